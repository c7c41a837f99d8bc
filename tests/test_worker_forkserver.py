"""Local workers forked from farm's worker forkserver (`farm.run.worker_forkserver`): a `farm cluster` started
as a user starts it has workers that are children of one server process which imported torch before any of
them existed (not of their Nannies), restarted workers too; with ``farm.fork-workers: false`` Dask spawns them
from their Nannies as before. Which commands start the server is decided from their arguments alone."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import dask.config
import pytest

from farm.run import worker_forkserver
from farm.run.forkserver_imports import DECODER_MODULES
from farm.run.machine import detect_gpus
from tests.test_workflows import FarmCluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the forkserver is Linux's")


def _processes(cluster: FarmCluster) -> dict[str, tuple[int, int, bool]]:
    """Per worker: its pid, its parent's pid, and whether torch was imported before any task of this test."""

    def facts() -> tuple[int, int, bool]:
        return os.getpid(), os.getppid(), "torch" in sys.modules

    return cluster.client.run(facts)


def _decoder_code(cluster: FarmCluster) -> dict[str, bool]:
    """Per worker: whether diffusers' shared model code was imported before any task of this test."""

    def imported() -> bool:
        return "diffusers.models.modeling_utils" in sys.modules

    return cluster.client.run(imported)


@pytest.mark.cluster
def test_farm_clusters_workers_fork_from_one_server_that_imported_torch(tmp_path):
    cluster = FarmCluster(tmp_path, 2)
    try:
        workers = _processes(cluster)
        nannies = cluster.client.run(os.getpid, nanny=True)
        assert len(workers) == 2, workers
        parents = {parent for _, parent, _ in workers.values()}
        assert len(parents) == 1, workers  # one server for every worker
        assert parents.isdisjoint(nannies.values()), (workers, nannies)  # not spawned by their Nannies
        assert parents != {cluster.proc.pid}
        assert all(torch for _, _, torch in workers.values()), workers
        # no GPU here: CPU workers find diffusers' model code imported by the server, once for all
        assert all(_decoder_code(cluster).values())

        # a lost worker comes back forked from the same server
        lost = sorted(workers)[0]
        with contextlib.suppress(Exception):  # the worker dies under the call
            cluster.client.run(os._exit, 1, workers=[lost])
        deadline = time.time() + 60
        while True:
            again = _processes(cluster)
            if len(again) == 2 and workers[lost][0] not in {pid for pid, _, _ in again.values()}:
                break
            assert time.time() < deadline, again
            time.sleep(0.2)
        assert {parent for _, parent, _ in again.values()} == parents, again
    finally:
        assert cluster.stop() == 0


@pytest.mark.cluster
def test_with_fork_workers_off_nannies_spawn_their_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_FARM__FORK_WORKERS", "false")
    cluster = FarmCluster(tmp_path, 1)
    try:
        workers = _processes(cluster)
        nannies = cluster.client.run(os.getpid, nanny=True)
        assert {parent for _, parent, _ in workers.values()} == set(nannies.values()), (workers, nannies)
    finally:
        assert cluster.stop() == 0


def test_only_a_command_starting_a_local_cluster_starts_the_server(monkeypatch):
    started: list[bool] = []
    monkeypatch.setattr(worker_forkserver, "start_worker_imports", lambda: started.append(True) or True)

    assert worker_forkserver.forked_local_workers(joins=True) == {}  # --scheduler, DASK_SCHEDULER_ADDRESS
    with dask.config.set({"farm.cluster-backend": "slurm"}):  # named outright: its workers may be elsewhere
        assert worker_forkserver.forked_local_workers(joins=False) == {}
    assert started == []
    settings = worker_forkserver.forked_local_workers(joins=False)
    assert settings == {"distributed.worker.multiprocessing-method": "forkserver"}
    assert started == [True]


def test_the_setting_and_the_platform_can_keep_dask_spawning(monkeypatch):
    with dask.config.set({"farm.fork-workers": False}):
        assert worker_forkserver.start_worker_imports() is False
        assert worker_forkserver.forked_local_workers(joins=False) == {}
    monkeypatch.setattr(sys, "platform", "darwin")
    assert worker_forkserver.start_worker_imports() is False


def test_the_server_gets_the_environment_a_nanny_gives_spawned_workers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: kept, as a Nanny keeps it
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        environment = worker_forkserver.pre_spawn_environment()
    assert environment["OMP_NUM_THREADS"] == "3"
    assert environment["MKL_NUM_THREADS"] == "1"  # distributed's default
    assert "MALLOC_TRIM_THRESHOLD_" not in environment  # None: left as it is


def test_a_refused_render_leaves_no_server_holding_its_output(tmp_path):
    """A render refused in its first moment (no such job) exits, and the pipe reading its output closes
    with it: the server, still importing torch, ends with the command."""
    started = time.monotonic()
    command = [sys.executable, "-m", "farm", "render", str(tmp_path / "no-such-job"), "--out",
               str(tmp_path / "out")]  # fmt: skip
    refused = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code = refused.wait(timeout=60)
    exited = time.monotonic()
    out, err = refused.communicate(timeout=60)  # returns when every holder of the pipes has closed them
    assert code != 0 and "farm: error:" in err, err
    assert time.monotonic() - exited < 1.0, "the forkserver kept the command's output open"
    assert exited - started < 60


def test_imported_elsewhere_the_module_changes_nothing():
    code = ("import atexit; atexit.register(print, 'teardown ran'); import farm.run.forkserver_exit; "
            "print('output kept', end='')")  # fmt: skip
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (plain.returncode, plain.stdout) == (0, "output kept" + "teardown ran\n"), plain
    code = "import sys, farm.run.forkserver_imports; print('diffusers' in sys.modules)"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (plain.returncode, plain.stdout) == (0, "False\n"), plain


def test_the_server_imports_diffusers_for_every_worker():
    """The server imports diffusers' model code once for all the workers it forks, GPU workers too."""
    code = ("import sys, json; from farm.run.forkserver_imports import import_decoder_code as imp; "
            "print(json.dumps(['diffusers' in sys.modules, imp()]))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [False, list(DECODER_MODULES)]


# The server's imports under its NVML check, then a fork whose child uses CUDA, as a forked worker does.
FORKED_CUDA = """
import os, sys, torch
from farm.run.forkserver_imports import import_decoder_code
print(len(import_decoder_code()) == 2 and torch.cuda.is_available(), flush=True)
pid = os.fork()
if pid == 0:
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception:
        os._exit(1)
    os._exit(0)
print(os.waitpid(pid, 0)[1] == 0)
"""


@pytest.mark.skipif(not detect_gpus(), reason="needs a GPU (runs on the device machine)")
def test_the_servers_imports_leave_cuda_to_the_forked_workers():
    environment = {**os.environ, worker_forkserver.NVML_CHECK: "1"}
    run = subprocess.run([sys.executable, "-c", FORKED_CUDA], capture_output=True, text=True, timeout=120,
                         env=environment)  # fmt: skip
    assert run.stdout.split() == ["True", "True"], (run.stdout, run.stderr)
