"""The SLURM backend against a real one-node SLURM (munged, slurmctld and slurmd started for this module,
`tests/slurm_node.py`; skipped, saying why, where SLURM is not installed or cannot start): `farm cluster
--backend slurm` asks for CPU worker jobs and an I/O worker job through dask-jobqueue, a render through it
writes the same bytes as one on a local cluster, and stopping it cancels its jobs. Also the SLURMRunner
form, ``srun -n 3 python -m farm.run.srun render …`` in an allocation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest
from distributed import Client

import farm
from farm.errors import FarmError
from farm.run import backends
from farm.run.backends.slurm import job_options
from farm.run.cluster import choose_cluster, workers_info
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output
from tests.slurm_node import PARTITION, SlurmUnavailable, slurm_node

ROOT = Path(__file__).resolve().parents[1]
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
pytestmark = pytest.mark.slow  # child processes: SLURM's daemons, farm cluster, the jobs' workers


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment of a command that uses the running one-node SLURM: its slurm.conf, small jobs
    (2 GiB workers) and the jobs' output under the test's folder."""
    pytest.importorskip("dask_jobqueue", reason="the SLURM backend needs dask-jobqueue (farm-decode[slurm])")
    folder = tmp_path_factory.mktemp("slurm")
    node = slurm_node(folder / "daemons")
    try:
        conf = node.__enter__()
    except SlurmUnavailable as exc:
        pytest.skip(f"no SLURM to test against: {exc}")
    try:
        yield {**os.environ, "SLURM_CONF": str(conf), "DASK_FARM__SLURM_MEMORY": "2GiB",
               "DASK_JOBQUEUE__SLURM__LOG_DIRECTORY": str(folder / "jobs"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    finally:
        node.__exit__(None, None, None)


def squeue(env: dict[str, str]) -> list[str]:
    done = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], env=env, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def assert_cancelled(env: dict[str, str], within_s: float = 60) -> None:
    """Every job of the stopped cluster cancelled: none running or waiting to run now (SLURM may still show
    one COMPLETING while it ends its processes), the queue empty within `within_s` seconds."""
    left = squeue(env)
    assert all(job.endswith("COMPLETING") for job in left), left
    deadline = time.monotonic() + within_s
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = squeue(env)
    assert left == [], left


class Lines:
    """A child process's output, read as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.time() + timeout
        while True:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"no {text!r} within {timeout} s:\n" + "\n".join(self.lines))
            time.sleep(0.1)


def test_a_farm_cluster_on_slurm_renders_the_bytes_of_a_local_one(slurm_env, tiny_job, tmp_path, scheduler3):
    scheduler_file = tmp_path / "scheduler.json"
    command = [sys.executable, "-m", "farm", "cluster", "--backend", "slurm", "--slurm-jobs", "2",
               "--io-workers", "1", "--partition", PARTITION, "--time", "00:20:00",
               "--slurm-directive=--comment=farm-test", "--port", "0", "--dashboard-port", "0",
               "--scheduler-file", str(scheduler_file)]  # fmt: skip
    proc = subprocess.Popen(command, env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    out = Lines(proc)
    try:
        out.wait_for("ready", timeout=300)
        assert "farm cluster: 2 SLURM worker(s) x 1 thread(s), protocol tcp" in out.lines
        assert "farm cluster: 1 I/O worker(s) (farm-io-*) for the writes and encodes" in out.lines
        jobs = squeue(slurm_env)
        assert len(jobs) == 3 and all(j.endswith("RUNNING") for j in jobs), jobs
        with Client(out.wait_for("farm cluster: scheduler ", 1).split()[-1], set_as_default=False) as client:
            where = client.run(lambda: (os.environ["SLURM_JOB_ID"], os.environ["SLURM_JOB_PARTITION"]))
            info = workers_info(client)
        # every worker in a job of its own, in the partition asked for; the I/O worker marked as one
        assert sorted(job for job, _ in where.values()) == sorted(j.split()[0] for j in jobs)
        assert {partition for _, partition in where.values()} == {PARTITION}
        io = [w for w in info.values() if (w.get("resources") or {}).get("farm-io")]
        assert [w["name"] for w in io] == ["farm-io-0"] and len(info) == 3
        job_script = (Path(slurm_env["DASK_JOBQUEUE__SLURM__LOG_DIRECTORY"])).glob("*.out")
        assert len(list(job_script)) == 3

        farm.render(tiny_job, tmp_path / "out", scheduler_file=str(scheduler_file), options=WHOLE,
                    log=lambda _: None)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    assert code == 0 and "farm cluster: stopped" in out.lines
    assert_cancelled(slurm_env)
    farm.render(tiny_job, tmp_path / "local", scheduler=scheduler3, options=WHOLE, log=lambda _: None)
    for shot in open_job(tiny_job).shots:
        on_slurm = read_frames(Output(tmp_path / "out"), shot).tobytes()
        assert on_slurm == read_frames(Output(tmp_path / "local"), shot).tobytes()
        video = f"videos/{shot}.mp4"
        assert (tmp_path / "out" / video).read_bytes() == (tmp_path / "local" / video).read_bytes()


def test_jobs_slurm_would_refuse_are_refused_in_words_before_any_is_submitted(slurm_env):
    command = [sys.executable, "-m", "farm", "cluster", "--backend", "slurm", "--partition", "nosuch",
               "--port", "0", "--dashboard-port", "0"]  # fmt: skip
    done = subprocess.run(command, env=slurm_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("farm: error: SLURM refuses the worker jobs: sbatch: error:")
    assert "nothing was submitted" in lines[0] and "Traceback" not in done.stderr
    assert squeue(slurm_env) == []


def test_srun_runs_scheduler_render_and_workers_in_an_allocation(slurm_env, tiny_job, tmp_path, scheduler3):
    """``srun -n 3 python -m farm.run.srun render JOB --out OUT``: task 0 the scheduler, task 1
    the render, task 2 a worker; the allocation ends with the render."""
    command = ["srun", "-n", "3", "--mem-per-cpu=2G", "-p", PARTITION, sys.executable, "-m",
               "farm.run.srun", "render", str(tiny_job), "--out", str(tmp_path / "out"),
               "--tiles", "1,1,1", "--batch-frames", "8"]  # fmt: skip
    done = subprocess.run(command, env=slurm_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{tmp_path / 'out'}/frames.zarr" in done.stdout  # task 1's render printed its outputs
    farm.render(tiny_job, tmp_path / "local", scheduler=scheduler3, options=WHOLE, log=lambda _: None)
    for shot in open_job(tiny_job).shots:
        on_slurm = read_frames(Output(tmp_path / "out"), shot).tobytes()
        assert on_slurm == read_frames(Output(tmp_path / "local"), shot).tobytes()


def test_the_slurm_backend_says_what_it_would_start():
    """Chosen by name only; jobs × GPUs per job decode workers; a worker count that is not whole jobs, and
    --gpus on farm cluster, refused in words."""
    ask = dict(scheduler=None, scheduler_file=None, gpu_count=0, ucx_available=False, cpu_count=8)
    assert backends.select(backends.ClusterAsk(workers=None, **ask), "auto").name != "slurm"
    with dask.config.set({"farm.cluster-backend": "slurm", "farm.slurm-jobs": 3, "farm.slurm-gpus": 0}):
        choice = choose_cluster(workers=None, **ask)
        said = (choice.kind, choice.n_workers, choice.threads_per_worker, choice.protocol)
        assert said == ("slurm", 3, 1, "tcp")
    with dask.config.set({"farm.cluster-backend": "slurm", "farm.slurm-jobs": 2, "farm.slurm-gpus": 4}):
        choice = choose_cluster(workers=None, **ask)
        assert (choice.n_workers, choice.threads_per_worker) == (8, 8)
        assert choose_cluster(workers=12, **ask).n_workers == 12
        with pytest.raises(FarmError, match="--workers 6 is not a whole number of SLURM jobs of 4 GPU"):
            choose_cluster(workers=6, **ask)
        with pytest.raises(FarmError, match="--protocol ucx needs GPU jobs"):
            choose_cluster(workers=None, protocol="ucx", **ask)
        with pytest.raises(FarmError, match="leave out --gpus"):
            from farm.run.clusterd import start

            start(gpus=1)


def job_script(options: dict) -> str:
    from dask_jobqueue.slurm import SLURMJob

    return SLURMJob(scheduler="tcp://head:8786", name="w", **options).job_script()


def test_a_gpu_job_runs_dask_cudas_worker_on_its_gpus_and_an_io_job_none():
    """The job scripts dask-jobqueue would submit (read, not submitted: the test machine has no GPU): a GPU
    job asks for its node's GPUs and their CPUs and memory, and runs dask-cuda's worker, warmed up, each
    GPU worker held to its own memory; an I/O job hides the GPUs; the settings become #SBATCH lines."""
    pytest.importorskip("dask_jobqueue", reason="the SLURM backend needs dask-jobqueue (farm-decode[slurm])")
    settings = {"farm.cluster-backend": "slurm", "farm.slurm-gpus": 4, "farm.slurm-cpus-per-gpu": 6,
                "farm.slurm-memory": "20GiB", "farm.slurm-partition": "gpu", "farm.slurm-account": "vfx",
                "farm.slurm-time": "04:00:00", "farm.slurm-directives": ["--constraint=h200"]}  # fmt: skip
    with dask.config.set(settings):
        choice = choose_cluster(scheduler=None, scheduler_file=None, workers=None, gpu_count=0,
                                ucx_available=False, cpu_count=2)  # fmt: skip
        decode, io = job_options(choice, {"memory_limit": "auto"})
    gpu = job_script(decode)
    for line in ("#SBATCH -p gpu", "#SBATCH -A vfx", "#SBATCH -t 04:00:00", "#SBATCH --constraint=h200",
                 "#SBATCH --gres=gpu:4", "#SBATCH --cpus-per-task=24", "#SBATCH --mem=80G",
                 "#SBATCH -n 1"):  # fmt: skip
        assert line in gpu.splitlines(), (line, gpu)
    command = gpu.splitlines()[-1]
    assert f"{sys.executable} -m dask cuda worker tcp://head:8786 --name w --nthreads 6" in command
    assert command.endswith(f"--preload farm.worker.warmup --memory-limit {20 * 2**30}")
    cpu = job_script(io)
    assert "#SBATCH --gres" not in cpu and "export CUDA_VISIBLE_DEVICES=" in cpu.splitlines()
    assert "-m distributed.cli.dask_worker tcp://head:8786 --name w --nthreads 2" in cpu
    assert "--resources farm-io=1" in cpu and "--nworkers" not in cpu
