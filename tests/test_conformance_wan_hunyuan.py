"""Wan 2.1 / 2.2 and HunyuanVideo against their reference: diffusers 0.42.1's classes, loaded the way
users' files load there, in float32 on a CPU.

The files are written in the layout each model ships: Wan 2.1's ``Wan2.1_VAE.pth`` (a ``torch.save`` of
the original naming, which diffusers' single-file converter reads), Wan 2.2 TI2V's ``Wan2.2_VAE.pth`` (its
own naming, as diffusers' conversion script reads it), HunyuanVideo's ``pytorch_model.pt``
(``{"state_dict": ...}`` in the names diffusers uses too). That diffusers' converters and classes decode
as the original code does was checked separately against Wan2.1 / Wan2.2 / HunyuanVideo's own ``vae``
modules (docs/decoders.md).

farm ingests a latent with the named tiny config and the file, and renders it on a real cluster: the frames
equal the reference pipeline's decode (its un-normalisation, ``vae.decode``) to the last 8-bit level. Tiled:
Wan's 2 temporal tiles (causal, context covering the receptive field) are as exact; on the same 2x2 spatial
grid farm's frames are at least as close to the untiled decode as diffusers' own tiled decode
(``enable_tiling``), and HunyuanVideo's 2 temporal tiles (never exact: GroupNorm statistics span a tile) at
least as close as diffusers' framewise decode in 2 tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from farm.decoders import FAMILIES
from farm.decoders.geometry import Geometry
from farm.inputs.synthetic import smooth_latent
from farm.planning.tiling import TileGrid, plan_shot
from tests.helpers import ingest_and_render, levels, psnr_db

pytestmark = pytest.mark.model

LATENT_HW = (4, 6)
SPATIAL_OVERLAP = 1  # on 4 x 6 latent units, farm's 2x2 grid is the grid diffusers' tiling cuts (checked)
GRIDS = [((1, 1, 1), None), ((2, 1, 1), (1, 0, 0)), ((1, 2, 2), (0, SPATIAL_OVERLAP, SPATIAL_OVERLAP))]


def seeded(model_class, config: dict, seed: int = 5) -> torch.nn.Module:
    """`model_class(**config)` with seeded weights: diffusers' initialisation from `seed`, then every
    parameter moved off it a little (some start at exactly zero or one)."""
    torch.manual_seed(seed)
    model = model_class(**config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model.eval()


def diffusers_spatial_tiles(model, fhw: tuple[int, int, int], scale: int) -> None:
    """Turn on diffusers' spatial tiling of `model` on the 2x2 grid farm cuts at `SPATIAL_OVERLAP`: tiles of
    ``ceil(n / 2) + overlap`` latent units every ``ceil(n / 2)`` (asserted to be farm's tiles)."""
    o = SPATIAL_OVERLAP
    plan = plan_shot("x", (1, *fhw), Geometry(scale, 4), TileGrid((1, 2, 2), (0, o, o)))
    for k, axis in ((1, "height"), (2, "width")):
        n, half = fhw[k], -(-fhw[k] // 2)
        setattr(model, f"tile_sample_min_{axis}", (half + o) * scale)
        setattr(model, f"tile_sample_stride_{axis}", half * scale)
        theirs = [(start, min(start + half + o, n)) for start in range(0, n, half)]
        ours = sorted({(t.latent[k].start, t.latent[k].end) for t in plan.tiles})
        assert ours == theirs, (axis, ours, theirs)
    model.use_tiling = True


def decode(model, z: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return levels(model.decode(z[None], return_dict=False)[0][0])


def assert_same_levels(got: np.ndarray, want: np.ndarray) -> None:
    """Equal to the last 8-bit level: float32 rounding may move a value on a rounding boundary by one."""
    assert got.shape == want.shape
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, (diff.max(), (diff > 0).mean())


def assert_at_least_as_close(ours: np.ndarray, theirs: np.ndarray, want: np.ndarray) -> None:
    """farm's tiled frames are at least as close to the untiled `want` as the reference's tiled ones."""
    farm_db, reference_db = psnr_db(ours, want), psnr_db(theirs, want)
    print(f"tiled vs untiled: farm {farm_db:.2f} dB, the reference's own tiling {reference_db:.2f} dB")
    assert farm_db >= reference_db, (farm_db, reference_db)


def wan_reference_decode(model, latent: torch.Tensor) -> torch.Tensor:
    """WanPipeline's un-normalisation of the latents it hands to ``vae.decode``."""
    mean = torch.tensor(model.config.latents_mean).view(-1, 1, 1, 1)
    std = torch.tensor(model.config.latents_std).view(-1, 1, 1, 1)
    return latent / (1.0 / std) + mean


def test_wan21_original_file_renders_as_diffusers_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers


    cls, name = FAMILIES["wan"], "wan-tiny"
    source = seeded(AutoencoderKLWan, cls.named_configs[name])
    full = cls._full_config(cls.named_configs[name])
    keep = cls.decoder_tensor_shapes(cls.named_configs[name])
    path = tmp_path / "Wan2.1_VAE.pth"
    torch.save({cls.original_name(k, "wan-original", full): v.contiguous()
                for k, v in source.state_dict().items() if k in keep}, path)  # fmt: skip

    reference = AutoencoderKLWan(**cls.named_configs[name]).eval()  # read as diffusers' converter reads it
    missing, _ = reference.load_state_dict(convert_wan_vae_to_diffusers(torch.load(path)), strict=False)
    assert not [k for k in missing if k in keep]
    latent = smooth_latent(np.random.default_rng(3), (4, 3, *LATENT_HW))
    z = wan_reference_decode(reference, torch.from_numpy(latent))
    want = decode(reference, z)
    assert want.shape == (9, 32, 48, 3) and want.std() > 10
    diffusers_spatial_tiles(reference, z.shape[1:], 8)
    theirs_tiled = decode(reference, z)

    untiled, temporal, spatial = ingest_and_render(
        tmp_path, latent, {"family": "wan", "config": name}, path, scheduler3, GRIDS
    )
    assert_same_levels(untiled, want)
    assert_same_levels(temporal, want)  # causal: context covering the receptive field makes it exact
    assert_at_least_as_close(spatial, theirs_tiled, want)


def test_wan22_original_file_renders_as_diffusers_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLWan


    cls, name = FAMILIES["wan"], "wan2.2-tiny"
    # the reference: diffusers' class with the weights under their diffusers names, which is what
    # `convert_vae_22` (diffusers' scripts/convert_wan_to_diffusers.py) makes of Wan2.2_VAE.pth
    reference = seeded(AutoencoderKLWan, cls.named_configs[name])
    full = cls._full_config(cls.named_configs[name])
    keep = cls.decoder_tensor_shapes(cls.named_configs[name])
    path = tmp_path / "Wan2.2_VAE.pth"
    torch.save({cls.original_name(k, "wan22-original", full): v.contiguous()
                for k, v in reference.state_dict().items() if k in keep}, path)  # fmt: skip
    latent = smooth_latent(np.random.default_rng(4), (8, 3, *LATENT_HW))
    z = wan_reference_decode(reference, torch.from_numpy(latent))
    want = decode(reference, z)
    assert want.shape == (9, 64, 96, 3) and want.std() > 10
    diffusers_spatial_tiles(reference, z.shape[1:], 16)
    theirs_tiled = decode(reference, z)

    untiled, temporal, spatial = ingest_and_render(
        tmp_path, latent, {"family": "wan", "config": name}, path, scheduler3, GRIDS
    )
    assert_same_levels(untiled, want)
    assert_same_levels(temporal, want)
    assert_at_least_as_close(spatial, theirs_tiled, want)


def test_hunyuanvideo_file_renders_as_diffusers_decodes(tmp_path, scheduler3):
    from diffusers import AutoencoderKLHunyuanVideo

    cls, name = FAMILIES["hunyuanvideo"], "hunyuanvideo-tiny"
    path = tmp_path / "pytorch_model.pt"
    source = seeded(AutoencoderKLHunyuanVideo, cls.named_configs[name])
    torch.save({"state_dict": {k: v.contiguous() for k, v in source.state_dict().items()}}, path)
    reference = AutoencoderKLHunyuanVideo(**cls.named_configs[name]).eval()  # as HunyuanVideo's load_vae
    reference.load_state_dict(torch.load(path)["state_dict"])
    latent = smooth_latent(np.random.default_rng(5), (4, 5, *LATENT_HW))
    z = torch.from_numpy(latent) / reference.config.scaling_factor  # HunyuanVideoPipeline
    reference.use_framewise_decoding = False  # the untiled decode (on by default: 2 tiles from 5 frames)
    want = decode(reference, z)
    assert want.shape == (17, 32, 48, 3) and want.std() > 10
    reference.use_framewise_decoding = True  # its temporal tiles: 2, one latent frame of overlap
    half = -(-z.shape[1] // 2)
    reference.tile_sample_min_num_frames, reference.tile_sample_stride_num_frames = (half + 1) * 4, half * 4
    theirs_temporal = decode(reference, z)
    reference.use_framewise_decoding = False
    diffusers_spatial_tiles(reference, z.shape[1:], 8)
    theirs_tiled = decode(reference, z)

    untiled, temporal, spatial = ingest_and_render(
        tmp_path, latent, {"family": "hunyuanvideo", "config": name}, path, scheduler3, GRIDS
    )
    assert_same_levels(untiled, want)
    assert_at_least_as_close(temporal, theirs_temporal, want)
    assert_at_least_as_close(spatial, theirs_tiled, want)
