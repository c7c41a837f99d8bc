"""A render, from a job to its outputs: `render` (the API's `farm.render`) makes what it is given one
`farm.run.request.RenderRequest`; `run_render` checks it, plans, joins or starts a cluster, runs the
graph and reports each shot's outcome. Every step below takes the request whole.

>>> import farm
>>> farm.synth("job.zarr", decoder="ltx2-tiny", shots=2, frames=17, height=128, width=192)  # doctest: +SKIP
>>> stats = farm.render("job.zarr", "out", workers=2)                                       # doctest: +SKIP
>>> stats.frames_written                                                                     # doctest: +SKIP
34

The pieces it puts together live in the modules named for them (`farm.planning.options`,
`farm.planning.jobplan`, `farm.planning.budgets`, `farm.run.resume`, `farm.store.output`,
`farm.store.frames`); import them from there (or from ``farm``): this module exports only what it defines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import dask.config
import numpy as np

from farm import keys, logs
from farm.config import joins_running_cluster
from farm.dashboard.monitor import dashboard_link
from farm.dashboard.monitor import install as install_monitor
from farm.dashboard.thumbnails import ShotThumbnails, middle_batch
from farm.decoders import decoder_class, decoder_timings
from farm.decoders.weights import pinned_weights
from farm.errors import FarmError
from farm.media import beneath
from farm.media.rates import start_timecode
from farm.media.settings import VideoSettings, with_decoder_hdr
from farm.owner import owner
from farm.planning.budgets import (
    check_fits,
    default_window,
    host_memory_warning,
    host_peak_bytes,
    memory_warning,
)
from farm.planning.jobplan import check_shots, plan_shots
from farm.planning.options import AUTO, PlanOptions
from farm.planning.schedule import Priority
from farm.planning.tiling import ShotPlan, assign_round_robin
from farm.run.cluster import (
    check_worker_paths,
    connect,
    planned_cluster_size,
    planned_gpu_memory,
    smallest_gpu_memory,
    smallest_memory_limit,
)
from farm.run.graph import (
    ProgressCallback,
    RenderStats,
    RenderTargets,
    ShotOutcome,
    Sound,
    prepare_decoders,
    read_first_latents,
    run_graph,
    split_workers,
)
from farm.run.recorded import (
    check_passes,
    describe_settings,
    differing_settings,
    given_settings,
    requests_per_recorded_settings,
)
from farm.run.request import RenderRequest
from farm.run.resume import (
    ResumePoints,
    check_one_job,
    latent_identities,
    outputs_asked,
    plan_opening,
    record_identity,
    recorded_identity,
    recorded_layout,
    render_identities,
    resume_points,
    sound_shots,
)
from farm.run.timeline import RenderTimeline
from farm.run.validate import check_frame_numbers_fit
from farm.store.claims import check_chunk_files
from farm.store.frames import prepare_output
from farm.store.job import Job, open_job
from farm.store.latent_chunks import LatentChunks
from farm.store.lock import (
    cancel_command,
    guarded_writes,
    job_read_lock,
    other_renders,
    output_lock,
    render_guard,
    shared_lock,
    stale_guards,
)
from farm.store.markers import mark_done
from farm.store.output import Output, check_writable, os_errors_in_one_line, removed_if_left_empty
from farm.store.output_kinds import TIMELINE, open_for_render
from farm.store.ownership import check_no_foreign_files, check_no_links

if TYPE_CHECKING:
    from distributed import Client
    from distributed import Future as DaskFuture


class SetupClock:
    """The seconds of each step of a render's set-up (`RenderStats.setup_phases`): where the time before
    the first decode goes, which on a GPU node is the part of a render that does not scale."""

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.phases[step] = now - self._last
        self._last = now

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def until_graph(self, graph_s: float) -> tuple[float, dict[str, float]]:
        """The set-up's seconds (all but the graph's `graph_s`, just ended), and its steps: the last is
        the graph's own start before its first submission."""
        setup = self.elapsed() - graph_s
        phases = {**self.phases, "start the graph": max(0.0, setup - sum(self.phases.values()))}
        logs.LOGGER.debug("set-up %.2f s: %s", setup, ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        return setup, phases


@dataclass(frozen=True)
class PassSetup:
    """What the set-up steps of one render pass read: its job (as it decodes), its request, and the
    clock timing the steps."""

    job: Job
    request: RenderRequest
    clock: SetupClock


@dataclass(frozen=True)
class ClusterSize:
    """How many decode and I/O workers the render's cluster has."""

    decode: int
    io: int


def render(
    job_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    options: PlanOptions | None = None,
    shots: Sequence[str] | None = None,
    restart: bool = False,
    compile: bool | str = False,
    video: VideoSettings | None = None,
    window: int | None = None,
    log: Callable[[str], None] = logs.message,
    on_progress: ProgressCallback | None = None,
    priority: int = 0,
    render_id: str | None = None,
    frames: str | None = None,
    stream: bool = True,
) -> RenderStats:
    """Render a job's shots to ``OUT/frames.zarr`` and ``OUT/videos``, resuming what OUT already holds.

    A rerun into the same OUT decodes only tiles that feed unfinished batches. OUT records what it is a
    render of (latents' hash, decoder spec, plan); a render of something else into it is refused unless
    `restart` (which starts the differing shots over). `compile` runs the decoder through
    torch.compile on GPU workers (each new tile shape compiles once per worker process); a string
    names the mode (`farm.decoders.COMPILE_MODES`, e.g. "reduce-overhead" for CUDA graphs).

    `frames` (e.g. ``"1-48"``, ``"1-100x2"``) renders only the batches holding those frame numbers and
    merges with what OUT already holds. `video` chooses the codec and an optional image sequence.
    Into an OUT that holds a render, `options` and `video` left out take the batch frames and output
    settings OUT recorded (`farm.run.recorded`); given, they must match them (or `restart`).

    `log` receives progress messages and warnings (default: the ``farm`` logger, `farm.logs`).
    `priority`: renders sharing a cluster run a higher priority's tasks first. `render_id` names the
    render on the cluster (task keys, the farm page, `farm cancel`; default: a new random id).

    The arguments become one `farm.run.request.RenderRequest`, rendered by `run_render`.
    """
    request = RenderRequest(
        job_path, out_path, workers=workers, scheduler=scheduler, scheduler_file=scheduler_file,
        options=options or PlanOptions(), shots=shots, restart=restart, compile=compile,
        video=video or VideoSettings(), window=window, log=log, on_progress=on_progress, priority=priority,
        render_id=render_id or "", frames=frames, stream=stream, given=given_settings(options, video),
    )  # fmt: skip
    return run_render(request)


def run_render(request: RenderRequest) -> RenderStats:
    """Render `request` (`render` documents its values), holding the job store's read lock
    (`farm.store.lock.job_read_lock`) from its first read, the latents' hash, to its end, so every
    batch decodes the latents that identity names."""
    with job_read_lock(request.job_path):
        return _render(request)


def _render(request: RenderRequest) -> RenderStats:
    job = open_job(request.job_path)
    # each shot resumes with the settings OUT recorded for it, unless the user set them: shots OUT
    # recorded different settings for render one after another, each with its own
    passes = requests_per_recorded_settings(request, request.shots or list(job.shots), list(job.shots))
    if len(passes) == 1:
        return _render_pass(job, passes[0][0])
    check_passes([part for part, _ in passes], job.spec.hdr)
    stats: list[RenderStats] = []
    for (part, _), differ in zip(passes, differing_settings([taken for _, taken in passes]), strict=True):
        assert part.shots is not None
        part.log(f"farm: shot(s) {', '.join(map(repr, part.shots))} resume with the settings OUT recorded "
                 f"for them ({describe_settings(differ)})")  # fmt: skip
        stats.append(_render_pass(job, part))
        if stats[-1].cancelled:
            break
    return merged_stats(stats)


def merged_stats(parts: Sequence[RenderStats]) -> RenderStats:
    """One `RenderStats` of renders of different shots run one after another."""
    merged = RenderStats(render_id=parts[0].render_id, setup_phases=dict(parts[0].setup_phases))
    for part in parts:
        for name in ("tiles_total", "tiles_decoded", "batches_total", "batches_written", "frames_written",
                     "seconds", "setup_s", "finish_s", "write_s", "encode_s", "encoded_bytes",
                     "encoded_pixels"):  # fmt: skip
            setattr(merged, name, getattr(merged, name) + getattr(part, name))
        merged.window = max(merged.window, part.window)
        merged.max_tiles_held = max(merged.max_tiles_held, part.max_tiles_held)
        merged.worker_steps.update(part.worker_steps)
        merged.shots.update(part.shots)
        merged.render_states.extend(part.render_states)
    return merged


def _render_pass(job: Job, request: RenderRequest) -> RenderStats:
    clock = SetupClock()
    # an HDR job renders HDR without --hdr; the request then carries what it renders
    video = with_decoder_hdr(request.video, job.spec.hdr)
    request = dataclasses.replace(request, video=video)
    if video.hdr is not None and job.spec.dtype != "float32":  # as LTX-2's pipelines, whatever their default
        request.log(f"farm: an HDR render decodes in float32 (the job's decoder spec says {job.spec.dtype})")
        job = dataclasses.replace(job, spec=dataclasses.replace(job.spec, dtype="float32"))
    out = request.out
    request.check()
    check_frame_numbers_fit(request.video.first_frame, pixel_frames(job, request.shots))
    timecodes = shot_timecodes(job, request.video.timecode)
    joins = joins_running_cluster(request.scheduler, request.scheduler_file, request.workers)
    # the weights as workers must find them, stamped before `_before_cluster` checks their content
    worker_spec = pinned_weights(job.spec).to_json()
    setup = PassSetup(job, request, clock)
    early = _before_cluster(job, request, clock, joins=joins)
    if early.checked is not None and early.checked.points.nothing_to_do:  # a finished OUT: no cluster
        request.log(f"farm: {str(out.root)!r} already holds every shot asked for; nothing to render")
        _write_missing_timeline(job, request, early.checked.plans, timecodes)
        return _add_outcomes(RenderStats(), early.checked.plans, early.checked.shot_errors, request)
    budget = request.options.worker_memory  # --gpu-memory: what each GPU worker is planned for and held to
    if not joins:  # a local cluster's memory is this machine's: a plan that cannot fit starts none
        check_fits(early.plans, job.spec, within_budget(planned_gpu_memory(request.workers), budget))
    with (
        dask.config.set({"farm.gpu-memory": budget}),  # travels with the render's tasks (farm.config)
        removed_if_left_empty(out),
        output_lock(out.root, early.names, job=job.path, render=request.render_id,
                    check=lambda: check_one_job(out, job.path, request.restart)) as lock,
        render_guard(out.root, lock.fields) as guard,  # what an I/O worker writes lands while it is held
        connect(scheduler=request.scheduler, scheduler_file=request.scheduler_file, workers=request.workers,
                decoder={"spec": worker_spec, "compile": request.compile}) as client,  # fmt: skip
    ):
        lock.record(scheduler=scheduler_address(client))  # for `farm cancel OUT`
        decode_workers, io_workers, gpu_bytes = _checked_cluster(client, job, out, early, budget)
        n_workers = len(decode_workers)
        decoders_ready = prepare_decoders(client, decode_workers, worker_spec, compile=request.compile,
                                          render_id=request.render_id, priority=request.priority)  # fmt: skip
        clock.mark("connect, check the workers")
        first_reads = FirstReads(client, request, decode_workers, len(io_workers), worker_spec)
        plans, shot_errors, identities, points = _on_cluster(
            setup, early, ClusterSize(n_workers, len(io_workers)), read_ahead=first_reads.read
        )
        assigned = assign_round_robin(points.pending, n_workers)
        first_reads.read(assigned)  # unless read before the hash was in
        window = _budget_window(client, request, decode_workers, gpu_bytes, plans, job)
        outputs = _start_output(setup, plans, identities, points, client=client, io_workers=io_workers,
                                guard=(guard, lock.fields))  # fmt: skip
        clock.mark("size the window, start the outputs")
        timeline = RenderTimeline(job, out, plans, request.video, timecodes, request.log)
        timeline.start({p.shot for p in plans} - {p.shot for p in points.pending})
        stats = RenderStats()
        interrupted = False
        try:
            if points.pending:
                _announce(client, len(points.pending), n_workers, request, request.log)
                layout = batch_layout(out, plans, points.pending)
                mark_cancelled(out, [], resumed=[p.shot for p in points.pending])
                middle = {p.shot: middle_batch(p) for p in plans}
                with ShotThumbnails(client, request.render_id, out, request.on_progress,
                                    middle) as thumbnails:  # fmt: skip  # the farm page's
                    targets = _targets(setup, plans, points, timecodes, worker_spec,
                                       latent_chunks(early.hashing.result()[0]))  # fmt: skip
                    stats = run_graph(
                        client, assigned, targets, window=window, on_progress=thumbnails,
                        priority=request.priority, render_id=request.render_id, outputs_ready=outputs.result,
                        stream=request.stream, latents_ahead=first_reads.futures,
                        on_shot_finished=timeline.shot_finished,
                        refused={name: str(error) for name, error in shot_errors.items()},
                        describe={"job": str(job.path), "out": str(out.root), "batches": layout,
                                  "owner": owner()},
                    )  # fmt: skip
                    stats.setup_s, stats.setup_phases = clock.until_graph(stats.seconds)
                    stats.worker_steps = _worker_steps(client, decoders_ready)
                mark_cancelled(out, [s.shot for s in stats.cancelled])
        except KeyboardInterrupt:
            # Ctrl-C, SIGTERM: the outputs' task is dropped, not waited for (a busy shared cluster may not
            # start it for long); one already writing finishes before the lock goes (`render_guard`)
            interrupted = True
            with contextlib.suppress(Exception):
                outputs.cancel()
            raise
        finally:
            if not interrupted:
                outputs.result()  # in place (or its error raised) before the lock is released
        timeline.end()
    stats = _add_outcomes(stats, plans, shot_errors, request)
    stats.finish_s = clock.elapsed() - stats.setup_s - stats.seconds if stats.seconds else 0.0
    return stats


def _checked_cluster(
    client: Client, job: Job, out: Output, early: BeforeCluster, budget: int | None = None
) -> tuple[list[str], list[str], int | None]:
    """The cluster's decode workers, its I/O workers and the smallest GPU memory among the former (at
    most the `budget`), once OUT is writable, the workers see the job's and OUT's paths, and the plans
    fit: every refusal before any task is submitted."""
    check_writable(out)
    check_worker_paths(client, {"job store": str(job.path), "output folder": str(out.root)})
    decode_workers, io_workers = split_workers(client)  # decoders, and the farm-io-* writers
    gpu_bytes = within_budget(smallest_gpu_memory(client, decode_workers), budget)
    check_fits(early.plans, job.spec, gpu_bytes)
    if early.checked is None:  # a fresh OUT on a running cluster: its latents were hashed meanwhile
        refuse_if_no_shot_hashed(early)
    return decode_workers, io_workers, gpu_bytes


def _targets(
    setup: PassSetup, plans: Sequence[ShotPlan], points: ResumePoints, timecodes: Mapping[str, str],
    spec_json: dict, chunks: Mapping[str, LatentChunks],
) -> RenderTargets:  # fmt: skip
    """Where the render's tasks read and write, and what they write: one value for the graph. `spec_json`:
    the decoder spec with its weights pinned (`farm.decoders.weights.pinned_weights`); `chunks`: the
    digests of each shot's latent chunks."""
    job, request = setup.job, setup.request
    return RenderTargets(
        job_path=str(job.path), spec_json=spec_json, out=request.out, latent_chunks=chunks,
        fps={name: info.rate or info.fps for name, info in job.shots.items()}, video=request.video,
        metadata={"comment": "farm render: " + job.spec.describe()},
        total_batches=points.totals, finish=points.finish, compile=request.compile,
        sound=_sound(job, plans, request.video), timecodes=dict(timecodes),
        writes={kind: frozenset(shots) for kind, shots in points.writes.items()},
    )  # fmt: skip


def latent_chunks(hashes: Mapping[str, dict]) -> dict[str, LatentChunks]:
    """Each hashed shot's latent chunk digests (`farm.run.resume.latent_identity`'s "chunks")."""
    return {name: h["chunks"] for name, h in hashes.items() if "chunks" in h}


def _worker_steps(client: Client, decoders_ready: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each decode worker's seconds to its decoder (`farm.worker.tasks.prepare_decoder`) and its first decode
    of each latent shape, logged for ``farm -v render``; empty unless debug messages are on."""
    if not logs.LOGGER.isEnabledFor(logging.DEBUG) or not decoders_ready:
        return {}
    steps = {w: dict(f.result()) for w, f in decoders_ready.items() if f.status == "finished"}
    first_calls = client.run(decoder_timings, workers=list(decoders_ready), on_error="ignore")
    for worker, timings in first_calls.items():
        if isinstance(timings, dict):
            for shape, seconds in timings.get("first_call_s", {}).items():
                steps.setdefault(worker, {})[f"first decode {shape}"] = seconds
    for worker, timed in steps.items():
        logs.LOGGER.debug("worker %s: %s", worker, ", ".join(f"{k} {v:.2f} s" for k, v in timed.items()))
    return steps


def pixel_frames(job: Job, shots: Sequence[str] | None) -> dict[str, int]:
    """The frames each named shot (every shot) decodes to; shots whose values cannot render are left
    out (they fail by name where shots are checked: `farm.planning.jobplan.check_shots`)."""
    cls = decoder_class(job.spec)
    geometry = cls.geometry_for(job.spec.config)
    names = [name for name in (job.shots if shots is None else shots) if name in job.shots]
    failing = check_shots(job, names, cls.latent_channels_for(job.spec.config))
    return {name: geometry.pixel_shape(tuple(job.shots[name].latent_shape[1:]))[0]
            for name in names if name not in failing}  # fmt: skip


def shot_timecodes(job: Job, override: str | None) -> dict[str, str]:
    """Each shot's start timecode (``--timecode``, else the job's), checked against its rate before
    anything starts; shots without one are left out."""
    found = {}
    for name, info in job.shots.items():
        try:
            start = start_timecode(info.rate, info.timecode, override)
        except FarmError as exc:
            if override:
                raise FarmError(f"shot {name!r}: {exc}") from None
            continue  # the job's own timecode: that shot fails by name (farm.planning.jobplan.check_shots)
        if start:
            found[name] = start
    return found


def mark_cancelled(out: Output, cancelled: Sequence[str], resumed: Sequence[str] = ()) -> None:
    """Record in OUT the shots `farm cancel` stopped (`farm status` reads them), and forget the mark of
    shots a render takes up again (`resumed`)."""
    for shot in resumed:
        beneath.unlink(out.root, out.cancelled_marker(shot))
    for shot in cancelled:
        mark_done(out.cancelled_marker(shot), root=out.root)


class FirstReads:
    """Each decode worker's first latent, read while the render still sets up (off the GPU's path):
    `read(assigned)` submits `read_first_latents` for those plans (tiles assigned to slots), once;
    `futures` holds them by `farm.run.graph.ahead_key`."""

    def __init__(
        self, client: Client, request: RenderRequest, workers: Sequence[str], n_io: int, spec_json: dict
    ) -> None:
        self.client, self.request, self.workers, self.n_io = client, request, workers, n_io
        self.spec_json = spec_json
        self.futures: dict[tuple[str, int, int], Any] = {}

    def read(self, assigned: Sequence[ShotPlan]) -> None:
        if self.futures:
            return
        self.futures = read_first_latents(
            self.client, assigned, self.workers, self.n_io, job_path=str(self.request.job_path),
            spec_json=self.spec_json, render_id=self.request.render_id, priority=self.request.priority,
            stream=self.request.stream,
        )  # fmt: skip


class Checked(NamedTuple):
    """A render's shots once their latents are hashed and OUT is read (`_check`)."""

    plans: list[ShotPlan]  # of the shots whose latents could be hashed
    shot_errors: dict[str, FarmError]  # every shot that cannot render, by name
    hashes: dict[str, dict]  # latent identities
    identities: dict[str, dict]  # render identities
    points: ResumePoints  # what OUT already holds, what is left


def _plan(
    job: Job, request: RenderRequest, clock: SetupClock, *, plan: bool = True,
    cluster: ClusterSize | None = None,
) -> tuple[list[ShotPlan], list[str], dict[str, FarmError]]:
    """Before any cluster: the shots' plans (grids and chunking OUT recorded are kept; none unless
    `plan`; auto tiles for the `cluster` this render will start, or one decode worker when not known),
    the names of the shots that go on (planned, when `plan`), and the errors of shots that cannot
    render (the others go on)."""
    names, shot_errors = _usable_shots(job, request.shots)
    plans: list[ShotPlan] = []
    if plan:
        recorded = recorded_layout(request.out, names, request.restart)
        size = cluster or ClusterSize(1, 0)
        plans, plan_errors = plan_shots(job, request.options, names, fixed=recorded.grids,
                                        fixed_chunks=recorded.chunks, n_workers=size.decode, n_io=size.io,
                                        video=request.video)  # fmt: skip
        shot_errors.update(plan_errors)
        names = [p.shot for p in plans]
    decoder_class(job.spec).check_weights(job.spec)
    clock.mark("read and plan the job" if plan else "read the job")
    return plans, names, shot_errors


class BeforeCluster(NamedTuple):
    """What a render knows before it connects (`_before_cluster`)."""

    plans: list[ShotPlan]  # none when auto tiles wait for the cluster (`plan_first` false)
    names: list[str]  # the shots that go on
    shot_errors: dict[str, FarmError]
    hashing: Future  # the latents' identities, being read
    checked: Checked | None  # None: OUT is checked once connected
    plan_first: bool
    planned_for: ClusterSize | None  # the cluster the plans were made for (None: not known before it)


def _before_cluster(job: Job, request: RenderRequest, clock: SetupClock, *, joins: bool) -> BeforeCluster:
    """Plan and check what can be before any cluster (refusals raise here, nothing touched).

    A fresh OUT joining a running cluster (`joins`): nothing can be refused or already done, and no
    cluster is started, so the latents are hashed while the client connects, and auto tiles are planned
    once, for the cluster's workers. Otherwise OUT is checked first, and auto tiles are planned for the
    cluster this render starts (or, joining one, for one worker: planned again once its size is known)."""
    fresh_join = joins and not request.out.frames_zarr.exists()
    plan_first = not (fresh_join and request.options.tiles == AUTO)
    expected = None if joins else ClusterSize(*planned_cluster_size(request.workers))
    plans, names, shot_errors = _plan(job, request, clock, plan=plan_first, cluster=expected)
    check_out_tree(job, request.out, names, request.video, request.restart)
    hashing = _on_own_thread("farm-hash-job", latent_identities, job, names)
    checked = None
    if not fresh_join:
        checked = _check(job, request, plans, shot_errors, hashing, clock)
    return BeforeCluster(plans, names, shot_errors, hashing, checked, plan_first, expected)


def refuse_if_no_shot_hashed(early: BeforeCluster) -> None:
    """Wait for the latents' hash and refuse, before anything is submitted, a render none of whose shots
    could be read (every latent unreadable or not finite): a refused render leaves the cluster as it was."""
    hashes, unreadable = early.hashing.result()
    if not any(name in hashes for name in early.names):
        raise next(iter({**early.shot_errors, **unreadable}.values()))


def check_out_tree(job: Job, out: Output, names: Sequence[str], video: VideoSettings, restart: bool) -> None:
    """Before anything is written: no link where farm keeps its files, no file farm did not write where
    it would write one (`farm.store.ownership`)."""
    check_no_links(out, names)
    check_one_job(out, job.path, restart)
    check_no_foreign_files(out, names, lambda shot: recorded_identity(out, shot),
                           lambda shot: outputs_asked(job, shot, video), restart=restart)  # fmt: skip


def _on_cluster(
    setup: PassSetup, early: BeforeCluster, cluster: ClusterSize, *,
    read_ahead: Callable[[Sequence[ShotPlan]], None],
) -> tuple[list[ShotPlan], dict[str, FarmError], dict, ResumePoints]:  # fmt: skip
    """Once connected to a cluster of `cluster` workers: the plans to render, the shots' errors,
    identities and what is left (auto tiles planned for this cluster).

    A fresh OUT renders every planned shot whole (unless `--frames` picks batches), so `read_ahead` is
    given them (assigned to slots) before the latents' hash is waited for: the first latents are read
    meanwhile (a shot whose latent turns out unreadable is dropped, and its read is never taken)."""
    job, request, clock = setup.job, setup.request, setup.clock
    checked = early.checked
    if checked is None:
        plans, shot_errors = early.plans, early.shot_errors
        if not early.plan_first:  # auto tiles for this cluster's workers, planned now only
            plans, shot_errors = _plan_for_cluster(setup, early.names, shot_errors, cluster)
        if request.frame_numbers is None:
            read_ahead(assign_round_robin(plans, cluster.decode))
        checked = _check(job, request, plans, shot_errors, early.hashing, clock)
    plans, shot_errors, hashes, identities, points = checked
    # auto tiles planned for another cluster than this one (one worker, joining it): planned again for it
    if request.options.tiles == AUTO and early.plan_first and early.planned_for != cluster:
        plans, shot_errors = _plan_for_cluster(setup, [p.shot for p in plans], shot_errors, cluster)
        identities, points = _what_is_left(job, request, plans, hashes)
    return plans, shot_errors, identities, points


def _write_missing_timeline(
    job: Job, request: RenderRequest, plans: Sequence[ShotPlan], timecodes: Mapping[str, str]
) -> None:
    """OUT holds every shot but no timeline (OpenTimelineIO installed since, or the file removed): write
    it, as a render would have (under OUT's shared lock, as every render writes it)."""
    path = TIMELINE.file(request.out)
    if os.path.lexists(path) or not TIMELINE.available():
        return
    try:
        timeline = RenderTimeline(job, request.out, plans, request.video, timecodes, request.log)
        if timeline.start({p.shot for p in plans}) is not None:
            request.log(f"farm: wrote the timeline OUT lacked, {str(path)!r}")
    except FarmError as exc:
        request.log(f"farm: the timeline OUT lacks is not written: {exc}")


def _plan_for_cluster(
    setup: PassSetup, names: Sequence[str], shot_errors: dict[str, FarmError], cluster: ClusterSize
) -> tuple[list[ShotPlan], dict[str, FarmError]]:
    """Auto tiles planned once the cluster is known, for its decode and I/O workers (grids and chunking
    an earlier render of OUT used are kept), with the errors of shots that cannot render added to
    `shot_errors`."""
    request = setup.request
    recorded = recorded_layout(request.out, names, request.restart)  # OUT is locked only now
    plans, plan_errors = plan_shots(setup.job, request.options, names, fixed=recorded.grids,
                                    fixed_chunks=recorded.chunks, n_workers=max(1, cluster.decode),
                                    n_io=cluster.io, video=request.video)  # fmt: skip
    setup.clock.mark("plan the job for the cluster")
    return plans, {**shot_errors, **plan_errors}


def _on_own_thread(name: str, fn: Callable[..., Any], *args: Any) -> Future:
    """`fn(*args)` started on a thread of its own; its result (or error) waits in the future."""
    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def _check(
    job: Job, request: RenderRequest, plans: list[ShotPlan], shot_errors: dict[str, FarmError],
    hashing: Future, clock: SetupClock,
) -> Checked:  # fmt: skip
    """The shots that can render and what OUT already holds of them (refusals raise here, with nothing
    touched)."""
    hashes, unreadable = hashing.result()
    clock.mark("hash the latents")
    shot_errors = {**shot_errors, **unreadable}  # unreadable or non-finite latents: those shots fail
    plans = [p for p in plans if p.shot in hashes]
    if not plans:
        raise next(iter(shot_errors.values()))
    identities, points = _what_is_left(job, request, plans, hashes)
    clock.mark("check what OUT holds")
    return Checked(plans, shot_errors, hashes, identities, points)


def _what_is_left(
    job: Job, request: RenderRequest, plans: Sequence[ShotPlan], hashes: dict[str, dict]
) -> tuple[dict, ResumePoints]:
    """The plans' render identities and what OUT still lacks of them (a render of something else into OUT
    is refused here, with nothing touched, unless `restart`)."""
    video = request.video
    identities, _ = render_identities(job, plans, video, hashes)
    points = resume_points(request.out, plans, identities, restart=request.restart,
                           frames=request.frame_numbers, first_frame=video.first_frame)  # fmt: skip
    return identities, points


def remove_stale_temporaries(out: Output) -> None:
    """Remove the temporaries killed renders left in OUT, unless another render is writing into OUT now
    (its temporaries are not stale: a later render alone in OUT removes what is left), and their guards
    (`farm.store.lock.stale_guards`). Under OUT's shared lock, which a render takes its shot locks under,
    so none starts writing meanwhile."""
    what = f"cannot clear what this render replaces in {str(out.root)!r}"
    with shared_lock(out.root), os_errors_in_one_line(what):
        stale = stale_guards(out.root)
        if not other_renders(out.root):
            stale += out.stale_temporaries()
        for path in stale:
            beneath.unlink(out.root, path)


def _sound(job: Job, plans: Sequence[ShotPlan], video: VideoSettings) -> Sound | None:
    """The render's sound (`farm.run.graph.Sound`): its decoder, the shots whose videos carry it."""
    shots = sound_shots(job, [p.shot for p in plans], video)
    if not shots or job.audio is None:
        return None
    return Sound(job.audio.to_json(), frozenset(shots), video.audio_format)


def _start_output(
    setup: PassSetup, plans: Sequence[ShotPlan], identities: dict, points: ResumePoints, *,
    client: Client, io_workers: Sequence[str], guard: tuple[str, Mapping[str, object]],
) -> Future | DaskFuture:  # fmt: skip
    """The render can start: only now is anything in OUT replaced (restarts). Output arrays and identity
    records are then written while the first tiles decode (decodes only read the job store); no blend
    or write is submitted before they are in place (the returned future).

    They are written by an I/O worker when the cluster has one: a job of many shots makes hundreds of
    small metadata files, Python work that on the render's own process would hold the GIL against the
    driver submitting the first decodes. Otherwise on a thread here. Either way they are written under
    `guard` (the render's guard and its lock's owner record: `farm.store.lock.guarded_writes`)."""
    job, request = setup.job, setup.request
    remove_stale_temporaries(request.out)
    open_for_render(request.out, plan_opening(points), stale=False)
    for note in points.notes:
        request.log(note)
    prepare = OutputsToPrepare(request.out, job, tuple(plans), identities, request.options.batch_frames,
                               request.video, request.render_id, guard[0], dict(guard[1]))  # fmt: skip
    if io_workers:
        outputs: Future | DaskFuture = client.submit(
            _prepare_outputs, prepare, key=(keys.PREPARE_OUTPUT, request.render_id), workers=[io_workers[0]],
            allow_other_workers=True, priority=request.priority * Priority.JOB + Priority.BLEND, pure=False,
        )  # fmt: skip
    else:
        outputs = _on_own_thread("farm-prepare", _prepare_outputs, prepare)
    if job.spec.random_weights:
        request.log(f"warning: {job.spec.describe()}: the frames are not a real decode")
    return outputs


def _usable_shots(job: Job, shots: Sequence[str] | None) -> tuple[list[str], dict[str, FarmError]]:
    """The shots to render (every shot, or the named ones), and an error for each whose values cannot
    render (that shot fails by name, the others go on)."""
    names = list(job.shots) if shots is None else list(dict.fromkeys(shots))
    unknown = [n for n in names if n not in job.shots]
    if unknown:
        raise FarmError(f"shots {unknown} are not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")
    errors = check_shots(job, names, decoder_class(job.spec).latent_channels_for(job.spec.config))
    errors.update(chunk_claims(job, [n for n in names if n not in errors]))
    if errors and len(errors) == len(names):
        raise next(iter(errors.values()))
    return [n for n in names if n not in errors], errors


def chunk_claims(job: Job, names: Sequence[str]) -> dict[str, FarmError]:
    """An error for each named shot whose latent chunks claim to unpack beyond their chunk size
    (`farm.store.claims.check_chunk_files`: their headers only, before the cluster and the hash)."""
    errors = {}
    for name in names:
        info = job.shots[name]
        chunk = info.latent_chunks or info.latent_shape
        chunk_bytes = math.prod(chunk) * np.dtype(info.latent_dtype or "float32").itemsize
        try:
            check_chunk_files(job.path / name / "latent", info.latent_codecs, chunk_bytes, name)
        except FarmError as exc:
            errors[name] = exc
    return errors


@dataclass(frozen=True)
class OutputsToPrepare:
    """What `_prepare_outputs` writes into OUT: each plan's arrays and its render identity (owned by
    `render_id`), while the render holds OUT (its `guard`, its shot locks' `owner` record)."""

    out: Output
    job: Job
    plans: tuple[ShotPlan, ...]
    identities: dict
    batch_frames: int
    video: VideoSettings
    render_id: str
    guard: str
    owner: dict


def _prepare_outputs(prepare: OutputsToPrepare) -> None:
    """Write `prepare`'s arrays and identities into OUT, unless the render let OUT go before this started
    (interrupted while the cluster had no thread free for this task): then nothing."""
    out = prepare.out
    with guarded_writes(out.root, prepare.guard, prepare.owner, [p.shot for p in prepare.plans]) as holding:
        if holding:
            _write_outputs(prepare)


def _write_outputs(prepare: OutputsToPrepare) -> None:
    out, job, plans, video = prepare.out, prepare.job, prepare.plans, prepare.video
    identities, batch_frames, render_id = prepare.identities, prepare.batch_frames, prepare.render_id
    prepare_output(out, job, [(p.shot, p.pixel_shape, batch_frames) for p in plans], video.frames_dtype,
                   first_frame=video.first_frame, chunk_mib=video.frame_chunk_mib,
                   timecode=video.timecode, colour=video.colour_attributes)  # fmt: skip
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="farm-identity") as pool:
        list(pool.map(lambda p: record_identity(out, p.shot, identities[p.shot], len(p.batches), render_id),
                      plans))  # fmt: skip


def batch_layout(out: Output, plans: Sequence[ShotPlan], pending: Sequence[ShotPlan]) -> dict[str, dict]:
    """Per shot, all its batches as the farm page draws them: how many, which were done before this
    render, and which it leaves out (``--frames``); the rest are this render's."""
    todo = {p.shot: {b.index for b in p.batches} for p in pending}
    layout = {}
    for plan in plans:
        if plan.shot not in todo:
            continue
        every = {b.index for b in plan.batches}
        done = out.batches_done(plan.shot) & every
        layout[plan.shot] = {
            "total": len(plan.batches),
            "done": sorted(done),
            "skipped": sorted(every - done - todo[plan.shot]),
            "batch_frames": plan.batches[0].frames if plan.batches else 0,  # the farm page's frames/s
        }
    return layout


def _budget_window(
    client: Client, request: RenderRequest, decode_workers: Sequence[str], gpu_bytes: int | None,
    plans: Sequence[ShotPlan], job: Job,
) -> int | None:  # fmt: skip
    """The window (the user's, or the default for the workers' GPUs: the smallest has `gpu_bytes`),
    after warning where the plan may not fit the workers' GPU or host memory."""
    n_workers, window, log = len(decode_workers), request.window, request.log
    check_fits(plans, job.spec, gpu_bytes)
    warning = memory_warning(plans, job.spec, gpu_bytes)
    if warning:
        log(warning)
    if window is None:
        window = default_window(plans, job.spec, gpu_bytes, n_workers)
    per_worker = max(window or 2 * n_workers, 1) // max(n_workers, 1)
    host_need = host_peak_bytes(plans, per_worker, request.video)
    warning = host_memory_warning(host_need, smallest_memory_limit(client, decode_workers))
    if warning:
        log(warning)
    return window


def scheduler_address(client: Client) -> str:
    """The address of the scheduler `client` is connected to (a local cluster's too)."""
    return str(getattr(client.scheduler, "address", "") or "")


def _announce(
    client: Client, n_shots: int, n_workers: int, request: RenderRequest, log: Callable[[str], None]
) -> None:
    """Install the farm page and say where to watch the render, and how to cancel it (its render id and
    scheduler: a local cluster's too, which `farm cancel` reaches from another shell)."""
    link = dashboard_link(client)
    page = install_monitor(client)
    log(
        f"farm: {n_shots} shot(s) to render, {n_workers} worker(s)"
        + (f", dashboard {link}" if link else "")
        + (f", farm page {page}" if page else "")
        + f", scheduler {scheduler_address(client)}, cancel with `{cancel_command(request.out.root)}`"
        + f", render id {request.render_id}"  # last: scripts read the id to the line's end
    )


def _add_outcomes(
    stats: RenderStats, plans: Sequence[ShotPlan], shot_errors: dict[str, FarmError], request: RenderRequest
) -> RenderStats:
    """`stats` with outcomes for the shots this render did not run: finished earlier, or failed before it
    started."""
    for plan in plans:
        if plan.shot not in stats.shots:  # finished by an earlier render
            video = {"video": str(request.out.video(plan.shot))} if request.video.writes_video else {}
            stats.shots[plan.shot] = ShotOutcome(plan.shot, len(plan.batches), len(plan.batches), video)
    for name, error in shot_errors.items():
        stats.shots[name] = ShotOutcome(name, 0, error=str(error))
    return stats


__all__ = ["FirstReads", "SetupClock", "batch_layout", "check_out_tree", "chunk_claims", "mark_cancelled",
           "refuse_if_no_shot_hashed", "render", "run_render", "scheduler_address", "shot_timecodes"]


def within_budget(gpu_bytes: int | None, budget: int | None) -> int | None:
    """The GPU memory a plan may use: the GPU's, at most the --gpu-memory budget (no GPU: None, a CPU
    cluster's plans are checked against the host)."""
    if gpu_bytes is None or budget is None:
        return gpu_bytes
    return min(gpu_bytes, budget)
