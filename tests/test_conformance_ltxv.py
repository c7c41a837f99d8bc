"""LTX-Video 0.9.0 / 0.9.1 / 0.9.5 against Lightricks' own code (`ltx-video` 0.1.2,
``ltx_video/models/autoencoders/causal_video_autoencoder.py``), in float32 on a CPU.

Each test builds the reference's `CausalVideoAutoencoder` from a released config's `vae` metadata at
tiny widths (the released block lists, one layer per block), seeds its weights and writes it as the
released single files are: every tensor under ``vae.`` in Lightricks' naming, the per-channel latent
statistics, and the ``config`` JSON in the safetensors metadata (what ltx-video's loader reads). farm
ingests a latent with the matching named config and that file and renders it on a real cluster; the
frames equal the reference pipeline's own decode (``vae_decode`` with its per-channel un-normalisation
and decode timestep) to the last 8-bit level. A temporal split into 2 tiles, whose context covers the
decoder's receptive field both ways, is as exact.

ltx-video has no tiled decode these configs can use (its tile sizes follow the encoder's block count,
not the 32x scale, and neither of its tilings passes the decode timestep): there is no reference tiling to
compare farm's spatial tiles with here (`tests/test_conformance_wan_hunyuan.py` does, with diffusers').
The 0.9.1 decoder's injected noise is drawn fresh by ltx-video and per position by farm, so its scales
stay at ltx-video's initial zeros here; the latent noise mix is off (``decode_noise_scale`` 0) for the
same reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from farm.inputs.synthetic import smooth_latent
from tests.helpers import ingest_and_render, levels

pytest.importorskip("ltx_video.models.autoencoders.causal_video_autoencoder",
                    reason="the reference: pip install --no-deps -r tests/references.txt")  # fmt: skip

pytestmark = pytest.mark.model

BASE, LATENT = 8, 8  # the tiny configs' widths (farm.decoders.ltxv: LTXV_TINY, LTXV_091_TINY, LTXV_095_TINY)
COMMON = {"_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3,
          "latent_channels": LATENT, "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4,
          "latent_log_var": "uniform", "use_quant_conv": False, "causal_decoder": False,
          "encoder_base_channels": BASE, "decoder_base_channels": BASE}  # fmt: skip
# 0.9.0's block list (encoder and decoder alike), one layer per block
V090_BLOCKS = [["res_x", 1], ["compress_all", 1], ["res_x_y", 1], ["res_x", 1], ["compress_all", 1],
               ["res_x_y", 1], ["res_x", 1], ["compress_all", 1], ["res_x", 1], ["res_x", 1]]  # fmt: skip


def decoder_blocks(inject_noise: bool) -> list:
    """0.9.1 / 0.9.5's decoder list (pixel side first): res_x groups between residual 2x2x2 upsamplers
    that halve the channels; 0.9.1 injects noise in all groups but the innermost."""
    blocks: list = []
    for i in range(4):
        blocks.append(["res_x", {"num_layers": 1, "inject_noise": inject_noise and i < 3}])
        if i < 3:
            blocks.append(["compress_all", {"residual": True, "multiplier": 2}])
    return blocks


# named config → the `vae` entry of the file's `config` metadata
METADATA = {
    "ltxv-tiny": {**COMMON, "blocks": V090_BLOCKS},
    "ltxv-0.9.1-tiny": {**COMMON, "encoder_blocks": V090_BLOCKS, "decoder_blocks": decoder_blocks(True),
                        "timestep_conditioning": True},
    "ltxv-0.9.5-tiny": {**COMMON, "encoder_blocks": V090_BLOCKS, "decoder_blocks": decoder_blocks(False),
                        "timestep_conditioning": True},
}  # fmt: skip
DECODE_TIMESTEP = 0.05  # LTXPipeline's usual decode timestep


def reference_file(name: str, path):
    """The reference model of `name` with seeded weights, written as a released single file."""
    from ltx_video.models.autoencoders.causal_video_autoencoder import CausalVideoAutoencoder
    from safetensors.torch import save_file

    config = METADATA[name]
    torch.manual_seed(7)
    model = CausalVideoAutoencoder.from_config(json.loads(json.dumps(config))).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["per_channel_statistics.mean-of-means"] = torch.linspace(-0.5, 0.5, LATENT)
    state["per_channel_statistics.std-of-means"] = torch.linspace(0.5, 2.0, LATENT)
    save_file({"vae." + k: v for k, v in state.items()}, str(path),
              metadata={"config": json.dumps({"vae": config})})  # fmt: skip
    return CausalVideoAutoencoder.from_pretrained(path).eval()  # as ltx-video loads it: config from metadata


def reference_decode(model, latent: torch.Tensor) -> np.ndarray:
    """The LTX-Video pipeline's decode of normalized latents (``vae_decode``), untiled, as uint8 frames."""
    from ltx_video.models.autoencoders.vae_encode import vae_decode

    timestep = torch.tensor([DECODE_TIMESTEP]) if model.decoder.timestep_conditioning else None
    with torch.inference_mode():
        video = vae_decode(latent[None], model, True, vae_per_channel_normalize=True, timestep=timestep)
    return levels(video[0])


@pytest.mark.parametrize("name", list(METADATA))
def test_farm_renders_what_ltx_video_decodes(tmp_path, scheduler3, name):
    path = tmp_path / "ltx-video-tiny.safetensors"
    model = reference_file(name, path)
    latent = smooth_latent(np.random.default_rng(3), (LATENT, 4, 4, 6))  # → 25 x 128 x 192
    want = reference_decode(model, torch.from_numpy(latent))
    assert want.shape == (25, 128, 192, 3) and want.std() > 10  # a picture, not a flat field

    spec = {"family": "ltxv", "config": name}
    if METADATA[name].get("timestep_conditioning"):
        spec |= {"decode_timestep": DECODE_TIMESTEP, "decode_noise_scale": 0.0}
    untiled, temporal = ingest_and_render(
        tmp_path, latent, spec, path, scheduler3, grids=[((1, 1, 1), None), ((2, 1, 1), (1, 0, 0))]
    )
    for got in (untiled, temporal):
        assert got.shape == want.shape
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        # float32 rounding (diffusers' RMS norm against ltx-video's pixel norm) moves a value sitting on a
        # rounding boundary by one level at most, and only a few of them
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
