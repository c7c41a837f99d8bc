"""Mochi against its reference: diffusers 0.42.1's `AutoencoderKLMochi` decoding as ``MochiPipeline``
decodes (the latents un-normalised with the config's ``latents_mean`` / ``latents_std`` and divided by
``scaling_factor``, then ``vae.decode`` in one pass, dropping the first 5 of its ``6 F`` frames), in
float32 on a CPU.

The weights are a diffusers folder (``save_pretrained``), as genmo/mochi-1-preview ships its ``vae/``.
farm ingests the normalized latents with the tiny named config and that folder and renders them on a real
cluster: the frames equal the pipeline's decode to the last 8-bit level, and so do two temporal tiles
whose later one decodes its measured context (not back to the shot's first frame).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES, spec_from_json
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import TileGrid, plan_shot
from tests.helpers import ingest_and_render, levels

pytestmark = pytest.mark.model

NAME = "mochi-tiny"
FRAMES = 24  # latent frames: 139 pixel frames, two temporal tiles
GRIDS = [((1, 1, 1), None), ((2, 1, 1), (1, 0, 0))]


def seeded(config: dict, seed: int = 5) -> torch.nn.Module:
    from diffusers import AutoencoderKLMochi

    torch.manual_seed(seed)
    model = AutoencoderKLMochi(**config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model.eval()


def pipeline_decode(vae, latent: torch.Tensor) -> np.ndarray:
    """MochiPipeline's un-normalisation (its ``__call__``, ``output_type`` not "latent") and decode."""
    latents = latent[None]
    mean = torch.tensor(vae.config.latents_mean).view(1, 12, 1, 1, 1).to(latents.device, latents.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, 12, 1, 1, 1).to(latents.device, latents.dtype)
    latents = latents * std / vae.config.scaling_factor + mean
    with torch.inference_mode():
        return levels(vae.decode(latents, return_dict=False)[0][0])


def test_mochi_folder_renders_as_its_pipeline_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLMochi

    cls = FAMILIES["mochi"]
    seeded(cls.named_configs[NAME]).save_pretrained(tmp_path / "vae")
    reference = AutoencoderKLMochi.from_pretrained(tmp_path / "vae").eval()
    latent = smooth_latent(np.random.default_rng(3), (12, FRAMES, 4, 6))
    want = pipeline_decode(reference, torch.from_numpy(latent))
    assert want.shape == (1 + 6 * (FRAMES - 1), 32, 48, 3) and want.std() > 10

    spec = spec_from_json({"family": "mochi", "config": NAME, "weights": {"path": str(tmp_path / "vae")}})
    plan = plan_shot("x", (12, FRAMES, 4, 6), cls.geometry_for_spec(spec), TileGrid((2, 1, 1), (1, 0, 0)))
    later = max(plan.tiles, key=lambda t: t.latent[0].start)
    assert later.latent[0].start - later.context > 0 and later.context >= 8  # not back to frame 0
    untiled, temporal = ingest_and_render(
        tmp_path, latent, {"family": "mochi", "config": NAME}, tmp_path / "vae", scheduler3, GRIDS
    )
    for got in (untiled, temporal):
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
