"""Workflows on a long-lived cluster: `farm cluster` as a real subprocess, `farm submit` in the foreground and
detached (its submitter SIGKILLed), `farm cancel` and Ctrl-C leaving resumable outputs, priorities on one
worker, and the farm page / metrics of what was submitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import av
import numpy as np
import pytest
import zarr
from distributed import Client

import farm
from farm.run.cluster import workers_info
from farm.store.frames import read_frames
from farm.store.output import Output
from farm.store.progress import output_progress
from tests.helpers import workers_paused

ROOT = Path(__file__).resolve().parents[1]
RENDER_FOLDER = str(ROOT / "workflows" / "render_folder.py")
RERENDER = str(ROOT / "workflows" / "rerender.py")
LONG_OPTIONS = ["--tiles", "2,1,1", "--batch-frames", "8"]
LONG_BATCHES = 6 * 17  # long_job: 6 shots of 129 frames in batches of 8


def farm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "farm", *args]


class FarmCluster:
    """`farm cluster` in a subprocess (its own session), with its printed addresses."""

    def __init__(self, tmp: Path, workers: int, *extra: str) -> None:
        self.scheduler_file = tmp / "scheduler.json"
        self.proc = subprocess.Popen(
            farm_cmd("cluster", "--workers", str(workers), "--port", "0", "--dashboard-port", "0",
                     "--scheduler-file", str(self.scheduler_file), *extra),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for_line("ready", timeout=90)
        self.address = self.value("scheduler")
        self.page = self.value("farm page")
        self.client = Client(self.address, set_as_default=False)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.time() > deadline:
                printed = "\n".join(self.lines)
                raise AssertionError(f"farm cluster did not print {text!r}:\n{printed}")
            time.sleep(0.05)

    def value(self, name: str) -> str:
        prefix = f"farm cluster: {name} "
        return next(line[len(prefix) :] for line in self.lines if line.startswith(prefix))

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.client.close()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def tasks_of(self, render: str) -> list:
        def keys(dask_scheduler, render):
            return [k for k in dask_scheduler.tasks if isinstance(k, tuple) and len(k) > 1
                    and (k[1] == render or str(k[1]).startswith(render + "."))]  # fmt: skip

        return self.client.run_on_scheduler(keys, render=render)

    def submission(self, sid: str) -> dict:
        return self.client.get_metadata(["farm", "submissions", sid], default={})

    def wait_submission(self, sid: str, timeout: float = 120) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            record = self.submission(sid)
            if record.get("state") in ("done", "failed", "cancelled"):
                return record
            time.sleep(0.2)
        raise AssertionError(f"submission {sid} did not end in {timeout} s: {self.submission(sid)}")


def submit(cluster: FarmCluster, *args: str, script: str = RENDER_FOLDER, **kw) -> subprocess.Popen:
    """`farm submit …` as a terminal starts it: its own session, Ctrl-C handled by default (a child
    inherits an ignored SIGINT, and code earlier in a test run may have left this process ignoring it)."""
    cmd = farm_cmd("submit", script, "--scheduler-file", str(cluster.scheduler_file), *args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_default_ctrl_c, **kw)  # fmt: skip


def _default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def done_markers(out: Path) -> int:
    return sum(len(list(d.iterdir())) for d in (out / ".farm" / "done").glob("*") if d.is_dir()) if (
        out / ".farm" / "done").exists() else 0  # fmt: skip


def batches_done(out: Path) -> int:
    o = Output(out)
    return sum(len(o.batches_done(p.shot)) for p in output_progress(out)) if out.exists() else 0


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def farm_status(out: Path) -> str:
    return subprocess.run(farm_cmd("status", str(out)), capture_output=True, text=True, check=True).stdout


# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, Path]:
    """A folder of two small jobs, and a long job (6 shots x 129 frames: 102 batches of 8) in its own."""
    root = tmp_path_factory.mktemp("jobs")
    small = root / "small"
    farm.synth(small / "alpha.zarr", decoder="ltx2-tiny", shots=2, frames=17, height=64, width=64, seed=1)
    farm.synth(small / "beta.zarr", decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, seed=2)
    zarr.open_group(str(small / "notes.zarr"), mode="w")  # a Zarr group but not a job store: skipped
    long = root / "long"
    farm.synth(long / "long.zarr", decoder="ltx2-tiny", shots=6, frames=129, height=64, width=64, seed=3)
    high = root / "high"
    farm.synth(high / "urgent.zarr", decoder="ltx2-tiny", shots=2, frames=33, height=64, width=64, seed=4)
    return {"small": small, "long": long, "high": high}


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    cluster = FarmCluster(tmp_path_factory.mktemp("cluster2"), workers=2)
    yield cluster
    if cluster.proc.poll() is None:
        assert cluster.stop(signal.SIGINT) == 0
    assert not cluster.scheduler_file.exists()


def test_cluster_prints_where_it_is_and_serves_the_farm_page(cluster2):
    identity = json.loads(cluster2.scheduler_file.read_text())
    assert identity["address"] == cluster2.address and cluster2.address.startswith("tcp://127.0.0.1:")
    assert cluster2.page.startswith("http://127.0.0.1:") and cluster2.page.endswith("/farm")
    assert any("2 CPU worker(s)" in line for line in cluster2.lines)
    assert len(workers_info(cluster2.client)) == 2
    with urllib.request.urlopen(cluster2.page, timeout=10) as response:
        assert b"farm renders" in response.read()


def test_cluster_starts_io_workers_and_renders_write_on_them(tmp_path):
    """`farm cluster --io-workers N` starts the CPU-only writers `farm render` starts for its own
    cluster; a render joining it writes its batches there (all but the last)."""
    from distributed import get_task_stream

    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64, seed=5)
    cluster = FarmCluster(tmp_path, 1, "--io-workers", "2")
    try:
        assert any("farm cluster: 2 I/O worker(s)" in line for line in cluster.lines)
        workers = workers_info(cluster.client)
        io = {addr for addr, w in workers.items() if str(w["name"]).startswith("farm-io-")}
        assert len(workers) == 3 and len(io) == 2
        with get_task_stream(client=cluster.client) as stream:
            stats = farm.render(str(job), str(tmp_path / "out"), scheduler=cluster.address,
                                options=farm.PlanOptions(batch_frames=8), log=lambda _m: None)  # fmt: skip
        assert stats.frames_written == 17 and not stats.failed
        writes = [d["worker"] for d in stream.data if "write-batch" in str(d["key"])]
        # all but the decode worker's last batch, which is written where it was blended (planning.schedule)
        assert len(writes) == 3 and sum(w in io for w in writes) == 2
    finally:
        assert cluster.stop() == 0


def test_cluster_refuses_a_negative_io_worker_count() -> None:
    result = subprocess.run(farm_cmd("cluster", "--io-workers", "-1", "--port", "0"), capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "--io-workers -1 is invalid; give a number ≥ 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_foreground_submit_renders_a_folder_with_per_job_overrides(cluster2, jobs, tmp_path):
    overrides = tmp_path / "overrides.toml"
    overrides.write_text(
        '[defaults]\nbatch_frames = 8\ntiles = "1,1,1"\n\n'
        '[jobs."beta.zarr"]\ndtype = "bfloat16"\ntiles = [2, 1, 1]\npriority = 3\n'
    )
    out = tmp_path / "renders"
    proc = submit(cluster2, "--", str(jobs["small"]), "--out", str(out), "--overrides", str(overrides))
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, text
    sid = text.split("farm: submission ", 1)[1].split(":", 1)[0]
    assert "skipping notes.zarr" in text
    for name, shots, frames in (("alpha", 2, 17), ("beta", 1, 9)):
        status = farm_status(out / name)
        assert f"{shots} of {shots} shots finished" in status, status
        assert read_frames(Output(out / name), "shot000").shape == (frames, 64, 64, 3)
    beta = zarr.open_group(str(out / "beta" / "frames.zarr"), mode="r").attrs["farm"]
    assert beta["decoder"]["dtype"] == "bfloat16"  # the override, through a view of the job store
    alpha = zarr.open_group(str(out / "alpha" / "frames.zarr"), mode="r").attrs["farm"]
    assert alpha["decoder"]["dtype"] == "float32"
    assert cluster2.submission(sid)["state"] == "done"
    renders = cluster2.client.get_metadata(["farm", "renders"])
    mine = {rid: r for rid, r in renders.items() if rid.startswith(sid + ".")}
    assert sorted(r["out"] for r in mine.values()) == [str(out / "alpha"), str(out / "beta")]
    assert {r["out"]: r["priority"] for r in mine.values()} == {str(out / "alpha"): 0, str(out / "beta"): 3}
    assert not cluster2.tasks_of(sid)  # nothing left behind on the scheduler


@pytest.mark.slow
def test_render_folder_refuses_unknown_override_keys(jobs, tmp_path):
    overrides = tmp_path / "o.json"
    overrides.write_text(json.dumps({"jobs": {"alpha": {"tile": [1, 1, 2]}}}))
    cmd = [sys.executable, RENDER_FOLDER, str(jobs["small"]), "--out", str(tmp_path / "o"),
           "--overrides", str(overrides)]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "unknown option(s) ['tile']" in run.stdout and "Traceback" not in run.stdout + run.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def detached_render(cluster2, jobs, tmp_path_factory) -> Path:
    """The long job submitted with --detach --follow; the follower is SIGKILLed mid-render."""
    out = tmp_path_factory.mktemp("detached") / "renders"
    proc = submit(cluster2, "--detach", "--follow", "--", str(jobs["long"]), "--out", str(out), *LONG_OPTIONS)
    long_out = out / "long"
    wait_until(lambda: done_markers(long_out) >= 1, 120, "the first batch of the detached render")
    with workers_paused(cluster2.client):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill = batches_done(long_out)
    text = proc.stdout.read()
    sid = text.split("farm: submission ", 1)[1].split(":", 1)[0]
    assert at_kill < LONG_BATCHES, "the render ended before its submitter was killed: make the job longer"
    record = cluster2.wait_submission(sid)
    assert record["state"] == "done" and record["exit_code"] == 0, record
    return long_out


def test_detached_render_finishes_after_its_submitter_is_killed(detached_render):
    status = farm_status(detached_render)
    assert "6 of 6 shots finished" in status, status
    assert batches_done(detached_render) == LONG_BATCHES
    for shot in output_progress(detached_render):
        assert shot.video and (detached_render / "videos" / f"{shot.shot}.mp4").stat().st_size > 0


def test_cancel_keeps_finished_batches_and_a_rerun_resumes(cluster2, jobs, detached_render, tmp_path):
    out = tmp_path / "renders"
    args = ["--", str(jobs["long"]), "--out", str(out), *LONG_OPTIONS]
    sid = submit(cluster2, "--detach", *args).communicate(timeout=60)[0].strip().splitlines()[-1]
    wait_until(lambda: done_markers(out / "long") >= 2, 120, "two finished batches")
    with workers_paused(cluster2.client):
        cancel = subprocess.run(farm_cmd("cancel", sid, "--scheduler", cluster2.address),
                                capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert f"cancelled {sid}" in cancel.stderr
    record = cluster2.wait_submission(sid, timeout=30)
    assert record["state"] == "cancelled" and record["exit_code"] == 130, record
    assert not cluster2.tasks_of(sid)
    kept = batches_done(out / "long")
    time.sleep(1.0)
    assert batches_done(out / "long") == kept, "batches were still being written after the cancel"
    assert 2 <= kept < LONG_BATCHES, "the render ended before it was cancelled: make the job longer"
    assert "of 6 shots finished" in farm_status(out / "long")
    renders = cluster2.client.get_metadata(["farm", "renders"])
    assert [r["state"] for rid, r in renders.items() if rid.startswith(sid + ".")] == ["cancelled"]

    rerun = submit(cluster2, "--detach", *args).communicate(timeout=60)[0].strip().splitlines()[-1]
    record = cluster2.wait_submission(rerun)
    assert record["state"] == "done", record
    assert any("resuming" in line for line in record["log"]), record["log"]
    assert batches_done(out / "long") == LONG_BATCHES
    for shot in ("shot000", "shot003", "shot005"):  # same bytes as the uninterrupted render
        a, b = read_frames(Output(out / "long"), shot), read_frames(Output(detached_render), shot)
        assert np.array_equal(a, b)


def test_rerender_renders_only_the_named_shots_again(cluster2, jobs, detached_render):
    out = Output(detached_render)
    frames_before = read_frames(out, "shot000")
    video_before = out.video("shot001").read_bytes()
    shot001 = detached_render / ".farm" / "done" / "shot001"
    untouched = {p: p.stat().st_mtime_ns for p in shot001.iterdir()}
    marker = out.done_marker("shot000", 0).stat().st_mtime_ns
    args = ["--", str(jobs["long"] / "long.zarr"), "--out", str(detached_render), "--shots", "shot000",
            *LONG_OPTIONS]  # fmt: skip
    proc = submit(cluster2, "--detach", *args, script=RERENDER)
    sid = proc.communicate(timeout=60)[0].strip().splitlines()[-1]
    record = cluster2.wait_submission(sid)
    assert record["state"] == "done", record
    assert any("shot000: 17/17 batches" in line for line in record["log"]), record["log"]
    assert out.done_marker("shot000", 0).stat().st_mtime_ns > marker  # rendered again
    assert {p: p.stat().st_mtime_ns for p in shot001.iterdir()} == untouched
    assert np.array_equal(read_frames(out, "shot000"), frames_before)  # deterministic: the same frames
    assert out.video("shot001").read_bytes() == video_before
    with av.open(str(out.video("shot000"))) as video:
        assert sum(1 for _ in video.decode(video=0)) == frames_before.shape[0]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stopping_a_foreground_submit_releases_its_tasks(cluster2, jobs, tmp_path, how):
    out = tmp_path / "renders"
    proc = submit(cluster2, "--", str(jobs["long"]), "--out", str(out), *LONG_OPTIONS)
    wait_until(lambda: done_markers(out / "long") >= 1, 120, "the first batch")
    with workers_paused(cluster2.client):
        if how == "ctrl-c":  # a terminal sends SIGINT to the submitter and its script
            os.killpg(proc.pid, signal.SIGINT)
        else:  # `kill PID` reaches the submitter only: it stops the script (its own process group) itself
            proc.send_signal(signal.SIGTERM)
        text, _ = proc.communicate(timeout=60)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), text   # 128 + the signal (docs/guarantees)
    sid = text.split("farm: submission ", 1)[1].split(":", 1)[0]
    wait_until(lambda: not cluster2.tasks_of(sid), 30, "the scheduler to release the tasks")
    assert cluster2.submission(sid)["state"] == "cancelled"
    assert 1 <= batches_done(out / "long") < LONG_BATCHES


def test_farm_page_lists_submissions(cluster2):
    with urllib.request.urlopen(cluster2.page.replace("/farm", "/farm/api/renders.json"), timeout=10) as r:
        snapshot = json.loads(r.read())
    states = {s["state"] for s in snapshot["submissions"]}
    assert {"done", "cancelled"} <= states
    assert all(r["state"] in ("done", "cancelled") for r in snapshot["renders"])


def test_higher_priority_tiles_go_first_on_one_worker(cluster2, jobs, tmp_path):
    """Two renders share a one-worker cluster (cluster2 with one of its workers retired, one task thread):
    the high-priority one, submitted while the low one runs, has all its tiles decoded before any more of
    the low one's."""
    client = cluster2.client
    client.retire_workers(workers=sorted(workers_info(client))[1:], close_workers=True)
    wait_until(lambda: len(workers_info(client)) == 1, 30, "one worker")
    client.get_task_stream()  # starts recording the task stream
    out = tmp_path / "renders"
    overrides = tmp_path / "o.json"
    overrides.write_text(json.dumps({"defaults": {"window": 100}}))  # every tile of the job at once
    low = submit(cluster2, "--detach", "--priority", "0", "--", str(jobs["long"]), "--out", str(out),
                 *LONG_OPTIONS)  # fmt: skip
    low_sid = low.communicate(timeout=60)[0].strip().splitlines()[-1]
    wait_until(lambda: done_markers(out / "long") >= 1, 120, "the low-priority render to start")
    high = submit(cluster2, "--detach", "--priority", "10", "--", str(jobs["high"]), "--out", str(out),
                  "--overrides", str(overrides), *LONG_OPTIONS)  # fmt: skip
    high_sid = high.communicate(timeout=60)[0].strip().splitlines()[-1]
    cluster2.wait_submission(high_sid)
    low_at_high_end = batches_done(out / "long")
    cluster2.wait_submission(low_sid)
    stream = client.get_task_stream()
    assert low_at_high_end < LONG_BATCHES, "the low-priority render finished before the high one: no contest"

    def starts(sid: str) -> list[float]:
        return sorted(
            next(s["start"] for s in t["startstops"] if s["action"] == "compute")
            for t in stream
            if t["key"][0] == "decode-tile" and str(t["key"][1]).startswith(sid)
        )

    low_starts, high_starts = starts(low_sid), starts(high_sid)
    assert len(high_starts) == 4 and len(low_starts) == 12
    first, last = high_starts[0], high_starts[-1]
    interleaved = [t for t in low_starts if first < t < last]
    assert not interleaved, f"{len(interleaved)} low-priority tiles started while high-priority tiles waited"
    assert low_starts[0] < first < low_starts[-1]  # the high job arrived while the low one was running
    assert batches_done(out / "long") == LONG_BATCHES and batches_done(out / "urgent") == 2 * 5


def test_cluster_stops_cleanly_on_sigterm(cluster2):
    assert cluster2.stop(signal.SIGTERM) == 0
    assert any("farm cluster: stopped" in line for line in cluster2.lines)
    assert not cluster2.scheduler_file.exists()


@pytest.mark.slow
def test_profile_setup_prints_a_row_per_job_size():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_setup.py"), "--shots", "1", "--shots", "3",
         "--frames", "9", "--height", "64", "--width", "96", "--repeats", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [
        line.split("|")
        for line in result.stdout.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 3 ")
    ]
    assert [r[1].strip() for r in rows] == ["1", "3"]
    assert all(float(x) > 0 for r in rows for x in r[3:7])


def test_render_folder_takes_carry_with_a_temporal_chunk_only(monkeypatch):
    import importlib.util

    from farm.errors import FarmError

    spec = importlib.util.spec_from_file_location("render_folder", RENDER_FOLDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "render_folder", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    options = module.plan_options({"chunk": [4, 0, 0], "carry": True}, "hero")
    assert options.chunk.frames == 4 and options.chunk.carry
    assert not module.plan_options({"chunk": [4, 0, 0]}, "hero").chunk.carry
    with pytest.raises(FarmError, match="hero: carry = true needs a temporal chunk"):
        module.plan_options({"carry": True}, "hero")
    with pytest.raises(FarmError, match="carry = 'yes' is invalid"):
        module.plan_options({"chunk": [4, 0, 0], "carry": "yes"}, "hero")
