"""OUT's locks: one per shot (the kernel frees it with its holder, never taken twice, none left by a failed
start; renders of other shots proceed, of the same shots or of another job are refused by name), the
short lock on what OUT's renders share, and a render's guard on what its tasks write into OUT."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm.errors import FarmError
from farm.run.render import remove_stale_temporaries
from farm.store.lock import (
    guarded_writes,
    held_shots,
    lock_owners,
    output_lock,
    render_guard,
    shared_lock,
    shot_lock_path,
    stale_guards,
)
from farm.store.output import Output

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}

# A process that waits for the go file, then tries the locks of argv[3:] (shots) for the job argv[2]:
# "got" (held 1.5 s, or until killed when FARM_TEST_HOLD is set) or "refused" with the message.
CONTENDER = """
import os, sys, time
from pathlib import Path
from farm.errors import FarmError
from farm.store.lock import output_lock
out, job, shots = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
go = out.parent / (out.name + ".go")
while not go.exists():
    time.sleep(0.001)
try:
    with output_lock(out, shots, job=job, render="r" + str(os.getpid())):
        print("got", flush=True)
        time.sleep(600 if os.environ.get("FARM_TEST_HOLD") else 1.5)
except FarmError as exc:
    print("refused", exc, flush=True)
"""


def contender(out: Path, job: Path, *shots: str, hold: bool = False) -> subprocess.Popen:
    env = {**ENV, "FARM_TEST_HOLD": "1"} if hold else ENV
    command = [sys.executable, "-c", CONTENDER, str(out), str(job), *shots]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)


def go(out: Path) -> None:
    (out.parent / (out.name + ".go")).touch()


def stale_lock(out: Path, shot: str) -> None:
    """The lock file a SIGKILLed render leaves: an owner record, no live holder."""
    path = shot_lock_path(out, shot)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": 999999, "host": "gone", "job": "/elsewhere/job.zarr"}))


@pytest.mark.slow
def test_two_processes_race_on_a_stale_lock_and_exactly_one_proceeds(tmp_path):
    for trial in range(4):
        out = tmp_path / f"out{trial}"
        stale_lock(out, "sh010")
        procs = [contender(out, tmp_path / "job.zarr", "sh010") for _ in range(2)]
        time.sleep(1.5)  # both imported and spinning on the go file
        go(out)
        results = sorted(p.communicate(timeout=60)[0].split()[0] for p in procs)
        assert results == ["got", "refused"], results
        assert not shot_lock_path(out, "sh010").exists()  # the winner removed it on release


def test_renders_of_other_shots_proceed_together_and_the_same_shots_are_refused_by_name(tmp_path):
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    first = contender(out, job, "sh010", "sh020", hold=True)
    try:
        go(out)
        assert first.stdout.readline().startswith("got")
        with output_lock(out, ["sh030", "sh040"], job=job):  # other shots: held at once
            assert sorted(held_shots(out)) == ["sh010", "sh020", "sh030", "sh040"]
            owners = {tuple(o["shots"]): o for o in lock_owners(out)}
            assert owners[("sh010", "sh020")]["pid"] == first.pid
            assert owners[("sh030", "sh040")]["pid"] == os.getpid()
        holder = rf"shot\(s\) 'sh020' by pid {first.pid} on {socket.gethostname()}, render r{first.pid}"
        with (
            pytest.raises(FarmError, match=holder),
            output_lock(out, ["sh030", "sh020"], job=job),
        ):  # fmt: skip
            pass
        assert sorted(held_shots(out)) == ["sh010", "sh020"]  # the refused render took none (sh030 is free)
        with output_lock(out, ["sh030"], job=job):
            pass
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert held_shots(out) == {}  # the kernel dropped the killed holder's locks
    with output_lock(out, ["sh010", "sh020"], job=job):
        assert set(held_shots(out)) == {"sh010", "sh020"}


def test_a_render_of_another_job_is_refused_while_a_render_writes_into_out(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "a.zarr").mkdir()
    (tmp_path / "b.zarr").mkdir()
    with output_lock(out, ["sh010"], job=tmp_path / "a.zarr"):
        with (
            pytest.raises(FarmError, match=r"render of job '.*a\.zarr' \(pid .*\), not of '.*b\.zarr'"),
            output_lock(out, ["sh020"], job=tmp_path / "b.zarr"),
        ):
            pass
        with output_lock(out, ["sh020"], job=tmp_path / "a.zarr"):  # the same job: other shots proceed
            pass
    with output_lock(out, ["sh020"], job=tmp_path / "b.zarr"):  # none live: OUT's own record decides
        pass


def test_a_killed_holder_leaves_no_lock_that_refuses(tmp_path):
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    holder = contender(out, job, "sh010", hold=True)
    go(out)
    assert holder.stdout.readline().startswith("got")
    with pytest.raises(FarmError, match=rf"pid {holder.pid} on "), output_lock(out, ["sh010"], job=job):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert shot_lock_path(out, "sh010").exists()  # the file stays, the kernel lock does not
    with output_lock(out, ["sh010"], job=job):
        assert json.loads(shot_lock_path(out, "sh010").read_text())["pid"] == os.getpid()
    assert not shot_lock_path(out, "sh010").exists()


def test_a_failed_start_leaves_no_lock(tmp_path):
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    with pytest.raises(RuntimeError), output_lock(out, ["sh010", "sh020"], job=job):
        raise RuntimeError("the cluster did not start")
    assert held_shots(out) == {} and not any(shot_lock_path(out, "sh010").parent.iterdir())
    with output_lock(out, ["sh010"], job=job):  # and the next render proceeds
        pass


SHARED_HOLDER = """
import sys, time
from pathlib import Path
from farm.store.lock import shared_lock
with shared_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_the_shared_lock_waits_for_its_holder_and_names_one_that_is_stuck(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", SHARED_HOLDER, str(out), "1.0"], stdout=subprocess.PIPE,
                              text=True, env=ENV)  # fmt: skip
    assert holder.stdout.readline().startswith("held")
    started = time.monotonic()
    with shared_lock(out):  # waits for the holder's moment to end
        assert holder.poll() is not None or time.monotonic() - started > 0.5
    holder.wait()
    stuck = subprocess.Popen([sys.executable, "-c", SHARED_HOLDER, str(out), "600"], stdout=subprocess.PIPE,
                             text=True, env=ENV)  # fmt: skip
    try:
        assert stuck.stdout.readline().startswith("held")
        with (
            pytest.raises(FarmError, match=rf"held for 0 s by pid {stuck.pid} on .*stuck"),
            shared_lock(out, wait=0.2),
        ):
            pass
        with (  # shot locks are taken under it
            pytest.raises(FarmError, match=rf"held for 0 s by pid {stuck.pid}"),
            output_lock(out, ["sh010"], job=tmp_path / "job.zarr", wait=0.2),
        ):
            pass
    finally:
        stuck.send_signal(signal.SIGKILL)
        stuck.wait()


def guarded(out: Path, guard: str, owner: dict, shots: list[str]) -> bool:
    with guarded_writes(out, guard, owner, shots) as holding:
        return holding


def test_a_renders_task_writes_only_while_the_render_holds_out(tmp_path):
    """What a render's task writes into OUT on a worker lands while the render holds OUT: the render
    waits for a task writing under its guard before it lets OUT go, and a task that starts later (the
    render was interrupted while the cluster was busy) is told not to write."""
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    with (
        output_lock(out, ["sh010", "sh020"], job=job, render="r1") as lock,
        render_guard(out, lock.fields) as guard,
    ):
        owner = dict(lock.fields)
        assert guarded(out, guard, owner, ["sh010", "sh020"])
        assert not guarded(out, guard, {**owner, "started": owner["started"] + 1}, ["sh010"])  # another r1
        assert not guarded(out, guard, owner, ["sh030"])  # a shot it does not hold
        writing, written = threading.Event(), []

        def task() -> None:
            with guarded_writes(out, guard, owner, ["sh010"]) as holding:
                writing.set()
                time.sleep(1.0)
                written.append((holding, held_shots(out).get("sh010", {}).get("render")))

        thread = threading.Thread(target=task)
        thread.start()
        assert writing.wait(10)
    assert written == [(True, "r1")]  # the render let OUT go only once the task had written
    thread.join()
    assert not guarded(out, guard, owner, ["sh010"]) and held_shots(out) == {}
    assert not any(Output(out).guards_dir.iterdir())


GUARD_HOLDER = """
import sys, time
from pathlib import Path
from farm.store.lock import output_lock, render_guard
out = Path(sys.argv[1])
with output_lock(out, ["sh010"], job=sys.argv[2], render="r1") as lock, render_guard(out, lock.fields) as g:
    print(g, flush=True)
    time.sleep(600)
"""


def test_a_task_of_a_killed_render_writes_nothing_and_its_guard_is_stale(tmp_path):
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    holder = subprocess.Popen([sys.executable, "-c", GUARD_HOLDER, str(out), str(job)],
                              stdout=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    try:
        guard = holder.stdout.readline().strip()
        owner = held_shots(out)["sh010"]
        assert guarded(out, guard, owner, ["sh010"]) and stale_guards(out) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (Output(out).guards_dir / guard).exists()  # SIGKILL leaves the guard, the kernel frees the lock
    assert not guarded(out, guard, owner, ["sh010"])
    with output_lock(out, ["sh020"], job=job) as lock, render_guard(out, lock.fields) as live:
        assert stale_guards(out) == [Output(out).guards_dir / guard] and live != guard
        remove_stale_temporaries(Output(out))  # as a render starting its outputs: the killed one's goes
        assert sorted(p.name for p in Output(out).guards_dir.iterdir()) == [live]


def test_a_render_waits_for_a_writing_task_only_so_long(tmp_path, caplog):
    out, job = tmp_path / "out", tmp_path / "job.zarr"
    writing, done = threading.Event(), threading.Event()
    with output_lock(out, ["sh010"], job=job) as lock:
        with render_guard(out, lock.fields, wait=0.3) as guard:

            def task() -> None:
                with guarded_writes(out, guard, dict(lock.fields), ["sh010"]):
                    writing.set()
                    done.wait(10)

            thread = threading.Thread(target=task)
            thread.start()
            assert writing.wait(10)
            started = time.monotonic()
        waited = time.monotonic() - started
    done.set()
    thread.join()
    assert 0.3 <= waited < 5 and "the render ends without waiting for it" in caplog.text
