"""HunyuanVideo's tiles with the whole shot's GroupNorm statistics, reduced across them round by round.

Its GroupNorms take their statistics over everything they are given (channels of a group, every frame,
row and column), so a tile decoding alone differs from the whole decode everywhere. The tiles decode from
the mid block run once over the shot, and at every later GroupNorm each tile's sums over its own region
are added up into the shot's statistics, which every tile then normalises with
(`farm.decoders.hunyuanvideo.groupnorm_rounds`, `farm.run.statistics_rounds`). The 2x2 render against
untiled: tests/test_fidelity.py (halo).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import farm
from farm.decoders import decoder_class
from farm.decoders.hunyuanvideo import groupnorm_rounds
from farm.inputs.synthetic import synth_spec
from farm.media.settings import VideoSettings
from farm.planning.jobplan import plan_job
from farm.planning.plan_table import describe_plans
from farm.planning.tiling import ChunkSize, TileGrid, own_blocks, plan_shot, takes_statistics_rounds
from farm.run.whole_frame import whole_frame_group_of
from farm.store.frames import read_frames
from farm.store.job import create_job, open_job, write_shot
from farm.store.output import Output

NAME = "hunyuanvideo-tiny"


def geometry(**changes):
    from dataclasses import replace

    spec = synth_spec(NAME)
    return replace(decoder_class(spec).geometry_for_spec(spec), **changes)


@pytest.mark.parametrize("tiles, overlap, context", [
    ((2, 1, 1), (1, 0, 0), 3), ((1, 2, 2), (0, 2, 2), 0), ((3, 2, 2), (1, 1, 0), 2),
])  # fmt: skip
def test_the_tiles_own_regions_count_every_position_of_every_layer_once(tiles, overlap, context):
    """Tiles overlap (a causal temporal split shares a latent frame, a blend shares more, and halo and
    context are decoded twice), but the regions whose sums make the statistics partition the shot at
    every layer's resolution: its rows and columns scaled, its frames as the causal upsamplers make them
    (a block's first latent frame one frame, each later one `s`)."""
    shape = (4, 9, 12, 10)
    plan = plan_shot("s", shape, geometry(halo=3, context=context), TileGrid(tiles, overlap))
    owns = own_blocks(plan)
    _, f, h, w = shape
    for s, sp in ((1, 1), (1, 2), (2, 4), (4, 8)):
        counted = np.zeros((1 + s * (f - 1), sp * h, sp * w), dtype=int)
        for tile, own in zip(plan.tiles, owns, strict=True):
            bf, bh, bw = tile.decoded_fhw
            layer = (1 + s * (bf - 1), sp * bh, sp * bw)
            frames, rows, cols = groupnorm_rounds.own_at_layer(own, (bf, bh, bw), layer)
            f0, r0, c0 = tile.decode_origin()
            counted[frames.start + s * f0 : frames.stop + s * f0, rows.start + sp * r0 : rows.stop + sp * r0,
                    cols.start + sp * c0 : cols.stop + sp * c0] += 1  # fmt: skip
        assert (counted == 1).all(), (s, sp, np.unique(counted, return_counts=True))


def test_temporal_tiles_in_rounds_equal_the_untiled_decode():
    """Two temporal tiles, the second with context back to the shot's start, through the decoder's own
    round API: with the shot's statistics their frames are the untiled decode's; the first normalising
    over its own frames (the mid block shared, nothing else), they are not."""
    spec = synth_spec(NAME, seed=0, dtype="float32")
    decoder = decoder_class(spec).load(spec, "cpu")
    latent = torch.randn(4, 8, 6, 6, generator=torch.Generator().manual_seed(2))
    whole = decoder.decode(latent, origin=(0, 0, 0))
    plan = plan_shot("s", (4, 8, 6, 6), geometry(halo=0, context=8), TileGrid((2, 1, 1), (1, 0, 0)))
    assert plan.tiles[1].decode_slices()[0].start == 0 < plan.tiles[1].latent[0].start  # context, not own
    shared = decoder.whole_frame(latent)
    carried, sums = [], []
    for tile, own in zip(plan.tiles, own_blocks(plan), strict=True):
        state, tile_sums = decoder.statistics_start(shared[(slice(None), *tile.decode_slices())], own)
        carried.append(state)
        sums.append(tile_sums)
    for _ in range(decoder.statistics_round_count(spec.config)):
        stats = groupnorm_rounds.combine(sums)
        carried, sums = map(list, zip(*(decoder.statistics_round(c, stats) for c in carried), strict=True))
    assert all(s is None for s in sums)
    for tile, pixels in zip(plan.tiles, carried, strict=True):
        (f0, f1), own_frames = (tile.pixels[0].start, tile.pixels[0].stop), slice(-tile.pixels[0].size, None)
        assert torch.allclose(pixels[:, own_frames], whole[:, f0:f1], atol=1e-4)
        alone = decoder.decode_shared(shared[(slice(None), *tile.decode_slices())])
        if not tile.index:  # the first tile's statistics alone are its frames'
            assert (alone[:, own_frames] - whole[:, f0:f1]).abs().max() > 0.02


def test_rounds_run_where_a_plan_splits_height_or_width_only():
    """Rounds need every tile of the shot in each reduction and one decode call per tile: a plan that
    splits frames (a resumed render keeps only the temporal tiles it needs) or chunks a tile decodes
    its tiles whole, with the halo and the blend; one that splits only height or width shares the pass
    and the statistics, with no blend, and `farm plan` says so."""
    spec = synth_spec(NAME)
    geo = decoder_class(spec).geometry_for_spec(spec)
    spatial = plan_shot("s", (4, 3, 24, 24), geo, TileGrid((1, 2, 2), (0, 0, 0)))
    temporal = plan_shot("s", (4, 12, 24, 24), geo, TileGrid((2, 2, 2), (1, 5, 5)))
    chunked = plan_shot("s", (4, 3, 24, 24), geo, TileGrid((1, 2, 2), (0, 0, 0)), chunk=ChunkSize(height=10))
    assert takes_statistics_rounds(spatial)
    assert not takes_statistics_rounds(temporal) and not takes_statistics_rounds(chunked)
    shared = whole_frame_group_of([spatial, temporal, chunked], spec.to_json())
    assert set(shared) == {(0, k) for k in range(4)}
    assert "exact by shared statistics" in describe_plans([spatial], spec, 2)
    note = describe_plans([temporal], spec, 2)
    assert "a blend over overlap 5" in note and "statistics" not in note


def test_explicit_tiles_blend_only_where_the_rounds_cannot_run(tmp_path):
    spec = synth_spec(NAME, seed=0)
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    write_shot(job, "s", np.zeros((4, 12, 24, 24), np.float32), fps=24.0)
    overlap = {tiles: plan_job(open_job(job), farm.PlanOptions(tiles=tiles), 1)[0].grid.overlap
               for tiles in ((1, 2, 2), (2, 2, 2))}  # fmt: skip
    assert overlap[(1, 2, 2)] == (0, 0, 0)
    assert overlap[(2, 2, 2)][1:] == (5, 5)


def test_a_resumed_render_runs_the_rounds_again_for_the_batches_left(tmp_path, scheduler3):
    """Rounds are not recorded: a render of the first frames, then one of the rest, gives the frames an
    untiled render gives (the second runs every spatial tile's rounds again for the batches left)."""
    spec = synth_spec(NAME, seed=0)
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    latent = np.random.default_rng(1).standard_normal((4, 3, 24, 24)).astype(np.float32)
    write_shot(job, "s", latent, fps=24.0)
    quiet = {"scheduler": scheduler3, "video": VideoSettings(enabled=False), "log": lambda _: None}
    farm.render(job, tmp_path / "whole", options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=4), **quiet)
    split = farm.PlanOptions(tiles=(1, 2, 2), batch_frames=4)
    first = farm.render(job, tmp_path / "tiled", options=split, frames="1-4", **quiet)
    assert not first.failed
    rest = farm.render(job, tmp_path / "tiled", options=split, **quiet)
    assert not rest.failed
    whole = read_frames(Output(tmp_path / "whole"), "s").astype(np.float64)
    tiled = read_frames(Output(tmp_path / "tiled"), "s").astype(np.float64)
    assert np.abs(tiled - whole).max() <= 1.0


def test_a_worker_carrying_several_tiles_between_rounds_is_counted_before_the_render():
    """A worker holds the carried activations of all its tiles of a shot between rounds: the released
    config's 1x2x2 tiles of a 33x480x832 shot fit a budget on four workers that one worker, carrying the
    other three tiles, does not; `check_fits` refuses the one-worker plan before any decode, saying what
    would help."""
    from dataclasses import replace

    from farm.errors import FarmError
    from farm.planning.budgets import check_fits, tile_peak_bytes, worker_peak_bytes
    from farm.planning.tiling import assign_round_robin

    spec = replace(synth_spec("hunyuanvideo"), dtype="bfloat16")
    cls = decoder_class(spec)
    geo = cls.geometry_for_spec(spec)
    plan = plan_shot("s", (16, 9, 60, 104), geo, TileGrid((1, 2, 2), (0, 0, 0)))
    assert takes_statistics_rounds(plan) and geo.halo == 12
    alone, spread = assign_round_robin([plan], 1)[0], assign_round_robin([plan], 4)[0]
    tile = spread.tiles[0]
    carried = cls.statistics_carried_bytes(spec, int(np.prod(geo.pixel_shape(tile.decoded_fhw))))
    assert tile.decoded_fhw == (9, 42, 64)  # halo 12 on the inner sides
    assert carried == (256 + 128) * 2 * 33 * 336 * 512  # channels, bf16 bytes, decoded pixel-frames
    peak = tile_peak_bytes(cls, spec, tile, plan.chunk)
    assert worker_peak_bytes(cls, spec, spread, tile) == peak
    assert worker_peak_bytes(cls, spec, alone, alone.tiles[0]) > peak + 2 * carried
    budget = peak + carried
    check_fits([spread], spec, budget)
    with pytest.raises(FarmError, match="more workers"):
        check_fits([alone], spec, budget)


def test_auto_tiles_count_what_a_worker_carries_between_rounds_and_take_no_blend(tmp_path):
    """The planner's own grids: on two workers under 32 GiB the released config's 33x480x832 shot splits
    height or width with no overlap (its rounds reach the dtype's noise), each worker's tile and what its
    other tile carries within the budget; on one worker, which would carry them all, no grid fits and the
    refusal says what would help (`check_fits` would have refused the plan before any decode)."""
    from dataclasses import replace

    from farm.errors import FarmError
    from farm.planning.budgets import check_fits

    spec = replace(synth_spec("hunyuanvideo"), dtype="bfloat16")
    job = tmp_path / "job.zarr"
    create_job(job, spec)
    write_shot(job, "s", np.zeros((16, 9, 60, 104), np.float32), fps=24.0)
    budget = farm.PlanOptions(worker_memory=32 * 2**30)
    (plan,) = plan_job(open_job(job), budget, 2)
    assert plan.grid.tiles[0] == 1 and plan.grid.overlap == (0, 0, 0) and takes_statistics_rounds(plan)
    check_fits([plan], spec, 32 * 2**30)
    with pytest.raises(FarmError, match="more workers hold less each"):
        plan_job(open_job(job), budget, 1)
