"""--colorspace on ProRes video, on a real local cluster: frames converted by OpenColorIO before the 10-bit
encode, the stream's colour tags and the container metadata naming the space after the segments are
joined, the default render's BT.709 tags, and the refusals made before any cluster."""

from __future__ import annotations

import re

import av
import numpy as np
import pytest
from av.video.reformatter import ColorRange, Colorspace

PyOpenColorIO = pytest.importorskip("PyOpenColorIO")
pytest.importorskip("OpenEXR")

import farm  # noqa: E402
from farm import cli  # noqa: E402
from farm.errors import FarmError  # noqa: E402
from farm.media import colour  # noqa: E402
from farm.media.settings import VideoSettings  # noqa: E402
from farm.media.video import encode_segment, read_frames  # noqa: E402
from farm.store import frames as zarr_frames  # noqa: E402
from farm.store.output import Output  # noqa: E402
from tests.test_hdr_render import QUIET, SHOT, UNREACHABLE, exr_header, exrs, make_job, render  # noqa: E402


def ocio(values: np.ndarray, source: str, target: str) -> np.ndarray:
    """OpenColorIO's conversion between two colour spaces of the pinned built-in config, by PyOpenColorIO
    with the config's exact curves (the default optimisation's approximations move values by 3e-6: enough
    for ProRes' rate control to quantise a slice differently)."""
    config = PyOpenColorIO.Config.CreateFromFile(f"ocio://{colour.OCIO_CONFIG}")
    processor = config.getProcessor(source, target).getOptimizedCPUProcessor(
        PyOpenColorIO.BIT_DEPTH_F32, PyOpenColorIO.BIT_DEPTH_F32, PyOpenColorIO.OPTIMIZATION_LOSSLESS
    )
    pixels = np.ascontiguousarray(values, dtype=np.float32)
    processor.applyRGB(pixels.reshape(-1))
    return pixels


def prores_by_pyav(values: np.ndarray, profile: str, pix_fmt: str, path) -> np.ndarray:
    """`values` in [0, 1] encoded by FFmpeg's prores_ks from 16-bit RGB (BT.709 matrix, tv range) with
    PyAV alone, read back as 16-bit RGB: the codec's own loss (the tiny job's noisy frames lose much)."""
    with av.open(str(path), mode="w", format="mov") as out:
        stream = out.add_stream("prores_ks", rate=24, options={"profile": profile, "vendor": "apl0"})
        stream.width, stream.height, stream.pix_fmt = values.shape[2], values.shape[1], pix_fmt
        stream.codec_context.colorspace, stream.codec_context.color_range = 1, 1
        for k, frame in enumerate(np.round(np.clip(values, 0.0, 1.0) * 65535.0).astype(np.uint16)):
            rgb = av.VideoFrame.from_ndarray(frame, format="rgb48le")
            yuv = rgb.reformat(format=pix_fmt, dst_colorspace=Colorspace.ITU709,
                               dst_color_range=ColorRange.MPEG)  # fmt: skip
            yuv.pts = k
            for packet in stream.encode(yuv):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return read_frames(path, depth=16)


def colour_of(path) -> tuple[dict[str, str], tuple[int, int, int], tuple[int, int, int]]:
    """The container metadata, the stream's (primaries, transfer, matrix) and its first frame's."""
    with av.open(str(path)) as container:
        ctx = container.streams.video[0].codec_context
        frame = next(container.decode(video=0))
        return (dict(container.metadata), (ctx.color_primaries, ctx.color_trc, ctx.colorspace),
                (frame.color_primaries, frame.color_trc, frame.colorspace))  # fmt: skip


@pytest.fixture
def sdr_job(tmp_path):
    return make_job(tmp_path / "sdr.zarr")


def test_prores_4444_in_acescct_is_opencolorios_conversion_of_the_decode(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out", video_suffix=".mov")
    settings = VideoSettings(codec="prores_4444", colorspace="acescct", sequence="exr")
    assert not render(sdr_job, out, settings, scheduler=scheduler3).failed

    levels = zarr_frames.read_frames(out, SHOT)
    assert levels.dtype == np.uint8  # the SDR decode kept as decoded
    want = ocio(levels / 255.0, "Gamma 2.4 Rec.709 - Texture", "ACEScct")
    assert want.min() > 0.0 and want.max() < 1.0  # ACEScct codes of SDR values fit the codec's range
    got = read_frames(out.video(SHOT), depth=16)
    assert got.shape == want.shape  # every frame, joined from three segments
    # exactly what ProRes 4444 makes of OpenColorIO's values given to it at 16 bits
    reference = prores_by_pyav(want, "4", "yuv444p10le", tmp_path / "reference.mov")
    np.testing.assert_array_equal(got, reference)
    # given at 8 bits, the same values would encode otherwise: farm feeds the encoder more than 8 bits
    eight_bit = prores_by_pyav(np.round(want * 255.0) / 255.0, "4", "yuv444p10le", tmp_path / "8bit.mov")
    assert np.abs(eight_bit.astype(np.int32) - reference).mean() > 16

    metadata, stream_tags, frame_tags = colour_of(out.video(SHOT))
    assert metadata["colour_space"] == "acescct" and metadata["ocio_colorspace"] == "ACEScct"
    assert metadata["ocio_config"] == f"ocio://{colour.OCIO_CONFIG}"
    assert metadata["color_interop_id"] == "ocio:acescct_ap1_scene"
    assert metadata["comment"].startswith("farm render: ")  # the render's own metadata kept beside it
    # FFmpeg has no codes for AP1 or the ACEScct curve: unspecified (2); the matrix the encode used, BT.709
    assert stream_tags == frame_tags == (2, 2, 1)
    # the same --colorspace applies to the EXR frames
    assert exr_header(exrs(out)[0])["colorInteropID"] == "ocio:acescct_ap1_scene"


def test_prores_hq_in_lin_rec709_is_tagged_bt709_primaries_and_linear_transfer(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out", video_suffix=".mov")
    settings = VideoSettings(codec="prores_hq", colorspace="lin_rec709")
    assert not render(sdr_job, out, settings, scheduler=scheduler3).failed
    metadata, stream_tags, frame_tags = colour_of(out.video(SHOT))
    assert stream_tags == frame_tags == (1, 8, 1)  # BT.709 primaries, linear transfer (AVCOL_TRC_LINEAR)
    assert metadata["colour_space"] == "lin_rec709" and metadata["color_interop_id"] == "lin_rec709_scene"
    linear = ocio(zarr_frames.read_frames(out, SHOT) / 255.0, "Gamma 2.4 Rec.709 - Texture",
                  "Linear Rec.709 (sRGB)")  # fmt: skip
    reference = prores_by_pyav(linear, "3", "yuv422p10le", tmp_path / "reference.mov")
    np.testing.assert_array_equal(read_frames(out.video(SHOT), depth=16), reference)


def test_default_prores_render_is_tagged_bt709_without_a_colour_space(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out", video_suffix=".mov")
    assert not render(sdr_job, out, VideoSettings(codec="prores_4444"), scheduler=scheduler3).failed
    metadata, stream_tags, frame_tags = colour_of(out.video(SHOT))
    assert stream_tags == frame_tags == (1, 1, 1)
    assert "colour_space" not in metadata


def test_an_8_bit_codec_is_not_encoded_in_another_colour_space(tmp_path):
    frames = np.zeros((2, 16, 16, 3), np.uint8)
    with pytest.raises(FarmError, match="h264 cannot be written in colour space 'acescg'"):
        encode_segment(frames, tmp_path / "a.mp4", 24, codec="h264", space="acescg")
    with pytest.raises(FarmError, match="prores_hq cannot be written in colour space 'lin_rec2020'; ProRes"):
        encode_segment(frames, tmp_path / "a.mov", 24, codec="prores_hq", space="lin_rec2020")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "settings, words",
    [
        (VideoSettings(codec="h265", colorspace="lin_rec709"),
         "--colorspace lin_rec709: h265 video is 8-bit display video (g24_rec709 only); choose --codec "
         "prores_hq or prores_4444"),
        (VideoSettings(codec="prores_4444", colorspace="acescg", enabled=False),
         "--colorspace acescg: colour spaces apply to EXR frames and ProRes video"),
        (VideoSettings(codec="prores_4444", colorspace="acescg", hdr="acescct"),
         "--colorspace acescg: an HDR render's video is its HLG master, which --colorspace does not change"),
    ],
)  # fmt: skip
def test_colour_spaces_no_output_can_hold_are_refused_before_any_cluster(tmp_path, settings, words):
    job = make_job(tmp_path / "job.zarr")
    with pytest.raises(FarmError, match=re.escape(words)) as err:
        farm.render(job, tmp_path / "out", scheduler=UNREACHABLE, video=settings, **QUIET)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_farm_render_h264_in_acescg_is_refused_in_one_line_before_any_cluster(tmp_path, capsys):
    job = make_job(tmp_path / "job.zarr")
    argv = ["render", str(job), "--out", str(tmp_path / "out"), "--scheduler", UNREACHABLE]
    assert cli.main([*argv, "--codec", "h264", "--colorspace", "acescg"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("--colorspace acescg: h264 video is 8-bit display video (g24_rec709 only); choose --codec "
            "prores_hq or prores_4444, add --sequence exr, or give --colorspace g24_rec709") in err
    assert not (tmp_path / "out").exists()


def test_segments_in_different_colour_spaces_are_not_joined(tmp_path):
    from farm.media.video import join_segments

    frames = np.full((2, 16, 16, 3), 128, np.uint8)
    encode_segment(frames, tmp_path / "0.mov", 24, codec="prores_4444", space="acescct")
    encode_segment(frames, tmp_path / "1.mov", 24, codec="prores_4444")
    words = "1.mov': its colour space is 'BT.709', the first segment's 'acescct'"
    with pytest.raises(FarmError, match=re.escape(words)):
        join_segments([tmp_path / "0.mov", tmp_path / "1.mov"], tmp_path / "shot.mov")
    join_segments([tmp_path / "0.mov", tmp_path / "0.mov"], tmp_path / "shot.mov")
    metadata, stream_tags, _ = colour_of(tmp_path / "shot.mov")
    assert metadata["colour_space"] == "acescct" and stream_tags == (2, 2, 1)
