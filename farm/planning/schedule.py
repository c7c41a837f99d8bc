"""The run policy of a render as one pure value: a :class:`Schedule`.

It says, for shot plans whose tiles are assigned to worker slots: the order decode tasks are submitted
in and the slot each runs on, where each batch is blended and where its writes and encodes run, the
named priorities, the window of decoded tiles held at once, and when a decoded tile is released (once
every batch it feeds is written). `farm.planning.render_state` runs a schedule as a state machine, which
`farm.run.graph` drives on a Dask cluster and `farm.planning.planner`'s simulator on a simulated clock to
predict its makespan, so a change of policy here or there changes both.

Slots are positions, not addresses: decode slot ``k`` is the k-th decode worker (sorted by address),
I/O slot ``j`` the j-th I/O worker. Nothing here imports Dask or torch.

>>> from farm.planning.tiling import Geometry, TileGrid, plan_shot, assign_round_robin
>>> shot = plan_shot("a", (8, 3, 4, 4), Geometry(8, 4), TileGrid((1, 1, 2), (0, 0, 1)))
>>> plans = assign_round_robin([shot], 2)
>>> s = make_schedule(plans, n_decode=2, n_io=0)
>>> [(d.tile, d.slot) for d in s.decodes], s.window
([(0, 0), (1, 1)], 4)
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from farm.errors import FarmError
from farm.planning.tiling import ShotPlan, plan_geometry, tile_segments

#: task threads of each I/O worker process (``farm-io-N``), in `farm.run.cluster` and in the simulator
IO_WORKER_THREADS = 2


class Priority:
    """Dask priorities of a render's tasks, relative to its job's base (higher runs first).

    Blends first (they free decoded tiles), then the marks that finish a batch, the writes and encodes
    that feed them, a shot's finishing, the pieces cut from decoded tiles, and decodes last, in tile
    order (``DECODE - tile index``). A job of priority P adds ``P * JOB`` to all of these, so every task
    of a higher-priority job runs before any of a lower one's.
    """

    JOB = 10**6
    PREPARE = 110  # a decode worker's decoder, loaded while the render sets up (its decodes wait for it)
    BLEND = 100
    MARK = 95
    OUTPUT = 90  # write-batch, encode-segment, write-sequence
    FINISH = 50
    PIECE = 10
    DECODE = 0

    @classmethod
    def base(cls, job_priority: int) -> int:
        return int(job_priority) * cls.JOB


@dataclass(frozen=True)
class DecodeStep:
    """One decode task: tile ``tile`` (position in ``plans[shot].tiles``) on decode slot ``slot``; with
    ``segment >= 0`` only that temporal segment of it (`tiling.tile_segments`: a streamed tile)."""

    shot: int
    tile: int
    slot: int
    priority: int  # relative to the job's base
    feeds: tuple[int, ...]  # positions in plans[shot].batches of the batches it feeds
    blends: tuple[int, ...]  # positions in Schedule.blends submitted right after this decode
    segment: int = -1  # -1: the whole tile
    frames: tuple[int, int] = (0, 0)  # tile-local pixel frames it decodes
    share: float = 1.0  # its part of the tile's decode work (latent frames)
    feed_frames: tuple[int, ...] = ()  # per fed batch: how many of its frames this step gives

    @property
    def unit(self) -> tuple[int, int, int]:
        return (self.shot, self.tile, self.segment)


@dataclass(frozen=True)
class BlendStep:
    """One batch's reduction and outputs: blended on decode slot ``slot`` from ``pieces`` (``(tile,
    segment)`` pairs, summed per tile then across tiles, in that order), written and encoded on I/O slot
    ``io`` (``None``: on the blending worker)."""

    shot: int
    batch: int  # position in plans[shot].batches
    pieces: tuple[tuple[int, int], ...]
    slot: int
    io: int | None
    local: bool  # fed by one tile: blended where it was decoded, no transfer

    @property
    def tiles(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(t for t, _ in self.pieces))


@dataclass(frozen=True)
class Schedule:
    decodes: tuple[DecodeStep, ...]  # in submission order
    blends: tuple[BlendStep, ...]  # in submission order
    window: int  # most decoded tiles (or segments) held at once
    n_decode: int
    n_io: int

    def __post_init__(self) -> None:
        if self.n_decode < 1:
            raise FarmError(
                f"a schedule needs at least one decode worker, got {self.n_decode}: the cluster has no "
                "decode workers (only I/O workers); start GPU or CPU workers"
            )
        if self.window < 1:
            raise FarmError(f"the window must hold at least one decoded tile, got {self.window}")

    def crossing(self) -> dict[tuple[int, int, int, int], tuple[int, int]]:
        """The pieces ``(*unit, batch)`` blended on another decode slot than the one that decodes them,
        each with (its decode slot, its blend slot): those that travel between workers (`farm.run.graph`
        shares them by CUDA IPC handle between workers of one host)."""
        blended_on = {(b.shot, b.batch): b.slot for b in self.blends}
        return {(*d.unit, b): (d.slot, blended_on[(d.shot, b)])
                for d in self.decodes for b in d.feeds if blended_on[(d.shot, b)] != d.slot}  # fmt: skip

    def releases(self) -> dict[tuple[int, int, int], int]:
        """Per decode step (its `unit`): how many batch writes must finish before it is released."""
        return {d.unit: len(d.feeds) for d in self.decodes}


def window_for(required: int, n_decode: int, requested: int | None = None) -> int:
    """The window a render holds: `requested` (default two decoded tiles per decode worker), raised to
    `required`, the fewest that let decodes submitted in order make progress."""
    if requested is not None and requested < 1:
        raise FarmError(f"--window must be at least 1 decoded tile, got {requested}")
    default = requested if requested is not None else 2 * max(1, n_decode)
    return max(default, required, 1)


def required_window(decodes: Sequence[DecodeStep], blends: Sequence[BlendStep]) -> int:
    """Fewest decode results held at once for decodes submitted in order to make progress: when batch b
    is the oldest unwritten one, the results held run from the oldest step still feeding an unwritten
    batch to the newest step b needs; the window must cover that span for every b."""
    position = {d.unit: i for i, d in enumerate(decodes)}
    order = {(b.shot, b.batch): k for k, b in enumerate(sorted(blends, key=lambda b: (b.shot, b.batch)))}
    last_of = sorted((max(order[(d.shot, b)] for b in d.feeds), position[d.unit]) for d in decodes if d.feeds)
    suffix_min, running = [0] * len(last_of), len(decodes)
    for i in range(len(last_of) - 1, -1, -1):
        running = min(running, last_of[i][1])
        suffix_min[i] = running
    lasts = [last for last, _ in last_of]
    need = 1
    for b in blends:
        newest = max(position[(b.shot, t, s)] for t, s in b.pieces)
        oldest = suffix_min[bisect.bisect_left(lasts, order[(b.shot, b.batch)])]
        need = max(need, newest - oldest + 1)
    return need


def _units(plan: ShotPlan, stream: bool) -> list[tuple[int, int, tuple[int, int], float]]:
    """(tile position, segment, tile-local pixel frames, share of the tile) per decode step of a shot,
    in submission order: the tiles' first segments, then their second ones, and so on.

    Interleaved so that every tile's first segment is submitted before any tile's later ones: the
    driver submits a decode with its pieces and blends (a few ms of client calls each), so a shot split
    over two GPUs whose tiles went tile by tile started its second GPU 21-40 ms after the first (the
    first tile's five segments submitted before it; docs/performance.md). A worker
    holding several tiles still runs them tile by tile: decodes of lower tiles have higher priority."""
    geometry = plan_geometry(plan) if stream and plan.chunk.frames else None
    per_tile = []
    for k, tile in enumerate(plan.tiles):
        segments = tile_segments(tile, geometry, plan.chunk) if geometry else []
        if len(segments) < 2:
            per_tile.append([(k, -1, (0, tile.pixels[0].size), 1.0)])
            continue
        total = sum(seg.latent_frames for seg in segments)
        per_tile.append([(k, seg.index, seg.frames, seg.latent_frames / total) for seg in segments])
    return [unit for rank in itertools.zip_longest(*per_tile) for unit in rank if unit is not None]


def make_schedule(
    plans: Sequence[ShotPlan], *, n_decode: int, n_io: int, window: int | None = None, stream: bool = True
) -> Schedule:
    """The schedule of `plans` on `n_decode` decode workers and `n_io` I/O workers.

    Decodes are submitted in job order (shot by shot, tile by tile) on slot ``tile.worker % n_decode``;
    with `stream`, a tile split into temporal chunks (``plan.chunk.frames``) is one decode per chunk, in
    order, each feeding the batches it reaches, and a shot's tiles take turns (`_units`). A batch is
    submitted with the decode of the last piece it needs; a batch fed by one tile is blended on that
    tile's slot, other batches round-robin over the decode slots in submission order; writes and
    encodes go round-robin over the I/O slots, or stay on the blending worker when there are none.
    """
    decodes: list[DecodeStep] = []
    blends: list[BlendStep] = []
    blend_turn = io_turn = 0
    for p, plan in enumerate(plans):
        units = _units(plan, stream)
        slots = [t.worker % max(1, n_decode) for t in plan.tiles]
        spans = [_absolute(plan, k, frames) for k, _, frames, _ in units]
        bounds = [(b.start, b.stop) for b in plan.batches]
        pieces = [[u for u, span in enumerate(spans) if _overlap(span, bound)] for bound in bounds]
        # the last unit of each tile that feeds a batch: a carried chunk before it is decoded even when
        # its batches are done (its state is needed), one after it never is
        last_needed: dict[int, int] = {}
        for u in (u for feeding in pieces for u in feeding):
            last_needed[units[u][0]] = max(last_needed.get(units[u][0], -1), u)
        for u, (k, segment, frames, share) in enumerate(units):
            ready = []
            for b, feeding in enumerate(pieces):  # batches whose last piece this is, in batch order
                if not feeding or max(feeding) != u:
                    continue
                local = len({units[v][0] for v in feeding}) == 1
                if local:
                    slot = slots[k]
                else:
                    slot, blend_turn = blend_turn % max(1, n_decode), blend_turn + 1
                io = None
                if n_io:
                    io, io_turn = io_turn % n_io, io_turn + 1
                ready.append(len(blends))
                # tile by tile, each tile's segments in order: the sum's order (the bytes) whatever
                # order the tiles' segments were submitted in
                summed = tuple(sorted(units[v][:2] for v in feeding))
                blends.append(BlendStep(p, b, summed, slot, io, local))
            feeds = tuple(b for b, feeding in enumerate(pieces) if u in feeding)
            if not feeds and not (plan.chunk.carry and u < last_needed.get(k, -1)):
                continue  # a segment of a resumed tile whose batches are all done
            given = tuple(_overlap(spans[u], bounds[b]) for b in feeds)
            priority = Priority.DECODE - plan.tiles[k].index
            decodes.append(
                DecodeStep(p, k, slots[k], priority, feeds, tuple(ready), segment, frames, share, given)
            )
    blends = _tail_written_where_blended(decodes, blends)
    required = required_window(decodes, blends) if decodes else 1
    return Schedule(tuple(decodes), tuple(blends), window_for(required, n_decode, window), n_decode, n_io)


# At most this many batches completed by a streamed tile's last segment are written where they were
# blended (a carried shot's tapered last segments complete one or two).
LOCAL_TAIL_BATCHES = 4


def _tail_written_where_blended(decodes: Sequence[DecodeStep], blends: list[BlendStep]) -> list[BlendStep]:
    """The batches a decode slot's last decode completes write on the blending worker: when that decode
    is a streamed tile's segment completing at most `LOCAL_TAIL_BATCHES`, all of them; else the last.

    Sending a batch to an I/O worker costs a transfer (≈ 0.06 s for 8 frames of 1088×1920, 0.02 s for
    704×1216 on an H200 node: docs/performance.md) that is hidden while the decode worker has work left.
    Once the slot has no decode left, nothing hides it: it would be the render's tail. A segment's few
    batches are written side by side by the decode worker's idle threads (docs/performance.md); a whole
    tile's many still go out, but the last."""
    last_decode = {d.slot: i for i, d in enumerate(decodes)}
    submitted_with = {b: i for i, d in enumerate(decodes) for b in d.blends}
    at_the_end: dict[int, list[int]] = {}
    for k, b in enumerate(blends):
        if submitted_with.get(k, -1) >= last_decode.get(b.slot, -1):
            at_the_end.setdefault(b.slot, []).append(k)
    tail = set()
    for slot, ks in at_the_end.items():
        last = last_decode.get(slot)  # None: a slot that only blends (tiles of other slots)
        few = last is not None and len(ks) <= LOCAL_TAIL_BATCHES and decodes[last].segment >= 0
        tail.update(ks if few else ks[-1:])
    return [replace(b, io=None) if k in tail else b for k, b in enumerate(blends)]


def _absolute(plan: ShotPlan, tile: int, frames: tuple[int, int]) -> tuple[int, int]:
    start = plan.tiles[tile].pixels[0].start
    return (start + frames[0], start + frames[1])


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))
