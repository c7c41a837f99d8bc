"""HunyuanVideo 1.5 against its reference: diffusers 0.42.1's `AutoencoderKLHunyuanVideo15`, loaded from
the folder users hold (``vae/`` of the diffusers release, written here by ``save_pretrained`` with seeded
random weights), decoded as ``HunyuanVideo15Pipeline`` decodes (``latents / scaling_factor``, then
``vae.decode``), float32 on a CPU.

farm ingests a normalized latent with the named tiny config and the folder, and renders it on a real
cluster: untiled, the frames equal the pipeline's decode to the last 8-bit level. Tiled (no split is
exact: the mid block's attention spans the tile), a temporal split with the adapter's context and a 2x2
split with its halo must reach what `benchmarks/measure_halo.py` measured for them (the adapter's tables),
far closer than the same splits without (checked against the measured tables' starting rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.inputs.synthetic import smooth_latent
from tests.helpers import ingest_and_render, levels, psnr_db
from tests.test_conformance_wan_hunyuan import assert_same_levels, seeded

pytestmark = pytest.mark.model

NAME = "hunyuanvideo15-tiny"


def pipeline_decode(vae, latent: torch.Tensor) -> np.ndarray:
    """`HunyuanVideo15Pipeline.__call__`'s decode branch on one latent ``[C, F, H, W]``."""
    with torch.inference_mode():
        z = latent[None].to(vae.dtype) / vae.config.scaling_factor
        return levels(vae.decode(z, return_dict=False)[0][0])


def test_hunyuanvideo15_folder_renders_as_the_pipeline_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLHunyuanVideo15

    cls = FAMILIES["hunyuanvideo15"]
    folder = tmp_path / "vae"
    seeded(AutoencoderKLHunyuanVideo15, cls.named_configs[NAME]).save_pretrained(folder)
    reference = AutoencoderKLHunyuanVideo15.from_pretrained(folder).eval()
    latent = smooth_latent(np.random.default_rng(5), (4, 5, 4, 6))
    want = pipeline_decode(reference, torch.from_numpy(latent))
    assert want.shape == (17, 64, 96, 3) and want.std() > 10

    (untiled,) = ingest_and_render(tmp_path, latent, {"family": "hunyuanvideo15", "config": NAME}, folder,
                                   scheduler3, [((1, 1, 1), None)])  # fmt: skip
    assert_same_levels(untiled, want)


def release_names(state: dict, up_blocks: int, layers: int) -> dict:
    """A diffusers state dict's decoder tensors under the names of HunyuanVideo 1.5's release, as
    ``convert_hunyuan_video_15_vae_checkpoint_to_diffusers`` (diffusers' ``scripts/``) pairs them."""
    pairs = {"decoder.conv_in.conv": "decoder.conv_in.conv", "decoder.norm_out": "decoder.norm_out",
             "decoder.conv_out.conv": "decoder.conv_out.conv"}  # fmt: skip
    for i in (0, 1):
        pairs[f"decoder.mid_block.resnets.{i}"] = f"decoder.mid.block_{i + 1}"
    attention = (("norm", "norm"), ("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("proj_out", "proj_out"))
    for theirs, ours in attention:
        pairs[f"decoder.mid_block.attentions.0.{ours}"] = f"decoder.mid.attn_1.{theirs}"
    for b in range(up_blocks):
        for r in range(layers + 1):
            pairs[f"decoder.up_blocks.{b}.resnets.{r}"] = f"decoder.up.{b}.block.{r}"
        pairs[f"decoder.up_blocks.{b}.upsamplers.0"] = f"decoder.up.{b}.upsample"
    out = {}
    for name, value in state.items():
        if name.startswith("decoder."):
            module, leaf = next((m, name[len(m):]) for m in sorted(pairs, key=len, reverse=True)
                                if name.startswith(m + "."))  # fmt: skip
            out[pairs[module] + leaf] = value.contiguous()
    return out


def test_the_releases_own_file_renders_as_the_pipeline_decodes(tmp_path, scheduler3):
    """tencent/HunyuanVideo-1.5's ``vae/diffusion_pytorch_model.safetensors`` is in the model's own naming;
    farm reads it as diffusers' conversion script would convert it."""
    from diffusers import AutoencoderKLHunyuanVideo15
    from safetensors.torch import save_file

    from farm.store.job import open_job

    cls = FAMILIES["hunyuanvideo15"]
    config = cls.named_configs[NAME]
    source = seeded(AutoencoderKLHunyuanVideo15, config)
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    blocks, layers = len(config["block_out_channels"]), config["layers_per_block"]
    save_file(release_names(source.state_dict(), blocks, layers), str(path))
    latent = smooth_latent(np.random.default_rng(7), (4, 3, 4, 6))
    want = pipeline_decode(source, torch.from_numpy(latent))

    (untiled,) = ingest_and_render(tmp_path, latent, {"family": "hunyuanvideo15", "config": NAME}, path,
                                   scheduler3, [((1, 1, 1), None)])  # fmt: skip
    assert open_job(tmp_path / "job.zarr").spec.weights["layout"] == "hunyuanvideo15-original"
    assert_same_levels(untiled, want)


# Two temporal tiles of a 40-frame shot against it untiled, on the weights and white-noise latents
# `benchmarks/measure_halo.py context --decoder hunyuanvideo15-tiny --shape 40,4,4` measured: at the
# adapter's context (14 frames) 50.3 dB over 8 frames either side of the seam, where 8 frames of context
# give 39.8 dB (the mid block's causal attention reaches every earlier frame: no split is exact).
CONTEXT_BAND_DB = 48.0


def test_hunyuanvideo15_temporal_tiles_with_their_context_against_untiled(tmp_path, scheduler3):
    import farm
    from farm.decoders import decoder_class
    from farm.inputs.synthetic import synth_spec
    from farm.media.settings import VideoSettings
    from farm.planning.jobplan import plan_job
    from farm.store.frames import read_frames
    from farm.store.job import create_job, open_job, write_shot
    from farm.store.output import Output

    spec = synth_spec(NAME, seed=0)
    assert decoder_class(spec).geometry_for_spec(spec).context == 14
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    latent = np.random.default_rng(1).standard_normal((4, 40, 4, 4)).astype(np.float32)
    write_shot(job, "s", latent, fps=24.0)
    split = farm.PlanOptions(tiles=(2, 1, 1), overlap=(0, 0, 0), batch_frames=64)
    later = [t for t in plan_job(open_job(job), split, 1)[0].tiles if t.grid_pos[0] == 1][0]
    assert later.context == 14 and later.latent[0].start - later.context > 0  # not the whole prefix
    frames = {}
    for name, options in (("whole", farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64)), ("split", split)):
        stats = farm.render(job, tmp_path / name, scheduler=scheduler3, options=options,
                            video=VideoSettings(enabled=False), log=lambda _: None)  # fmt: skip
        assert not stats.failed
        frames[name] = read_frames(Output(tmp_path / name), "s")
    seam = later.pixels[0].start
    band = slice(seam - 8, seam + 8)
    assert psnr_db(frames["split"][band], frames["whole"][band]) >= CONTEXT_BAND_DB
