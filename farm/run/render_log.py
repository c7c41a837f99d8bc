"""A driver's render written down as it goes (`farm.store.render_logs`): its set-up before the first event,
each event its state machine handles with the instructions it led to and what the driver knew beside it
(the worker that left or joined, the shots moved, why a shot failed), and how it ended, with the retries
the scheduler made of its tasks."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError
from farm.planning import render_state as rs
from farm.planning.render_events import end_line, event_line, setup_line
from farm.run.cluster import scheduler_call
from farm.store.render_logs import RenderLogFile
from farm.version import __version__

if TYPE_CHECKING:
    from farm.run.graph import Driver

RETRIES_CALL_S = 2.0  # the scheduler's count of retries is given up this soon (`graph.MONITOR_CALL_S`)


@contextlib.contextmanager
def recording(driver: Driver, refused: Mapping[str, str]) -> Iterator[None]:
    """Write `driver`'s render into ``OUT/.farm/renders/<render-id>.jsonl`` while the block runs it;
    `refused`: the render's shots that failed before its graph, with why."""
    log = RenderLogFile(driver.targets.out, driver.render_id)
    log.write(setup_line(render_id=driver.render_id, host=socket.gethostname(), pid=os.getpid(),
                         version=__version__, started=time.time(), shots=[p.shot for p in driver.plans],
                         state_setup=driver.state.setup, refused=refused))  # fmt: skip

    def heard(event: rs.Event, instructions: list[rs.Instruction]) -> None:
        log.write(event_line(time.time(), event, instructions, _note(driver, event)))

    driver.state.listeners.append(heard)
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (`farm.cli`)
        log.write(end_line(time.time(), "interrupted", **_outcomes(driver)))
        raise
    except BaseException as exc:
        error = str(exc) if isinstance(exc, FarmError) else f"{type(exc).__name__}: {exc}"
        log.write(end_line(time.time(), "error", error=error, **_outcomes(driver)))
        raise
    else:
        stats = driver.stats
        outcome = "failed" if stats.failed or refused else "cancelled" if stats.cancelled else "done"
        log.write(end_line(time.time(), outcome, **_outcomes(driver), retries=_retries(driver)))
    finally:
        driver.state.listeners.remove(heard)
        log.close()


def _note(driver: Driver, event: rs.Event) -> dict[str, Any]:
    """What the driver knows of `event` that the event does not say: shot names, worker addresses."""
    plans, state = driver.plans, driver.state
    if isinstance(event, rs.BatchWritten):
        blend = driver.schedule.blends[event.blend]
        return {"shot": plans[blend.shot].shot, "batch": plans[blend.shot].batches[blend.batch].index}
    if isinstance(event, rs.ShotFailed | rs.OutputWritten):
        name = plans[event.shot].shot
        error = driver.stats.shots[name].error
        return {"shot": name, **({"reason": error} if isinstance(event, rs.ShotFailed) and error else {})}
    if isinstance(event, rs.WorkersJoined | rs.WorkerLeft):
        workers = driver.workers
        moved = {plans[p].shot: workers[slot] for p, slot in state.moved.items() if slot < len(workers)}
        if isinstance(event, rs.WorkerLeft):
            return {"worker": workers[event.slot], "moved": moved}
        return {"workers": list(workers[len(workers) - event.count :]), "moved": moved}
    return {}


def _outcomes(driver: Driver) -> dict[str, Any]:
    stats = driver.stats
    return {
        "batches_written": stats.batches_written,
        "batches_total": stats.batches_total,
        "failed": {s.shot: s.error for s in stats.failed},
        "cancelled": [s.shot for s in stats.cancelled],
    }


def _retries(driver: Driver) -> dict[str, int] | None:
    """Per task kind (``decode-tile``, …), how many times the scheduler ran one of this render's tasks
    again after it raised (Dask's ``retries``), read off the scheduler's transition log; None when the
    scheduler cannot say."""
    from distributed.protocol.pickle import dumps

    try:  # as `Client.run_on_scheduler`, given up as soon as the render's monitoring calls are
        response = scheduler_call(driver.client, "run_function", RETRIES_CALL_S,
                                  function=dumps(retried_tasks), args=dumps((driver.render_id,)),
                                  kwargs=dumps({}), wait=True)  # fmt: skip
    except Exception:  # the history must never break a render
        return None
    counted = response.get("result") if response.get("status") == "OK" else None
    return dict(counted) if isinstance(counted, dict) else None


def retried_tasks(render_id: str, dask_scheduler: Any = None) -> dict[str, int]:
    """On the scheduler: per task kind of render `render_id`, its retries. A task that raised with retries
    left goes from ``processing`` back to ``released`` on the worker's ``task-erred-…`` message (then
    waits and runs again); one without goes to ``erred``."""
    counts: Counter[str] = Counter()
    for transition in dask_scheduler.transition_log:
        key, start, finish, stimulus = transition[0], transition[1], transition[2], transition[4]
        if (start, finish) != ("processing", "released") or not str(stimulus).startswith("task-erred"):
            continue
        if isinstance(key, tuple) and len(key) >= 2 and key[1] == render_id and isinstance(key[0], str):
            counts[key[0]] += 1
    return dict(counts)
