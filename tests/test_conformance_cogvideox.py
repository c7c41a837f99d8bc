"""CogVideoX against its reference: diffusers 0.42.1's `AutoencoderKLCogVideoX` decoding as the CogVideoX
pipelines decode (``decode_latents``: the latents divided by ``scaling_factor``, then ``vae.decode``,
which decodes frames 0-2 and then pairs of latent frames, carrying each causal convolution's inputs), in
float32 on a CPU.

The weights are a diffusers folder (``save_pretrained``), the form the CogVideoX releases ship their VAE
in (``vae/`` of THUDM/CogVideoX-2b, -5b, CogVideoX1.5-5b). farm ingests the normalized latents with the
tiny named config and that folder and renders them on a real cluster: the frames equal the pipeline's
decode to the last 8-bit level, and so do two temporal tiles whose later one decodes its measured
context (not back to the shot's first frame) and two frames of lookahead.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import TileGrid, plan_shot
from tests.helpers import ingest_and_render, levels

pytestmark = pytest.mark.model

NAME = "cogvideox-tiny"
FRAMES = 33  # latent frames: 129 pixel frames, two temporal tiles of 17 and 16 (odd, as the pipelines make)
GRIDS = [((1, 1, 1), None), ((2, 1, 1), (1, 0, 0))]


def seeded(config: dict, seed: int = 5) -> torch.nn.Module:
    """`AutoencoderKLCogVideoX(**config)` with diffusers' initialisation from `seed`, then every parameter
    moved off it a little (some start at exactly zero or one)."""
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(seed)
    model = AutoencoderKLCogVideoX(**config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model.eval()


def pipeline_decode(vae, latent_fchw: torch.Tensor) -> np.ndarray:
    """`CogVideoXPipeline.decode_latents` on the pipeline's latents ``[B, F, C, H, W]`` → uint8 frames."""
    from diffusers import CogVideoXPipeline

    pipe = SimpleNamespace(vae=vae, vae_scaling_factor_image=vae.config.scaling_factor)
    with torch.inference_mode():
        return levels(CogVideoXPipeline.decode_latents(pipe, latent_fchw[None])[0])


def test_cogvideox_folder_renders_as_its_pipeline_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLCogVideoX

    cls = FAMILIES["cogvideox"]
    seeded(cls.named_configs[NAME]).save_pretrained(tmp_path / "vae")
    reference = AutoencoderKLCogVideoX.from_pretrained(tmp_path / "vae").eval()
    latent = smooth_latent(np.random.default_rng(3), (4, FRAMES, 4, 6))  # [C, F, H, W]
    want = pipeline_decode(reference, torch.from_numpy(latent).permute(1, 0, 2, 3))
    assert want.shape == (1 + 4 * (FRAMES - 1), 32, 48, 3) and want.std() > 10

    geometry = cls.geometry_for_spec(_spec(tmp_path))
    later = max(plan_shot("x", (4, FRAMES, 4, 6), geometry, TileGrid((2, 1, 1), (1, 0, 0))).tiles,
                key=lambda t: t.latent[0].start)  # fmt: skip
    assert later.latent[0].start - later.context > 0 and later.context >= 10  # not back to frame 0
    untiled, temporal = ingest_and_render(
        tmp_path, latent, {"family": "cogvideox", "config": NAME}, tmp_path / "vae", scheduler3, GRIDS
    )
    for got in (untiled, temporal):
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())


def _spec(tmp_path):
    from farm.decoders import spec_from_json

    return spec_from_json({"family": "cogvideox", "config": NAME, "weights": {"path": str(tmp_path / "vae")}})


def test_blocks_decode_in_the_whole_shots_frame_batches():
    """A block starting anywhere in the shot has ``1 + 4 (f - 1)`` pixel frames; one from the shot's start
    with two frames of lookahead equals diffusers' whole decode on the frames it keeps (the pair or
    first batch of its last frame complete), bit for bit."""
    from farm.decoders import load_decoder

    decoder = load_decoder({"family": "cogvideox", "config": NAME, "weights": {"random_seed": 2}})
    z = torch.from_numpy(smooth_latent(np.random.default_rng(4), (4, 9, 2, 2)))
    with torch.inference_mode():
        whole = decoder.model.decode(z[None]).sample[0]
    assert whole.shape[1] == 33
    for start in range(0, 5):
        for frames in range(1, 5):
            out = decoder.decode(z[:, start : start + frames], origin=(start, 0, 0))
            assert out.shape[1] == 1 + 4 * (frames - 1), (start, frames)
    lookahead = decoder.geometry.lookahead
    for end in range(1, 9):
        out = decoder.decode(z[:, : min(9, end + lookahead)], origin=(0, 0, 0))
        keep = 1 + 4 * (end - 1)
        assert torch.equal(out[:, :keep], (whole[:, :keep].float() + 1) / 2), end
    # without the lookahead, a frame whose pair is cut decodes otherwise: the lookahead is needed
    out = decoder.decode(z[:, :4], origin=(0, 0, 0))
    assert not torch.allclose(out[:, :13], (whole[:, :13] + 1) / 2, atol=1e-3)
