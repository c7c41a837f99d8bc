"""What is guaranteed on failure (docs/guarantees.md), each case reproduced on a real cluster.

No command deletes or overwrites anything before its inputs and options are validated and the work is
known possible; --restart removes exactly the outputs of the settings it replaces; bad per-shot values
fail their shot by name; paths are resolved where typed; a finished OUT needs no cluster.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

import farm
from farm.errors import FarmError
from farm.inputs.synthetic import smooth_latent
from farm.media.settings import VideoSettings
from farm.planning.jobplan import plan_job
from farm.store.output import Output
from farm.store.progress import output_progress

QUIET = {"log": lambda _: None}
TILES = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever needs a cluster fails to connect


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (but the lock) with its content hash."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("guarantees") / "job.zarr"
    farm.synth(path, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=64)
    return path


@pytest.fixture(scope="module")
def finished(job, tmp_path_factory, scheduler3) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    stats = farm.render(job, out, scheduler=scheduler3, options=TILES,
                        video=VideoSettings(sequence="png8"), **QUIET)  # fmt: skip
    assert not stats.failed
    return out


def test_refused_commands_touch_nothing(job, finished):
    before = snapshot(finished)
    refusals = [
        ({"restart": True, "frames": "500-600"}, "asks for frames 500..600 beyond shot"),
        (
            {"video": VideoSettings(codec="prores_hq", sequence="png8")},
            "--codec: OUT has h264, this render prores_hq",
        ),
        (
            {"options": farm.PlanOptions(tiles=(1, 1, 1), batch_frames=4)},
            "--batch-frames: OUT has 8, this render 4",
        ),
        ({"restart": True, "video": VideoSettings(preset="nosuch")}, "--preset 'nosuch' is invalid"),
        ({"restart": True, "video": VideoSettings(first_frame=-1)}, "--first-frame -1 is invalid"),
        ({"restart": True, "video": VideoSettings(crf=99)}, "--crf 99 is invalid"),
        ({"restart": True, "window": 0}, "--window 0 is invalid"),
        ({"restart": True, "workers": 0}, "--workers must be at least 1"),
        ({"restart": True, "frames": "1-x"}, "--frames '1-x' is invalid"),
    ]
    for kwargs, message in refusals:
        kwargs = {"options": TILES, "video": VideoSettings(sequence="png8"), "scheduler": NOWHERE, **kwargs}
        if "workers" in kwargs:
            del kwargs["scheduler"]
        with pytest.raises(FarmError, match=message):
            farm.render(job, finished, **kwargs, **QUIET)
        assert snapshot(finished) == before, kwargs
    # the codec message names the setting in words, not as a dict
    with pytest.raises(FarmError) as refused:
        farm.render(job, finished, options=TILES, video=VideoSettings(codec="prores_hq", sequence="png8"),
                    **QUIET)  # fmt: skip
    assert "{" not in str(refused.value) and len(str(refused.value)) < 400


def test_a_finished_output_needs_no_cluster(job, finished):
    stats = farm.render(job, finished, scheduler=NOWHERE, options=TILES, video=VideoSettings(sequence="png8"),
                        **QUIET)  # fmt: skip
    assert not stats.failed and stats.frames_written == 0
    assert all(s.video for s in stats.shots.values())


@pytest.mark.slow  # waits for a connection to an unreachable scheduler to time out
def test_option_errors_leave_no_empty_output(job, tmp_path):
    for kwargs in ({"workers": 0}, {"frames": "1-x"}, {"video": VideoSettings(preset="nosuch")},
                   {"scheduler": NOWHERE}):  # fmt: skip
        out = tmp_path / "new"
        with pytest.raises(FarmError):
            farm.render(job, out, options=TILES, **kwargs, **QUIET)
        assert not out.exists(), kwargs


def test_restart_replaces_exactly_the_outputs_of_the_old_settings(job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    render = dict(scheduler=scheduler3, options=TILES, **QUIET)
    assert not farm.render(job, out.root, video=VideoSettings(sequence="png8"), **render).failed
    mine = [out.videos_dir / "notes.txt", out.sequence_dir("shot000") / "notes.txt", out.root / "README"]
    for path in mine:
        path.write_text("the user's own file")
    old_pngs = sorted(out.sequence_dir("shot000").glob("shot000.*.png"))
    assert [p.name for p in old_pngs][:2] == ["shot000.0001.png", "shot000.0002.png"]
    other = VideoSettings(codec="prores_hq", sequence="png8", first_frame=1001)
    stats = farm.render(job, out.root, restart=True, video=other, **render)
    assert not stats.failed
    for shot in ("shot000", "shot001"):
        assert not out.video(shot, ".mp4").exists() and out.video(shot, ".mov").exists()
        names = sorted(p.name for p in out.sequence_dir(shot).glob("*.png"))
        assert names == [f"{shot}.{n}.png" for n in range(1001, 1018)]
        assert not list(out.segments_dir(shot).iterdir())
    assert all(p.read_text() == "the user's own file" for p in mine)
    rows = {r.shot: r for r in output_progress(out.root)}
    assert rows["shot000"].frames == 17 and rows["shot000"].video


def test_frames_status_counts_rendered_frames(job, tmp_path, scheduler3):
    out = tmp_path / "out"
    farm.render(job, out, scheduler=scheduler3, options=TILES, frames="1-8", **QUIET)
    rows = {r.shot: r for r in output_progress(out)}
    assert (rows["shot000"].frames, rows["shot000"].batches_done, rows["shot000"].batches_total) == (8, 1, 3)
    assert not rows["shot000"].video


def test_bad_shot_values_fail_their_shot_by_name(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    rng = np.random.default_rng(0)
    good = smooth_latent(rng, (8, 2, 2, 2))
    bad = (
        ("fps-text", good, "abc"),
        ("fps-zero", good, 0),
        ("ints", good.astype(np.int32), 24),
        ("one-row", smooth_latent(rng, (8, 2, 1, 2)), 24),
    )
    for name, latent, fps in bad:
        group = zarr.open_group(store=str(job), mode="r+").require_group(name)
        group.attrs["fps"] = fps
        group.create_array("latent", data=latent, chunks=latent.shape)
    result = subprocess.run(
        [sys.executable, "-m", "farm", "render", str(job), "--out", str(tmp_path / "out"), "--scheduler",
         scheduler3, "--tiles", "1,1,1"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    expected = (
        "shot 'fps-text': fps 'abc' is invalid",
        "shot 'fps-zero': fps 0 is invalid",
        "shot 'ints': latent dtype int32",
        "shot 'one-row': latent has shape (8, 2, 1, 2)",
    )
    for message in expected:
        assert message in result.stderr, result.stderr
    assert "1 of 5 shots finished" in result.stderr
    assert Output(tmp_path / "out").video("shot000").exists()


def test_relative_paths_reach_workers_started_elsewhere(job, tmp_path, scheduler3):
    """The workers run in another directory than the command: relative paths are made absolute first."""
    here = tmp_path / "here"
    here.mkdir()
    os.symlink(job, here / "job.zarr")
    result = subprocess.run(
        [sys.executable, "-m", "farm", "render", "job.zarr", "--out", "out", "--scheduler", scheduler3,
         "--tiles", "1,1,1", "--shots", "shot001"],
        capture_output=True, text=True, timeout=300, cwd=here,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert Output(here / "out").video("shot001").exists()


def test_a_worker_that_cannot_see_a_path_is_named(cluster3, tmp_path):
    import socket

    from farm.run.cluster import check_worker_paths

    missing = str(tmp_path / "not-on-this-host.zarr")
    with pytest.raises(FarmError) as refused:
        check_worker_paths(cluster3, {"job store": missing})
    message = str(refused.value)
    assert f"on {socket.gethostname()} cannot see the job store {missing!r}" in message
    assert "worker " in message and "tcp://127.0.0.1:" in message


def test_farm_cluster_beyond_loopback_without_tls_warns():
    from farm.run.clusterd import exposure_warning

    warning = exposure_warning("0.0.0.0", "tcp")
    assert "without TLS" in warning and "require-encryption" in warning and "127.0.0.1" in warning
    assert exposure_warning("node7.studio", "tcp")
    assert exposure_warning("127.0.0.1", "tcp") is None and exposure_warning("localhost", "ucx") is None
    import dask.config

    assert "plain HTTP" in exposure_warning("0.0.0.0", "tls")  # the comm is TLS, the dashboard is not
    assert exposure_warning("127.0.0.1", "tls") is None
    with dask.config.set({"distributed.scheduler.dashboard.tls": {"cert": "c.pem", "key": "k.pem"}}):
        assert exposure_warning("0.0.0.0", "tls") is None


def test_a_stale_task_writes_nothing_into_a_shot_a_newer_render_owns(job, finished, cluster3):
    from farm.store.job import open_job
    from farm.worker.tasks import mark_batch

    out = Output(finished)
    batch = plan_job(open_job(job), TILES, 1, ["shot000"])[0].batches[1]
    out.done_marker("shot000", 1).unlink()
    stale = cluster3.submit(mark_batch, out, batch, 0.0, 0.0,
                            key=("mark-batch", "gone", "shot000", 1))  # fmt: skip
    with pytest.raises(FarmError, match="render gone was superseded in this output by render "):
        stale.result()
    assert 1 not in out.batches_done("shot000")
    owner = zarr.open_group(store=str(out.shot_group("shot000")), mode="r").attrs["owner"]
    mark_batch_now = cluster3.submit(mark_batch, out, batch, 0.0, 0.0,
                                     key=("mark-batch", owner, "shot000", 1))  # fmt: skip
    mark_batch_now.result()
    assert 1 in out.batches_done("shot000")
