"""Mochi against its reference: diffusers 0.42.1's `AutoencoderKLMochi` decoding as ``MochiPipeline``
decodes (the latents un-normalised with the config's ``latents_mean`` / ``latents_std`` and divided by
``scaling_factor``, then ``vae.decode`` in one pass, dropping the first 5 of its ``6 F`` frames), in
float32 on a CPU.

The weights are a diffusers folder (``save_pretrained``), as genmo/mochi-1-preview ships its ``vae/``, or
ComfyUI's repackaged ``mochi_vae.safetensors`` (genmo's own names under ``decoder.``). farm ingests the
normalized latents with the tiny named config and those weights and renders them on a real cluster: the
frames equal the pipeline's decode to the last 8-bit level, and so do two temporal tiles whose later one
decodes its measured context (not back to the shot's first frame).
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


# Names of the released decoder's tensors in genmo's layout, as diffusers'
# scripts/convert_mochi_to_diffusers.py (`convert_mochi_vae_state_dict_to_diffusers`) reads them, beside
# the diffusers names it gives them.
SCRIPT_NAMES = {
    "decoder.conv_in.weight": "decoder.blocks.0.0.weight",
    "decoder.block_in.resnets.0.norm1.norm_layer.weight": "decoder.blocks.0.1.stack.0.weight",
    "decoder.block_in.resnets.2.conv2.conv.bias": "decoder.blocks.0.3.stack.5.bias",
    "decoder.up_blocks.0.resnets.5.conv1.conv.weight": "decoder.blocks.1.blocks.5.stack.2.weight",
    "decoder.up_blocks.1.resnets.3.norm2.norm_layer.bias": "decoder.blocks.2.blocks.3.stack.3.bias",
    "decoder.up_blocks.2.proj.weight": "decoder.blocks.3.proj.weight",
    "decoder.block_out.resnets.2.conv2.conv.weight": "decoder.blocks.4.2.stack.5.weight",
    "decoder.proj_out.bias": "decoder.output_proj.bias",
}


def test_original_layout_names_every_released_decoder_tensor_as_the_conversion_script_does():
    cls = FAMILIES["mochi"]
    full = cls._full_config({})
    names = {n: cls.original_name(n, "mochi-original", full) for n in cls.decoder_tensor_shapes({})}
    assert len(names) == 162 and len(set(names.values())) == len(names)  # every tensor, one name each
    assert all(v.startswith(("decoder.blocks.", "decoder.output_proj.")) for v in names.values())
    assert {k: names[k] for k in SCRIPT_NAMES} == SCRIPT_NAMES
    assert cls.original_layout(list(names.values())) == "mochi-original"
    assert cls.original_layout(list(names)) is None  # diffusers' own names


def test_comfyui_mochi_vae_file_renders_as_its_pipeline_decodes(tmp_path, scheduler3):
    """ComfyUI's repackaged ``mochi_vae.safetensors``: genmo's names under ``decoder.``."""
    from safetensors.torch import save_file

    cls = FAMILIES["mochi"]
    source = seeded(cls.named_configs[NAME], seed=7)
    full = cls._full_config(cls.named_configs[NAME])
    keep = cls.decoder_tensor_shapes(cls.named_configs[NAME])
    path = tmp_path / "mochi_vae.safetensors"
    save_file({cls.original_name(k, "mochi-original", full): v.contiguous()
               for k, v in source.state_dict().items() if k in keep}, str(path))  # fmt: skip
    latent = smooth_latent(np.random.default_rng(4), (12, 3, 4, 6))
    want = pipeline_decode(source, torch.from_numpy(latent))
    (untiled,) = ingest_and_render(tmp_path, latent, {"family": "mochi", "config": NAME}, path, scheduler3,
                                   [((1, 1, 1), None)])  # fmt: skip
    diff = np.abs(untiled.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
