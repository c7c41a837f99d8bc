"""farm.planning.tiling: pure tile planning (splits, causal shift, ramps, batches, chunks, streaming window).

Property tests over many shapes, counts and overlaps, checked against the rules in the module docstring
and DESIGN.md ("Two tilings"), plus the LTX-2 redundancy figures and the user-facing error messages.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from farm.errors import FarmError
from farm.planning.tiling import (
    Batch,
    ChunkSize,
    Geometry,
    Interval,
    ShotPlan,
    TileGrid,
    assign_round_robin,
    carried_frames,
    plan_chunks,
    plan_identity,
    plan_shot,
    split_by_count,
    trapezoid,
    validate_chunking,
)
from tests.helpers import plans_required_window

LTX2 = Geometry(spatial_scale=32, temporal_scale=8, causal=True)
GEOMETRIES = [
    LTX2,
    Geometry(spatial_scale=32, temporal_scale=8, causal=False),
    Geometry(spatial_scale=8, temporal_scale=4, causal=True),
    Geometry(spatial_scale=8, temporal_scale=4, causal=False),
    Geometry(spatial_scale=4, temporal_scale=1, causal=True),
    Geometry(spatial_scale=1, temporal_scale=3, causal=True),
]
SMALL_GEOMETRIES = [
    Geometry(spatial_scale=4, temporal_scale=2, causal=True),
    Geometry(spatial_scale=4, temporal_scale=2, causal=False),
    Geometry(spatial_scale=2, temporal_scale=4, causal=True),
    Geometry(spatial_scale=3, temporal_scale=1, causal=True),
    Geometry(spatial_scale=1, temporal_scale=3, causal=False),
]
PROPS = settings(deadline=None)  # examples: the profile's (tests/conftest.py: 200, or 40 in the fast tier)


# --------------------------------------------------------------------------------------------------
# Strategies and helpers
# --------------------------------------------------------------------------------------------------


@st.composite
def axis_split(draw, max_size: int = 12, max_count: int | None = None) -> tuple[int, int, int]:
    """(size, count, overlap) valid for `split_by_count`: count ≤ size, overlap ≤ size - count."""
    size = draw(st.integers(1, max_size))
    count = draw(st.integers(1, min(size, max_count or size)))
    overlap = draw(st.integers(0, 3)) if count == 1 else draw(st.integers(0, size - count))
    return size, count, overlap


@st.composite
def shot_case(draw, geometries=GEOMETRIES, max_size: int = 12, max_count: int | None = None):
    """A valid plan_shot input: (geometry, latent shape, grid, batch_frames)."""
    geometry = draw(st.sampled_from(geometries))
    axes = [draw(axis_split(max_size, max_count)) for _ in range(3)]
    channels = draw(st.integers(1, 4))
    latent = (channels, *(a[0] for a in axes))
    grid = TileGrid(tiles=tuple(a[1] for a in axes), overlap=tuple(a[2] for a in axes))
    batch_frames = draw(st.integers(1, 40))
    return geometry, latent, grid, batch_frames


def pixel_interval(iv: Interval, geometry: Geometry, axis: int) -> tuple[int, int]:
    """Reference latent → pixel mapping (the rule stated in DESIGN.md)."""
    if axis == 0:
        t = geometry.temporal_scale
        if geometry.causal:
            return iv.start * t, 1 + (iv.end - 1) * t
        return iv.start * t, iv.end * t
    k = geometry.spatial_scale
    return iv.start * k, iv.end * k


def raw_ramp(iv: Interval, geometry: Geometry, axis: int) -> list[float]:
    """The un-normalised trapezoid of one tile along one axis, in pixel units."""
    start, stop = pixel_interval(iv, geometry, axis)
    if axis == 0 and geometry.causal:
        left = 0 if iv.left_ramp == 0 else 1 + (iv.left_ramp - 1) * geometry.temporal_scale
        return trapezoid(stop - start, left, iv.right_ramp * geometry.temporal_scale, left_from_zero=True)
    scale = geometry.temporal_scale if axis == 0 else geometry.spatial_scale
    return trapezoid(stop - start, iv.left_ramp * scale, iv.right_ramp * scale)


def axis_tiles(plan: ShotPlan, axis: int) -> list:
    """The distinct tiles along one axis (grid position 0 on the other two axes), in order."""
    return [t for t in plan.tiles if all(t.grid_pos[a] == 0 for a in range(3) if a != axis)]


def unshifted(plan: ShotPlan, geometry: Geometry, axis: int) -> list[Interval]:
    """The axis' latent intervals with the causal shift undone (the plain count-based split)."""
    ivs = [t.latent[axis] for t in axis_tiles(plan, axis)]
    if axis == 0 and geometry.causal:
        ivs = [iv if i == 0 else Interval(iv.start + 1, iv.end, iv.left_ramp - 1, iv.right_ramp)
               for i, iv in enumerate(ivs)]  # fmt: skip
    return ivs


def simulate(plans: list[ShotPlan], window: int) -> bool:
    """Drive the render loop abstractly; True when every tile is submitted and every batch written.

    Tiles are submitted in order across plans while fewer than `window` are held; batches complete in
    order (across plans) as soon as all their tiles are submitted; a tile is released once every batch
    it feeds is complete.
    """
    order = [(p, t.index) for p, plan in enumerate(plans) for t in plan.tiles]
    batches = [(p, b) for p, plan in enumerate(plans) for b in plan.batches]
    feeds: dict[tuple[int, int], list[int]] = {key: [] for key in order}
    for g, (p, b) in enumerate(batches):
        for t in b.tiles:
            feeds[(p, t)].append(g)
    submitted: set[tuple[int, int]] = set()
    held: set[tuple[int, int]] = set()
    cursor = done = 0
    while True:
        while done < len(batches) and all((batches[done][0], t) in submitted for t in batches[done][1].tiles):
            done += 1
        held = {k for k in held if any(g >= done for g in feeds[k])}
        if cursor < len(order) and len(held) < window:
            submitted.add(order[cursor])
            held.add(order[cursor])
            cursor += 1
            continue
        return cursor == len(order) and done == len(batches)


# --------------------------------------------------------------------------------------------------
# Trapezoid ramps
# --------------------------------------------------------------------------------------------------


@PROPS
@given(st.integers(1, 60), st.integers(0, 70), st.integers(0, 70), st.booleans())
def test_trapezoid_shape(length, left, right, from_zero):
    w = trapezoid(length, left, right, left_from_zero=from_zero)
    assert len(w) == length
    assert all(0.0 <= v <= 1.0 for v in w)
    lo, hi = min(left, length), length - min(right, length)
    assert all(v == 1.0 for v in w[lo:hi])
    if from_zero and left:
        assert w[0] == 0.0
    else:
        assert min(w) > 0.0


@PROPS
@given(st.integers(1, 40), st.integers(0, 20))
def test_complementary_ramps_sum_to_one(ramp, flat):
    # A right ramp of `ramp` samples against a left ramp of the same length (both exclude 0 and 1).
    a = trapezoid(flat + ramp, 0, ramp)
    b = trapezoid(ramp + flat, ramp, 0)
    overlap = [x + y for x, y in zip(a[flat:], b[:ramp], strict=True)]
    assert overlap == pytest.approx([1.0] * ramp, abs=1e-12)
    # Causal: the left ramp starts at exactly 0 one sample early and is one sample wider.
    c = trapezoid(ramp + 1 + flat, ramp + 1, 0, left_from_zero=True)
    assert c[0] == 0.0
    overlap = [x + y for x, y in zip([1.0, *a[flat:]], c[: ramp + 1], strict=True)]
    assert overlap == pytest.approx([1.0] * (ramp + 1), abs=1e-12)


# --------------------------------------------------------------------------------------------------
# Count-based split, causal shift, pixel mapping
# --------------------------------------------------------------------------------------------------


@PROPS
@given(axis_split(max_size=40))
def test_split_by_count(case):
    size, count, overlap = case
    ivs = split_by_count(size, count, overlap)
    assert len(ivs) == count
    assert ivs[0].start == 0 and ivs[-1].end == size
    sizes = [iv.size for iv in ivs]
    assert max(sizes) - min(sizes) <= 1
    if count > 1:
        assert sum(sizes) == size + (count - 1) * overlap
        assert min(sizes) > overlap
    for a, b in zip(ivs, ivs[1:], strict=False):
        assert a.end - b.start == overlap
        assert a.right_ramp == overlap and b.left_ramp == overlap
    assert ivs[0].left_ramp == 0 and ivs[-1].right_ramp == 0


@PROPS
@given(shot_case())
def test_plan_splits_and_maps(case):
    geometry, latent, grid, batch_frames = case
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    assert plan.latent_shape == latent
    assert plan.pixel_shape == geometry.pixel_shape(latent[1:])
    assert len(plan.tiles) == math.prod(grid.tiles)
    assert [t.index for t in plan.tiles] == list(range(len(plan.tiles)))
    # frames-major grid order
    assert [t.grid_pos for t in plan.tiles] == sorted(t.grid_pos for t in plan.tiles)
    for axis in range(3):
        size, count, overlap = latent[1 + axis], grid.tiles[axis], grid.overlap[axis]
        causal_frames = axis == 0 and geometry.causal
        tiles = axis_tiles(plan, axis)
        assert len(tiles) == count
        # every tile at grid index i along this axis shares the same interval and span
        for t in plan.tiles:
            assert t.latent[axis] == tiles[t.grid_pos[axis]].latent[axis]
            assert t.pixels[axis] == tiles[t.grid_pos[axis]].pixels[axis]
        ivs = [t.latent[axis] for t in tiles]
        plain = unshifted(plan, geometry, axis)
        # count-based split before the shift
        assert plain[0].start == 0 and plain[-1].end == size
        sizes = [iv.size for iv in plain]
        assert max(sizes) - min(sizes) <= 1
        for a, b in zip(plain, plain[1:], strict=False):
            assert a.end - b.start == overlap
        # after the shift: temporal neighbours share overlap + 1 frames, and do a frame more of work
        expected_overlap = overlap + 1 if causal_frames else overlap
        for a, b in zip(ivs, ivs[1:], strict=False):
            assert a.end - b.start == expected_overlap
            assert b.left_ramp == expected_overlap and a.right_ramp == overlap
        assert ivs[0].start == 0 and ivs[-1].end == size
        extra = (count - 1) * overlap + ((count - 1) if causal_frames else 0)
        assert sum(iv.size for iv in ivs) == size + extra
        # pixel mapping
        extent = plan.pixel_shape[axis]
        for t in tiles:
            span = t.pixels[axis]
            assert (span.start, span.stop) == pixel_interval(t.latent[axis], geometry, axis)
            assert 0 <= span.start < span.stop <= extent
            assert len(span.weights) == span.size
        spans = [t.pixels[axis] for t in tiles]
        assert spans[0].start == 0 and spans[-1].stop == extent
        for a, b in zip(spans, spans[1:], strict=False):
            # starts may tie: a causal first tile of overlap + 1 frames lies inside the shifted second
            assert a.start <= b.start and a.stop < b.stop
            assert b.start <= a.stop  # neighbours touch or overlap: no gap
        if causal_frames:
            for t in tiles[1:]:
                s, e = t.latent[0].start, t.latent[0].end
                assert (t.pixels[0].start, t.pixels[0].stop) == (
                    s * geometry.temporal_scale,
                    1 + (e - 1) * geometry.temporal_scale,
                )
                assert t.pixels[0].weights[0] == 0.0  # the shifted tile's first frame has no say


@PROPS
@given(shot_case())
def test_per_axis_weights_sum_to_one(case):
    geometry, latent, grid, batch_frames = case
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    for axis in range(3):
        extent = plan.pixel_shape[axis]
        tiles = axis_tiles(plan, axis)
        total = np.zeros(extent)
        raw_total = np.zeros(extent)
        covered = np.zeros(extent, dtype=int)
        raws = []
        for t in tiles:
            span = t.pixels[axis]
            w = np.asarray(span.weights)
            raw = np.asarray(raw_ramp(t.latent[axis], geometry, axis))
            raws.append(raw)
            assert np.all(w >= 0.0)
            total[span.start : span.stop] += w
            raw_total[span.start : span.stop] += raw
            covered[span.start : span.stop] += 1
        assert np.all(covered >= 1)
        np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-9)
        raw_is_one = bool(np.all(np.abs(raw_total - 1.0) < 1e-9))
        assert plan.complementary[axis] == raw_is_one
        for t, raw in zip(tiles, raws, strict=True):
            span = t.pixels[axis]
            if plan.complementary[axis]:
                assert list(span.weights) == list(raw)
            else:
                np.testing.assert_allclose(span.weights, raw / raw_total[span.start : span.stop], atol=1e-12)


@PROPS
@given(shot_case(SMALL_GEOMETRIES, max_size=6, max_count=3))
def test_weights_blend_to_one_in_3d(case):
    geometry, latent, grid, batch_frames = case
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    total = np.zeros(plan.pixel_shape)
    covered = np.zeros(plan.pixel_shape, dtype=int)
    for t in plan.tiles:
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in t.pixels)
        wf, wh, ww = (np.asarray(s.weights) for s in t.pixels)
        total[f0:f1, h0:h1, w0:w1] += wf[:, None, None] * wh[None, :, None] * ww[None, None, :]
        covered[f0:f1, h0:h1, w0:w1] += 1
    assert covered.min() >= 1
    np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-9)


def test_causal_pixel_mapping_example():
    plan = plan_shot("s", (4, 16, 2, 2), LTX2, TileGrid(tiles=(2, 1, 1), overlap=(2, 0, 0)))
    first, second = (t.latent[0] for t in plan.tiles)
    assert (first.start, first.end) == (0, 9)
    assert (second.start, second.end) == (6, 16)  # 7 less the causal shift
    assert (plan.tiles[0].pixels[0].start, plan.tiles[0].pixels[0].stop) == (0, 65)
    assert (plan.tiles[1].pixels[0].start, plan.tiles[1].pixels[0].stop) == (48, 121)
    assert plan.pixel_shape == (121, 64, 64)
    assert plan.tiles[1].pixels[0].weights[0] == 0.0
    assert plan.complementary == (True, True, True)


# --------------------------------------------------------------------------------------------------
# Redundancy (LTX-2 figures for 1216x704x121: latent 38x22x16, 128 channels)
# --------------------------------------------------------------------------------------------------

LTX2_LATENT = (128, 16, 22, 38)


@pytest.mark.parametrize(
    ("tiles", "overlap", "expected"),
    [
        ((1, 2, 2), (0, 4, 4), 1.31),
        ((1, 2, 4), (0, 4, 4), 1.55),
        ((1, 8, 1), (0, 4, 0), 2.27),
        ((1, 1, 1), (0, 0, 0), 1.0),
    ],
)
def test_ltx2_redundancy(tiles, overlap, expected):
    plan = plan_shot("ltx", LTX2_LATENT, LTX2, TileGrid(tiles=tiles, overlap=overlap))
    assert plan.pixel_shape == (121, 704, 1216)
    assert plan.redundancy == pytest.approx(expected, abs=0.01)


@PROPS
@given(shot_case())
def test_redundancy_is_decoded_over_latent_volume(case):
    geometry, latent, grid, batch_frames = case
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    decoded = 1
    for axis in range(3):
        size, count, overlap = latent[1 + axis], grid.tiles[axis], grid.overlap[axis]
        shift = (count - 1) if axis == 0 and geometry.causal else 0
        decoded *= size + (count - 1) * overlap + shift
    assert plan.redundancy == pytest.approx(decoded / math.prod(latent[1:]), rel=1e-12)
    assert plan.redundancy >= 1.0
    whole = plan_shot("s", latent, geometry, batch_frames=batch_frames)
    assert whole.redundancy == 1.0 and len(whole.tiles) == 1


# --------------------------------------------------------------------------------------------------
# Temporal output batches
# --------------------------------------------------------------------------------------------------


@PROPS
@given(shot_case())
def test_batches(case):
    geometry, latent, grid, batch_frames = case
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    frames = plan.pixel_shape[0]
    assert [b.index for b in plan.batches] == list(range(len(plan.batches)))
    assert len(plan.batches) == math.ceil(frames / batch_frames)
    assert plan.batches[0].start == 0 and plan.batches[-1].stop == frames
    for a, b in zip(plan.batches, plan.batches[1:], strict=False):
        assert a.stop == b.start
        assert a.frames == batch_frames
    assert 1 <= plan.batches[-1].frames <= batch_frames
    for b in plan.batches:
        assert isinstance(b, Batch) and b.shot == "s"
        want = tuple(t.index for t in plan.tiles if t.pixels[0].start < b.stop and b.start < t.pixels[0].stop)
        assert b.tiles == want
        assert b.tiles  # every output frame is fed by some tile
    for t in plan.tiles:
        pieces = plan.batch_pieces(t)
        span = t.pixels[0]
        assert [b.index for b, _ in pieces] == [b.index for b in plan.batches if t.index in b.tiles]
        cursor = 0
        for b, sl in pieces:
            assert sl.step is None
            assert sl.start == cursor  # pieces tile the tile's own frames, in order, without gaps
            lo, hi = span.start + sl.start, span.start + sl.stop
            assert b.start <= lo < hi <= b.stop
            assert lo == max(span.start, b.start) and hi == min(span.stop, b.stop)
            cursor = sl.stop
        assert cursor == span.size


def test_batch_frames_must_be_positive():
    for bad in (0, -3):
        with pytest.raises(FarmError, match=rf"--batch-frames {bad} is invalid.*≥ 1"):
            plan_shot("s", (4, 3, 2, 2), LTX2, batch_frames=bad)


# --------------------------------------------------------------------------------------------------
# Round-robin assignment and determinism
# --------------------------------------------------------------------------------------------------


@PROPS
@given(st.lists(shot_case(max_size=6), min_size=1, max_size=4), st.integers(1, 9))
def test_assign_round_robin(cases, n_workers):
    plans = [
        plan_shot(f"shot{i}", latent, g, grid, batch_frames=bf)
        for i, (g, latent, grid, bf) in enumerate(cases)
    ]
    assigned = assign_round_robin(plans, n_workers)
    assert len(assigned) == len(plans)
    workers = [t.worker for p in assigned for t in p.tiles]
    assert workers == [i % n_workers for i in range(len(workers))]
    for before, after in zip(plans, assigned, strict=True):
        assert len(after.tiles) == len(before.tiles)
        for t0, t1 in zip(before.tiles, after.tiles, strict=True):
            assert t1 == type(t0)(**{**t0.__dict__, "worker": t1.worker})
        assert after == type(before)(**{**before.__dict__, "tiles": after.tiles})
    # inputs untouched (frozen): all tiles still on slot 0
    assert all(t.worker == 0 for p in plans for t in p.tiles)


def test_assign_round_robin_more_tiles_than_workers():
    plans = [
        plan_shot("a", LTX2_LATENT, LTX2, TileGrid(tiles=(1, 2, 4), overlap=(0, 4, 4))),
        plan_shot("b", (128, 4, 3, 3), LTX2, TileGrid(tiles=(2, 1, 1), overlap=(1, 0, 0))),
    ]
    out = assign_round_robin(plans, 3)
    assert [t.worker for t in out[0].tiles] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert [t.worker for t in out[1].tiles] == [2, 0]
    with pytest.raises(FarmError, match="at least one worker"):
        assign_round_robin(plans, 0)


@PROPS
@given(shot_case(), st.sampled_from([ChunkSize(), ChunkSize(height=3, width=4)]))
def test_plans_are_deterministic(case, chunk):
    geometry, latent, grid, batch_frames = case
    a = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames, chunk=chunk)
    b = plan_shot("s", list(latent), geometry, grid, batch_frames=batch_frames, chunk=chunk)
    assert a == b
    assert hash(a) == hash(b)
    assert a.chunk == chunk


# --------------------------------------------------------------------------------------------------
# Intra-worker chunks
# --------------------------------------------------------------------------------------------------

limit = st.one_of(st.none(), st.integers(1, 7))
spatial_limit = st.one_of(st.none(), st.integers(2, 7))  # decoders' reflect padding needs ≥ 2 units


@PROPS
@given(
    st.sampled_from(SMALL_GEOMETRIES + [LTX2]),
    st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9)),
    st.tuples(limit, spatial_limit, spatial_limit),
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
)
def test_plan_chunks(geometry, fhw, limits, overlap):
    chunk = ChunkSize(*limits, overlap=overlap)
    chunks = plan_chunks(fhw, geometry, chunk)
    pixel_shape = geometry.pixel_shape(fhw)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    counts = [len({c.grid_pos[a] for c in chunks}) for a in range(3)]
    assert len(chunks) == math.prod(counts)
    for axis in range(3):
        lim = limits[axis]
        along = [c for c in chunks if all(c.grid_pos[a] == 0 for a in range(3) if a != axis)]
        ivs = [c.latent[axis] for c in along]
        assert ivs[0].start == 0 and ivs[-1].end == fhw[axis]
        if lim is None or lim >= fhw[axis]:
            assert len(ivs) == 1
        else:
            shift = 1 if axis == 0 and geometry.causal else 0
            assert ivs[0].size <= lim
            assert all(iv.size <= lim + shift for iv in ivs[1:])
        # coverage and normalised weights along the axis
        extent = pixel_shape[axis]
        total = np.zeros(extent)
        for c in along:
            span = c.pixels[axis]
            assert (span.start, span.stop) == pixel_interval(c.latent[axis], geometry, axis)
            assert 0 <= span.start < span.stop <= extent
            total[span.start : span.stop] += span.weights
        np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-9)
    if math.prod(pixel_shape) <= 40_000:
        total3 = np.zeros(pixel_shape)
        for c in chunks:
            (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in c.pixels)
            wf, wh, ww = (np.asarray(s.weights) for s in c.pixels)
            total3[f0:f1, h0:h1, w0:w1] += wf[:, None, None] * wh[None, :, None] * ww[None, None, :]
        np.testing.assert_allclose(total3, 1.0, rtol=0, atol=1e-9)


def test_plan_chunks_without_limit_is_one_chunk():
    chunks = plan_chunks((9, 7, 5), LTX2, ChunkSize())
    assert len(chunks) == 1
    (c,) = chunks
    assert c.latent_slices() == (slice(0, 9), slice(0, 7), slice(0, 5))
    assert tuple((s.start, s.stop) for s in c.pixels) == ((0, 65), (0, 224), (0, 160))
    assert all(set(s.weights) == {1.0} for s in c.pixels)


def test_plan_chunks_rejects_zero_limit():
    with pytest.raises(FarmError, match=r"chunk size 0 is invalid.*≥ 1"):
        plan_chunks((4, 4, 4), LTX2, ChunkSize(frames=0))


@pytest.mark.parametrize("axis", ["height", "width"])
def test_plan_chunks_rejects_spatial_chunks_padding_cannot_handle(axis):
    with pytest.raises(FarmError, match=rf"chunk {axis} 1 is too small.*use 2 or more"):
        plan_chunks((4, 4, 4), LTX2, ChunkSize(**{axis: 1}))


# --------------------------------------------------------------------------------------------------
# The guard between the two tilings
# --------------------------------------------------------------------------------------------------


def test_conflicting_temporal_tilings_refused():
    grid = TileGrid(tiles=(2, 1, 1), overlap=(1, 0, 0))  # 16 + 1 = 17 frames over 2 tiles: 9 and 8
    with pytest.raises(FarmError, match="conflicting temporal tilings") as err:
        plan_shot("s", (4, 16, 4, 4), LTX2, grid, chunk=ChunkSize(frames=4))
    msg = str(err.value)
    # tiles [0, 9) and, after the causal shift, [7, 16): 9 latent frames each
    assert "2 temporal tiles" in msg and "9 latent frames" in msg and "chunks of 4" in msg
    assert "--tiles 1,H,W" in msg and "at least 9" in msg  # says what would be valid
    with pytest.raises(FarmError, match="conflicting temporal tilings"):
        validate_chunking(grid, ChunkSize(frames=9), [Interval(0, 9, 0, 1), Interval(7, 17, 2, 0)])


@PROPS
@given(shot_case(), st.data())
def test_temporal_guard(case, data):
    geometry, latent, grid, batch_frames = case
    assume(grid.tiles[0] > 1)
    plan = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    plain_frames = max(iv.size for iv in unshifted(plan, geometry, 0))
    tile_frames = max(t.latent[0].size for t in plan.tiles)  # including the causal shift
    # smaller than the tiles' own frames: refused
    small = data.draw(st.integers(1, plain_frames - 1)) if plain_frames > 1 else None
    if small is not None:
        with pytest.raises(FarmError, match="conflicting temporal tilings"):
            plan_shot("s", latent, geometry, grid, batch_frames=batch_frames, chunk=ChunkSize(frames=small))
    # large enough for every tile: accepted, and no tile is split in time
    big = data.draw(st.integers(tile_frames, tile_frames + 5))
    chunked = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames, chunk=ChunkSize(frames=big))
    assert chunked.tiles == plan.tiles and chunked.chunk.frames == big
    for t in chunked.tiles:
        assert {
            c.grid_pos[0] for c in plan_chunks([iv.size for iv in t.latent], geometry, chunked.chunk)
        } == {0}
    # spatial-only chunk limits (2 or more: reflect padding) are always accepted with temporal tiles
    hw = ChunkSize(height=data.draw(st.integers(2, 4)), width=data.draw(st.integers(2, 4)))
    assert plan_shot("s", latent, geometry, grid, batch_frames=batch_frames, chunk=hw).tiles == plan.tiles


def test_one_temporal_tile_allows_any_temporal_chunking():
    plan = plan_shot("s", (4, 16, 4, 4), LTX2, TileGrid(tiles=(1, 2, 2), overlap=(0, 1, 1)),
                     chunk=ChunkSize(frames=2))  # fmt: skip
    assert plan.chunk.frames == 2


def test_guard_accounts_for_the_causal_shift():
    # 16 latent frames in 2 temporal tiles, no overlap: [0, 8) and, shifted, [7, 16) = 9 frames.
    grid = TileGrid(tiles=(2, 1, 1), overlap=(0, 0, 0))
    chunk = ChunkSize(frames=8)
    try:
        plan = plan_shot("s", (4, 16, 2, 2), LTX2, grid, chunk=chunk)
    except FarmError as err:  # refusing the combination is a valid fix too
        assert "conflicting temporal tilings" in str(err)
        return
    for t in plan.tiles:
        chunks = plan_chunks([iv.size for iv in t.latent], LTX2, plan.chunk)
        assert {c.grid_pos[0] for c in chunks} == {0}, f"tile {t.index} ({t.latent[0]}) split in time"


# --------------------------------------------------------------------------------------------------
# The streaming window
# --------------------------------------------------------------------------------------------------


@PROPS
@given(st.lists(shot_case(max_size=6), min_size=1, max_size=3))
def test_required_window_is_enough_and_least(cases):
    plans = [
        plan_shot(f"s{i}", latent, g, grid, batch_frames=bf) for i, (g, latent, grid, bf) in enumerate(cases)
    ]
    need = plans_required_window(plans)
    n_tiles = sum(len(p.tiles) for p in plans)
    assert 1 <= need <= n_tiles
    assert simulate(plans, need)
    assert simulate(plans, n_tiles)
    if need > 1:
        assert not simulate(plans, need - 1)


def test_required_window_too_small_deadlocks():
    # 2 temporal x 2 width tiles; the batch across the temporal seam needs all four tiles at once.
    plan = plan_shot("s", (4, 8, 2, 4), LTX2, TileGrid(tiles=(2, 1, 2), overlap=(1, 0, 1)), batch_frames=16)
    assert any(set(b.tiles) == {0, 1, 2, 3} for b in plan.batches)
    assert plans_required_window([plan]) == 4
    assert simulate([plan], 4)
    assert not simulate([plan], 3)
    # whole shots only need one tile held at a time
    whole = [plan_shot(f"w{i}", (4, 5, 2, 2), LTX2, batch_frames=8) for i in range(3)]
    assert plans_required_window(whole) == 1 and simulate(whole, 1)


# --------------------------------------------------------------------------------------------------
# Errors a user can cause
# --------------------------------------------------------------------------------------------------


def test_more_tiles_than_latent_units():
    with pytest.raises(
        FarmError, match=r"height: 5 tiles do not fit a latent of 4 units; use at most 4 tiles"
    ):
        plan_shot("s", (4, 3, 4, 6), LTX2, TileGrid(tiles=(1, 5, 1)))
    assert len(plan_shot("s", (4, 3, 4, 6), LTX2, TileGrid(tiles=(1, 4, 1))).tiles) == 4


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_zero_tiles(axis):
    tiles = [1, 1, 1]
    tiles[axis] = 0
    with pytest.raises(FarmError, match=r"tile count 0 is invalid; use a whole number ≥ 1") as err:
        plan_shot("s", (4, 5, 5, 5), LTX2, TileGrid(tiles=tuple(tiles)))
    assert ("frames", "height", "width")[axis] in str(err.value)


@pytest.mark.parametrize("count", [1, 2])
def test_negative_overlap(count):
    with pytest.raises(FarmError, match=r"width: overlap -1 is invalid; use a whole number ≥ 0"):
        plan_shot("s", (4, 5, 5, 5), LTX2, TileGrid(tiles=(1, 1, count), overlap=(0, 0, -1)))


@PROPS
@given(st.sampled_from(GEOMETRIES), st.integers(2, 30), st.data())
def test_overlap_too_large_names_the_largest_valid(geometry, size, data):
    count = data.draw(st.integers(2, size))
    axis = data.draw(st.integers(0, 2))
    shape = [3, 3, 3]
    shape[axis] = size
    tiles, overlap = [1, 1, 1], [0, 0, 0]
    tiles[axis] = count
    overlap[axis] = data.draw(st.integers(size - count + 1, size + 5))
    grid = TileGrid(tiles=tuple(tiles), overlap=tuple(overlap))
    with pytest.raises(FarmError, match="is not smaller than the tile size") as err:
        plan_shot("s", (2, *shape), geometry, grid)
    msg = str(err.value)
    assert ("frames", "height", "width")[axis] in msg and f"overlap {overlap[axis]}" in msg
    found = re.search(r"use an overlap of at most (\d+)", msg)
    assert found, msg
    best = int(found.group(1))
    assert best == size - count
    overlap[axis] = best  # the suggestion plans
    plan = plan_shot("s", (2, *shape), geometry, TileGrid(tiles=tuple(tiles), overlap=tuple(overlap)))
    assert len(plan.tiles) == count
    overlap[axis] = best + 1  # and is the largest that does
    with pytest.raises(FarmError, match="is not smaller than the tile size"):
        plan_shot("s", (2, *shape), geometry, TileGrid(tiles=tuple(tiles), overlap=tuple(overlap)))


@pytest.mark.parametrize("shape", [(16, 22, 38), (1, 128, 16, 22, 38), ()])
def test_latent_must_be_4d(shape):
    with pytest.raises(FarmError, match=r"expected 4 dimensions \[C, F, H, W\]") as err:
        plan_shot("s", shape, LTX2)
    assert str(tuple(shape)) in str(err.value)


def test_empty_latent_axis():
    with pytest.raises(FarmError, match="empty axis"):
        plan_shot("s", (4, 0, 2, 2), LTX2)


# --------------------------------------------------------------------------------------------------
# Context and lookahead frames of temporal tiles
# --------------------------------------------------------------------------------------------------


@PROPS
@given(shot_case(), st.integers(0, 6), st.integers(0, 6))
def test_context_frames_are_decoded_then_dropped(case, context, lookahead):
    """Tiles keep their own frames, ranges and ramps; they also decode the decoder's context before and
    lookahead after (clipped to the shot), exactly the pixel frames they drop, counted as redundant work."""
    geometry, latent, grid, batch_frames = case
    plain = plan_shot("s", latent, geometry, grid, batch_frames=batch_frames)
    warm = Geometry(geometry.spatial_scale, geometry.temporal_scale, geometry.causal, context, lookahead)
    plan = plan_shot("s", latent, warm, grid, batch_frames=batch_frames)
    frames = latent[1]
    assert plan.batches == plain.batches
    for tile, base in zip(plan.tiles, plain.tiles, strict=True):
        assert (tile.latent, tile.pixels, tile.grid_pos) == (base.latent, base.pixels, base.grid_pos)
        f = tile.latent[0]
        assert tile.context == min(context, f.start) and tile.lookahead == min(lookahead, frames - f.end)
        decoded = tile.decode_slices()
        assert decoded[1:] == tile.latent_slices()[1:]
        assert (decoded[0].start, decoded[0].stop) == (f.start - tile.context, f.end + tile.lookahead)
        assert decoded[0].start >= 0 and decoded[0].stop <= frames
        head, tail = tile.discarded_frames(geometry.temporal_scale)
        decoded_pixels = geometry.pixel_frames(decoded[0].stop - decoded[0].start)
        assert decoded_pixels - head - tail == tile.pixels[0].size
        assert warm.pixel_frames(decoded[0].stop) - tail == tile.pixels[0].stop  # same place in the shot
        assert tile.latent_volume == math.prod(tile.decoded_fhw)
    extra = sum(t.latent_volume - b.latent_volume for t, b in zip(plan.tiles, plain.tiles, strict=True))
    assert plan.redundancy == pytest.approx(plain.redundancy + extra / math.prod(latent[1:]))
    if grid.tiles[0] == 1:
        assert plan.tiles == plain.tiles  # one temporal tile: nothing before or after it to decode


def test_context_is_part_of_the_plan_identity_only_when_used():
    from farm.planning.tiling import plan_identity

    grid = TileGrid(tiles=(2, 1, 1), overlap=(1, 0, 0))
    plain = plan_shot("s", (4, 16, 2, 2), LTX2, grid)
    warm = plan_shot("s", (4, 16, 2, 2), Geometry(32, 8, True, context=3), grid)
    assert "context" not in plan_identity(plain)
    assert plan_identity(warm)["context"] == [[0, 0], [3, 0]]


def test_temporal_guard_counts_context_frames():
    """A temporal tile's context frames are decoded in the same call: a chunk must hold them too."""
    grid = TileGrid(tiles=(2, 1, 1), overlap=(1, 0, 0))  # tiles [0, 9) and [7, 16)
    warm = Geometry(32, 8, True, context=4)
    with pytest.raises(FarmError, match="conflicting temporal tilings") as err:
        plan_shot("s", (4, 16, 2, 2), warm, grid, chunk=ChunkSize(frames=12))
    assert "at least 13" in str(err.value)
    plan = plan_shot("s", (4, 16, 2, 2), warm, grid, chunk=ChunkSize(frames=13))
    for t in plan.tiles:
        assert {c.grid_pos[0] for c in plan_chunks(t.decoded_fhw, warm, plan.chunk)} == {0}


def test_temporal_chunks_carry_context_inside_a_tile():
    chunks = plan_chunks((16, 2, 2), Geometry(32, 8, True, context=3, lookahead=2), ChunkSize(frames=6))
    firsts = [c for c in chunks if c.grid_pos[1:] == (0, 0)]
    assert [(c.context, c.lookahead) for c in firsts] == [(0, 2)] + [(3, 2)] * (len(firsts) - 2) + [(3, 0)]


@pytest.mark.parametrize("taper", [True, False])
@pytest.mark.parametrize("frames, limit", [(16, 5), (16, 1), (16, 16), (7, 3), (2, 1), (16, 4)])
def test_carried_chunks_tile_the_frames_once_with_weight_one(frames, limit, taper):
    g = Geometry(32, 8, True, context=24, carries=True)
    chunks = plan_chunks((frames, 4, 6), g, ChunkSize(frames=limit, height=2, carry=True, taper=taper))
    firsts = sorted((c for c in chunks if c.grid_pos[1:] == (0, 0)), key=lambda c: c.grid_pos[0])
    # latent frames: consecutive, no overlap, no context or lookahead, in the schedule's sizes
    assert [c.latent[0].size for c in firsts] == carried_frames(frames, limit, taper)
    assert firsts[0].latent[0].start == 0 and firsts[-1].latent[0].end == frames
    assert all(a.latent[0].end == b.latent[0].start for a, b in zip(firsts, firsts[1:], strict=False))
    assert all(c.context == 0 and c.lookahead == 0 for c in chunks)
    # pixel frames: the whole decode's, each exactly once, at weight 1, as many as each chunk decodes
    spans = [c.pixels[0] for c in firsts]
    assert spans[0].start == 0 and spans[-1].stop == g.pixel_frames(frames)
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:], strict=False))
    assert all(set(s.weights) == {1.0} for s in spans)
    assert [s.size for s in spans] == [g.pixel_frames(c.latent[0].size) if i == 0 else 8 * c.latent[0].size
                                       for i, c in enumerate(firsts)]  # fmt: skip
    # spatial chunks still overlap and blend as before
    assert len({c.grid_pos[1] for c in chunks}) > 1


def test_carry_is_checked_and_is_part_of_the_plan_identity():
    with pytest.raises(FarmError, match="needs temporal chunks"):
        ChunkSize(height=4, carry=True)
    plain = Geometry(32, 8, True)
    with pytest.raises(FarmError, match="cannot carry its causal state"):
        plan_shot("a", (8, 9, 4, 4), plain, chunk=ChunkSize(frames=2, carry=True))
    with pytest.raises(FarmError, match="need a causal decoder"):
        plan_chunks((9, 4, 4), Geometry(32, 8, False, carries=True), ChunkSize(frames=2, carry=True))
    carrying = Geometry(32, 8, True, carries=True)
    carried = plan_shot("a", (8, 9, 4, 4), carrying, chunk=ChunkSize(frames=2, carry=True))
    overlapped = plan_shot("a", (8, 9, 4, 4), carrying, chunk=ChunkSize(frames=2))
    even = plan_shot("a", (8, 9, 4, 4), carrying, chunk=ChunkSize(frames=2, carry=True, taper=False))
    assert plan_identity(carried)["carry"] == "tapered" and "carry" not in plan_identity(overlapped)
    assert plan_identity(even)["carry"] is True  # what carried renders before tapering recorded
    assert {k: v for k, v in plan_identity(carried).items() if k != "carry"} == plan_identity(overlapped)


@pytest.mark.parametrize(
    "size, limit, sizes",
    [
        (16, 4, [1, 4, 4, 4, 2, 1]),  # the last chunks halve; the first takes the remainder
        (16, 5, [4, 5, 4, 2, 1]),
        (16, 8, [1, 8, 4, 2, 1]),
        (7, 3, [1, 3, 2, 1]),
        (5, 4, [2, 2, 1]),
        (16, 16, [16]),  # one chunk: nothing to taper
        (16, 1, [1] * 16),
    ],
)
def test_carried_chunks_taper_to_one_latent_frame_at_the_end(size, limit, sizes):
    assert carried_frames(size, limit) == sizes
    assert sum(sizes) == size and max(sizes) <= limit
    assert carried_frames(size, limit, taper=False) == [min(limit, size - s) for s in range(0, size, limit)]


# --------------------------------------------------------------------------------------------------
# The spatial halo
# --------------------------------------------------------------------------------------------------


def test_a_tile_decodes_its_halo_on_sides_with_a_neighbour_only():
    geometry = Geometry(spatial_scale=32, temporal_scale=8, causal=True, halo=3)
    plan = plan_shot("s", (8, 4, 10, 20), geometry, TileGrid((1, 2, 2), (0, 0, 0)))
    by_pos = {t.grid_pos: t for t in plan.tiles}
    assert by_pos[(0, 0, 0)].halo == (0, 3, 0, 3)
    assert by_pos[(0, 1, 1)].halo == (3, 0, 3, 0)
    corner = by_pos[(0, 0, 1)]
    assert corner.latent_slices()[1:] == (slice(0, 5), slice(10, 20))
    assert corner.decode_slices()[1:] == (slice(0, 8), slice(7, 20))
    assert corner.decoded_fhw == (4, 8, 13)
    assert corner.discarded_pixels(geometry) == ((0, 0), (0, 96), (96, 0))
    assert plan.redundancy == pytest.approx(4 * 8 * 13 * 4 / (4 * 10 * 20))
    assert plan_identity(plan)["halo"] == [list(t.halo) for t in plan.tiles]
    # a halo wider than the neighbour stops at the shot's edge; without a halo nothing is recorded
    wide = plan_shot("s", (8, 4, 10, 20), replace(geometry, halo=30), TileGrid((1, 2, 2), (0, 0, 0)))
    assert {t.decoded_fhw[1:] for t in wide.tiles} == {(10, 20)}
    assert "halo" not in plan_identity(plan_shot("s", (8, 4, 10, 20), replace(geometry, halo=0),
                                                 TileGrid((1, 2, 2), (0, 0, 0))))  # fmt: skip


def test_chunks_inside_a_tile_decode_the_halo_too():
    geometry = Geometry(spatial_scale=32, temporal_scale=8, causal=True, halo=2)
    chunks = plan_chunks((3, 6, 12), geometry, ChunkSize(width=6, overlap=(0, 0, 0)))
    assert [c.halo for c in chunks] == [(0, 0, 0, 2), (0, 0, 2, 0)]
    assert [c.decode_slices()[2] for c in chunks] == [slice(0, 8), slice(4, 12)]


def test_drop_context_crops_the_halo_and_the_context_frames():
    import torch

    from farm.worker.tasks import drop_context

    geometry = Geometry(spatial_scale=2, temporal_scale=1, causal=False, context=1, halo=1)
    plan = plan_shot("s", (1, 4, 6, 6), geometry, TileGrid((2, 2, 2), (0, 0, 0)))
    shape = geometry.pixel_shape((4, 6, 6))
    whole = torch.arange(3 * math.prod(shape), dtype=torch.float32).reshape(3, *shape)
    for tile in plan.tiles:
        block = whole[(slice(None), *(slice(s.start * k, s.stop * k) for s, k in
                                      zip(tile.decode_slices(), (1, 2, 2), strict=True)))]  # fmt: skip
        own = drop_context(block, tile, geometry)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        assert torch.equal(own, whole[:, f0:f1, h0:h1, w0:w1])
