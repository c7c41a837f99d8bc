"""Turn shot plans into Dask tasks and drive them through a bounded window.

Decode tasks are pinned to workers (round-robin, `allow_other_workers=True` so a lost worker's tiles run
elsewhere), which takes them out of the scheduler's root-task queuing: this module keeps at most
`window` decoded tiles alive at once, submitting the next tile only when a held one has been blended
into every batch it feeds. Blends run as soon as all their pieces exist; a shot's video is joined
once its last batch is written.

Task keys read as what they are in the dashboard: ``("decode-tile", render, shot, i)``,
``("tile-piece", …)``, ``("blend-batch", render, shot, k)``, ``("write-batch", …)``,
``("encode-segment", …)``, ``("mark-batch", …)`` and ``("finish-shot", render, shot)``.
"""

from __future__ import annotations

import contextlib
import operator
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from farm.cluster import IO_WORKER_PREFIX
from farm.errors import FarmError
from farm.store import Output
from farm.tasks import (
    Placement,
    VideoSettings,
    blend_batch,
    decode_tile,
    encode_batch,
    finish_shot,
    mark_batch,
    write_batch,
    write_sequence,
)
from farm.tiling import ShotPlan, Tile, required_window


@dataclass
class ShotOutcome:
    shot: str
    batches_total: int
    batches_written: int = 0
    video: str | None = None
    error: str | None = None


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
    seconds: float = 0.0
    write_s: float = 0.0
    encode_s: float = 0.0
    shots: dict[str, ShotOutcome] = field(default_factory=dict)

    @property
    def failed(self) -> list[ShotOutcome]:
        return [s for s in self.shots.values() if s.error]


ProgressCallback = Callable[[RenderStats], None]


@dataclass
class _TileState:
    plan: ShotPlan
    tile: Tile
    worker: str
    pending_batches: int
    decode: Any = None
    pieces: dict[int, Any] = field(default_factory=dict)


def run_graph(
    client: Any,
    plans: Sequence[ShotPlan],
    *,
    job_path: str,
    spec_json: dict,
    out: Output,
    fps: dict[str, float],
    video: VideoSettings = VideoSettings(),
    metadata: dict[str, str] | None = None,
    window: int | None = None,
    on_progress: ProgressCallback | None = None,
    retries: int = 1,
    total_batches: dict[str, int] | None = None,
    compile: bool | str = False,
    priority: int = 0,
    render_id: str | None = None,
    describe: dict[str, Any] | None = None,
    finish: set[str] | None = None,
) -> RenderStats:
    """Render `plans` (tiles already assigned to worker slots) on the cluster behind `client`.

    `plans` may be partial (`tiling.pending_plan`): only their batches are written; a shot's video is
    joined from all `total_batches[shot]` segments once its last pending batch is done.

    `priority`: a job with a higher priority has all its tasks run before a lower one's (Dask priorities
    are offset by ``priority * 10**6``). Progress is published on the scheduler under the metadata key
    ``("farm", "renders", render_id)`` (see `farm.monitor`), with `describe` merged in.
    """
    from distributed import as_completed

    started = time.perf_counter()
    render_id = render_id or uuid.uuid4().hex[:8]
    job_priority = int(priority) * 10**6
    workers, io_workers = split_workers(client)
    if not workers:
        raise RuntimeError("the cluster has no decode workers")

    metadata = dict(metadata or {})
    stats = RenderStats(
        tiles_total=sum(len(p.tiles) for p in plans),
        batches_total=sum(len(p.batches) for p in plans),
        shots={p.shot: ShotOutcome(p.shot, len(p.batches)) for p in plans},
    )
    stats.window = max(window or 2 * len(workers), required_window(plans))
    stats.render_id = render_id
    publisher = ProgressPublisher(client, render_id, priority, describe or {})

    order: list[_TileState] = []
    for plan in plans:
        feeds = {t.index: 0 for t in plan.tiles}
        for batch in plan.batches:
            for i in batch.tiles:
                feeds[i] += 1
        for tile in plan.tiles:
            order.append(_TileState(plan, tile, workers[tile.worker % len(workers)], feeds[tile.index]))
    by_key = {(s.plan.shot, s.tile.index): s for s in order}
    tiles_submitted: dict[str, set[int]] = {p.shot: set() for p in plans}
    batches_left = {p.shot: len(p.batches) for p in plans}
    total_batches = total_batches or {p.shot: len(p.batches) for p in plans}
    failed_shots: set[str] = set()
    futures = as_completed(with_results=False)
    meaning: dict[str, tuple[str, Any]] = {}
    blend_slot = 0
    io_slot = [0]
    held = 0

    def submit_tile(state: _TileState) -> None:
        plan, tile = state.plan, state.tile
        cuts = [(b.index, frames) for b, frames in plan.batch_pieces(tile)]
        state.decode = client.submit(
            decode_tile, job_path, spec_json, tile, plan.chunk, cuts, compile,
            key=("decode-tile", render_id, plan.shot, tile.index),
            workers=[state.worker], allow_other_workers=True, retries=retries,
            priority=job_priority - tile.index,
        )  # fmt: skip
        for b, _ in cuts:
            state.pieces[b] = client.submit(
                operator.getitem, state.decode, b,
                key=("tile-piece", render_id, plan.shot, tile.index, b), priority=job_priority + 10,
            )  # fmt: skip
        futures.add(state.decode)
        meaning[state.decode.key] = ("decode", state)
        tiles_submitted[plan.shot].add(tile.index)

    def submit_ready_blends(plan: ShotPlan, newly: int) -> None:
        nonlocal blend_slot
        for batch in plan.batches:
            if newly not in batch.tiles or not set(batch.tiles) <= tiles_submitted[plan.shot]:
                continue
            states = [by_key[(plan.shot, i)] for i in batch.tiles]
            placements = [placement(plan, s.tile, batch.start) for s in states]
            pieces = [s.pieces[batch.index] for s in states]
            if len(states) == 1:
                target = states[0].worker  # whole-batch tile: blend where it was decoded, no transfer
            else:
                target = workers[blend_slot % len(workers)]
                blend_slot += 1
            name = (render_id, plan.shot, batch.index)
            frames = client.submit(
                blend_batch, batch, plan.pixel_shape[1:], placements, pieces, video.frames_dtype,
                video.takes_yuv420,
                key=("blend-batch", *name), priority=job_priority + 100,
                workers=[target], allow_other_workers=True,
            )  # fmt: skip
            # I/O workers (other processes) write and encode when the cluster has them
            io_target = io_workers[io_slot[0] % len(io_workers)] if io_workers else target
            io_slot[0] += 1
            where = {"workers": [io_target], "allow_other_workers": True}
            # writing and encoding run side by side: on an I/O worker, or the blending worker's other threads
            written = client.submit(
                write_batch,
                str(out.root),
                batch,
                frames,
                key=("write-batch", *name),
                priority=job_priority + 90,
                **where,
            )
            encoded = 0.0
            if video.enabled:
                encoded = client.submit(
                    encode_batch, str(out.root), batch, frames, fps[plan.shot], video, metadata,
                    key=("encode-segment", *name), priority=job_priority + 90, **where,
                )  # fmt: skip
            extra = []
            if video.sequence:
                extra.append(client.submit(
                    write_sequence, str(out.root), batch, frames, video,
                    key=("write-sequence", *name), priority=job_priority + 90, **where,
                ))  # fmt: skip
            fut = client.submit(
                mark_batch, str(out.root), batch, written, encoded, *extra, key=("mark-batch", *name),
                priority=job_priority + 95, **where,
            )  # fmt: skip
            futures.add(fut)
            meaning[fut.key] = ("blend", (plan, batch))

    def release(state: _TileState) -> None:
        nonlocal held
        if state.decode is not None:
            state.decode = None
            state.pieces.clear()
            held -= 1

    def fail_shot(shot: str, error: BaseException) -> None:
        if shot in failed_shots:
            return
        failed_shots.add(shot)
        stats.shots[shot].error = (
            str(error) if isinstance(error, FarmError) else f"{type(error).__name__}: {error}"
        )
        for state in order:
            if state.plan.shot == shot and state.decode is not None:
                release(state)  # dropping our references lets the scheduler forget the shot's tasks

    cursor = 0

    def fill_window() -> None:
        nonlocal cursor, held
        while cursor < len(order) and held < stats.window:
            state = order[cursor]
            cursor += 1
            if state.plan.shot in failed_shots:
                continue
            submit_tile(state)
            held += 1
            stats.max_tiles_held = max(stats.max_tiles_held, held)
            submit_ready_blends(state.plan, state.tile.index)

    def submit_finish(plan: ShotPlan) -> None:
        if not video.enabled:
            return
        if finish is not None and plan.shot not in finish:
            return  # a frame-range render: the shot's other batches are still to do
        done = client.submit(
            finish_shot, str(out.root), plan.shot, total_batches[plan.shot], metadata, video.suffix,
            key=("finish-shot", render_id, plan.shot), priority=job_priority + 50,
        )  # fmt: skip
        futures.add(done)
        meaning[done.key] = ("finish", plan)

    for plan in plans:
        if not plan.batches:  # resumed after its last batch: only the video is left to join
            submit_finish(plan)
    fill_window()
    last_check = 0.0
    for fut in futures:
        if time.monotonic() - last_check > 0.5:  # `farm cancel` records the render id on the scheduler
            last_check = time.monotonic()
            if cancel_requested(client, render_id):
                for plan in plans:
                    if not stats.shots[plan.shot].video and plan.shot not in failed_shots:
                        fail_shot(plan.shot, FarmError("cancelled (farm cancel); finished batches are kept"))
                futures.clear()
                break
        kind, what = meaning.pop(fut.key, (None, None))
        if kind is None:
            continue
        if kind == "decode":
            if fut.status == "finished":
                stats.tiles_decoded += 1
            continue  # a failed decode surfaces through the blends that need it
        if kind == "blend":
            plan, batch = what
            if plan.shot in failed_shots:
                continue
            if fut.status != "finished":
                fail_shot(plan.shot, _exception(fut))
                fill_window()
                continue
            result = fut.result()
            stats.batches_written += 1
            stats.frames_written += result["frames"]
            stats.write_s += result["write_s"]
            stats.encode_s += result["encode_s"]
            stats.shots[plan.shot].batches_written += 1
            for i in batch.tiles:
                state = by_key[(plan.shot, i)]
                state.pending_batches -= 1
                if state.pending_batches == 0:
                    release(state)
            batches_left[plan.shot] -= 1
            if batches_left[plan.shot] == 0:
                submit_finish(plan)
            fill_window()
        elif kind == "finish":
            plan = what
            if fut.status != "finished":
                fail_shot(plan.shot, _exception(fut))
            else:
                stats.shots[plan.shot].video = fut.result()["video"]
        publisher.publish(stats)
        if on_progress:
            on_progress(stats)
    stats.seconds = time.perf_counter() - started
    publisher.publish(stats, final=True)
    if on_progress:
        on_progress(stats)
    return stats


class ProgressPublisher:
    """Keeps the scheduler's copy of a render's progress current (rate-limited), for the farm page,
    Prometheus metrics and `farm status` of a live render."""

    def __init__(self, client: Any, render_id: str, priority: int, describe: dict[str, Any]) -> None:
        self.client, self.key = client, ["farm", "renders", render_id]
        self.base = {"render": render_id, "priority": priority, "started": time.time(), **describe}
        self.last = 0.0

    def publish(self, stats: RenderStats, final: bool = False) -> None:
        now = time.time()
        if not final and now - self.last < 0.5:
            return
        self.last = now
        state = "running"
        if final:
            state = "failed" if stats.failed else "done"
        record = {
            **self.base,
            "state": state,
            "updated": now,
            "tiles_total": stats.tiles_total,
            "tiles_decoded": stats.tiles_decoded,
            "batches_total": stats.batches_total,
            "batches_written": stats.batches_written,
            "frames_written": stats.frames_written,
            "shots": {name: asdict(outcome) for name, outcome in stats.shots.items()},
        }
        with contextlib.suppress(Exception):  # monitoring must never break a render
            self.client.set_metadata(self.key, record)


def cancel_requested(client: Any, render_id: str) -> bool:
    from farm.monitor import is_cancelled

    try:
        cancelled = client.get_metadata(["farm", "cancelled"], default={}) or {}
    except Exception:  # monitoring must never break a render
        return False
    return is_cancelled(render_id, cancelled)


def split_workers(client: Any) -> tuple[list[str], list[str]]:
    """The cluster's decode workers and its I/O workers (named ``farm-io-*``), each sorted by address."""
    decode, io = [], []
    for address, info in sorted(client.scheduler_info(n_workers=-1)["workers"].items()):
        (io if str(info.get("name", "")).startswith(IO_WORKER_PREFIX) else decode).append(address)
    return decode, io


def placement(plan: ShotPlan, tile: Tile, batch_start: int) -> Placement:
    span_f, span_h, span_w = tile.pixels
    return Placement(
        frame=max(span_f.start - batch_start, 0),
        rows=(span_h.start, span_h.stop),
        cols=(span_w.start, span_w.stop),
    )


def _exception(fut: Any) -> BaseException:
    try:
        exc = fut.exception()
    except Exception as err:  # cancelled futures raise instead of returning
        return err
    return exc if exc is not None else RuntimeError(f"task {fut.key} ended as {fut.status}")
