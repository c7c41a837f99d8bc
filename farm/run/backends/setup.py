"""farm's set-up of a cluster it starts, whatever the backend: the scheduler's settings, the warm-up
preload, the worker plugins (interrupts, a quick exit, the backend's own), the I/O workers, the tensor
transport and, for ``farm cluster``, the farm page. `farm render`'s own cluster and ``farm cluster``
both go through :func:`start_cluster` and :func:`set_up_workers`."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

import dask
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from farm import config, logs
from farm.planning.schedule import IO_WORKER_THREADS
from farm.run.backends import ClusterChoice
from farm.run.machine import cpu_count
from farm.worker import transport_plugin, warmup

IO_WORKER_PREFIX = "farm-io-"  # the names of farm's I/O workers; on other clusters a fallback only
IO_RESOURCE = "farm-io"  # the Dask worker resource that marks an I/O worker (dask worker --resources)
WARMUP_PRELOAD = "farm.worker.warmup"
IO_WORKERS_TIMEOUT_S = 120


def start_cluster(
    choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, decoder: dict[str, Any] | None = None,
    **cluster_kwargs: Any,
) -> Any:  # fmt: skip
    """Start the cluster `choice` describes through its backend; `cluster_kwargs` (host, ports, memory
    limit, protocol…) go to its constructor, and `stack` holds the Dask settings it needs while it runs.
    `hint` ends the message when the backend's dependency is missing. `decoder`: the decoder the render
    this cluster is started for decodes with (``{"spec": worker spec JSON, "compile": mode}``), which a
    backend's warmed-up workers build as they start (`farm.worker.warmup.DECODER_HINT`)."""
    backend = choice.backend
    kwargs = {
        "n_workers": choice.n_workers,
        "threads_per_worker": choice.threads_per_worker,
        **cluster_kwargs,
    }
    # farm places every task itself; stealing moves loosely restricted ones (`stop_work_stealing`). The
    # scheduler reads this once, when it starts: `farm render`'s own and `farm cluster`'s alike.
    stack.enter_context(dask.config.set({"distributed.scheduler.work-stealing": False}))
    if backend.warm_up:
        # each decode worker imports torch and diffusers and makes its CUDA context while it connects
        # (`farm.worker.warmup`), not after its first decode task arrives
        kwargs["preload"] = [*kwargs.get("preload", []), WARMUP_PRELOAD]
        if decoder is not None:  # each worker's Nanny copies Dask's settings as it is made: set until it is
            stack.enter_context(dask.config.set({warmup.DECODER_HINT: decoder}))
    return backend.start(choice, stack, hint=hint, **kwargs)


@dataclass(frozen=True)
class WorkersSetUp:
    io_workers: int  # I/O workers started
    page: str | None  # the farm page's URL, when installed


def set_up_workers(
    cluster: Any, client: Client, choice: ClusterChoice, *, io_workers: int | None, memory_limit: Any,
    security: Any = None, page: bool = False,
) -> WorkersSetUp:  # fmt: skip
    """farm's plugins on every worker of `cluster` (just started by `choice`'s backend), restarted ones too;
    its I/O workers (`io_workers`; None: ``farm.io-workers``, else the backend's default), joined before
    this returns; the tensor transport; with `page`, the farm page on the scheduler. `security`: the
    cluster's TLS settings, when it requires encryption."""
    backend = choice.backend
    for plugin in [IgnoreInterruptPlugin(), QuickExitPlugin(), *backend.worker_plugins(choice)]:
        client.register_plugin(plugin)
    n_io = io_worker_count(choice, io_workers)
    if n_io:
        backend.add_io_workers(cluster, n_io, memory_limit, security=security)
        client.wait_for_workers(choice.n_workers + n_io, timeout=IO_WORKERS_TIMEOUT_S)
    transport_plugin.install(client)
    link = None
    if page:
        from farm.dashboard import monitor

        link = monitor.install(client)
    return WorkersSetUp(n_io, link)


def io_worker_count(choice: ClusterChoice, io_workers: int | None = None) -> int:
    """The I/O workers `set_up_workers` starts beside `choice`'s decode workers: `io_workers`, else
    ``farm.io-workers``, else the backend's default."""
    chosen = io_workers if io_workers is not None else config.get("io-workers")
    return choice.backend.default_io_workers(choice, cpu_count()) if chosen is None else int(chosen)


def add_local_io_workers(cluster: Any, n: int, memory_limit: Any, security: Any = None) -> None:
    """Start `n` CPU-only worker processes on this machine in a running `distributed.SpecCluster`: new
    entries of its worker spec, then the cluster awaited, which SpecCluster documents as what brings
    its workers in line with the spec. `security`: the cluster's TLS settings, when it requires
    encryption."""
    from distributed import Nanny

    specs = {}
    for i in range(n):
        specs[f"{IO_WORKER_PREFIX}{i}"] = {
            "cls": Nanny,
            "options": {
                **({"security": security} if security is not None else {}),
                "nthreads": IO_WORKER_THREADS,
                "resources": {IO_RESOURCE: 1},
                "host": "127.0.0.1",
                "memory_limit": memory_limit,
                # never touch a GPU: these only write and encode. UCX must then not create a CUDA
                # context either (the parent's config asks for one; with no visible device it fails).
                "env": {"CUDA_VISIBLE_DEVICES": "", "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "False"},
                "config": {"distributed-ucxx.create-cuda-context": False},
            },
        }
    extend_worker_spec(cluster, specs)


def extend_worker_spec(cluster: Any, specs: dict[str, dict[str, Any]]) -> None:
    """Add `specs` (name: ``{"cls": …, "options": …}``) to a running `distributed.SpecCluster`'s worker
    spec, then await the cluster, which SpecCluster documents as what brings its workers in line with the
    spec: the new workers start."""
    cluster.worker_spec.update(specs)
    cluster.sync(_in_line_with_spec, cluster)


async def _in_line_with_spec(cluster: Any) -> None:
    await cluster


def quiet_distributed_logs() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


class IgnoreInterruptPlugin(WorkerPlugin):
    """Workers of a cluster farm started ignore SIGINT: Ctrl-C on a terminal reaches every process of its
    group, and the client (or ``farm cluster``), not each worker, decides what an interrupt stops (it
    closes the cluster quietly). Applied to workers that restart later too."""

    name = "farm-ignore-interrupt"
    idempotent = True

    def setup(self, worker: Any) -> None:
        if threading.current_thread() is threading.main_thread():  # signal.signal works only there
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class QuickExitPlugin(WorkerPlugin):
    """Worker processes of a cluster farm started skip Python's interpreter teardown once their worker
    has closed: freeing every module and object of torch and diffusers held a render's end (and a
    ``farm cluster`` stop) 1.4 s on a 2-core machine, against 0.06 s without (docs/performance.md). Logs
    and output streams are flushed first; every output file was durable before its task ended."""

    name = "farm-quick-exit"
    idempotent = True

    def teardown(self, worker: Any) -> None:
        import atexit
        import multiprocessing

        if multiprocessing.parent_process() is None:  # a worker inside the user's own process: its exit
            return  # (and exit code) are not the worker's to cut short
        atexit.register(_exit_now)  # registered last, so it runs first of the exit handlers


def _exit_now() -> None:
    logging.shutdown()
    logs.end_process(0)
