"""The output lock: the kernel frees it with its holder, never taken twice, none left by a failed start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.errors import FarmError
from farm.store.lock import lock_path, output_lock

# A process that waits for the go file, then tries the lock: "got" (held 1.5 s) or "refused".
CONTENDER = """
import sys, time
from pathlib import Path
from farm.errors import FarmError
from farm.store.lock import output_lock
out, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
try:
    with output_lock(out):
        print("got", flush=True)
        time.sleep(1.5)
except FarmError as exc:
    print("refused", exc, flush=True)
"""


def stale_lock(out: Path) -> None:
    """The lock file a SIGKILLed render leaves: an owner record, no live holder."""
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": 999999, "host": "gone"}))


@pytest.mark.slow
def test_two_processes_race_on_a_stale_lock_and_exactly_one_proceeds(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    for trial in range(4):
        out, go = tmp_path / f"out{trial}", tmp_path / f"go{trial}"
        stale_lock(out)
        procs = [
            subprocess.Popen([sys.executable, "-c", CONTENDER, str(out), str(go)], stdout=subprocess.PIPE,
                             text=True, env=env)
            for _ in range(2)
        ]  # fmt: skip
        time.sleep(1.5)  # both imported and spinning on the go file
        go.touch()
        results = sorted(p.communicate(timeout=60)[0].split()[0] for p in procs)
        assert results == ["got", "refused"], results
        assert not lock_path(out).exists()  # the winner removed it on release


def test_a_killed_holder_leaves_no_lock_that_refuses(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", CONTENDER, str(out), str(tmp_path / "go")], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )  # fmt: skip
    (tmp_path / "go").touch()
    assert holder.stdout.readline().startswith("got")
    with pytest.raises(FarmError, match=rf"pid {holder.pid} on "), output_lock(out):  # live holder
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock_path(out).exists()  # the file stays, the kernel lock does not
    with output_lock(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
    assert not lock_path(out).exists()


def test_a_failed_start_leaves_no_lock(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), output_lock(out):
        raise RuntimeError("the cluster did not start")
    assert not lock_path(out).exists()
    with output_lock(out):  # and the next render proceeds
        pass
