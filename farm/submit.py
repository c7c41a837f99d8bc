"""Submit workflow scripts to a running cluster, follow them, and cancel renders.

- **Foreground** (`run_foreground`): the script runs here as ``python SCRIPT ARGS…`` with the cluster's
  address, a submission id and its priority in its environment (`farm.workflow` reads them). Ctrl-C stops
  the script; its client goes away, so the scheduler releases its tasks; finished batches stay.
- **Detached** (`submit_detached`): the script's source is sent to the cluster and runs as the task
  ``("workflow-driver", <submission>)`` on a worker. The task calls `secede` (it leaves the worker's
  thread pool: it holds no task slot while it waits on renders) and is held by `fire_and_forget`, so the
  render goes on when the submitting process exits or is killed. Its log and state are published under
  ``("farm", "submissions", <submission>)``.
- **Cancel** (`cancel`): records ``("farm", "cancelled", <id>)`` (workflows stop at their next check)
  and releases, on the scheduler, every task whose key's second element is the render id, or a render of
  the submission (``<submission>.<n>-<job>``), until none are left. Done markers are written only after a
  batch's frames and segment, so whatever finished stays finished and a rerun resumes from there.

Submission ids look like ``s1a2b3c4``; render ids of a submission ``s1a2b3c4.1-jobname``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import config, logs
from farm.dashboard.monitor import FINAL_STATES, install
from farm.errors import FarmError
from farm.owner import current_user
from farm.render_ids import render_matches, render_of
from farm.run.cluster import scheduler_file_address, workers_info
from farm.run.tls import check_tls, check_tls_to
from farm.store.lock import lock_owners
from farm.workflow import (
    ENV_PRIORITY,
    ENV_SCHEDULER,
    ENV_SUBMISSION,
    EXIT_CANCELLED,
    Context,
    use_context,
)

if TYPE_CHECKING:
    from distributed import Client

DRIVER_PREFIX = "workflow-driver"
DRIVER_PRIORITY = 10**12  # a detached driver starts before any render's tasks
LOG_LINES = 200  # lines of a detached workflow's log kept on the scheduler


def new_submission_id() -> str:
    return "s" + uuid.uuid4().hex[:7]


def resolve_address(scheduler: str | None, scheduler_file: str | None) -> str:
    """The scheduler address from ``--scheduler`` or ``--scheduler-file`` (at most one), else from Dask's
    ``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``)."""
    if not scheduler and not scheduler_file:
        scheduler = config.scheduler_address()
    if scheduler and scheduler_file:
        raise FarmError(
            f"both --scheduler ({scheduler}) and --scheduler-file ({scheduler_file}) were given; give one"
        )
    if scheduler:
        return scheduler
    if not scheduler_file:
        raise FarmError(
            "no cluster given: pass --scheduler ADDRESS or --scheduler-file FILE of a running cluster, or "
            "set DASK_SCHEDULER_ADDRESS (start one with `farm cluster --scheduler-file FILE`)"
        )
    return scheduler_file_address(scheduler_file)


def client_for(address: str) -> Client:
    from distributed import Client


    check_tls(("client",))
    check_tls_to(address)
    try:
        return Client(address, set_as_default=False, timeout="10s")
    except (OSError, TimeoutError, ValueError, RuntimeError) as exc:  # RuntimeError: tcp:// under TLS
        raise FarmError(
            f"could not connect to the scheduler at {address}: {exc}; check that the cluster is running "
            "(farm cluster prints its address) and reachable from here"
        ) from None


def _check_script(script: str | os.PathLike) -> Path:
    path = Path(script)
    if not path.is_file():
        raise FarmError(f"workflow script {str(path)!r} does not exist or is not a file")
    if path.suffix != ".py":
        raise FarmError(f"workflow script {str(path)!r} is not a Python file (.py)")
    return path


def _publish(client: Client, submission: str, record: dict[str, Any]) -> None:
    # one key at a time, "state" last: a reader that sees a submission ended finds its exit code and end
    for key, value in sorted(record.items(), key=lambda item: item[0] == "state"):
        with contextlib.suppress(Exception):
            client.set_metadata(["farm", "submissions", submission, key], value)


# --------------------------------------------------------------------------------------------------
# Foreground
# --------------------------------------------------------------------------------------------------


def published_args(args: Sequence[str]) -> list[str]:
    """What the farm page may show of a workflow's arguments (`farm.page-arguments`): by default none
    (``["(3 arguments)"]``); ``masked``: option names with every value as ``***`` (``--api-token=***``),
    since arguments may carry tokens and passwords and the page is read by everyone who reaches it."""
    if not args:
        return []
    if str(config.get("page-arguments")) != "masked":
        return [f"({len(args)} argument{'s' if len(args) != 1 else ''})"]
    shown = []
    for arg in args:
        if arg.startswith("-") and not arg.lstrip("-")[:1].isdigit():
            shown.append(arg.split("=", 1)[0] + ("=***" if "=" in arg else ""))
        else:
            shown.append("***")
    return shown


def run_foreground(
    script: str | os.PathLike,
    args: Sequence[str],
    address: str,
    *,
    priority: int = 0,
    submission: str | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """Run `script` here against the cluster at `address`; returns its exit code (130 if interrupted)."""
    path = _check_script(script)
    submission = submission or new_submission_id()
    client = client_for(address)
    try:
        page = install(client)
        _publish(client, submission, {
            "script": str(path), "args": published_args(args), "priority": priority, "detached": False,
            "state": "running", "started": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
            "user": current_user(),
        })  # fmt: skip
        log(f"farm: submission {submission}: running {path} against {address}" +
            (f"; farm page {page}" if page else ""))  # fmt: skip
        env = {**os.environ, ENV_SCHEDULER: address, ENV_SUBMISSION: submission, ENV_PRIORITY: str(priority)}
        proc, heartbeat = _start_watched(path, args, env)
        previous = None
        stopped_by = signal.SIGINT
        if threading.current_thread() is threading.main_thread():  # SIGTERM stops it like Ctrl-C

            def on_sigterm(*_: Any) -> None:
                nonlocal stopped_by
                stopped_by = signal.SIGTERM
                raise KeyboardInterrupt

            previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, stopped_by)  # the script and whatever it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = EXIT_TERMINATED if stopped_by == signal.SIGTERM else EXIT_CANCELLED
            _flag_cancelled(client, submission)
            released = _cancel_tasks(client, submission)
            _publish(client, submission, {"state": "cancelled", "finished": time.time(), "exit_code": code})
            how = "terminated (SIGTERM)" if code == EXIT_TERMINATED else "interrupted"
            log(f"farm: submission {submission} {how} ({released} task(s) released); "
                "finished batches are kept, submit again to resume")  # fmt: skip
            return code
        finally:
            os.close(heartbeat)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        state = "done" if code == 0 else ("cancelled" if code == EXIT_CANCELLED else "failed")
        _publish(client, submission, {"state": state, "finished": time.time(), "exit_code": code})
        return code
    finally:
        client.close()


EXIT_TERMINATED = 143  # 128 + SIGTERM, as `farm render`

# The script runs in a process group of its own under this watcher: when the pipe from `farm submit`
# reaches EOF (it exited, however: SIGKILL, SIGHUP, a crash), the whole group is terminated, so no
# workflow goes on orphaned, its renders holding the cluster.
WATCHER = """
import os, runpy, signal, sys, threading
fd, script = int(sys.argv[1]), sys.argv[2]
def watch():
    while os.read(fd, 1):
        pass
    os.killpg(os.getpgrp(), signal.SIGTERM)
threading.Thread(target=watch, daemon=True, name="farm-heartbeat").start()
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
"""


def _start_watched(path: Path, args: Sequence[str], env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """Start ``python SCRIPT ARGS`` in its own process group, tied to this process by a pipe (`WATCHER`);
    returns the process and the pipe's write end, to be closed when this process is done with it."""
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    try:
        proc = subprocess.Popen([sys.executable, "-c", WATCHER, str(read_end), str(path), *args], env=env,
                                pass_fds=(read_end,), process_group=0)  # fmt: skip
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


# --------------------------------------------------------------------------------------------------
# Detached: the driver task
# --------------------------------------------------------------------------------------------------


class _DriverLog:
    """A detached workflow's log: the worker's logger plus the last lines on the scheduler."""

    def __init__(self, client: Client, submission: str) -> None:
        import logging

        self.client, self.submission = client, submission
        self.lines: list[str] = []
        self.count = 0
        self.logger = logging.getLogger("farm.workflow")

    def __call__(self, message: str) -> None:
        for line in str(message).splitlines() or [""]:
            self.logger.info("[%s] %s", self.submission, line)
            self.lines.append(line)
            self.count += 1
        del self.lines[:-LOG_LINES]
        _publish(self.client, self.submission, {"log": list(self.lines), "log_count": self.count})


def run_driver(source: str, filename: str, args: list[str], submission: str, priority: int) -> int:
    """The detached workflow, run as a task on a worker: secede, then run the script to its end.

    It talks to the scheduler through a client of its own rather than `get_client()`: while a render
    runs in this process, `farm.run.cluster.connect`'s client is the process' default client, which
    `get_client()` prefers and caches on the worker, and that client closes when the render ends.
    """
    from distributed import Client, get_worker, secede

    secede()  # a long-running task: give the worker its thread slot back
    worker = get_worker()
    address = worker.scheduler.address
    client = Client(address, set_as_default=False)
    log = _DriverLog(client, submission)
    _publish(client, submission, {"state": "running", "running_since": time.time(),
                                  "worker": get_worker().address})  # fmt: skip
    ctx = Context(scheduler=address, submission=submission, priority=priority, argv=list(args),
                  detached=True, log=log, client=client)  # fmt: skip
    code: int = 0
    try:
        with use_context(ctx):
            code = exec_script(source, filename, log)
    finally:
        state = "done" if code == 0 else ("cancelled" if code == EXIT_CANCELLED else "failed")
        _publish(client, submission, {"state": state, "finished": time.time(), "exit_code": code})
        client.close()
        # A render's client that get_client() cached on this worker is closed now: let the next
        # get_client() on this worker make a fresh one.
        cached = getattr(worker, "_client", None)
        if cached is not None and getattr(cached, "status", "") in ("closing", "closed"):
            worker._client = None
    return code


def exec_script(source: str, filename: str, log: Callable[[str], None]) -> int:
    """Run a workflow's source as ``__main__``; its exit code (SystemExit), or 1 with the traceback logged."""

    def script_print(*values: Any, sep: str | None = " ", end: str | None = "\n", **_: Any) -> None:
        log((sep if sep is not None else " ").join(map(str, values)))

    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": filename, "print": script_print}
    try:
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - running the user's workflow is the point
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        log(str(exc.code))
        return 1
    except BaseException:
        log(traceback.format_exc())
        return 1
    return 0


def submit_detached(
    script: str | os.PathLike,
    args: Sequence[str],
    address: str,
    *,
    priority: int = 0,
    submission: str | None = None,
    log: Callable[[str], None] = print,
) -> str:
    """Start `script` on the cluster at `address` as a detached driver; returns the submission id."""
    from distributed import fire_and_forget


    path = _check_script(script)
    source = path.read_text()
    compile(source, str(path), "exec")  # a syntax error is reported here, not on the cluster
    relative = relative_path_arguments(args)
    if relative:
        logs.LOGGER.warning(
            f"relative path(s) {', '.join(map(repr, relative))} in the workflow's arguments: a detached "
            "workflow runs in a worker process of the cluster and reads them from that worker's working "
            "directory (where `farm cluster` or `dask worker` started), not from this one; give absolute "
            "paths"
        )
    submission = submission or new_submission_id()
    client = client_for(address)
    try:
        page = install(client)
        workers = sorted(workers_info(client))
        if not workers:
            raise FarmError(f"the cluster at {address} has no workers to run the workflow on")
        _publish(client, submission, {
            "script": str(path), "args": published_args(args), "priority": priority, "detached": True,
            "state": "queued", "started": time.time(), "host": socket.gethostname(), "log": [],
            "log_count": 0, "user": current_user(),
        })  # fmt: skip
        # Restricted to the workers there are (any of them, or others later): restricted tasks skip the
        # scheduler's queue, so the driver starts as soon as a thread is free, even on a busy cluster.
        driver = client.submit(
            run_driver, source, str(path), list(args), submission, priority,
            key=(DRIVER_PREFIX, submission), pure=False, priority=DRIVER_PRIORITY,
            workers=workers, allow_other_workers=True,
        )  # fmt: skip
        fire_and_forget(driver)
        log(f"farm: submission {submission}: {path} runs on the cluster at {address} (detached)" +
            (f"; farm page {page}" if page else ""))  # fmt: skip
        log(f"farm: watch it on the farm page or with `farm status OUT`; "
            f"stop it with `farm cancel {submission} --scheduler {address}`")  # fmt: skip
        return submission
    finally:
        client.close()


def relative_path_arguments(args: Sequence[str]) -> list[str]:
    """The workflow arguments that read as relative paths: not options, not absolute, and naming
    something that exists here or holding a path separator (``--out=renders/ep01`` counts its value)."""
    found = []
    for arg in args:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if not value or value.startswith("-") or os.path.isabs(value) or "://" in value:
            continue
        if os.sep in value or os.path.exists(value):
            found.append(value)
    return found


def follow(address: str, submission: str, *, log: Callable[[str], None] = print, poll: float = 0.5) -> int:
    """Print a detached workflow's log until it ends; returns its exit code. Stopping this stops nothing."""
    client = client_for(address)
    try:
        seen = 0
        while True:
            record = client.get_metadata(["farm", "submissions", submission], default=None)
            if record is None:
                raise FarmError(f"no submission {submission!r} on the cluster at {address}")
            lines, count = record.get("log", []), int(record.get("log_count", 0))
            new = count - seen
            for line in lines[max(len(lines) - new, 0) :] if new > 0 else []:
                log(line)
            seen = count
            state = record.get("state")
            if state in FINAL_STATES:
                code = record.get("exit_code")
                log(f"farm: submission {submission} {state}" + (f" (exit code {code})" if code else ""))
                return int(code) if code is not None else (0 if state == "done" else 1)
            time.sleep(poll)
    finally:
        client.close()


# --------------------------------------------------------------------------------------------------
# Cancel
# --------------------------------------------------------------------------------------------------


def _release_on_scheduler(dask_scheduler: Any, target: str, release: bool = True) -> dict[str, int]:
    """Runs on the scheduler: release every task of render `target` (or of its submission's renders)
    from every client that wants it, telling those clients their futures were cancelled.

    Done here rather than with `Client.cancel(force=True)`: that walks dependents and asserts each one
    is wanted by a client, which fails for farm's intermediate tasks (a blend's write and encode are
    held only through the mark task that needs them)."""
    s = dask_scheduler
    wanted: dict[str, list[Any]] = {}
    matched = drivers = 0
    for key, ts in list(s.tasks.items()):
        render = render_of(key)
        if render is None or not render_matches(render, target):
            continue
        if key[0] == DRIVER_PREFIX:
            drivers += 1  # a detached driver stops by itself at its next cancellation check
            continue
        matched += 1
        for cs in ts.who_wants or ():
            wanted.setdefault(cs.client_key, []).append(key)
    keys = sorted({k for ks in wanted.values() for k in ks}, key=str)
    if keys and release:
        s.report({"op": "cancelled-keys", "keys": keys, "reason": f"farm cancel {target}", "msg": None})
        for client, client_keys in wanted.items():
            s.client_releases_keys(keys=client_keys, client=client, stimulus_id=f"farm-cancel-{time.time()}")
    return {"tasks": matched, "released": len(keys), "drivers": drivers}


def owners_of(meta: Mapping[str, Any], renders: Sequence[str], submissions: Sequence[str]) -> dict[str, str]:
    """Who started each of these renders and submissions (id → "user@host"): a submission's own record,
    and for a render of a submitted workflow (``s1.2-job``) its submission's; a render's own record
    otherwise. Ids without an owner recorded are left out."""
    subs, recs = dict(meta.get("submissions", {})), dict(meta.get("renders", {}))
    records: dict[str, Any] = {sid: subs.get(sid) for sid in submissions}
    for rid in renders:
        parent = next((sid for sid in subs if sid != rid and render_matches(rid, sid)), None)
        records[rid] = subs.get(parent) if parent else (recs.get(rid) or {}).get("owner")
    return {rid: f"{who['user']}@{who.get('host', '?')}" for rid, who in records.items()
            if isinstance(who, Mapping) and who.get("user")}  # fmt: skip


def check_owners(
    meta: Mapping[str, Any], renders: Sequence[str], submissions: Sequence[str], target: str
) -> None:
    """Refuse to cancel what another user started (this guards against mistakes, not malice: anyone
    who can reach the scheduler can run code on it, Dask's model; docs/monitoring.md)."""
    me = current_user()
    others = {
        rid: who for rid, who in owners_of(meta, renders, submissions).items() if who.split("@")[0] != me
    }
    if others:
        rid, who = next(iter(others.items()))
        raise FarmError(
            f"{target!r}: {rid} was started by {who}, not by {me}; nothing was cancelled. Cancel someone "
            "else's render only with --force"
        )


def renders_writing(out: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The render id and scheduler address of each render writing into the folder `out` now (renders of
    different shots may write into one OUT at once), as each recorded them in its shot locks
    (`farm.store.lock.lock_owners`), for ``farm cancel OUT``."""
    owners = lock_owners(Path(out))
    if not owners:
        raise FarmError(f"no farm render is writing into {os.fspath(out)!r} now (no lock of it is held); "
                        "nothing was cancelled")  # fmt: skip
    for owner in owners:
        if not owner.get("render") or not owner.get("scheduler"):
            raise FarmError(
                f"the render writing into {os.fspath(out)!r} (pid {owner.get('pid', '?')} on "
                f"{owner.get('host', '?')}) has not reached its cluster yet; nothing was cancelled, try "
                "again in a few seconds"
            )
    return [(str(owner["render"]), str(owner["scheduler"])) for owner in owners]


def render_ended(out: str | os.PathLike[str], render: str) -> bool:
    """Whether render `render` holds no lock of OUT any more (it has ended)."""
    return all(owner.get("render") != render for owner in lock_owners(Path(out)))


def _wait_for(condition: Callable[[], bool], deadline: float, poll: float) -> bool:
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def _flag_cancelled(client: Client, target: str) -> None:
    client.set_metadata(["farm", "cancelled", target], {"at": time.time(), "host": socket.gethostname()})


def _submission_state(client: Client, submission: str) -> str:
    return str(client.get_metadata(["farm", "submissions", submission, "state"], default="done"))


def _ended_states(meta: dict, renders: list[str], submissions: list[str]) -> str:
    """How the named renders and submissions ended ("finished", "failed", "been cancelled", joined), or ""
    when any of them has not ended."""
    states = [meta.get("renders", {}).get(r, {}).get("state") for r in renders]
    states += [meta.get("submissions", {}).get(s, {}).get("state") for s in submissions]
    if not states or any(state not in FINAL_STATES for state in states):
        return ""
    said = {"done": "finished", "failed": "failed", "cancelled": "been cancelled",
            "interrupted": "been interrupted"}  # fmt: skip
    return " and ".join(dict.fromkeys(said[str(state)] for state in states))


def _cancel_tasks(client: Client, target: str) -> int:
    return int(client.run_on_scheduler(_release_on_scheduler, target=target)["tasks"])


def cancel(
    target: str,
    address: str,
    *,
    wait: float = 60.0,
    log: Callable[[str], None] = print,
    poll: float = 0.2,
    quiet_for: float = 1.0,
    force: bool = False,
    ended: Callable[[], bool] | None = None,
) -> int:
    """Cancel render or submission `target` on the cluster at `address`; 0 when it stopped in `wait` s.

    A render or workflow another user started is refused unless `force` (`check_owners`).

    Keeps releasing the target's tasks until none have appeared for `quiet_for` seconds (a driver may
    submit a few more before it notices), and waits for a detached driver of the target to end.
    `ended()`: whether the render has ended (``farm cancel OUT``: OUT's lock released); then it has
    stopped, even when its cluster went with it (a local render's does).
    """
    client = client_for(address)
    try:
        meta = client.get_metadata(["farm"], default={}) or {}
        renders = [r for r in meta.get("renders", {}) if render_matches(r, target)]
        submissions = [s for s in meta.get("submissions", {}) if render_matches(s, target)]
        first = client.run_on_scheduler(_release_on_scheduler, target=target, release=False)
        if not renders and not submissions and not first["tasks"] and not first["drivers"]:
            known = sorted(set(meta.get("renders", {})) | set(meta.get("submissions", {})))
            raise FarmError(
                f"no render or submission {target!r} on the cluster at {address}; known ids: "
                + (", ".join(known[-20:]) if known else "none")
            )
        if not force:
            check_owners(meta, renders, submissions, target)
        ended_as = _ended_states(meta, renders, submissions)
        if ended_as and not first["tasks"] and not first["drivers"]:
            log(f"farm: {target} had already {ended_as} before this cancel; nothing to cancel (farm status "
                "OUT shows what it wrote)")  # fmt: skip
            return 0
        # First the flag (workflows check it when their render returns), then release the tasks.
        _flag_cancelled(client, target)
        released = 0
        deadline = time.monotonic() + wait
        quiet_since = time.monotonic()
        while True:
            if ended is not None and ended():
                break
            try:
                step = client.run_on_scheduler(_release_on_scheduler, target=target)
            except OSError:  # the scheduler went away: a local render closes its cluster as it stops
                if ended is None or not _wait_for(ended, deadline, poll):
                    raise
                break
            released += step["tasks"]
            now = time.monotonic()
            if step["tasks"]:
                quiet_since = now
            live_subs = [s for s in submissions if _submission_state(client, s) not in FINAL_STATES]
            if now - quiet_since >= quiet_for and not live_subs:
                break
            if now > deadline:
                log(f"farm: cancel {target}: still running after {wait:.0f} s "
                    f"({step['tasks']} task(s), workflow(s) {live_subs or 'none'}); try again")  # fmt: skip
                return 1
            time.sleep(poll)
        for r in renders if ended is None or not ended() else ():  # (an ended local render's cluster is gone)
            state = client.get_metadata(["farm", "renders", r, "state"], default=None)
            if state not in ("done",):
                client.set_metadata(["farm", "renders", r, "state"], "cancelled")
        log(f"farm: cancelled {target}: {released} task(s) released; finished batches are kept "
            "(farm status OUT shows them), a rerun resumes from there")  # fmt: skip
        return 0
    finally:
        client.close()
