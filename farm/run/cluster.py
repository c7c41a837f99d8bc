"""Where farm runs: an existing Dask scheduler, a local CUDA cluster (one worker per GPU), or a local CPU
cluster.

Choosing is pure (:func:`choose_cluster`, testable anywhere); starting is :func:`connect`. dask-cuda is
imported only inside the branch that starts a local CUDA cluster: it does not import on a machine
without CUDA, and the CPU path never needs it.

>>> with connect(workers=2) as client:  # doctest: +SKIP
...     client.submit(sum, [1, 2]).result()
3
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dask
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from farm import config, logs
from farm.errors import FarmError
from farm.planning.schedule import IO_WORKER_THREADS
from farm.run.tls import check_tls, check_tls_to
from farm.worker import transport_plugin
from farm.worker.tasks import path_problem, where_am_i

# Local CPU clusters start at most this many workers unless asked for more: each worker holds its
# own copy of the decoder, so more processes cost memory and rarely speed up one shot.
MAX_DEFAULT_CPU_WORKERS = 4

UCX_WARNING = (
    "UCX is not installed (distributed-ucxx; pip install 'farm-decode[cuda]'): workers talk over TCP, so "
    "decoded tiles travel between GPUs through host memory"
)


@dataclass(frozen=True)
class ClusterChoice:
    """What :func:`connect` will start or join.

    ``threads_per_worker`` is Dask's task threads per worker; ``torch_threads`` is how many intra-op
    threads torch may use in each worker process of a local CPU cluster (so that workers together
    use the machine's cores without oversubscribing them).
    """

    kind: Literal["existing", "local-cpu", "local-cuda"]
    n_workers: int
    protocol: str
    threads_per_worker: int
    warning: str | None
    torch_threads: int = 1


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
    """Decide, without starting anything, which cluster to use.

    - ``scheduler`` or ``scheduler_file``: join that cluster (``n_workers`` 0: it has what it has).
    - GPUs present: a local CUDA cluster, one worker per GPU (``workers`` uses the first N GPUs). With
      several, over UCX when distributed-ucxx is installed, else TCP with a warning; with one, over
      TCP (no tile moves between GPUs, and UCX's slower task round trips cost a carried 704×1216 shot
      ≈ 0.1 s on an H200, docs/performance.md), unless `protocol` ("ucx" or "tcp") says otherwise.
    - no GPU: a local CPU cluster of ``workers`` processes (default ``min(cpu_count, 4)``) with one
      task thread each and `cpu_decode_threads` torch threads each (None: the cores split between
      them; `farm.cpu-decode-threads`, read by `cpu_decode_threads`, says why a fixed count is the
      default).
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
    cpu_count = max(1, cpu_count)

    if scheduler is not None or scheduler_file is not None:
        flag = "--scheduler" if scheduler is not None else "--scheduler-file"
        if workers is not None:
            raise FarmError(
                f"--workers starts a local cluster; it cannot be combined with {flag}: the running "
                "cluster's workers are what you get (leave out --workers, or leave out "
                f"{flag} to start a local cluster of {workers} workers)"
            )
        if threads_per_worker is not None:
            raise FarmError(
                f"threads per worker apply to a local cluster; they cannot be combined with {flag}: "
                "set them where the running cluster's workers are started (dask worker --nthreads)"
            )
        address = scheduler if scheduler is not None else scheduler_file
        assert address is not None
        if scheduler_file is not None:
            protocol = ""  # in the file; known once connected
        else:
            protocol = address.split("://", 1)[0] if "://" in address else "tcp"
        return ClusterChoice("existing", 0, protocol, 0, None, 0)

    if gpu_count > 0:
        if workers is not None and workers > gpu_count:
            raise FarmError(
                f"--workers {workers} asks for more workers than GPUs: this machine has {gpu_count} "
                f"GPU{'s' if gpu_count != 1 else ''} and a local CUDA cluster runs one worker per GPU; "
                f"use --workers 1..{gpu_count}"
            )
        n = workers if workers is not None else gpu_count
        wanted = protocol or ("ucx" if n > 1 else "tcp")
        protocol = "ucx" if wanted == "ucx" and ucx_available else "tcp"
        warning = UCX_WARNING if wanted == "ucx" and not ucx_available else None
        # One decode at a time runs on the GPU (farm.worker.tasks' decode thread); the other task threads
        # blend, write Zarr and encode video while it does, so the GPU never waits on I/O.
        io_threads = threads_per_worker or min(8, max(2, cpu_count // n))
        return ClusterChoice("local-cuda", n, protocol, io_threads, warning, 1)

    n = workers if workers is not None else min(cpu_count, MAX_DEFAULT_CPU_WORKERS)
    tpw = threads_per_worker or 1
    warning = None
    if n * tpw > cpu_count:
        warning = (
            f"{n} workers × {tpw} thread{'s' if tpw != 1 else ''} on {cpu_count} CPU "
            f"core{'s' if cpu_count != 1 else ''}: tasks will compete for cores"
        )
    torch_threads = cpu_decode_threads or max(1, cpu_count // (n * tpw))
    return ClusterChoice("local-cpu", n, "tcp", tpw, warning, torch_threads)


def cpu_decode_threads() -> int | None:
    """``farm.cpu-decode-threads``: torch's intra-op threads in each worker of a local CPU cluster, or
    None for ``auto`` (the cores split between the workers).

    The same count on every worker, whatever their number, keeps the frames byte-identical across
    worker counts: torch's CPU convolutions (oneDNN's, and MKL's without it) sum in another order with
    another thread count on some CPUs (a level off in a few pixels of a tiny test render on a Xeon with
    AMX), so 1 worker of 2 threads and 3 workers of 1 can write different bytes. ``auto`` is faster with
    fewer workers than cores, at that cost."""
    value = config.get("cpu-decode-threads")
    if value == "auto":
        return None
    whole = isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).isdigit()
    if not whole or int(value) < 1:
        raise FarmError(
            f"farm.cpu-decode-threads is {value!r}; it takes a whole number of threads (at least 1) or "
            "auto (the cores split between the workers)"
        )
    return int(value)


def detect_gpus() -> int:
    """Number of CUDA devices this process may use (0 on a CPU-only machine or with a CPU build of
    torch), found without importing torch (seconds the driver of a render does not need): the CUDA
    driver's own count, which honours ``CUDA_VISIBLE_DEVICES``."""
    if not _torch_has_cuda():
        return 0
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return int(count.value)


def local_gpu_memory(count: int | None = None) -> int | None:
    """Total memory of the smallest of this machine's first `count` CUDA devices (all by default), read
    from the CUDA driver without importing torch: the GPUs a local CUDA cluster would run on. None
    without GPUs (a local cluster then decodes on CPU workers)."""
    gpus = detect_gpus()
    if not gpus:
        return None
    libcuda = ctypes.CDLL("libcuda.so.1")
    sizes = []
    for index in range(min(gpus, count or gpus)):
        device, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if libcuda.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        if libcuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) == 0 and total.value:
            sizes.append(int(total.value))
    return min(sizes) if sizes else None


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from its ``version.py`` without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return False
    match = re.search(r"^cuda\b[^=]*=\s*(.+)$", text, flags=re.MULTILINE)
    return match is not None and match.group(1).strip() != "None"


def local_decode_workers() -> int:
    """The decode workers `connect` starts on this machine when nothing is said: one per GPU, or up to
    `MAX_DEFAULT_CPU_WORKERS` CPU processes (`farm plan` plans for as many as `farm render` runs)."""
    choice = choose_cluster(scheduler=None, scheduler_file=None, workers=None, gpu_count=detect_gpus(),
                            ucx_available=False, cpu_count=cpu_count())  # fmt: skip
    return choice.n_workers


def ucx_available() -> bool:
    """Whether distributed's UCX backend (package distributed-ucxx, module ``distributed_ucxx``) is
    installed. Looks the module up without importing it."""
    try:
        return importlib.util.find_spec("distributed_ucxx") is not None
    except (ImportError, ValueError):
        return False


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


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


def _quiet_distributed_logs() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


class IgnoreInterruptPlugin(WorkerPlugin):
    """Workers of a local cluster ignore SIGINT: Ctrl-C on a terminal reaches every process of its group,
    and the client, not each worker, decides what an interrupt stops (it closes the cluster quietly).
    Applied to workers that restart later too."""

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
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def scheduler_to_join(scheduler: str | None, scheduler_file: str | None, workers: int | None) -> str | None:
    """The scheduler address `connect` joins: `scheduler`, or with neither it, `scheduler_file` nor
    ``workers`` Dask's ``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``)."""
    if scheduler is None and scheduler_file is None and workers is None:
        return config.scheduler_address()
    return scheduler


def joins_running_cluster(scheduler: str | None, scheduler_file: str | None, workers: int | None) -> bool:
    """Whether `connect` with these arguments joins a running cluster (starts none)."""
    return scheduler_file is not None or scheduler_to_join(scheduler, scheduler_file, workers) is not None


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
                                  ignored_from)  # fmt: skip
    finally:
        if ignored_from:  # the cleanup is over: this process takes Ctrl-C as before (so do its children)
            signal.signal(signal.SIGINT, ignored_from[0])


def _connected(
    choice: ClusterChoice, scheduler: str | None, scheduler_file: str | None, memory_limit: Any,
    io_workers: int | None, stack: contextlib.ExitStack, ignored_from: list[Any],
) -> Iterator[Client]:  # fmt: skip
    """`connect`'s body inside its exit stack: join or start the cluster, yield the client."""
    if choice.kind == "existing":
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
    else:
        cluster = _start_local(choice, memory_limit, stack)
        client = Client(cluster)
        stack.callback(client.close)
        client.register_plugin(IgnoreInterruptPlugin())
        client.register_plugin(QuickExitPlugin())
        if choice.kind == "local-cpu":
            client.register_plugin(TorchThreadsPlugin(choice.torch_threads))
        start_io_workers(cluster, client, choice, io_workers, memory_limit)
    transport_plugin.install(client)
    try:
        yield client
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (farm.cli): stop the cluster without its warnings
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        if choice.kind != "existing":  # our own workers: their cancelled tasks need no warning either
            with contextlib.suppress(Exception):
                client.run(_quiet_distributed_logs, on_error="ignore")
        if threading.current_thread() is threading.main_thread():  # a second Ctrl-C must not cut
            ignored_from.append(signal.signal(signal.SIGINT, signal.SIG_IGN))  # the cleanup short
        raise


IO_WORKER_PREFIX = "farm-io-"  # the names of farm's I/O workers; on other clusters a fallback only
IO_RESOURCE = "farm-io"  # the Dask worker resource that marks an I/O worker (dask worker --resources)


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
    if choice.kind != "local-cuda":
        return 0
    return io_workers_beside_gpus(choice.n_workers, cpu_count)


def io_workers_beside_gpus(n_gpus: int, cpu_count: int) -> int:
    """I/O worker processes a local CUDA cluster starts beside `n_gpus` GPU workers: about one per
    three cores, at most 6 per GPU, at least one."""
    return max(1, min(6 * n_gpus, cpu_count // 3))


def start_io_workers(
    cluster: Any, client: Client, choice: ClusterChoice, io_workers: int | None, memory_limit: Any,
    security: Any = None,
) -> int:  # fmt: skip
    """The I/O workers of a local cluster just started: `io_workers` of them (None: ``farm.io-workers``,
    else `default_io_workers`), joined before this returns their count."""
    chosen = io_workers if io_workers is not None else config.get("io-workers")
    n_io = default_io_workers(choice, cpu_count()) if chosen is None else int(chosen)
    if n_io:
        add_io_workers(cluster, n_io, memory_limit, security=security)
        client.wait_for_workers(choice.n_workers + n_io, timeout=120)
    return n_io


def add_io_workers(cluster: Any, n: int, memory_limit: Any, security: Any = None) -> None:
    """Start `n` CPU-only worker processes in a running local cluster (SpecCluster); `security`: the
    cluster's TLS settings, when it requires encryption."""
    from distributed import Nanny

    for i in range(n):
        cluster.worker_spec[f"{IO_WORKER_PREFIX}{i}"] = {
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
    cluster.sync(cluster._correct_state)


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


def _start_local(choice: ClusterChoice, memory_limit: Any, stack: contextlib.ExitStack) -> LocalCluster:
    cluster = start_local_cluster(
        choice, stack, no_cuda_hint="or connect to a running cluster with --scheduler",
        memory_limit=memory_limit, host="127.0.0.1", dashboard_address="127.0.0.1:0",
        **({"protocol": choice.protocol} if choice.kind == "local-cuda" else {}),
    )  # fmt: skip
    stack.callback(cluster.close)
    return cluster


WARMUP_PRELOAD = "farm.worker.warmup"


def start_local_cluster(
    choice: ClusterChoice, stack: contextlib.ExitStack, *, no_cuda_hint: str, **cluster_kwargs: Any
) -> LocalCluster:
    """Start the local cluster `choice` describes: a ``LocalCUDACluster`` (one worker per GPU) or a
    ``LocalCluster`` of CPU worker processes; `cluster_kwargs` (host, ports, memory limit, protocol…)
    go to its constructor, and `stack` holds the Dask settings it needs while it runs."""
    common = {
        "n_workers": choice.n_workers,
        "threads_per_worker": choice.threads_per_worker,
        **cluster_kwargs,
    }
    # farm places every task itself; stealing moves loosely restricted ones (`stop_work_stealing`). The
    # scheduler reads this once, when it starts: `farm render`'s own and `farm cluster`'s alike.
    stack.enter_context(dask.config.set({"distributed.scheduler.work-stealing": False}))
    if choice.kind != "local-cuda":
        return LocalCluster(processes=True, **common)
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as e:
        raise FarmError(
            f"found {detect_gpus()} GPU(s) but dask-cuda does not import ({e}); install the GPU extras "
            f"(pip install 'farm-decode[cuda]'), {no_cuda_hint}"
        ) from e
    # each GPU worker imports torch and diffusers and makes its CUDA context while it connects
    # (`farm.worker.warmup`), not after its first decode task arrives
    common["preload"] = [*common.get("preload", []), WARMUP_PRELOAD]
    if common.get("protocol") == "ucx":
        # UCX must create the CUDA context before it initialises, on the client and scheduler side too
        # (the scheduler of a local cluster runs in this process). Workers get it from dask-cuda.
        stack.enter_context(dask.config.set({"distributed-ucxx.create-cuda-context": True}))
    return LocalCUDACluster(**common)


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
