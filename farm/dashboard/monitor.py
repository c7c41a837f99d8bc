"""Live progress of farm renders on the scheduler: the farm page, its JSON, and Prometheus metrics.

Every render publishes its progress in the scheduler's metadata (`farm.run.graph.ProgressPublisher`, key
``("farm", "renders", render_id)``); submitted workflows publish theirs under ``("farm", "submissions",
id)`` (`farm.submit`) and `farm cancel` records ``("farm", "cancelled", id)``. :class:`FarmMonitor`, a
scheduler plugin, reads those records, counts task transitions per render and shot (tiles decoded, task
errors; a task key's second element is its render id, its third the shot) and serves, on the scheduler's
HTTP server (the dashboard's port):

- ``/farm``: the farm page, one table per render (job, output, priority, state, tiles decoded, batches
  written, frames/s, ETA, failures) with a row per shot: its thumbnail once finished and a strip of its
  batches (done, running, pending, failed, skipped), and the submitted workflows;
- ``/farm/api/renders.json``: the same numbers as JSON;
- ``/farm/thumbnail/<render>/<shot>.png``: a finished shot's middle frame, small (made once by the
  render's client, `farm.dashboard.thumbnails`, and kept in the scheduler's metadata);
- ``/metrics``: ``farm_*`` Prometheus metrics for the same counts, next to Dask's own.

Install it with :func:`install` (what `farm render`, `farm submit` and `farm cluster` do), or on a
scheduler started by hand with ``dask scheduler --preload farm.dashboard.monitor``.

>>> from farm.run.cluster import connect
>>> with connect(workers=2) as client:          # doctest: +SKIP
...     print(install(client))
http://127.0.0.1:8787/farm
"""

from __future__ import annotations

import base64
import collections
import contextlib
import html
import json
import os
import re
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from farm import config, keys
from farm.render_ids import is_cancelled, render_of

if TYPE_CHECKING:
    from distributed import Client

PLUGIN_NAME = "farm-monitor"
PAGE_PATH = "farm"
JSON_PATH = "farm/api/renders.json"
# First elements of the task keys farm submits (farm.run.graph, farm.submit), for reference: any tuple key
# ``(prefix, render_id, …)`` with a string render id counts as a render's task (see `render_of`).
TASK_PREFIXES = frozenset({*keys.TASK_PREFIXES, "workflow-driver"})  # the last: farm.submit's
# Tasks of one batch (key ``(prefix, render, shot, batch)``): the batch runs from its blend to its mark.
BATCH_PREFIXES = frozenset({"blend-batch", "write-batch", "encode-segment", "write-sequence", "mark-batch"})
BATCH_STATES = ("done", "running", "pending", "failed", "skipped", "cancelled", "interrupted")
THUMBNAIL_PATH = "farm/thumbnail"
# A "running" render whose tasks are all gone from the scheduler and whose record has not changed for
# this long lost its driver (a killed `farm render` or foreground submit): shown as "interrupted".
STALE_AFTER_S = 30.0
WORKER_EVENTS = 50  # workers joining and leaving, the latest kept for the page
FINAL_STATES = frozenset({"done", "failed", "cancelled", "interrupted"})


# What the page and its JSON show of a submitted workflow: never its pid, host, full path or raw
# arguments (`farm.submit.published_args` publishes them hidden or masked); its owner's user name.
SUBMISSION_FIELDS = ("script", "args", "priority", "detached", "state", "started", "finished", "exit_code",
                     "log_count", "user")  # fmt: skip
LOG_LINE_CHARS = 300
PRUNE_EVERY_S = 10.0


def page_limits() -> tuple[int, float]:
    """(`farm.page-keep-renders`, `farm.page-keep-hours`), as this process' configuration sets them."""
    try:
        return max(0, int(config.get("page-keep-renders"))), max(0.0, float(config.get("page-keep-hours")))
    except (TypeError, ValueError, KeyError):
        return 50, 24.0


def forgotten(finished: list[tuple[float, str]], keep: int, hours: float, now: float) -> list[str]:
    """Of finished entries (time, id), those to forget: all but the newest `keep`, and any older than
    `hours`."""
    newest_first = sorted(finished, reverse=True)
    return [rid for i, (t, rid) in enumerate(newest_first) if i >= keep or now - t > hours * 3600]


@dataclass
class TaskCounts:
    """What the scheduler saw of one render's tasks, per shot."""

    decoded: dict[str, set[Any]] = field(default_factory=dict)  # shot -> decode-tile indices in memory
    batches: dict[str, dict[int, str]] = field(default_factory=dict)  # shot -> batch -> running/done/failed
    errors: dict[str, int] = field(default_factory=dict)  # shot -> tasks that ended erred
    last_error: str = ""
    last_seen: float = 0.0


def note_batch(states: dict[int, str], prefix: str, batch: Any, finish: str) -> None:
    """A batch's state after one of its tasks moved to `finish`: done once its mark task holds a
    result, failed once any of its tasks erred, running while any runs."""
    if not isinstance(batch, int) or states.get(batch) in ("done", "failed"):
        return
    if finish == "erred":
        states[batch] = "failed"
    elif prefix == "mark-batch" and finish == "memory":
        states[batch] = "done"
    elif finish == "processing":
        states[batch] = "running"


def batch_states(layout: Mapping[str, Any] | None, seen: Mapping[int, str], total: int) -> list[str]:
    """Every batch of a shot, in order: done before this render or by it, running, failed, pending, or
    skipped (left out with ``--frames``). `layout` is what the render published (`render.batch_layout`);
    without it (an older record) the shot's batches are counted from `total` and what was seen."""
    layout = layout or {}
    count = int(layout.get("total", 0)) or max([total, *(b + 1 for b in seen)])
    before, skipped = set(layout.get("done", ())), set(layout.get("skipped", ()))
    return [
        "done" if i in before else seen.get(i) or ("skipped" if i in skipped else "pending")
        for i in range(count)
    ]


def stopped_batches(states: list[str], shot: Mapping[str, Any], render_state: str) -> list[str]:
    """A shot's batch states once it or its render stopped: the batches that were running show how
    (cancelled, interrupted); a render that ended otherwise left them unwritten (pending). The scheduler
    forgets a stopped render's tasks without finishing them, so what it saw last was "running"."""
    if shot.get("cancelled"):
        stop = "cancelled"
    elif render_state in ("cancelled", "interrupted"):
        stop = render_state
    elif render_state in FINAL_STATES:
        stop = "pending"
    else:
        return states  # running, or cancelling: its tasks may still run
    return [stop if st == "running" else st for st in states]


def batches_on_disk(record: Mapping[str, Any]) -> dict[str, int] | None:
    """Per shot of a render record, the batches its OUT marks done, where this process sees OUT."""
    import os

    out = record.get("out")
    done = os.path.join(str(out), ".farm", "done") if out else None
    if not done or not os.path.isdir(done):
        return None
    try:
        shots = [s for s in dict(record.get("shots", {})) if os.path.isdir(os.path.join(done, s))]
        return {s: sum(1 for f in os.listdir(os.path.join(done, s)) if f.isdigit()) for s in shots}
    except OSError:
        return None


def relative_to_out(path: Any, out: Any) -> Any:
    """A path inside OUT as the page shows it: relative to OUT (the render's row names OUT once)."""
    if isinstance(path, str) and isinstance(out, str) and path.startswith(out.rstrip("/") + "/"):
        return path[len(out.rstrip("/")) + 1 :]
    return path


def thumbnail_url(render_id: str, shot: str) -> str:
    """A shot's thumbnail, relative to the dashboard's root (`farm.dashboard.thumbnails` makes it)."""
    return f"{THUMBNAIL_PATH}/{quote(render_id, safe='')}/{quote(shot, safe='')}.png"


def page_link(dashboard: str | None) -> str | None:
    """The farm page's URL from the dashboard's (``http://host:8787/status`` → ``http://host:8787/farm``)."""
    if not dashboard:
        return None
    parts = urlsplit(dashboard)
    path = parts.path
    if path.endswith("/status"):
        path = path[: -len("status")]
    if not path.endswith("/"):
        path += "/"
    return urlunsplit((parts.scheme, parts.netloc, path + PAGE_PATH, "", ""))


class FarmMonitor(SchedulerPlugin):
    """Scheduler plugin: the farm page, its JSON and farm's Prometheus metrics (see the module doc)."""

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, prefix: str = "/") -> None:
        self.prefix = "/" + prefix.strip("/") + ("/" if prefix.strip("/") else "")
        self.scheduler: Any = None
        self.counts: dict[str, TaskCounts] = {}
        self.workers: dict[str, str] = {}  # address -> name, of the workers seen join
        self.worker_events: collections.deque[dict[str, Any]] = collections.deque(maxlen=WORKER_EVENTS)
        self._pruner: Any = None  # the periodic `prune`, while the plugin runs

    # -- plugin hooks -------------------------------------------------------------------------------

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            handlers = [
                (self.prefix + JSON_PATH, _JsonHandler, {"monitor": self}),
                (
                    self.prefix + THUMBNAIL_PATH + r"/([^/]+)/([^/]+)\.png",
                    _ThumbnailHandler,
                    {"monitor": self},
                ),  # fmt: skip
                (self.prefix + PAGE_PATH + "/?", _PageHandler, {"monitor": self}),
            ]
            app.add_handlers(r".*$", handlers)
        _register_collector()
        _MONITORS.add(self)
        from tornado.ioloop import PeriodicCallback

        self._pruner = PeriodicCallback(self._prune_quietly, PRUNE_EVERY_S * 1000)
        self._pruner.start()

    def _prune_quietly(self) -> None:
        with contextlib.suppress(Exception):  # housekeeping must never disturb the scheduler
            self.prune(time.time())

    async def close(self) -> None:
        _MONITORS.discard(self)
        if self._pruner is not None:
            self._pruner.stop()

    def add_worker(self, scheduler: Any, worker: str) -> None:
        ws = scheduler.workers.get(worker)
        name = str(getattr(ws, "name", worker))
        self.workers[worker] = name
        self.worker_events.append({"time": time.time(), "event": "joined", "worker": worker, "name": name})

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        name = self.workers.pop(worker, worker)
        self.worker_events.append({"time": time.time(), "event": "left", "worker": worker, "name": name})

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        render = render_of(key)
        if render is None:
            return
        counts = self.counts.setdefault(render, TaskCounts())
        counts.last_seen = time.time()
        shot = str(key[2]) if len(key) >= 3 else ""
        if key[0] in BATCH_PREFIXES and len(key) >= 4:
            note_batch(counts.batches.setdefault(shot, {}), key[0], key[3], finish)
        if key[0] == "decode-tile" and finish == "memory" and len(key) >= 4:
            counts.decoded.setdefault(shot, set()).add(key[3])
        elif finish == "erred" and start == "processing":  # failed itself, not through a dependency
            counts.errors[shot] = counts.errors.get(shot, 0) + 1
            text = kwargs.get("exception_text") or ""
            counts.last_error = f"{key[0]} {shot}: {text}"[:300]

    # -- what the page, the JSON and the metrics show ----------------------------------------------

    def live_renders(self) -> set[str]:
        """Render ids that have tasks on the scheduler now."""
        live = set()
        for key in list(getattr(self.scheduler, "tasks", {})):
            render = render_of(key)
            if render is not None:
                live.add(render)
        return live

    def prune(self, now: float) -> None:
        """Forget finished renders and workflows beyond `farm.page-keep-renders` (the newest kept) or
        older than `farm.page-keep-hours`, with their thumbnails and task counts: a long-lived cluster's
        page, JSON and metrics stay bounded. Runs on the scheduler every `PRUNE_EVERY_S` (no request
        changes anything)."""
        meta = getattr(self.scheduler, "task_metadata", {}).get("farm", {})
        keep, hours = page_limits()
        live = self.live_renders()
        cancelled = dict(meta.get("cancelled", {}))
        renders = meta.get("renders", {})
        finished = [
            (float(rec.get("updated") or 0) if isinstance(rec, dict) else 0.0, rid)
            for rid, rec in list(renders.items())
            if not isinstance(rec, dict)
            or _render_state(rid, rec, cancelled, rid in live, now) in FINAL_STATES
        ]
        for rid in forgotten(finished, keep, hours, now):
            renders.pop(rid, None)
            meta.get("thumbnails", {}).pop(rid, None)
            meta.get("cancelled", {}).pop(rid, None)
            self.counts.pop(rid, None)
        subs = meta.get("submissions", {})
        done = [
            (float(sub.get("finished") or sub.get("started") or 0) if isinstance(sub, dict) else 0.0, sid)
            for sid, sub in list(subs.items())
            if not isinstance(sub, dict) or sub.get("state") not in ("running", "queued")
        ]
        for sid in forgotten(done, keep, hours, now):
            subs.pop(sid, None)
        for rid in [r for r in self.counts if r not in renders and r not in live]:
            if now - self.counts[rid].last_seen > hours * 3600:
                self.counts.pop(rid, None)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """Every render and submission the scheduler knows of, with derived rates (JSON-able)."""
        now = time.time() if now is None else now
        meta = getattr(self.scheduler, "task_metadata", {}).get("farm", {})
        records = dict(meta.get("renders", {}))
        cancelled = dict(meta.get("cancelled", {}))
        live = self.live_renders()
        pictures = dict(meta.get("thumbnails", {}))
        renders = [
            summarize(rid, rec, self.counts.get(rid), cancelled, rid in live, now, pictures.get(rid),
                      on_disk=None if rid in live else batches_on_disk(rec))  # fmt: skip
            for rid, rec in records.items()
            if isinstance(rec, dict)
        ]
        renders.sort(key=lambda r: (r["state"] in FINAL_STATES, -r["priority"], -(r["started"] or 0)))
        submissions = []
        for sid, sub in dict(meta.get("submissions", {})).items():
            if not isinstance(sub, dict):
                continue
            entry = {"submission": sid, **{k: sub[k] for k in SUBMISSION_FIELDS if k in sub}}
            entry["script"] = os.path.basename(str(sub.get("script", "")))  # no paths of the submitter's
            entry["log"] = [str(line)[:LOG_LINE_CHARS] for line in list(sub.get("log", []))[-8:]]
            if entry.get("state") == "running" and is_cancelled(sid, cancelled):
                entry["state"] = "cancelling"
            submissions.append(entry)
        submissions.sort(key=lambda s: -(s.get("started") or 0))
        workers = {"now": len(getattr(self.scheduler, "workers", {})), "events": list(self.worker_events)}
        return {"time": now, "renders": renders, "submissions": submissions, "workers": workers}


def summarize(
    render_id: str,
    record: Mapping[str, Any],
    counts: TaskCounts | None,
    cancelled: Mapping[str, Any],
    live: bool,
    now: float,
    thumbnails: Mapping[str, Any] | None = None,
    on_disk: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One render's numbers: the published record plus rates, ETA, failures and per-shot tile counts,
    batch states and thumbnails (`thumbnails`: shot → the picture `farm.dashboard.thumbnails` published).
    `on_disk`: per shot, the batches OUT marks done (`batches_on_disk`), which a render that no longer
    runs shows instead of what it last published (tasks it left running may have finished since)."""
    counts = counts or TaskCounts()
    state = _render_state(render_id, record, cancelled, live, now)
    started = float(record.get("started") or now)
    updated = float(record.get("updated") or now)
    end = now if state in ("running", "cancelling") else updated
    elapsed = max(end - started, 1e-9)
    frames = int(record.get("frames_written", 0))
    batches_total = int(record.get("batches_total", 0))
    batches_written = int(record.get("batches_written", 0))
    fps = frames / elapsed if frames else 0.0
    eta = None
    if state == "running" and batches_written:
        eta = (batches_total - batches_written) * (updated - started) / batches_written - (now - updated)
        eta = max(eta, 0.0)
    shots = []
    seen_by_render = 0  # batches this render marked done, as published or as the scheduler saw them
    for name, shot in dict(record.get("shots", {})).items():
        summary, this_render = _summarize_shot(render_id, name, shot, record, counts, state, elapsed,
                                               thumbnails or {}, on_disk)  # fmt: skip
        seen_by_render += this_render
        shots.append(summary)
    batches_written = max(batches_written, seen_by_render)
    failed_shots = sum(1 for s in shots if s["state"] == "failed")
    cancelled_shots = sum(1 for s in shots if s["state"] == "cancelled")
    return {
        "render": render_id,
        "job": record.get("job"),
        "out": record.get("out"),
        "user": (record.get("owner") or {}).get("user") if isinstance(record.get("owner"), Mapping) else None,
        "priority": int(record.get("priority", 0)),
        "state": state,
        "started": record.get("started"),
        "updated": record.get("updated"),
        "elapsed_s": elapsed,
        "tiles_total": int(record.get("tiles_total", 0)),
        "tiles_decoded": int(record.get("tiles_decoded", 0)),
        "batches_total": batches_total,
        "batches_written": batches_written,
        "frames_written": frames,
        "frames_per_second": fps,
        "eta_s": eta,
        "failed_shots": failed_shots,
        "cancelled_shots": cancelled_shots,
        "task_errors": sum(counts.errors.values()),
        "failures": failed_shots + sum(counts.errors.values()),
        "last_error": counts.last_error or None,
        "shots": shots,
    }


def _render_state(
    render_id: str, record: Mapping[str, Any], cancelled: Mapping[str, Any], live: bool, now: float
) -> str:
    """The render's state as published, or cancelled / cancelling, or interrupted (a render that stopped
    publishing and no longer runs)."""
    state = str(record.get("state", "running"))
    if state != "done" and is_cancelled(render_id, cancelled):
        state = "cancelled" if state != "running" or not live else "cancelling"
    elif state == "running" and not live and now - float(record.get("updated", now)) > STALE_AFTER_S:
        state = "interrupted"
    return state


def _summarize_shot(
    render_id: str,
    name: str,
    shot: Mapping[str, Any],
    record: Mapping[str, Any],
    counts: TaskCounts,
    state: str,
    elapsed: float,
    thumbnails: Mapping[str, Any],
    on_disk: Mapping[str, int] | None,
) -> tuple[dict[str, Any], int]:
    """One shot's numbers on the farm page, and the batches this render marked done in it."""
    written, total = int(shot.get("batches_written", 0)), int(shot.get("batches_total", 0))
    # the scheduler saw these marks itself: a render killed before it published them still counts them
    this_render = max(written, sum(1 for s in counts.batches.get(name, {}).values() if s == "done"))
    layout = dict(record.get("batches", {})).get(name) or {}
    # as on disk: the shot's batches done by earlier renders too, out of all its batches
    written = len(layout.get("done", ())) + this_render
    if on_disk is not None and name in on_disk:
        written = on_disk[name]
    total = int(layout.get("total", 0)) or total
    shot_frames = shot.get("frames_written")
    if not shot_frames and this_render and layout.get("batch_frames"):  # marked before it published
        shot_frames = this_render * int(layout["batch_frames"])
    summary = {
        "shot": name,
        "state": _shot_state(shot, written, total, state, bool(counts.decoded.get(name))),
        "tiles_decoded": len(counts.decoded.get(name, ())),
        "tiles_total": shot.get("tiles_total"),
        "batches_written": written,
        "batches_total": total,
        "frames_written": shot_frames,
        "frames_per_second": (shot_frames / elapsed) if shot_frames else None,
        "task_errors": counts.errors.get(name, 0),
        "video": relative_to_out(shot.get("video"), record.get("out")),
        "error": shot.get("error"),
        "batches": stopped_batches(batch_states(layout, counts.batches.get(name, {}), total), shot, state),
        "thumbnail": thumbnail_url(render_id, name) if name in thumbnails else None,
        "thumbnail_frame": thumbnails.get(name, {}).get("frame_index"),
    }
    return summary, this_render


def _shot_state(shot: Mapping[str, Any], written: int, total: int, state: str, decoding: bool) -> str:
    """A shot's state on the farm page, from its own record and the render's `state`."""
    if shot.get("cancelled"):
        return "cancelled"  # its own state: a cancel is not a failure
    if shot.get("error"):
        return "failed"
    if written >= total and (shot.get("video") or state == "done"):
        return "done"
    if state in ("cancelled", "cancelling", "interrupted"):
        return state
    if state in ("done", "failed"):
        return "incomplete"  # the render ended before this shot did
    if written or decoding:
        return "rendering"
    return "queued"


# --------------------------------------------------------------------------------------------------
# HTTP: the page and its JSON
# --------------------------------------------------------------------------------------------------


class _Handler(web.RequestHandler):
    def initialize(self, monitor: FarmMonitor) -> None:
        self.monitor = monitor


class _JsonHandler(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(self.monitor.snapshot(), default=str))


class _ThumbnailHandler(_Handler):
    def get(self, render_id: str, shot: str) -> None:
        meta = getattr(self.monitor.scheduler, "task_metadata", {}).get("farm", {})
        picture = dict(meta.get("thumbnails", {})).get(render_id, {}).get(shot)
        if not isinstance(picture, dict) or "png" not in picture:
            raise web.HTTPError(404, f"no thumbnail for render {render_id!r}, shot {shot!r} (yet)")
        self.set_header("Content-Type", "image/png")
        self.set_header("Cache-Control", "max-age=86400")  # made once, when the shot finished
        self.write(base64.b64decode(picture["png"]))


class _PageHandler(_Handler):
    def get(self) -> None:
        refresh = self.get_argument("refresh", "2")
        if not re.fullmatch(r"[0-9]{1,5}", refresh):  # ASCII digits only ("²".isdigit() is true)
            raise web.HTTPError(400, "refresh must be a whole number of seconds, 0 to 99999")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(render_page(self.monitor.snapshot(), refresh=refresh, prefix=self.monitor.prefix))


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _bar(done: int, total: int) -> str:
    pct = 100.0 * done / total if total else 0.0
    return f'<div class="bar"><div style="width:{pct:.1f}%"></div></div>'


def _progress_cell(done: int, total: int) -> str:
    return _cell("batches_written", done, f"{done}/{total}")[: -len("</td>")] + _bar(done, total) + "</td>"


def _cell(name: str, value: Any, text: str | None = None, cls: str = "") -> str:
    """A table cell whose machine-readable value sits in ``data-value`` (tests and scrapers read it)."""
    shown = html.escape(str(value) if text is None else text)
    klass = f' class="{cls}"' if cls else ""
    return f'<td data-name="{name}" data-value="{html.escape(str(value))}"{klass}>{shown}</td>'


def _shots_table(r: Mapping[str, Any], prefix: str) -> str:
    """One render's shots: picture, state, tiles, batches (a strip, one mark per batch), rate, errors."""
    rid = html.escape(r["render"])
    out = [f"<table class='shots' data-render='{rid}'><tr><th>picture</th><th class='l'>shot</th>"
           "<th>state</th><th>tiles decoded</th><th>batches written</th><th class='l'>batches</th>"
           "<th>frames/s</th><th>task errors</th><th class='l'>video / error</th></tr>"]  # fmt: skip
    for s in r["shots"]:
        tiles = s["tiles_decoded"]
        tiles_text = f"{tiles}/{s['tiles_total']}" if s["tiles_total"] is not None else str(tiles)
        fps = s["frames_per_second"]
        note = s["error"] or s["video"] or ""
        out.append(f"<tr data-shot='{html.escape(s['shot'])}'>")
        out.append(_thumbnail_cell(s, prefix))
        out.append(_cell("shot", s["shot"], cls="l"))
        out.append(_cell("state", s["state"], cls=f"state {s['state']}"))
        out.append(_cell("tiles_decoded", tiles, tiles_text))
        out.append(_progress_cell(s["batches_written"], s["batches_total"]))
        out.append(_strip_cell(s.get("batches") or []))
        out.append(_cell("frames_per_second", "" if fps is None else round(fps, 2),
                         "–" if fps is None else f"{fps:.1f}"))  # fmt: skip
        out.append(_cell("task_errors", s["task_errors"]))
        out.append(_cell("note", note, cls="err l" if s["error"] else "l"))
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _thumbnail_cell(shot: Mapping[str, Any], prefix: str) -> str:
    """The shot's picture once it has one; the browser notes in ``data-loaded`` the width it decoded."""
    if not shot.get("thumbnail"):
        return "<td class='pic' data-name='thumbnail' data-value=''><div class='nopic'></div></td>"
    src = html.escape(prefix + shot["thumbnail"])
    alt = html.escape(f"{shot['shot']}, frame {shot.get('thumbnail_frame')}")
    return (f"<td class='pic' data-name='thumbnail' data-value='{src}'><img class='thumb' src='{src}' "
            f"alt='{alt}' title='{alt}' onload='this.dataset.loaded=this.naturalWidth'></td>")  # fmt: skip


def _strip_cell(states: list[str]) -> str:
    """A mark per batch, coloured by its state (`BATCH_STATES`), in batch order."""
    marks = "".join(f"<span class='b {st}' title='batch {i}: {st}'></span>" for i, st in enumerate(states))
    value = html.escape(",".join(states))
    return f"<td class='l' data-name='batches' data-value='{value}'><div class='strip'>{marks}</div></td>"


STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:20px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
.sub{color:#666;font-size:13px;margin-bottom:10px} a{color:#0b63c5}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin-bottom:6px}
th,td{padding:4px 10px;border-bottom:1px solid #e4e4e4;text-align:right;font-size:13px;white-space:nowrap}
th{background:#f0f3f6;font-weight:600} td.l,th.l{text-align:left}
.state{font-weight:600} .done{color:#1a7f37} .failed,.cancelled,.interrupted{color:#c62828}
.running,.rendering,.cancelling{color:#0b63c5} .queued{color:#888}
.bar{display:inline-block;width:90px;height:8px;background:#e6e6e6;border-radius:4px;vertical-align:middle;
margin-left:6px} .bar div{height:8px;background:#2e7d32;border-radius:4px}
.err{color:#c62828;white-space:normal;text-align:left;max-width:520px}
pre{background:#fff;padding:6px;font-size:12px;max-width:1100px;overflow:auto}
td.pic{padding:2px 6px} img.thumb{width:96px;display:block;border-radius:2px}
.nopic{width:96px;height:54px;background:#eee;border-radius:2px}
.strip{display:flex;flex-wrap:wrap;gap:1px;max-width:260px} .strip .b{width:7px;height:12px;border-radius:1px}
.b.done{background:#2e7d32} .b.running{background:#0b63c5} .b.pending{background:#cfd4da}
.b.failed{background:#c62828} .b.skipped{background:#fff;outline:1px solid #cfd4da}
.b.cancelled{background:#ef6c00} .b.interrupted{background:#8d6e63}
.legend .b{display:inline-block;width:7px;height:12px;margin:0 3px 0 10px;vertical-align:middle}
"""


def _clock(t: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(t))) if t else "–"


def _workflows_table(subs: list[Mapping[str, Any]]) -> str:
    """The submitted workflows, newest first, with when each started and ended (logs folded)."""
    if not subs:
        return ""
    out = ["<h2>submitted workflows</h2><table class='submissions'><tr><th class='l'>id</th>"
           "<th class='l'>script</th><th>state</th><th>started</th><th>ended</th><th>took</th><th>mode</th>"
           "<th>priority</th><th>exit</th><th class='l'>log</th></tr>"]  # fmt: skip
    for s in subs:
        started, ended = s.get("started"), s.get("finished")
        took = (float(ended) - float(started)) if started and ended else None
        out.append("<tr>" + _cell("submission", s["submission"], cls="l"))
        out.append(_cell("script", s.get("script", ""), cls="l"))
        out.append(_cell("state", s.get("state", ""), cls=f"state {s.get('state', '')}"))
        out.append(_cell("started", started or "", _clock(started)))
        out.append(_cell("finished", ended or "", _clock(ended)))
        out.append(_cell("took_s", "" if took is None else round(took, 1), _fmt_s(took)))
        out.append(_cell("mode", "detached" if s.get("detached") else "foreground"))
        out.append(_cell("priority", s.get("priority", 0)))
        out.append(_cell("exit_code", "" if s.get("exit_code") is None else s["exit_code"]))
        log = html.escape("\n".join(s.get("log") or []))
        out.append(f"<td class='l'><details><summary>{len(s.get('log') or [])} line(s)</summary>"
                   f"<pre>{log}</pre></details></td></tr>")  # fmt: skip
    out.append("</table>")
    return "".join(out)


def _workers_section(workers: Mapping[str, Any]) -> str:
    """How many workers the scheduler has, and the latest to join or leave."""
    events = list(workers.get("events", []))[-8:]
    rows = "".join(
        f"<tr data-event='{html.escape(e['event'])}'>" + _cell("time", e["time"], _clock(e["time"]))
        + _cell("event", e["event"], cls=f"state {'done' if e['event'] == 'joined' else 'failed'}")
        + _cell("name", e["name"], cls="l") + _cell("worker", e["worker"], cls="l") + "</tr>"
        for e in reversed(events)
    )  # fmt: skip
    table = (f"<table class='workers'><tr><th>time</th><th>event</th><th class='l'>name</th>"
             f"<th class='l'>address</th></tr>{rows}</table>") if rows else ""  # fmt: skip
    n = int(workers.get("now", 0))
    return f"<h2>workers: <span data-name='workers' data-value='{n}'>{n}</span></h2>{table}"


def render_page(snapshot: Mapping[str, Any], refresh: str = "2", prefix: str = "/") -> str:
    """The farm page: the submitted workflows and the workers' comings and goings first, then a section
    per render, a row per shot."""
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>farm</title>"]
    if re.fullmatch(r"[0-9]{1,5}", refresh) and int(refresh) > 0:
        out.append(f"<meta http-equiv='refresh' content='{int(refresh)}'>")
    out.append(f"<style>{STYLE}</style></head><body>")
    renders = snapshot.get("renders", [])
    running = sum(1 for r in renders if r["state"] in ("running", "cancelling"))
    out.append("<h1>farm renders</h1>")
    out.append(
        f"<div class='sub'>{len(renders)} render(s), {running} running · "
        f"<a href='{prefix}status'>Dask dashboard</a> · <a href='{prefix}{JSON_PATH}'>JSON</a> · "
        f"<a href='{prefix}metrics'>metrics</a> · updated {time.strftime('%H:%M:%S')}"
        "<span class='legend'>"
        + "".join(f"<span class='b {st}'></span>{st}" for st in BATCH_STATES)
        + "</span></div>"
    )
    out.append(_workflows_table(snapshot.get("submissions", [])))
    out.append(_workers_section(snapshot.get("workers", {})))
    if not renders:
        out.append("<p>No renders yet. Start one with <code>farm render JOB --out OUT --scheduler …</code> "
                   "or <code>farm submit WORKFLOW.py</code>.</p>")  # fmt: skip
    for r in renders:
        rid = html.escape(r["render"])
        out.append(f"<h2 id='render-{rid}'>render {rid}</h2>")
        by = f" · started by {html.escape(str(r['user']))}" if r.get("user") else ""
        out.append(
            f"<div class='sub'>job {html.escape(str(r['job']))} → {html.escape(str(r['out']))}{by}</div>"
        )
        out.append(f"<table class='render' data-render='{rid}'><tr>")
        heads = ["state", "priority", "tiles decoded", "batches written", "frames", "frames/s", "elapsed",
                 "ETA", "failures"]  # fmt: skip
        out.append("".join(f"<th>{h}</th>" for h in heads) + "</tr><tr>")
        out.append(_cell("state", r["state"], cls=f"state {r['state']}"))
        out.append(_cell("priority", r["priority"]))
        out.append(_cell("tiles_decoded", r["tiles_decoded"], f"{r['tiles_decoded']}/{r['tiles_total']}"))
        out.append(_progress_cell(r["batches_written"], r["batches_total"]))
        out.append(_cell("frames_written", r["frames_written"]))
        fps = r["frames_per_second"]
        out.append(_cell("frames_per_second", round(fps, 2), f"{fps:.1f}"))
        out.append(_cell("elapsed_s", round(r["elapsed_s"], 1), _fmt_s(r["elapsed_s"])))
        eta = r["eta_s"]
        out.append(_cell("eta_s", "" if eta is None else round(eta, 1), _fmt_s(eta)))
        out.append(_cell("failures", r["failures"], cls="failed" if r["failures"] else ""))
        out.append("</tr></table>")
        if r["last_error"]:
            out.append(f"<div class='err'>last task error: {html.escape(r['last_error'])}</div>")
        out.append(_shots_table(r, prefix))
    out.append("</body></html>")
    return "".join(out)


# --------------------------------------------------------------------------------------------------
# Prometheus: one collector per process, over the monitors of the schedulers in it (usually one)
# --------------------------------------------------------------------------------------------------

_MONITORS: weakref.WeakSet[FarmMonitor] = weakref.WeakSet()
_COLLECTOR: Any = None


class _FarmCollector:
    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        render_labels = ["render", "job"]
        shot_labels = ["render", "job", "shot"]
        families = {
            "tiles_planned": ("farm_render_tiles_planned", "Tiles a render decodes", render_labels),
            "tiles_decoded": ("farm_render_tiles_decoded", "Tiles a render has decoded", render_labels),
            "batches_planned": ("farm_render_batches_planned", "Batches a render writes", render_labels),
            "batches_written": ("farm_render_batches_written", "Temporal batches written", render_labels),
            "frames_written": ("farm_render_frames_written", "Frames written", render_labels),
            "fps": ("farm_render_frames_per_second", "Frames written per second", render_labels),
            "eta": ("farm_render_eta_seconds", "Estimated seconds left (running renders)", render_labels),
            "failed_shots": ("farm_render_failed_shots", "Shots that failed (not cancelled)", render_labels),
            "cancelled_shots": ("farm_render_cancelled_shots", "Shots a cancel stopped", render_labels),
            "task_errors": ("farm_render_task_errors", "Tasks that ended in error", render_labels),
            "priority": ("farm_render_priority", "The render's priority", render_labels),
            "state": ("farm_render_state", "1 for the render's current state", [*render_labels, "state"]),
            "shot_tiles": ("farm_shot_tiles_decoded", "Tiles of a shot decoded", shot_labels),
            "shot_batches_planned": ("farm_shot_batches_planned", "Batches of a shot", shot_labels),
            "shot_batches_written": ("farm_shot_batches_written", "Batches of a shot written", shot_labels),
            "shot_failed": ("farm_shot_failed", "1 if the shot failed", shot_labels),
        }  # fmt: skip
        metrics = {k: GaugeMetricFamily(name, doc, labels=ls) for k, (name, doc, ls) in families.items()}
        for monitor in list(_MONITORS):
            with contextlib.suppress(Exception):  # a half-written record must not break /metrics
                for r in monitor.snapshot()["renders"]:
                    labels = [r["render"], str(r["job"] or "")]
                    metrics["tiles_planned"].add_metric(labels, r["tiles_total"])
                    metrics["tiles_decoded"].add_metric(labels, r["tiles_decoded"])
                    metrics["batches_planned"].add_metric(labels, r["batches_total"])
                    metrics["batches_written"].add_metric(labels, r["batches_written"])
                    metrics["frames_written"].add_metric(labels, r["frames_written"])
                    metrics["fps"].add_metric(labels, r["frames_per_second"])
                    if r["eta_s"] is not None:
                        metrics["eta"].add_metric(labels, r["eta_s"])
                    metrics["failed_shots"].add_metric(labels, r["failed_shots"])
                    metrics["cancelled_shots"].add_metric(labels, r["cancelled_shots"])
                    metrics["task_errors"].add_metric(labels, r["task_errors"])
                    metrics["priority"].add_metric(labels, r["priority"])
                    metrics["state"].add_metric([*labels, r["state"]], 1)
                    for s in r["shots"]:
                        sl = [*labels, s["shot"]]
                        metrics["shot_tiles"].add_metric(sl, s["tiles_decoded"])
                        metrics["shot_batches_planned"].add_metric(sl, s["batches_total"])
                        metrics["shot_batches_written"].add_metric(sl, s["batches_written"])
                        metrics["shot_failed"].add_metric(sl, 1 if s["state"] == "failed" else 0)
        yield from metrics.values()


def _register_collector() -> None:
    global _COLLECTOR
    if _COLLECTOR is not None:
        return
    try:
        import prometheus_client
    except ImportError:  # /metrics then says prometheus_client is missing; the page still works
        return
    _COLLECTOR = _FarmCollector()
    prometheus_client.REGISTRY.register(_COLLECTOR)


# --------------------------------------------------------------------------------------------------
# Installing
# --------------------------------------------------------------------------------------------------


def install(client: Client) -> str | None:
    """Register :class:`FarmMonitor` on the client's scheduler (once) and return the farm page's URL.

    Returns None, installing nothing, when the scheduler cannot load farm (a scheduler started
    elsewhere without farm installed): renders still run, only the page and metrics are missing.
    """
    try:
        client.register_plugin(FarmMonitor(), name=PLUGIN_NAME)
    except Exception:
        return None
    return page_link(dashboard_link(client))


def dask_setup(scheduler: Any) -> None:
    """``dask scheduler --preload farm.dashboard.monitor``: the farm page and metrics on a scheduler
    started by hand."""
    scheduler.add_plugin(FarmMonitor(), name=PLUGIN_NAME, idempotent=True)  # started with the scheduler


def dashboard_link(client: Client) -> str | None:
    """The scheduler's dashboard URL, or None when it has none (bokeh missing, dashboard disabled)."""
    try:
        link = client.dashboard_link
    except Exception:
        return None
    return link or None
