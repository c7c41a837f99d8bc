"""farm.run.cluster: the pure choice, a real local CPU cluster, and joining a running cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
from distributed import Client

import farm
from farm.dashboard import monitor
from farm.errors import FarmError
from farm.run import cluster
from farm.run.backends.setup import QuickExitPlugin
from farm.run.cluster import ClusterChoice, choose_cluster, connect, workers_info
from farm.worker import transport


def choose(**kw):
    args = dict(
        scheduler=None, scheduler_file=None, workers=None, gpu_count=0, ucx_available=False, cpu_count=8
    )
    args.update(kw)
    return choose_cluster(**args)


# --- choose_cluster --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        # an existing cluster
        (dict(scheduler="tcp://10.0.0.5:8786"), ClusterChoice("existing", 0, "tcp", 0, None, 0)),
        (dict(scheduler="10.0.0.5:8786", gpu_count=8), ClusterChoice("existing", 0, "tcp", 0, None, 0)),
        (dict(scheduler="ucx://10.0.0.5:8786"), ClusterChoice("existing", 0, "ucx", 0, None, 0)),
        (dict(scheduler_file="/shared/sched.json"), ClusterChoice("existing", 0, "", 0, None, 0)),
        # local CUDA: one worker per GPU
        (dict(gpu_count=4, ucx_available=True), ClusterChoice("local-cuda", 4, "ucx", 2, None, 1)),
        (dict(gpu_count=4, ucx_available=True, workers=2), ClusterChoice("local-cuda", 2, "ucx", 4, None, 1)),
        # one GPU worker: nothing moves between GPUs, so TCP (its task round trips are faster) unless asked
        (dict(gpu_count=1, ucx_available=True, workers=1), ClusterChoice("local-cuda", 1, "tcp", 8, None, 1)),
        (dict(gpu_count=4, ucx_available=True, workers=1), ClusterChoice("local-cuda", 1, "tcp", 8, None, 1)),
        (dict(gpu_count=1, ucx_available=False), ClusterChoice("local-cuda", 1, "tcp", 8, None, 1)),
        (
            dict(gpu_count=1, ucx_available=True, protocol="ucx"),
            ClusterChoice("local-cuda", 1, "ucx", 8, None, 1),
        ),
        (
            dict(gpu_count=2, ucx_available=True, protocol="tcp"),
            ClusterChoice("local-cuda", 2, "tcp", 4, None, 1),
        ),
        (
            dict(gpu_count=2, ucx_available=True, threads_per_worker=2),
            ClusterChoice("local-cuda", 2, "ucx", 2, None, 1),
        ),
        # local CPU
        (dict(cpu_count=16), ClusterChoice("local-cpu", 4, "tcp", 1, None, 4)),
        (dict(cpu_count=8), ClusterChoice("local-cpu", 4, "tcp", 1, None, 2)),
        (dict(cpu_count=2), ClusterChoice("local-cpu", 2, "tcp", 1, None, 1)),
        (dict(cpu_count=1), ClusterChoice("local-cpu", 1, "tcp", 1, None, 1)),
        (dict(cpu_count=0), ClusterChoice("local-cpu", 1, "tcp", 1, None, 1)),
        (dict(cpu_count=8, workers=1), ClusterChoice("local-cpu", 1, "tcp", 1, None, 8)),
        (dict(cpu_count=8, workers=3), ClusterChoice("local-cpu", 3, "tcp", 1, None, 2)),
        (
            dict(cpu_count=8, workers=2, threads_per_worker=2),
            ClusterChoice("local-cpu", 2, "tcp", 2, None, 2),
        ),
        # ucx_available means nothing without GPUs
        (dict(cpu_count=4, ucx_available=True), ClusterChoice("local-cpu", 4, "tcp", 1, None, 1)),
    ],
)
def test_choose_cluster(kw, expected):
    assert choose(**kw) == expected


def test_gpus_without_ucx_use_tcp_and_warn():
    choice = choose(gpu_count=2, ucx_available=False)
    assert (choice.kind, choice.n_workers, choice.protocol) == ("local-cuda", 2, "tcp")
    assert choice.warning is not None
    assert "host memory" in choice.warning and "\n" not in choice.warning


def test_more_cpu_workers_than_cores_warns():
    choice = choose(cpu_count=2, workers=6)
    assert (choice.kind, choice.n_workers, choice.torch_threads) == ("local-cpu", 6, 1)
    assert choice.warning == "6 workers × 1 thread on 2 CPU cores: tasks will compete for cores"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(scheduler="tcp://a:8786", scheduler_file="s.json"),
            r"both --scheduler \(tcp://a:8786\) and --scheduler-file \(s.json\) were given",
        ),
        (
            dict(scheduler="tcp://a:8786", workers=2),
            "--workers starts a local cluster; it cannot be combined with --scheduler:",
        ),
        (
            dict(scheduler_file="s.json", workers=2),
            "--workers starts a local cluster; it cannot be combined with --scheduler-file:",
        ),
        (
            dict(scheduler="tcp://a:8786", threads_per_worker=2),
            "threads per worker apply to a local cluster; they cannot be combined with --scheduler",
        ),
        (dict(workers=0), "--workers must be at least 1, got 0"),
        (dict(workers=-3, gpu_count=2), "--workers must be at least 1, got -3"),
        (dict(workers=0, scheduler="tcp://a:8786"), "--workers must be at least 1, got 0"),
        (dict(threads_per_worker=0), "threads per worker must be at least 1, got 0"),
        (
            dict(gpu_count=2, workers=3, ucx_available=True),
            r"--workers 3 asks for more workers than GPUs: this machine has 2 GPUs .* use --workers 1..2",
        ),
        (
            dict(gpu_count=1, workers=2),
            r"this machine has 1 GPU and a local CUDA cluster runs one worker per GPU; use --workers 1..1",
        ),
    ],
)
def test_choose_cluster_errors(kw, message):
    with pytest.raises(FarmError, match=message):
        choose(**kw)


def test_detection_on_this_machine():
    import torch

    assert cluster.detect_gpus() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert isinstance(cluster.ucx_available(), bool)
    import importlib.util

    assert cluster.ucx_available() == (importlib.util.find_spec("distributed_ucxx") is not None)


# --- a local CPU cluster ---------------------------------------------------------------------------


@pytest.fixture
def dask_cuda_tripwire(tmp_path, monkeypatch):
    """A `dask_cuda` module first on sys.path (workers inherit it): importing it is detectable in
    sys.modules whether or not the real dask-cuda is installed."""
    (tmp_path / "dask_cuda.py").write_text("TRIPWIRE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    assert "dask_cuda" not in sys.modules
    yield
    sys.modules.pop("dask_cuda", None)


def _imported(name: str) -> bool:
    return name in sys.modules


@pytest.mark.skipif(cluster.detect_gpus() > 0, reason="a machine with GPUs starts a CUDA cluster")
@pytest.mark.cluster
def test_connect_local_cpu_cluster(dask_cuda_tripwire):
    expected = choose_cluster(
        scheduler=None,
        scheduler_file=None,
        workers=2,
        gpu_count=0,
        ucx_available=False,
        cpu_count=cluster.cpu_count(),
    )
    with connect(workers=2) as client:
        local_cluster = client.cluster
        info = client.scheduler_info(n_workers=-1)
        assert len(info["workers"]) == 2
        assert all(addr.startswith("tcp://127.0.0.1:") for addr in info["workers"])
        assert info["address"].startswith("tcp://127.0.0.1:")
        assert {w["nthreads"] for w in info["workers"].values()} == {1}

        assert not _imported("dask_cuda")
        assert set(client.run(_imported, "dask_cuda").values()) == {False}
        assert set(client.run(transport.is_registered).values()) == {True}
        assert transport.is_registered()

        import torch

        assert set(client.run(torch.get_num_threads).values()) == {expected.torch_threads}
        assert set(client.run(_plugin_names).values()) == {True}

        link = monitor.dashboard_link(client)
        assert link is None or link.startswith("http://127.0.0.1:")
        assert client.submit(lambda x: x + 1, 41).result() == 42
    assert client.status == "closed"
    assert local_cluster.status.name == "closed"
    assert not _imported("dask_cuda")


def _plugin_names(dask_worker=None) -> bool:
    return "farm-quick-exit" in dask_worker.plugins


def _close_like_a_worker_process(marker: str, log: str) -> None:
    """A worker process's end, as `QuickExitPlugin` meets it: an exit handler registered earlier, a line
    logged and text left in a buffered stream, then the plugin's teardown."""
    import atexit
    import logging
    import pathlib

    atexit.register(lambda: pathlib.Path(marker).write_text("ran"))
    stream = open(log, "w", buffering=1 << 16)  # noqa: SIM115 (left open: the exit must flush it)
    logging.basicConfig(stream=stream, force=True)
    logging.getLogger("check").warning("logged before exit")
    QuickExitPlugin().teardown(None)
    sys.exit(3)  # what a closing worker process does next: exit, here through the handlers


def test_quick_exit_skips_the_interpreter_teardown_and_keeps_what_was_written(tmp_path):
    """A worker process of farm's own clusters, its worker closed (`QuickExitPlugin.teardown`), exits
    without Python's teardown: exit handlers registered before it never run, and what it logged still
    arrives. In the process that started the cluster (a worker in the user's own process) it does
    nothing: that process' exit handlers and exit code stay its own."""
    import multiprocessing

    marker, log = tmp_path / "teardown-ran", tmp_path / "worker.log"
    child = multiprocessing.get_context("spawn").Process(target=_close_like_a_worker_process,
                                                         args=(str(marker), str(log)))  # fmt: skip
    child.start()
    child.join(120)
    assert child.exitcode == 0 and not marker.exists()
    assert "logged before exit" in log.read_text()
    code = ("import sys; from tests.test_cluster import _close_like_a_worker_process as close; "
            "close(sys.argv[1], sys.argv[2])")
    done = subprocess.run([sys.executable, "-c", code, str(marker), str(log)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.returncode == 3 and marker.read_text() == "ran", done.stderr


@pytest.mark.skipif(cluster.detect_gpus() > 0, reason="a machine with GPUs starts a CUDA cluster")
@pytest.mark.cluster
def test_cpu_workers_decode_with_one_thread_count_unless_auto():
    """`farm.cpu-decode-threads`: every local CPU worker runs torch with the same thread count whatever
    their number (the bytes then do not depend on it); auto gives one worker the cores."""
    import torch

    with connect(workers=1) as client:
        assert set(client.run(torch.get_num_threads).values()) == {1}
    with dask.config.set({"farm.cpu-decode-threads": "auto"}), connect(workers=1) as client:
        assert set(client.run(torch.get_num_threads).values()) == {cluster.cpu_count()}
    with dask.config.set({"farm.cpu-decode-threads": 2}), connect(workers=2) as client:
        assert set(client.run(torch.get_num_threads).values()) == {2}
    for bad in (0, "two", -1, True, 1.5):
        with dask.config.set({"farm.cpu-decode-threads": bad}), pytest.raises(FarmError) as err:
            cluster.cpu_decode_threads()
        assert f"farm.cpu-decode-threads is {bad!r}; it takes a whole number" in str(err.value)


# --- an existing cluster: scheduler and workers in their own processes -----------------------------


def _farm_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(farm.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def running_cluster(tmp_path_factory):
    """`dask scheduler` and `dask worker` processes, as someone would start them on a farm."""
    sched_file = tmp_path_factory.mktemp("cluster") / "scheduler.json"
    env = _farm_env()
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                 "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not write its file"
            assert procs[0].poll() is None, "the scheduler exited"
            time.sleep(0.1)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(sched_file),
                 "--host", "127.0.0.1", "--nworkers", "2", "--nthreads", "1", "--no-dashboard"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        with Client(scheduler_file=str(sched_file)) as c:
            c.wait_for_workers(2, timeout=60)
        yield sched_file
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_connect_to_existing_cluster_by_scheduler_file(running_cluster):
    # Defined here, not at module level, so that they travel by value: the scheduler and workers
    # started from the command line cannot import this test module.
    def make_bf16(n):
        import torch

        return torch.arange(n, dtype=torch.float32).to(torch.bfloat16).reshape(2, -1)

    def total(t):
        return float(t.float().sum())

    def farm_modules():
        import sys

        return sorted(m for m in sys.modules if m == "farm" or m.startswith("farm."))

    with connect(scheduler_file=str(running_cluster)) as client:
        a, b = sorted(workers_info(client))
        assert set(client.run(transport.is_registered).values()) == {True}

        # A bfloat16 tensor moves from worker a to worker b (distributed's own serializer cannot).
        t = client.submit(make_bf16, 64, workers=[a], pure=False)
        s = client.submit(total, t, workers=[b], pure=False)
        assert s.result() == float(sum(range(64)))
        stats = client.run(transport.transport_stats)
        assert stats[a]["dask_serialized"] >= 1 and stats[b]["dask_deserialized"] >= 1

        # Through the scheduler, which has no farm registration: it forwards frames untouched.
        back = client.gather(t, direct=False)
        assert back.shape == (2, 32) and float(back.float().sum()) == float(sum(range(64)))
        [f] = client.scatter([back], direct=False)
        assert client.submit(total, f, workers=[b], pure=False).result() == float(sum(range(64)))
        assert client.run_on_scheduler(farm_modules) == []

    # Leaving connect() closed the client only: the cluster and its workers are still there.
    with Client(scheduler_file=str(running_cluster)) as other:
        assert len(workers_info(other)) == 2
        assert other.submit(lambda: 7).result() == 7


def test_connect_to_existing_cluster_by_address(running_cluster):
    address = json.loads(running_cluster.read_text())["address"]
    with connect(scheduler=address) as client:
        assert len(workers_info(client)) == 2
        link = monitor.dashboard_link(client)
        assert link is None or link.startswith("http://127.0.0.1:")
    with Client(address) as other:
        assert len(workers_info(other)) == 2


def test_connect_refuses_a_missing_scheduler_file(tmp_path):
    start = time.monotonic()
    with (
        pytest.raises(FarmError, match=r"scheduler file .*nope.json does not exist"),
        connect(scheduler_file=str(tmp_path / "nope.json")),
    ):
        pass
    assert time.monotonic() - start < 5


def test_connect_reports_an_unreachable_scheduler():
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "1s"}),
        pytest.raises(FarmError, match=r"could not connect to a scheduler at tcp://127.0.0.1:9"),
        connect(scheduler="tcp://127.0.0.1:9"),
    ):
        pass


def test_connect_rejects_workers_with_scheduler():
    with (
        pytest.raises(
            FarmError, match="--workers starts a local cluster; it cannot be combined with --scheduler"
        ),
        connect(scheduler="tcp://127.0.0.1:9", workers=2),
    ):
        pass


@pytest.mark.cluster
def test_an_interrupt_leaves_the_processs_ctrl_c_as_it_was():
    """connect() ignores a second Ctrl-C while it stops a cluster after the first, then restores the
    handler: a process that goes on (a test run, a notebook) and the children it starts later still
    stop on Ctrl-C (children inherit an ignored SIGINT)."""
    import signal

    from farm.run.cluster import connect

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), connect(workers=1):
        raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is before


def _stealing_runs(dask_scheduler=None) -> bool:
    return "stealing" in dask_scheduler.periodic_callbacks


@pytest.mark.skipif(cluster.detect_gpus() > 0, reason="a machine with GPUs starts a CUDA cluster")
@pytest.mark.cluster
def test_no_work_stealing_on_the_clusters_farm_starts_or_joins(dask_cuda_tripwire):
    """Dask steals loosely restricted tasks, which farm's are (a lost worker's tiles run elsewhere): it
    moved blends onto I/O workers on a GPU node. The clusters farm starts (`farm render`'s own, `farm
    cluster`) run without it; a scheduler farm joins has it stopped, once, and says so."""
    from distributed import LocalCluster

    from farm.run import clusterd

    with connect(workers=2) as client:
        assert "stealing" not in client.cluster.scheduler.extensions
        assert client.submit(lambda x: x + 1, 1).result() == 2
    started, daemon_client, facts = clusterd.start(gpus=0, workers=1, port=0, dashboard_port=0, io_workers=0)
    try:
        assert "stealing" not in started.scheduler.extensions
    finally:
        daemon_client.close()
        started.close()
        facts["_stack"].close()
    # someone else's scheduler, with Dask's default (stated here: a cluster fixture of this test process
    # may hold farm's setting while it runs): stealing runs until farm joins
    with (
        dask.config.set({"distributed.scheduler.work-stealing": True}),
        LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as theirs,
    ):
        with Client(theirs) as other:
            assert other.run_on_scheduler(_stealing_runs)
        with connect(scheduler=theirs.scheduler_address) as client:
            assert not client.run_on_scheduler(_stealing_runs)
            assert not cluster.stop_work_stealing(client)  # already stopped: nothing to do
            assert client.submit(lambda x: x + 1, 1).result() == 2
            with connect(scheduler=theirs.scheduler_address) as second:  # a second farm client
                assert not second.run_on_scheduler(_stealing_runs)
            assert not client.run_on_scheduler(_stealing_runs)  # still held off by the first
        with Client(theirs) as other:  # the last farm client left: their scheduler is as farm found it
            assert other.run_on_scheduler(_stealing_runs)
