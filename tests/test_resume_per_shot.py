"""A plain rerun resumes each shot of OUT with the settings OUT recorded for that shot, even where shots
differ; only an option the user sets that contradicts a shot's record is refused. Real processes, a real
local cluster, real Zarr stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.run.resume import recorded_identity
from farm.store.frames import read_frames
from farm.store.markers import read_marker
from farm.store.output import Output
from tests.helpers import farm


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def other_shots_bytes(root: Path, shot: str) -> dict[str, bytes]:
    """OUT's files but the shot's, the timeline (which covers every shot) and the render histories (each
    render adds its own)."""
    return {n: data for n, data in tree_bytes(root).items()
            if shot not in n and n != "timeline.otio" and not n.startswith(".farm/renders/")}  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("per_shot") / "long.zarr"
    result = farm("synth", str(path), "--shots", "3", "--frames", "33", "--height", "64", "--width", "96")
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.slow
def test_a_plain_rerun_resumes_each_shot_with_its_own_recorded_settings(job, tmp_path, scheduler3):
    out = tmp_path / "long2"
    cluster = ["--scheduler", scheduler3]
    first = farm("render", str(job), "--out", str(out), *cluster, "--batch-frames", "16", "-q")
    assert first.returncode == 0, first.stderr
    again = farm("render", str(job), "--out", str(out), *cluster, "--restart", "--codec", "prores_hq",
                 "--batch-frames", "32", "--shots", "shot001", "--frames", "1-32", "-q")  # fmt: skip
    assert again.returncode == 0, again.stderr
    others = other_shots_bytes(out, "shot001")

    plain = farm("render", str(job), "--out", str(out), *cluster)
    assert plain.returncode == 0, plain.stderr
    assert "farm: error" not in plain.stderr
    assert "shot(s) 'shot001' resume with the settings OUT recorded for them (--batch-frames 32, " \
        "--codec prores_hq)" in plain.stderr
    # shot001 finished with what it recorded: batches of 32, a ProRes video; the others untouched
    identity = recorded_identity(Output(out), "shot001")
    assert identity["plan"]["batch_frames"] == 32 and identity["outputs"]["video"] == "prores_hq"
    assert (out / "videos" / "shot001.mov").stat().st_size > 0
    assert read_frames(Output(out), "shot001").shape[0] == 33
    assert other_shots_bytes(out, "shot001") == others
    status = farm("status", str(out))
    assert "3 of 3 shots finished" in status.stdout, status.stdout

    # an option given that contradicts one shot's record is refused, naming that shot alone, before the
    # shots whose records it matches render anything (shot000 has a batch to render again)
    record = read_marker(Output(out).done_marker("shot000", 1)) or {}
    (Output(out).frames_array("shot000") / next(k for k, v in record["chunks"].items() if v)).unlink()
    before = tree_bytes(out)
    given = farm("render", str(job), "--out", str(out), *cluster, "--codec", "h264")
    assert given.returncode == 2, given.stderr
    assert tree_bytes(out) == before
    errors = [line for line in given.stderr.splitlines() if line.startswith("farm: error:")]
    assert len(errors) == 1 and "shot 'shot001': --codec: OUT has prores_hq, this render h264" in errors[0]
    assert "shot000" not in errors[0] and "shot002" not in errors[0]


@pytest.mark.slow
def test_a_plain_resume_keeps_the_timecode_the_render_was_given(tmp_path, scheduler3):
    """--timecode is recorded per shot: a plain resume of a render started with it writes it on every
    EXR frame, in the video's tmcd track and on the timeline's clip, as one uninterrupted render would."""
    import av
    import OpenEXR
    import opentimelineio as otio

    job = tmp_path / "job.zarr"
    made = farm("synth", str(job), "--shots", "1", "--frames", "33", "--height", "64", "--width", "64")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "out"
    cluster = ["--scheduler", scheduler3]
    first = farm("render", str(job), "--out", str(out), *cluster, "--timecode", "01:00:00:00", "--sequence",
                 "exr", "--frames", "1-16", "-q")  # fmt: skip
    assert first.returncode == 0, first.stderr
    plain = farm("render", str(job), "--out", str(out), *cluster)
    assert plain.returncode == 0, plain.stderr
    frames = sorted((out / "sequences" / "shot000").glob("*.exr"))
    assert len(frames) == 33
    for number, path in enumerate(frames):
        with OpenEXR.File(str(path)) as exr:
            code = exr.header().get("timeCode")
        assert code is not None, f"{path.name} carries no timecode"
        assert (code.hours, code.minutes, code.seconds, code.frame) == (1, 0, number // 24, number % 24)
    with av.open(str(out / "videos" / "shot000.mp4")) as container:
        assert {s.metadata.get("timecode") for s in container.streams.data} == {"01:00:00:00"}
    clip = next(iter(otio.adapters.read_from_file(str(out / "timeline.otio")).find_clips()))
    assert otio.opentime.to_timecode(clip.source_range.start_time, 24.0) == "01:00:00:00"
    # --timecode given with another value than the shot's record is refused, naming it
    other = farm("render", str(job), "--out", str(out), *cluster, "--timecode", "02:00:00:00")
    assert other.returncode == 2, other.stderr
    assert "--timecode: OUT has 01:00:00:00, this render 02:00:00:00" in other.stderr


@pytest.mark.slow
def test_a_rerun_with_nothing_to_render_writes_the_timeline_out_lacks(job, tmp_path, scheduler3):
    """A finished OUT without timeline.otio (rendered before OpenTimelineIO was installed, or the file
    removed): the plain rerun renders nothing, changes nothing else, and writes the timeline."""
    import opentimelineio as otio

    out = tmp_path / "out"
    cluster = ["--scheduler", scheduler3]
    first = farm("render", str(job), "--out", str(out), *cluster, "--batch-frames", "16", "-q")
    assert first.returncode == 0, first.stderr
    (out / "timeline.otio").unlink()
    before = tree_bytes(out)
    again = farm("render", str(job), "--out", str(out), *cluster)
    assert again.returncode == 0, again.stderr
    assert "nothing to render" in again.stderr and "wrote the timeline OUT lacked" in again.stderr
    after = tree_bytes(out)
    assert after.pop("timeline.otio") and after == before
    clips = list(otio.adapters.read_from_file(str(out / "timeline.otio")).find_clips())
    assert [c.name for c in clips] == ["shot000", "shot001", "shot002"]
    assert all(c.metadata["farm"]["finished"] for c in clips)
    assert [c.media_reference.target_url for c in clips] == [f"videos/shot00{k}.mp4" for k in range(3)]
