"""farm.media.video: H.264 segments encoded on their own, joined without re-encoding (real files)."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from farm.errors import FarmError
from farm.media.video import (
    VideoInfo,
    encode_segment,
    join_segments,
    probe,
    read_frames,
    with_valid_decode_timestamps,
)
from tests.helpers import pattern

H, W = 64, 96  # tests.helpers.pattern's default size
NTSC = Fraction(30000, 1001)


def encode_batches(tmp_path: Path, sizes: list[int], fps: float | Fraction, **kw) -> list[Path]:
    """Encode consecutive batches of one moving pattern, last batch first (task order is arbitrary)."""
    starts = np.cumsum([0, *sizes[:-1]])
    paths = [tmp_path / f"seg{i:03d}.mp4" for i in range(len(sizes))]
    for i in reversed(range(len(sizes))):
        encode_segment(pattern(sizes[i], start=int(starts[i])), paths[i], fps, **kw)
    return paths


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def packets(path: Path) -> list[av.Packet]:
    with av.open(str(path)) as c:
        return [p for p in c.demux(c.streams.video[0]) if p.size > 0]


def stray_files(directory: Path, expected: list[Path]) -> set[str]:
    return {p.name for p in directory.iterdir()} - {p.name for p in expected}


@pytest.mark.parametrize("fps", [24, NTSC, 25, 23.976])
def test_encode_segment_roundtrip(tmp_path: Path, fps: float | Fraction) -> None:
    src = pattern(10)
    out = tmp_path / "a.mp4"
    encode_segment(src, out, fps)
    info = probe(out)
    assert info == VideoInfo(
        frames=10,
        width=W,
        height=H,
        fps=Fraction(fps).limit_denominator(1001000),
        codec="h264",
        pix_fmt="yuv420p",
        metadata=info.metadata,
    )
    got = read_frames(out)
    assert got.shape == src.shape and got.dtype == np.uint8
    assert mean_abs_diff(got, src) < 3
    assert stray_files(tmp_path, [out]) == set()
    pk = packets(out)
    assert pk[0].is_keyframe
    assert [p.pts for p in sorted(pk, key=lambda p: p.pts)] == [k * pk[0].duration for k in range(10)]


def test_encode_segment_tags_bt709(tmp_path: Path) -> None:
    out = tmp_path / "a.mp4"
    encode_segment(pattern(2), out, 24)
    with av.open(str(out)) as c:
        frame = next(c.decode(video=0))
    # AVCOL_PRI_BT709 / AVCOL_TRC_BT709 / AVCOL_SPC_BT709 are 1; AVCOL_RANGE_MPEG (tv) is 1.
    assert (frame.color_primaries, frame.color_trc, frame.colorspace, frame.color_range) == (1, 1, 1, 1)


def test_segments_share_extradata(tmp_path: Path) -> None:
    """Headers depend only on size, fps and preset: not on content, length or crf."""
    extradata = set()
    for i, (n, crf) in enumerate([(1, 18), (2, 18), (5, 30), (9, 10)]):
        out = tmp_path / f"s{i}.mp4"
        encode_segment(pattern(n, start=7 * i), out, NTSC, crf=crf)
        with av.open(str(out)) as c:
            extradata.add(bytes(c.streams.video[0].codec_context.extradata))
    assert len(extradata) == 1 and len(next(iter(extradata))) > 0


@pytest.mark.parametrize(
    ("sizes", "fps"),
    [([8, 8, 8, 1], 24), ([16, 17], NTSC), ([1, 8, 1, 2], 25)],
)
def test_join_segments(tmp_path: Path, sizes: list[int], fps: float | Fraction) -> None:
    segs = encode_batches(tmp_path, sizes, fps)
    out = tmp_path / "joined.mp4"
    join_segments(segs, out)
    assert stray_files(tmp_path, [*segs, out]) == set()

    info = probe(out)
    assert (info.frames, info.width, info.height, info.fps) == (sum(sizes), W, H, Fraction(fps))
    assert (info.codec, info.pix_fmt) == ("h264", "yuv420p")

    # Same pixels as decoding the segments one after another, bit for bit; close to the source.
    joined = read_frames(out)
    separate = np.concatenate([read_frames(s) for s in segs])
    assert joined.shape == (sum(sizes), H, W, 3)
    np.testing.assert_array_equal(joined, separate)
    assert mean_abs_diff(joined, pattern(sum(sizes))) < 3

    # Continuous presentation timestamps, strictly increasing decode timestamps, dts <= pts,
    # and an IDR frame at the start of every segment.
    pk = packets(out)
    step = pk[0].duration
    assert sorted(p.pts for p in pk) == [k * step for k in range(sum(sizes))]
    dts = [p.dts for p in pk]
    assert all(a < b for a, b in zip(dts, dts[1:], strict=False))
    assert all(p.dts <= p.pts for p in pk)
    keyframes = [p.pts // step for p in pk if p.is_keyframe]
    assert keyframes == list(np.cumsum([0, *sizes[:-1]]))


def test_h265_short_segments_encode_and_join(tmp_path: Path) -> None:
    # x265 leaves a two-frame clip's dts uninitialised (most tries, not all): the muxer used to fail.
    sizes = [2, 8, 2, 1, 2, 2, 3, 2]
    segs = encode_batches(tmp_path, sizes, 24, codec="h265")
    for seg, n in zip(segs, sizes, strict=True):
        pk = packets(seg)
        assert len(pk) == n
        assert all(p.dts <= p.pts for p in pk)
        assert all(a.dts < b.dts for a, b in zip(pk, pk[1:], strict=False))
    out = tmp_path / "joined.mp4"
    join_segments(segs, out)
    joined = read_frames(out)
    assert joined.shape == (sum(sizes), H, W, 3)
    assert mean_abs_diff(joined, pattern(sum(sizes))) < 3


@pytest.mark.parametrize(
    ("pts", "dts", "want"),
    [
        ([0, 1], [0, 1], [0, 1]),  # valid: kept
        ([0, 2, 1], [-2, -1, 0], [-2, -1, 0]),  # valid B-frame delay: kept
        ([0, 1], [8753160913407277434, 8753160913407277435], [0, 1]),  # what x265 gives 2 frames
        ([0, 1], [-9042521604759584125, -9042521604759584124], [0, 1]),
        ([0, 2, 1], [5, 5, 5], [-1, 0, 1]),  # not increasing and after pts: rebuilt with delay 1
    ],
)
def test_decode_timestamps_rebuilt_only_when_invalid(pts: list[int], dts: list[int], want: list[int]) -> None:
    pk = []
    for t, d in zip(pts, dts, strict=True):
        p = av.Packet(b"x")
        p.pts, p.dts = t, d
        pk.append(p)
    assert [p.dts for p in with_valid_decode_timestamps(pk)] == want
    assert [p.pts for p in pk] == pts


def test_join_single_segment_and_mixed_crf(tmp_path: Path) -> None:
    seg = tmp_path / "only.mp4"
    encode_segment(pattern(5), seg, 24, crf=30)
    other = tmp_path / "other.mp4"
    encode_segment(pattern(3, start=5), other, 24, crf=12)
    join_segments([seg], tmp_path / "one.mp4")
    np.testing.assert_array_equal(read_frames(tmp_path / "one.mp4"), read_frames(seg))
    join_segments([seg, other], tmp_path / "two.mp4")
    assert probe(tmp_path / "two.mp4").frames == 8


def test_metadata_roundtrip(tmp_path: Path) -> None:
    comment = "farm: decoded with RANDOM weights"
    seg = tmp_path / "s.mp4"
    encode_segment(pattern(3), seg, 24, metadata={"comment": comment})
    assert probe(seg).metadata["comment"] == comment
    out = tmp_path / "j.mp4"
    join_segments([seg, seg], out, metadata={"comment": comment, "title": "shot 7"})
    meta = probe(out).metadata
    assert meta["comment"] == comment and meta["title"] == "shot 7"
    assert probe(out).frames == 6


@pytest.mark.parametrize(
    ("other_kw", "param"),
    [({"h": 48}, "height"), ({"w": 64}, "width"), ({"fps": 25}, "fps")],
)
def test_join_mismatch_refused(tmp_path: Path, other_kw: dict, param: str) -> None:
    good = [tmp_path / "a.mp4", tmp_path / "b.mp4", tmp_path / "c.mp4"]
    fps = other_kw.pop("fps", 24)
    encode_segment(pattern(4), good[0], 24)
    encode_segment(pattern(4, start=4, **other_kw), good[1], fps)
    encode_segment(pattern(4, start=8, **other_kw), good[2], fps)
    out = tmp_path / "joined.mp4"
    with pytest.raises(FarmError, match=rf"b\.mp4.*\b{param}\b"):
        join_segments(good, out)
    assert not out.exists()
    assert stray_files(tmp_path, good) == set()


def test_join_extradata_mismatch_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    encode_segment(pattern(2), a, 24)
    encode_segment(pattern(2), b, 24, preset="slow")  # more reference frames: a different SPS
    with pytest.raises(FarmError, match=r"b\.mp4.*extradata"):
        join_segments([a, b], tmp_path / "joined.mp4")
    assert not (tmp_path / "joined.mp4").exists()


def test_join_failure_keeps_existing_output(tmp_path: Path) -> None:
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    encode_segment(pattern(2), a, 24)
    encode_segment(pattern(2), b, 30)
    out = tmp_path / "joined.mp4"
    out.write_bytes(b"previous")
    with pytest.raises(FarmError):
        join_segments([a, b], out)
    assert out.read_bytes() == b"previous"
    assert stray_files(tmp_path, [a, b, out]) == set()


def test_join_zero_segments(tmp_path: Path) -> None:
    with pytest.raises(FarmError, match="no segments"):
        join_segments([], tmp_path / "x.mp4")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "frames",
    [
        np.zeros((2, 63, 96, 3), np.uint8),
        np.zeros((2, 64, 95, 3), np.uint8),
        np.zeros((2, 64, 96, 4), np.uint8),
        np.zeros((2, 64, 96, 3), np.float32),
        np.zeros((0, 64, 96, 3), np.uint8),
    ],
    ids=["odd-height", "odd-width", "rgba", "float", "empty"],
)
def test_encode_segment_refuses_bad_frames(tmp_path: Path, frames: np.ndarray) -> None:
    with pytest.raises(FarmError):
        encode_segment(frames, tmp_path / "x.mp4", 24)
    assert list(tmp_path.iterdir()) == []


def test_join_missing_segment(tmp_path: Path) -> None:
    a = tmp_path / "a.mp4"
    encode_segment(pattern(2), a, 24)
    with pytest.raises(FarmError, match="missing"):
        join_segments([a, tmp_path / "missing.mp4"], tmp_path / "j.mp4")
    assert os.listdir(tmp_path) == ["a.mp4"]


def test_missing_output_directory(tmp_path: Path) -> None:
    with pytest.raises(FarmError, match="cannot write"):
        encode_segment(pattern(2), tmp_path / "nope" / "a.mp4", 24)


def yuv_planes(rgb: np.ndarray) -> np.ndarray:
    import torch

    from farm.media.yuv import rgb_to_yuv420

    pixels = torch.from_numpy(rgb).permute(3, 0, 1, 2).float() / 255.0
    return rgb_to_yuv420(pixels).numpy()


def test_rgb_to_yuv420_matches_swscale() -> None:
    """farm.media.yuv's conversion (done on the blending GPU) agrees with FFmpeg's BT.709 tv-range one."""
    from av.video.reformatter import ColorRange, Colorspace

    src = pattern(3)
    planes = yuv_planes(src)
    assert planes.shape == (3, H * 3 // 2, W) and planes.dtype == np.uint8
    for k in range(3):
        ref = av.VideoFrame.from_ndarray(src[k], format="rgb24").reformat(
            format="yuv420p", dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG
        )
        luma = np.frombuffer(ref.planes[0], np.uint8).reshape(H, ref.planes[0].line_size)[:, :W]
        assert np.abs(planes[k, :H].astype(int) - luma).max() <= 1
        for i, rows in ((1, slice(H, H + H // 4)), (2, slice(H + H // 4, None))):
            plane = ref.planes[i]
            chroma = np.frombuffer(plane, np.uint8).reshape(H // 2, plane.line_size)[:, : W // 2]
            # swscale filters chroma with its own kernel; farm averages each 2x2 block
            assert mean_abs_diff(planes[k, rows].reshape(H // 2, W // 2), chroma) < 1.5


def test_encode_segment_from_yuv420_planes(tmp_path: Path) -> None:
    src = pattern(10)
    out = tmp_path / "y.mp4"
    encode_segment(None, out, 24, yuv420=yuv_planes(src))
    got = read_frames(out)
    assert got.shape == src.shape
    assert mean_abs_diff(got, src) < 3
    with av.open(str(out)) as c:
        frame = next(c.decode(video=0))
    assert (frame.colorspace, frame.color_range) == (1, 1)
    # joinable with a segment encoded from RGB: the same stream headers
    rgb = tmp_path / "r.mp4"
    encode_segment(pattern(4, start=10), rgb, 24)
    join_segments([out, rgb], tmp_path / "joined.mp4")
    assert probe(tmp_path / "joined.mp4").frames == 14


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"codec": "prores_hq"}, "give it RGB frames"),
        ({"yuv420": np.zeros((2, H, W), np.uint16)}, "planes must be uint8"),
        ({"yuv420": np.zeros((2, H + 1, W), np.uint8)}, "planes must be uint8"),
    ],
)
def test_encode_segment_refuses_bad_planes(tmp_path: Path, kw: dict, match: str) -> None:
    kw.setdefault("yuv420", np.zeros((2, H * 3 // 2, W), np.uint8))
    with pytest.raises(FarmError, match=match):
        encode_segment(None, tmp_path / "bad.mov", 24, **kw)
    assert list(tmp_path.iterdir()) == []


def test_encoder_threads_come_from_the_setting_not_the_machine(tmp_path: Path) -> None:
    """x264's slice threads shape the bitstream: a fixed count (farm.encoder-threads) makes a segment's
    bytes independent of the cores of the worker that encoded it; 0, the default, leaves the choice to
    x264 (1.5 per core); a negative count is refused before a render starts."""
    import dask

    from farm.media.settings import VideoSettings
    from farm.run.validate import check_video_settings

    frames = pattern(8, h=128, w=192)
    paths = {}
    for name, threads in (("a", 4), ("b", 4), ("one", 1)):
        paths[name] = tmp_path / f"{name}.mp4"
        encode_segment(frames, paths[name], 24, preset="ultrafast", threads=threads)
    assert paths["a"].read_bytes() == paths["b"].read_bytes() != paths["one"].read_bytes()
    assert VideoSettings().encoder_threads == 0
    with dask.config.set({"farm.encoder-threads": 4}):
        assert VideoSettings().encoder_threads == 4
    with pytest.raises(FarmError, match="farm.encoder-threads"):
        check_video_settings(VideoSettings(encoder_threads=-1))
