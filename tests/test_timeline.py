"""`OUT/timeline.otio`: written by farm, read back with OpenTimelineIO's own reader; every shot a clip in
job order with its rate, timecode and references, whose files resolve to what the render wrote."""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.media.rates import timecode_to_frames
from farm.media.sequences import frame_path
from farm.media.timeline import SequenceFiles, TimelineShot, write_timeline

otio = pytest.importorskip("opentimelineio")

SHOTS = [
    TimelineShot("sh010", 49, Fraction(24000, 1001), "01:00:00:00", "videos/sh010.mp4",
                 SequenceFiles("sequences/sh010", "sh010.", ".exr", 1001), finished=True),
    TimelineShot("sh020", 17, Fraction(30000, 1001), "00:59:59;28", "videos/sh020.mp4", None, finished=True),
    TimelineShot("sh005", 25, Fraction(25), None, None,
                 SequenceFiles("sequences/sh005", "sh005.", ".png", 1, 6), finished=True),
    TimelineShot("sh030", 33, Fraction(24), "02:00:00:12", "videos/sh030.mov",
                 SequenceFiles("sequences/sh030", "sh030.", ".exr", 1001), finished=False),
]  # fmt: skip


def _clips(path: Path) -> list:
    timeline = otio.adapters.read_from_file(str(path))  # OpenTimelineIO's own reader
    assert len(timeline.tracks) == 1 and timeline.tracks[0].kind == otio.schema.TrackKind.Video
    return list(timeline.tracks[0])


def test_every_shot_is_a_clip_in_job_order_with_its_rate_timecode_and_references(tmp_path):
    path = write_timeline(tmp_path, SHOTS, name="job")
    assert path == tmp_path / "timeline.otio"
    assert otio.adapters.read_from_file(str(path)).name == "job"
    clips = _clips(path)
    assert [c.name for c in clips] == ["sh010", "sh020", "sh005", "sh030"]  # the order given, not sorted
    for clip, shot in zip(clips, SHOTS, strict=True):
        rng = clip.source_range
        assert rng.duration.value == shot.frames and rng.duration.rate == pytest.approx(float(shot.rate))
        assert rng.start_time.rate == pytest.approx(float(shot.rate))
        timecode = shot.timecode or "00:00:00:00"
        assert rng.start_time == otio.opentime.from_timecode(timecode, float(shot.rate))
        assert otio.opentime.to_timecode(rng.start_time, float(shot.rate)) == timecode
        assert clip.metadata["farm"]["finished"] is shot.finished
    sh010, sh020, sh005, sh030 = clips
    assert sh010.active_media_reference_key == "video"
    video = sh010.media_references()["video"]
    assert isinstance(video, otio.schema.ExternalReference) and video.target_url == "videos/sh010.mp4"
    sequence = sh010.media_references()["image_sequence"]
    assert isinstance(sequence, otio.schema.ImageSequenceReference)
    assert sequence.target_url_base == "sequences/sh010/" and sequence.start_frame == 1001
    assert sequence.frame_zero_padding == 4 and sequence.name_suffix == ".exr"
    # the sequence's first and last frames of the clip, as OpenTimelineIO resolves them
    first, last = sh010.source_range.start_time, sh010.source_range.end_time_inclusive()
    assert sequence.target_url_for_image_number(sequence.frame_for_time(first) - 1001) == \
        "sequences/sh010/sh010.1001.exr"  # fmt: skip
    assert sequence.frame_for_time(last) == 1001 + 48
    assert set(sh020.media_references()) == {"video"}
    assert sh005.active_media_reference_key == "image_sequence"  # no video: the sequence is the media
    assert sh005.media_reference.target_url_for_image_number(0) == "sequences/sh005/sh005.000001.png"
    assert isinstance(sh030.media_reference, otio.schema.MissingReference)  # not finished: its place only
    assert sh030.duration().value == 33


def test_the_references_resolve_to_the_files_under_out(tmp_path):
    """Relative URLs, resolved against the timeline's folder, name the files the render writes there."""
    shot = TimelineShot("sh010", 3, Fraction(24), "01:00:00:00", "videos/sh010.mp4",
                        SequenceFiles("sequences/sh010", "sh010.", ".png", 1001), finished=True)  # fmt: skip
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "sh010.mp4").write_bytes(b"")
    frames = [frame_path(tmp_path / "sequences" / "sh010", "sh010", 1001 + k, "png") for k in range(3)]
    frames[0].parent.mkdir(parents=True)
    for frame in frames:
        frame.write_bytes(b"")
    (clip,) = _clips(write_timeline(tmp_path, [shot], name="job"))
    video = clip.media_references()["video"].target_url
    assert (tmp_path / otio.url_utils.filepath_from_url(video)).is_file()
    sequence = clip.media_references()["image_sequence"]
    count = sequence.number_of_images_in_sequence()
    named = [tmp_path / sequence.target_url_for_image_number(k) for k in range(count)]
    assert named == frames


def test_rewriting_as_shots_finish_replaces_the_file_whole(tmp_path):
    waiting = [TimelineShot(s.name, s.frames, s.rate, s.timecode, s.video, s.sequence, False) for s in SHOTS]
    path = write_timeline(tmp_path, waiting, name="job")
    missing = [isinstance(c.media_reference, otio.schema.MissingReference) for c in _clips(path)]
    assert missing == [True] * len(SHOTS)
    write_timeline(tmp_path, [SHOTS[0], *waiting[1:]], name="job")
    clips = _clips(tmp_path / "timeline.otio")
    assert clips[0].media_reference.target_url == "videos/sh010.mp4"
    json.loads((tmp_path / "timeline.otio").read_text())  # whole JSON
    assert sorted(os.listdir(tmp_path)) == ["timeline.otio"]  # no temp file left
    # the clips not finished yet kept their places: the cut does not move
    assert [c.source_range for c in clips] == [c.source_range for c in _clips_of(SHOTS, tmp_path / "all")]


def _clips_of(shots: list[TimelineShot], folder: Path) -> list:
    folder.mkdir()
    return _clips(write_timeline(folder, shots, name="job"))


def test_a_shot_that_cannot_be_a_clip_is_refused_by_name(tmp_path):
    bad = TimelineShot("sh010", 0, Fraction(24), None, "videos/sh010.mp4", None, finished=True)
    with pytest.raises(FarmError, match=r"timeline: shot 'sh010' has 0 frames"):
        write_timeline(tmp_path, [bad], name="job")
    wrong = TimelineShot("sh010", 3, Fraction(24), "01:00:00;00", "videos/sh010.mp4", None, finished=True)
    with pytest.raises(FarmError, match=r"timeline: shot 'sh010': timecode '01:00:00;00' is drop-frame"):
        write_timeline(tmp_path, [wrong], name="job")
    assert not (tmp_path / "timeline.otio").exists()


def test_any_rate_farm_takes_is_counted(tmp_path):
    """A rate SMPTE timecode does not have (12.5 fps, which OpenTimelineIO's from_timecode refuses): the
    clip still starts at the frame its timecode counts, as farm counts it (12 labels a second)."""
    shot = TimelineShot("sh010", 10, Fraction(25, 2), "00:00:01:03", None, None, finished=False)
    with pytest.raises(ValueError):
        otio.opentime.from_timecode("00:00:01:03", 12.5)
    (clip,) = _clips(write_timeline(tmp_path, [shot], name="job"))
    assert clip.source_range.start_time.value == timecode_to_frames("00:00:01:03", Fraction(25, 2)) == 15
    assert clip.source_range.start_time.rate == 12.5
    assert np.isclose(clip.source_range.duration.to_seconds(), 0.8)


def test_an_hdr_shots_clip_takes_its_hlg_master_as_active_media(tmp_path):
    otio = pytest.importorskip("opentimelineio")
    pytest.importorskip("av")
    from farm.media.settings import VideoSettings
    from farm.run.timeline import timeline_shot
    from farm.store.output import Output

    outputs = VideoSettings(hdr="acescct", sequence="exr", first_frame=1001).identity()
    shot = timeline_shot(Output(tmp_path), "sh010", 17, Fraction(24), None, outputs, finished=True)
    assert shot.video == "videos/sh010.mp4"  # the HLG master, whatever the codec setting says
    path = write_timeline(tmp_path, [shot], name="hdr")
    clip = next(iter(otio.adapters.read_from_file(str(path)).find_clips()))
    assert clip.active_media_reference_key == "video"
    assert clip.media_reference.target_url == "videos/sh010.mp4"
    assert clip.media_references()["image_sequence"].start_frame == 1001
