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
import re

import numpy as np
import pytest
import torch

from farm.inputs.synthetic import smooth_latent
from tests.helpers import LTXV_TINY_FILE_CONFIGS, ingest_and_render, levels

pytest.importorskip("ltx_video.models.autoencoders.causal_video_autoencoder",
                    reason="the reference: pip install --no-deps -r tests/references.txt")  # fmt: skip

pytestmark = pytest.mark.model

LATENT = 8
METADATA = LTXV_TINY_FILE_CONFIGS
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


@pytest.mark.parametrize(
    ("change", "named", "message"),
    [
        ({"causal_decoder": True}, "ltxv-tiny", "decoder_causal: the file has True, the job's config False"),
        ({"timestep_conditioning": True}, "ltxv-tiny", "timestep_conditioning: the file has True"),
        ({"spatial_padding_mode": "reflect"}, "ltxv-tiny", "spatial_padding_mode 'reflect'"),
        ({}, "ltxv-0.9.1-tiny", "the file is ltxv-0.9.5-tiny: use that config"),
    ],
)
def test_a_named_config_the_file_contradicts_is_refused(tmp_path, change, named, message):
    """The file's own config decides: a job whose named config decodes otherwise is refused at the weight
    check (headers only), naming the field and the config that fits."""
    from farm.decoders import decoder_class, spec_from_json
    from farm.errors import FarmError

    source = "ltxv-0.9.5-tiny" if named == "ltxv-0.9.1-tiny" else named
    path = tmp_path / "ltx-video-tiny.safetensors"
    reference_file(source, path)
    if change:
        from safetensors.torch import load_file, save_file

        vae = {**METADATA[source], **change}
        save_file(load_file(str(path)), str(path), metadata={"config": json.dumps({"vae": vae})})
    spec = spec_from_json({"family": "ltxv", "config": named, "weights": {"path": str(path)}})
    with pytest.raises(FarmError, match=re.escape(message)):
        decoder_class(spec).check_weights(spec)
