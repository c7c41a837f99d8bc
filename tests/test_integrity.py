"""Integrity: farm removes only what it wrote, trusts no marker whose outputs changed, refuses an output
it cannot identify, and says why in one line. Real job stores, a real local cluster, real videos."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import farm
from farm import cli
from farm.errors import FarmError
from farm.media.settings import VideoSettings
from farm.store.frames import read_frames
from farm.store.output import Output
from farm.store.progress import output_progress

QUIET = {"log": lambda _: None}
TILES = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever needs a cluster fails to connect


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its content hash."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """`farm ARGV` in this process: (exit code, stdout and stderr)."""
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("integrity") / "job.zarr"
    farm.synth(path, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=64)
    return path


# --- farm deletes only what it wrote -------------------------------------------------------------


def test_synth_overwrite_replaces_only_a_job_store(tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"precious")
    code, err = run_cli(capsys, "synth", str(folder), "--overwrite")
    assert code == 2 and "is not a farm job store" in err and len(err.strip().splitlines()) == 1
    assert (folder / "holiday.jpg").read_bytes() == b"precious"
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    assert run_cli(capsys, "synth", str(file), "--overwrite")[0] == 2 and file.read_text() == "mine"
    job = tmp_path / "job.zarr"
    assert run_cli(capsys, "synth", str(job), "--frames", "9", "--height", "64", "--width", "64")[0] == 0
    assert run_cli(capsys, "synth", str(job), "--overwrite", "--frames", "9", "--height", "64",
                   "--width", "64", "--shots", "2", "--seed", "3")[0] == 0  # fmt: skip
    assert sorted(p.name for p in job.iterdir() if p.is_dir()) == ["shot000", "shot001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.zarr", "notes.txt", "photos"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--fps", "0"], "--fps '0' is invalid"),
        (["--fps", "5000"], "--fps '5000' is invalid"),
        (["--seed", "-1"], "--seed -1 is invalid"),
        (["--seed", str(2**40)], "is invalid; use a whole number from 0"),
        (["--frames", "10"], "--frames 10 cannot be produced"),
    ],
)
def test_a_refused_synth_changes_and_leaves_nothing(tmp_path, capsys, option, message):
    job = tmp_path / "job.zarr"
    small = ["--frames", "9", "--height", "64", "--width", "64"]
    assert run_cli(capsys, "synth", str(job), *small)[0] == 0
    before = snapshot(job)
    code, err = run_cli(capsys, "synth", str(job), "--overwrite", *small, *option)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert snapshot(job) == before
    fresh = tmp_path / "fresh" / "job.zarr"
    assert run_cli(capsys, "synth", str(fresh), *small, *option)[0] == 2
    assert not fresh.parent.exists()  # nothing behind: the corrected command is not refused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.zarr"]
    assert run_cli(capsys, "synth", str(fresh), *small)[0] == 0


@pytest.mark.parametrize("where", ["same", "inside", "holds"])
def test_out_may_not_be_inside_or_hold_the_job_store(job, tmp_path, where):
    copy = tmp_path / "work" / "job.zarr"
    shutil.copytree(job, copy)
    out = {"same": copy, "inside": copy / "render", "holds": copy.parent}[where]
    before = snapshot(copy.parent)
    with pytest.raises(FarmError, match="choose an output folder outside the job store"):
        farm.render(copy, out, scheduler=NOWHERE, options=TILES, **QUIET)
    assert snapshot(copy.parent) == before and not (copy / "render").exists()


def test_restart_and_clean_up_remove_only_farm_files(job, tmp_path, scheduler3):
    out = tmp_path / "out"
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, video=VideoSettings(sequence="png8"),
                        **QUIET)  # fmt: skip
    assert not stats.failed
    o = Output(out)
    users = [
        o.shot_group("shot000") / "notes.txt",
        o.frames_array("shot000") / "c" / "README",
        o.done_dir("shot000") / "mine.txt",
        o.segments_dir("shot000") / "keep.mp4",
        o.videos_dir / "draft.tmp",
        o.videos_dir / ".draft.tmp.mp4",
        o.sequence_dir("shot000") / ".edit.tmp.png",
        o.sequence_dir("shot000") / "edit.tmp",
    ]
    for path in users:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"mine")
    stats = farm.render(job, out, scheduler=scheduler3, restart=True, video=VideoSettings(sequence="png8"),
                        options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=16), **QUIET)  # fmt: skip
    assert not stats.failed and stats.batches_written == 4
    assert all(p.read_bytes() == b"mine" for p in users)
    assert read_frames(o, "shot000").shape == (17, 64, 64, 3)


# --- verified outputs --------------------------------------------------------------------------


@pytest.fixture
def rendered(job, tmp_path, scheduler3) -> tuple[Path, dict[str, np.ndarray]]:
    out = tmp_path / "out"
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET)
    assert not stats.failed
    return out, {s: read_frames(Output(out), s) for s in ("shot000", "shot001")}


def chunk_of(out: Path, shot: str, batch: int) -> Path:
    record = json.loads(Output(out).done_marker(shot, batch).read_bytes())
    name = next(k for k, v in record["chunks"].items() if v is not None)
    return Output(out).frames_array(shot) / name


def test_markers_record_checksums_and_status_verify_checks_them(rendered, capsys):
    out, _ = rendered
    code, printed = run_cli(capsys, "status", str(out), "--verify")
    assert code == 0 and "2 of 2 shots finished" in printed
    chunk_of(out, "shot000", 1).write_bytes(b"")  # what ENOSPC leaves
    video = Output(out).video("shot001")
    video.write_bytes(video.read_bytes()[:-100])  # truncated
    code, err = run_cli(capsys, "status", str(out), "--verify")
    assert code == 1 and "2 finished output(s) are missing or damaged" in err
    rows = {r.shot: r for r in output_progress(out, verify=True)}
    assert rows["shot000"].damaged == 1 and rows["shot001"].damaged == 1
    assert not rows["shot000"].finished and not rows["shot001"].finished


def test_render_repairs_missing_truncated_and_corrupt_outputs(rendered, job, scheduler3):
    out, frames = rendered
    o = Output(out)
    chunk_of(out, "shot000", 0).unlink()  # deleted
    chunk_of(out, "shot000", 2).write_bytes(b"")  # 0 bytes
    data = bytearray(chunk_of(out, "shot001", 1).read_bytes())
    data[len(data) // 2] ^= 0xFF  # corrupt, same size
    chunk_of(out, "shot001", 1).write_bytes(bytes(data))
    o.video("shot001").unlink()  # a deleted video: its segments are gone too
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET)
    assert not stats.failed
    # shot000's two damaged batches (its video intact, kept); every batch of shot001, whose video is
    # joined again from segments removed when it was first joined
    assert stats.batches_written == 2 + 3
    for shot in frames:
        np.testing.assert_array_equal(read_frames(o, shot), frames[shot])
        assert o.video(shot).exists()
    assert all(r.finished and r.damaged == 0 for r in output_progress(out, verify=True))


def test_a_damaged_batch_of_a_shot_with_an_intact_video_renders_that_batch_alone(rendered, job, scheduler3):
    """One deleted chunk of batch 1: that batch alone is decoded again, the video is kept byte for byte,
    and the message names the batch and what of it is damaged, not the video."""
    out, frames = rendered
    o = Output(out)
    video = o.video("shot000").read_bytes()
    others = {b: o.done_marker("shot000", b).read_bytes() for b in (0, 2)}
    chunk = chunk_of(out, "shot000", 1)
    chunk.unlink()
    notes: list[str] = []
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, log=notes.append)
    assert not stats.failed and stats.batches_written == 1 and stats.frames_written == 8
    said = [n for n in notes if n.startswith("farm: shot") and "damaged" in n]
    assert said == ["farm: shot 'shot000': batch 1 (frames) missing or damaged in OUT; rendering that batch "
                    "again; its video intact and kept"], notes  # fmt: skip
    assert o.video("shot000").read_bytes() == video
    assert {b: o.done_marker("shot000", b).read_bytes() for b in (0, 2)} == others
    np.testing.assert_array_equal(read_frames(o, "shot000"), frames["shot000"])
    assert all(r.finished and r.damaged == 0 for r in output_progress(out, verify=True))


def test_a_lost_video_says_why_every_batch_renders_again(rendered, job, scheduler3):
    out, frames = rendered
    o = Output(out)
    o.video("shot001").write_bytes(o.video("shot001").read_bytes()[:-100])  # truncated
    notes: list[str] = []
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, log=notes.append)
    assert not stats.failed and stats.batches_written == 3
    said = [n for n in notes if n.startswith("farm: shot") and "damaged" in n]
    assert said == ["farm: shot 'shot001': its video missing or damaged in OUT; the segments it was joined "
                    "from are removed once joined, so 3 of its 3 batches render again to rebuild it"], notes
    np.testing.assert_array_equal(read_frames(o, "shot001"), frames["shot001"])
    assert all(r.finished and r.damaged == 0 for r in output_progress(out, verify=True))


def test_corrupt_metadata_is_one_line_never_nothing_to_render(rendered, job, capsys):
    out, _ = rendered
    (out / "frames.zarr" / "zarr.json").write_text("{not json")
    code, err = run_cli(capsys, "status", str(out))
    assert code == 2 and "damaged metadata" in err and len(err.strip().splitlines()) == 1
    code, err = run_cli(capsys, "render", str(job), "--out", str(out), "--scheduler", NOWHERE,
                        "--tiles", "1,1,1", "--batch-frames", "8")  # fmt: skip
    assert code == 2 and "cannot be established" in err and len(err.strip().splitlines()) == 1


def test_a_shot_without_its_identity_is_refused_not_resumed(rendered, job, scheduler3):
    out, frames = rendered
    (Output(out).shot_group("shot000") / "zarr.json").unlink()
    before = snapshot(out)
    with pytest.raises(FarmError, match="no readable record of what they are a render of"):
        farm.render(job, out, scheduler=NOWHERE, options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=16),
                    **QUIET)  # fmt: skip
    assert snapshot(out) == before
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, restart=True, shots=["shot000"],
                        **QUIET)  # fmt: skip
    assert not stats.failed
    np.testing.assert_array_equal(read_frames(Output(out), "shot000"), frames["shot000"])


def test_status_of_a_finished_render_without_video(job, tmp_path, scheduler3, capsys):
    out = tmp_path / "out"
    assert not farm.render(job, out, scheduler=scheduler3, options=TILES, video=VideoSettings(enabled=False),
                           **QUIET).failed  # fmt: skip
    code, printed = run_cli(capsys, "status", str(out), "--verify")
    assert code == 0 and "2 of 2 shots finished" in printed
    chunk_of(out, "shot001", 2).unlink()
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, video=VideoSettings(enabled=False),
                        **QUIET)  # fmt: skip
    assert stats.batches_written == 1 and not stats.failed  # only the damaged batch
    assert all(r.finished for r in output_progress(out, verify=True))


# --- a live scheduler file ---------------------------------------------------------------------


def test_a_live_scheduler_file_is_never_replaced(tmp_path, scheduler3):
    from farm.run import clusterd

    path = tmp_path / "scheduler.json"
    live = json.dumps({"address": scheduler3, "id": "other"})
    path.write_text(live)
    with pytest.raises(FarmError, match="belongs to a running scheduler"):
        clusterd.serve(workers=1, gpus=0, port=0, dashboard_port=0, scheduler_file=str(path),
                       log=lambda _: None)  # fmt: skip
    assert path.read_text() == live
    path.write_text(json.dumps({"address": "tcp://127.0.0.1:9", "id": "stale"}))  # nothing listens there
    stop = threading.Event()
    lines: list[str] = []
    thread = threading.Thread(target=clusterd.serve, kwargs=dict(
        workers=1, gpus=0, port=0, dashboard_port=0, scheduler_file=str(path), log=lines.append, stop=stop,
        memory_limit=None))  # fmt: skip
    thread.start()
    deadline = time.time() + 60
    while not any("ready" in line for line in lines) and time.time() < deadline:
        time.sleep(0.1)
    ours = json.loads(path.read_text())
    assert ours["id"] != "stale" and clusterd.scheduler_listening(ours["address"])
    path.write_text(live)  # another cluster's now: stopping this one leaves it
    stop.set()
    thread.join(60)
    assert path.read_text() == live


# --- consistent inputs -------------------------------------------------------------------------


def replacement(job: Path, folder: Path, name: str = "shot000", value: float = 0.5) -> Path:
    """A latent file for a shot `name`, shaped like the job's shot000, of other values."""
    shape = zarr.open_array(store=str(job / "shot000" / "latent"), mode="r").shape
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.npy"
    np.save(path, np.full(shape, value, np.float32))
    return path


def test_replace_of_a_shot_being_rendered_is_refused(job, tmp_path, scheduler3):
    from farm.inputs.ingest import ingest

    copy = tmp_path / "job.zarr"
    shutil.copytree(job, copy)
    before = snapshot(copy)
    source = replacement(copy, tmp_path / "src")
    refusals: list[str] = []

    def replace_meanwhile(stats) -> None:
        if not refusals:
            with pytest.raises(FarmError, match="is being read by a farm render") as caught:
                ingest(copy, [source], replace=True)
            refusals.append(str(caught.value))

    stats = farm.render(copy, tmp_path / "out", scheduler=scheduler3, options=TILES,
                        on_progress=replace_meanwhile, **QUIET)  # fmt: skip
    assert refusals and not stats.failed and snapshot(copy) == before
    assert ingest(copy, [source], replace=True).replaced == ["shot000"]  # once the render has ended


KILL_AT = """
import os, signal, sys
import farm.media.files, farm.inputs.ingest
calls = []
real_rename, real_exchange = os.rename, farm.media.files.exchange
def counting(real):
    def step(*args):
        if sys._getframe(1).f_code.co_name != "_commit":
            return real(*args)
        calls.append(args)
        if len(calls) > int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args)
    return step
if sys.argv[4] == "no-exchange":
    farm.inputs.ingest.exchange = counting(lambda a, b: False)
else:
    farm.inputs.ingest.exchange = counting(real_exchange)
farm.inputs.ingest.os.rename = counting(real_rename)
farm.inputs.ingest.ingest(sys.argv[1], [sys.argv[2]], replace=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exchange", "no-exchange"])
def test_replace_killed_at_any_step_loses_no_shot(job, tmp_path, mode):
    import subprocess
    import sys

    from farm.inputs.ingest import ingest
    from farm.store.job import open_job

    def latent(path: Path) -> np.ndarray:
        return np.asarray(zarr.open_array(store=str(path / "shot000" / "latent"), mode="r")[...])

    old = latent(job)
    source = replacement(job, tmp_path / "src")
    for steps in range(4):  # killed before each step of the commit, or not at all
        copy = tmp_path / f"job{steps}" / "job.zarr"
        shutil.copytree(job, copy)
        child = subprocess.run([sys.executable, "-c", KILL_AT, str(copy), str(source), str(steps), mode],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert child.returncode in (-9, 0), child.stderr
        other = replacement(job, tmp_path / "other", "extra", 0.25)
        ingest(copy, [other])  # the next ingest tidies what the killed one left
        assert set(open_job(copy).shots) == {"shot000", "shot001", "extra"}
        now = latent(copy)
        assert np.array_equal(now, old) or np.all(now == 0.5), steps
        assert not [p.name for p in copy.parent.iterdir() if p.name.startswith(".")]


# --- fail fast ---------------------------------------------------------------------------------

SLEEPER = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM])
def test_a_foreground_submit_takes_its_workflow_down_with_it(tmp_path, scheduler3, how):
    import subprocess
    import sys

    script, pid_file = tmp_path / "wf.py", tmp_path / "pid"
    script.write_text(SLEEPER)
    # a hang-up ends the submit as in a terminal, even where the tests run under nohup (ignored SIGHUP)
    submit = subprocess.Popen([sys.executable, "-m", "farm", "submit", str(script), "--scheduler",
                               scheduler3, "--", str(pid_file)], stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))  # fmt: skip
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    workflow = int(pid_file.read_text())
    submit.send_signal(how)
    code = submit.wait(30)
    if how == signal.SIGTERM:
        assert code == 143, submit.stderr.read() if submit.stderr else ""
    deadline = time.time() + 10
    while _alive(workflow) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(workflow)


def test_connecting_to_a_refused_port_or_not_a_scheduler_fails_within_seconds(cluster3, tmp_path):
    import socket

    from farm.run.cluster import connect

    started = time.time()
    with pytest.raises(FarmError, match="nothing listens at 127.0.0.1:9"), connect(scheduler=NOWHERE):
        pass
    stale = tmp_path / "scheduler.json"
    stale.write_text(json.dumps({"address": NOWHERE}))
    with pytest.raises(FarmError, match="stale scheduler file"), connect(scheduler_file=str(stale)):
        pass
    assert time.time() - started < 5
    dashboard = cluster3.dashboard_link.split("//")[1].split("/")[0]  # an HTTP server, not Dask
    with pytest.raises(FarmError, match="is not a Dask scheduler"), connect(scheduler=f"tcp://{dashboard}"):
        pass
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never speaks
        port = silent.getsockname()[1]
        started = time.time()
        with pytest.raises(FarmError, match="is not a Dask scheduler"), \
                connect(scheduler=f"tcp://127.0.0.1:{port}"):  # fmt: skip
            pass
        assert time.time() - started < 10


# --- limits before work ------------------------------------------------------------------------


def test_a_tile_no_worker_can_hold_is_refused_before_any_decode(tmp_path, capsys, scheduler3):
    from farm.inputs.synthetic import synth_spec
    from farm.store.job import create_job, write_shot

    job = tmp_path / "huge.zarr"  # 20000x20000 pixels: a few MB of latents, TBs to decode whole
    create_job(job, synth_spec("ltx2-tiny"))
    write_shot(job, "big", np.zeros((8, 2, 625, 625), np.float32), fps=24.0)
    code, err = run_cli(capsys, "plan", str(job), "--tiles", "1,1,1")
    assert code == 2 and "split it with --tiles F,H,W or bound each decode call with --chunk" in err
    with pytest.raises(FarmError, match="more than this machine has"):
        farm.render(job, tmp_path / "out", scheduler=scheduler3, options=farm.PlanOptions(tiles=(1, 1, 1)),
                    **QUIET)  # fmt: skip
    assert not Output(tmp_path / "out").frames_zarr.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "500"], "--workers 500 is beyond this machine"),
        (["--priority", str(10**30)], "--priority 1000000000000000000000000000000 is invalid"),
        (["--priority", "-1000000"], "use a whole number from -999999 to 999999"),
    ],
)
def test_limits_are_refused_in_one_line_before_a_cluster(job, tmp_path, capsys, argv, message):
    code, err = run_cli(capsys, "render", str(job), "--out", str(tmp_path / "out"), *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_compressed_input_larger_than_it_declares_is_refused_unread(tmp_path, capsys):
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (8, 3, 2, 2)})  # fmt: skip
    bomb = tmp_path / "bomb.npz"  # 100 kB that unpack to 100 MB
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("latent.npy", header.getvalue() + bytes(100_000_000))
    assert bomb.stat().st_size < 200_000
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    before = snapshot(job)
    code, err = run_cli(capsys, "ingest", str(job), str(bomb))
    assert code == 2 and "unpacks to 100000" in err and len(err.strip().splitlines()) == 1
    assert snapshot(job) == before


@pytest.mark.slow
def test_a_lost_scheduler_is_named_within_seconds(job, tmp_path):
    import subprocess
    import sys

    from distributed import Client

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    sched_file = tmp_path / "scheduler.json"
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                                  "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file",
                                  str(sched_file)], **quiet)  # fmt: skip
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        worker = subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file",
                                   str(sched_file), "--host", "127.0.0.1", "--nworkers", "1",
                                   "--nthreads", "1", "--no-dashboard"], **quiet)  # fmt: skip
        with Client(scheduler_file=str(sched_file)) as c:
            c.wait_for_workers(1, timeout=60)
        killed: list[float] = []

        def kill_the_scheduler(stats) -> None:
            if not killed:
                scheduler.kill()
                killed.append(time.monotonic())

        with pytest.raises(FarmError, match="lost the scheduler at tcp://127.0.0.1"):
            farm.render(job, tmp_path / "out", scheduler_file=str(sched_file), options=TILES,
                        on_progress=kill_the_scheduler, **QUIET)  # fmt: skip
        assert killed and time.monotonic() - killed[0] < 15
    finally:
        for proc in (worker, scheduler):
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.fixture
def small_disk(tmp_path):
    """A 160 kB file system of its own (tmpfs), grown by `grow()`; skipped where mounting is not allowed."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:  # fmt: skip
        pytest.skip("cannot mount a small file system here (needs root)")

    def grow() -> None:
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)

    yield mount, grow
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_rerun_writes_over_the_empty_chunks_a_failed_batch_left(job, tmp_path, scheduler3):
    """A batch whose write failed (a full disk) leaves 0-byte chunk files, in its frames and in the
    shot's valid array, and no done marker: the rerun renders it again without reading them back."""
    from farm.store.frames import VALID, chunk_files

    out = tmp_path / "out"
    assert not farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET).failed
    o = Output(out)
    for array_dir in (o.frames_array("shot000"), o.shot_group("shot000") / VALID):
        arr = zarr.open_array(store=str(array_dir), mode="r")
        for chunk in chunk_files(array_dir, arr, 16, 17):  # batch 2: frame 16, the last chunk, in part
            chunk.write_bytes(b"")
    o.done_marker("shot000", 2).unlink()
    o.video_done_marker("shot000").unlink()  # a shot with a failed batch has no video joined
    o.video("shot000").unlink()
    assert not farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET).failed
    assert [(row.batches_done, row.damaged) for row in output_progress(out, verify=True)] == [(3, 0), (3, 0)]
    assert zarr.open_array(store=str(o.shot_group("shot000") / VALID), mode="r")[...].all()


def test_a_full_disk_is_one_line_and_the_rerun_completes(job, small_disk, scheduler3, capsys):
    disk, grow = small_disk
    out = disk / "out"
    try:
        stats = farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET)
        errors = [s.error or "" for s in stats.failed]
    except FarmError as exc:
        errors = [str(exc)]
    full = ("No space left on device", "is full on")  # while preparing OUT / on a worker, naming the disk
    assert errors and all(any(f in e for f in full) and "\n" not in e for e in errors), errors
    grow()
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES, **QUIET)
    assert not stats.failed
    code, printed = run_cli(capsys, "status", str(out), "--verify")
    assert code == 0 and "2 of 2 shots finished" in printed


@pytest.mark.slow
def test_monitoring_calls_give_up_on_a_scheduler_that_does_not_answer(tmp_path):
    """The render's watcher asks the scheduler for cancels and workers and publishes progress: against a
    scheduler that stopped answering (here: SIGSTOP), each call gives up within seconds instead of waiting
    out Dask's reconnect timeout, so the watcher can still name a lost scheduler."""
    import subprocess
    import sys

    from distributed import Client

    from farm.run.cluster import workers_info
    from farm.run.graph import MONITOR_CALL_S, ProgressPublisher, RenderStats, cancel_requested

    sched_file = tmp_path / "scheduler.json"
    command = [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
               "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)]  # fmt: skip
    scheduler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            publisher = ProgressPublisher(client, "r1", 0, {})
            publisher.publish(RenderStats())  # a live scheduler answers
            assert cancel_requested(client, "r1") is False
            scheduler.send_signal(signal.SIGSTOP)
            for call in (lambda: cancel_requested(client, "r1"), lambda: publisher.publish(RenderStats()),
                         lambda: workers_info(client, timeout=MONITOR_CALL_S)):  # fmt: skip
                publisher.last = 0.0  # not rate-limited
                started = time.monotonic()
                with contextlib.suppress(Exception):  # a timeout, for workers_info
                    call()
                assert time.monotonic() - started < MONITOR_CALL_S + 3
            scheduler.send_signal(signal.SIGCONT)
    finally:
        scheduler.send_signal(signal.SIGCONT)
        scheduler.kill()
        scheduler.wait()
