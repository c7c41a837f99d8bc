"""Allegro against its reference: diffusers 0.42.1's `AutoencoderKLAllegro`, loaded from the folder users
hold (``vae/`` of rhymes-ai/Allegro, written here by ``save_pretrained`` with seeded random weights),
decoded as ``AllegroPipeline.decode_latents`` decodes (``z / scaling_factor``, then ``vae.decode`` with
tiling on, as the pipeline's users turn it on: diffusers decodes Allegro only in tiles), float32 on a CPU.

A latent of one of diffusers' tiles (allegro-tiny's ``sample_size`` 128: 6 x 16 x 16 latents) is a tile
the pipeline decodes whole, with no blend: farm's untiled decode, on a real cluster from the pipeline's own
``output_type="latent"`` latents, equals it to the last 8-bit level. A single ``.safetensors`` file of the
decoder decodes the same. A shot of the release's length split in time decodes as untiled.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.inputs.synthetic import smooth_latent
from tests.helpers import ingest_and_render, levels
from tests.test_conformance_wan_hunyuan import assert_same_levels, seeded

pytestmark = pytest.mark.model

NAME = "allegro-tiny"
BLOCK = (6, 16, 16)  # one of diffusers' decode tiles of allegro-tiny: 24 x 128 x 128 pixels


def allegro_pipeline(folder):
    """``AllegroPipeline`` with its VAE only (no transformer or text encoder hands over latents), tiled."""
    from diffusers import AllegroPipeline, AutoencoderKLAllegro

    vae = AutoencoderKLAllegro.from_pretrained(folder).eval()
    vae.enable_tiling()
    return AllegroPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=None, scheduler=None)


def pipeline_decode(pipe, latents: torch.Tensor) -> np.ndarray:
    """The pipeline's own ``decode_latents`` of ``[1, C, F, H, W]`` → uint8 frames ``[F, H, W, 3]``."""
    with torch.inference_mode():
        return levels(pipe.decode_latents(latents)[0])


def test_allegro_pipeline_latents_render_as_the_pipeline_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLAllegro

    import farm
    from farm.inputs.ingest import add_pipeline_shot
    from farm.store.frames import read_frames
    from farm.store.job import open_job
    from farm.store.output import Output

    cls = FAMILIES["allegro"]
    folder = tmp_path / "vae"
    seeded(AutoencoderKLAllegro, cls.named_configs[NAME]).save_pretrained(folder)
    pipe = allegro_pipeline(folder)
    latents = torch.from_numpy(smooth_latent(np.random.default_rng(5), (4, *BLOCK)))[None]
    want = pipeline_decode(pipe, latents)
    assert want.shape == (24, 128, 128, 3) and want.std() > 10

    job = tmp_path / "job.zarr"
    add_pipeline_shot(job, latents, pipeline=pipe, name="shot", fps=24, num_frames=24, height=128, width=128)
    spec = open_job(job).spec
    assert (spec.family, spec.config_name, spec.latents) == ("allegro", None, "normalized")
    stats = farm.render(job, tmp_path / "out", scheduler=scheduler3,
                        options=farm.PlanOptions(tiles=(1, 1, 1)), log=lambda _: None)  # fmt: skip
    assert not stats.failed
    assert_same_levels(read_frames(Output(tmp_path / "out"), "shot"), want)


def test_a_single_file_decodes_as_the_pipeline(tmp_path):
    """The decoder's tensors in one ``.safetensors`` file (diffusers' names), checked from its header and
    loaded onto the device: the same frames as the pipeline's decode of its folder."""
    from diffusers import AutoencoderKLAllegro
    from safetensors.torch import save_file

    from farm.decoders import spec_from_json

    cls = FAMILIES["allegro"]
    source = seeded(AutoencoderKLAllegro, cls.named_configs[NAME], seed=7)
    source.save_pretrained(tmp_path / "vae")
    path = tmp_path / "allegro_vae.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()
               if k.startswith(("decoder.", "post_quant_conv."))}, str(path))  # fmt: skip
    raw = {"family": "allegro", "config": NAME, "weights": {"path": str(path)}, "latents": "normalized"}
    spec = cls.check_weights(spec_from_json(raw))
    decoder = cls.load(spec, "cpu")
    latents = torch.from_numpy(smooth_latent(np.random.default_rng(6), (4, *BLOCK)))
    want = pipeline_decode(allegro_pipeline(tmp_path / "vae"), latents[None])
    got = decoder.decode(latents).clamp(0, 1).mul(255).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    assert_same_levels(got, want)


def test_allegro_frames_are_four_per_latent_frame_and_not_causal():
    """``F`` latent frames decode to ``4 F`` pixel frames, and a later latent frame changes earlier pixels
    (the temporal convolutions look both ways and their GroupNorms see the whole clip)."""
    from farm.decoders import spec_from_json

    spec = spec_from_json({"family": "allegro", "config": NAME, "weights": {"random_seed": 1}})
    cls = FAMILIES["allegro"]
    geometry = cls.geometry_for_spec(spec)
    assert (geometry.spatial_scale, geometry.temporal_scale, geometry.causal) == (8, 4, False)
    decoder = cls.load(spec, "cpu")
    z = torch.from_numpy(smooth_latent(np.random.default_rng(2), (4, 3, 2, 2)))
    whole = decoder.decode(z)
    assert tuple(whole.shape) == (3, 12, 16, 16) == (3, *geometry.pixel_shape((3, 2, 2)))
    prefix = decoder.decode(z[:, :2].contiguous())
    assert prefix.shape[1] == 8 and (prefix - whole[:, :8]).abs().max() > 1e-3


def test_temporal_tiles_of_a_released_length_shot_equal_untiled(tmp_path, scheduler3):
    """22 latent frames (the release's 88 pixel frames) split in two in time: the recorded context reaches
    across the whole shot, so each tile decodes with every frame and the split equals the untiled render
    (measured contexts of 2 to 10 frames leave the seam band at 18 to 31 dB)."""
    from diffusers import AutoencoderKLAllegro

    cls = FAMILIES["allegro"]
    assert cls.temporal_context[NAME] == (22, 22)
    seeded(AutoencoderKLAllegro, cls.named_configs[NAME], seed=3).save_pretrained(tmp_path / "vae")
    latent = smooth_latent(np.random.default_rng(8), (4, 22, 2, 2))
    grids = [((1, 1, 1), None), ((2, 1, 1), (1, 0, 0))]
    untiled, temporal = ingest_and_render(
        tmp_path, latent, {"family": "allegro", "config": NAME}, tmp_path / "vae", scheduler3, grids
    )
    assert untiled.shape == (88, 16, 16, 3)
    assert_same_levels(temporal, untiled)


def test_farm_plan_says_how_the_pipeline_tiles():
    """`farm plan`'s line under the decoder: the block diffusers' tiling decodes (the release's 6x40x40
    latents, the tiny config's 6x16x16), which a farm tile equals."""
    from farm.decoders import spec_from_json

    cls = FAMILIES["allegro"]
    for name, block in (("allegro", "6x40x40"), (NAME, "6x16x16")):
        spec = spec_from_json({"family": "allegro", "config": name, "weights": {"random_seed": 0}})
        note = cls.plan_note(spec)
        assert note is not None and f"blocks of {block} latents" in note, note
