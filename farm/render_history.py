"""What `farm status OUT --renders` and ``--render ID`` print: OUT's render histories
(`farm.store.render_logs`) summed up one render a row, and one render's events as readable lines.

Pure: the histories come read, and which renders still run (they hold their shots' locks) comes as ids.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.store.render_logs import StoredHistory

RUNNING, STOPPED = "running", "stopped without an end"


@dataclass
class RenderSummary:
    """One render as its history tells it (a render of several passes: all of them)."""

    render_id: str
    host: str = "?"
    pid: int | None = None
    version: str = "?"
    started: float | None = None
    ended: float | None = None  # its last pass's end; None while running or when it stopped without one
    state: str = STOPPED  # "ended", RUNNING or STOPPED
    outcome: str = "-"  # done, cancelled, interrupted, failed, error (its worst pass)
    shots: list[str] = field(default_factory=list)
    workers_lost: list[str] = field(default_factory=list)
    workers_joined: list[str] = field(default_factory=list)
    moved: dict[str, str] = field(default_factory=dict)  # shot → the worker it moved to, last heard
    decode_retries: int | None = None  # None: no end line said
    failed: dict[str, str] = field(default_factory=dict)  # shot → why
    error: str | None = None  # why the render itself stopped (outcome "error")
    last_line: float | None = None  # when its last event was handled


OUTCOME_ORDER = ("done", "cancelled", "interrupted", "failed", "error")


def summarise(history: StoredHistory, running: Collection[str]) -> RenderSummary:
    """`history` summed up; `running`: the ids of the renders that hold shot locks in OUT now."""
    summary = RenderSummary(history.render_id)
    open_pass = False
    for record in history.records:
        if "setup" in record:
            setup = record["setup"]
            if summary.started is None:
                summary.host, summary.pid = str(setup.get("host", "?")), setup.get("pid")
                summary.version, summary.started = str(setup.get("farm", "?")), setup.get("started")
            refused = {str(shot): str(reason) for shot, reason in (setup.get("refused") or {}).items()}
            for shot in [*setup.get("shots", []), *refused]:
                if shot not in summary.shots:
                    summary.shots.append(shot)
            for shot, reason in refused.items():  # failed before the graph
                summary.failed.setdefault(shot, reason)
            open_pass = True
        elif "event" in record:
            _take_event(summary, record)
        elif "end" in record:
            open_pass = False
            summary.ended = record["end"]
            outcome = str(record.get("outcome", "-"))
            if outcome in OUTCOME_ORDER and (summary.outcome not in OUTCOME_ORDER or OUTCOME_ORDER.index(
                    outcome) > OUTCOME_ORDER.index(summary.outcome)):  # fmt: skip
                summary.outcome = outcome
            if record.get("error"):
                summary.error = str(record["error"])
            for shot, reason in (record.get("failed") or {}).items():
                summary.failed.setdefault(shot, str(reason))
            retries = record.get("retries")
            if isinstance(retries, Mapping):
                summary.decode_retries = (summary.decode_retries or 0) + int(retries.get("decode-tile", 0))
    if open_pass:
        summary.ended = None
        summary.state = RUNNING if history.render_id in running else STOPPED
    elif summary.ended is not None:
        summary.state = "ended"
    return summary


def _take_event(summary: RenderSummary, record: Mapping[str, Any]) -> None:
    event, note = record.get("event") or {}, record.get("note") or {}
    summary.last_line = record.get("t", summary.last_line)
    kind = event.get("type")
    if kind == "WorkerLeft" and note.get("worker"):
        summary.workers_lost.append(str(note["worker"]))
    elif kind == "WorkersJoined":
        summary.workers_joined.extend(str(w) for w in note.get("workers", []))
    elif kind == "ShotFailed" and note.get("shot"):
        summary.failed.setdefault(str(note["shot"]), str(note.get("reason", "?")))
    if "moved" in note:
        summary.moved = {str(k): str(v) for k, v in note["moved"].items()}


def clock(t: float | None) -> str:
    """A time as the local date and time to the second; ``-`` for none."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def table(summaries: Sequence[RenderSummary]) -> list[str]:
    """`farm status OUT --renders`: a row per render, oldest first, and beneath a render, its failed shots
    with their reasons and the workers it lost or gained."""
    lines = [f"{'render':<14} {'host':<16} {'started':<19}  {'ended':<22} {'shots':>5}  {'outcome':<9} "
             f"{'lost':>4} {'joined':>6} {'retries':>7}"]  # fmt: skip
    for s in sorted(summaries, key=lambda s: (s.started or 0, s.render_id)):
        ended = clock(s.ended) if s.state == "ended" else s.state
        retries = "-" if s.decode_retries is None else str(s.decode_retries)
        lines.append(f"{s.render_id:<14} {s.host[:16]:<16} {clock(s.started):<19}  {ended:<22} "
                     f"{len(s.shots):>5}  {s.outcome:<9} {len(s.workers_lost):>4} "
                     f"{len(s.workers_joined):>6} {retries:>7}")  # fmt: skip
        if s.error:
            lines.append(f"  stopped: {s.error}")
        lines.extend(f"  shot {shot!r} failed: {reason}" for shot, reason in s.failed.items())
        lines.extend(f"  worker lost: {w}" for w in s.workers_lost)
        lines.extend(f"  worker joined: {w}" for w in s.workers_joined)
    return lines


def event_lines(history: StoredHistory, running: Collection[str]) -> list[str]:
    """`farm status OUT --render ID`: the render's set-up, each event with what it led to, and its end."""
    lines: list[str] = []
    shots: list[str] = []
    start: float | None = None
    for record in history.records:
        if "setup" in record:
            setup = record["setup"]
            shots = list(setup.get("shots", []))
            start = setup.get("started") if start is None else start
            state = setup.get("state") or {}
            schedule = state.get("schedule") or {}
            steps = len(schedule.get("decodes", ())) or schedule.get("decodes_count", 0)
            host, pid = setup.get("host", "?"), setup.get("pid", "?")
            lines.append(f"render {history.render_id} on {host} (pid {pid}, "
                         f"farm {setup.get('farm', '?')}), started {clock(setup.get('started'))}: "
                         f"{len(shots)} shot(s) ({', '.join(shots)}), {steps} decode(s) on "
                         f"{schedule.get('n_decode', '?')} decode worker(s), window "
                         f"{schedule.get('window', '?')}")  # fmt: skip
            lines.extend(f"  shot {shot!r} failed before the render: {reason}"
                         for shot, reason in (setup.get("refused") or {}).items())  # fmt: skip
        elif "event" in record:
            at = _since(record.get("t"), start)
            text = describe_event(record.get("event") or {}, record.get("note") or {}, shots)
            done = describe_instructions(record.get("instructions") or [], shots)
            lines.append(f"{at}  {text}" + (f"  → {done}" if done else ""))
        elif "end" in record:
            written, total = record.get("batches_written", "?"), record.get("batches_total", "?")
            detail = f"{written}/{total} batch(es) written"
            if record.get("error"):
                detail += f"; {record['error']}"
            for shot, reason in (record.get("failed") or {}).items():
                detail += f"; shot {shot!r} failed: {reason}"
            retries = record.get("retries") or {}
            if retries:
                detail += "; retried: " + ", ".join(f"{n} {kind}" for kind, n in sorted(retries.items()))
            lines.append(f"{_since(record['end'], start)}  ended {clock(record['end'])}: "
                         f"{record.get('outcome', '?')} ({detail})")  # fmt: skip
    summary = summarise(history, running)
    if summary.state != "ended":
        last = f" (its last line: {clock(summary.last_line)})" if summary.last_line else ""
        lines.append(f"{summary.state}{last}")
    return lines


def _since(t: float | None, start: float | None) -> str:
    return f"{'?':>9}" if t is None or start is None else f"{f'+{t - start:.2f}s':>9}"


def _shot(shots: Sequence[str], p: Any) -> str:
    return repr(shots[p]) if isinstance(p, int) and 0 <= p < len(shots) else f"#{p}"


def describe_event(event: Mapping[str, Any], note: Mapping[str, Any], shots: Sequence[str]) -> str:
    """One event as a phrase: what happened, with the shot names and worker addresses the render noted."""
    kind = event.get("type")
    moved = note.get("moved") or {}
    moves = f"; shots moved: {', '.join(f'{s!r} → {w}' for s, w in moved.items())}" if moved else ""
    if kind == "Started":
        return "started"
    if kind == "OutputsOpened":
        return "output arrays open"
    if kind == "BatchWritten":
        if "shot" in note:
            return f"shot {note['shot']!r} batch {note['batch']} written"
        return f"blend {event.get('blend')} written"
    if kind == "ShotFailed":
        return f"shot {_shot(shots, event.get('shot'))} failed: {note.get('reason', '?')}"
    if kind == "OutputWritten":
        return f"shot {_shot(shots, event.get('shot'))}: {event.get('kind')} written"
    if kind == "WorkersJoined":
        joined = ", ".join(note.get("workers", [])) or "?"
        return f"{event.get('count')} decode worker(s) joined: {joined}{moves}"
    if kind == "WorkerLeft":
        return f"decode worker {note.get('worker', '?')} (slot {event.get('slot')}) left{moves}"
    if kind == "RenderCancelled":
        return "cancelled (farm cancel)"
    return str(kind)


def describe_instructions(instructions: Iterable[Mapping[str, Any]], shots: Sequence[str]) -> str:
    """Instructions as ``SubmitDecode(step=3, slot=1)``, a shot by its name."""
    out = []
    for i in instructions:
        fields = ", ".join(f"{k}={_shot(shots, v) if k == 'shot' else _value(v)}" for k, v in i.items()
                           if k != "type")  # fmt: skip
        out.append(f"{i.get('type')}({fields})")
    return ", ".join(out)


def _value(v: Any) -> str:
    return "(" + ", ".join(map(str, v)) + ")" if isinstance(v, list) else str(v)
