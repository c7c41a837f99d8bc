"""Where farm runs: a cluster backend (`farm.run.backends`: an existing Dask scheduler, a local CUDA
cluster of one worker per GPU, a local CPU cluster, or one registered beside them) chosen, then joined
or started.

Choosing is pure (:func:`choose_cluster`, testable anywhere); starting is :func:`connect`. dask-cuda is
imported only by the backend that starts a local CUDA cluster: it does not import on a machine
without CUDA, and the CPU path never needs it.

>>> with connect(workers=2) as client:  # doctest: +SKIP
...     client.submit(sum, [1, 2]).result()
3
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from distributed import Client

from farm import logs
from farm.config import scheduler_to_join
from farm.errors import FarmError
from farm.run import backends
from farm.run.backends import ClusterAsk, ClusterChoice
from farm.run.backends.local_cuda import io_workers_beside_gpus as io_workers_beside_gpus
from farm.run.backends.setup import IO_RESOURCE as IO_RESOURCE
from farm.run.backends.setup import IO_WORKER_PREFIX as IO_WORKER_PREFIX
from farm.run.backends.setup import io_worker_count, quiet_distributed_logs, set_up_workers, start_cluster
from farm.run.machine import cpu_count, cpu_decode_threads, detect_gpus, ucx_available
from farm.run.tls import check_tls, check_tls_to
from farm.worker import transport_plugin
from farm.worker.tasks import path_problem, where_am_i


def choose_cluster(
    *,
    scheduler: str | None,
    scheduler_file: str | None,
    workers: int | None,
    gpu_count: int,
    ucx_available: bool,
    cpu_count: int,
    threads_per_worker: int | None = None,
    protocol: str | None = None,
    cpu_decode_threads: int | None = None,
) -> ClusterChoice:
    """Decide, without starting anything, which cluster to use: the backend ``farm.cluster-backend``
    names, or by default (`farm.run.backends.select`):

    - ``scheduler`` or ``scheduler_file``: join that cluster (``n_workers`` 0: it has what it has).
    - GPUs present: a local CUDA cluster, one worker per GPU (`farm.run.backends.local_cuda`).
    - no GPU: a local CPU cluster of ``workers`` processes (`farm.run.backends.local_cpu`).
    """
    if scheduler is not None and scheduler_file is not None:
        raise FarmError(
            f"both --scheduler ({scheduler}) and --scheduler-file ({scheduler_file}) were given; "
            "give one of them to join a running cluster, or neither to start a local one"
        )
    if workers is not None and workers < 1:
        raise FarmError(f"--workers must be at least 1, got {workers}")
    if threads_per_worker is not None and threads_per_worker < 1:
        raise FarmError(f"threads per worker must be at least 1, got {threads_per_worker}")
    ask = ClusterAsk(scheduler=scheduler, scheduler_file=scheduler_file, workers=workers, gpu_count=gpu_count,
                     ucx_available=ucx_available, cpu_count=max(1, cpu_count),
                     threads_per_worker=threads_per_worker, protocol=protocol,
                     cpu_decode_threads=cpu_decode_threads)  # fmt: skip
    return backends.select(ask).choose(ask)


def local_decode_workers() -> int:
    """The decode workers `connect` starts on this machine when nothing is said: one per GPU, or up to
    `farm.run.backends.local_cpu.MAX_DEFAULT_CPU_WORKERS` CPU processes (`farm plan` plans for as many
    as `farm render` runs)."""
    return _planned_choice(None).n_workers


def _planned_choice(workers: int | None) -> ClusterChoice:
    """What `connect` would start on this machine with `workers` (and no scheduler), as chosen before."""
    return choose_cluster(scheduler=None, scheduler_file=None, workers=workers, gpu_count=detect_gpus(),
                          ucx_available=False, cpu_count=cpu_count())  # fmt: skip


def planned_cluster_size(workers: int | None) -> tuple[int, int]:
    """The decode and I/O workers of the cluster `connect` would start with `workers` (and no scheduler),
    as its backend chooses them before starting (`set_up_workers` adds the I/O workers)."""
    choice = _planned_choice(workers)
    return choice.n_workers, io_worker_count(choice)


def planned_gpu_memory(workers: int | None) -> int | None:
    """The GPU memory of the smallest decode worker of the cluster `connect` would start with `workers`
    (and no scheduler), as its backend knows it before starting (None: CPU workers)."""
    choice = _planned_choice(workers)
    return choice.backend.decode_memory(choice)


@contextlib.contextmanager
def connect(
    *,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit: str | int | float | None = "auto",
    on_warning: Any = None,
    io_workers: int | None = None,
    decoder: dict[str, Any] | None = None,
) -> Iterator[Client]:
    """Yield a :class:`distributed.Client` with farm's tensor transport installed.

    Joins the cluster at ``scheduler`` (an address) or ``scheduler_file`` (or, with neither and no
    ``workers``, at Dask's ``scheduler-address`` setting, ``DASK_SCHEDULER_ADDRESS``), or starts a local
    one (see :func:`choose_cluster`): local clusters listen on 127.0.0.1 only, dashboard on a free port.
    On exit, closes the client and whatever cluster this call started; a cluster it joined keeps
    running. ``memory_limit`` is each local worker's host-memory limit (Dask's syntax: ``"auto"``,
    ``"8GiB"``, a fraction, ``None`` for no limit). ``on_warning(message)`` receives the choice's
    warning (default: :func:`warnings.warn`).

    ``io_workers``: CPU worker processes (named ``farm-io-N``) added to a local cluster to write Zarr
    and encode video, so a GPU worker's process spends its GIL on decoding (one process writes Zarr at
    ≈ 300 frames/s at most: docs/performance.md). Default: about one per 3 cores beside a CUDA cluster
    (at most 6 per GPU), none beside a CPU cluster; ``farm.io-workers`` in dask.config sets it.

    ``decoder``: ``{"spec": worker spec JSON, "compile": mode}`` of the render a local cluster is started
    for: its decode workers build that decoder as their processes start, beside their imports
    (`farm.worker.warmup`), while the client connects and sets up. A cluster joined is left as it is.
    """
    scheduler = scheduler_to_join(scheduler, scheduler_file, workers)
    choice = choose_cluster(
        scheduler=scheduler,
        scheduler_file=scheduler_file,
        workers=workers,
        gpu_count=0 if scheduler or scheduler_file else detect_gpus(),
        ucx_available=ucx_available(),
        cpu_count=cpu_count(),
        threads_per_worker=threads_per_worker,
        cpu_decode_threads=cpu_decode_threads(),
    )
    if choice.warning:
        if on_warning is None:
            import warnings

            warnings.warn(choice.warning, stacklevel=3)
        else:
            on_warning(choice.warning)

    ignored_from: list[Any] = []  # the SIGINT handler a Ctrl-C's cleanup replaced, restored after it
    try:
        with contextlib.ExitStack() as stack:
            yield from _connected(choice, scheduler, scheduler_file, memory_limit, io_workers, stack,
                                  ignored_from, decoder)  # fmt: skip
    finally:
        if ignored_from:  # the cleanup is over: this process takes Ctrl-C as before (so do its children)
            signal.signal(signal.SIGINT, ignored_from[0])


def _connected(
    choice: ClusterChoice, scheduler: str | None, scheduler_file: str | None, memory_limit: Any,
    io_workers: int | None, stack: contextlib.ExitStack, ignored_from: list[Any],
    decoder: dict[str, Any] | None = None,
) -> Iterator[Client]:  # fmt: skip
    """`connect`'s body inside its exit stack: join or start the cluster, yield the client."""
    backend = choice.backend
    if not backend.starts_cluster:
        client = _join(scheduler=scheduler, scheduler_file=scheduler_file)
        stack.callback(client.close)
        if stop_work_stealing(client):
            logs.LOGGER.info(
                "farm: holding work stealing off on the scheduler at %s while farm runs there (it moves "
                "farm's pinned blends onto I/O workers); it is turned back on when the last farm client "
                "leaves, or start the scheduler with DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING=False",
                client.scheduler_info().get("address", "?"),
            )
        stack.callback(_restore_quietly, client)  # runs before client.close (the stack unwinds)
        transport_plugin.install(client)
    else:
        cluster = start_cluster(choice, stack, hint="or connect to a running cluster with --scheduler",
                                decoder=decoder, memory_limit=memory_limit, host="127.0.0.1",
                                dashboard_address="127.0.0.1:0")  # fmt: skip
        stack.callback(_close_timed, cluster)
        client = Client(cluster)
        stack.callback(client.close)
        set_up_workers(cluster, client, choice, io_workers=io_workers, memory_limit=memory_limit)
    try:
        yield client
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (farm.cli): stop the cluster without its warnings
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        if backend.starts_cluster:  # our own workers: their cancelled tasks need no warning either
            with contextlib.suppress(Exception):
                client.run(quiet_distributed_logs, on_error="ignore")
        if threading.current_thread() is threading.main_thread():  # a second Ctrl-C must not cut
            ignored_from.append(signal.signal(signal.SIGINT, signal.SIG_IGN))  # the cleanup short
        raise
        raise


def _close_timed(cluster: Any) -> None:
    """Close the local `cluster` (its workers' processes ended), logging the seconds it took (`farm -v`)."""
    started = time.perf_counter()
    cluster.close()
    logs.LOGGER.debug("closed the local cluster in %.2f s", time.perf_counter() - started)


def workers_info(client: Client, timeout: float | None = None) -> dict[str, dict[str, Any]]:
    """The scheduler's workers now, by address, fetched for this call (giving up after `timeout`
    seconds, when given). (``client.scheduler_info()`` returns the client's cached copy, which its
    periodic refresh, without per-worker details, can replace between the fetch and the return: a
    cluster then seemed to have no workers.)"""
    return dict(scheduler_call(client, "identity", timeout, n_workers=-1)["workers"])


def scheduler_call(client: Client, method: str, timeout: float | None, **kwargs: Any) -> Any:
    """The scheduler's rpc `method` called with `kwargs`, given up after `timeout` seconds (None: as
    long as Dask waits, through its reconnect timeout)."""
    if client.scheduler is None:
        raise FarmError("the Dask client is not connected to a scheduler")
    return client.sync(getattr(client.scheduler, method), callback_timeout=timeout, **kwargs)


def check_worker_paths(client: Client, paths: dict[str, str]) -> None:
    """Every worker sees each of `paths` (``{"job store": path, "output folder": path}``) at that path;
    else a FarmError naming the workers, their hosts and the paths, before any task is submitted."""
    def problems(paths: dict[str, str], dask_worker: Any = None) -> list[str]:
        found = [p for what, path in paths.items() if (p := path_problem(path, what))]
        return [f"{where_am_i(dask_worker)} {p}" for p in found]

    found = [p for ps in client.run(problems, paths).values() for p in ps]
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise FarmError(
            "; ".join(found[:3]) + more + ": every worker must see the job stores and outputs at the paths "
            "the render was given (a shared file system mounted at the same place); nothing was rendered"
        )


def default_io_workers(choice: ClusterChoice, cpu_count: int) -> int:
    """The I/O workers `choice`'s backend starts beside its decode workers when nothing says how many."""
    return choice.backend.default_io_workers(choice, cpu_count)


def _join(*, scheduler: str | None, scheduler_file: str | None) -> Client:
    check_tls(("client",))  # a TLS setting that is missing or wrong fails here in words, not in the comm
    if scheduler_file is not None:
        # Client(scheduler_file=...) waits for a missing file to appear, and reads a FIFO without end:
        # the address is read here, defensively, and joined as --scheduler would be
        scheduler = scheduler_file_address(scheduler_file)
        where = f"the scheduler in {scheduler_file}"
        kwargs: dict[str, Any] = {"address": scheduler}
        check_tls_to(scheduler)
        probe_scheduler(scheduler, where)
    else:
        where = f"a scheduler at {scheduler}"
        kwargs = {"address": scheduler}
        check_tls_to(str(scheduler))
        probe_scheduler(str(scheduler), where)
    try:
        return Client(**kwargs)
    except (OSError, TimeoutError, ValueError, RuntimeError) as e:  # RuntimeError: tcp:// under TLS
        raise FarmError(
            f"could not connect to {where}: {e}; check that it is running and reachable "
            "(dask scheduler prints its address), or leave out --scheduler to start a local cluster"
        ) from e


def scheduler_file_address(path: str | os.PathLike[str]) -> str:
    """The address in the Dask scheduler file at `path`, read as a regular file of bounded size and depth
    (`farm.safe_read`); FarmError in one line when there is none, or it is not a scheduler file."""
    from farm.safe_read import read_json

    what = f"scheduler file {os.fspath(path)}"
    try:
        record = read_json(path, what, limit=1024 * 1024)
    except FileNotFoundError:
        raise FarmError(
            f"{what} does not exist; give the file a running scheduler wrote (farm cluster / dask "
            "scheduler --scheduler-file PATH), or --scheduler ADDRESS"
        ) from None
    address = record.get("address") if isinstance(record, dict) else None
    if not isinstance(address, str) or not address:
        raise FarmError(f"{what} is not a Dask scheduler file (no \"address\"); give the file a running "
                        "scheduler wrote, or --scheduler ADDRESS")  # fmt: skip
    return address


PROBE_TIMEOUT_S = 5.0  # a scheduler on a reachable host answers in milliseconds


def probe_scheduler(address: str, where: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail within seconds, saying which, when nothing listens at a ``tcp://`` address or what listens
    is not a Dask server (a Dask server speaks first: its handshake, `distributed.comm.core.Listener`),
    instead of Dask's long connect timeout or a hang. Other protocols are left to Dask."""
    import socket

    from distributed.comm import parse_address, parse_host_port

    try:
        protocol, location = parse_address(address)
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        return  # Dask's own message for a malformed address
    if protocol != "tcp":
        return
    hint = "check the address (dask scheduler and farm cluster print theirs) and that it is running"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise FarmError(f"could not connect to {where}: no answer from {host}:{port} within {timeout:g} s "
                        f"(a firewall, or no such host?); {hint}") from None  # fmt: skip
    except OSError as exc:
        raise FarmError(f"could not connect to {where}: {exc.strerror or exc} (nothing listens at "
                        f"{host}:{port}: a stale scheduler file or address?); {hint}") from None  # fmt: skip
    with sock:
        sock.settimeout(timeout)
        try:
            greeting = sock.recv(8)
        except OSError:
            greeting = b""
    if not greeting:
        raise FarmError(
            f"could not connect to {where}: {host}:{port} accepts connections but is not a Dask scheduler "
            f"(no Dask handshake within {timeout:g} s: a dashboard or another service's port?); {hint}"
        )


def stop_work_stealing(client: Client) -> bool:
    """Hold the work stealing of the scheduler `client` joined off while this client is connected; True
    when it was running (this client then turned it off). `restore_work_stealing` gives it back once no
    farm client holds it off: a shared scheduler is left as farm found it.

    farm places every task itself (decodes round-robin, a batch's blend where its pieces are, writes
    and encodes on I/O workers), with loose restrictions so a lost worker's tasks still run elsewhere;
    Dask steals loosely restricted tasks. On a `farm cluster` of one H200 it moved 1088x1920 blends
    onto idle I/O workers, which fetched the GPU pieces and blended on the CPU: 1.9 s renders against
    1.25 s (docs/performance.md). The clusters farm starts have it off from the start."""

    # defined here so it travels by value: the scheduler need not import farm
    async def hold(dask_scheduler: Any = None, client_id: str = "") -> bool:
        from distributed.diagnostics.plugin import SchedulerPlugin

        s = dask_scheduler
        stealing = s.extensions.get("stealing")
        holds = s.__dict__.setdefault("_farm_stealing_holds", set())
        holds.add(client_id)
        if "farm-stealing-holds" not in s.plugins:

            class ReleaseOnLeave(SchedulerPlugin):  # a client that leaves, killed or not, holds nothing
                name = "farm-stealing-holds"

                def remove_client(self, scheduler: Any, client: str) -> None:
                    held = scheduler.__dict__.setdefault("_farm_stealing_holds", set())
                    held.discard(client)
                    theirs = scheduler.extensions.get("stealing")
                    stopped = getattr(scheduler, "_farm_stopped_stealing", False)
                    if not held and theirs is not None and stopped:
                        scheduler._farm_stopped_stealing = False
                        asyncio.get_running_loop().create_task(theirs.start())

            s.add_plugin(ReleaseOnLeave())
        if stealing is None or "stealing" not in s.periodic_callbacks:
            return False
        await stealing.stop()
        s._farm_stopped_stealing = True  # farm turned it off: farm turns it back on
        return True

    return bool(client.run_on_scheduler(hold, client_id=client.id))


def restore_work_stealing(client: Client) -> bool:
    """Release this client's hold on work stealing; turn stealing back on when farm turned it off and no
    connected farm client still holds it (holds of clients gone, killed ones too, are dropped). True
    when it was turned back on."""

    async def release(dask_scheduler: Any = None, client_id: str = "") -> bool:
        s = dask_scheduler
        holds = s.__dict__.setdefault("_farm_stealing_holds", set())
        holds.discard(client_id)
        holds.intersection_update(s.clients)  # clients that went away hold nothing
        stealing = s.extensions.get("stealing")
        if holds or stealing is None or not getattr(s, "_farm_stopped_stealing", False):
            return False
        s._farm_stopped_stealing = False
        await stealing.start()
        return True

    return bool(client.run_on_scheduler(release, client_id=client.id))


def _restore_quietly(client: Client) -> None:
    if client.status != "running":  # reconnecting to a scheduler that went away: a call would wait it out
        return
    with contextlib.suppress(Exception):  # the scheduler may be gone: nothing left to restore
        restore_work_stealing(client)


def smallest_gpu_memory(client: Client, workers: Sequence[str]) -> int | None:
    """Total memory of the smallest GPU among `workers` (None on a CPU cluster)."""
    sizes = [v for v in client.run(_gpu_memory_total, workers=list(workers)).values() if v]
    return min(sizes) if sizes else None


def _gpu_memory_total() -> int | None:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


def smallest_memory_limit(client: Client, workers: Sequence[str]) -> int | None:
    """The smallest host-memory limit among `workers` (None when none has one)."""
    info = workers_info(client)
    limits = [int(info[w].get("memory_limit") or 0) for w in workers if w in info]
    limits = [v for v in limits if v > 0]
    return min(limits) if limits else None
