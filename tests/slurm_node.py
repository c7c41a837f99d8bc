"""A one-node SLURM cluster for the tests, every daemon's file under one folder: munged, slurmctld and
slurmd started as child processes of the test run and stopped at the end.

`start_slurm_node(folder)` returns the slurm.conf to point ``SLURM_CONF`` at, or raises `SlurmUnavailable`
saying why it could not (no SLURM installed, not root, a daemon that did not come up): the test then
skips with that reason. Install with ``apt-get install -y slurm-wlm munge`` (Debian 12: SLURM 22.05);
`.ci/run` does so where it can.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PARTITION = "farm"
DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT_S = 60
NODE_CPUS = 4  # at least: a decode job and an I/O job run side by side on a 2-core machine


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why."""


def _program(name: str) -> str:
    for folder in (None, "/usr/sbin", "/sbin"):
        found = shutil.which(name, path=folder)
        if found:
            return found
    raise SlurmUnavailable(f"{name} is not installed (apt-get install -y slurm-wlm munge)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise SlurmUnavailable("no MemTotal in /proc/meminfo")


def slurm_conf(folder: Path, node: str, cpus: int, memory_mib: int, munge_socket: Path) -> str:
    """A minimal slurm.conf: this machine as the one node (`cpus`, `memory_mib`), one partition, no
    accounting, no cgroups, every state, spool, pid and log file under `folder`."""
    return "\n".join([
        "ClusterName=farmtest",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",  # the node's CPUs as written here, a small machine's too
        "SlurmdTimeout=30",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mib} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@contextlib.contextmanager
def slurm_node(folder: Path) -> Iterator[Path]:
    """A running one-node SLURM cluster whose files are all under `folder`; yields its slurm.conf.
    The daemons are stopped, by their process ids, when the block ends."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("the SLURM daemons of the test run as root, and the tests do not")
    munged, mungekey = _program("munged"), _program("mungekey")
    slurmctld, slurmd, sinfo = _program("slurmctld"), _program("slurmd"), _program("sinfo")
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(exist_ok=True)
    key, munge_socket = folder / "munge" / "munge.key", folder / "munge" / "munge.socket"
    subprocess.run([mungekey, "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    cpus = max(NODE_CPUS, os.cpu_count() or 1)
    conf.write_text(slurm_conf(folder, node, cpus, _memory_mib() * 3 // 4, munge_socket))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    commands = [
        [munged, "--foreground", "--force", f"--key-file={key}", f"--socket={munge_socket}",
         f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--log-file={folder / 'munge' / 'munged.log'}",
         f"--seed-file={folder / 'munge' / 'munged.seed'}"],
        [slurmctld, "-D", "-i", "-f", str(conf)],
        [slurmd, "-D", "-N", node, "-f", str(conf)],
    ]  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in zip(DAEMONS, commands, strict=True):
            log = open(folder / f"{name}.out", "wb")  # noqa: SIM115 (closed with the process)
            started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
            log.close()
            if name == "munged":
                _wait_for(lambda: munge_socket.exists(), "munged's socket", started[-1], folder)
        _wait_for(lambda: _node_idle(sinfo, env), f"node {node} idle in sinfo", started[-1], folder)
        yield conf
    finally:
        if started:  # no job outlives the test: a job's step would outlive slurmd
            scancel = shutil.which("scancel")
            if scancel:
                subprocess.run([scancel, "--full", "--partition", PARTITION], env=env, capture_output=True,
                               timeout=30)  # fmt: skip
                with contextlib.suppress(SlurmUnavailable):
                    _wait_for(lambda: _no_jobs(env), "empty queue", started[-1], folder, timeout=30)
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _node_idle(sinfo: str, env: dict[str, str]) -> bool:
    done = subprocess.run([sinfo, "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    return done.returncode == 0 and done.stdout.strip() == "idle"


def _no_jobs(env: dict[str, str]) -> bool:
    done = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=10)
    return done.returncode == 0 and not done.stdout.strip()


def _wait_for(ready: Callable[[], bool], what: str, process: subprocess.Popen[bytes], folder: Path,
              timeout: float = START_TIMEOUT_S) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            logs = " ".join(sorted(p.name for p in folder.glob("*.log")))
            raise SlurmUnavailable(f"no {what} within {timeout:g} s (exit {process.poll()}; logs in "
                                   f"{folder}: {logs})")  # fmt: skip
        time.sleep(0.3)
