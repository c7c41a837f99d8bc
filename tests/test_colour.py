"""Colour metadata read back from the files: PNG chunks, EXR header attributes, H.264 chroma siting."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import av
import numpy as np
import pytest

from farm.media import sequences, yuv
from farm.media.video import encode_segment
from tests.helpers import pattern

H, W = 32, 48


def png_chunks(path: Path) -> dict[bytes, bytes]:
    """A PNG's chunks by type (the last of each), each checked against its CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, pos = {}, 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks[kind] = body
        pos += 12 + length
    return chunks


@pytest.mark.parametrize("fmt", ["png8", "png16"])
def test_png_carries_bt709_cicp_chrm_and_gama(tmp_path: Path, fmt: str) -> None:
    (path,) = sequences.write_frames(pattern(1, 0, H, W), tmp_path, "sh", format=fmt)
    chunks = png_chunks(path)
    # cICP: BT.709 primaries (1), BT.709 transfer (1), RGB (matrix 0), full range (1); before IDAT
    assert chunks[b"cICP"] == bytes([1, 1, 0, 1])
    white_x, white_y, red_x, red_y = struct.unpack(">4I", chunks[b"cHRM"][:16])
    assert (white_x, white_y, red_x, red_y) == (31270, 32900, 64000, 33000)
    assert struct.unpack(">I", chunks[b"gAMA"])[0] == 45455  # 1/2.2, for readers without cICP
    order = list(png_chunks(path))
    assert order.index(b"cICP") < order.index(b"IDAT")
    np.testing.assert_array_equal(
        sequences.read_image(path) if fmt == "png8" else sequences.read_image(path) // 257,
        pattern(1, 0, H, W)[0],
    )


@pytest.mark.skipif(not sequences.exr_available(), reason="openexr is not installed")
def test_exr_says_fps_and_display_referred_values_or_writes_linear(tmp_path: Path) -> None:
    import OpenEXR

    frames = pattern(2, 0, H, W)
    display = sequences.write_frames(frames, tmp_path / "d", "sh", format="exr", fps=24000 / 1001)
    linear = sequences.write_frames(frames, tmp_path / "l", "sh", format="exr", fps=25.0, exr_values="linear")
    with OpenEXR.File(str(display[0])) as f:
        header = dict(f.header())  # the File clears its own dict on close
        shown = np.asarray(f.channels()["RGB"].pixels, dtype=np.float32)
    assert (
        header["framesPerSecond"] == pytest.approx(24000 / 1001)
        and header["framesPerSecond"].denominator == 1001
    )
    assert header["colorInteropID"] == "g24_rec709_display" and "display-referred" in header["colorEncoding"]
    with OpenEXR.File(str(linear[0])) as f:
        header = dict(f.header())  # the File clears its own dict on close
        light = np.asarray(f.channels()["RGB"].pixels, dtype=np.float32)
    assert header["framesPerSecond"] == 25 and header["colorInteropID"] == "lin_rec709_scene"
    assert "scene-linear" in header["colorEncoding"]
    np.testing.assert_allclose(shown, frames[0] / 255.0, atol=1e-3)  # values as decoded
    # linear values: the BT.709 OETF applied to them gives the display values back
    oetf = np.where(light < 0.018, 4.5 * light, 1.099 * np.power(light, 0.45) - 0.099)
    np.testing.assert_allclose(oetf, shown, atol=4e-3)
    assert (light <= shown + 1e-3).all() and light[shown > 0.2].mean() < shown[shown > 0.2].mean()


# ---- H.264: where the chroma samples sit --------------------------------------------------------


def _rbsp(nal: bytes) -> bytes:
    """A NAL unit's payload without emulation-prevention bytes (00 00 03 → 00 00)."""
    out, zeros = bytearray(), 0
    for b in nal:
        if zeros >= 2 and b == 3:
            zeros = 0
            continue
        out.append(b)
        zeros = zeros + 1 if b == 0 else 0
    return bytes(out)


class _Bits:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def u(self, n: int) -> int:
        v = 0
        for _ in range(n):
            v = (v << 1) | ((self.data[self.pos // 8] >> (7 - self.pos % 8)) & 1)
            self.pos += 1
        return v

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
        return (1 << zeros) - 1 + self.u(zeros)


def h264_chroma_location(avcc: bytes) -> int | None:
    """chroma_sample_loc_type_top_field of the first SPS in an avcC record (ITU-T H.264 7.3.2.1.1, E.1.1);
    None when the stream does not say (decoders then assume 0, left-sited)."""
    n = int.from_bytes(avcc[6:8], "big")
    b = _Bits(_rbsp(avcc[8 : 8 + n][1:]))
    profile = b.u(8)
    b.u(16), b.ue()  # constraint flags and level, sps id
    if profile in (100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135):
        if b.ue() == 3:  # chroma_format_idc
            b.u(1)
        b.ue(), b.ue(), b.u(1)
        assert b.u(1) == 0, "scaling matrices are not parsed here"
    b.ue()  # log2_max_frame_num
    if b.ue() == 0:  # pic_order_cnt_type (x264 writes 0 or 2)
        b.ue()
    b.ue(), b.u(1), b.ue(), b.ue()  # ref frames, gaps, width, height
    if b.u(1) == 0:  # frame_mbs_only
        b.u(1)
    b.u(1)
    if b.u(1):  # cropping
        b.ue(), b.ue(), b.ue(), b.ue()
    if not b.u(1):  # no VUI
        return None
    if b.u(1) and b.u(8) == 255:  # aspect ratio
        b.u(32)
    if b.u(1):  # overscan
        b.u(1)
    if b.u(1):  # video signal type, colour description
        b.u(4)
        if b.u(1):
            b.u(24)
    return b.ue() if b.u(1) else None


def test_rgb_to_yuv420_sites_chroma_at_the_centre() -> None:
    """farm.media.yuv's chroma is each 2x2 block's mean: centre-sited (H.264 chroma_sample_loc_type 1)."""
    import torch

    rgb = torch.zeros(3, 1, 4, 4)
    rgb[2, 0, :, 1] = 1.0  # a blue column at x = 1: a left-sited filter would weigh it more than x = 0
    planes = yuv.rgb_to_yuv420(rgb).numpy()[0]
    cb = planes[4 : 4 + 1].reshape(2, 2)
    mirrored = torch.zeros(3, 1, 4, 4)
    mirrored[2, 0, :, 0] = 1.0
    cb_mirrored = yuv.rgb_to_yuv420(mirrored).numpy()[0][4:5].reshape(2, 2)
    np.testing.assert_array_equal(cb, cb_mirrored)  # both columns of a block count alike
    assert cb[0, 0] > 128 and cb[0, 1] == 128


@pytest.mark.parametrize("source", ["rgb", "planes"])
def test_h264_says_chroma_is_centre_sited(tmp_path: Path, source: str) -> None:
    import torch

    frames = pattern(3, 0, H, W)
    out = tmp_path / "c.mp4"
    if source == "rgb":
        encode_segment(frames, out, 24)
    else:
        pixels = torch.from_numpy(frames).permute(3, 0, 1, 2).float() / 255.0
        encode_segment(None, out, 24, yuv420=yuv.rgb_to_yuv420(pixels).numpy())
    with av.open(str(out)) as container:
        extradata = bytes(container.streams.video[0].codec_context.extradata)
    assert h264_chroma_location(extradata) == 1  # centre, as farm.media.yuv computes it
