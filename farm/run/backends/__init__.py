"""Cluster backends: where a render's workers come from, behind one protocol.

A backend (:class:`ClusterBackend`) says when it applies to what was asked (:class:`ClusterAsk`), what
it would start or join (:meth:`~ClusterBackend.choose`, pure: a :class:`ClusterChoice`), how it starts
its cluster (:meth:`~ClusterBackend.start`), and what its workers need beyond farm's own set-up
(`farm.run.backends.setup`, applied to every cluster farm starts, whatever its backend): worker
plugins, I/O workers and how they are added. The built-in backends, each in its own module and
registered by name: `existing` (a running scheduler, by address or scheduler file), `local_cuda` (one
dask-cuda worker per GPU), `local_cpu` (CPU worker processes), `slurm` (workers in SLURM batch jobs,
chosen by name only).

Which one runs: the backend named by ``farm.cluster-backend``, or with ``auto`` (the default) the first
registered built-in that applies: a running scheduler when one is given, else the GPUs when there are
any, else the CPU. Callers ask the backend (:attr:`ClusterChoice.backend`), never its name.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from farm import config
from farm.errors import FarmError

AUTO = "auto"  # farm.cluster-backend's default: the first registered backend that applies


@dataclass(frozen=True)
class ClusterAsk:
    """What a render or ``farm cluster`` asked for, and what this machine has: a backend's input."""

    scheduler: str | None
    scheduler_file: str | None
    workers: int | None
    gpu_count: int
    ucx_available: bool
    cpu_count: int
    threads_per_worker: int | None = None
    protocol: str | None = None
    cpu_decode_threads: int | None = None

    @property
    def joins(self) -> bool:
        """Whether a running scheduler was named."""
        return self.scheduler is not None or self.scheduler_file is not None

    @property
    def join_flag(self) -> str:
        return "--scheduler" if self.scheduler is not None else "--scheduler-file"


@dataclass(frozen=True)
class ClusterChoice:
    """What `farm.run.cluster.connect` will start or join: `kind` is the backend's registered name.

    ``threads_per_worker`` is Dask's task threads per worker; ``torch_threads`` is how many intra-op
    threads torch may use in each worker process of a local CPU cluster (so that workers together
    use the machine's cores without oversubscribing them).
    """

    kind: str
    n_workers: int
    protocol: str
    threads_per_worker: int
    warning: str | None
    torch_threads: int = 1

    @property
    def backend(self) -> ClusterBackend:
        return named(self.kind)


class ClusterBackend(ABC):
    """One way to get a cluster. Subclass it, give it a `name`, and :func:`register` an instance."""

    name: ClassVar[str]  # its registered name, as ``farm.cluster-backend`` gives it
    label: ClassVar[str]  # its decode workers in words ("GPU (dask-cuda)", "CPU"), as `farm cluster` prints
    starts_cluster: ClassVar[bool] = True  # False: it joins a running scheduler (`ClusterAsk.scheduler`)
    on_this_machine: ClassVar[bool] = True  # False: its workers run elsewhere (not on this machine's GPUs)
    # decode workers import torch (making their CUDA context) and build the render's decoder as they start
    warm_up: ClassVar[bool] = False

    def applies(self, ask: ClusterAsk) -> bool:
        """Whether ``auto`` takes this backend for `ask` (backends after it are not asked). A backend that
        is only ever chosen by name keeps this default."""
        return False

    @abstractmethod
    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        """What this backend would start (or join) for `ask`, without starting anything; FarmError, in
        words, for what it cannot do."""

    def start(
        self, choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, **cluster_kwargs: Any
    ) -> Any:
        """Start the cluster `choice` describes and return it (a `distributed.SpecCluster`, or anything with
        its ``scheduler_address``, ``worker_spec`` and ``close``). `cluster_kwargs` are Dask's (host, ports,
        memory_limit, protocol, security, n_workers, threads_per_worker, preload); `stack` holds settings
        it needs while the cluster runs; `hint` ends a FarmError about a missing dependency (what else to
        do)."""
        raise TypeError(f"the {self.name} backend joins a running cluster; it starts none")

    def decode_memory(self, choice: ClusterChoice) -> int | None:
        """The GPU memory of the smallest decode worker the cluster `choice` describes will have, known
        before it starts (a plan that cannot fit then starts none); None when its workers decode on CPUs
        or say so only once they join."""
        return None

    def worker_plugins(self, choice: ClusterChoice) -> list[Any]:
        """Worker plugins this backend's workers need beside farm's own (`farm.run.backends.setup`)."""
        return []

    def default_io_workers(self, choice: ClusterChoice, cpu_count: int) -> int:
        """The CPU-only I/O workers started beside the decode workers when ``farm.io-workers`` and the
        options say nothing."""
        return 0

    def add_io_workers(self, cluster: Any, n: int, memory_limit: Any, security: Any = None) -> None:
        """Start `n` I/O worker processes in `cluster`, which this backend started: by default on this
        machine, as Nanny specs beside the others (`farm.run.backends.setup.add_local_io_workers`)."""
        from farm.run.backends.setup import add_local_io_workers

        add_local_io_workers(cluster, n, memory_limit, security=security)


_REGISTRY: dict[str, ClusterBackend] = {}


def register(backend: ClusterBackend) -> ClusterBackend:
    """Make `backend` choosable by its name (``farm.cluster-backend``) and, when it `applies`, by
    ``auto`` after the backends registered before it. A name is registered once."""
    if backend.name in _REGISTRY or backend.name == AUTO:
        raise ValueError(f"a cluster backend named {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered() -> list[str]:
    """The backends' names, in the order ``auto`` asks them."""
    return list(_REGISTRY)


def named(name: str) -> ClusterBackend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise FarmError(
            f"farm.cluster-backend is {name!r}, which is no cluster backend; use {AUTO} or one of "
            f"{', '.join(_REGISTRY)}"
        ) from None


def configured() -> ClusterBackend | None:
    """The backend ``farm.cluster-backend`` names, or None with ``auto`` (the ask decides)."""
    name = str(config.get("cluster-backend"))
    return None if name == AUTO else named(name)


def select(ask: ClusterAsk, name: str | None = None) -> ClusterBackend:
    """The backend for `ask`: `name`'s (None: ``farm.cluster-backend``), or with ``auto`` the first that
    applies. A backend named outright must fit the ask: one that starts a cluster takes no running
    scheduler, and the one that joins needs one."""
    name = str(name if name is not None else config.get("cluster-backend"))
    if name == AUTO:
        for backend in _REGISTRY.values():
            if backend.applies(ask):
                return backend
        raise FarmError(f"no cluster backend applies (registered: {', '.join(_REGISTRY)})")
    backend = named(name)
    if backend.starts_cluster and ask.joins:
        raise FarmError(
            f"farm.cluster-backend {name} starts its own cluster; it cannot be combined with {ask.join_flag} "
            f"(leave out {ask.join_flag}, or set farm.cluster-backend to {AUTO} to join that scheduler)"
        )
    if not backend.starts_cluster and not ask.joins:
        raise FarmError(f"farm.cluster-backend {name} joins a running cluster: give --scheduler ADDRESS or "
                        "--scheduler-file PATH")  # fmt: skip
    return backend


# The built-in backends register themselves, in the order `auto` asks them.
from farm.run.backends import existing, local_cuda, local_cpu, slurm  # noqa: E402, F401, I001
