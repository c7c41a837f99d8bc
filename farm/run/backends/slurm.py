"""The SLURM backend: a scheduler in this process and its workers in SLURM batch jobs, through
dask-jobqueue's ``SLURMCluster``; chosen by name only (``farm.cluster-backend: slurm``, ``farm cluster
--backend slurm``).

Each job takes one node's worth of workers: with ``farm.slurm-gpus`` G > 0, G GPUs
(``#SBATCH --gres=gpu:G``) and one dask-cuda worker per GPU (``dask cuda worker``, warmed up as farm's
local GPU workers are); with 0, one CPU worker. ``farm.slurm-jobs`` jobs (or ``--workers`` decode workers)
are asked for; partition, account, time limit and further ``#SBATCH`` lines come from ``farm.slurm-*``,
anything else from dask-jobqueue's own ``jobqueue.slurm.*`` settings (log directory, python, job script
prologue, interface…). I/O workers, when asked for, are CPU-only jobs of their own with the ``farm-io``
resource.

Inside an allocation already held, ``srun -n N python -m farm.run.srun COMMAND …`` runs the
scheduler (task 0), the farm command (task 1, joined to that scheduler) and workers (the other tasks),
through dask-jobqueue's ``SLURMRunner`` (:func:`run_in_allocation`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import weakref
from typing import Any

import dask
from dask.utils import parse_bytes

from farm import config
from farm.errors import FarmError
from farm.planning.schedule import IO_WORKER_THREADS
from farm.run.backends import ClusterAsk, ClusterBackend, ClusterChoice, register
from farm.run.backends.setup import IO_RESOURCE, IO_WORKER_PREFIX, WARMUP_PRELOAD, extend_worker_spec
from farm.run.machine import detect_gpus

GPU_WORKER_COMMAND = "dask cuda worker"  # jobqueue runs `python -m <this>`: dask's CLI, dask-cuda's command
CPU_WORKER_COMMAND = "distributed.cli.dask_worker"
JOB_NAME = "farm-worker"
SUBMIT = "sbatch"
WAIT_FOR_JOBS_S = 600  # a queue slower than this to start the jobs fails the start in words


def _setting(key: str) -> Any:
    return config.get(f"slurm-{key}")


def gpus_per_job() -> int:
    return config.whole_number("slurm-gpus")


class SLURM(ClusterBackend):
    name = "slurm"
    label = "SLURM"
    on_this_machine = False

    def __init__(self) -> None:
        self._io_jobs: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()

    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        """``farm.slurm-jobs`` jobs (or as many as ``workers`` decode workers take), each with
        ``farm.slurm-gpus`` GPUs and one worker per GPU, or one CPU worker; over TCP unless `protocol` asks
        for UCX (GPU jobs, distributed-ucxx installed)."""
        gpus = gpus_per_job()
        per_job = max(1, gpus)
        if ask.workers is not None:
            if ask.workers % per_job:
                raise FarmError(
                    f"--workers {ask.workers} is not a whole number of SLURM jobs of {per_job} GPU worker(s) "
                    f"each (farm.slurm-gpus {gpus}); give a multiple of {per_job}, or --slurm-jobs N"
                )
            jobs = ask.workers // per_job
        else:
            jobs = config.whole_number("slurm-jobs", minimum=1)
        protocol = ask.protocol or "tcp"
        if protocol == "ucx" and not (gpus and ask.ucx_available):
            raise FarmError("--protocol ucx needs GPU jobs (farm.slurm-gpus ≥ 1) and distributed-ucxx (pip "
                            "install 'farm-decode[cuda]'); use --protocol tcp, or leave it out")  # fmt: skip
        threads = ask.threads_per_worker or (min(8, max(2, _cpus_per_gpu())) if gpus else 1)
        torch_threads = 1 if gpus else (ask.cpu_decode_threads or threads)
        return ClusterChoice(self.name, jobs * per_job, protocol, threads, None, torch_threads)

    def start(
        self, choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, **cluster_kwargs: Any
    ) -> Any:
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError as e:
            raise FarmError(f"the SLURM backend needs dask-jobqueue ({e}); pip install 'farm-decode[slurm]', "
                            "or choose another cluster backend") from e  # fmt: skip
        if shutil.which(SUBMIT) is None:
            raise FarmError(f"{SUBMIT} is not on PATH: the SLURM backend submits its workers as batch jobs; "
                            "run farm where SLURM's commands are (a login node, or a job)")  # fmt: skip
        security = cluster_kwargs.get("security")
        if security is not None and not security.require_encryption:
            security = None  # jobqueue would hand the workers empty --tls-* options
        scheduler_options = {
            "host": cluster_kwargs.get("host", "127.0.0.1"),
            "port": cluster_kwargs.get("scheduler_port", 0),
            "dashboard_address": cluster_kwargs.get("dashboard_address", ":0"),
        }
        protocol = cluster_kwargs.get("protocol", choice.protocol)
        decode, io = job_options(choice, cluster_kwargs)
        try:
            cluster = SLURMCluster(protocol=protocol, security=security, scheduler_options=scheduler_options,
                                   **decode)  # fmt: skip
        except (OSError, RuntimeError, ValueError) as e:
            raise FarmError(f"could not start the SLURM cluster's scheduler: {e}; {hint}") from e
        self._io_jobs[cluster] = {**io, "protocol": protocol, "security": security}  # for `add_io_workers`
        try:
            check_submittable(cluster.job_script())
            jobs = choice.n_workers // max(1, gpus_per_job())
            cluster.scale(jobs=jobs)
            _wait_for_jobs(cluster, choice.n_workers, f"{jobs} SLURM job(s)")
        except BaseException:
            cluster.close()
            raise
        return cluster

    def worker_plugins(self, choice: ClusterChoice) -> list[Any]:
        if gpus_per_job():
            return []
        from farm.run.backends.local_cpu import TorchThreadsPlugin

        return [TorchThreadsPlugin(choice.torch_threads)]

    def add_io_workers(self, cluster: Any, n: int, memory_limit: Any, security: Any = None) -> None:
        """`n` CPU-only SLURM jobs, one I/O worker each (named ``farm-io-N``, resource ``farm-io``)."""
        from dask_jobqueue.slurm import SLURMJob

        options = self._io_jobs[cluster]
        specs = {f"{IO_WORKER_PREFIX}{i}": {"cls": SLURMJob, "options": dict(options)} for i in range(n)}
        extend_worker_spec(cluster, specs)
        _wait_for_jobs(cluster, len(cluster.worker_spec), f"{n} SLURM I/O job(s)")


def job_options(
    choice: ClusterChoice, cluster_kwargs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """dask-jobqueue's options (`SLURMJob`'s) for the decode jobs `choice` describes and for an I/O job,
    from the ``farm.slurm-*`` settings and `cluster_kwargs` (``memory_limit``, ``preload``)."""
    gpus = gpus_per_job()
    memory = _worker_memory(cluster_kwargs.get("memory_limit"))
    common: dict[str, Any] = {
        "queue": _setting("partition"),
        "account": _setting("account"),
        "walltime": _setting("time"),
        "job_name": JOB_NAME,
        "processes": 1,  # one worker command a job: dask-cuda's starts a worker per GPU itself
    }
    directives = [*dask.config.get("jobqueue.slurm.job-extra-directives", []), *_directives()]
    preloads = [arg for module in cluster_kwargs.get("preload", []) for arg in ("--preload", module)]
    if gpus:
        decode = {
            "worker_command": GPU_WORKER_COMMAND,
            "cores": choice.threads_per_worker,
            "job_cpu": gpus * _cpus_per_gpu(),
            "memory": str(memory * gpus),
            "job_extra_directives": [*directives, f"--gres=gpu:{gpus}"],
            # warmed up as farm's local GPU workers are; the memory limit is each GPU worker's, not the job's
            "worker_extra_args": ["--preload", WARMUP_PRELOAD, *preloads, "--memory-limit", str(memory)],
        }
    else:
        decode = {
            "worker_command": CPU_WORKER_COMMAND,
            "cores": choice.threads_per_worker,
            "memory": str(memory),
            "job_extra_directives": directives,
            "worker_extra_args": preloads,
        }
    io = {
        "worker_command": CPU_WORKER_COMMAND,
        "cores": IO_WORKER_THREADS,
        "memory": str(memory),
        "job_extra_directives": directives,
        "job_script_prologue": _no_gpu_prologue(),
        "worker_extra_args": ["--resources", f"{IO_RESOURCE}=1"],
    }
    return {**common, **decode}, {**common, **io}


def check_submittable(script: str) -> None:
    """SLURM would take the job `script` (partition, account, time limit, resources, directives): ``sbatch
    --test-only`` submits nothing; a FarmError with SLURM's own words when it would not."""
    try:
        done = subprocess.run([SUBMIT, "--test-only"], input=script, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FarmError(f"could not ask SLURM whether it takes the worker jobs ({SUBMIT} --test-only: "
                        f"{e})") from e  # fmt: skip
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
        raise FarmError(f"SLURM refuses the worker jobs: {said}; check the partition, account, time limit "
                        "and directives (farm cluster --partition/--account/--time/--slurm-directive, or "
                        "farm.slurm-*); nothing was submitted")  # fmt: skip


def _cpus_per_gpu() -> int:
    return config.whole_number("slurm-cpus-per-gpu", minimum=1)


def _directives() -> list[str]:
    value = _setting("directives") or []
    if isinstance(value, str):  # DASK_FARM__SLURM_DIRECTIVES='--qos=high' reads as one
        value = [value]
    return [str(v) for v in value]


def _worker_memory(memory_limit: Any) -> int:
    """Each worker's host memory: the cluster's memory limit when one was given in bytes or Dask's
    syntax (``farm cluster --memory-limit 24GiB``), else ``farm.slurm-memory``."""
    if isinstance(memory_limit, (str, int)) and memory_limit != "auto":
        with contextlib.suppress(TypeError, ValueError):
            given = int(parse_bytes(memory_limit) if isinstance(memory_limit, str) else memory_limit)
            if given >= 2**20:  # not a fraction of this machine's memory, which says nothing of a node's
                return given
    memory = config.byte_size("slurm-memory")
    if memory is None:
        raise FarmError("farm.slurm-memory is unset; set it to each SLURM worker's host memory, e.g. 16GiB")
    return memory


def _no_gpu_prologue() -> list[str]:
    prologue = list(dask.config.get("jobqueue.slurm.job-script-prologue", []) or [])
    # never touch a GPU: these only write and encode (as farm's local I/O workers)
    return [*prologue, "export CUDA_VISIBLE_DEVICES=",
            "export DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=False"]  # fmt: skip


def _wait_for_jobs(cluster: Any, n_workers: int, what: str) -> None:
    try:
        cluster.wait_for_workers(n_workers, timeout=WAIT_FOR_JOBS_S)
    except TimeoutError:
        raise FarmError(
            f"{what} did not all start within {WAIT_FOR_JOBS_S} s ({len(cluster.scheduler_info['workers'])} "
            f"of {n_workers} workers joined; squeue shows them, and the jobs' output says why); they were "
            "cancelled. Check the partition, account and limits (farm.slurm-*), or try when the queue is "
            "shorter"
        ) from None



# `srun -n N python -m farm.run.srun COMMAND ARGS…` inside an allocation: the farm commands
# that run against a scheduler, given it with --scheduler
ALLOCATION_COMMANDS = ("render", "submit")
SCHEDULER_FILE = "farm-scheduler-{job_id}.json"  # in the working directory, which every task must see
FARM_PAGE_PRELOAD = "farm.dashboard.monitor"


def run_in_allocation(argv: list[str]) -> int:
    """One task of ``srun -n N python -m farm.run.srun COMMAND ARGS…`` (N ≥ 3), through
    dask-jobqueue's ``SLURMRunner``: task 0 runs the scheduler (work stealing off, the farm page), task 1
    runs ``farm COMMAND ARGS… --scheduler ADDRESS`` once every other task has a worker in, the others are
    workers: a `dask_cuda.CUDAWorker` (one worker per GPU the task sees, warmed up) where the task sees
    GPUs, a plain Dask worker otherwise (a GPU worker that joins after the render started takes decode
    work as it joins). When the command ends, the scheduler and the workers stop; its exit
    status is task 1's."""
    if not argv or argv[0] not in ALLOCATION_COMMANDS:
        given = argv[0] if argv else "nothing"
        raise FarmError(f"srun … python -m farm.run.srun runs a farm command against the cluster "
                        f"it starts: give one of {', '.join(ALLOCATION_COMMANDS)} and its arguments, not "
                        f"{given}")  # fmt: skip
    if "--scheduler" in argv or "--scheduler-file" in argv:
        raise FarmError("the command joins the allocation's own scheduler; leave out --scheduler and "
                        "--scheduler-file")  # fmt: skip
    from dask_jobqueue.slurm import SLURMRunner
    from distributed import Client

    gpus = detect_gpus()
    worker_class = "dask_cuda.CUDAWorker" if gpus else "distributed.Worker"
    worker_options: dict[str, Any] = {"nthreads": 4 if gpus else 1}
    if gpus:
        worker_options["preload"] = [WARMUP_PRELOAD]
    scheduler_options = {"preload": [FARM_PAGE_PRELOAD], "dashboard_address": ":8787"}
    dask.config.set({"distributed.scheduler.work-stealing": False})  # read as the scheduler starts
    with SLURMRunner(scheduler_file=SCHEDULER_FILE, worker_class=worker_class, worker_options=worker_options,
                     scheduler_options=scheduler_options) as runner:  # fmt: skip
        # only task 1 gets here: the scheduler's and the workers' tasks end inside SLURMRunner
        with Client(runner) as client:
            client.wait_for_workers(runner.n_workers, timeout=WAIT_FOR_JOBS_S)
        # the farm command as a process of its own: the CLI is a layer above this one
        command = [sys.executable, "-m", "farm", *argv, "--scheduler", str(runner.scheduler_address)]
        return subprocess.run(command).returncode


def main(argv: list[str]) -> int:
    """`run_in_allocation`, its FarmError printed in one line (`farm.run.srun` is the program)."""
    try:
        return run_in_allocation(argv)
    except FarmError as exc:
        print(f"farm: error: {exc}", file=sys.stderr)
        return exc.exit_code


register(SLURM())
