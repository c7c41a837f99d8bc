"""The run policy of a render as one pure value: a :class:`Schedule`.

It says, for shot plans whose tiles are assigned to worker slots: the order decode tasks are submitted
in and the slot each runs on, where each batch is blended and where its writes and encodes run, the
named priorities, the window of decoded tiles held at once, and when a decoded tile is released (once
every batch it feeds is written). `farm.graph` runs a schedule on a Dask cluster; `farm.planner`'s
simulator replays the same schedule to predict its makespan, so a change of policy here changes both.

Slots are positions, not addresses: decode slot ``k`` is the k-th decode worker (sorted by address),
I/O slot ``j`` the j-th I/O worker. Nothing here imports Dask or torch.

>>> from farm.tiling import Geometry, TileGrid, plan_shot, assign_round_robin
>>> shot = plan_shot("a", (8, 3, 4, 4), Geometry(8, 4), TileGrid((1, 1, 2), (0, 0, 1)))
>>> plans = assign_round_robin([shot], 2)
>>> s = make_schedule(plans, n_decode=2, n_io=0)
>>> [(d.tile, d.slot) for d in s.decodes], s.window
([(0, 0), (1, 1)], 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from farm.errors import FarmError
from farm.tiling import ShotPlan, required_window

#: task threads of each I/O worker process (``farm-io-N``), in `farm.cluster` and in the simulator
IO_WORKER_THREADS = 2


class Priority:
    """Dask priorities of a render's tasks, relative to its job's base (higher runs first).

    Blends first (they free decoded tiles), then the marks that finish a batch, the writes and encodes
    that feed them, a shot's finishing, the pieces cut from decoded tiles, and decodes last, in tile
    order (``DECODE - tile index``). A job of priority P adds ``P * JOB`` to all of these, so every task
    of a higher-priority job runs before any of a lower one's.
    """

    JOB = 10**6
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
    """One decode task: tile ``tile`` (position in ``plans[shot].tiles``) on decode slot ``slot``."""

    shot: int
    tile: int
    slot: int
    priority: int  # relative to the job's base
    feeds: tuple[int, ...]  # positions in plans[shot].batches of the batches it feeds
    blends: tuple[int, ...]  # positions in Schedule.blends submitted right after this decode


@dataclass(frozen=True)
class BlendStep:
    """One batch's reduction and outputs: blended on decode slot ``slot`` from the pieces of ``tiles``
    (summed in that order), written and encoded on I/O slot ``io`` (``None``: on the blending worker)."""

    shot: int
    batch: int  # position in plans[shot].batches
    tiles: tuple[int, ...]  # tile positions
    slot: int
    io: int | None
    local: bool  # fed by one tile: blended where it was decoded, no transfer


@dataclass(frozen=True)
class Schedule:
    decodes: tuple[DecodeStep, ...]  # in submission order
    blends: tuple[BlendStep, ...]  # in submission order
    window: int  # most decoded tiles held at once
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

    def releases(self) -> dict[tuple[int, int], int]:
        """Per decoded tile ``(shot, tile)``: how many batch writes must finish before it is released."""
        return {(d.shot, d.tile): len(d.feeds) for d in self.decodes}

    def shot_blends(self, shot: int) -> list[BlendStep]:
        return [b for b in self.blends if b.shot == shot]


def window_for(plans: Sequence[ShotPlan], n_decode: int, requested: int | None = None) -> int:
    """The window a render of `plans` holds: `requested` (default two decoded tiles per decode worker),
    raised to the fewest tiles that let tiles submitted in order make progress."""
    if requested is not None and requested < 1:
        raise FarmError(f"--window must be at least 1 decoded tile, got {requested}")
    default = requested if requested is not None else 2 * max(1, n_decode)
    return max(default, required_window(plans) if plans else 1)


def make_schedule(
    plans: Sequence[ShotPlan], *, n_decode: int, n_io: int, window: int | None = None
) -> Schedule:
    """The schedule of `plans` on `n_decode` decode workers and `n_io` I/O workers.

    Decodes are submitted in job order (shot by shot, tile by tile) on slot ``tile.worker % n_decode``.
    A batch is submitted with the decode of the last tile it needs; a batch fed by one tile is blended
    on that tile's slot, other batches round-robin over the decode slots in submission order; writes and
    encodes go round-robin over the I/O slots, or stay on the blending worker when there are none.
    """
    decodes: list[DecodeStep] = []
    blends: list[BlendStep] = []
    blend_turn = io_turn = 0
    for p, plan in enumerate(plans):
        position = {t.index: k for k, t in enumerate(plan.tiles)}
        slots = [t.worker % max(1, n_decode) for t in plan.tiles]
        batch_tiles = [tuple(position[i] for i in batch.tiles) for batch in plan.batches]
        for k, tile in enumerate(plan.tiles):
            ready = []
            for b, tiles in enumerate(batch_tiles):  # batches whose last tile this is, in batch order
                if max(tiles) != k:
                    continue
                local = len(tiles) == 1
                if local:
                    slot = slots[k]
                else:
                    slot, blend_turn = blend_turn % max(1, n_decode), blend_turn + 1
                io = None
                if n_io:
                    io, io_turn = io_turn % n_io, io_turn + 1
                ready.append(len(blends))
                blends.append(BlendStep(p, b, tiles, slot, io, local))
            feeds = tuple(b for b, tiles in enumerate(batch_tiles) if k in tiles)
            decodes.append(DecodeStep(p, k, slots[k], Priority.DECODE - tile.index, feeds, tuple(ready)))
    return Schedule(tuple(decodes), tuple(blends), window_for(plans, n_decode, window), n_decode, n_io)
