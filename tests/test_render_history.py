"""Each render leaves its history in OUT (``OUT/.farm/renders/<render-id>.jsonl``): its set-up, every event
of its state machine with the instructions it led to, and how it ended. The history replays into a fresh
`RenderState`; `farm status OUT --renders` lists the renders (a worker lost mid-render, a render killed
before its end) and ``--render ID`` prints one's events."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import farm
from farm import cli
from farm.media.files import process_umask
from farm.planning.render_events import event_from_record, instruction_from_record, state_setup_from_record
from farm.planning.render_state import RenderState
from farm.render_history import summarise
from farm.store.output import Output
from farm.store.render_logs import read_history
from tests.helpers import workers_paused

QUIET = {"log": lambda _: None}
OPTIONS = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def test_a_renders_history_holds_its_setup_events_and_end_and_replays(tmp_path, scheduler3, capsys):
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=2, frames=17, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    stats = farm.render(job, out.root, options=OPTIONS, scheduler=scheduler3, render_id="r-replay", **QUIET)
    assert not stats.failed and len(stats.render_states) == 1

    path = out.render_log("r-replay")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~process_umask()  # as the umask allows
    records = read_history(path).records
    setup, events, end = records[0]["setup"], records[1:-1], records[-1]
    assert setup["render"] == "r-replay" and setup["pid"] == os.getpid() and setup["farm"] == farm.__version__
    assert setup["shots"] == ["shot000", "shot001"] and setup["host"]
    assert end["outcome"] == "done" and end["batches_written"] == end["batches_total"] == 6
    assert end["failed"] == {} and end["retries"] == {}

    # the file's events, fed into a machine built from its set-up line, lead to the instructions it recorded
    fresh = RenderState(**state_setup_from_record(setup["state"]))
    for record in events:
        recorded = [instruction_from_record(i) for i in record["instructions"]]
        assert fresh.handle(event_from_record(record["event"])) == recorded
    assert fresh.log == stats.render_states[0].log and fresh.finished == {0, 1}

    code, printed = run_cli(capsys, "status", str(out.root), "--renders")
    row = next(line for line in printed.splitlines() if line.startswith("r-replay"))
    assert code == 0 and " done " in row and "running" not in row, printed
    code, printed = run_cli(capsys, "status", str(out.root), "--render", "r-replay")
    lines = printed.splitlines()
    assert code == 0 and lines[0].startswith("render r-replay on ")
    assert "2 shot(s) (shot000, shot001)" in lines[0]
    assert "started  → SubmitDecode(step=0" in lines[1]
    assert any("shot 'shot001': video written  → ShotDone(shot='shot001')" in line for line in lines), printed
    assert "ended " in lines[-1] and ": done (6/6 batch(es) written)" in lines[-1]
    code, printed = run_cli(capsys, "status", str(out.root), "--render", "nope")
    assert code == 2 and "holds no history of render 'nope' (renders: r-replay;" in printed


@pytest.mark.slow
def test_a_worker_lost_mid_render_shows_in_the_renders_list(tmp_path, capsys):
    from farm.run.cluster import connect

    job = tmp_path / "job.zarr"
    farm.synth(job, shots=3, frames=25, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    with connect(workers=3) as client:
        pids = client.run(os.getpid)  # address → its worker process
        victim = sorted(pids)[0]
        history = out.render_log("r-lost")

        calls: list[None] = []

        def kill_a_worker(_stats: object) -> None:
            """At the render's start (its first progress call): SIGKILL a decode worker; at its first
            result, hold the driver's loop until the render noticed, so the render still runs when it does."""
            calls.append(None)
            if len(calls) == 1:
                os.kill(pids[victim], signal.SIGKILL)
            elif len(calls) == 2:
                deadline = time.monotonic() + 60
                while '"WorkerLeft"' not in history.read_text():
                    assert time.monotonic() < deadline, "the render did not notice the lost worker"
                    time.sleep(0.1)

        stats = farm.render(job, out.root, options=OPTIONS, scheduler=client.scheduler.address,
                            render_id="r-lost", on_progress=kill_a_worker, **QUIET)  # fmt: skip
    assert not stats.failed and len(calls) > 2

    code, printed = run_cli(capsys, "status", str(out.root), "--renders")
    lines = printed.splitlines()
    row = next(line for line in lines if line.startswith("r-lost"))
    assert code == 0 and row.split()[-3] == "1" and " done " in row, printed  # lost: 1
    assert f"  worker lost: {victim}" in lines, printed
    code, printed = run_cli(capsys, "status", str(out.root), "--render", "r-lost")
    assert f"decode worker {victim} (slot 0) left" in printed, printed


def start_render_and_wait(command: list[str], out: Output) -> tuple[subprocess.Popen, Path]:
    """`farm render` in a process of its own, once its history holds its Started event (the workers are
    held, so it waits on its first decodes)."""
    render = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (paths := sorted(out.renders_dir.glob("*.jsonl"))) or '"Started"' not in (
                paths[0].read_text()):  # fmt: skip
            assert render.poll() is None, render.stderr.read() if render.stderr else ""
            assert time.monotonic() < deadline, "the render wrote no Started event"
            time.sleep(0.1)
    except BaseException:
        render.kill()
        render.kill()
        render.wait()
        raise
    return render, paths[0]


@pytest.mark.slow
def test_a_killed_render_leaves_a_history_reported_as_stopped_without_an_end(tmp_path, cluster3, capsys):
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=2, frames=17, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    command = [sys.executable, "-m", "farm", "render", str(job), "--out", str(out.root), "--scheduler",
               cluster3.scheduler.address, "--tiles", "1,1,1", "--batch-frames", "8"]  # fmt: skip
    with workers_paused(cluster3):  # the render submits its first decodes, then waits on them
        render, path = start_render_and_wait(command, out)
        try:
            render_id = path.name.removesuffix(".jsonl")
            code, printed = run_cli(capsys, "status", str(out.root), "--renders")
            assert code == 0 and "running" in next(x for x in printed.splitlines() if x.startswith(render_id))
            render.send_signal(signal.SIGKILL)
            render.wait(timeout=30)
        finally:
            render.kill()
            render.wait()

    text = path.read_text()
    assert text.endswith("\n")  # every line it reached is whole
    records = read_history(path).records
    assert len(records) == len(text.splitlines()) and "setup" in records[0]
    assert [r["event"]["type"] for r in records[1:2]] == ["Started"] and not any("end" in r for r in records)
    code, printed = run_cli(capsys, "status", str(out.root), "--renders")
    row = next(line for line in printed.splitlines() if line.startswith(render_id))
    assert code == 0 and "stopped without an end" in row and "running" not in row, printed
    code, printed = run_cli(capsys, "status", str(out.root), "--render", render_id)
    assert printed.splitlines()[-1].startswith("stopped without an end (its last line: "), printed

    # SIGTERM ends a history as interrupted: tests/test_interrupts.py, on the render's own cluster


def test_the_scheduler_counts_a_renders_retried_tasks(tmp_path, cluster3):
    """A task of the render that raised and ran again (Dask's ``retries``) is counted by its kind; another
    render's and a task that never raised are not."""
    from farm.run.render_log import retried_tasks

    def fails_once(flag: str) -> int:  # nested: pickled by value (the workers cannot import this module)
        import pathlib

        if not pathlib.Path(flag).exists():
            pathlib.Path(flag).touch()
            raise RuntimeError("a decode that fails once")
        return 1

    flag = str(tmp_path / "failed-once")
    retried = cluster3.submit(fails_once, flag, key=("decode-tile", "r-retry", "shot000", 0), retries=1)
    other = cluster3.submit(fails_once, flag + "-other", key=("decode-tile", "r-other", "shot000", 0),
                            retries=1)
    plain = cluster3.submit(len, "ab", key=("blend-batch", "r-retry", "shot000", 0), retries=1)
    assert cluster3.gather([retried, other, plain]) == [1, 1, 2]
    assert cluster3.run_on_scheduler(retried_tasks, "r-retry") == {"decode-tile": 1}


@pytest.mark.slow
def test_renders_writing_one_out_at_once_each_write_their_own_history(tmp_path, cluster3, capsys):
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=2, frames=17, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    renders = []
    with workers_paused(cluster3):  # both render at once: each submits its first decodes, then waits
        try:
            for shot in ("shot000", "shot001"):
                renders.append(subprocess.Popen(
                    [sys.executable, "-m", "farm", "render", str(job), "--out", str(out.root), "--shots",
                     shot, "--scheduler", cluster3.scheduler.address, "--tiles", "1,1,1", "--batch-frames",
                     "8"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))  # fmt: skip
            deadline = time.monotonic() + 120
            while sum('"Started"' in p.read_text() for p in out.renders_dir.glob("*.jsonl")) < 2:
                assert all(r.poll() is None for r in renders), [r.stderr.read() for r in renders if r.stderr]
                assert time.monotonic() < deadline, "the two renders did not both start"
                time.sleep(0.1)
        except BaseException:
            for render in renders:
                render.kill()
            raise
    assert [render.wait(timeout=240) for render in renders] == [0, 0]

    histories = [read_history(p) for p in sorted(out.renders_dir.glob("*.jsonl"))]
    assert len(histories) == 2 and sorted(h.records[0]["setup"]["shots"] for h in histories) == [
        ["shot000"], ["shot001"]]  # fmt: skip
    assert [h.records[-1]["outcome"] for h in histories] == ["done", "done"]
    assert {h.records[0]["setup"]["render"] for h in histories} == {h.render_id for h in histories}
    code, printed = run_cli(capsys, "status", str(out.root), "--renders")
    assert code == 0 and sum(" done " in line for line in printed.splitlines()) == 2, printed


@pytest.mark.slow
def test_failed_shots_show_with_their_reasons_and_the_decode_retries(tmp_path, cluster3, capsys):
    """A shot refused before the graph (NaN in its latent) and one whose latent chunk is damaged while the
    render runs (its decode fails, is retried once, fails again) are listed with why; the render failed."""
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=3, frames=17, height=64, width=64, fps=24.0)
    nan = zarr.open_array(store=str(job / "shot002" / "latent"), mode="r+")
    nan[:, 0] = np.nan
    out = Output(tmp_path / "out")
    command = [sys.executable, "-m", "farm", "render", str(job), "--out", str(out.root), "--scheduler",
               cluster3.scheduler.address, "--tiles", "1,1,1", "--batch-frames", "8"]  # fmt: skip
    with workers_paused(cluster3):  # the render hashed the latents and waits on its first decodes
        render, path = start_render_and_wait(command, out)
        for chunk in (job / "shot000" / "latent" / "c").rglob("*"):
            if chunk.is_file():
                chunk.write_bytes(b"not a zstd chunk")
    assert render.wait(timeout=240) == 1

    summary = summarise(read_history(path), running=())
    assert summary.outcome == "failed" and summary.decode_retries == 1, summary
    assert sorted(summary.failed) == ["shot000", "shot002"] and "NaN" in summary.failed["shot002"]
    code, printed = run_cli(capsys, "status", str(out.root), "--renders")
    lines = printed.splitlines()
    row = next(line for line in lines if line.startswith(summary.render_id))
    assert code == 0 and " failed " in row and row.split()[-1] == "1", printed  # decode retries: 1
    assert f"  shot 'shot000' failed: {summary.failed['shot000']}" in lines, printed
    assert any(line.startswith("  shot 'shot002' failed: ") and "NaN" in line for line in lines), printed
    code, printed = run_cli(capsys, "status", str(out.root), "--render", summary.render_id)
    assert "shot 'shot000' failed: " in printed and "; retried: 1 decode-tile" in printed, printed


def test_a_schedule_too_big_to_record_is_recorded_by_its_size(monkeypatch):
    """Past `MAX_RECORDED_STEPS` the set-up line holds the schedule's size only, and says the render cannot
    be rebuilt from it (instead of a line of megabytes)."""
    import json

    from farm.planning import render_events
    from farm.planning.schedule import make_schedule
    from farm.planning.tiling import Geometry, TileGrid, assign_round_robin, plan_shot

    shot = plan_shot("a", (8, 3, 4, 4), Geometry(8, 4), TileGrid((1, 1, 2), (0, 0, 1)))
    state = RenderState(make_schedule(assign_round_robin([shot], 2), n_decode=2, n_io=0), batches=[1])
    whole = render_events.state_setup_record(state.setup)
    assert whole["complete"] and render_events.state_setup_from_record(whole) is not None
    monkeypatch.setattr(render_events, "MAX_RECORDED_STEPS", 2)  # this schedule has 2 decodes and a blend
    line = render_events.setup_line(render_id="r", host="h", pid=1, version="v", started=0.0, shots=["a"],
                                    state_setup=state.setup)  # fmt: skip
    recorded = json.loads(line)["setup"]["state"]
    assert not recorded["complete"] and "decodes" not in recorded["schedule"]
    assert recorded["schedule"] == {"window": state.window, "n_decode": 2, "n_io": 0, "decodes_count": 2,
                                    "blends_count": 1}  # fmt: skip
    assert render_events.state_setup_from_record(recorded) is None
