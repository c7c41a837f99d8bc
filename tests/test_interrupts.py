"""Ctrl-C and SIGTERM of `farm render`: one line, exit 130 / 143, workers stopped quietly, resumable (at
once on a shared cluster that is busy with other work, with nothing written into OUT after it); outputs
honour the umask."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import farm
from farm.media.video import encode_segment
from farm.run.cluster import connect
from farm.store.frames import read_frames
from farm.store.output import Output
from farm.store.render_logs import read_history
from tests.helpers import workers_paused
from tests.test_render_history import start_render_and_wait

TERMINATED = "terminated (SIGTERM)"  # what farm's one line says of a SIGTERM


def start_render(job: Path, out: Path) -> tuple[subprocess.Popen, list[str]]:
    """`farm render` in its own process group with Ctrl-C's default action (as on a terminal), once it
    has started rendering."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "render", str(job), "--out", str(out), "--workers", "2",
         "--tiles", "1,1,1", "--batch-frames", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines = []
    for line in proc.stderr:  # farm's messages go to stderr (farm.logs)
        lines.append(line)
        if "render id" in line:
            break
    return proc, lines


def test_ctrl_c_and_sigterm_print_one_line_and_the_render_resumes(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=2, frames=33, height=64, width=64)
    out = tmp_path / "out"
    cases = ((signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, TERMINATED))
    seen = 0  # render histories in OUT
    for sig, code, line in cases:
        proc, _ = start_render(job, out)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C reaches the whole process group
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        assert err.splitlines() == [f"farm: {line}; finished batches are kept, rerun to resume"], err  # after
        # "render id": one line, no worker traceback, no distributed warnings
        assert not (out / ".farm" / "lock").exists()
        histories = sorted((out / ".farm" / "renders").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        if len(histories) > seen:  # this render reached its graph: its history says how it ended
            assert read_history(histories[-1]).records[-1].get("outcome") == "interrupted", histories[-1]
        seen = len(histories)
    whole_shots = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
    stats = farm.render(job, out, scheduler=scheduler3, options=whole_shots, log=lambda _: None)
    assert not stats.failed and all(Output(out).video(s).exists() for s in ("shot000", "shot001"))
    assert read_frames(Output(out), "shot001").shape == (33, 64, 64, 3)


def test_sigterm_ends_a_render_on_a_busy_shared_cluster_at_once_and_nothing_lands_in_out_after_it(tmp_path):
    """A render joined to a cluster whose every worker thread is held by other work: its output arrays'
    task (on the I/O worker) has not started when SIGTERM comes. The render exits within seconds,
    releasing OUT, and that task writes nothing into OUT once the cluster is free again (the render
    cancelled it; one starting after the render ended finds its guard gone: tests/test_lock.py)."""
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=2, frames=17, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    with connect(workers=1, io_workers=1) as client:  # the output arrays are an I/O worker's task
        command = [sys.executable, "-m", "farm", "render", str(job), "--out", str(out.root), "--tiles",
                   "1,1,1", "--batch-frames", "8", "--scheduler", client.scheduler.address]  # fmt: skip
        with workers_paused(client):
            render, history = start_render_and_wait(command, out)
            try:
                render.send_signal(signal.SIGTERM)
                _, err = render.communicate(timeout=30)
            finally:
                render.kill()
                render.wait()
            assert render.returncode == 143, err
            assert err.splitlines()[-1] == f"farm: {TERMINATED}; finished batches are kept, rerun to resume"
            assert read_history(history).records[-1].get("outcome") == "interrupted"
            assert not out.lock_file.exists() and not any(out.shot_locks_dir.glob("*"))
        render_id = history.name.removesuffix(".jsonl")
        deadline = time.monotonic() + 60  # the cluster is free: it runs or drops what it held of the render
        while client.run_on_scheduler(render_tasks, render_id):
            assert time.monotonic() < deadline, "the render's tasks stayed on the cluster"
            time.sleep(0.1)
        assert not out.frames_zarr.exists() and not any(out.guards_dir.glob("*"))
        stats = farm.render(job, out.root, scheduler=client.scheduler.address, log=lambda _: None,
                            options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8))  # fmt: skip
    assert not stats.failed and all(out.video(s).exists() for s in ("shot000", "shot001"))
    assert read_frames(out, "shot001").shape == (17, 64, 64, 3)


def render_tasks(render_id: str, dask_scheduler=None) -> list[str]:  # run on the scheduler
    return [str(key) for key in dask_scheduler.tasks if render_id in str(key)]


def test_videos_and_sequences_honour_the_umask(tmp_path):
    frames = np.zeros((2, 32, 32, 3), np.uint8)
    old = os.umask(0o002)
    try:
        encode_segment(frames, tmp_path / "a.mp4", 24)
        from farm.media.sequences import write_frames

        (png,) = write_frames(frames[:1], tmp_path / "seq", "sh", format="png8")
    finally:
        os.umask(old)
    for path in (tmp_path / "a.mp4", png):
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
