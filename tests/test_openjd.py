"""The Open Job Description template (workflows/openjd/farm-render.yaml) run with `openjd run`: two tasks of
its Render step at once (two sessions, as two hosts of a render manager run them), each a `farm render
--shots` of its group on a local cluster of its own, into one OUT; then its Verify step. OUT equals one
render of the whole job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import farm
from farm.store.lock import held_shots
from farm.store.output import Output
from tests.helpers import assert_same_video, chunk_files

TEMPLATE = Path(__file__).parents[1] / "workflows" / "openjd" / "farm-render.yaml"
OPENJD = str(Path(sys.executable).parent / "openjd")  # openjd-cli, a test dependency
OPTIONS = "--tiles 1,1,1 --batch-frames 8"


def openjd(*args: str, job: Path, out: Path) -> list[str]:
    """An `openjd run` of the template for `job` into `out`: 2 shots per task, one decode worker each."""
    return [OPENJD, "run", str(TEMPLATE), "-p", f"JobStore={job}", "-p", f"Out={out}", "-p", "ShotCount=4",
            "-p", "ShotsPerTask=2", "-p", "Workers=1", "-p", f"DecoderOptions={OPTIONS}",
            "-p", f"Python={sys.executable}", *args]  # fmt: skip


def test_the_template_passes_openjd_checks():
    result = subprocess.run([OPENJD, "check", str(TEMPLATE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "passes validation checks" in result.stdout, result.stderr


@pytest.mark.slow
def test_two_tasks_at_once_render_into_one_out_that_verifies_and_equals_one_render(tmp_path):
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=4, frames=41, height=64, width=64, seed=5)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    tasks = [
        subprocess.Popen(openjd("--step", "Render", "--task-param", f"Shot={group}", job=job, out=out),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for group in ("1-2", "3-4")
    ]  # fmt: skip
    held: set[str] = set()
    try:
        while all(task.poll() is None for task in tasks) and held != set(farm.open_job(job).shots):
            held = max(held, set(held_shots(out)), key=len)  # the most shots held at one moment
            time.sleep(0.05)
        logs = [task.communicate(timeout=500)[0] for task in tasks]
    finally:
        for task in tasks:
            task.kill()
            task.wait()
    assert held == {"shot000", "shot001", "shot002", "shot003"}  # both tasks were rendering at once
    for task, log in zip(tasks, logs, strict=True):
        assert task.returncode == 0 and "Session ended successfully" in log, log
    assert "shots shot000,shot001 into" in logs[0] and "shots shot002,shot003 into" in logs[1]

    verify = subprocess.run(openjd("--step", "Verify", "--no-run-dependencies", job=job, out=out),
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert verify.returncode == 0 and "4 of 4 shots finished" in verify.stdout, verify.stdout
    (out / "videos" / "shot001.mp4").write_bytes(b"damaged")  # the Verify step fails a damaged OUT
    damaged = subprocess.run(openjd("--step", "Verify", "--no-run-dependencies", job=job, out=out),
                             capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert damaged.returncode != 0, damaged.stdout

    single = tmp_path / "single"
    alone = subprocess.run([sys.executable, "-m", "farm", "render", str(job), "--out", str(single),
                            "--workers", "1", *OPTIONS.split()], capture_output=True, text=True, env=env,
                           timeout=500)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    together, reference = chunk_files(out), chunk_files(single)
    assert sorted(together) == sorted(reference) and len(reference) > 4 * 5
    assert [name for name in reference if together[name] != reference[name]] == []  # byte for byte
    for shot in ("shot000", "shot002", "shot003"):  # shot001's video damaged above
        assert_same_video(Output(out).video(shot), Output(single).video(shot))
