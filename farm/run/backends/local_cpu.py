"""The local CPU backend: a `distributed.LocalCluster` of CPU worker processes on this machine, one task
thread each by default, torch's threads in each set by ``farm.cpu-decode-threads``."""

from __future__ import annotations

import contextlib
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from farm.run.backends import ClusterAsk, ClusterBackend, ClusterChoice, register

# Local CPU clusters start at most this many workers unless asked for more: each worker holds its
# own copy of the decoder, so more processes cost memory and rarely speed up one shot.
MAX_DEFAULT_CPU_WORKERS = 4


class LocalCPU(ClusterBackend):
    name = "local-cpu"
    label = "CPU"
    warm_up = True

    def applies(self, ask: ClusterAsk) -> bool:
        return not ask.joins

    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        """``workers`` processes (default ``min(cpu_count, 4)``) with one task thread each and
        `cpu_decode_threads` torch threads each (None: the cores split between them;
        `farm.run.machine.cpu_decode_threads` says why a fixed count is the default)."""
        cpu_count = max(1, ask.cpu_count)
        n = ask.workers if ask.workers is not None else min(cpu_count, MAX_DEFAULT_CPU_WORKERS)
        tpw = ask.threads_per_worker or 1
        warning = None
        if n * tpw > cpu_count:
            warning = (
                f"{n} workers × {tpw} thread{'s' if tpw != 1 else ''} on {cpu_count} CPU "
                f"core{'s' if cpu_count != 1 else ''}: tasks will compete for cores"
            )
        torch_threads = ask.cpu_decode_threads or max(1, cpu_count // (n * tpw))
        return ClusterChoice(self.name, n, "tcp", tpw, warning, torch_threads)

    def start(
        self, choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, **cluster_kwargs: Any
    ) -> Any:
        from distributed import LocalCluster

        return LocalCluster(processes=True, **cluster_kwargs)

    def worker_plugins(self, choice: ClusterChoice) -> list[Any]:
        return [TorchThreadsPlugin(choice.torch_threads)]


class TorchThreadsPlugin(WorkerPlugin):
    """Sets torch's intra-op thread count in each worker of a local CPU cluster.

    distributed already starts worker processes with ``OMP_NUM_THREADS=1`` (its
    ``distributed.nanny.pre-spawn-environ``), which keeps numpy/BLAS to one thread per worker but
    leaves cores idle when there are fewer workers than cores. An environment variable cannot fix
    that reliably (OpenMP reads it when the library loads, which may be before the Nanny applies its
    ``env``), so this plugin calls :func:`torch.set_num_threads` in every worker, including workers
    restarted later.
    """

    name = "farm-torch-threads"
    idempotent = True

    def __init__(self, n_threads: int):
        self.n_threads = n_threads

    def setup(self, worker: Any) -> None:
        import torch

        torch.set_num_threads(self.n_threads)


register(LocalCPU())
