"""The auto planner: per shot, whole-shot tasks or a tile grid, chosen by predicted makespan of the job.

Pure: shapes, a cost model (`farm.planning.costmodel`) and a memory model in; tile grids and predictions out.

How it chooses (:func:`choose_plans`):

1. For every distinct shot shape, enumerate grids of up to ``max_per_axis`` tiles along frames, height
   and width (``max_tiles`` in all) with the decoder's minimum overlap per axis (:func:`min_overlap_for`);
   drop grids whose largest decode call does not fit a worker's memory, and grids that cannot be split
   at that overlap. Each grid's tiles are costed with the cost model.
2. Start from the cheapest grid that fits for every shot (the whole shot when it fits: 1.0x work).
3. Tiles go to workers round-robin in job order (as `farm.run.graph` runs them), so when shots outnumber
   workers only the last partial round leaves workers idle. Try splitting the shots of that tail
   (the last ``S mod W`` shots, that plus one round, or all shots) into each candidate number of tiles,
   simulate the job each time (:func:`predict`: decodes, piece transfers, blends, Zarr writes and video
   encodes, shot finishing, the bounded window), and keep the plan with the least predicted makespan
   (ties: less redundant work, then fewer tiles) if it beats the cheapest plan by more than
   :data:`MIN_GAIN`. Only split grids that no other grid beats on both decode time and redundant work
   are tried. For very long jobs the tail is chosen on the last ``S mod W + 2W`` shots (with
   round-robin in job order the rounds before repeat the same pattern) and confirmed on the whole job.

So a batch of at least as many shots as workers decodes whole shots (plus, at most, a split tail), and
a single large shot on many workers is split along the cheapest axes.

:func:`predict` is the same simulation, for any plan (auto or explicit): makespan, decode-only makespan,
utilisation, redundant work, transfer bytes and peak memory per worker.

Example:
    >>> from farm.planning import costmodel
    >>> from farm.planning.tiling import Geometry
    >>> g = Geometry(32, 8, True)
    >>> m = costmodel.load("ltx2-h200")
    >>> grids = choose_plans({"a": (128, 16, 22, 38)}, g, 1, m, None,
    ...                      memory=MemoryModel(10**9, 118))
    >>> grids["a"].tiles
    (1, 1, 1)
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from farm.decoders import decoder_class, memory_model
from farm.decoders.base import DEFAULT_SPATIAL_OVERLAP
from farm.decoders.memory import MemoryModel
from farm.errors import FarmError
from farm.planning.costmodel import CostModel
from farm.planning.render_state import (
    BatchWritten,
    Event,
    OutputsOpened,
    OutputWritten,
    RenderState,
    Started,
    SubmitBlend,
    SubmitDecode,
    SubmitEndOutputs,
    WorkersJoined,
)
from farm.planning.schedule import IO_WORKER_THREADS, Priority, Schedule, make_schedule
from farm.planning.tiling import (
    ChunkSize,
    Geometry,
    ShotPlan,
    TileGrid,
    assign_round_robin,
    causal_shift,
    plan_chunks,
    plan_geometry,
    plan_shot,
    spatial_halo,
    split_by_count,
    temporal_context,
    with_margins,
)

# Minimum overlap per axis (frames, height, width), latent units, where auto splits an axis.
#
# Height and width: the decoder's measured spatial overlap (`spatial_overlap_for`: the least whose seam
# reaches `farm.decoders.base.SEAM_TARGET_DB`, what LTX-2's shipped overlap of 4 gives the real LTX-2
# decoder; docs/fidelity.md, "Seams"). Seam error falls steadily with the overlap and has no knee, so
# auto wins by choosing the grid (whole shots, fewer seams, cheaper axes), not by thinner seams.
# Frames, measured with benchmarks/measure_seams.py on the real LTX-2 decoder architecture (random weights,
# CPU; before temporal tiles carried causal context): the causal decoder's error after a tile's start
# decays about twice as slowly as the error after a spatial cut (~17 latent frames against ~8 columns to
# fall below 5/255). 12 is the smallest temporal overlap measured whose seam is no worse than a spatial
# seam at overlap 4 in max error (63 against 78-86 /255) and seam-band PSNR (29.3 against 27.0-27.2 dB),
# on 30-unit axes. A 121-frame shot (16 latent frames) therefore never gets temporal tiles from auto.
MIN_TEMPORAL_OVERLAP = 12
DEFAULT_MIN_OVERLAP = (MIN_TEMPORAL_OVERLAP, DEFAULT_SPATIAL_OVERLAP, DEFAULT_SPATIAL_OVERLAP)

MAX_PER_AXIS = 8
MAX_TILES = 64
FINISH = "finish"  # the simulator's task (and output) of a shot's outputs written after its last batch
MEMORY_HEADROOM = 0.9  # plan decode calls to at most this fraction of a worker's memory
# Splitting shots that would decode whole must cut the predicted makespan by more than this: redundant
# work costs GPU time other jobs could use, and the end-to-end figures (blend, write, encode measured on
# an earlier, serial output path) are not trusted to a few percent. Single shots on many workers gain
# far more than this; a batch's last partial round usually does not.
MIN_GAIN = 0.05


def min_overlap_for(spec: Any | None) -> tuple[int, int, int]:
    """The minimum overlap per axis for a decoder spec: 12 frames, and its decoder's spatial overlap."""
    if spec is None:
        return DEFAULT_MIN_OVERLAP
    spatial = decoder_class(spec).spatial_overlap_for(spec.config)
    return (MIN_TEMPORAL_OVERLAP, spatial, spatial)


# --------------------------------------------------------------------------------------------------
# Candidate grids for one shot shape
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One tile grid for one shot shape, costed."""

    grid: TileGrid
    tile_seconds: tuple[float, ...]  # decode seconds per tile (all its chunks), without task overhead
    peak_bytes: int  # largest decode call
    redundancy: float

    @property
    def n_tiles(self) -> int:
        return len(self.tile_seconds)

    @property
    def max_seconds(self) -> float:
        return max(self.tile_seconds)

    @property
    def total_seconds(self) -> float:
        return sum(self.tile_seconds)

    def span(self, workers: int) -> float:
        """Decode time of this shot alone when its tiles go round-robin to `workers` workers."""
        loads = [0.0] * max(1, workers)
        for k, s in enumerate(self.tile_seconds):
            loads[k % len(loads)] += s
        return max(loads)


def _axis_sizes(
    size: int, count: int, overlap: int, *, temporal: bool, causal: bool, geometry: Geometry | None = None
) -> list[int] | None:
    """Latent sizes each tile of an axis decodes (temporal: with the decoder's context and lookahead
    frames; spatial: with its halo), or None when the split is impossible at that overlap."""
    try:
        intervals = split_by_count(size, count, overlap)
    except FarmError:
        return None
    if temporal and causal:
        intervals = causal_shift(intervals)
    if geometry is not None:
        margins = temporal_context if temporal else spatial_halo
        return with_margins(intervals, margins(intervals, size, geometry))
    return [iv.size for iv in intervals]


def _fit_overlap(size: int, count: int, overlap: int) -> int | None:
    """`overlap` when `count` tiles of `size` can share it, else None (auto never thins a seam)."""
    if count == 1:
        return 0
    return overlap if _axis_sizes(size, count, overlap, temporal=False, causal=False) else None


def _decode_seconds(
    latent_fhw: Sequence[int], geometry: Geometry, chunk: ChunkSize, cost: CostModel
) -> float:
    if chunk.limits() == (None, None, None):
        return cost.decode_seconds(geometry.pixel_shape(latent_fhw))
    return sum(
        cost.decode_seconds(tuple(s.size for s in c.pixels)) for c in plan_chunks(latent_fhw, geometry, chunk)
    )


def _call_peak(memory: MemoryModel, latent_fhw: Sequence[int], geometry: Geometry, chunk: ChunkSize) -> int:
    """Peak memory of a tile's largest decode call (the tile, or its largest chunk)."""
    if chunk.limits() == (None, None, None):
        return memory.peak_bytes(geometry.pixel_shape(latent_fhw))
    calls = plan_chunks(latent_fhw, geometry, chunk)
    return max(memory.peak_bytes(geometry.pixel_shape(c.decoded_fhw)) for c in calls)


@dataclass(frozen=True)
class SharedRounds:
    """A decoder whose spatial tiles share the shot's GroupNorm statistics, one round across them per
    GroupNorm, where a grid splits neither frames nor chunks a tile (`takes_statistics_rounds`): such
    grids need no blend where the rounds are `exact`, and a worker holds what each of its other tiles of
    the shot carries between rounds (`carried_bytes` of a tile's decoded pixel-frames) beside the tile it
    decodes; tiles go round-robin over `workers`."""

    exact: bool
    carried_bytes: Callable[[int], int]
    workers: int


def shared_rounds_for(spec: Any | None, n_workers: int) -> SharedRounds | None:
    """`SharedRounds` for a decoder spec whose tiles share its statistics; None for any other."""
    if spec is None:
        return None
    cls = decoder_class(spec)
    if not cls.shares_statistics(spec.config):
        return None
    carried = lambda pixel_frames: cls.statistics_carried_bytes(spec, pixel_frames)  # noqa: E731
    return SharedRounds(cls.statistics_exact(spec.config), carried, n_workers)


def _axis_options(
    size: int, axis: int, overlap: int, geometry: Geometry, max_per_axis: int
) -> dict[int, tuple[int, list[int]]]:
    """Tile counts along one axis → (overlap, tile lengths), for the counts the decoder can take."""
    options = {}
    most = min(max_per_axis, size) if geometry.splits(axis) else 1
    for count in range(1, most + 1):
        o = _fit_overlap(size, count, overlap)
        if o is None:
            continue
        lens = _axis_sizes(size, count, o, temporal=axis == 0, causal=geometry.causal, geometry=geometry)
        if lens is not None and min(lens) >= geometry.min_block[axis]:  # too small for the decoder
            options[count] = (o, lens)
    return options


def candidates(
    latent_shape: Sequence[int],
    geometry: Geometry,
    cost: CostModel,
    memory: MemoryModel | None,
    memory_budget: float | None,
    *,
    min_overlap: Sequence[int] = DEFAULT_MIN_OVERLAP,
    chunk: ChunkSize = ChunkSize(),
    max_per_axis: int = MAX_PER_AXIS,
    max_tiles: int = MAX_TILES,
    rounds: SharedRounds | None = None,
) -> list[Candidate]:
    """Every grid for a shot shape that fits memory, sorted by tile count then grid (deterministic).
    With `rounds`, a grid whose tiles share the shot's statistics counts what its worker's other tiles
    carry between rounds, and takes no spatial overlap where the rounds are exact."""
    _, f, h, w = (int(x) for x in latent_shape)
    sizes = (f, h, w)
    out = []
    known: dict[tuple[int, int, int], tuple[float, int]] = {}

    def tile_costs(fhw: tuple[int, int, int]) -> tuple[float, int]:
        """Decode seconds and call peak of a tile shape; grids share most of their tile shapes."""
        if fhw not in known:
            peak = _call_peak(memory, fhw, geometry, chunk) if memory is not None else 0
            known[fhw] = (_decode_seconds(fhw, geometry, chunk, cost), peak)
        return known[fhw]

    per_axis = [_axis_options(size, axis, int(min_overlap[axis]), geometry, max_per_axis)
                for axis, size in enumerate(sizes)]  # fmt: skip
    rounds = None if any(chunk.limits()) else rounds  # chunked tiles decode alone
    exact_axes = per_axis
    if rounds is not None and rounds.exact:  # tiles of one temporal tile need no blend
        exact_axes = [per_axis[0], *(_axis_options(sizes[a], a, 0, geometry, max_per_axis) for a in (1, 2))]
    for tf, (of, lf) in per_axis[0].items():
        spatial = exact_axes if tf == 1 else per_axis
        for th, (oh, lh) in spatial[1].items():
            for tw, (ow, lw) in spatial[2].items():
                if tf * th * tw > max_tiles:
                    continue
                grid = TileGrid((tf, th, tw), (of, oh, ow))
                if tf > 1 and chunk.frames is not None and chunk.frames < max(lf):
                    continue  # temporal tiles and temporal chunks would both split a tile
                seconds, peak, volume = [], 0, 0
                try:
                    for a in lf:
                        for b in lh:
                            for c in lw:
                                tile_seconds, tile_peak = tile_costs((a, b, c))
                                seconds.append(tile_seconds)
                                peak = max(peak, tile_peak)
                                volume += a * b * c
                except FarmError:  # the chunking does not fit these tiles
                    continue
                if rounds is not None and tf == 1 and th * tw > 1:
                    others = math.ceil(th * tw / rounds.workers) - 1
                    shapes = [(a, b, c) for a in lf for b in lh for c in lw]
                    largest = max(math.prod(geometry.pixel_shape(fhw)) for fhw in shapes)
                    peak += others * rounds.carried_bytes(largest)
                if memory_budget is not None and peak > memory_budget:
                    continue
                out.append(Candidate(grid, tuple(seconds), peak, volume / (f * h * w)))
    out.sort(key=lambda c: (c.n_tiles, c.grid.tiles))
    return out


# --------------------------------------------------------------------------------------------------
# Simulation of a job on workers
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """What the cost model predicts for a job's plans on `n_workers` workers."""

    n_workers: int
    makespan_s: float  # decode, transfers, blends, Zarr writes, video encodes, shot finishing
    decode_makespan_s: float  # decode and gather: the same plans with blend, output, shot costs zero
    decode_busy_s: float  # sum of decode task seconds (includes redundant overlap work)
    busy_s: float  # sum of all task seconds
    utilisation: float  # decode_busy_s / (n_workers * makespan_s): how busy the GPUs are decoding
    thread_utilisation: float  # busy_s / (n_workers * threads_per_worker * makespan_s)
    redundancy: float  # decoded latent volume / the shots' latent volume
    tiles: int
    transfer_bytes: int
    peak_bytes_per_worker: tuple[int, ...]

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_bytes_per_worker, default=0)


@dataclass(frozen=True)
class ShotTasks:
    """Timing-relevant facts of one shot's plan (shared by shots of equal shape and grid)."""

    tile_seconds: tuple[float, ...]
    tile_peak: tuple[int, ...]
    tile_volume: tuple[int, ...]  # latent volume
    tile_priority: tuple[int, ...]  # tile index (decode priority is -index)
    tile_hw: tuple[int, ...]  # pixels per frame of each tile
    feeds: tuple[tuple[tuple[int, int], ...], ...]  # per tile: (batch position, piece pixel volume)
    batch_tiles: tuple[tuple[int, ...], ...]  # per batch: tile positions
    batch_pixels: tuple[int, ...]
    batch_piece_pixels: tuple[int, ...]  # per batch: the summed pixel volume of its pieces
    latent_volume: int


def shot_tasks(
    plan: ShotPlan, cost: CostModel, memory: MemoryModel | None, geometry: Geometry
) -> ShotTasks:
    """What `simulate_schedule` needs of `plan`: each tile's predicted decode seconds and peak memory,
    the pieces it feeds, each batch's tiles and pixels."""
    position = {t.index: k for k, t in enumerate(plan.tiles)}
    batch_pos = {b.index: k for k, b in enumerate(plan.batches)}
    seconds, peak, volume, feeds = [], [], [], []
    for tile in plan.tiles:
        fhw = tile.decoded_fhw  # context and lookahead frames are decoded too
        seconds.append(_decode_seconds(fhw, geometry, plan.chunk, cost))
        peak.append(_call_peak(memory, fhw, geometry, plan.chunk) if memory else 0)
        volume.append(tile.latent_volume)
        hw = tile.pixels[1].size * tile.pixels[2].size
        feeds.append(tuple((batch_pos[b.index], (s.stop - s.start) * hw) for b, s in plan.batch_pieces(tile)))
    piece_pixels = [0] * len(plan.batches)
    for tile_feeds in feeds:
        for b, px in tile_feeds:
            piece_pixels[b] += px
    return ShotTasks(
        tile_seconds=tuple(seconds),
        tile_peak=tuple(peak),
        tile_volume=tuple(volume),
        tile_priority=tuple(t.index for t in plan.tiles),
        tile_hw=tuple(t.pixels[1].size * t.pixels[2].size for t in plan.tiles),
        feeds=tuple(feeds),
        batch_tiles=tuple(tuple(position[i] for i in b.tiles) for b in plan.batches),
        batch_pixels=tuple(b.frames * plan.pixel_shape[1] * plan.pixel_shape[2] for b in plan.batches),
        batch_piece_pixels=tuple(piece_pixels),
        latent_volume=math.prod(plan.latent_shape[1:]),
    )


def predict(
    plans: Sequence[ShotPlan],
    n_workers: int,
    cost_model: CostModel,
    *,
    memory: MemoryModel | None = None,
    window: int | None = None,
    geometry: Geometry | None = None,
    n_io: int = 0,
    joins: Sequence[tuple[float, int]] = (),
) -> Prediction:
    """Simulate `plans` (tiles assigned to worker slots, as `plan_job` returns them) on `n_workers`.

    The simulation follows `farm.run.graph` and `farm.worker.tasks`: each worker runs ``threads_per_worker``
    tasks at once, highest priority first (blends, then writes and encodes, then shot finishing, then decodes
    in tile order), and decodes one at a time on its GPU (a decode waiting for the GPU holds a thread).
    The order, slots, blend and I/O targets, priorities and window are those of
    `farm.planning.schedule.make_schedule` (what `farm.run.graph` runs): decodes pinned to their slot and
    submitted in job order through the window; a tile leaves the window when every batch it feeds is written;
    `n_io` I/O workers (``IO_WORKER_THREADS`` threads each) take the writes and encodes. A batch fed
    by one tile is blended where that tile was decoded, other batches round-robin over the workers once
    their pieces have crossed (``latency + bytes / bandwidth``, one transfer at a time into each
    worker). A blended batch's Zarr write and video encode are two tasks on its I/O worker, once its
    frames got there (``send_s_per_pixel``, one batch at a time from each blending worker), or on the
    blending worker when it has none; each waiting for an output stream: one of its node's
    ``output_streams_per_node`` when they are fewer than its workers' together, else one of its
    worker's ``output_streams_per_worker``; with ``disk_s_per_pixel`` a Zarr write also waits for its
    node's disk, which takes one batch at a time. A shot's finishing task runs on the least busy worker
    after its last batch.

    The policy is `farm.planning.render_state.RenderState`, the state machine `farm.run.graph` runs:
    `joins` (``(seconds, workers)`` pairs) adds decode workers mid-render as a render adopts them (shots
    not started move to them, the window widens); utilisation then counts them from the start.

    ``decode_makespan_s`` is the same simulation with blends, writes, encodes and shot finishing
    taking no time: decode and gather, the part that tiling decides.
    """
    if n_workers < 1:
        raise FarmError(f"need at least one worker to predict for; got {n_workers}")
    for at, count in joins:
        if at < 0 or count < 1:
            raise FarmError(
                f"a worker join needs a time of at least 0 s and at least 1 worker; got ({at}, {count})"
            )
    cache: dict[Any, ShotTasks] = {}
    shots = []
    for plan in plans:
        key = (plan.latent_shape, plan.grid, plan.chunk, tuple((b.start, b.stop) for b in plan.batches),
               tuple(t.index for t in plan.tiles))  # fmt: skip
        if key not in cache:
            cache[key] = shot_tasks(plan, cost_model, memory, geometry or plan_geometry(plan))
        shots.append(cache[key])
    schedule = make_schedule(plans, n_decode=n_workers, n_io=n_io, window=window)
    full = simulate_schedule(shots, schedule, cost_model, output=True, joins=joins)
    decode_only = simulate_schedule(shots, schedule, cost_model, output=False, joins=joins)
    n_all = n_workers + sum(count for _, count in joins)
    slots = [tuple(t.worker % n_workers for t in plan.tiles) for plan in plans]
    peaks = [0] * n_all
    for s, slot in zip(shots, slots, strict=True):
        for k, w in enumerate(slot):
            peaks[w] = max(peaks[w], s.tile_peak[k])
    for kind, p, k, w in full["trace"]:  # tiles of shots moved to a joined worker peak there too
        if kind == "decode" and w >= n_workers:
            peaks[w] = max(peaks[w], shots[p].tile_peak[k])
    decoded = sum(sum(s.tile_volume) for s in shots)
    volume = sum(s.latent_volume for s in shots)
    span = max(full["makespan"], 1e-12)
    return Prediction(
        n_workers=n_all,
        makespan_s=full["makespan"],
        decode_makespan_s=decode_only["makespan"],
        decode_busy_s=full["decode_busy"],
        busy_s=full["busy"],
        utilisation=full["decode_busy"] / (n_all * span),
        thread_utilisation=full["busy"] / (n_all * max(1, cost_model.threads_per_worker) * span),
        redundancy=decoded / volume if volume else 1.0,
        tiles=sum(len(s.tile_seconds) for s in shots),
        transfer_bytes=int(full["transfer_bytes"]),
        peak_bytes_per_worker=tuple(peaks),
    )


def simulate_schedule(
    shots: Sequence[ShotTasks],
    schedule: Schedule,
    cost: CostModel,
    *,
    output: bool,
    joins: Sequence[tuple[float, int]] = (),
) -> dict[str, Any]:
    """Discrete-event replay of `schedule` (see :func:`predict`); ``trace`` lists the tasks in the order
    they became ready: ``(kind, shot, position, worker)``, I/O workers numbered after the decode ones
    (those joining included)."""
    sim = _Simulation(shots, schedule, cost, output=output, joins=joins)
    return sim.run()


class _Simulation:
    """The state of one replay: the cost model's clock and workers around the render's own state
    machine (`state`), which says what to submit and when a tile leaves the window. Workers ``0 …
    n_decode-1`` decode and blend, those joining mid-render (`joins`) follow, idle until they join; I/O
    workers follow them and run only writes and encodes (``IO_WORKER_THREADS`` each). Tasks:
    ``("decode", step)``, ``("blend" | "write" | "encode", blend)``, ``("arrive", blend)`` (its pieces
    are there), ``("sent", blend)`` (its frames reached its I/O worker), ``("finish", shot)`` with
    positions in ``schedule.decodes`` / ``schedule.blends``, and ``("join", workers)``."""

    def __init__(
        self,
        shots: Sequence[ShotTasks],
        schedule: Schedule,
        cost: CostModel,
        *,
        output: bool,
        joins: Sequence[tuple[float, int]] = (),
    ):
        self.shots, self.schedule, self.cost, self.output = shots, schedule, cost, output
        # a shot's outputs after its last batch (its video's join) are one "finish" task here; the
        # state machine decides when the shot is finished, as it does for the render's driver
        self.finishes = output and cost.shot_overhead_s > 0
        finish = {p: (FINISH,) for p in range(len(shots))} if self.finishes else {}
        self.state = RenderState(schedule, [len(s.batch_tiles) for s in shots], end_outputs=finish)
        # decode workers that join mid-render have their places from the start, idle until they join
        self.live = schedule.n_decode
        n, n_io = schedule.n_decode + sum(count for _, count in joins), schedule.n_io
        self.n = n
        self.link = cost.link() if cost.links else None
        self.per_node = max(1, cost.workers_per_node)
        stages = [("write", cost.write_s_per_pixel), ("encode", cost.encode_s_per_pixel)]
        self.stages = dict((name, rate) for name, rate in stages if rate > 0) if output else {}
        self.blend_at = {(b.shot, b.batch): j for j, b in enumerate(schedule.blends)}
        threads = max(1, cost.threads_per_worker)
        self.ready: list[list[tuple]] = [[] for _ in range(n + n_io)]  # per worker: (-priority, seq, task)
        self.free_threads = [threads] * n + [IO_WORKER_THREADS] * n_io
        self.gpu_free = [0.0] * n  # one decode at a time per GPU (farm.worker.tasks' decode thread)
        self.recv_free = [0.0] * n
        self.send_free = [0.0] * n  # when each decode worker is done sending blended batches
        n_nodes = (n + self.per_node - 1) // self.per_node
        self.cores_busy: list[list[tuple[float, float]]] = [[] for _ in range(n_nodes)]  # the same, outputs
        # a node's cores are its decode workers' shares (`CostModel.cores_encode_s_per_pixel`)
        self.decode_workers_on = [min(self.per_node, n - k * self.per_node) for k in range(n_nodes)]
        self.node_streams = [[0.0] * max(1, cost.output_streams_per_node) for _ in range(n_nodes)]
        self.disk_busy: list[list[tuple[float, float]]] = [[] for _ in range(n_nodes)]  # sorted intervals
        self.worker_streams = [[0.0] * max(1, cost.output_streams_per_worker) for _ in range(n + n_io)]
        # Whichever limit binds: the node's streams when fewer than its workers' together, else each worker's.
        per_worker = max(1, cost.output_streams_per_worker)
        self.node_bound = cost.output_streams_per_node < self.per_node * per_worker
        self.events: list[tuple] = []  # (time, seq, worker, task)
        self.seq = 0
        for at, count in joins:
            self.seq += 1
            heapq.heappush(self.events, (at, self.seq, 0, ("join", count)))
        self.arrived = [0] * len(schedule.blends)
        self.blend_slot = [b.slot for b in schedule.blends]  # where each blend runs (moved by joins)
        self.stages_left = [len(self.stages)] * len(schedule.blends)
        self.totals = {"decode_busy": 0.0, "busy": 0.0, "transfer_bytes": 0.0}
        self.touched: set[int] = set()
        self.trace: list[tuple[str, int, int, int]] = []

    def node_of(self, w: int) -> int:
        return (w if w < self.n else w - self.n) // self.per_node % len(self.node_streams)

    def push_ready(self, w: int, priority: float, task: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.ready[w], (-priority, self.seq, task))
        self.touched.add(w)
        kind, i = task
        if kind == "decode":
            step = self.schedule.decodes[i]
            self.trace.append((kind, step.shot, step.tile, w))
        elif kind == "finish":
            self.trace.append((kind, i, 0, w))
        else:
            blend = self.schedule.blends[i]
            self.trace.append((kind, blend.shot, blend.batch, w))

    def apply(self, event: Event) -> None:
        """Hand `event` to the render's state machine and carry out its instructions on the clock: a
        decode becomes ready on its slot, a blend is noted where it will run once its pieces are there, a
        finish goes to the least busy worker; releases only free the window, which the state keeps."""
        for instruction in self.state.handle(event):
            if isinstance(instruction, SubmitDecode):
                priority = Priority.DECODE + self.schedule.decodes[instruction.step].priority
                self.push_ready(instruction.slot, priority, ("decode", instruction.step))
            elif isinstance(instruction, SubmitBlend):
                self.blend_slot[instruction.blend] = instruction.slot
            elif isinstance(instruction, SubmitEndOutputs) and self.finishes:
                least = min(range(self.live), key=lambda i: (-self.free_threads[i], len(self.ready[i]), i))
                self.push_ready(least, Priority.FINISH, ("finish", instruction.shot))

    def seconds(self, task: tuple) -> float:
        kind, i = task
        cost = self.cost
        if kind == "decode":
            step = self.schedule.decodes[i]
            return cost.task_overhead_s + self.shots[step.shot].tile_seconds[step.tile] * step.share
        if kind == "finish":
            return cost.shot_overhead_s
        blend = self.schedule.blends[i]
        s = self.shots[blend.shot]
        if kind == "blend":
            return cost.task_overhead_s + cost.blend_s_per_pixel * s.batch_piece_pixels[blend.batch]
        return cost.task_overhead_s + self.stages[kind] * s.batch_pixels[blend.batch]

    def start(self, w: int, now: float) -> None:
        while self.free_threads[w] and self.ready[w]:
            _, _, task = heapq.heappop(self.ready[w])
            kind = task[0]
            d = self.seconds(task)
            end = now + d
            if kind == "decode":  # takes a thread, then waits for the GPU (CPU workers: for a stream)
                begin = max(now, self.gpu_free[w])
                if self.cost.decode_on_host:
                    streams = self.node_streams[self.node_of(w)]
                    begin = max(begin, heapq.heappop(streams))
                    heapq.heappush(streams, begin + d)
                end = self.gpu_free[w] = begin + d
                self.totals["decode_busy"] += d
            elif kind in ("write", "encode"):  # waits for an output stream (its node's or its own)
                streams = self.node_streams[self.node_of(w)] if self.node_bound else self.worker_streams[w]
                begin = max(now, heapq.heappop(streams))
                end = begin + d
                # and for what every stream of the node shares: its cores (writes and encodes), its disk
                node, cost = self.node_of(w), self.cost
                cores = cost.cores_write_s_per_pixel if kind == "write" else cost.cores_encode_s_per_pixel
                shared = [(self.cores_busy[node], cores / self.decode_workers_on[node])]
                if kind == "write":
                    shared.append((self.disk_busy[node], cost.disk_s_per_pixel))
                for busy, rate in shared:
                    if rate > 0:
                        end = max(end, self.book(busy, rate, begin, task[1], now))
                heapq.heappush(streams, end)
            self.totals["busy"] += d
            self.free_threads[w] -= 1
            self.seq += 1
            heapq.heappush(self.events, (end, self.seq, w, task))

    def book(
        self, busy: list[tuple[float, float]], s_per_pixel: float, begin: float, j: int, now: float
    ) -> float:
        """When a node's shared resource (its disk, its cores), whose booked intervals are `busy`, has taken
        blend `j`'s batch at `s_per_pixel`, from `begin` on: in the first gap of its time from `begin` that
        holds it. (Outputs are booked as their stream frees, not in the order they begin: one booked later
        may begin earlier.)"""
        blend = self.schedule.blends[j]
        while busy and busy[0][1] <= now:  # nothing books the past
            busy.pop(0)
        seconds = s_per_pixel * self.shots[blend.shot].batch_pixels[blend.batch]
        at = begin
        for start, end in busy:
            if start >= at + seconds:
                break
            at = max(at, end)
        bisect.insort(busy, (at, at + seconds))
        return at + seconds

    def arrive(self, j: int) -> None:
        self.arrived[j] += 1
        blend = self.schedule.blends[j]
        if self.arrived[j] < len(blend.pieces):
            return
        if self.output:
            self.push_ready(self.blend_slot[j], Priority.BLEND, ("blend", j))
        else:
            self.apply(BatchWritten(j))

    def decoded(self, w: int, i: int, now: float) -> None:
        """Send a decode's pieces to where their batches blend (one transfer at a time into each)."""
        step = self.schedule.decodes[i]
        hw = self.shots[step.shot].tile_hw[step.tile]
        for b, frames in zip(step.feeds, step.feed_frames, strict=True):
            j = self.blend_at[(step.shot, b)]
            t = self.blend_slot[j]
            if t == w or self.link is None:
                self.arrive(j)
                continue
            nbytes = frames * hw * self.cost.piece_bytes_per_pixel
            self.totals["transfer_bytes"] += nbytes
            begin = max(now, self.recv_free[t])
            same_node = t // self.per_node == w // self.per_node
            at = self.recv_free[t] = begin + self.link.seconds(nbytes, same_node=same_node)
            self.seq += 1
            heapq.heappush(self.events, (at, self.seq, t, ("arrive", j)))

    def blended(self, w: int, j: int, now: float) -> None:
        """A batch blended on `w` goes to its I/O worker (one send at a time from `w`), else stays."""
        blend = self.schedule.blends[j]
        io = blend.io
        if io is None:
            self.output_ready(w, j)
            return
        pixels = self.shots[blend.shot].batch_pixels[blend.batch]
        at = self.send_free[w] = max(now, self.send_free[w]) + self.cost.send_s_per_pixel * pixels
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, self.n + io, ("sent", j)))

    def output_ready(self, w: int, j: int) -> None:
        for name in self.stages:  # a batch's Zarr write and video encode, side by side on `w`
            self.push_ready(w, Priority.OUTPUT, (name, j))

    def finished(self, w: int, task: tuple, now: float) -> None:
        kind, i = task
        if kind == "join":
            self.live += i
            self.apply(WorkersJoined(i))
            return
        if kind == "arrive":
            self.arrive(i)
            return
        if kind == "sent":
            self.output_ready(w, i)
            return
        self.free_threads[w] += 1
        self.touched.add(w)
        if kind == "decode":
            self.decoded(w, i, now)
        elif kind == "blend":
            if self.stages:
                self.blended(w, i, now)
            else:
                self.apply(BatchWritten(i))
        elif kind in ("write", "encode"):
            self.stages_left[i] -= 1
            if self.stages_left[i] == 0:
                self.apply(BatchWritten(i))
        elif kind == FINISH:
            self.apply(OutputWritten(i, FINISH))

    def run(self) -> dict[str, Any]:
        self.apply(Started())
        self.apply(OutputsOpened())
        for w in range(len(self.ready)):
            self.start(w, 0.0)
        self.touched.clear()
        makespan = 0.0
        while self.events:
            now, _, w, task = heapq.heappop(self.events)
            if task[0] != "join":  # a worker joining after the last task ends no later
                makespan = max(makespan, now)
            self.finished(w, task, now)
            for i in sorted(self.touched):
                self.start(i, now)
            self.touched.clear()
        finished = sorted(self.state.finished)
        return {"makespan": makespan, **self.totals, "trace": self.trace, "finished": finished}


# --------------------------------------------------------------------------------------------------
# Choosing plans
# --------------------------------------------------------------------------------------------------


def _nothing_fits(
    shot: str, shape: Sequence[int], geometry: Geometry, memory: MemoryModel | None,
    worker_memory_bytes: int | None, headroom: float, max_tiles: int, max_per_axis: int,
    rounds: SharedRounds | None,
) -> FarmError:  # fmt: skip
    """The refusal of a shot none of whose grids fits a worker's memory."""
    whole = memory.peak_bytes(geometry.pixel_shape(shape[1:])) if memory else 0
    carrying = (" A worker holds what each of its tiles of a shot carries between the GroupNorm rounds they "
                "share: more workers hold less each.") if rounds else ""  # fmt: skip
    return FarmError(
        f"shot {shot!r}: no tile grid of at most {max_tiles} tiles ({max_per_axis} per axis) fits a worker's "
        f"memory ({(worker_memory_bytes or 0) / 2**30:.1f} GiB x {headroom}); the whole shot needs "
        f"{whole / 2**30:.1f} GiB.{carrying} Set --chunk F,H,W to decode tiles in smaller calls, or give "
        "--tiles"
    )


def choose_plans(
    shots: Mapping[str, Sequence[int]],
    geometry: Geometry,
    n_workers: int,
    cost_model: CostModel,
    worker_memory_bytes: int | None = None,
    spec: Any | None = None,
    *,
    memory: MemoryModel | None = None,
    min_overlap: Sequence[int] | None = None,
    batch_frames: int = 32,
    chunk: ChunkSize = ChunkSize(),
    fixed: Mapping[str, TileGrid] | None = None,
    max_per_axis: int = MAX_PER_AXIS,
    max_tiles: int = MAX_TILES,
    headroom: float = MEMORY_HEADROOM,
    window: int | None = None,
    min_gain: float = MIN_GAIN,
) -> dict[str, TileGrid]:
    """A tile grid per shot (job order kept) minimising the job's predicted makespan on `n_workers`.

    `shots` maps names to latent shapes ``[C, F, H, W]`` in job order. `worker_memory_bytes` bounds each
    decode call (times `headroom`; None: no bound); the memory model comes from `memory` or, failing
    that, from the decoder adapter of `spec`. `fixed` shots keep the grid given (a resumed render keeps
    the plan it started with) and are simulated alongside. Splitting beyond the cheapest grids (whole
    shots) must cut the predicted makespan by more than `min_gain` (a fraction). Raises FarmError when
    a shot has no grid whose decode calls fit the memory.
    """
    if n_workers < 1:
        raise FarmError(f"need at least one worker to plan for; got {n_workers}")
    if memory is None and spec is not None:
        memory = memory_model(spec)
    overlap = tuple(min_overlap) if min_overlap is not None else min_overlap_for(spec)
    budget = None if worker_memory_bytes is None or memory is None else worker_memory_bytes * headroom
    fixed = dict(fixed or {})
    names = list(shots)
    shapes = {n: tuple(int(x) for x in shots[n]) for n in names}

    cands: dict[tuple[int, ...], list[Candidate]] = {}
    for n in names:
        shape = shapes[n]
        if n in fixed or shape in cands:
            continue
        rounds = shared_rounds_for(spec, n_workers)
        cands[shape] = candidates(shape, geometry, cost_model, memory, budget, min_overlap=overlap,
                                  chunk=chunk, max_per_axis=max_per_axis, max_tiles=max_tiles,
                                  rounds=rounds)  # fmt: skip
        if not cands[shape]:
            raise _nothing_fits(n, shape, geometry, memory, worker_memory_bytes, headroom, max_tiles,
                                max_per_axis, rounds)  # fmt: skip
    base = {n: (fixed[n] if n in fixed else min(cands[shapes[n]], key=_base_key).grid) for n in names}

    free = [n for n in names if n not in fixed]
    if not free or n_workers == 1:  # one worker: splitting only adds work (memory already respected)
        return base
    s_count, w_count = len(names), n_workers
    # For long jobs, search on the job's suffix: the rounds before it repeat the same pattern.
    suffix_len = s_count if s_count <= 3 * w_count else (s_count % w_count) + 2 * w_count
    scope = names[s_count - suffix_len :]
    scope_free = [n for n in scope if n not in fixed]
    r = len(scope_free) % w_count
    tails = sorted({m for m in (r, r + w_count, len(scope_free)) if 0 < m <= len(scope_free)})

    plan_cache: dict[tuple, ShotPlan] = {}

    def shot_plan(name: str, grid: TileGrid) -> ShotPlan:
        key = (shapes[name], grid)
        if key not in plan_cache:
            plan_cache[key] = plan_shot(
                "", shapes[name], geometry, grid, batch_frames=batch_frames, chunk=chunk
            )
        return replace(plan_cache[key], shot=name)

    def evaluate(grids: Mapping[str, TileGrid], names_: Sequence[str]) -> tuple:
        plans = assign_round_robin([shot_plan(n, grids[n]) for n in names_], n_workers)
        pred = predict(plans, n_workers, cost_model, window=window, geometry=geometry)
        return (pred.makespan_s, pred.redundancy, pred.tiles)

    tried: list[tuple[tuple, int, dict[str, TileGrid]]] = [(evaluate(base, scope), 0, dict(base))]
    for m in tails:
        tail = scope_free[len(scope_free) - m :]
        tail_shapes = sorted({shapes[n] for n in tail})
        n_max = min(max_tiles, max(2, math.ceil(2 * w_count / m)))
        share = max(1, w_count // m)  # workers per tail shot
        for option in _tail_options(tail_shapes, cands, share, n_max):
            grids = dict(base)
            for n in tail:
                if shapes[n] in option:
                    grids[n] = option[shapes[n]]
            tried.append((evaluate(grids, scope), len(tried), grids))
    if len(scope) < len(names):  # chosen on the suffix: confirm the best few and the base on the whole job
        tried.sort(key=lambda t: (t[0], t[1]))
        finalists = tried[:3] + [t for t in tried[3:] if t[1] == 0]
        tried = [(evaluate(g, names), order, g) for _, order, g in finalists]
    return _best_grids(tried, min_gain)


def _best_grids(tried: list[tuple[tuple, int, dict[str, TileGrid]]], min_gain: float) -> dict[str, TileGrid]:
    """The grids of the best prediction tried (makespan, redundancy, tiles; then the order tried), unless
    it beats the base grids (tried first) by no more than `min_gain`: splitting must pay, redundant work
    for a gain within the model's error does not."""
    tried = sorted(tried, key=lambda t: (t[0], t[1]))
    best = tried[0]
    base_entry = next(t for t in tried if t[1] == 0)
    if best[0][0] >= base_entry[0][0] * (1.0 - min_gain):
        best = base_entry
    return best[2]


def _tail_options(
    tail_shapes: Sequence[tuple[int, ...]],
    cands: Mapping[tuple[int, ...], Sequence[Candidate]],
    share: int,
    n_max: int,
) -> list[dict[tuple[int, ...], TileGrid]]:
    """Grids to try for the tail shots' shapes (each shot sharing `share` workers): every Pareto grid of
    a single shape, or, for several shapes, per tile count the best grid of each shape with that count."""
    frontier = {shape: pareto(cands[shape], share, n_max) for shape in tail_shapes}
    if len(tail_shapes) == 1:
        return [{tail_shapes[0]: c.grid} for c in frontier[tail_shapes[0]]]
    options: list[dict[tuple[int, ...], TileGrid]] = []
    for count in range(2, n_max + 1):
        choice = {}
        for shape in tail_shapes:
            with_count = [c for c in frontier[shape] if c.n_tiles == count]
            if with_count:
                choice[shape] = min(with_count, key=lambda c: (c.span(share), c.redundancy)).grid
        if choice:
            options.append(choice)
    return options


def pareto(found: Sequence[Candidate], workers: int, n_max: int) -> list[Candidate]:
    """Split grids (2..n_max tiles) that no other grid beats on both decode span and redundant work.

    A grid whose tiles take longer to decode on `workers` workers *and* decode more than another's is
    never worth choosing; the job simulation picks among the rest. This also keeps auto from trading
    extra redundant work for second-order gains of the end-to-end simulation.
    """
    split = [c for c in found if 1 < c.n_tiles <= n_max]
    keyed = sorted(split, key=lambda c: (c.span(workers), c.redundancy, c.n_tiles, c.grid.tiles))
    out, best_redundancy = [], math.inf
    for c in keyed:
        if c.redundancy < best_redundancy - 1e-12:
            out.append(c)
            best_redundancy = c.redundancy
    return sorted(out, key=lambda c: (c.n_tiles, c.grid.tiles))


def _base_key(c: Candidate) -> tuple:
    return (c.total_seconds, c.n_tiles, c.grid.tiles)


def describe(prediction: Prediction, cost_model: CostModel) -> str:
    """Lines for `farm plan`: what the cost model predicts for these plans."""
    p = prediction
    device = "CPU" if cost_model.decode_on_host else "GPU"  # where the cost model's decodes ran
    return "\n".join(
        [
            f"predicted on {p.n_workers} worker(s) by cost model {cost_model.name} ({cost_model.date}; "
            f"transfers over {cost_model.protocol}):",
            f"  makespan {p.makespan_s:.2f} s (decode and gather alone {p.decode_makespan_s:.2f} s); "
            f"{device} decode utilisation {p.utilisation:.0%}, task threads busy {p.thread_utilisation:.0%}",
            f"  redundant work {p.redundancy:.2f}x over {p.tiles} tiles; {p.transfer_bytes / 1e9:.2f} GB of "
            f"pieces between workers; peak memory per worker {p.peak_bytes / 2**30:.2f} GiB",
        ]
    )


__all__ = [
    "Candidate",
    "MIN_TEMPORAL_OVERLAP",
    "Prediction",
    "ShotTasks",
    "candidates",
    "choose_plans",
    "describe",
    "min_overlap_for",
    "predict",
    "shot_tasks",
    "simulate_schedule",
]
