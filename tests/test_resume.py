"""Resume and failures: real SIGKILLs of the render process and of workers, then reruns into the same OUT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent, synth
from farm.planning.options import PlanOptions
from farm.run.render import render
from farm.store.frames import read_frames
from farm.store.job import open_job, write_shot
from farm.store.output import Output
from farm.store.output_kinds import TIMELINE
from tests.helpers import CAUSAL_LTX2_TINY, assert_same_video, farm

OPTIONS = PlanOptions(tiles=(2, 1, 2), overlap=(1, 0, 1), batch_frames=8)
QUIET = {"log": lambda _: None}


@pytest.fixture(scope="module")
def long_job(tmp_path_factory) -> Path:
    """3 shots of 41 frames (6 batches each): long enough to kill mid-render."""
    path = tmp_path_factory.mktemp("resume") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=3, frames=41, height=128, width=192, seed=3)
    return path


@pytest.fixture(scope="module")
def causal_long_job(tmp_path_factory) -> Path:
    """The same shots for a causal LTX-2 decoder, whose state carries across temporal chunks."""
    path = tmp_path_factory.mktemp("resume-causal") / "job.zarr"
    synth(path, decoder=CAUSAL_LTX2_TINY, shots=3, frames=41, height=128, width=192, seed=3)
    return path


@pytest.fixture(scope="module")
def uninterrupted(long_job, tmp_path_factory, scheduler3) -> Output:
    out = Output(tmp_path_factory.mktemp("clean") / "out")
    stats = render(long_job, out.root, scheduler=scheduler3, options=OPTIONS, **QUIET)
    assert not stats.failed
    return out


def assert_same_output(a: Output, b: Output, job: Path) -> None:
    """Zarr frames byte-identical; videos the same frames (x264 output is not byte-reproducible)."""
    for shot in open_job(job).shots:
        assert read_frames(a, shot).tobytes() == read_frames(b, shot).tobytes()
        assert_same_video(a.video(shot), b.video(shot))


def cli_render(job: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "farm", "render", str(job), "--out", str(out), "--workers", "2",
           "--tiles", "2,1,2", "--overlap", "1,0,1", "--batch-frames", "8", *extra]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def wait_for_markers(
    out: Output, count: int, timeout: float = 120, shots: tuple[str, ...] = ("shot000", "shot001", "shot002")
) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = sum(len(out.batches_done(s)) for s in shots)
        if done >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} batches finished in {timeout} s")


def test_latent_hash_is_the_blockwise_digest_older_outputs_recorded(tmp_path):
    """The latent is now read in one call (through zarrs when installed), but its digest is still the
    sha256 of its 8-latent-frame blocks in order, so an OUT recorded by an older farm still resumes."""
    import hashlib

    from farm.run.resume import latent_identity

    # 89 frames: 12 latent frames, one whole block of 8 and one of 4
    synth(tmp_path / "job", decoder="ltx2-tiny", shots=1, frames=89, height=64, width=64)
    job = open_job(tmp_path / "job")
    shot = next(iter(job.shots))
    latent = np.asarray(zarr.open_array(store=str(tmp_path / "job" / shot / "latent"), mode="r")[...])
    expected = hashlib.sha256()
    for start in range(0, latent.shape[1], 8):
        expected.update(np.ascontiguousarray(latent[:, start : start + 8]).tobytes())
    got = latent_identity(job, shot)
    assert latent.shape[1] == 12 and got["sha256"] == expected.hexdigest()
    assert hashlib.sha256(latent.tobytes()).hexdigest() != got["sha256"]  # blocks, not the whole array


def test_sigkill_of_render_and_its_cluster_then_resume(long_job, uninterrupted, tmp_path):
    out = Output(tmp_path / "out")
    proc = cli_render(long_job, out.root)
    wait_for_markers(out, 6, shots=("shot000",))  # kill once the first shot's batches are all written
    os.killpg(proc.pid, signal.SIGKILL)  # the render process and its local cluster, mid-run
    proc.wait()
    done_before = {s: out.batches_done(s) for s in open_job(long_job).shots}
    assert 6 <= sum(map(len, done_before.values())) < 18
    assert any((out.root / ".farm" / "locks").iterdir())  # shot locks left behind by the killed holder

    rerun = subprocess.run(
        [sys.executable, "-m", "farm", "render", str(long_job), "--out", str(out.root), "--workers", "2",
         "--tiles", "2,1,2", "--overlap", "1,0,1", "--batch-frames", "8"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    # finished shots are skipped, part-finished ones resume (which of the two depends on the kill's timing)
    assert "resuming" in rerun.stderr or "2 shot(s) to render" in rerun.stderr  # messages: stderr
    import re

    decoded_again = int(re.search(r"\((\d+) tiles decoded\)", rerun.stderr).group(1))
    assert decoded_again <= 8  # only tiles of unfinished batches were decoded: none of shot000's
    assert_same_output(out, uninterrupted, long_job)
    assert not list(out.root.rglob("*.tmp*")) and not any((out.root / ".farm" / "locks").iterdir())

    status = subprocess.run([sys.executable, "-m", "farm", "status", str(out.root)], capture_output=True,
                            text=True)  # fmt: skip
    assert status.returncode == 0
    assert "shot000" in status.stdout and "6/6" in status.stdout and "3 of 3 shots finished" in status.stdout


def test_lost_worker_mid_render(long_job, uninterrupted, tmp_path, cluster3):
    out = Output(tmp_path / "out")
    pids = list(cluster3.run(os.getpid).values())
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(stats=render(long_job, out.root, scheduler=cluster3.scheduler.address,
                                                     options=OPTIONS, **QUIET))
    )  # fmt: skip
    thread.start()
    wait_for_markers(out, 2)
    os.kill(pids[0], signal.SIGKILL)
    thread.join(timeout=300)
    assert not result["stats"].failed
    assert_same_output(out, uninterrupted, long_job)
    cluster3.wait_for_workers(3, timeout=180)  # the nanny restarts it for the next tests (slow when loaded)


def test_lost_worker_mid_carried_render_recomputes_the_state_chain(causal_long_job, tmp_path, cluster3):
    """Carried chunks: a killed worker takes the decoder states of its tiles' chunks with it; the chunks
    before are decoded again for them (Dask lineage), and the frames are the uninterrupted render's."""
    from farm.media.settings import VideoSettings
    from farm.planning.tiling import ChunkSize

    carried = PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8,
                             chunk=ChunkSize(frames=2, carry=True))  # fmt: skip
    quiet = {"options": carried, "video": VideoSettings(enabled=False), **QUIET}
    clean = Output(tmp_path / "clean")
    assert not render(causal_long_job, clean.root, scheduler=cluster3.scheduler.address, **quiet).failed
    out = Output(tmp_path / "out")
    pids = list(cluster3.run(os.getpid).values())
    result = {}
    address = cluster3.scheduler.address
    thread = threading.Thread(
        target=lambda: result.update(stats=render(causal_long_job, out.root, scheduler=address, **quiet))
    )
    thread.start()
    wait_for_markers(out, 2)
    os.kill(pids[0], signal.SIGKILL)
    thread.join(timeout=300)
    assert not result["stats"].failed
    for shot in open_job(causal_long_job).shots:
        assert read_frames(out, shot).tobytes() == read_frames(clean, shot).tobytes()
    cluster3.wait_for_workers(3, timeout=180)  # the nanny restarts it (a torch import on 2 loaded cores)


def test_an_auto_resume_keeps_the_carried_chunks_its_output_started_with(
    causal_long_job, tmp_path, scheduler3
):
    """OUT started with carried chunks; a rerun with auto tiles and no --chunk keeps them (as it keeps
    the grid) and finishes with the bytes of an uninterrupted carried render, instead of being refused
    for a changed plan."""
    from farm.media.settings import VideoSettings
    from farm.planning.options import AUTO
    from farm.planning.tiling import ChunkSize
    from farm.run.resume import recorded_layout

    chunk = ChunkSize(frames=2, carry=True)
    carried = PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=chunk)
    quiet = {"scheduler": scheduler3, "video": VideoSettings(enabled=False), **QUIET}
    clean, out = Output(tmp_path / "clean"), Output(tmp_path / "out")
    assert not render(causal_long_job, clean.root, options=carried, **quiet).failed
    assert not render(causal_long_job, out.root, options=carried, frames="1-16", **quiet).failed
    shots = list(open_job(causal_long_job).shots)
    assert recorded_layout(out, shots, restart=False).chunks == dict.fromkeys(shots, chunk)
    stats = render(causal_long_job, out.root, options=PlanOptions(tiles=AUTO, batch_frames=8), **quiet)
    assert not stats.failed and stats.batches_written == 3 * 4  # batches 3-6 of each shot
    for shot in shots:
        assert read_frames(out, shot).tobytes() == read_frames(clean, shot).tobytes()


def test_changed_latents_are_refused_then_restarted(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=2, frames=9, height=64, width=64)
    out = Output(tmp_path / "out")
    render(job, out.root, scheduler=scheduler3, **QUIET)
    before = {s: out.video(s).read_bytes() for s in ("shot000", "shot001")}
    write_shot(job, "shot001", smooth_latent(np.random.default_rng(99), (8, 2, 2, 2)), fps=24.0)
    with pytest.raises(FarmError, match="shot 'shot001': the latents changed"):
        render(job, out.root, scheduler=scheduler3, **QUIET)
    with pytest.raises(FarmError, match="--batch-frames: OUT has 9, this render 4"):
        render(job, out.root, scheduler=scheduler3, options=PlanOptions(batch_frames=4), **QUIET)
    assert {s: out.video(s).read_bytes() for s in before} == before  # nothing lost
    stats = render(job, out.root, scheduler=scheduler3, restart=True, **QUIET)
    assert not stats.failed and out.video("shot001").read_bytes() != before["shot001"]


def test_second_render_into_a_live_output_is_refused(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from farm.store.lock import output_lock\n"
         "with output_lock(Path(sys.argv[1]), ['shot000'], job=sys.argv[2]):\n"
         "    print('held', flush=True); time.sleep(60)", str(out), str(job)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        held_by = f"being written by another farm render: shot\\(s\\) 'shot000' by pid {holder.pid} "
        with pytest.raises(FarmError, match=held_by):
            render(job, out, scheduler=scheduler3, **QUIET)
    finally:
        holder.kill()
        holder.wait()
    assert not render(job, out, scheduler=scheduler3, **QUIET).failed  # its holder is gone: taken over


def test_nan_and_corrupt_latents_fail_their_shot_only(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=3, frames=17, height=64, width=64)
    nan = smooth_latent(np.random.default_rng(1), (8, 3, 2, 2))
    nan[:, 2] = np.nan
    write_shot(job, "shot001", nan, fps=24.0)
    chunk = next(p for p in (job / "shot002" / "latent" / "c").rglob("*") if p.is_file())
    chunk.write_bytes(b"this is not a zstd chunk")
    result = subprocess.run(
        [sys.executable, "-m", "farm", "render", str(job), "--out", str(tmp_path / "out"), "--scheduler",
         scheduler3], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "shot 'shot001'" in result.stderr and "NaN or Inf in latent frames [2]" in result.stderr
    assert "shot 'shot002'" in result.stderr and "cannot read latent frames" in result.stderr
    assert "1 of 3 shots finished" in result.stderr
    assert Output(tmp_path / "out").video("shot000").exists()
    # no shot can render: refused, and the new OUT is not left behind (its latents were hashed while the
    # client joined the running cluster: a fresh OUT has nothing to refuse before that)
    only_nan = tmp_path / "nan.zarr"
    synth(only_nan, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64)
    write_shot(only_nan, "shot000", nan, fps=24.0)
    with pytest.raises(FarmError, match=r"shot 'shot000': latent holds NaN or Inf in latent frames \[2\]"):
        render(only_nan, tmp_path / "out-nan", scheduler=scheduler3, **QUIET)
    assert not (tmp_path / "out-nan").exists()


def test_bad_job_stores_and_outputs(tmp_path, scheduler3):
    not_zarr = tmp_path / "plain"
    not_zarr.mkdir()
    with pytest.raises(FarmError, match="not a Zarr job store"):
        render(not_zarr, tmp_path / "o1", scheduler=scheduler3, **QUIET)
    group = zarr.open_group(store=str(tmp_path / "nofarm.zarr"), mode="w", zarr_format=3)
    group.attrs["x"] = 1
    with pytest.raises(FarmError, match="not a farm job store"):
        render(tmp_path / "nofarm.zarr", tmp_path / "o2", scheduler=scheduler3, **QUIET)
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    zarr.open_group(store=str(job), mode="r+").create_group("bad name!")
    stats = render(job, tmp_path / "o3", scheduler=scheduler3, **QUIET)  # fails that shot, not the render
    assert [s.shot for s in stats.failed] == ["bad name!"]
    assert "shot name 'bad name!' is not allowed" in stats.shots["bad name!"].error
    assert stats.shots["shot000"].video
    assert (tmp_path / "o3" / "timeline.otio").exists() == TIMELINE.available()
    job2 = tmp_path / "job2.zarr"
    synth(job2, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    write_shot(job2, "wrong-channels", np.zeros((4, 2, 2, 2), np.float32), fps=24.0)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(FarmError, match="not writable"):
        render(job2, a_file / "out", scheduler=scheduler3, **QUIET)
    stats = render(job2, tmp_path / "o4", scheduler=scheduler3, **QUIET)
    assert [s.shot for s in stats.failed] == ["wrong-channels"]
    assert "has 4 channels but the decoder" in stats.shots["wrong-channels"].error
    assert stats.shots["shot000"].video


def test_an_output_decoded_with_a_superseded_config_is_refused_and_named(tmp_path):
    """Outputs rendered when `ltx2-tiny` meant diffusers' causal defaults record no config revision: a
    rerun is refused (its frames would mix two decoders) with the reason and --restart, `farm status`
    names the shot, and --restart renders it over with the released decoder."""
    from farm.decoders import spec_from_json
    from farm.media.settings import VideoSettings

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64)
    out = tmp_path / "out"
    options = {"workers": 1, "video": VideoSettings(enabled=False), **QUIET}
    assert not render(job, out, **options).failed
    group = zarr.open_group(str(Output(out).shot_group("shot000")), mode="r+")
    identity = dict(group.attrs["render"])
    assert identity["decoder"]["config_revision"] == 2
    identity["decoder"] = {k: v for k, v in identity["decoder"].items() if k != "config_revision"}
    group.attrs["render"] = identity  # as an earlier farm recorded it
    superseded = r"superseded by revision 2 \(now the released LTX-2 decoder.*--restart"
    with pytest.raises(FarmError, match=superseded):
        render(job, out, **options)
    status = farm("status", str(out))
    assert status.returncode == 1
    assert "shot 'shot000' was decoded with ltx2 config 'ltx2-tiny' revision 1" in status.stderr
    assert not render(job, out, restart=True, **options).failed
    assert farm("status", str(out)).returncode == 0
    # a spec that asks for the superseded revision is refused; one that names none gets the current one
    raw = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}}
    assert spec_from_json(raw).to_json()["config_revision"] == 2
    with pytest.raises(FarmError, match="revision 1 is superseded"):
        spec_from_json({**raw, "config_revision": 1})
