"""Temporal tiles with causal context, per family, in real renders against the untiled render.

Each family's adapter records how many latent frames a temporal tile decodes before (context) and after
(lookahead) its own and discards. Where the decoder's temporal receptive field is finite (LTX-2, LTX-Video,
Wan, CogVideoX, Mochi) that makes a temporal split exact: within one uint8 level of the untiled render.
HunyuanVideo's GroupNorms take statistics over the whole tile, so no split is exact there; its context
must make a 2-tile temporal split at least 1 dB closer to untiled than the same split without context.
The shots are long enough that a later tile's context does not reach back to the shot's first frame
(which would make the test trivially exact). Spatial tiles decode a halo (see the end of this file).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import farm
from farm.decoders import decoder_class
from farm.inputs.synthetic import smooth_latent, synth_spec
from farm.media.settings import VideoSettings
from farm.planning import planner
from farm.planning.jobplan import plan_job
from farm.store.frames import read_frames
from farm.store.job import create_job, open_job, write_shot
from farm.store.output import Output

FRAMES_ONLY = VideoSettings(enabled=False)
# decoder → latent frames, rows, columns of the test shot (long enough that a later tile's context does
# not reach frame 0; HunyuanVideo's wide enough for a 2x2 split at overlap 2)
SHOTS = {
    "ltx2-tiny": (30, 2, 2),
    "ltxv-tiny": (24, 2, 2),
    "wan-tiny": (56, 2, 2),
    "hunyuanvideo-tiny": (20, 4, 4),
    "cogvideox-tiny": (48, 2, 2),
    "mochi-tiny": (30, 2, 2),
}
TEMPORAL = farm.PlanOptions(tiles=(2, 1, 1), overlap=(1, 0, 0), batch_frames=64)


def make_job(tmp_path, name: str):
    spec = synth_spec(name, seed=3)
    cls = decoder_class(spec)
    path = tmp_path / f"{name}.zarr"
    create_job(path, spec)
    channels = cls.latent_channels_for(spec.config)
    latent = smooth_latent(np.random.default_rng(5), (channels, *SHOTS[name]))
    write_shot(path, "s", latent, fps=24.0)
    return path, cls.geometry_for(spec.config)


def render(job, out, scheduler, options) -> np.ndarray:
    stats = farm.render(job, out, scheduler=scheduler, options=options, video=FRAMES_ONLY, log=lambda _: None)
    assert not stats.failed
    return read_frames(Output(out), "s").astype(np.float64)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def frame_psnr(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [psnr(x, y) for x, y in zip(a, b, strict=True)]


def seam_frame(job) -> int:
    """First pixel frame of the later temporal tile."""
    plan = plan_job(open_job(job), TEMPORAL, 1)[0]
    later = [t for t in plan.tiles if t.grid_pos[0] == 1][0]
    assert later.context > 0 and later.latent[0].start - later.context > 0  # context, not the whole prefix
    return later.pixels[0].start


@pytest.mark.parametrize("name", ["ltx2-tiny", "ltxv-tiny", "wan-tiny", "cogvideox-tiny", "mochi-tiny"])
def test_temporal_split_is_exact_where_the_receptive_field_is_finite(tmp_path, scheduler3, name):
    job, geometry = make_job(tmp_path, name)
    seam_frame(job)
    whole = render(job, tmp_path / "whole", scheduler3, farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64))
    split = render(job, tmp_path / "split", scheduler3, TEMPORAL)
    assert np.abs(split - whole).max() <= 1.0


# The same 2-tile temporal split of this shot decoded without context frames
# (`benchmarks/measure_halo.py context --decoder hunyuanvideo-tiny --shape 20,4,4 --latent smooth --seed 3
# --contexts 0`): 17.8 dB over the clip. Its context must gain at least 1 dB on that.
CONTEXT_FREE_DB = 17.8


def test_hunyuanvideo_temporal_split_gains_from_its_context(tmp_path, scheduler3):
    job, _ = make_job(tmp_path, "hunyuanvideo-tiny")
    seam_frame(job)
    whole = render(job, tmp_path / "whole", scheduler3, farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64))
    split = render(job, tmp_path / "split", scheduler3, TEMPORAL)
    assert psnr(split, whole) >= CONTEXT_FREE_DB + 1.0


# Spatial seams: the default overlap of a split (explicit tiles without --overlap, and auto) is the
# decoder's measured one (`spatial_overlap_for`). Rendered here on the latents and weights
# `benchmarks/measure_seams.py spatial` measured (seed 0, 3 latent frames, 16 units along the split axis,
# 8 across), its seam must reach the target. HunyuanVideo's tiles of a split like these take the shot's
# GroupNorm statistics in rounds, with no blend (its overlap, 0, is `spatial_overlap_for`'s only where
# its rounds cannot run: a split of frames too, or chunks).
SPATIAL_SHOTS = {"h": (3, 16, 8), "w": (3, 8, 16)}  # shot → latent frames, rows, columns
SPLIT = {"h": (1, 2, 1), "w": (1, 1, 2)}


def seam_band(plan, axis: int, scale: int) -> np.ndarray:
    """Pixels (along `axis`, 1 or 2) within one latent unit (`scale` pixels) of a tile edge inside the
    shot, and the overlaps."""
    extent = plan.pixel_shape[axis]
    band = np.zeros(extent, dtype=bool)
    cover = np.zeros(extent, dtype=int)
    for span in {(t.pixels[axis].start, t.pixels[axis].stop) for t in plan.tiles}:
        cover[span[0] : span[1]] += 1
        for edge in span:
            if 0 < edge < extent:
                band[max(0, edge - scale) : edge + scale] = True
    return band | (cover > 1)


def seam_psnr(job, out, scheduler, shot: str, overlap: tuple[int, int, int] | None) -> tuple[float, int]:
    """Seam-band PSNR of `shot` split in two against its untiled render (in OUT/whole), and the overlap."""
    options = farm.PlanOptions(tiles=SPLIT[shot], overlap=overlap, batch_frames=64)
    plan = plan_job(open_job(job), options, 1, [shot])[0]
    axis = 1 if shot == "h" else 2
    farm.render(job, out, scheduler=scheduler, options=options, shots=[shot], video=FRAMES_ONLY,
                log=lambda _: None)  # fmt: skip
    split = read_frames(Output(out), shot).astype(np.float64)
    whole = read_frames(Output(job.parent / "whole"), shot).astype(np.float64)
    band = seam_band(plan, axis, plan.pixel_shape[axis] // plan.latent_shape[axis + 1])
    index = (slice(None), band, slice(None)) if axis == 1 else (slice(None), slice(None), band)
    return psnr(split[index], whole[index]), plan.grid.overlap[axis]


@pytest.mark.parametrize("name", ["ltx2-tiny", "ltxv-tiny", "wan-tiny", "hunyuanvideo-tiny"])
def test_default_spatial_overlap_meets_the_seam_target(tmp_path, scheduler3, name):
    from farm.decoders.base import SEAM_TARGET_DB

    spec = synth_spec(name, seed=0)
    cls = decoder_class(spec)
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    for shot, fhw in SPATIAL_SHOTS.items():
        latent = smooth_latent(np.random.default_rng(0), (cls.latent_channels_for(spec.config), *fhw))
        write_shot(job, shot, latent, fps=24.0)
    farm.render(job, tmp_path / "whole", scheduler=scheduler3, options=farm.PlanOptions(tiles=(1, 1, 1)),
                video=FRAMES_ONLY, log=lambda _: None)  # fmt: skip
    expected = cls.spatial_overlap_for(spec.config)
    assert planner.min_overlap_for(spec)[1:] == (expected, expected)  # where --tiles auto splits
    seams = []  # the worse axis counts, as in the measurement
    for shot in SPLIT:
        seam, overlap = seam_psnr(job, tmp_path / shot, scheduler3, shot, None)
        assert overlap == (0 if cls.statistics_exact(spec.config) else expected)
        seams.append(seam)
    assert min(seams) >= SEAM_TARGET_DB, seams


# Spatial halo: a 2x2 split with the default options (the decoder's halo; no blend where the halo alone
# is exact) against the same shot untiled, on white-noise latents (the harder case) wide enough that no
# tile's halo covers the frame. Exact halos: within one uint8 level of untiled; Wan's among them, its
# tiles decoding from the mid block run once over the whole frame (a whole-frame task per shot).
# HunyuanVideo's GroupNorms see the whole shot: its tiles decode from the mid block run once over the shot
# and take the shot's statistics at every later GroupNorm, reduced across the tiles round by round, so
# hunyuanvideo-tiny at halo 8 is exact too (without the rounds: halo and blend 36.2 dB over the band).
# MiniMax-H3's ViT decodes its own 256-px tiles, laid out from the decoded block's corner: minimax-h3-tiny
# 56.4 dB at halo 8. CogVideoX's and Mochi's GroupNorms see whole frames: their halo and blend must
# reach what the halo alone measured (cogvideox-tiny 41.6 dB at 8, mochi-tiny 45.0 at 4), as HunyuanVideo
# 1.5's, Cosmos's, Allegro's and VidTok's (hunyuanvideo15-tiny 44.9 dB at 6, cosmos-tiny 42.8 at 12,
# allegro-tiny 34.1 at 12, 36.2 with its blend; vidtok-tiny 47.2 at 8, 52.4 with its blend).
HALO_SHOTS = {  # decoder → latent frames, rows, columns; the seam-band PSNR a non-exact halo must reach
    "ltx2-tiny": ((2, 20, 20), None),
    "ltx2.3-tiny": ((2, 20, 20), None),
    "ltxv-tiny": ((2, 24, 24), None),
    "ltx2-diffusion-tiny": ((3, 12, 12), None),
    "wan-tiny": ((3, 24, 24), None),
    "hunyuanvideo-tiny": ((3, 24, 24), None),
    "minimax-h3-tiny": ((3, 32, 36), 50.0),  # 56.4 dB measured for the halo alone (7x40x44)
    "cogvideox-tiny": ((3, 24, 24), 40.0),
    "mochi-tiny": ((3, 24, 24), 43.0),
    "hunyuanvideo15-tiny": ((3, 24, 24), 40.0),
    "cosmos-tiny": ((3, 32, 32), 40.0),
    "allegro-tiny": ((3, 32, 32), 34.0),
    "vidtok-tiny": ((3, 32, 32), 50.0),
}


@pytest.mark.parametrize("name", sorted(HALO_SHOTS))
def test_halo_tiles_against_the_untiled_render(tmp_path, scheduler3, name):
    spec = synth_spec(name, seed=0)
    cls = decoder_class(spec)
    fhw, band_target = HALO_SHOTS[name]
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    latent = np.random.default_rng(1).standard_normal((cls.latent_channels_for(spec.config), *fhw))
    write_shot(job, "s", latent.astype(np.float32), fps=24.0)
    split = farm.PlanOptions(tiles=(1, 2, 2), batch_frames=64)
    plan = plan_job(open_job(job), split, 1)[0]
    halo = cls.geometry_for_spec(spec).halo
    assert halo > 0 and {max(t.halo) for t in plan.tiles} == {halo}
    assert all(t.decoded_fhw[1:] < fhw[1:] for t in plan.tiles)  # the halo, not the frame, bounds a tile
    exact = cls.halo_is_exact(spec.config) or cls.statistics_exact(spec.config)
    assert plan.grid.overlap[1:] == ((0, 0) if exact else (cls.spatial_overlap_for(spec.config),) * 2)
    whole = render(job, tmp_path / "whole", scheduler3, farm.PlanOptions(tiles=(1, 1, 1), batch_frames=64))
    tiled = render(job, tmp_path / "tiled", scheduler3, split)
    if band_target is None:
        assert np.abs(tiled - whole).max() <= 1.0
    else:
        band = np.zeros(whole.shape[1:3], dtype=bool)
        for edge in {t.pixels[1].start for t in plan.tiles} - {0}:
            band[edge - 16 : edge + 16, :] = True
        for edge in {t.pixels[2].start for t in plan.tiles} - {0}:
            band[:, edge - 16 : edge + 16] = True
        assert psnr(tiled[:, band], whole[:, band]) >= band_target
