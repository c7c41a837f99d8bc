"""MiniMax-H3's video VAE against its reference: diffusers 0.42.1's `AutoencoderKLMiniMaxH3`, decoded as
its pipeline's video decode step (``MiniMaxH3VideoDecodeStep``) runs it, in float32 on a CPU.

The step un-normalises the latents with the config's ``latents_mean`` / ``latents_std``, calls
``vae.decode`` (its 256-px tiles, blended, on by default, and its 17-frame clips) and turns the
ImageNet-normalised output into [0, 1] (``* pixel_std + pixel_mean``, clamped). The weights are seeded
(every parameter moved off diffusers' initialisation, whose zero residual gains would leave each token to
itself), saved as a diffusers folder and loaded by farm as a user's would be: farm's untiled render equals
the step to the last 8-bit level; a 2x2 split at the family's measured halo and overlap stays within what
`benchmarks/measure_halo.py` measured.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.decoders.minimax_h3.adapter import PIXEL_MEAN, PIXEL_STD
from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import ChunkSize, TileGrid, plan_chunks, plan_shot
from tests.helpers import ingest_and_render, psnr_db

pytestmark = pytest.mark.model

NAME = "minimax-h3-tiny"
CONFIG = FAMILIES["minimax-h3"].named_configs[NAME]
# 7 latent frames (one clip: 22 pixel frames) of 20 x 24 latent units: 320 x 384 pixels, which the decoder
# cuts into 2 x 2 tiles of 256 px
LATENT = (4, 7, 20, 24)


def seeded(seed: int = 5) -> torch.nn.Module:
    """The tiny model with diffusers' initialisation from `seed`, then every parameter moved off it."""
    from diffusers import AutoencoderKLMiniMaxH3

    torch.manual_seed(seed)
    model = AutoencoderKLMiniMaxH3(**CONFIG)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
    return model.eval()


def pipeline_decode(vae, latents: torch.Tensor) -> np.ndarray:
    """``MiniMaxH3VideoDecodeStep`` on normalized latents ``[C, F, H, W]`` → uint8 frames ``[F, H, W, 3]``."""
    with torch.inference_mode():
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        video = vae.decode(latents[None] * std + mean, return_dict=False)[0]
        pixel_mean = torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
        pixel_std = torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1)
        video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
    return video[0].mul(255.0).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()


def test_the_pipeline_step_is_what_the_reference_runs():
    """The decode step's source says what `pipeline_decode` does, and the pipeline's pixel statistics are
    the adapter's."""
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3VideoDecodeStep
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    source = inspect.getsource(MiniMaxH3VideoDecodeStep.__call__)
    for line in ("latents = block_state.latents * latents_std + latents_mean",
                 "video = components.vae.decode(latents, return_dict=False)[0]",
                 "video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)"):  # fmt: skip
        assert line in source, line
    assert MiniMaxH3ModularPipeline.pixel_mean.fget(None) == PIXEL_MEAN
    assert MiniMaxH3ModularPipeline.pixel_std.fget(None) == PIXEL_STD
    assert "MiniMaxH3ModularPipeline" in FAMILIES["minimax-h3"].pipeline_conventions


def test_render_equals_the_pipeline_decode_and_tiles_stay_near_it(tmp_path, scheduler3):
    from diffusers import AutoencoderKLMiniMaxH3
    from safetensors.torch import load_file

    seeded().save_pretrained(tmp_path / "vae")
    # what from_pretrained reads of the folder (itself needs `accelerate` for this class, not installed)
    reference = AutoencoderKLMiniMaxH3.from_config(AutoencoderKLMiniMaxH3.load_config(tmp_path / "vae"))
    reference.load_state_dict(load_file(tmp_path / "vae" / "diffusion_pytorch_model.safetensors"))
    reference.eval()
    assert reference.use_tiling  # the released decode: 256-px tiles
    latent = smooth_latent(np.random.default_rng(3), LATENT)
    want = pipeline_decode(reference, torch.from_numpy(latent))
    assert want.shape == (22, 320, 384, 3) and want.std() > 10

    untiled, tiled = ingest_and_render(
        tmp_path, latent, {"family": "minimax-h3", "config": NAME}, tmp_path / "vae", scheduler3,
        [((1, 1, 1), None), ((1, 2, 2), None)],
    )  # fmt: skip
    diff = np.abs(untiled.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())
    # a 2x2 split at the measured halo and overlap: the seam band (16 px either side) as measured
    band = np.zeros(want.shape[1:3], dtype=bool)
    band[160 - 16 : 160 + 16, :] = True
    band[:, 192 - 16 : 192 + 16] = True
    seam_db = psnr_db(tiled[:, band], want[:, band])
    print(f"2x2 tiles against the pipeline's decode: seam band {seam_db:.1f} dB")
    assert seam_db >= SEAM_BAND_DB


# What a 2x2 split at the halo and overlap the adapter records (8 and 4) must reach over the seam band: it
# reaches 52.6 dB here (`benchmarks/measure_halo.py` measured 56.4 dB for the halo alone on white noise)
SEAM_BAND_DB = 50.0


def test_frame_counts_follow_the_decoders_clips():
    """``5n + m`` latent frames decode to ``17n + 1 + 4 (m - 1)`` pixel frames, as diffusers decodes them."""
    cls = FAMILIES["minimax-h3"]
    geometry = cls.geometry_for(CONFIG)
    model = seeded()
    for frames in range(3, 13):
        with torch.inference_mode():
            out = model.decode(torch.randn(1, 4, frames, 1, 2), return_dict=False)[0]
        assert out.shape[2] == geometry.pixel_frames(frames), frames
        assert geometry.latent_frames(out.shape[2]) == frames
    assert geometry.pixel_frames(12) == 39 and geometry.latent_frames(38) is None


def test_time_is_never_split():
    geometry = FAMILIES["minimax-h3"].geometry_for(CONFIG)
    with pytest.raises(FarmError, match="decodes a shot whole along frames"):
        plan_shot("s", LATENT, geometry, TileGrid((2, 1, 1), (1, 0, 0)))
    with pytest.raises(FarmError, match="decodes a shot whole along frames"):
        plan_chunks(LATENT[1:], geometry, ChunkSize(frames=4))
    plan = plan_shot("s", LATENT, geometry, TileGrid((1, 2, 2), (0, 1, 1)))
    assert plan.pixel_shape == (22, 320, 384) and {t.pixels[0].size for t in plan.tiles} == {22}


def test_random_weights_mix_tokens():
    """RANDOM weights draw the blocks' residual gains, so a decoded pixel depends on other latent units."""
    from farm.decoders import load_decoder

    decoder = load_decoder({"family": "minimax-h3", "config": NAME, "weights": {"random_seed": 0}})
    z = torch.from_numpy(smooth_latent(np.random.default_rng(1), (4, 3, 2, 2)))
    moved = z.clone()
    moved[:, :, 1, 1] += 1.0
    a, b = decoder.decode(z), decoder.decode(moved)
    assert (a[:, :, :16, :16] - b[:, :, :16, :16]).abs().max() > 1e-3  # the corner unit away from the change
