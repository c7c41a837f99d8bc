"""Cosmos 1.0 against its reference: diffusers 0.42.1's `AutoencoderKLCosmos`, loaded from the folder users
hold (``vae/`` of the diffusers release, written here by ``save_pretrained`` with seeded random weights),
decoded as ``CosmosTextToWorldPipeline`` decodes (``z · std[c, t] / sigma_data + mean[c, t]`` with the
config's statistics per channel and latent frame and the scheduler's ``sigma_data``, then ``vae.decode``),
float32 on a CPU.

The pipeline itself (its VAE and scheduler; no transformer or text encoder is needed to hand over latents)
goes through `add_pipeline_shot`, which records the scheduler's ``sigma_data`` in the spec; farm renders on a
real cluster, untiled: the frames equal the pipeline's decode to the last 8-bit level. A tile that starts
later in the shot un-normalises with its own frames' statistics, as the whole shot's decode does there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent
from tests.helpers import levels
from tests.test_conformance_wan_hunyuan import assert_same_levels, seeded

pytestmark = pytest.mark.model

NAME = "cosmos-tiny"
SIGMA_DATA = 0.5  # the release's EDMEulerScheduler


def pipeline_z(vae, latents: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """`CosmosTextToWorldPipeline.__call__`'s un-normalisation of ``[B, C, F, H, W]`` latents."""
    c, f = vae.config.latent_channels, latents.size(2)
    mean = torch.tensor(vae.config.latents_mean).view(1, c, -1, 1, 1)[:, :, :f].to(latents)
    std = torch.tensor(vae.config.latents_std).view(1, c, -1, 1, 1)[:, :, :f].to(latents)
    return latents * std / sigma_data + mean


def cosmos_pipeline(folder):
    from diffusers import AutoencoderKLCosmos, CosmosTextToWorldPipeline, EDMEulerScheduler

    vae = AutoencoderKLCosmos.from_pretrained(folder).eval()
    scheduler = EDMEulerScheduler(sigma_min=0.002, sigma_max=80, sigma_data=SIGMA_DATA,
                                  sigma_schedule="karras", prediction_type="epsilon", rho=7.0,
                                  final_sigmas_type="sigma_min")  # fmt: skip
    return CosmosTextToWorldPipeline(text_encoder=None, tokenizer=None, transformer=None, vae=vae,
                                     scheduler=scheduler, safety_checker=lambda *a, **k: None)  # fmt: skip


def test_cosmos_pipeline_latents_render_as_the_pipeline_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLCosmos

    import farm
    from farm.inputs.ingest import add_pipeline_shot
    from farm.store.frames import read_frames
    from farm.store.job import open_job
    from farm.store.output import Output

    cls = FAMILIES["cosmos"]
    folder = tmp_path / "vae"
    seeded(AutoencoderKLCosmos, cls.named_configs[NAME]).save_pretrained(folder)
    pipe = cosmos_pipeline(folder)
    latents = torch.from_numpy(smooth_latent(np.random.default_rng(5), (4, 3, 4, 6)))[None]
    with torch.inference_mode():
        want = levels(pipe.vae.decode(pipeline_z(pipe.vae, latents, SIGMA_DATA), return_dict=False)[0][0])
    assert want.shape == (17, 32, 48, 3) and want.std() > 10

    job = tmp_path / "job.zarr"
    add_pipeline_shot(job, latents, pipeline=pipe, name="shot", fps=24, num_frames=17, height=32, width=48)
    spec = open_job(job).spec
    assert (spec.family, spec.latents, spec.extra.get("sigma_data")) == ("cosmos", "normalized", SIGMA_DATA)
    stats = farm.render(job, tmp_path / "out", scheduler=scheduler3,
                        options=farm.PlanOptions(tiles=(1, 1, 1)), log=lambda _: None)  # fmt: skip
    assert not stats.failed
    assert_same_levels(read_frames(Output(tmp_path / "out"), "shot"), want)


def test_a_later_tile_un_normalises_with_its_own_frames_statistics(tmp_path):
    from diffusers import AutoencoderKLCosmos

    cls = FAMILIES["cosmos"]
    folder = tmp_path / "vae"
    seeded(AutoencoderKLCosmos, cls.named_configs[NAME]).save_pretrained(folder)
    vae = AutoencoderKLCosmos.from_pretrained(folder).eval()
    spec = cls.check_weights(farm_spec(folder, SIGMA_DATA))
    decoder = cls.load(spec, "cpu")
    latent = torch.from_numpy(smooth_latent(np.random.default_rng(6), (4, 16, 2, 3)))
    whole = pipeline_z(vae, latent[None], SIGMA_DATA)
    for first in (0, 5, 13):
        tile = decoder.decoder_input(latent[:, first:], origin=(first, 0, 0))
        torch.testing.assert_close(tile, whole[:, :, first:], rtol=1e-6, atol=1e-6)
    with pytest.raises(FarmError, match="cover 16 latent frames"):  # as far as the statistics go
        decoder.decoder_input(torch.zeros(4, 2, 2, 3), origin=(15, 0, 0))


def farm_spec(folder, sigma_data: float):
    from farm.decoders import spec_from_json

    return spec_from_json({"family": "cosmos", "config": NAME, "weights": {"path": str(folder)},
                           "dtype": "float32", "latents": "normalized",
                           "sigma_data": sigma_data})  # fmt: skip


def test_temporal_tiles_of_a_released_length_shot_equal_untiled(tmp_path, scheduler3):
    """A normalized shot of 16 latent frames (as far as the statistics go: 121 pixel frames) split in two
    in time: the recorded context reaches back to the shot's start, so the split is exact (the temporal
    attention reaches every earlier frame: measured context of 10 frames leaves 19 dB at the seam)."""
    import farm
    from farm.decoders import spec_from_json
    from farm.media.settings import VideoSettings
    from farm.planning.jobplan import plan_job
    from farm.store.frames import read_frames
    from farm.store.job import create_job, open_job, write_shot
    from farm.store.output import Output

    spec = spec_from_json({"family": "cosmos", "config": NAME, "weights": {"random_seed": 0},
                           "dtype": "float32", "latents": "normalized"})  # fmt: skip
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    write_shot(job, "s", smooth_latent(np.random.default_rng(8), (4, 16, 3, 4)), fps=24.0)
    split = farm.PlanOptions(tiles=(2, 1, 1), overlap=(0, 0, 0), batch_frames=64)
    later = [t for t in plan_job(open_job(job), split, 1)[0].tiles if t.grid_pos[0] == 1][0]
    assert later.latent[0].start > 0 and later.latent[0].start - later.context == 0  # from the start
    frames = {}
    for name, options in (("whole", farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64)), ("split", split)):
        stats = farm.render(job, tmp_path / name, scheduler=scheduler3, options=options,
                            video=VideoSettings(enabled=False), log=lambda _: None)  # fmt: skip
        assert not stats.failed
        frames[name] = read_frames(Output(tmp_path / name), "s").astype(np.int16)
    assert frames["whole"].shape == (121, 24, 32, 3) and frames["whole"].std() > 10
    assert np.abs(frames["split"] - frames["whole"]).max() <= 1


def test_cosmos_decodes_in_a_process_that_built_another_decoder_on_the_meta_device_first():
    """diffusers imports every autoencoder module at once, making Cosmos's patching filters then: inside
    another family's meta-device build they are meta tensors (as a worker that decoded another job first
    has them). farm makes them again, with the values diffusers defines them with."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = """
import torch
from farm.decoders import FAMILIES, spec_from_json
hy = FAMILIES["hunyuanvideo15"]
hy.meta_model(hy.named_configs["hunyuanvideo15-tiny"])  # imports diffusers' autoencoders, meta device
from diffusers.models.autoencoders import autoencoder_kl_cosmos as module
assert module._WAVELETS["haar"].is_meta
spec = spec_from_json({"family": "cosmos", "config": "cosmos-tiny", "weights": {"random_seed": 0}})
pixels = FAMILIES["cosmos"].load(spec, "cpu").decode(torch.zeros(4, 2, 2, 2), origin=(0, 0, 0))
assert pixels.shape == (3, 9, 16, 16) and torch.isfinite(pixels).all()
print("decoded")
"""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "decoded" in done.stdout, done.stderr[-2000:]

    from diffusers.models.autoencoders import autoencoder_kl_cosmos as module

    from farm.decoders.cosmos.adapter import FILTERS

    assert module._WAVELETS.keys() == FILTERS.keys()
    assert all(torch.equal(module._WAVELETS[k], torch.tensor(v)) for k, v in FILTERS.items())
