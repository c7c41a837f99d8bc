"""Pure tile planning: how a shot's latent is split into tiles, where each tile's pixels land, how they blend.

Nothing here touches torch, a GPU, Dask or the disk: shapes in, frozen dataclasses out. Execution
(`farm.run.graph`) and the worker-side decode (`farm.worker.tasks`) consume a `ShotPlan`.

Splitting follows the LTX-2 multi-GPU decoder:

* an axis of `size` latent units split into `count` tiles with `overlap` units shared by neighbours
  (count-based split: the tiles together decode ``size + (count - 1) * overlap`` units);
* temporal tiles of a causal decoder after the first start one latent frame early and widen their
  left ramp by one (the causal shift), so each tile sees the frame its first output depends on;
* a temporal tile also decodes the decoder's `context` latent frames before its own and `lookahead`
  frames after (``Geometry``; clipped to the shot) and discards their pixels: they warm the decoder's
  temporal state and are never blended, so only the real overlap is; they count as redundant work;
* latent frames ``[s, e)`` of a causal decoder with temporal scale ``t`` give pixel frames
  ``[s*t, 1 + (e-1)*t)`` (the first latent frame decodes to one pixel frame); spatial ``[s, e)`` gives
  ``[s*k, e*k)``;
* blend weights are separable trapezoids in pixel units. Where neighbours' ramps are complementary the
  weights already sum to one; elsewhere each axis' weights are divided by their per-pixel sum. Because
  the grid is a product of per-axis splits, that normalisation is separable too, so every tile can be
  pre-weighted where it was decoded and the blend is a plain sum.

Example:
    >>> g = Geometry(spatial_scale=32, temporal_scale=8, causal=True)
    >>> plan = plan_shot("a", (128, 16, 22, 38), g, TileGrid(tiles=(1, 2, 4), overlap=(0, 4, 4)))
    >>> len(plan.tiles), round(plan.redundancy, 2)
    (8, 1.56)
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from farm.decoders.geometry import Geometry
from farm.errors import FarmError

AXES = ("frames", "height", "width")
MIN_SPATIAL_CHUNK = 2  # latent rows/columns: reflect padding of a 1-unit-wide block is undefined


@dataclass(frozen=True)
class Interval:
    """One tile along one axis, in latent units, with its blend ramps (also latent units)."""

    start: int
    end: int
    left_ramp: int
    right_ramp: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PixelSpan:
    """Where an interval lands in pixels, and its 1-D blend weights there (already normalised)."""

    start: int
    stop: int
    weights: tuple[float, ...]

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class TileGrid:
    """Inter-worker tiling: tile counts and overlaps per axis (frames, height, width), latent units."""

    tiles: tuple[int, int, int] = (1, 1, 1)
    overlap: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self) -> None:
        _check_triple(self.tiles, "tile count", minimum=1, example="1,2,2")
        _check_triple(self.overlap, "overlap", minimum=0, example="1,2,2")


@dataclass(frozen=True)
class ChunkSize:
    """Intra-worker tiling: the largest latent block one decode call may take (None: no limit).

    `carry`: temporal chunks do not overlap and decode no context; each starts from the decoder's
    causal state where the previous chunk left it (the last input frames of every causal convolution),
    so a tile decodes in time order with no frame decoded twice, the frames of its first chunks
    ready while later ones decode. Needs a decoder that carries its state (`Geometry.carries`: LTX-2).
    The frames equal a whole-tile decode up to float rounding, not bit for bit, so carrying is part of
    the plan's identity; streamed or not, and on any number of workers, a carried plan writes the same bytes.

    `taper` (with `carry`, when a tile is longer than one chunk): the tile's last chunks halve down to one
    latent frame (…, 4, 4, 2, 1; the first chunk takes what is left over), so the frames still to write
    when the decode ends are one small chunk's rather than a whole chunk's (`carried_frames`).
    """

    frames: int | None = None
    height: int | None = None
    width: int | None = None
    overlap: tuple[int, int, int] = (1, 2, 2)
    carry: bool = False
    taper: bool = True

    def __post_init__(self) -> None:
        for axis, limit in zip(AXES, self.limits(), strict=True):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise FarmError(
                    f"chunk size {limit!r} is invalid for {axis}: use a whole number of latent units ≥ 1, "
                    "or no limit"
                )
        _check_triple(self.overlap, "chunk overlap", minimum=0, example="1,2,2")
        if self.carry and self.frames is None:
            raise FarmError(
                "carrying the decoder's state needs temporal chunks: give a chunk of frames too, "
                "e.g. --chunk 4,0,0 --carry"
            )

    def limits(self) -> tuple[int | None, int | None, int | None]:
        return (self.frames, self.height, self.width)


def _check_triple(values: Sequence[int], what: str, *, minimum: int, example: str) -> None:
    """Validation where tiling values are built: three whole numbers (frames, height, width) ≥ minimum."""
    ok = len(values) == 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    if not ok:
        raise FarmError(
            f"{what} must be three whole numbers ≥ {minimum} (frames, height, width), e.g. {example}; "
            f"got {tuple(values)!r}"
        )
    for axis, v in zip(AXES, values, strict=True):
        if v < minimum:
            raise FarmError(f"{axis}: {what} {v} is invalid; use a whole number ≥ {minimum}")


@dataclass(frozen=True)
class Tile:
    """One decode task: a block of the latent, where its pixels go, and its separable weights.

    `context` latent frames before ``latent[0].start`` and `lookahead` frames after ``latent[0].end`` are
    decoded with the tile and their pixel frames discarded (never blended): they only warm the decoder's
    temporal state (causal convolution caches, receptive field) so the tile's own frames match a decode of
    the whole shot. `latent` and `pixels` are the tile's own frames; :meth:`decode_slices` the decoded block.
    """

    shot: str
    index: int  # position in the shot's tile order (frames-major): blends sum in this order
    grid_pos: tuple[int, int, int]
    latent: tuple[Interval, Interval, Interval]
    pixels: tuple[PixelSpan, PixelSpan, PixelSpan]
    worker: int = 0  # round-robin slot, assigned over the whole job
    context: int = 0  # latent frames decoded before the tile's own, then discarded
    lookahead: int = 0  # latent frames decoded after the tile's own, then discarded
    halo: tuple[int, int, int, int] = (0, 0, 0, 0)  # latent rows above, below, columns left, right: likewise

    @property
    def decoded_fhw(self) -> tuple[int, int, int]:
        """Latent frames, rows and columns one decode of this tile takes (context, lookahead and halo
        included)."""
        f, h, w = self.latent
        top, bottom, left, right = self.halo
        return (self.context + f.size + self.lookahead, top + h.size + bottom, left + w.size + right)

    @property
    def block_fhw(self) -> tuple[int, int, int]:
        """The tile's own latent frames with its decoded rows and columns (halo included): what its
        temporal segments split."""
        return (self.latent[0].size, *self.decoded_fhw[1:])

    @property
    def latent_volume(self) -> int:
        """Latent volume decoded for this tile (its context and lookahead frames are decode work too)."""
        return math.prod(self.decoded_fhw)

    @property
    def pixel_volume(self) -> int:
        return math.prod(span.size for span in self.pixels)

    def latent_slices(self) -> tuple[slice, slice, slice]:
        """The tile's own latent block (without context and lookahead)."""
        return tuple(slice(iv.start, iv.end) for iv in self.latent)  # type: ignore[return-value]

    def decode_slices(self) -> tuple[slice, slice, slice]:
        """The latent block one decode of this tile reads: context and lookahead frames and the halo
        included."""
        f, h, w = self.latent_slices()
        top, bottom, left, right = self.halo
        return (
            slice(f.start - self.context, f.stop + self.lookahead),
            slice(h.start - top, h.stop + bottom),
            slice(w.start - left, w.stop + right),
        )

    def decode_origin(self) -> tuple[int, int, int]:
        """First latent frame, row and column of the decoded block in its shot."""
        return tuple(s.start for s in self.decode_slices())

    def discarded_frames(self, temporal_scale: int) -> tuple[int, int]:
        """Pixel frames of the decoded block to drop at its start (context) and end (lookahead).

        Latent frames ``[s - c, e + a)`` of a causal decoder give pixel frames
        ``[(s - c) t, 1 + (e + a - 1) t)``; the tile keeps ``[s t, 1 + (e - 1) t)`` (non-causal:
        ``[s t, e t)``), so ``c t`` go at the start and ``a t`` at the end either way.
        """
        return self.context * temporal_scale, self.lookahead * temporal_scale

    def discarded_pixels(self, geometry: Geometry) -> tuple[tuple[int, int], ...]:
        """Pixels of the decoded block to drop per axis (frames, rows, columns), at its start and end:
        the context frames and the halo, decoded only so the tile's own pixels see what a whole-shot
        decode sees."""
        k = geometry.spatial_scale
        top, bottom, left, right = self.halo
        return self.discarded_frames(geometry.temporal_scale), (top * k, bottom * k), (left * k, right * k)


@dataclass(frozen=True)
class Batch:
    """A temporal batch of output frames: one blend task, one Zarr chunk, one video segment."""

    shot: str
    index: int
    start: int
    stop: int
    tiles: tuple[int, ...]  # indices of the tiles whose pixels reach this batch, in summation order

    @property
    def frames(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ShotPlan:
    shot: str
    latent_shape: tuple[int, int, int, int]  # C, F, H, W
    pixel_shape: tuple[int, int, int]  # F, H, W
    grid: TileGrid
    tiles: tuple[Tile, ...]
    batches: tuple[Batch, ...]
    complementary: tuple[bool, bool, bool]  # per axis: did the ramps already sum to one?
    chunk: ChunkSize = field(default_factory=ChunkSize)

    @property
    def redundancy(self) -> float:
        """Decoded latent volume over the shot's latent volume (1.0 = no overlap work)."""
        return sum(t.latent_volume for t in self.tiles) / math.prod(self.latent_shape[1:])

    def batch_pieces(self, tile: Tile) -> list[tuple[Batch, slice]]:
        """The batches a tile feeds and, for each, the slice of the tile's own frames that goes there."""
        span = tile.pixels[0]
        out = []
        for batch in self.batches:
            lo, hi = max(span.start, batch.start), min(span.stop, batch.stop)
            if lo < hi:
                out.append((batch, slice(lo - span.start, hi - span.start)))
        return out


# --------------------------------------------------------------------------------------------------
# Splitting one axis
# --------------------------------------------------------------------------------------------------


def split_by_count(size: int, count: int, overlap: int, *, axis: str = "axis") -> list[Interval]:
    """Split `size` units into `count` tiles sharing `overlap` units with each neighbour.

    Tile sizes differ by at most one; together they cover ``size + (count - 1) * overlap`` units.
    """
    if count < 1:
        raise FarmError(f"{axis}: tile count {count} is invalid; use a whole number ≥ 1")
    if overlap < 0:
        raise FarmError(f"{axis}: overlap {overlap} is invalid; use a whole number ≥ 0")
    if count == 1:
        return [Interval(0, size, 0, 0)]
    if count > size:
        raise FarmError(
            f"{axis}: {count} tiles do not fit a latent of {size} units; use at most {size} tiles"
        )
    total = size + (count - 1) * overlap
    base, extra = divmod(total, count)
    sizes = [base + (1 if i < extra else 0) for i in range(count)]
    if overlap >= min(sizes):
        max_overlap = _max_overlap(size, count)
        raise FarmError(
            f"{axis}: overlap {overlap} is not smaller than the tile size {min(sizes)} "
            f"({count} tiles over {size} latent units); use an overlap of at most {max_overlap}"
        )
    intervals = []
    start = 0
    for i, tile_size in enumerate(sizes):
        end = start + tile_size
        intervals.append(Interval(start, end, overlap if i > 0 else 0, overlap if i < count - 1 else 0))
        start = end - overlap
    assert intervals[-1].end == size
    return intervals


def split_by_size(size: int, tile_size: int, overlap: int, *, axis: str = "axis") -> list[Interval]:
    """Split into tiles of at most `tile_size` units (intra-worker chunking): the fewest tiles that fit."""
    if tile_size < 1:
        raise FarmError(f"{axis}: chunk size {tile_size} is invalid; use a whole number ≥ 1")
    if size <= tile_size:
        return [Interval(0, size, 0, 0)]
    if overlap >= tile_size:
        raise FarmError(
            f"{axis}: chunk overlap {overlap} must be smaller than the chunk size {tile_size}; "
            f"use at most {tile_size - 1}"
        )
    count = math.ceil((size - overlap) / (tile_size - overlap))
    return split_by_count(size, count, overlap, axis=axis)


def _max_overlap(size: int, count: int) -> int:
    best = 0
    for o in range(size):
        sizes_min = (size + (count - 1) * o) // count
        if o < sizes_min:
            best = o
    return best


def causal_shift(intervals: list[Interval]) -> list[Interval]:
    """Start every temporal tile after the first one latent frame early, widening its left ramp by one."""
    return [
        iv if i == 0 else Interval(iv.start - 1, iv.end, iv.left_ramp + 1, iv.right_ramp)
        for i, iv in enumerate(intervals)
    ]


def trapezoid(length: int, left: int, right: int, left_from_zero: bool = False) -> list[float]:
    """1-D blend ramp: rises over `left` samples, falls over `right`; 1 in between.

    Ramps exclude their end points (0 and 1) so two complementary ramps sum to one; a causal temporal
    ramp starts at exactly 0 on the frame its tile decodes as a (lower quality) first frame.
    """
    left, right = max(0, min(left, length)), max(0, min(right, length))
    w = [1.0] * length
    if left:
        steps = left + 1 if left_from_zero else left + 2
        rise = [k / (steps - 1) for k in range(steps)][:-1]
        if not left_from_zero:
            rise = rise[1:]
        for k in range(left):
            w[k] *= rise[k]
    if right:
        for k in range(right):
            w[length - right + k] *= (right - k) / (right + 1)
    return w


def whole_axis(pixels: int, size: int) -> tuple[list[Interval], list[PixelSpan], bool]:
    """An axis the decoder is not split along (`Geometry.splits`): one interval of `size` latent units, its
    `pixels` at weight one."""
    return [Interval(0, size, 0, 0)], [PixelSpan(0, pixels, (1.0,) * pixels)], True


def unsplit(axis: int) -> str:
    """Why a decoder is not split along `axis`, and what to do, in words."""
    return (f"this decoder decodes a shot whole along {AXES[axis]} (it blends its own pieces there, or no "
            "halo or context was measured for it: docs/decoders.md); use 1 tile and no --chunk along "
            f"{AXES[axis]}")  # fmt: skip


def pixel_span(iv: Interval, scale: int, *, temporal: bool, causal: bool) -> tuple[int, int, list[float]]:
    """Map a latent interval to pixel units: (start, stop, raw ramp weights)."""
    if temporal and causal:
        start, stop = iv.start * scale, 1 + (iv.end - 1) * scale
        left = 0 if iv.left_ramp == 0 else 1 + (iv.left_ramp - 1) * scale
        return start, stop, trapezoid(stop - start, left, iv.right_ramp * scale, left_from_zero=True)
    start, stop = iv.start * scale, iv.end * scale
    return start, stop, trapezoid(stop - start, iv.left_ramp * scale, iv.right_ramp * scale)


def axis_spans(
    intervals: list[Interval], scale: int, extent: int, *, temporal: bool, causal: bool
) -> tuple[list[PixelSpan], bool]:
    """Pixel spans of an axis' tiles with weights normalised to sum to one per pixel.

    Returns the spans and whether the raw ramps were already complementary (no normalisation needed).
    """
    raw = [pixel_span(iv, scale, temporal=temporal, causal=causal) for iv in intervals]
    total = [0.0] * extent
    for start, stop, w in raw:
        if start < 0 or stop > extent:
            raise AssertionError(f"tile span [{start}, {stop}) outside [0, {extent})")
        for k, v in enumerate(w):
            total[start + k] += v
    if min(total) <= 0.0:
        raise AssertionError("a pixel is covered by no tile with positive weight")
    complementary = all(abs(t - 1.0) < 1e-6 for t in total)
    spans = []
    for start, stop, w in raw:
        if complementary:
            weights = tuple(w)
        else:
            weights = tuple(v / total[start + k] for k, v in enumerate(w))
        spans.append(PixelSpan(start, stop, weights))
    return spans, complementary


# --------------------------------------------------------------------------------------------------
# Planning a shot
# --------------------------------------------------------------------------------------------------


def check_min_block(decoded: Sequence[Sequence[int]], geometry: Geometry, what: str, remedy: str) -> None:
    """Every decode call's latent size per axis (`decoded[axis]`) must reach the decoder's `min_block`."""
    for axis, (sizes, least) in enumerate(zip(decoded, geometry.min_block, strict=True)):
        if sizes and min(sizes) < least:
            remedy = remedy.format(axis=AXES[axis], least=least)
            raise FarmError(
                f"{what} would decode {min(sizes)} latent units of {AXES[axis]}, but this decoder needs at "
                f"least {least} at a time (its attention window): {remedy}"
            )


def temporal_context(intervals: Sequence[Interval], frames: int, geometry: Geometry) -> list[tuple[int, int]]:
    """(context, lookahead) latent frames per temporal interval: the decoder's, clipped to the shot."""
    return [(min(geometry.context, iv.start), min(geometry.lookahead, frames - iv.end)) for iv in intervals]


def with_margins(intervals: Sequence[Interval], margins: Sequence[tuple[int, int]]) -> list[int]:
    """Latent units each interval decodes with its (before, after) margins: context frames, or halo."""
    return [before + iv.size + after for iv, (before, after) in zip(intervals, margins, strict=True)]


def whole_frame_groups(plan: ShotPlan) -> dict[tuple[int, int], tuple[int, ...]]:
    """For a decoder with a whole-frame pass: the plan's tiles (positions in ``plan.tiles``) by the latent
    frames ``[start, stop)`` they decode (context included), each group sharing one pass over those
    frames and the whole frame. Empty where the plan splits neither height nor width (a tile then is
    the whole frame)."""
    if plan.grid.tiles[1] * plan.grid.tiles[2] == 1:
        return {}
    groups: dict[tuple[int, int], list[int]] = {}
    for k, tile in enumerate(plan.tiles):
        frames = tile.decode_slices()[0]
        groups.setdefault((frames.start, frames.stop), []).append(k)
    return {span: tuple(tiles) for span, tiles in groups.items()}


def takes_statistics_rounds(plan: ShotPlan) -> bool:
    """For a decoder whose tiles share the shot's GroupNorm statistics (`shares_statistics`): whether this
    plan's tiles do, one round across them per GroupNorm. They do where the plan splits height or width
    and neither splits frames (a resumed render keeps every spatial tile of an unfinished batch, so the
    rounds see the whole shot) nor chunks a tile (one decode call per tile carries from round to round)."""
    return plan.grid.tiles[0] == 1 and not any(plan.chunk.limits()) and bool(whole_frame_groups(plan))


def takes_whole_frame_pass(cls: Any, config: dict[str, Any], plan: ShotPlan) -> bool:
    """Whether the plan's spatial tiles, of decoder class `cls` and `config`, decode from a whole-frame pass
    (`shares_whole_frame`): a decoder that also shares the shot's GroupNorm statistics only where its rounds
    run (elsewhere the pass alone loses to the blend), one whose tiles take the pass in one call only
    (`whole_frame_in_one_call`) not where the plan chunks its tiles."""
    if not cls.shares_whole_frame(config) or not whole_frame_groups(plan):
        return False
    if cls.shares_statistics(config) and not takes_statistics_rounds(plan):
        return False
    return not (cls.whole_frame_in_one_call(config) and any(plan.chunk.limits()))


def own_blocks(plan: ShotPlan) -> list[tuple[tuple[int, int], ...]]:
    """Each tile's own latent block for statistics shared across a plan's tiles (`takes_statistics_rounds`),
    tile-local (frames, rows, columns ``[start, stop)`` in its decoded block): its own frames, rows and
    columns, each cut where the next tile along that axis starts, so that tiles whose blocks overlap (a
    causal temporal split shares a latent frame; an overlap blend shares more) count every position once."""
    starts = [sorted({t.latent[axis].start for t in plan.tiles}) for axis in range(3)]
    found = []
    for tile in plan.tiles:
        origin = tile.decode_origin()
        block: list[tuple[int, int]] = []
        for axis, interval in enumerate(tile.latent):
            stop = next((s for s in starts[axis] if s > interval.start), interval.end)
            block.append((interval.start - origin[axis], min(stop, interval.end) - origin[axis]))
        found.append(tuple(block))
    return found


def spatial_halo(intervals: Sequence[Interval], size: int, geometry: Geometry) -> list[tuple[int, int]]:
    """(before, after) latent rows or columns of halo per spatial interval: the decoder's, clipped to the
    shot, so only sides with a neighbour decode one (a side on the shot's edge pads as a whole decode
    does)."""
    return [(min(geometry.halo, iv.start), min(geometry.halo, size - iv.end)) for iv in intervals]


def validate_chunking(
    grid: TileGrid, chunk: ChunkSize, temporal_tiles: Sequence[Interval], decoded: Sequence[int] = ()
) -> None:
    """Temporal tiles across workers and temporal chunks inside a worker must not both split one tile.

    `decoded`: latent frames each temporal tile decodes (its own, context and lookahead), when known.
    """
    if grid.tiles[0] > 1 and chunk.frames is not None:
        tile_frames = max([iv.size for iv in temporal_tiles] + list(decoded))  # after the causal shift
        if chunk.frames < tile_frames:
            raise FarmError(
                f"conflicting temporal tilings: {grid.tiles[0]} temporal tiles across workers "
                f"(up to {tile_frames} latent frames each) would also be split in time by chunks of "
                f"{chunk.frames} latent frames inside a worker; two causal splits of one tile conflict. "
                f"Use one temporal tile across workers (--tiles 1,H,W), a temporal chunk of at least "
                f"{tile_frames} latent frames, or no temporal chunking"
            )


def plan_batches(shot: str, frames: int, batch_frames: int, tiles: Sequence[Tile]) -> tuple[Batch, ...]:
    if batch_frames < 1:
        raise FarmError(f"--batch-frames {batch_frames} is invalid; use a whole number ≥ 1")
    batches = []
    for k, start in enumerate(range(0, frames, batch_frames)):
        stop = min(start + batch_frames, frames)
        feeding = tuple(t.index for t in tiles if t.pixels[0].start < stop and start < t.pixels[0].stop)
        batches.append(Batch(shot, k, start, stop, feeding))
    return tuple(batches)


def plan_shot(
    shot: str,
    latent_shape: Sequence[int],
    geometry: Geometry,
    grid: TileGrid = TileGrid(),
    *,
    batch_frames: int = 32,
    chunk: ChunkSize = ChunkSize(),
) -> ShotPlan:
    """Split one shot's latent ``[C, F, H, W]`` into tiles and temporal output batches."""
    if len(latent_shape) != 4:
        raise FarmError(
            f"shot {shot!r}: latent has shape {tuple(latent_shape)}; expected 4 dimensions [C, F, H, W]"
        )
    c, f, h, w = (int(x) for x in latent_shape)
    if min(c, f, h, w) < 1:
        raise FarmError(f"shot {shot!r}: latent shape {tuple(latent_shape)} has an empty axis")
    for name, values in (("--tiles", grid.tiles), ("--overlap", grid.overlap)):
        if len(values) != 3:
            raise FarmError(f"{name} needs three values F,H,W; got {values}")
    pixel_shape = geometry.pixel_shape((f, h, w))
    for axis, count in enumerate(grid.tiles):
        if count > 1 and not geometry.splits(axis):
            raise FarmError(f"shot {shot!r}: {count} tiles along {AXES[axis]} are invalid: {unsplit(axis)}")
    per_axis: list[tuple[list[Interval], list[PixelSpan], bool]] = []
    for axis, (size, count, overlap) in enumerate(zip((f, h, w), grid.tiles, grid.overlap, strict=True)):
        if not geometry.splits(axis):
            per_axis.append(whole_axis(pixel_shape[axis], size))
            continue
        name = f"shot {shot!r}, {AXES[axis]}"
        intervals = split_by_count(size, count, overlap, axis=name)
        temporal = axis == 0
        if temporal and geometry.causal:
            intervals = causal_shift(intervals)
        scale = geometry.temporal_scale if temporal else geometry.spatial_scale
        spans, complementary = axis_spans(
            intervals, scale, pixel_shape[axis], temporal=temporal, causal=geometry.causal
        )
        per_axis.append((intervals, spans, complementary))
    warm = temporal_context(per_axis[0][0], f, geometry)
    halos = [spatial_halo(per_axis[a][0], size, geometry) for a, size in ((1, h), (2, w))]
    decoded = with_margins(per_axis[0][0], warm)
    spatial_decoded = [with_margins(per_axis[k][0], halos[k - 1]) for k in (1, 2)]
    check_min_block([decoded, *spatial_decoded], geometry, f"shot {shot!r}: a tile",
                    "use fewer tiles along {axis}")  # fmt: skip
    validate_chunking(grid, chunk, per_axis[0][0], decoded)
    if chunk.carry and not geometry.carries:
        raise FarmError(
            f"shot {shot!r}: this decoder cannot carry its causal state from one temporal chunk to the "
            "next (it looks ahead in time or injects noise: only causal, noiseless LTX-2 configs carry, and "
            "no released one is causal); drop --carry to decode each chunk with context on both sides"
        )

    tiles: list[Tile] = []
    for i_f in range(grid.tiles[0]):
        for i_h in range(grid.tiles[1]):
            for i_w in range(grid.tiles[2]):
                pos = (i_f, i_h, i_w)
                tiles.append(
                    Tile(
                        shot=shot,
                        index=len(tiles),
                        grid_pos=pos,
                        latent=tuple(per_axis[a][0][pos[a]] for a in range(3)),  # type: ignore[arg-type]
                        pixels=tuple(per_axis[a][1][pos[a]] for a in range(3)),  # type: ignore[arg-type]
                        context=warm[i_f][0],
                        lookahead=warm[i_f][1],
                        halo=(*halos[0][i_h], *halos[1][i_w]),
                    )
                )
    if any(limit is not None for limit in chunk.limits()):  # a chunking that cannot be decoded: now
        for fhw in sorted({t.decoded_fhw for t in tiles}):
            plan_chunks(fhw, geometry, chunk)
    batches = plan_batches(shot, pixel_shape[0], batch_frames, tiles)
    return ShotPlan(
        shot=shot,
        latent_shape=(c, f, h, w),
        pixel_shape=pixel_shape,
        grid=grid,
        tiles=tuple(tiles),
        batches=batches,
        complementary=tuple(p[2] for p in per_axis),  # type: ignore[arg-type]
        chunk=chunk,
    )


def assign_round_robin(plans: Sequence[ShotPlan], n_workers: int) -> list[ShotPlan]:
    """Give the job's tiles, in order across shots, to worker slots 0, 1, …, n-1, 0, 1, …"""
    if n_workers < 1:
        raise FarmError(f"need at least one worker to assign tiles to; got {n_workers}")
    out, slot = [], 0
    for plan in plans:
        tiles = []
        for tile in plan.tiles:
            tiles.append(replace(tile, worker=slot % n_workers))
            slot += 1
        out.append(replace(plan, tiles=tuple(tiles)))
    return out


# --------------------------------------------------------------------------------------------------
# Intra-worker chunks and the streaming window
# --------------------------------------------------------------------------------------------------


def plan_chunks(tile_latent_fhw: Sequence[int], geometry: Geometry, chunk: ChunkSize) -> list[Tile]:
    """Split one tile's latent block into decode calls no larger than `chunk` (tile-local coordinates).

    The chunks' pixel weights are normalised, so decoding each, weighting and summing gives the tile.
    """
    return list(_plan_chunks(tuple(int(x) for x in tile_latent_fhw), geometry, chunk))


@functools.lru_cache(maxsize=4096)  # the planner asks for the same tile shapes over many candidate grids
def _plan_chunks(tile_latent_fhw: tuple[int, ...], geometry: Geometry, chunk: ChunkSize) -> tuple[Tile, ...]:
    limits = chunk.limits()
    for axis_name, limit in zip(AXES[1:], limits[1:], strict=True):
        if limit is not None and limit < MIN_SPATIAL_CHUNK:
            raise FarmError(
                f"chunk {axis_name} {limit} is too small: decoders pad each chunk spatially (reflect "
                f"padding), which needs at least {MIN_SPATIAL_CHUNK} latent units; use {MIN_SPATIAL_CHUNK} "
                "or more"
            )
    f, h, w = (int(x) for x in tile_latent_fhw)
    pixel_shape = geometry.pixel_shape((f, h, w))
    per_axis = []
    for axis, size in enumerate((f, h, w)):
        limit = limits[axis]
        temporal = axis == 0
        if temporal and chunk.carry and limit is not None:
            per_axis.append(carried_chunks(size, limit, geometry, chunk.taper))
            continue
        if not geometry.splits(axis):
            if limit is not None:
                raise FarmError(f"a --chunk of {limit} along {AXES[axis]} is invalid: {unsplit(axis)}")
            per_axis.append(whole_axis(pixel_shape[axis], size)[:2])
            continue
        name = f"chunk {AXES[axis]}"
        intervals = (
            [Interval(0, size, 0, 0)]
            if limit is None
            else split_by_size(size, limit, min(chunk.overlap[axis], max(limit - 1, 0)), axis=name)
        )
        if temporal and geometry.causal:
            intervals = causal_shift(intervals)
        scale = geometry.temporal_scale if temporal else geometry.spatial_scale
        spans, _ = axis_spans(intervals, scale, pixel_shape[axis], temporal=temporal, causal=geometry.causal)
        per_axis.append((intervals, spans))
    # carried chunks see their past through the state, not through decoded context
    warm = [(0, 0)] * len(per_axis[0][0]) if chunk.carry else temporal_context(per_axis[0][0], f, geometry)
    halos = [spatial_halo(per_axis[a][0], size, geometry) for a, size in ((1, h), (2, w))]
    decoded = with_margins(per_axis[0][0], warm)
    spatial_decoded = [with_margins(per_axis[k][0], halos[k - 1]) for k in (1, 2)]
    check_min_block([decoded, *spatial_decoded], geometry, "a chunk",
                    "use --chunk of at least {least} along {axis}, or none")  # fmt: skip
    chunks: list[Tile] = []
    for i_f in range(len(per_axis[0][0])):
        for i_h in range(len(per_axis[1][0])):
            for i_w in range(len(per_axis[2][0])):
                pos = (i_f, i_h, i_w)
                chunks.append(
                    Tile(
                        shot="",
                        index=len(chunks),
                        grid_pos=pos,
                        latent=tuple(per_axis[a][0][pos[a]] for a in range(3)),  # type: ignore[arg-type]
                        pixels=tuple(per_axis[a][1][pos[a]] for a in range(3)),  # type: ignore[arg-type]
                        context=warm[i_f][0],
                        lookahead=warm[i_f][1],
                        halo=(*halos[0][i_h], *halos[1][i_w]),
                    )
                )
    return tuple(chunks)


def carried_frames(size: int, limit: int, taper: bool = True) -> list[int]:
    """Latent frames per carried temporal chunk of a tile of `size` latent frames, in time order.

    Without `taper`: `limit` each, the last one shorter. With it, the last chunks halve down to one
    latent frame and the first chunk takes the remainder (16 by 4: 1, 4, 4, 4, 2, 1). The frames of a
    chunk are written while the next decodes; a halving chunk decodes in about as long as the writes its
    predecessor left, so what is left to write when the decode ends is one latent frame's pixels
    (8 frames for LTX-2) instead of a whole chunk's: at 1088x1920, 32 frames took 0.23 s to write
    durably after the decode (docs/performance.md).
    """
    if not taper or size <= limit:
        return [min(limit, size - s) for s in range(0, size, limit)]
    tail: list[int] = []
    step = 1
    while sum(tail) + min(step, limit) <= size:
        tail.append(min(step, limit))
        step *= 2
    left = size - sum(tail)
    return ([left] if left else []) + tail[::-1]


def carried_chunks(
    size: int, limit: int, geometry: Geometry, taper: bool = True
) -> tuple[list[Interval], list[PixelSpan]]:
    """Temporal chunks of `size` latent frames decoded with the causal state carried (sizes from
    `carried_frames`), no overlap, weight 1 on every pixel frame. Latent frames ``[s, e)`` of a causal
    decoder give pixel frames ``[0, 1 + (e-1)*t)`` for the first chunk and ``[1 + (s-1)*t, 1 + (e-1)*t)``
    after it: the first latent frame is the only one that decodes to one pixel frame."""
    t = geometry.temporal_scale
    if not geometry.causal:
        raise FarmError("carried temporal chunks need a causal decoder; this one is not: drop --carry")
    starts = list(itertools.accumulate(carried_frames(size, limit, taper), initial=0))
    intervals = [Interval(s, e, 0, 0) for s, e in itertools.pairwise(starts)]
    spans = []
    for iv in intervals:
        start = 0 if iv.start == 0 else 1 + (iv.start - 1) * t
        stop = 1 + (iv.end - 1) * t
        spans.append(PixelSpan(start, stop, (1.0,) * (stop - start)))
    return intervals, spans


@dataclass(frozen=True)
class Segment:
    """One temporal chunk of a tile (its pieces share one latent frame interval), decoded as a task of
    its own when a render streams: its batches are blended and written while later segments decode."""

    index: int
    frames: tuple[int, int]  # tile-local pixel frames [start, stop)
    latent_frames: int
    pieces: tuple[Tile, ...]  # its decode calls, from plan_chunks (tile-local coordinates)


def tile_segments(tile: Tile, geometry: Geometry, chunk: ChunkSize) -> list[Segment]:
    """The tile's temporal chunks, in order (one when `chunk` does not split frames)."""
    groups: dict[int, list[Tile]] = {}
    for piece in plan_chunks(tile.block_fhw, geometry, chunk):
        groups.setdefault(piece.grid_pos[0], []).append(piece)
    return [
        Segment(i, (ps[0].pixels[0].start, ps[0].pixels[0].stop), ps[0].latent[0].size, tuple(ps))
        for i, ps in sorted(groups.items())
    ]


def plan_geometry(plan: ShotPlan) -> Geometry:
    """The decoder geometry a plan was made with, read back from its latent and pixel shapes."""
    _, f, h, _ = plan.latent_shape
    pf, ph, _ = plan.pixel_shape
    spatial = ph // h
    if f > 1 and (pf - 1) % (f - 1) == 0 and pf != f * ((pf - 1) // (f - 1)):
        return Geometry(spatial, (pf - 1) // (f - 1), causal=True)
    return Geometry(spatial, max(1, pf // f), causal=pf % f != 0)


def pending_plan(plan: ShotPlan, done_batches: set[int]) -> ShotPlan:
    """The part of a plan still to do: unfinished batches and only the tiles that feed them.

    Tiles keep their indices, so blends still sum in the same order and a resumed render writes the same
    bytes as an uninterrupted one.
    """
    batches = tuple(b for b in plan.batches if b.index not in done_batches)
    needed = {i for b in batches for i in b.tiles}
    return replace(plan, tiles=tuple(t for t in plan.tiles if t.index in needed), batches=batches)


def plan_identity(plan: ShotPlan) -> dict:
    """What about a plan decides the output bytes (not the worker count: that changes nothing)."""
    return {
        "tiles": list(plan.grid.tiles),
        "overlap": list(plan.grid.overlap),
        "batch_frames": plan.batches[0].frames if plan.batches else 0,
        "chunk": [plan.chunk.frames, plan.chunk.height, plan.chunk.width, list(plan.chunk.overlap)],
        # recorded only when used, as context is; True is the even schedule renders before tapering had
        **({"carry": "tapered" if plan.chunk.taper else True} if plan.chunk.carry else {}),
        "pixel_shape": list(plan.pixel_shape),
        # context frames change what a tile decodes; recorded only when used, so plans without them keep
        # the identity earlier renders stored
        **(
            {"context": [[t.context, t.lookahead] for t in plan.tiles if t.grid_pos[1:] == (0, 0)]}
            if any(t.context or t.lookahead for t in plan.tiles)
            else {}
        ),  # fmt: skip
        # likewise the spatial halo
        **({"halo": [list(t.halo) for t in plan.tiles]} if any(any(t.halo) for t in plan.tiles) else {}),
    }
