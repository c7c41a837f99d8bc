"""The local GPU backend: a dask-cuda ``LocalCUDACluster``, one worker per GPU of this machine, over UCX
between several GPUs when distributed-ucxx is installed, with CPU-only I/O workers beside them.
dask-cuda is imported only when the cluster starts: it does not import on a machine without CUDA."""

from __future__ import annotations

import contextlib
from typing import Any

import dask

from farm.errors import FarmError
from farm.run.backends import ClusterAsk, ClusterBackend, ClusterChoice, register
from farm.run.machine import detect_gpus, local_gpu_memory

UCX_WARNING = (
    "UCX is not installed (distributed-ucxx; pip install 'farm-decode[cuda]'): workers talk over TCP, so "
    "decoded tiles travel between GPUs through host memory"
)


class LocalCUDA(ClusterBackend):
    name = "local-cuda"
    label = "GPU (dask-cuda)"
    warm_up = True

    def applies(self, ask: ClusterAsk) -> bool:
        return not ask.joins and ask.gpu_count > 0

    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        """One worker per GPU (``workers``: the first N GPUs). With several, over UCX when distributed-ucxx
        is installed, else TCP with a warning; with one, over TCP (no tile moves between GPUs, and UCX's
        slower task round trips cost a carried 704×1216 shot ≈ 0.1 s on an H200, docs/performance.md),
        unless `protocol` ("ucx" or "tcp") says otherwise."""
        gpu_count, workers = ask.gpu_count, ask.workers
        if gpu_count < 1:
            raise FarmError(
                f"the {self.name} cluster backend runs one worker per GPU, and this machine has no GPU; "
                "set farm.cluster-backend to auto"
            )
        if workers is not None and workers > gpu_count:
            raise FarmError(
                f"--workers {workers} asks for more workers than GPUs: this machine has {gpu_count} "
                f"GPU{'s' if gpu_count != 1 else ''} and a local CUDA cluster runs one worker per GPU; "
                f"use --workers 1..{gpu_count}"
            )
        n = workers if workers is not None else gpu_count
        wanted = ask.protocol or ("ucx" if n > 1 else "tcp")
        protocol = "ucx" if wanted == "ucx" and ask.ucx_available else "tcp"
        warning = UCX_WARNING if wanted == "ucx" and not ask.ucx_available else None
        # One decode at a time runs on the GPU (farm.worker.tasks' decode thread); the other task threads
        # blend, write Zarr and encode video while it does, so the GPU never waits on I/O.
        io_threads = ask.threads_per_worker or min(8, max(2, max(1, ask.cpu_count) // n))
        return ClusterChoice(self.name, n, protocol, io_threads, warning, 1)

    def start(
        self, choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, **cluster_kwargs: Any
    ) -> Any:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as e:
            raise FarmError(
                f"found {detect_gpus()} GPU(s) but dask-cuda does not import ({e}); install the GPU "
                f"extras (pip install 'farm-decode[cuda]'), {hint}"
            ) from e
        cluster_kwargs.setdefault("protocol", choice.protocol)
        if cluster_kwargs["protocol"] == "ucx":
            # UCX must create the CUDA context before it initialises, on the client and scheduler side too
            # (the scheduler of a local cluster runs in this process). Workers get it from dask-cuda.
            stack.enter_context(dask.config.set({"distributed-ucxx.create-cuda-context": True}))
        return LocalCUDACluster(**cluster_kwargs)

    def decode_memory(self, choice: ClusterChoice) -> int | None:
        return local_gpu_memory(choice.n_workers)  # the first n_workers GPUs: dask-cuda's

    def default_io_workers(self, choice: ClusterChoice, cpu_count: int) -> int:
        return io_workers_beside_gpus(choice.n_workers, cpu_count)


def io_workers_beside_gpus(n_gpus: int, cpu_count: int) -> int:
    """I/O worker processes a local CUDA cluster starts beside `n_gpus` GPU workers: about one per
    three cores, at most 6 per GPU, at least one."""
    return max(1, min(6 * n_gpus, cpu_count // 3))


register(LocalCUDA())
