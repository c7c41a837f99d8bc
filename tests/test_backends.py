"""Cluster backends behind one protocol (`farm.run.backends`): a backend registered beside the built-in ones
runs a render with nothing else changed, farm's own worker set-up applied to its workers, and its
workers' memory known before it starts bounds the plan; ``auto`` asks
the built-ins in order; a backend named outright must fit what was asked; and no module outside
`farm/run/backends/` names a backend."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

import farm
from farm.errors import FarmError
from farm.run import backends
from farm.run.backends import ClusterAsk, ClusterChoice
from farm.run.backends.local_cpu import LocalCPU
from farm.run.cluster import choose_cluster
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output

ROOT = Path(__file__).resolve().parents[1]
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)


class MarkWorkers(WorkerPlugin):
    """Writes a file named after each worker that sets it up, and the farm plugins it found there."""

    name = "test-mark-workers"
    idempotent = True

    def __init__(self, folder: str):
        self.folder = folder

    def setup(self, worker: Any) -> None:
        Path(self.folder, str(worker.name)).write_text(" ".join(sorted(worker.plugins)))


class RecordingCPU(LocalCPU):
    """A backend of its own: the local CPU cluster under another name, recording what it chose and
    started, with one I/O worker beside its decode workers and a plugin of its own."""

    name = "test-recording-cpu"
    label = "recording CPU"

    def __init__(self, folder: Path):
        self.folder = folder
        self.chosen: list[ClusterChoice] = []
        self.started: list[Any] = []

    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        choice = super().choose(ask)
        self.chosen.append(choice)
        return choice

    def start(self, choice: ClusterChoice, stack: contextlib.ExitStack, *, hint: str, **kwargs: Any) -> Any:
        cluster = super().start(choice, stack, hint=hint, **kwargs)
        self.started.append(cluster)
        return cluster

    def worker_plugins(self, choice: ClusterChoice) -> list[Any]:
        return [*super().worker_plugins(choice), MarkWorkers(str(self.folder))]

    def default_io_workers(self, choice: ClusterChoice, cpu_count: int) -> int:
        return 1


@pytest.fixture
def recording(tmp_path):
    folder = tmp_path / "marks"
    folder.mkdir()
    backend = RecordingCPU(folder)
    backends.register(backend)
    try:
        yield backend
    finally:
        backends.unregister(backend.name)


@pytest.mark.cluster
def test_a_registered_backend_runs_a_render_with_nothing_else_changed(tiny_job, tmp_path, recording,
                                                                      scheduler3):  # fmt: skip
    with dask.config.set({"farm.cluster-backend": recording.name}):
        stats = farm.render(tiny_job, tmp_path / "out", workers=2, options=WHOLE, log=lambda _: None)
    assert not stats.failed
    assert [c.kind for c in recording.chosen] == [recording.name] * len(recording.chosen) and recording.chosen
    assert len(recording.started) == 1 and recording.started[0].status.name == "closed"  # started, stopped
    # its decode workers and the I/O worker it asked for, each with farm's plugins and its own
    marks = {p.name: set(p.read_text().split()) for p in recording.folder.iterdir()}
    assert set(marks) == {"0", "1", "farm-io-0"}
    for plugins in marks.values():
        assert {"farm-ignore-interrupt", "farm-quick-exit", "farm-torch-threads", MarkWorkers.name} <= plugins
    # the same bytes as a render on a cluster of the built-in backend
    farm.render(tiny_job, tmp_path / "plain", scheduler=scheduler3, options=WHOLE, log=lambda _: None)
    for shot in open_job(tiny_job).shots:
        ours = read_frames(Output(tmp_path / "out"), shot).tobytes()
        assert ours == read_frames(Output(tmp_path / "plain"), shot).tobytes()


class SmallGPUs(RecordingCPU):
    """A backend whose decode workers will have 1 MiB of GPU memory each."""

    name = "test-small-gpus"

    def decode_memory(self, choice: ClusterChoice) -> int | None:
        return 1 << 20


def test_a_plan_that_cannot_fit_the_backends_workers_starts_no_cluster(tiny_job, tmp_path):
    backend = SmallGPUs(tmp_path)
    backends.register(backend)
    try:
        with dask.config.set({"farm.cluster-backend": backend.name}), pytest.raises(FarmError) as err:
            farm.render(tiny_job, tmp_path / "out", workers=1, options=WHOLE, log=lambda _: None)
    finally:
        backends.unregister(backend.name)
    assert "more than the smallest worker GPU has (1.0 MiB)" in str(err.value)
    assert backend.chosen and not backend.started


def ask(**kw: Any) -> ClusterAsk:
    base: dict[str, Any] = dict(scheduler=None, scheduler_file=None, workers=None, gpu_count=0,
                                ucx_available=False, cpu_count=8)  # fmt: skip
    return ClusterAsk(**{**base, **kw})


def test_auto_asks_the_built_in_backends_in_order(recording):
    assert backends.registered()[:4] == ["existing", "local-cuda", "local-cpu", "slurm"]
    assert backends.select(ask(scheduler="tcp://10.0.0.5:8786"), "auto").name == "existing"
    assert backends.select(ask(scheduler_file="/shared/s.json"), "auto").name == "existing"
    assert backends.select(ask(gpu_count=2), "auto").name == "local-cuda"
    assert backends.select(ask(), "auto").name == "local-cpu"  # not the one registered after it
    assert backends.select(ask(gpu_count=2), recording.name) is recording  # named outright, GPUs or not


def test_a_backend_named_outright_must_fit_what_was_asked(recording):
    with dask.config.set({"farm.cluster-backend": recording.name}), pytest.raises(FarmError) as err:
        choose_cluster(scheduler="tcp://10.0.0.5:8786", scheduler_file=None, workers=None, gpu_count=0,
                       ucx_available=False, cpu_count=4)  # fmt: skip
    assert f"farm.cluster-backend {recording.name} starts its own cluster" in str(err.value)
    with dask.config.set({"farm.cluster-backend": "existing"}), pytest.raises(FarmError) as err:
        choose_cluster(scheduler=None, scheduler_file=None, workers=2, gpu_count=0, ucx_available=False,
                       cpu_count=4)  # fmt: skip
    assert "joins a running cluster: give --scheduler ADDRESS or --scheduler-file PATH" in str(err.value)
    with dask.config.set({"farm.cluster-backend": "local-cuda"}), pytest.raises(FarmError) as err:
        choose_cluster(scheduler=None, scheduler_file=None, workers=None, gpu_count=0, ucx_available=False,
                       cpu_count=4)  # fmt: skip
    assert "this machine has no GPU" in str(err.value)
    with dask.config.set({"farm.cluster-backend": "pbs"}), pytest.raises(FarmError) as err:
        choose_cluster(scheduler=None, scheduler_file=None, workers=None, gpu_count=0, ucx_available=False,
                       cpu_count=4)  # fmt: skip
    wanted = "'pbs', which is no cluster backend; use auto or one of existing, local-cuda, local-cpu, slurm"
    assert wanted in str(err.value)
    with pytest.raises(ValueError, match="already registered"):
        backends.register(LocalCPU())


def test_a_backend_name_is_said_only_by_its_backend():
    """Callers ask the backend object (`ClusterChoice.backend`) what it does; a string naming a backend
    outside `farm/run/backends/` would be a branch on it a new backend could not join. No module uses
    Dask's private `SpecCluster._correct_state` either."""
    names = {"existing", "local-cuda", "local-cpu", "slurm"}
    assert names <= set(backends.registered())
    found = []
    for path in sorted([*(ROOT / "farm").rglob("*.py"), *(ROOT / "tools").glob("*.py")]):
        if (ROOT / "farm" / "run" / "backends") in path.parents:
            continue
        text = path.read_text()
        assert "_correct_state" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found
