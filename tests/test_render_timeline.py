"""A render's `OUT/timeline.otio` read back with OpenTimelineIO's own reader (every shot in job order, its
rate, timecode and references resolving to the files the render wrote), the summary listing every
output absolute, and `farm cancel OUT` stopping a local render from another process, whose resumed
render's timeline ends complete."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
import zarr

import farm
from farm.cli import main as cli_main
from farm.cli import output_lines
from farm.errors import FarmError
from farm.media.rates import timecode_to_frames
from farm.media.settings import VideoSettings
from farm.run.render import render
from farm.run.timeline import RenderTimeline
from farm.store.job import open_job
from farm.store.lock import lock_owner, output_lock
from farm.store.output import Output
from tests.helpers import farm as farm_command

otio = pytest.importorskip("opentimelineio")

TIMECODES = {"shot000": "01:00:00:00", "shot001": "01:00:10:12"}
RATE = Fraction(24000, 1001)
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)


def two_shot_job(path: Path, *, audio: bool = False, frames: int = 17) -> Path:
    """A 2-shot ltx2-tiny job at 24000/1001 fps, each shot with its own start timecode."""
    farm.synth(path, decoder="ltx2-tiny", shots=2, frames=frames, height=64, width=64, fps="24000/1001",
               audio=audio)  # fmt: skip
    for shot, timecode in TIMECODES.items():
        zarr.open_group(store=str(path / shot), mode="r+").attrs["timecode"] = timecode
    return path


def read_timeline(out: Path):
    return otio.adapters.read_from_file(str(out / "timeline.otio"))


def check_complete(out: Path, first_frame: int | None = None) -> None:
    """Every shot a finished clip in job order, at its rate and timecode, its references resolving."""
    clips = list(read_timeline(out).find_clips())
    assert [c.name for c in clips] == ["shot000", "shot001"]
    for clip in clips:
        start = clip.source_range.start_time
        assert start.rate == pytest.approx(float(RATE))
        assert round(start.value) == timecode_to_frames(TIMECODES[clip.name], RATE)
        assert clip.metadata["farm"]["finished"] is True
        video = clip.media_references()["video"]
        assert (out / video.target_url).is_file() and not Path(video.target_url).is_absolute()
        assert (out / video.target_url).samefile(Output(out).video(clip.name))
        if first_frame is not None:
            seq = clip.media_references()["image_sequence"]
            first = out / seq.target_url_for_image_number(0)
            last = out / seq.target_url_for_image_number(seq.number_of_images_in_sequence() - 1)
            assert first.name == f"{clip.name}.{first_frame:04d}.png" and first.is_file() and last.is_file()
            assert seq.number_of_images_in_sequence() == round(clip.source_range.duration.value)


def test_render_writes_a_timeline_and_the_summary_lists_every_output(tmp_path, scheduler3):
    job = two_shot_job(tmp_path / "job.zarr", audio=True)
    out = tmp_path / "out"
    settings = VideoSettings(sequence="png8", first_frame=1001)
    stats = render(job, out, scheduler=scheduler3, options=WHOLE, video=settings, log=lambda _: None)
    assert not stats.failed
    check_complete(out, first_frame=1001)

    lines = output_lines(Output(out), list(stats.shots))
    assert lines[0] == f"  frames: {out / 'frames.zarr'}"
    for shot in ("shot000", "shot001"):
        assert f"  video:  {out / 'videos' / (shot + '.mp4')}" in lines
        assert f"  sound:  {out / 'audio' / (shot + '.wav')}" in lines
        assert f"  sequence: {out / 'sequences' / shot}/{shot}.####.png (frames 1001-1017)" in lines
    assert lines[-1] == f"  timeline: {out / 'timeline.otio'}"
    assert all(Path(line.split(":", 1)[1].strip().split(" (")[0]).is_absolute() for line in lines)

    # a render of one shot keeps the clips of the others OUT holds, as OUT records them
    plans = farm.plan(open_job(job), WHOLE, 1, shots=["shot001"])
    subset = RenderTimeline(open_job(job), Output(out), plans, VideoSettings(), TIMECODES, lambda _: None)
    subset.start(set())
    clips = list(read_timeline(out).find_clips())
    assert [c.name for c in clips] == ["shot000", "shot001"]
    assert clips[0].metadata["farm"]["finished"] is True and "image_sequence" in clips[0].media_references()
    assert clips[1].metadata["farm"]["finished"] is False  # not finished in the render that started


def test_summary_paths_are_absolute_from_a_relative_out(tmp_path):
    job = two_shot_job(tmp_path / "job.zarr")
    result = farm_command("render", "job.zarr", "--out", "out", "--workers", "1", "--tiles", "1,1,1",
                          cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert job.exists()
    for line in result.stdout.splitlines()[1:]:
        assert Path(line.split(":", 1)[1].strip()).is_absolute(), line
    assert f"  video:  {tmp_path / 'out' / 'videos' / 'shot001.mp4'}" in result.stdout.splitlines()


@pytest.mark.slow
def test_farm_cancel_out_stops_a_local_render_and_the_resumed_timeline_is_complete(tmp_path, scheduler3):
    job = two_shot_job(tmp_path / "job.zarr", frames=161)  # 21 batches of 8 frames per shot
    out = tmp_path / "out"
    args = ["render", str(job), "--out", str(out), "--workers", "1", "--tiles", "1,1,1",
            "--batch-frames", "8"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
    )  # fmt: skip
    announced = ""
    for line in proc.stderr:  # farm's messages go to stderr
        if "render id" in line:
            announced = line
            break
    owner = lock_owner(out)
    assert owner is not None, announced
    assert f"render id {owner['render']}" in announced and f"scheduler {owner['scheduler']}" in announced
    assert f"farm cancel {out}" in announced

    refused = farm_command(*args)
    assert refused.returncode != 0 and f"cancel it with `farm cancel {out}`" in refused.stderr

    while not Output(out).batches_done("shot000"):  # some work finished before the cancel
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    # from this process (not the render's; in-process, so no interpreter start-up lets the render end first)
    assert cli_main(["cancel", str(out), "--wait", "60"]) == 0  # no --scheduler: OUT's lock names it
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "cancelled" in err, err
    kept = {s: Output(out).batches_done(s) for s in ("shot000", "shot001")}
    assert kept["shot000"] and len(kept["shot000"]) + len(kept["shot001"]) < 2 * 21  # stopped, batches kept
    assert lock_owner(out) is None
    assert not all(c.metadata["farm"]["finished"] for c in read_timeline(out).find_clips())

    stats = render(job, out, scheduler=scheduler3, options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8),
                   log=lambda _: None)  # fmt: skip
    assert not stats.failed and stats.batches_written == 2 * 21 - sum(len(v) for v in kept.values())
    check_complete(out)


def test_the_lock_records_the_render_and_farm_cancel_out_needs_a_live_one(tmp_path):
    out = tmp_path / "out"
    job = tmp_path / "job.zarr"
    with output_lock(out, ["shot000"], job=job, render="r1a2b3c4") as lock:
        lock.record(scheduler="tcp://127.0.0.1:8786")
        owner = lock_owner(out)
        assert owner is not None and owner["render"] == "r1a2b3c4" and owner["pid"] == os.getpid()
        assert owner["scheduler"] == "tcp://127.0.0.1:8786" and owner["shots"] == ["shot000"]
        with (
            pytest.raises(
                FarmError,
                match=f"'shot000' by pid {os.getpid()} on .*, render r1a2b3c4\\. .*`farm cancel {out}`",
            ),
            output_lock(out, ["shot000"], job=job),
        ):
            pass
    assert lock_owner(out) is None
    result = farm_command("cancel", str(out))
    assert result.returncode != 0
    assert f"no farm render is writing into {str(out)!r} now" in result.stderr, result.stderr


def test_a_timeline_farm_did_not_write_is_left_alone(tmp_path):
    job = two_shot_job(tmp_path / "job.zarr")
    out = tmp_path / "out"
    out.mkdir()
    (out / "timeline.otio").write_text('{"OTIO_SCHEMA": "Timeline.1", "name": "the editor\'s cut"}')
    said: list[str] = []
    plans = farm.plan(open_job(job), WHOLE, 1)
    timeline = RenderTimeline(open_job(job), Output(out), plans, VideoSettings(), TIMECODES, said.append)
    assert timeline.start(set()) is None and timeline.end() is None
    assert (out / "timeline.otio").read_text().endswith("the editor's cut\"}")
    assert len(said) == 1 and "is not a timeline farm wrote" in said[0], said
    (out / "timeline.otio").unlink()  # gone: farm writes its own, every shot in place, none finished yet
    RenderTimeline(open_job(job), Output(out), plans, VideoSettings(), TIMECODES, said.append).start(set())
    clips = list(read_timeline(out).find_clips())
    assert [c.name for c in clips] == ["shot000", "shot001"]
    assert not any(c.metadata["farm"]["finished"] for c in clips)
    assert all(isinstance(c.media_reference, otio.schema.MissingReference) for c in clips)


def test_status_verify_checks_the_timeline(tmp_path, scheduler3, capsys):
    job = two_shot_job(tmp_path / "job.zarr")
    out = tmp_path / "out"
    assert not render(job, out, scheduler=scheduler3, options=WHOLE, log=lambda _: None).failed
    assert cli_main(["status", str(out), "--verify"]) == 0
    path = out / "timeline.otio"
    text = path.read_text()

    stale = read_timeline(out)  # a shot finished, its clip not marked so
    next(iter(stale.find_clips())).metadata["farm"]["finished"] = False
    otio.adapters.write_to_file(stale, str(path))
    capsys.readouterr()
    assert cli_main(["status", str(out), "--verify"]) == 1
    assert "does not show finished shot(s) ['shot000'] as finished" in capsys.readouterr().err
    assert cli_main(["status", str(out)]) == 0  # without --verify the timeline is not read

    path.write_text(text[: len(text) // 2])  # cut short
    assert cli_main(["status", str(out), "--verify"]) == 1
    assert f"{str(path)!r} is not a timeline farm wrote" in capsys.readouterr().err
    path.unlink()  # none: a render without OpenTimelineIO writes none
    assert cli_main(["status", str(out), "--verify"]) == 0


def test_without_opentimelineio_a_render_says_so_and_writes_no_timeline(tmp_path, scheduler3, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentimelineio", None)  # as if the editorial extra were not installed
    job = two_shot_job(tmp_path / "job.zarr")
    out, said = tmp_path / "out", []
    assert not render(job, out, scheduler=scheduler3, options=WHOLE, log=said.append).failed
    assert any("OpenTimelineIO is not installed: no timeline.otio is written" in line for line in said), said
    assert not (out / "timeline.otio").exists() and Output(out).video("shot001").is_file()
    assert "  timeline:" not in "\n".join(output_lines(Output(out), ["shot000", "shot001"]))
