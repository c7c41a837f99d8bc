"""A render's event log as JSON lines: `RenderState`'s events and instructions, and its set-up, to and
from plain JSON objects.

A render's history (``OUT/.farm/renders/<render-id>.jsonl``, `farm.store.render_logs`) holds one JSON
object a line: first its set-up (``{"setup": …}``: render id, host, pid, farm version, shots, the shots
refused before the graph with why, and the state machine's set-up), then one line per event the state
machine handled (``{"t": …, "event": {"type": "BatchWritten", "blend": 3}, "instructions": [...], "note":
{…}}``), and last how it ended (``{"end": …}``).
An event or instruction is ``{"type": <class name>, <its fields>}``. The set-up holds the whole schedule
unless it has more than `MAX_RECORDED_STEPS` steps; then only its size (``"complete": false``), and the
render cannot be replayed from its file.

Pure: nothing here touches the disk or a clock.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from farm.planning import render_state as rs
from farm.planning.schedule import BlendStep, DecodeStep, Schedule

EVENTS: dict[str, type] = {t.__name__: t for t in (
    rs.Started, rs.OutputsOpened, rs.BatchWritten, rs.ShotFailed, rs.OutputWritten, rs.WorkersJoined,
    rs.WorkerLeft, rs.RenderCancelled,
)}  # fmt: skip
INSTRUCTIONS: dict[str, type] = {t.__name__: t for t in (
    rs.SubmitDecode, rs.SubmitBlend, rs.SubmitStartOutputs, rs.Release, rs.SubmitEndOutputs, rs.ShotDone,
    rs.CancelShot,
)}  # fmt: skip
# a schedule with more decode and blend steps than this is recorded by its size only: its set-up line
# would run to megabytes (about 150 bytes a step)
MAX_RECORDED_STEPS = 20_000


def to_record(item: Any) -> dict[str, Any]:
    """An event or instruction as ``{"type": name, field: value, …}`` (tuples as lists)."""
    return {"type": type(item).__name__, **dataclasses.asdict(item)}


def _from_record(record: Mapping[str, Any], types: Mapping[str, type], what: str) -> Any:
    if not isinstance(record, Mapping) or record.get("type") not in types:
        raise ValueError(f"not a RenderState {what}: {record!r} (types: {', '.join(types)})")
    cls = types[record["type"]]
    values = {f.name: record[f.name] for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def event_from_record(record: Mapping[str, Any]) -> rs.Event:
    """The event `to_record` wrote; ValueError for anything else."""
    return _from_record(record, EVENTS, "event")


def instruction_from_record(record: Mapping[str, Any]) -> rs.Instruction:
    """The instruction `to_record` wrote; ValueError for anything else."""
    return _from_record(record, INSTRUCTIONS, "instruction")


def state_setup_record(setup: Mapping[str, Any]) -> dict[str, Any]:
    """`RenderState.setup` as JSON: the schedule step by step (or only its size, past
    `MAX_RECORDED_STEPS`), shot sets as sorted lists, `end_outputs` keyed by the shot's position."""
    schedule: Schedule = setup["schedule"]
    complete = len(schedule.decodes) + len(schedule.blends) <= MAX_RECORDED_STEPS
    recorded: dict[str, Any] = {"window": schedule.window, "n_decode": schedule.n_decode,
                                "n_io": schedule.n_io}  # fmt: skip
    if complete:
        recorded["decodes"] = [dataclasses.asdict(d) for d in schedule.decodes]
        recorded["blends"] = [dataclasses.asdict(b) for b in schedule.blends]
    else:
        recorded["decodes_count"], recorded["blends_count"] = len(schedule.decodes), len(schedule.blends)
    return {
        "complete": complete,
        "schedule": recorded,
        "batches": list(setup["batches"]),
        "sound": list(setup["sound"]),
        "pinned": sorted(setup["pinned"]),
        "carried": sorted(setup["carried"]),
        "outputs_open": setup["outputs_open"],
        "end_outputs": {str(p): sorted(kinds) for p, kinds in setup["end_outputs"].items()},
    }


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def state_setup_from_record(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """`RenderState`'s keyword arguments from `state_setup_record`'s JSON (``RenderState(**them)``); None
    when the schedule was recorded by its size only."""
    if not record.get("complete"):
        return None
    s = record["schedule"]
    decodes = tuple(DecodeStep(**{k: _tuples(v) for k, v in d.items()}) for d in s["decodes"])
    blends = tuple(BlendStep(**{k: _tuples(v) for k, v in b.items()}) for b in s["blends"])
    return {
        "schedule": Schedule(decodes, blends, s["window"], s["n_decode"], s["n_io"]),
        "batches": record["batches"],
        "sound": record["sound"],
        "pinned": record["pinned"],
        "carried": record["carried"],
        "outputs_open": record["outputs_open"],
        "end_outputs": {int(p): kinds for p, kinds in record["end_outputs"].items()},
    }


def setup_line(*, render_id: str, host: str, pid: int, version: str, started: float, shots: Sequence[str],
               state_setup: Mapping[str, Any], refused: Mapping[str, str] | None = None) -> str:  # fmt: skip
    """The first line of a render's history (a render of several passes, one per pass). `shots`: those its
    state machine runs, by position; `refused`: the render's shots that failed before it, with why."""
    return _line({"setup": {"render": render_id, "host": host, "pid": pid, "farm": version,
                            "started": started, "shots": list(shots), "refused": dict(refused or {}),
                            "state": state_setup_record(state_setup)}})  # fmt: skip


def event_line(t: float, event: rs.Event, instructions: Sequence[rs.Instruction],
               note: Mapping[str, Any] | None = None) -> str:  # fmt: skip
    """One handled event with the instructions it led to; `note`: what the render knew beside it (the
    address of a worker that left, why a shot failed)."""
    record: dict[str, Any] = {"t": t, "event": to_record(event), "instructions": [to_record(i) for i in
                                                                                   instructions]}  # fmt: skip
    if note:
        record["note"] = dict(note)
    return _line(record)


def end_line(t: float, outcome: str, **detail: Any) -> str:
    """The last line: how the render (pass) ended: ``done``, ``failed``, ``cancelled``, ``interrupted``
    (Ctrl-C, SIGTERM) or ``error``."""
    return _line({"end": t, "outcome": outcome, **detail})


def _line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), default=str) + "\n"
