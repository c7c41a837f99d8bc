"""Local worker processes forked from a server that imports what decoding needs from the command's start.

A fresh decode worker spends seconds importing torch and diffusers' model code before its first decode
(FINDINGS.md: 8.7-9.1 s on an H200 node). Spawned by its Nanny, a worker can begin them only after the
command has imported Dask, read and planned the job and started the scheduler, and after the new process
has imported Dask again itself. A command that will start a local cluster (`farm render` without
``--scheduler``, `farm cluster`) therefore calls `start_worker_imports` first thing: Python's
forkserver starts beside the command and imports `WORKER_MODULES` while the command sets up; the local
cluster's Nannies then fork their workers from it (``distributed.worker.multiprocessing-method:
forkserver``, `forked_local_workers`), each worker finding those modules imported, and several
workers share one import instead of each running it at once, diffusers' model code included
(`farm.run.forkserver_imports`). A worker's warm-up (`farm.worker.warmup`) then creates its CUDA context
and builds its decoder, reading the weights onto the GPU beside the model's build.

The forkserver never touches a GPU: importing torch makes no CUDA context, and the server checks CUDA's
availability through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``), so each forked worker makes its own
context on the GPU dask-cuda gives it (``CUDA_VISIBLE_DEVICES``, set in the worker before any CUDA call).
``farm.fork-workers: false`` keeps Dask's spawned workers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path

import dask.config
import yaml

from farm import config, logs
from farm.run.forkserver_exit import SERVER_MARK

# What the forkserver imports, in order: what ends the server with the command, Dask's worker machinery,
# torch, diffusers' model code (`farm.run.forkserver_imports`), farm's
# decoder registry and the warm-up preload. A module that fails to import is skipped (the forked worker
# imports it, and its decode raises in words).
WORKER_MODULES = (
    "farm.run.forkserver_exit",
    "distributed",
    "torch",
    "farm.run.forkserver_imports",
    "farm.decoders",
    "farm.worker.warmup",
)
START_METHOD = "forkserver"
# torch's fork-safe availability check: a `torch.cuda.is_available()` in the server asks NVML, not the
# CUDA driver, so no process forked from it inherits an initialised driver
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"

_started = False  # this process started the forkserver with WORKER_MODULES
_started_at: float | None = None  # the seconds since this process's start when it did (`started_at`)


def forked_local_workers(*, joins: bool) -> dict[str, str]:
    """The Dask settings a command holds while it runs so that the local cluster it starts forks its
    workers from a forkserver importing `WORKER_MODULES`, started now (`start_worker_imports`); none when
    the command `joins` a running scheduler, when ``farm.cluster-backend`` names a backend outright (it may
    start its workers elsewhere; ``auto`` takes this machine's GPUs or CPUs), or when no forkserver
    starts. Decided from the arguments and settings alone, before the command imports Dask's distributed;
    held for the whole command, so that workers restarted after a loss fork from it too."""
    if joins or config.get("cluster-backend") != "auto" or not start_worker_imports():
        return {}
    return {"distributed.worker.multiprocessing-method": START_METHOD}


def start_worker_imports() -> bool:
    """Start the forkserver importing `WORKER_MODULES`, unless ``farm.fork-workers`` is off, this platform
    has no forkserver, or it already runs; True when local workers can fork from it. Returns at once: the
    imports run in the server's own process."""
    global _started, _started_at
    if not config.get("fork-workers") or not sys.platform.startswith("linux"):
        return False
    if START_METHOD not in multiprocessing.get_all_start_methods():
        return False
    if _started:
        return True
    # what a Nanny sets in its own environment before it spawns a worker (thread counts, malloc's trim
    # threshold, read as the process starts): the server and every worker forked from it inherit them
    os.environ.update(pre_spawn_environment())
    context = multiprocessing.get_context(START_METHOD)
    context.set_forkserver_preload(list(WORKER_MODULES))
    with _environment({NVML_CHECK: "1", SERVER_MARK: str(os.getpid())}):  # the server's alone
        forkserver.ensure_running()
    _started = True
    _started_at = logs.process_age_s()
    return True


def started_at() -> float | None:
    """Seconds from this process's start to its starting the forkserver (None: it started none, or the
    platform does not tell), for `farm -v render`."""
    return _started_at


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """`variables` set in this process's environment for the block (a process started in it inherits
    them), then restored."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pre_spawn_environment() -> dict[str, str]:
    """``distributed.nanny.pre-spawn-environ`` as a Nanny applies it (a variable already set wins; None
    unsets nothing), read without importing distributed: its defaults file registered as distributed
    registers it at import (`dask.config.update_defaults` keeps what the user configured)."""
    spec = importlib.util.find_spec("distributed")
    if spec is None or spec.origin is None:
        return {}
    with open(Path(spec.origin).with_name("distributed.yaml"), encoding="utf-8") as fh:
        dask.config.update_defaults(yaml.safe_load(fh))
    wanted = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    return {name: os.environ.get(name, str(value)) for name, value in wanted.items() if value is not None}
