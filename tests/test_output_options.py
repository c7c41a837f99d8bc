"""Render outputs chosen per render: codecs, image sequences, frame ranges merging into an output."""

from __future__ import annotations

import numpy as np
import pytest

import farm
from farm.errors import FarmError
from farm.media import sequences, video
from farm.media.settings import VideoSettings
from farm.planning.options import parse_frame_numbers
from farm.store.frames import read_frames
from farm.store.output import Output
from tests.helpers import assert_same_video

QUIET = {"log": lambda _: None}
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.zarr"
    farm.synth(path, decoder="ltx2-tiny", shots=1, frames=33, height=64, width=64, fps=25.0)
    return path


def test_frame_range_renders_only_its_batches_then_merges(job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    stats = farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, frames="10-1", **QUIET)
    # frames 10-1 (descending: the same set as 1-10) live in batches [0, 8) and [8, 16)
    assert out.batches_done("shot000") == {0, 1}
    assert stats.frames_written == 16 and not out.video("shot000").exists()
    stats = farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, frames="17-33x4", **QUIET)
    assert out.batches_done("shot000") == {0, 1, 2, 3, 4} and stats.frames_written == 17
    assert video.probe(out.video("shot000")).frames == 33  # every batch done: the video is joined
    whole = Output(tmp_path / "whole")
    farm.render(job, whole.root, scheduler=scheduler3, options=WHOLE, **QUIET)
    assert read_frames(out, "shot000").tobytes() == read_frames(whole, "shot000").tobytes()
    assert_same_video(out.video("shot000"), whole.video("shot000"))


@pytest.mark.parametrize(
    "text, numbers",
    [("1-5", [1, 2, 3, 4, 5]), ("1-9x3", [1, 4, 7]), ("1-6:2", [1, 2, 3, 4, 5, 6]), ("5-1", [1, 2, 3, 4, 5]),
     ("9-1x4", [1, 5, 9]), ("3,1,7-8", [1, 3, 7, 8]), ("1001-1003", [1001, 1002, 1003])],
)  # fmt: skip
def test_frame_lists_in_render_farm_forms(text, numbers):
    assert parse_frame_numbers(text) == numbers
    with pytest.raises(FarmError, match="names no frame"):
        parse_frame_numbers(",")


@pytest.mark.parametrize("text", ["a-b", "1-10x0", "1.5", "1-10x-2"])
def test_bad_frame_lists_are_refused(job, tmp_path, scheduler3, text):
    with pytest.raises(FarmError, match="--frames"):
        farm.render(job, tmp_path / "out", scheduler=scheduler3, options=WHOLE, frames=text, **QUIET)


def test_frames_outside_the_shot_are_refused(job, tmp_path, scheduler3):
    with pytest.raises(FarmError, match="numbered 1-33"):
        farm.render(job, tmp_path / "out", scheduler=scheduler3, options=WHOLE, frames="100-200", **QUIET)


def test_prores_video_and_png16_sequence(job, tmp_path, scheduler3):
    settings = VideoSettings(codec="prores_hq", sequence="png16", first_frame=1001)
    out = Output(tmp_path / "out", settings.suffix)
    stats = farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=settings, **QUIET)
    assert not stats.failed and out.video("shot000").suffix == ".mov"
    info = video.probe(out.video("shot000"))
    assert info.codec == "prores" and info.frames == 33 and float(info.fps) == 25.0
    frames = read_frames(out, "shot000")
    by_number = sequences.sequence_files(out.sequence_dir("shot000"), "shot000", "png")
    assert sorted(by_number) == list(range(1001, 1034))
    files = [by_number[n] for n in sorted(by_number)]
    assert files[0].name == "shot000.1001.png"
    assert sequences.png_bit_depth(files[0]) == 16
    first = sequences.read_image(files[0])
    np.testing.assert_array_equal((first.astype(np.float64) / 257).round().astype(np.uint8), frames[0])
    # a different output choice is a different render of OUT: refused, nothing touched
    in_words = ("--sequence: OUT has png16, this render none; "
                "--codec: OUT has prores_hq, this render h264")  # fmt: skip
    with pytest.raises(FarmError, match=in_words):
        farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=VideoSettings(), **QUIET)
    # left out, the output settings are OUT's: the finished render resumes, with nothing to do
    assert farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, **QUIET).batches_written == 0


def test_float16_master_copy_with_h264_and_exr(job, tmp_path, scheduler3):
    settings = VideoSettings(frames_dtype="float16", sequence="exr" if sequences.exr_available() else "png16")
    out = Output(tmp_path / "f16")
    assert not farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=settings, **QUIET).failed
    levels = Output(tmp_path / "u8")
    farm.render(job, levels.root, scheduler=scheduler3, options=WHOLE, **QUIET)
    master = read_frames(out, "shot000")
    assert master.dtype == np.float16 and master.min() >= 0.0 and master.max() <= 1.0
    # the same blend kept at half precision: within one level of the 8-bit render (half rounds first)
    as_levels = master.astype(np.float32) * 255
    assert np.abs(as_levels - read_frames(levels, "shot000")).max() <= 1.0
    assert video.probe(out.video("shot000")).frames == 33
    if settings.sequence == "exr":
        files = sequences.sequence_files(out.sequence_dir("shot000"), "shot000", "exr")
        np.testing.assert_array_equal(sequences.read_image(files[1]).astype(np.float16), master[0])


@pytest.mark.skipif(not sequences.exr_available(), reason="openexr is not installed")
def test_exr_sequence_headers_carry_the_shots_fps_and_value_encoding(job, tmp_path, scheduler3):
    import OpenEXR

    settings = VideoSettings(enabled=False, sequence="exr", exr_values="linear", first_frame=101)
    out = Output(tmp_path / "exr")
    assert not farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=settings, **QUIET).failed
    files = sequences.sequence_files(out.sequence_dir("shot000"), "shot000", "exr")
    assert sorted(files) == list(range(101, 134))
    with OpenEXR.File(str(files[117])) as f:
        header = dict(f.header())
    assert header["framesPerSecond"] == 25 and header["colorInteropID"] == "lin_rec709_scene"
    # the choice is part of what OUT is a render of: display values into the same OUT are refused
    with pytest.raises(FarmError, match="--exr-values: OUT has linear, this render display"):
        display = VideoSettings(enabled=False, sequence="exr", first_frame=101)
        farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=display, **QUIET)
