"""`farm cluster`: a long-lived scheduler and workers that workflows are submitted to.

One dask-cuda worker per GPU where there are GPUs (UCX when installed), CPU worker processes otherwise
(`farm.run.cluster.choose_cluster` decides), or the workers of the backend ``farm.cluster-backend`` names
(SLURM batch jobs: `farm.run.backends.slurm`). The scheduler writes a scheduler file, serves the dashboard,
the farm page and ``/metrics`` (`farm.dashboard.monitor`), and everything runs until SIGINT or SIGTERM, then
stops cleanly. It listens on 127.0.0.1 unless ``host`` says otherwise; workers on other nodes join
with ``dask cuda worker --scheduler-file F`` (or ``dask worker``) once it listens on a reachable
address. Dask's TLS settings (``distributed.comm.require-encryption`` and ``distributed.comm.tls.*``)
are honoured: the cluster then listens on ``tls://``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distributed import Client
from distributed.comm import parse_address, parse_host_port
from distributed.security import Security

from farm.dashboard import monitor
from farm.errors import FarmError, FarmRuntimeError
from farm.media.beneath import atomic_path
from farm.run import backends
from farm.run.backends import ClusterChoice
from farm.run.backends.setup import set_up_workers, start_cluster
from farm.run.cluster import choose_cluster
from farm.run.machine import cpu_count, cpu_decode_threads, detect_gpus, ucx_available
from farm.run.tls import check_tls
from farm.run.validate import check_local_workers
from farm.safe_read import read_json


def parse_gpus(text: str | None) -> int | None:
    """``--gpus``: ``all`` (None: every GPU there is) or a count ≥ 0 (0: CPU workers even with GPUs)."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise FarmError(f"--gpus {text!r} is invalid; give all or a number of GPUs ≥ 0")
    return n


def exposure_warning(host: str, protocol: str) -> str | None:
    """A warning when the scheduler listens beyond loopback without TLS: whoever reaches its port can run
    code on the workers (Dask runs what clients send)."""
    import ipaddress

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if loopback:
        return None
    if protocol == "tls":
        return dashboard_exposure(host)
    return (
        f"listening on {host} without TLS: anyone who can reach the scheduler's port can run code on the "
        "workers as this user. Require TLS: set distributed.comm.require-encryption: true and "
        "distributed.comm.tls.{ca-file,scheduler,worker,client} in the Dask configuration of every node "
        "(docs/clusters.md, 'TLS on a multi-node farm'), or listen on 127.0.0.1"
    )


def dashboard_exposure(host: str) -> str | None:
    """A warning when the comm is TLS but the dashboard (the farm page, its JSON, ``/metrics``) is plain
    HTTP beyond loopback: Dask serves it over TLS only with ``distributed.scheduler.dashboard.tls.cert``
    and ``.key`` set."""
    import dask.config

    tls = dask.config.get("distributed.scheduler.dashboard.tls", {}) or {}
    if tls.get("cert") and tls.get("key"):
        return None
    return (
        f"the comm is TLS but the dashboard (the farm page, its JSON, /metrics) is plain HTTP on {host}: "
        "anyone on the network can read it. Serve it over TLS (distributed.scheduler.dashboard.tls.cert and "
        ".key), put it behind a TLS proxy, or keep it on 127.0.0.1 (docs/clusters.md, 'The dashboard on a "
        "shared network')"
    )


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """A FarmRuntimeError naming the option when a fixed port (not 0) is already taken on `host`.

    The probe binds with SO_REUSEADDR, as the scheduler and the dashboard do: a port left in
    TIME_WAIT by a cluster just stopped is free to them, while a port something listens on is not."""
    import socket

    for option, port in ports.items():
        if port == 0:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                raise FarmRuntimeError(
                    f"{option} {port}: {host}:{port} is taken ({exc.strerror}): is another cluster running "
                    "there? choose another port, or 0 for any free one"
                ) from None


def _checked_gpu_count(
    gpus: int | None, workers: int | None, protocol: str | None, io_workers: int | None
) -> int:
    """This machine's GPUs `start` takes, once its options are known good (FarmError before anything
    starts); none for a backend whose workers run elsewhere, which checks its own options."""
    if io_workers is not None and io_workers < 0:
        raise FarmError(f"--io-workers {io_workers} is invalid; give a number ≥ 0")
    backend = backends.configured()
    if backend is not None and not backend.on_this_machine:
        if gpus is not None:
            raise FarmError(f"--gpus counts this machine's GPUs, and the {backend.name} backend's workers "
                            "run elsewhere; leave out --gpus (its own options say how many GPUs its workers "
                            "take)")  # fmt: skip
        return 0
    found = detect_gpus()
    if gpus is not None and gpus > found:
        raise FarmError(f"--gpus {gpus} asks for more GPUs than this machine has ({found})")
    gpu_count = found if gpus is None else gpus
    if protocol not in (None, "tcp", "ucx"):
        raise FarmError(f"--protocol {protocol!r} is invalid; use ucx or tcp")
    if protocol == "ucx" and (gpu_count == 0 or not ucx_available()):
        raise FarmError(
            "--protocol ucx needs GPUs and distributed-ucxx (pip install 'farm-decode[cuda]'); "
            "use --protocol tcp, or leave it out"
        )
    if gpu_count and workers is not None:
        raise FarmError("--workers sets CPU workers; with GPUs use --gpus N (one worker per GPU) or --gpus 0")
    if not gpu_count:
        check_local_workers(workers)
    return gpu_count


def start(
    *,
    gpus: int | None = None,
    workers: int | None = None,
    protocol: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8786,
    dashboard_port: int = 8787,
    scheduler_file: str | None = None,
    threads_per_worker: int | None = None,
    memory_limit: str | None = "auto",
    io_workers: int | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Start the cluster; returns (cluster, client, facts) where facts say what was started.

    `io_workers`: CPU-only worker processes (``farm-io-N``) that write and encode beside GPU workers, as
    ``farm render`` starts for its own cluster (None: ``farm.io-workers``, else about one per 3 cores,
    at most 6 per GPU; none beside CPU workers)."""
    gpu_count = _checked_gpu_count(gpus, workers, protocol, io_workers)
    choice = choose_cluster(
        scheduler=None,
        scheduler_file=None,
        workers=gpu_count if gpu_count else workers,
        gpu_count=gpu_count,
        ucx_available=ucx_available(),  # `protocol` ("tcp") overrides it
        cpu_count=cpu_count(),
        threads_per_worker=threads_per_worker,
        protocol=protocol,
        cpu_decode_threads=cpu_decode_threads(),
    )
    check_tls()
    check_ports_free(host, {"--port": port, "--dashboard-port": dashboard_port})
    security = Security()  # from Dask's configuration: TLS when it requires encryption
    wire = _wire_protocol(choice, security)
    if scheduler_file:
        check_scheduler_file_free(Path(scheduler_file))
        Path(scheduler_file).parent.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = {
        "host": host,
        "scheduler_port": port,
        "dashboard_address": f"{host}:{dashboard_port}",
        "memory_limit": memory_limit,
        "protocol": wire,
        "security": security,
    }  # the scheduler file is written here (`write_scheduler_file`), not by Dask, which removes it blindly
    stack = contextlib.ExitStack()
    cluster = _start_local(choice, stack, common, host, port, dashboard_port)
    client = Client(cluster, set_as_default=False)
    tls = security if security.require_encryption else None
    try:
        done = set_up_workers(cluster, client, choice, io_workers=io_workers, memory_limit=memory_limit,
                              security=tls, page=True)  # fmt: skip
    except BaseException:  # I/O workers that never joined, say: nothing of the cluster outlives the error
        with contextlib.suppress(Exception):
            client.close(timeout=10)
        with contextlib.suppress(Exception):
            cluster.close(timeout=30)
        stack.close()
        raise
    identity = None
    if scheduler_file:
        info = {**cluster.scheduler_info, "address": cluster.scheduler_address}
        identity = write_scheduler_file(Path(scheduler_file), info)
    facts = {
        "label": choice.backend.label,
        "workers": choice.n_workers,
        "io_workers": done.io_workers,
        "threads_per_worker": choice.threads_per_worker,
        "protocol": wire,
        "address": cluster.scheduler_address,
        "dashboard": monitor.dashboard_link(client),
        "page": done.page,
        "scheduler_file": scheduler_file,
        "scheduler_id": identity,
        "warning": choice.warning,
        "exposure": exposure_warning(host, wire),
        "_stack": stack,
    }
    return cluster, client, facts


def _wire_protocol(choice: ClusterChoice, security: Security) -> str:
    """The cluster's comm protocol: the chosen one, or TLS where Dask's configuration requires it."""
    if not security.require_encryption:
        return choice.protocol
    if choice.protocol == "ucx":
        raise FarmError("the Dask configuration requires TLS, which UCX lacks; use --protocol tcp")
    return "tls"


def _start_local(
    choice: ClusterChoice, stack: contextlib.ExitStack, common: dict[str, Any], host: str, port: int,
    dashboard_port: int,
) -> Any:
    """The local cluster `choice` describes, or a `FarmRuntimeError` that says why it could not start."""
    try:
        return start_cluster(choice, stack, hint="or start CPU workers with --gpus 0", **common)
    except (OSError, RuntimeError, TypeError, ValueError) as exc:  # LocalCluster wraps what stopped it
        stack.close()
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        raise FarmRuntimeError(
            f"could not start the scheduler on {host}:{port} (dashboard {dashboard_port}): "
            f"{type(cause).__name__}: {cause}; is another cluster running? choose other ports with --port "
            "and --dashboard-port (0 = any free)"
        ) from None


def scheduler_listening(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts connections at a scheduler address (``tcp://host:port``)."""
    try:
        _, location = parse_address(address)
        host, port = parse_host_port(location)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError, TypeError):
        return False


def check_scheduler_file_free(path: Path) -> None:
    """A scheduler file may be written only where none is, or where the one there names a scheduler that
    no longer listens (left by a cluster that was killed); anything else is refused, untouched."""
    if not path.exists() and not path.is_symlink():
        return
    try:
        address = read_json(path, f"--scheduler-file {str(path)!r}", limit=1024 * 1024)["address"]
    except (OSError, FarmError, KeyError, TypeError):
        raise FarmError(
            f"--scheduler-file {str(path)!r} exists and is not a Dask scheduler file; choose another path "
            "(nothing was changed)"
        ) from None
    if scheduler_listening(str(address)):
        raise FarmError(
            f"--scheduler-file {str(path)!r} belongs to a running scheduler ({address}); stop that cluster "
            "or choose another --scheduler-file"
        )


def write_scheduler_file(path: Path, info: dict[str, Any]) -> str:
    """Write the scheduler file (Dask's format: the scheduler's identity, its ``address`` first of all)
    in one rename; returns the id that makes it this cluster's (`remove_own_scheduler_file`)."""
    keep = ("type", "id", "address", "services", "started")
    record = {k: info[k] for k in keep if k in info}
    record.setdefault("id", f"farm-{os.getpid()}-{id(info)}")
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2))
    return str(record["id"])


def remove_own_scheduler_file(path: Path, identity: str | None) -> None:
    """Remove the scheduler file only while it is still this cluster's (another may have replaced it)."""
    try:
        if read_json(path, f"scheduler file {path}", limit=1024 * 1024).get("id") == identity:
            path.unlink()
    except (OSError, FarmError, AttributeError):
        pass


def serve(
    *,
    log: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    **options: Any,
) -> int:
    """Start the cluster (options as :func:`start`), print where it is, run until SIGINT/SIGTERM or
    `stop`, then close it and remove the scheduler file."""
    stop = stop or threading.Event()
    cluster, client, facts = start(**options)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        for warning in (facts["warning"], facts["exposure"]):
            if warning:
                log(f"farm cluster: warning: {warning}")
        log(f"farm cluster: scheduler {facts['address']}")
        if facts["dashboard"]:
            log(f"farm cluster: dashboard {facts['dashboard']}")
        if facts["page"]:
            log(f"farm cluster: farm page {facts['page']}")
        log(f"farm cluster: {facts['workers']} {facts['label']} worker(s) x {facts['threads_per_worker']} "
            f"thread(s), protocol {facts['protocol']}")  # fmt: skip
        if facts["io_workers"]:
            log(f"farm cluster: {facts['io_workers']} I/O worker(s) (farm-io-*) for the writes and encodes")
        target = f"--scheduler-file {facts['scheduler_file']}" if facts["scheduler_file"] else (
            f"--scheduler {facts['address']}")  # fmt: skip
        if facts["scheduler_file"]:
            log(f"farm cluster: scheduler file {facts['scheduler_file']}")
        log(f"farm cluster: ready; submit with `farm submit WORKFLOW.py {target}`; Ctrl-C stops the cluster")
        while not stop.wait(0.5):
            pass
        log("farm cluster: stopping")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(Exception):
            client.close(timeout=10)
        with contextlib.suppress(Exception):
            cluster.close(timeout=30)
        facts["_stack"].close()
        if facts["scheduler_file"]:
            remove_own_scheduler_file(Path(facts["scheduler_file"]), facts["scheduler_id"])
    log("farm cluster: stopped")
    return 0
