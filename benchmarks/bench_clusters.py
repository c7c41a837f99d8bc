"""The clusters the GPU benchmarks render on: one started in the benchmark's own process (as `farm render`
without a scheduler starts it), or a long-lived `farm cluster` in a process of its own, joined by its
scheduler file (as a studio's renders join theirs)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# daemon-tcp, daemon-ucx: `farm cluster --protocol tcp|ucx` (daemon: its default, tcp on one GPU)
KINDS = ("inproc", "daemon", "daemon-tcp", "daemon-ucx")


@contextlib.contextmanager
def daemon_cluster(
    work: Path, gpus: int, io_workers: int | None = None, protocol: str | None = None
) -> Iterator[Any]:
    """`farm cluster --gpus N` in its own process (its own session: a Ctrl-C here does not reach it), and
    a client of it once every worker has joined; stopped (SIGTERM) on exit."""
    from distributed import Client

    work.mkdir(parents=True, exist_ok=True)
    scheduler_file = work / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    command = ["cluster", "--gpus", str(gpus), "--port", "0", "--dashboard-port", "0",
               "--scheduler-file", str(scheduler_file)]  # fmt: skip
    if io_workers is not None:
        command += ["--io-workers", str(io_workers)]
    if protocol is not None:
        command += ["--protocol", protocol]
    ready = work / "cluster.log"
    with open(ready, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "farm", *command], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 180
        while "farm cluster: ready" not in ready.read_text():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"farm cluster did not start:\n{ready.read_text()[-2000:]}")
            time.sleep(0.2)
        client = Client(scheduler_file=str(scheduler_file))
        try:
            yield client
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def cluster(
    kind: str, work: Path, gpus: int, io_workers: int | None = None
) -> contextlib.AbstractContextManager:
    """A client of a `kind` cluster (`KINDS`) of `gpus` GPU workers."""
    from farm.run.cluster import connect

    if kind == "inproc":
        return connect(workers=gpus, io_workers=io_workers)
    if kind.startswith("daemon"):
        return daemon_cluster(work, gpus, io_workers, kind.partition("-")[2] or None)
    raise ValueError(f"cluster kind {kind!r}; use one of {KINDS}")
