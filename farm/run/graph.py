"""Turn shot plans into Dask tasks and drive them through a bounded window.

Decode tasks are pinned to workers (round-robin, `allow_other_workers=True` so a lost worker's tiles run
elsewhere), which takes them out of the scheduler's root-task queuing: this module keeps at most
`window` decoded tiles alive at once, submitting the next tile only when a held one has been blended
into every batch it feeds. Blends run as soon as all their pieces exist; a shot's video is joined
once its last batch is written.

The policy is a `farm.planning.schedule.Schedule` (order, slots, priorities) run by a
`farm.planning.render_state.RenderState` (window, releases, finishing, workers joining); this module feeds
it Dask's results and carries out its instructions. Task keys read as what they are in the dashboard
(`farm.keys`): ``("decode-tile", render, shot, i)``, ``("tile-piece", …)``, ``("blend-batch", render, shot,
k)``, ``("write-batch", …)``, ``("encode-segment", …)``, ``("mark-batch", …)``, and one task per shot output
(`farm.worker.writers.SHOT_WRITERS`): ``("finish-shot", render, shot)`` (its video's join) and, for a shot
with sound, ``("decode-audio", render, shot)`` (the whole shot's sound, which its video's join then muxes).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from farm import config, keys, logs
from farm.errors import FarmError
from farm.planning.render_state import (
    BatchWritten,
    CancelShot,
    Instruction,
    OutputsOpened,
    OutputWritten,
    Release,
    RenderCancelled,
    RenderState,
    ShotDone,
    ShotFailed,
    Started,
    SubmitBlend,
    SubmitDecode,
    SubmitEndOutputs,
    SubmitStartOutputs,
    WorkerLeft,
    WorkersJoined,
)
from farm.planning.schedule import BlendStep, DecodeStep, Priority, Schedule, make_schedule
from farm.planning.tiling import ShotPlan, Tile, plan_geometry, tile_segments
from farm.render_ids import is_cancelled
from farm.run.cluster import IO_RESOURCE, IO_WORKER_PREFIX, scheduler_call, workers_info
from farm.run.render_log import recording
from farm.run.statistics_rounds import StatisticsRounds
from farm.run.whole_frame import WholeFramePasses, whole_frame_group_of
from farm.store.latent_chunks import LatentChunks
from farm.store.output import Output
from farm.worker.ipc import can_open, gpus_seen, one_host
from farm.worker.tasks import (
    Placement,
    VideoSettings,
    blend_batch,
    decode_tile,
    mark_batch,
    prepare_decoder,
    read_latent_ahead,
    segment_latent_frames,
    share_piece,
    take_piece,
)
from farm.worker.writers import (
    SHOT_WRITERS,
    ShotContext,
    ShotWriter,
    ShotWriting,
    batch_writers,
    shot_writers,
)

if TYPE_CHECKING:
    from distributed import Client


@dataclass
class ShotOutcome:
    shot: str
    batches_total: int
    batches_written: int = 0
    files: dict[str, str] = field(default_factory=dict)  # shot output kind → its file, once written
    error: str | None = None
    cancelled: bool = False  # stopped by `farm cancel`: not a failure, its finished batches stay
    frames_written: int = 0

    @property
    def video(self) -> str | None:
        """Its video, once joined (or found joined by an earlier render)."""
        return self.files.get("video")


@dataclass
class RenderStats:
    tiles_total: int = 0
    tiles_decoded: int = 0
    batches_total: int = 0
    batches_written: int = 0
    frames_written: int = 0
    window: int = 0
    max_tiles_held: int = 0
    render_id: str = ""
    seconds: float = 0.0  # the graph: first submission to last result
    setup_s: float = 0.0  # before the graph: reading, hashing and planning the job, connecting
    finish_s: float = 0.0  # after the graph: the last thumbnails, outcomes, closing the client
    setup_phases: dict[str, float] = field(default_factory=dict)  # set-up seconds per step, in order
    # per decode worker: seconds to its decoder and to each first decode (only with debug messages on)
    worker_steps: dict[str, dict[str, float]] = field(default_factory=dict)
    write_s: float = 0.0
    encode_s: float = 0.0
    encoded_bytes: int = 0  # of the video segments this render encoded
    encoded_pixels: int = 0  # their pixel-frames
    shots: dict[str, ShotOutcome] = field(default_factory=dict)
    # each graph's state machine (one per render pass): its log, event by event with the instructions it
    # led to, replays the render's decisions (`RenderState.replay`)
    render_states: list[RenderState] = field(default_factory=list, repr=False)

    @property
    def encoded_bits_per_pixel(self) -> float | None:
        """What this render's video segments were written at, on average (None: it encoded none)."""
        return self.encoded_bytes * 8 / self.encoded_pixels if self.encoded_pixels else None

    @property
    def failed(self) -> list[ShotOutcome]:
        return [s for s in self.shots.values() if s.error and not s.cancelled]

    @property
    def cancelled(self) -> list[ShotOutcome]:
        return [s for s in self.shots.values() if s.cancelled]


ProgressCallback = Callable[[RenderStats], None]


@dataclass(frozen=True)
class RenderTargets:
    """What a render's tasks read and write, and how they run: the same for every task of one render."""

    job_path: str
    spec_json: dict
    out: Output  # every path under OUT, its video suffix the render's codec's
    fps: dict[str, Fraction | float]  # exact rates (farm.media.rates), a float only where a shot has none
    video: VideoSettings
    metadata: dict[str, str]
    total_batches: dict[str, int]  # per shot, all its batches (a partial plan writes only some)
    # shots whose every batch is written once this render's are, so their outputs written after the last
    # batch (the video) are written (None: every shot whose batches all finish)
    finish: set[str] | None
    compile: bool | str = False
    retries: int = 1
    sound: Sound | None = None
    timecodes: dict[str, str] = field(default_factory=dict)  # start timecode per shot, where it has one
    # per shot output kind, the shots whose file this render writes (`farm.run.resume.ResumePoints.writes`;
    # None: every shot, of each kind the video settings ask for)
    writes: Mapping[str, Collection[str]] | None = None
    # per shot, the digests of its latent's chunks the render recorded when it hashed the job: each decode
    # gets those of the chunks its tile reads, and checks every chunk it reads against them
    latent_chunks: Mapping[str, LatentChunks] = field(default_factory=dict)


@dataclass(frozen=True)
class Sound:
    """A render's sound: the audio decoder, the shots whose videos carry sound (those whose sound file
    this render writes are `RenderTargets.writes`' "sound"), and the sound files' format."""

    spec_json: dict
    shots: frozenset[str]
    format: str = "wav"


def run_graph(
    client: Client,
    plans: Sequence[ShotPlan],
    targets: RenderTargets,
    *,
    window: int | None = None,
    on_progress: ProgressCallback | None = None,
    priority: int = 0,
    render_id: str | None = None,
    describe: dict[str, Any] | None = None,
    outputs_ready: Callable[[], Any] | None = None,
    stream: bool = True,
    latents_ahead: dict[tuple[str, int, int], Any] | None = None,
    on_shot_finished: Callable[[str], None] | None = None,
    refused: Mapping[str, str] | None = None,
) -> RenderStats:
    """Render `plans` (tiles already assigned to worker slots) on the cluster behind `client`.

    The run policy is `farm.planning.schedule.make_schedule`'s; this runs it. `plans` may be partial
    (`tiling.pending_plan`): only their batches are written; a shot's video is joined from all
    `targets.total_batches[shot]` segments once its last pending batch is done. `targets`: what the
    tasks read and write (`RenderTargets`; `targets.writes` the shots whose video, sound or other shot
    output this render writes: each gets its writer's task, `farm.worker.writers.SHOT_WRITERS`; a video's
    join waits for the sound this render decodes).

    `priority`: a job with a higher priority has all its tasks run before a lower one's
    (`farm.planning.schedule.Priority`). Progress is published on the scheduler under the metadata key
    ``keys.RENDERS + (render_id,)`` (see `farm.dashboard.monitor`), with `describe` merged in.

    `stream`: a tile split into temporal chunks (``--chunk F,…``) is decoded one chunk per task, so its
    first batches are blended and written while its later frames decode (same frames either way).

    `outputs_ready`: waits until the output arrays exist (made on another thread meanwhile): the first
    window of decodes is submitted before it is called, every blend and write after.

    `latents_ahead`: `read_first_latents`' futures, handed to the decodes they were read for.

    `on_shot_finished(shot)`: called on the driver's thread once a shot's video is joined (the timeline).

    `refused`: the render's shots that failed before its graph, with why (for its history).
    """
    workers, io_workers = split_workers(client)
    schedule = make_schedule(plans, n_decode=len(workers), n_io=len(io_workers), window=window, stream=stream)
    render_id = render_id or uuid.uuid4().hex[:8]
    # which decode workers see each other's GPUs (CUDA IPC opens a piece only where its GPU is visible)
    gpus = functools.partial(gpus_seen, client, workers)
    options = DriverOptions(render_id, priority, describe or {}, outputs_ready=outputs_ready, gpus=gpus,
                            latents_ahead=latents_ahead, on_shot_finished=on_shot_finished)  # fmt: skip
    driver = Driver(client, plans, schedule, RenderWorkers(workers, io_workers), targets, options)
    with recording(driver, refused or {}):  # OUT/.farm/renders/<render-id>.jsonl
        return driver.run(on_progress)


def prepare_decoders(
    client: Client, workers: Sequence[str], spec_json: dict, *, compile: bool | str, render_id: str,
    priority: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Submit `prepare_decoder` to each decode worker now, so that its decoder loads (imports, build,
    weights onto its device) while the render still sets up, instead of on its first decode's path.
    Futures by worker address; each result is that worker's seconds per step. The settings that travel
    with the render's tasks (`farm.config.WORKER_SETTINGS`: the GPU-memory budget) travel with it too."""
    prepare = functools.partial(config.run_with, config.worker_settings(), prepare_decoder)
    return {
        worker: client.submit(
            prepare, spec_json, compile, key=(keys.PREPARE_DECODER, render_id, i), workers=[worker],
            allow_other_workers=False, priority=Priority.base(priority) + Priority.PREPARE, pure=False,
        )  # fmt: skip
        for i, worker in enumerate(workers)
    }


def read_first_latents(
    client: Client, plans: Sequence[ShotPlan], workers: Sequence[str], n_io: int, *, job_path: str,
    spec_json: dict, render_id: str, priority: int = 0, stream: bool = True,
) -> dict[tuple[str, int, int], Any]:  # fmt: skip
    """Submit each decode worker's first latent read now, before the rest of the render's set-up
    (window, outputs, the graph itself): the first decode then finds its latent on its worker instead
    of reading it on the GPU's critical path (19 ms for a 1088×1920 shot's first chunk on an H200
    node, docs/performance.md). Keyed by `ahead_key` (shot name, tile, segment: positions in `plans` may
    differ from the plans `run_graph` gets, when some shots drop out meanwhile) for `run_graph`; `plans`
    with tiles assigned to slots, as `run_graph` takes them, and the cluster's decode `workers` and `n_io`
    I/O workers as `split_workers` gives them. A first decode that takes a whole-frame pass
    (`whole_frame_group_of`, by the job's decoder `spec_json`) reads no latent: none is read for it."""
    if not plans or not workers:
        return {}
    schedule = make_schedule(plans, n_decode=len(workers), n_io=n_io, stream=stream)
    first: dict[int, DecodeStep] = {}
    for step in schedule.decodes:
        first.setdefault(step.slot, step)
    shared = whole_frame_group_of(plans, spec_json)
    futures = {}
    for slot, step in first.items():
        if (step.shot, step.tile) in shared:
            continue
        plan = plans[step.shot]
        tile = plan.tiles[step.tile]
        frames: tuple[int, int] | None = None
        part: tuple[int, ...] = ()
        if step.segment >= 0:  # a streamed tile: its first segment's latent frames only
            frames = segment_latent_frames(tile_segments(tile, plan_geometry(plan), plan.chunk)[step.segment])
            part = (step.segment,)
        futures[ahead_key(plan, step)] = client.submit(
            read_latent_ahead, job_path, tile, frames,
            key=(keys.READ_LATENT, render_id, plan.shot, tile.index, *part), workers=[workers[slot]],
            allow_other_workers=True, priority=Priority.base(priority) + step.priority,
        )  # fmt: skip
    return futures


def ahead_key(plan: ShotPlan, step: DecodeStep) -> tuple[str, int, int]:
    """The key of `step`'s latent read ahead: its shot's name, its tile's index and its segment."""
    return (plan.shot, plan.tiles[step.tile].index, step.segment)


CANCELLED = "cancelled (farm cancel); finished batches are kept"  # a cancelled shot's error


def _as_completed() -> Any:
    from distributed import as_completed

    # results come with the futures, fetched in the client's background thread: the loop never waits
    # on a round trip per batch (only marks and finishes are tracked; their results are small dicts)
    return as_completed(with_results=True, raise_errors=False)


@dataclass(frozen=True)
class RenderWorkers:
    """The cluster's workers a render uses, each list sorted by address (`split_workers`): decode slot
    ``k`` is ``decode[k]``, I/O slot ``j`` is ``io[j]``."""

    decode: Sequence[str]
    io: Sequence[str] = ()


@dataclass(frozen=True)
class DriverOptions:
    """How a driver runs beside its schedule: its render's name and priority, what it publishes, and the
    hooks it waits on or takes results from.

    `completions` makes the iterator of finished ``(future, result)`` pairs (``distributed.as_completed``;
    tests of the driver pass their own beside a fake client). `outputs_ready` waits until the output
    arrays exist; `gpus` says which GPUs each decode worker sees (`ipc.visible_gpus`); `latents_ahead`
    holds `read_first_latents`' futures by `ahead_key`."""

    render_id: str
    priority: int = 0
    describe: dict[str, Any] = field(default_factory=dict)
    completions: Callable[[], Any] = _as_completed
    outputs_ready: Callable[[], Any] | None = None
    gpus: Callable[[], dict[str, tuple[str, tuple[str, ...]]]] | None = None
    latents_ahead: dict[tuple[str, int, int], Any] | None = None
    on_shot_finished: Callable[[str], None] | None = None  # a shot's video joined (its name)


class Driver:
    """Runs one :class:`~farm.planning.schedule.Schedule` on a Dask client, a shell around its
    :class:`~farm.planning.render_state.RenderState`: finished futures go in as events (a batch written,
    a shot failed or finished, workers joined, a cancel), and the instructions that come out are carried
    out here (`carry_out`: decodes, blends and shot outputs submitted, decoded tiles' futures let go).
    The policy (window, releases, finishing, joins) is the state machine's, which the planner's simulator
    runs too.

    Progress publishing, `farm cancel` polling and noticing workers that join or leave run on a thread of
    their own (:class:`Watcher`), so the loop only reacts to finished tasks.
    """

    def __init__(
        self,
        client: Client,
        plans: Sequence[ShotPlan],
        schedule: Schedule,
        workers: RenderWorkers,
        targets: RenderTargets,
        options: DriverOptions,
    ) -> None:
        self.client, self.plans, self.schedule, self.targets = client, list(plans), schedule, targets
        self.workers, self.io_workers = list(workers.decode), list(workers.io)
        self.render_id, self.base = options.render_id, Priority.base(options.priority)
        self.stats = RenderStats(
            tiles_total=len(schedule.decodes),
            batches_total=len(schedule.blends),
            shots={p.shot: ShotOutcome(p.shot, len(p.batches)) for p in plans},
            window=schedule.window,
            render_id=options.render_id,
        )
        self.publisher = ProgressPublisher(client, options.render_id, options.priority, options.describe)
        # the settings workers read (farm.WORKER_SETTINGS) that this process sets: they go with each task
        self.settings = config.worker_settings()
        self.futures = options.completions()
        self.meaning: dict[Any, tuple[str, Any]] = {}
        self.decoded: dict[tuple[int, int, int], Any] = {}  # step unit → decode future, while held
        self.pieces: dict[tuple[int, int, int, int], Any] = {}  # (*unit, batch) → piece future
        self.frames_of = {d.unit: d.frames for d in schedule.decodes}  # step unit → tile-local frames
        self.last_segment = {(d.shot, d.tile): d.segment for d in schedule.decodes}  # decodes run in order
        self.carried: dict[tuple[int, int], Any] = {}  # (shot, tile) → decode future its next segment takes
        self.blend_index = {(b.shot, b.batch): j for j, b in enumerate(schedule.blends)}
        # pieces blended on another decode worker that can open them go by CUDA IPC handle
        self.shared = shared_over_ipc(schedule, self.workers, options.gpus)
        self.outputs_ready = options.outputs_ready
        self.latents_ahead = dict(options.latents_ahead or {})  # `ahead_key` → its read-ahead future
        self.on_shot_finished = options.on_shot_finished
        # (shot, kind) → the task writing a shot output that another waits for, until that one takes it
        self.waited_on: dict[tuple[int, str], Any] = {}
        self.waited_kinds = {kind for writer in SHOT_WRITERS.values() for kind in writer.waits_on}
        self.state = RenderState(
            schedule,
            [len(p.batches) for p in plans],
            # the shots with an output written at their start, before (and waited for by) those at their end
            sound=[p for p in range(len(plans)) if any(self.will_write(w, p) for w in shot_writers("start"))],
            pinned={piece[0] for piece in self.shared},  # their pieces go between given workers
            carried={p for p, plan in enumerate(plans) if plan.chunk.carry},
            outputs_open=options.outputs_ready is None,
            # what a shot is finished with: the outputs written after its last batch (its video's join)
            end_outputs={p: [w.kind.name for w in shot_writers("end") if self.will_write(w, p)]
                         for p in range(len(plans))},  # fmt: skip
        )
        self.stats.render_states.append(self.state)
        self.whole_frame = WholeFramePasses(
            self.plans, schedule, targets.spec_json, render_id=self.render_id, job_path=targets.job_path,
            latent_chunks=targets.latent_chunks, compile=targets.compile, submit=self.submit,
            workers=lambda: list(self.workers),
        )  # fmt: skip
        self.statistics = StatisticsRounds(
            self.plans, schedule, targets.spec_json, render_id=self.render_id, compile=targets.compile,
            submit=self.submit, workers=lambda: list(self.workers),
        )  # fmt: skip
        self.lock = threading.Lock()  # the loop's handling and `adopt` (on the watcher's thread) take turns

    @property
    def failed(self) -> set[int]:
        """Shots that failed or were cancelled (positions in `plans`)."""
        return self.state.failed

    @property
    def moved(self) -> Mapping[int, int]:
        """Shots moved to a decode worker that joined mid-render: shot → its slot."""
        return self.state.moved

    # -- carrying out the state machine's instructions ------------------------------------------------

    def carry_out(self, instructions: Sequence[Instruction]) -> None:
        for instruction in instructions:
            if isinstance(instruction, SubmitDecode):
                self.submit_decode(self.schedule.decodes[instruction.step], instruction.slot)
            elif isinstance(instruction, SubmitBlend):
                self.submit_blend(self.schedule.blends[instruction.blend])
            elif isinstance(instruction, SubmitStartOutputs):  # its sound
                self.submit_shot_outputs(instruction.shot, "start")
            elif isinstance(instruction, Release):
                self.release(instruction.unit)
            elif isinstance(instruction, SubmitEndOutputs):  # its video's join
                self.submit_shot_outputs(instruction.shot, "end")
            elif isinstance(instruction, ShotDone) and self.on_shot_finished is not None:
                self.on_shot_finished(self.plans[instruction.shot].shot)
            elif isinstance(instruction, CancelShot):
                self.record_failure(instruction.shot, FarmError(CANCELLED))
                self.stats.shots[self.plans[instruction.shot].shot].cancelled = True
        self.stats.max_tiles_held = self.state.max_held

    # -- submitting ---------------------------------------------------------------------------------

    def submit_decode(self, step: DecodeStep, slot: int) -> None:
        plan = self.plans[step.shot]
        tile = plan.tiles[step.tile]
        cuts = batch_cuts(plan, step)
        t = self.targets
        part = () if step.segment < 0 else (step.segment,)  # a streamed tile: one key per segment
        carried = plan.chunk.carry and step.segment >= 0
        previous = self.carried.pop((step.shot, step.tile), None) if carried else None
        ahead = self.latents_ahead.pop(ahead_key(plan, step), None)
        recorded = t.latent_chunks.get(plan.shot)
        chunks = None if recorded is None else recorded.covering(tile.decode_slices())
        shared = self.whole_frame.for_decode(step, self.base + step.priority)
        decoded = self.statistics.for_decode(step, shared, self.base + step.priority)
        if decoded is not None:  # the tile's rounds decoded it from the pass
            shared = None
        decode = self.submit(
            decode_tile, t.job_path, t.spec_json, tile, plan.chunk, cuts, t.compile, step.segment, previous,
            ahead, chunks=chunks, shared=shared, decoded=decoded,
            key=(keys.DECODE_TILE, self.render_id, plan.shot, tile.index, *part),
            workers=[self.workers[slot]], allow_other_workers=True, retries=t.retries,
            priority=self.base + step.priority,
        )  # fmt: skip
        self.decoded[step.unit] = decode
        if carried and step.segment < self.last_segment[(step.shot, step.tile)]:
            # the next segment takes the whole result as an argument, not a task that picks the state
            # out of it: that would add a scheduler round trip between two segments, GPU idle
            self.carried[(step.shot, step.tile)] = decode
        for b, (index, _) in zip(step.feeds, cuts, strict=True):
            cut = share_piece if (*step.unit, b) in self.shared else take_piece
            self.pieces[(*step.unit, b)] = self.submit(
                cut, decode, index,
                key=(keys.TILE_PIECE, self.render_id, plan.shot, tile.index, *part, index),
                priority=self.base + Priority.PIECE,
            )  # fmt: skip
        decode.add_done_callback(self._count_decode)  # a failed decode surfaces through its blends

    def submit_blend(self, step: BlendStep) -> None:
        plan, t = self.plans[step.shot], self.targets
        batch = plan.batches[step.batch]
        pieces = [self.pieces[(step.shot, k, segment, step.batch)] for k, segment in step.pieces]
        places = [placement(plan, self.frames_of[(step.shot, k, seg)], plan.tiles[k], batch.start)
                  for k, seg in step.pieces]  # fmt: skip
        groups = [k for k, _ in step.pieces]  # a streamed tile's segments sum first, as whole tiles do
        name = (self.render_id, plan.shot, batch.index)
        blend_at = self.workers[self.moved.get(step.shot, step.slot)]
        frames = self.submit(
            blend_batch, batch, plan.pixel_shape[1:], places, pieces, t.video.frames_dtype,
            t.video.takes_yuv420, groups, t.video.hdr,
            key=(keys.BLEND_BATCH, *name), priority=self.base + Priority.BLEND,
            workers=[blend_at], allow_other_workers=True,
        )  # fmt: skip
        # writes, encodes and images run side by side on an I/O worker, or on the blending worker's threads
        where: dict[str, Any] = {
            "workers": [self.io_workers[step.io] if step.io is not None else blend_at],
            "allow_other_workers": True,
            "priority": self.base + Priority.OUTPUT,
        }
        writers = batch_writers(t.video)
        writing = ShotWriting(t.video, t.fps[plan.shot], t.metadata, t.timecodes.get(plan.shot))
        alone = writers[0].alone if len(writers) == 1 else None
        if alone is not None:  # the batch's only output: written and marked in one task
            only = writers[0]
            mark = self.submit(alone, t.out, batch, frames, *only.args(writing),
                               key=(keys.MARK_BATCH, *name), **where)  # fmt: skip
            self.futures.add(mark)
            self.meaning[mark.key] = ("blend", step)
            return
        seconds: dict[str, Any] = {"write_s": 0.0, "encode_s": 0.0}
        others = []
        for writer in writers:
            written = self.submit(writer.task, t.out, batch, frames, *writer.args(writing),
                                  key=(writer.key, *name), **where)  # fmt: skip
            if writer.seconds:
                seconds[writer.seconds] = written
            else:
                others.append(written)
        where["priority"] = self.base + Priority.MARK
        mark = self.submit(mark_batch, t.out, batch, seconds["write_s"], seconds["encode_s"], *others,
                           key=(keys.MARK_BATCH, *name), **where)  # fmt: skip
        self.futures.add(mark)
        self.meaning[mark.key] = ("blend", step)

    def will_write(self, writer: ShotWriter, shot: int) -> bool:
        """Whether this render writes `writer`'s output of `shot` (an output written after the last batch
        only where the shot's every batch is then written)."""
        t, name = self.targets, self.plans[shot].shot
        if writer.when == "end" and t.finish is not None and name not in t.finish:
            return False  # a frame-range render whose shot still has other batches to do
        if t.writes is None:
            return writer.kind.asked(t.video.identity())
        return name in t.writes.get(writer.kind.name, ())

    def submit_shot_outputs(self, shot: int, when: Literal["start", "end"]) -> None:
        """The tasks writing the shot's outputs of this timing (`farm.worker.writers.shot_writers`), each
        placed, waiting and given its arguments as its writer says."""
        context = ShotContext(self.targets, self.plans[shot])
        for writer in shot_writers(when):
            if not self.will_write(writer, shot):
                continue
            waits = [self.waited_on.pop((shot, k)) for k in writer.waits_on if (shot, k) in self.waited_on]
            where: dict[str, Any] = {}
            if writer.where == "decode":  # a GPU task: the shot's decode worker, retried as decodes are
                where = {"workers": [self.workers[shot % len(self.workers)]], "allow_other_workers": True,
                         "retries": self.targets.retries}  # fmt: skip
            done = self.submit(
                writer.task, *writer.args(context), *waits, **writer.keywords(context),
                key=(writer.key, self.render_id, context.shot), priority=self.base + Priority.FINISH, **where,
            )  # fmt: skip
            if writer.kind.name in self.waited_kinds:
                self.waited_on[(shot, writer.kind.name)] = done
            self.futures.add(done)
            self.meaning[done.key] = ("shot-output", (shot, writer))

    def adopt(self, joined: Sequence[str]) -> None:
        """Decode workers that joined mid-render take work (`RenderState`'s `WorkersJoined`)."""
        with self.lock:
            old = len(self.workers)
            self.workers.extend(joined)
            instructions = self.state.handle(WorkersJoined(len(joined)))
            logs.LOGGER.debug("%d decode worker(s) joined: %d shot(s) moved to them", len(joined),
                              sum(1 for s in self.moved.values() if s >= old))  # fmt: skip
            self.carry_out(instructions)

    def worker_left(self, slot: int) -> None:
        """The decode worker on `slot` left: shots moved to it and not started go back to their slots."""
        with self.lock:
            self.carry_out(self.state.handle(WorkerLeft(slot)))

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`Client.submit`, the task run under the worker settings this process sets (`settings`)."""
        if self.settings:
            fn = functools.partial(config.run_with, self.settings, fn)
        return self.client.submit(fn, *args, **kwargs)

    # -- reacting -----------------------------------------------------------------------------------

    def release(self, unit: tuple[int, int, int]) -> None:
        """Drop our references to a decoded tile (or segment), so the scheduler can forget it."""
        self.decoded.pop(unit, None)
        for key in [k for k in self.pieces if k[:3] == unit]:
            del self.pieces[key]

    def record_failure(self, shot: int, error: BaseException) -> None:
        """Note why `shot` stopped, and drop the decoder state its next segments would have taken."""
        message = str(error) if isinstance(error, FarmError) else f"{type(error).__name__}: {error}"
        self.stats.shots[self.plans[shot].shot].error = message
        for key in [k for k in self.carried if k[0] == shot]:  # no later segment of it will be submitted
            del self.carried[key]

    def fail_shot(self, shot: int, error: BaseException) -> None:
        if shot in self.failed:
            return
        self.record_failure(shot, error)
        self.carry_out(self.state.handle(ShotFailed(shot)))

    def batch_written(self, step: BlendStep, result: dict[str, Any]) -> None:
        stats = self.stats
        stats.batches_written += 1
        stats.frames_written += result["frames"]
        stats.write_s += result["write_s"]
        stats.encode_s += result["encode_s"]
        if result.get("encoded_bytes"):
            _, height, width = self.plans[step.shot].pixel_shape
            stats.encoded_bytes += result["encoded_bytes"]
            stats.encoded_pixels += result["frames"] * height * width
        shot = stats.shots[self.plans[step.shot].shot]
        shot.batches_written += 1
        shot.frames_written += result["frames"]
        self.carry_out(self.state.handle(BatchWritten(self.blend_index[(step.shot, step.batch)])))

    def _count_decode(self, fut: Any) -> None:  # runs on the client's thread: one increment, no locks
        if fut.status == "finished":
            self.stats.tiles_decoded += 1

    def handle(self, fut: Any, result: Any) -> None:
        entry = self.meaning.pop(fut.key, None)
        if entry is None:
            return
        kind, what = entry
        if kind == "blend":
            if what.shot in self.failed:
                return
            if fut.status != "finished":
                self.fail_shot(what.shot, _exception(fut))
            else:
                self.batch_written(what, result)
        elif kind == "shot-output":
            shot, writer = what
            self.shot_output_written(shot, writer, fut, result)

    def shot_output_written(self, shot: int, writer: ShotWriter, fut: Any, result: Any) -> None:
        """A shot output's task ended: its file goes into the outcome, and the state machine hears of it
        (`OutputWritten`: once every output written after the shot's last batch is, `ShotDone`)."""
        if fut.status != "finished":
            self.fail_shot(shot, _exception(fut))
            return
        self.stats.shots[self.plans[shot].shot].files[writer.kind.name] = result[writer.reports]
        self.carry_out(self.state.handle(OutputWritten(shot, writer.kind.name)))

    def cancel_all(self) -> None:
        self.carry_out(self.state.handle(RenderCancelled()))
        self.futures.clear()

    def run(self, on_progress: ProgressCallback | None = None) -> RenderStats:
        started = time.perf_counter()
        self.carry_out(self.state.handle(Started()))  # the first window's decodes start while the
        # outputs are being made; then the scheduler round trips: the farm page shows the render from its
        # start, nothing done
        self.publisher.publish(self.stats)
        if on_progress:
            on_progress(self.stats)  # the totals before anything is done: a progress bar from the start
        if self.outputs_ready is not None:
            self.outputs_ready()
        self.carry_out(self.state.handle(OutputsOpened()))  # blends held back, then the shots' sound
        watcher = Watcher(self)
        watcher.start()
        try:
            for fut, result in self.futures:
                # `farm cancel` releases the tasks first: their futures may end as cancelled before the
                # watcher's next poll, and a cancelled task is the cancel, not a failure of its shot
                if fut.status == "cancelled" and cancel_requested(self.client, self.render_id):
                    watcher.cancelled.set()
                if watcher.cancelled.is_set():
                    break
                with self.lock:
                    self.handle(fut, result)
                if on_progress:
                    on_progress(self.stats)
        finally:
            watcher.stop()
        if watcher.lost.is_set():
            address = getattr(self.client.scheduler, "address", None) or "its address"
            raise FarmError(
                f"lost the scheduler at {address}: no connection for {SCHEDULER_LOST_S:g} s (it stopped or "
                "was killed?); finished batches are kept, rerun once a scheduler runs to resume"
            )
        if watcher.cancelled.is_set():
            self.cancel_all()
        self.stats.seconds = time.perf_counter() - started
        self.publisher.publish(self.stats, final=True)
        if on_progress:
            on_progress(self.stats)
        return self.stats


def batch_cuts(plan: ShotPlan, step: DecodeStep) -> list[tuple[int, slice]]:
    """(batch index, frames of the step's own pixels that go there) for each batch the step feeds."""
    first = plan.tiles[step.tile].pixels[0].start + step.frames[0]  # the step's first frame in the shot
    cuts = []
    for b in step.feeds:
        batch = plan.batches[b]
        lo, hi = max(batch.start, first), min(batch.stop, first + step.frames[1] - step.frames[0])
        cuts.append((batch.index, slice(lo - first, hi - first)))
    return cuts


SCHEDULER_LOST_S = 3.0  # a scheduler connection down this long is a lost scheduler, named as such
# A monitoring call to the scheduler (progress, cancel, workers) gives up this soon: one made as the
# scheduler dies would otherwise wait out Dask's reconnect timeout (30 s), and the watcher with it.
MONITOR_CALL_S = 2.0


class Watcher(threading.Thread):
    """Beside a driver's loop: publishes its progress every `period` seconds and polls whether
    `farm cancel` named the render; on a cancel it empties the driver's completions so the loop ends."""

    def __init__(self, driver: Driver, period: float = 0.5) -> None:
        super().__init__(name=f"farm-watch-{driver.render_id}", daemon=True)
        self.driver, self.period = driver, period
        self.cancelled = threading.Event()
        self.lost = threading.Event()  # the scheduler went away and did not come back
        self.stopped = threading.Event()

    def run(self) -> None:
        d = self.driver
        away_since = None
        while not self.stopped.wait(self.period):
            if d.client.status != "running":  # the scheduler connection dropped: Dask reconnects
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since > SCHEDULER_LOST_S:
                    self.lost.set()
                    d.futures.clear()
                    return
                continue
            away_since = None
            d.publisher.publish(d.stats)
            if cancel_requested(d.client, d.render_id):
                self.cancelled.set()
                d.futures.clear()
                return
            joined, left = self.decode_workers_changed()
            for slot in left:
                d.worker_left(slot)
            if joined:
                d.adopt(joined)

    def decode_workers_changed(self) -> tuple[list[str], list[int]]:
        """Decode workers the scheduler has that the driver does not use yet, and the slots of those it
        used that the scheduler no longer has (none of either on any error)."""
        d = self.driver
        try:
            info = workers_info(d.client, timeout=MONITOR_CALL_S)
        except Exception:  # monitoring must never break a render
            return [], []
        known = set(d.workers) | set(d.io_workers)
        joined = sorted(a for a, i in info.items() if a not in known and not is_io_worker(i))
        left = [slot for slot, a in enumerate(d.workers) if a not in info and slot not in d.state.left]
        return joined, left

    def stop(self) -> None:
        self.stopped.set()
        self.join()


class ProgressPublisher:
    """Keeps the scheduler's copy of a render's progress current (rate-limited), for the farm page,
    Prometheus metrics and `farm status` of a live render."""

    def __init__(self, client: Client, render_id: str, priority: int, describe: dict[str, Any]) -> None:
        self.client, self.key = client, keys.metadata_path(*keys.RENDERS, render_id)
        self.base = {"render": render_id, "priority": priority, "started": time.time(), **describe}
        self.last = 0.0

    def publish(self, stats: RenderStats, final: bool = False) -> None:
        now = time.time()
        if not final and now - self.last < 0.5:
            return
        self.last = now
        state = "running"
        if final:
            state = "failed" if stats.failed else "cancelled" if stats.cancelled else "done"
        record = {
            **self.base,
            "state": state,
            "updated": now,
            "tiles_total": stats.tiles_total,
            "tiles_decoded": stats.tiles_decoded,
            "batches_total": stats.batches_total,
            "batches_written": stats.batches_written,
            "frames_written": stats.frames_written,
            "shots": {name: {**asdict(shot), "video": shot.video} for name, shot in stats.shots.items()},
        }
        with contextlib.suppress(Exception):  # monitoring must never break a render
            # the last record waits as long as Dask does: the page must not show a finished render running
            scheduler_call(self.client, "set_metadata", None if final else MONITOR_CALL_S,
                           keys=self.key, value=record)  # fmt: skip


def cancel_requested(client: Client, render_id: str) -> bool:
    try:
        cancelled = scheduler_call(client, "get_metadata", MONITOR_CALL_S,
                                   keys=keys.metadata_path(*keys.CANCELLED), default={}) or {}  # fmt: skip
    except Exception:  # monitoring must never break a render
        return False
    return is_cancelled(render_id, cancelled)


def shared_over_ipc(
    schedule: Schedule,
    decode_workers: Sequence[str],
    gpus: Callable[[], dict[str, tuple[str, tuple[str, ...]]]] | None = None,
) -> set[tuple[int, int, int, int]]:
    """The pieces ``(*unit, batch)`` that go by CUDA IPC handle (`worker.ipc`): with ``farm.cuda-ipc`` on,
    those blended on another decode worker that can open them (`farm.worker.ipc.can_open`: the same host and,
    with `gpus`, a worker that sees the decoding worker's GPU). The others go by value. `gpus` (per
    worker, `ipc.visible_gpus`) is asked only when some piece crosses between workers of one host."""
    if not config.get("cuda-ipc"):
        return set()
    crossing = {piece: (decode_workers[decoded], decode_workers[blended])
                for piece, (decoded, blended) in schedule.crossing().items()}  # fmt: skip
    within = {piece: pair for piece, pair in crossing.items() if one_host(list(pair))}
    seen = gpus() if gpus is not None and within else None
    return {
        piece for piece, (decoded_on, blended_on) in within.items() if can_open(decoded_on, blended_on, seen)
    }


def split_workers(client: Client) -> tuple[list[str], list[str]]:
    """The cluster's decode workers and its I/O workers, each sorted by address: I/O workers are those
    with the Dask worker resource ``farm-io`` (``dask worker --resources farm-io=1``; farm's own clusters
    give it theirs), or, on workers started without it, named ``farm-io-*``."""
    decode: list[str] = []
    io: list[str] = []
    for address, info in sorted(workers_info(client).items()):
        (io if is_io_worker(info) else decode).append(address)
    return decode, io


def is_io_worker(info: dict[str, Any]) -> bool:
    """Whether a worker (its `scheduler_info` entry) writes and encodes instead of decoding."""
    resources = info.get("resources") or {}
    return bool(resources.get(IO_RESOURCE)) or str(info.get("name", "")).startswith(IO_WORKER_PREFIX)


def placement(plan: ShotPlan, frames: tuple[int, int], tile: Tile, batch_start: int) -> Placement:
    """Where a piece of `tile` (its tile-local pixel `frames`: the whole tile or one segment) goes in a
    batch starting at frame `batch_start`."""
    span_f, span_h, span_w = tile.pixels
    return Placement(
        frame=max(span_f.start + frames[0] - batch_start, 0),
        rows=(span_h.start, span_h.stop),
        cols=(span_w.start, span_w.stop),
    )


def _exception(fut: Any) -> BaseException:
    try:
        exc = fut.exception()
    except Exception as err:  # cancelled futures raise instead of returning
        return err
    return exc if exc is not None else RuntimeError(f"task {fut.key} ended as {fut.status}")
