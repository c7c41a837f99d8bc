"""Output formats written and read back: video codecs (PyAV) and image sequences (PNG / OpenEXR readers)."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from farm.errors import FarmError
from farm.media import sequences
from farm.media.video import CODECS, encode_segment, join_segments, probe, read_frames
from tests.helpers import pattern as video_pattern

H, W = 48, 80


def pattern(n: int, start: int = 0) -> np.ndarray:
    """The moving gradients of test_video, at this module's smaller frame size."""
    return video_pattern(n, start, H, W)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Also for float and 16-bit frames (test_video's is for uint8)."""
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


# codec → (container suffix, codec name read back, pix_fmt read back, codec tag, profile, max mean error)
# FFmpeg's ProRes decoder reports 4444 as 12-bit 4:4:4 whatever the encoder's 10-bit input.
VIDEO = {
    "h264": (".mp4", "h264", "yuv420p", "avc1", "High", 3.0),
    "h265": (".mp4", "hevc", "yuv420p", "hvc1", "Main", 3.0),
    "prores_hq": (".mov", "prores", "yuv422p10le", "apch", "HQ", 2.5),
    "prores_4444": (".mov", "prores", "yuv444p12le", "ap4h", "4444", 0.5),
}


@pytest.mark.parametrize("codec", list(VIDEO))
def test_video_segments_join_losslessly(tmp_path: Path, codec: str) -> None:
    suffix, name, pix_fmt, tag, profile, max_err = VIDEO[codec]
    assert CODECS[codec].suffix == suffix
    fps = Fraction(24000, 1001)
    sizes = [8, 8, 3]
    starts = np.cumsum([0, *sizes[:-1]])
    segs = [tmp_path / f"seg{i}{suffix}" for i in range(len(sizes))]
    for i in reversed(range(len(sizes))):  # batches finish in any order
        encode_segment(pattern(sizes[i], int(starts[i])), segs[i], fps, codec=codec, crf=16,
                       metadata={"comment": "farm test"})  # fmt: skip
    out = tmp_path / f"shot{suffix}"
    join_segments(segs, out, metadata={"comment": "farm test"})
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in [*segs, out]}  # no temp files left

    info = probe(out)
    assert (info.codec, info.pix_fmt, info.frames, info.width, info.height) == (name, pix_fmt, 19, W, H)
    assert info.fps == fps and info.metadata["comment"] == "farm test"
    with av.open(str(out)) as c:
        stream = c.streams.video[0]
        assert c.format.name.startswith("mov")
        assert (stream.codec_context.codec_tag, stream.codec_context.profile) == (tag, profile)
        packets = [p for p in c.demux(stream) if p.size > 0]
    with av.open(str(out)) as c:
        frame = next(c.decode(video=0))
        # BT.709 primaries, transfer and matrix (1 in FFmpeg's enums), tv range (1)
        assert (frame.color_primaries, frame.color_trc, frame.colorspace, frame.color_range) == (1, 1, 1, 1)
    step = packets[0].duration
    assert sorted(p.pts for p in packets) == [k * step for k in range(19)]
    keyframes = [p.pts // step for p in packets if p.is_keyframe]
    if CODECS[codec].rate_control:  # long GOP: one key frame at the start of every segment
        assert keyframes == list(starts)
    else:  # ProRes: intra only
        assert keyframes == list(range(19))
    # Joined without re-encoding: the same pixels as decoding the segments one after another.
    joined = read_frames(out)
    np.testing.assert_array_equal(joined, np.concatenate([read_frames(s) for s in segs]))
    assert mean_abs_diff(joined, pattern(19)) < max_err


@pytest.mark.parametrize("codec", ["prores_hq", "prores_4444"])
@pytest.mark.parametrize("dtype", [np.float16, np.uint16])
def test_prores_takes_high_bit_depth_frames(tmp_path: Path, codec: str, dtype) -> None:
    src = pattern(3).astype(np.float64) / 255 + 0.3 / 255  # values between 8-bit levels
    frames = src.astype(np.float16) if dtype == np.float16 else np.round(src * 65535).astype(np.uint16)
    encode_segment(frames, tmp_path / "a.mov", 25, codec=codec)
    got = read_frames(tmp_path / "a.mov", depth=16).astype(np.float64) / 65535
    assert got.shape == src.shape
    # 4:4:4 keeps what 8 bits cannot (8-bit rounding alone costs 0.3 here); 4:2:2 halves chroma detail
    assert mean_abs_diff(got * 255, src * 255) < (2.5 if codec == "prores_hq" else 0.2)


def test_video_codec_errors(tmp_path: Path) -> None:
    with pytest.raises(FarmError, match="unknown video codec"):
        encode_segment(pattern(2), tmp_path / "a.mp4", 24, codec="vp9")
    with pytest.raises(FarmError, match="uint8"):
        encode_segment(pattern(2).astype(np.float32) / 255, tmp_path / "a.mp4", 24, codec="h265")
    with pytest.raises(FarmError, match="even"):
        encode_segment(np.zeros((1, 48, 81, 3), np.uint8), tmp_path / "a.mov", 24, codec="prores_hq")
    encode_segment(np.zeros((1, 47, 81, 3), np.uint8), tmp_path / "odd.mov", 24, codec="prores_4444")  # 4:4:4
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    encode_segment(pattern(2), a, 24, codec="h264")
    encode_segment(pattern(2), b, 24, codec="h265")
    with pytest.raises(FarmError, match=r"b\.mp4.*codec"):
        join_segments([a, b], tmp_path / "j.mp4")
    p, q = tmp_path / "p.mov", tmp_path / "q.mov"
    encode_segment(pattern(2), p, 24, codec="prores_hq")
    encode_segment(pattern(2), q, 24, codec="prores_4444")
    with pytest.raises(FarmError, match=r"q\.mov.*(profile|pix_fmt)"):
        join_segments([p, q], tmp_path / "j.mov")
    with pytest.raises(FarmError, match=r"\.mov"):
        join_segments([p], tmp_path / "j.mp4")
    assert not any(n.startswith("j.") for n in os.listdir(tmp_path))


# ---- image sequences -----------------------------------------------------------------------------


def test_png8_sequence_names_numbers_and_values(tmp_path: Path) -> None:
    frames = pattern(5)
    d = tmp_path / "seq"
    first = sequences.write_frames(frames[:3], d, "sh010", start=0, first_frame=1001, format="png8")
    second = sequences.write_frames(frames[3:], d, "sh010", start=3, first_frame=1001, format="png8")
    assert [p.name for p in first + second] == [f"sh010.{n}.png" for n in range(1001, 1006)]
    numbers, images = sequences.read_sequence(d, "sh010", "png")
    assert numbers == list(range(1001, 1006))
    assert sequences.png_bit_depth(first[0]) == 8 and images.dtype == np.uint8
    np.testing.assert_array_equal(images, frames)  # lossless
    assert sorted(os.listdir(d)) == sorted(p.name for p in first + second)  # no temp files left


@pytest.mark.parametrize("source", ["uint8", "float16"])
def test_png16_sequence(tmp_path: Path, source: str) -> None:
    frames8 = pattern(2)
    frames = frames8 if source == "uint8" else (frames8 / 255).astype(np.float16)
    paths = sequences.write_frames(frames, tmp_path, "a", start=7, first_frame=0, format="png16", padding=6)
    assert [p.name for p in paths] == ["a.000007.png", "a.000008.png"]
    assert all(sequences.png_bit_depth(p) == 16 for p in paths)
    _, images = sequences.read_sequence(tmp_path, "a", "png")
    assert images.dtype == np.uint16
    if source == "uint8":
        np.testing.assert_array_equal(images, frames8.astype(np.uint16) * 257)  # 255 → 65535 exactly
    else:
        expected = np.round(frames.astype(np.float32) * 65535)
        np.testing.assert_array_equal(images, expected.astype(np.uint16))


@pytest.mark.parametrize("source", ["uint8", "float16"])
def test_exr_half_float_sequence(tmp_path: Path, source: str) -> None:
    openexr = pytest.importorskip("OpenEXR", reason="EXR sequences need the openexr package (farm[exr])")
    frames8 = pattern(3)
    halves = (frames8 / 255).astype(np.float16)
    halves[0, 0, 0] = [1.5, -0.25, 0.5]  # out-of-range values survive in EXR (no clipping)
    frames = frames8 if source == "uint8" else halves
    paths = sequences.write_frames(frames, tmp_path / "exr", "sh", start=0, first_frame=1, format="exr")
    assert [p.name for p in paths] == ["sh.0001.exr", "sh.0002.exr", "sh.0003.exr"]
    numbers, images = sequences.read_sequence(tmp_path / "exr", "sh", "exr")
    assert numbers == [1, 2, 3] and images.dtype == np.float16
    expected = (frames8.astype(np.float32) / 255).astype(np.float16) if source == "uint8" else halves
    np.testing.assert_array_equal(images, expected)
    with openexr.File(str(paths[0])) as f:
        assert f.channels()["RGB"].type() == openexr.HALF
        np.testing.assert_allclose(f.header()["chromaticities"], sequences.REC709_CHROMATICITIES, atol=1e-6)


def test_sequence_errors_and_atomic_writes(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(FarmError, match="unknown image format"):
        sequences.write_frames(pattern(1), tmp_path, "a", format="tiff")
    with pytest.raises(FarmError, match=r"\[F, H, W, 3\]"):
        sequences.write_frames(pattern(1)[..., :2], tmp_path, "a")
    with pytest.raises(FarmError, match="negative"):
        sequences.write_frames(pattern(1), tmp_path, "a", first_frame=-1)
    assert list(tmp_path.iterdir()) == []
    # A frame number wider than the padding keeps all its digits.
    assert sequences.write_frames(pattern(1), tmp_path, "a", first_frame=12345)[0].name == "a.12345.png"
    # A write that fails midway leaves the earlier files complete and no temporary files.
    previous = sequences.frame_path(tmp_path, "b", 2, "png")
    previous.write_bytes(b"previous render")
    real = sequences.encode_png
    calls = []

    def failing(image):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(image)

    monkeypatch.setattr(sequences, "encode_png", failing)
    with pytest.raises(OSError, match="disk full"):
        sequences.write_frames(pattern(3), tmp_path, "b", first_frame=1)
    assert sorted(os.listdir(tmp_path)) == ["a.12345.png", "b.0001.png", "b.0002.png"]
    assert previous.read_bytes() == b"previous render"
    assert sequences.read_image(tmp_path / "b.0001.png").shape == (H, W, 3)
