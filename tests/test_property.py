"""Property: whatever a user does to one OUT (renders, refused renders, --restart, cancels, kills, in any
order), every batch marked done still has its frames and every finished shot its video.

Random sequences of those steps run against one OUT on the shared cluster; after each step the OUT is
checked against an uninterrupted reference render. Small for CI: a few examples, tiny shots.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import farm
from farm.errors import FarmError
from farm.media import video as farm_video
from farm.media.settings import VideoSettings
from farm.store.frames import read_frames
from farm.store.lock import held_shots, shared_lock
from farm.store.output import Output

SHOTS = ("shot000", "shot001")
FRAMES = 17
QUIET = {"log": lambda _: None}
STEPS = ("render", "render-part", "refused-settings", "refused-option", "restart", "cancel", "kill")


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("property") / "job.zarr"
    farm.synth(path, decoder="ltx2-tiny", shots=2, frames=FRAMES, height=64, width=64, seed=5)
    return path


@pytest.fixture(scope="module")
def reference(job, tmp_path_factory, scheduler3) -> dict[str, np.ndarray]:
    """Frames of an uninterrupted render: whole-shot tiles give the same frames at any batch size."""
    out = tmp_path_factory.mktemp("reference") / "out"
    farm.render(job, out, scheduler=scheduler3, options=options(8), **QUIET)
    return {s: read_frames(Output(out), s) for s in SHOTS}


def options(batch_frames: int) -> farm.PlanOptions:
    return farm.PlanOptions(tiles=(1, 1, 1), batch_frames=batch_frames)


def check_invariants(out: Output, reference: dict[str, np.ndarray]) -> None:
    import zarr

    for shot in SHOTS:
        done = out.batches_done(shot)
        if not done and not out.video_done_marker(shot).exists():
            continue
        group = zarr.open_group(store=str(out.shot_group(shot)), mode="r")
        size = group.attrs["render"]["plan"]["batch_frames"]
        frames = read_frames(out, shot)
        for k in done:  # a batch marked done holds exactly the reference frames
            part = slice(k * size, min((k + 1) * size, FRAMES))
            assert np.array_equal(frames[part], reference[shot][part]), (shot, k)
        if out.video_done_marker(shot).exists():  # a finished shot has its video, every frame in it
            codec = group.attrs["render"]["outputs"]["video"]
            video = out.video(shot, farm_video.CODECS[codec].suffix)
            assert video.exists() and farm_video.probe(video).frames == FRAMES, shot
    assert not held_shots(out.root)  # no step leaves a lock that refuses the next render
    with shared_lock(out.root, wait=0):
        pass


def cancel_mid_render(job: Path, out: Output, client: object, batch_frames: int) -> None:
    from farm.submit import cancel

    scheduler = client.scheduler.address
    started = threading.Event()
    render_id = f"prop-{time.monotonic_ns()}"

    def log(line: str) -> None:
        if "render id" in line:
            started.set()

    def run() -> None:
        try:
            farm.render(job, out.root, scheduler=scheduler, options=options(batch_frames),
                        render_id=render_id, log=log)  # fmt: skip
        finally:
            started.set()

    thread = threading.Thread(target=run)
    thread.start()
    started.wait(120)
    if thread.is_alive():
        with contextlib.suppress(FarmError):  # it finished before the cancel arrived
            cancel(render_id, scheduler, wait=30, log=lambda _: None)
    thread.join(120)
    wait_until_idle(client, render_id)


def wait_until_idle(client: object, render_id: str | None) -> None:
    deadline = time.monotonic() + 60
    while render_id and render_tasks_left(client, render_id) and time.monotonic() < deadline:
        time.sleep(0.2)  # a running task finishes after its render stopped (docs/guarantees.md, stale tasks)


def render_tasks_left(client: object, render_id: str) -> int:
    """Tasks of `render_id` still on any worker (running ones go on after their client dies)."""

    def count(render_id: str, dask_worker: object = None) -> int:
        return sum(1 for key in dask_worker.state.tasks if isinstance(key, tuple) and render_id in key)

    return sum(client.run(count, render_id).values())


def kill_mid_render(job: Path, out: Output, client: object, batch_frames: int, delay: float) -> None:
    scheduler = client.scheduler.address
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "render", str(job), "--out", str(out.root), "--scheduler",
         scheduler, "--tiles", "1,1,1", "--batch-frames", str(batch_frames)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    render_id = None
    for line in proc.stderr:  # farm's messages go to stderr (farm.logs)
        if "render id" in line:
            render_id = line.rsplit("render id", 1)[1].strip()
            break
    time.sleep(delay)
    with contextlib.suppress(ProcessLookupError):  # it may have ended (nothing left to render)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    wait_until_idle(client, render_id)


STEP = st.tuples(st.sampled_from(STEPS), st.sampled_from((4, 8)), st.sampled_from((0.0, 0.5)))


@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(steps=st.lists(STEP, min_size=3, max_size=5))
def test_random_steps_never_lose_finished_work(steps, job, reference, cluster3, tmp_path_factory):
    scheduler3 = cluster3.scheduler.address
    out = Output(tmp_path_factory.mktemp("prop") / "out")
    current = None  # the batch size OUT's shots were rendered with (None: nothing yet)
    for step, batch_frames, delay in steps:
        size = current or batch_frames
        if step == "render":
            farm.render(job, out.root, scheduler=scheduler3, options=options(size), **QUIET)
            current = size
        elif step == "render-part":
            farm.render(job, out.root, scheduler=scheduler3, options=options(size), frames="1-4", **QUIET)
            current = size
        elif step == "refused-settings" and current:
            with pytest.raises(FarmError, match="--batch-frames: OUT has"):
                farm.render(job, out.root, scheduler=scheduler3, options=options(12 - current), **QUIET)
        elif step == "refused-option":
            with pytest.raises(FarmError):
                farm.render(job, out.root, scheduler=scheduler3, options=options(size), restart=True,
                            video=VideoSettings(preset="nosuch"), **QUIET)  # fmt: skip
        elif step == "restart":
            farm.render(job, out.root, scheduler=scheduler3, options=options(batch_frames), restart=True,
                        **QUIET)  # fmt: skip
            current = batch_frames
        elif step == "cancel":
            cancel_mid_render(job, out, cluster3, size)
            current = current or (size if out.shot_group(SHOTS[0]).exists() else None)
        elif step == "kill":
            kill_mid_render(job, out, cluster3, size, delay)
            current = current or (size if out.shot_group(SHOTS[0]).exists() else None)
        check_invariants(out, reference)
