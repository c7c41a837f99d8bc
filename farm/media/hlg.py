"""The HDR master: 10-bit BT.2020 HLG HEVC segments of scene-linear frames, joinable like every video.

:func:`encode_hlg_segment` encodes one temporal batch of scene-linear frames (float16 from an HDR
render's Zarr, in ``lin_rec709`` or ``acescg``) with libx265, Main 10, ``yuv420p10le``, tagged BT.2020
primaries, ARIB STD-B67 (HLG) transfer, BT.2020 non-constant-luminance matrix, limited range, centre-sited
chroma, in the container as in the HEVC VUI. The colour path is `farm.media.hdr`'s (OpenColorIO to
BT.2020, LTX-2's HLG mapping, Y'CbCr computed here: no swscale). Segments are closed GOPs with
content-independent headers (`farm.media.video`'s x265 settings), so `farm.media.video.join_segments`
joins a shot's segments without re-encoding.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

import av
import numpy as np
from av.video.reformatter import ColorRange

from farm.errors import FarmError
from farm.media.beneath import atomic_path
from farm.media.colour import convert
from farm.media.hdr import hlg_signal, hlg_yuv420p10
from farm.media.video import CHROMA_CENTRE, X265_PARAMS, with_valid_decode_timestamps

__all__ = ["HLG_PIX_FMT", "encode_hlg_segment", "hlg_planes"]

HLG_PIX_FMT = "yuv420p10le"
# FFmpeg's AVCOL_PRI_BT2020, AVCOL_TRC_ARIB_STD_B67, AVCOL_SPC_BT2020_NCL
_BT2020, _ARIB_STD_B67, _BT2020_NCL = 9, 18, 9
# The same frames must give the same bytes (a resumed or re-run batch): with a sliced lookahead, and with
# B-frames (their bits varied from one 10-bit encode of a render's batch to the next while the I and P
# frames did not), x265's bitstream differs between encodes
_X265_HLG = (f"{X265_PARAMS}:lookahead-slices=0:bframes=0"
             ":colorprim=bt2020:transfer=arib-std-b67:colormatrix=bt2020nc:range=limited")
LINEAR_SOURCES = ("lin_rec709", "acescg")


def hlg_planes(frames: Any, space: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scene-linear RGB ``[F, H, W, 3]`` in `space` → the master's 10-bit Y, Cb, Cr planes."""
    if space not in LINEAR_SOURCES:
        raise FarmError(f"HLG master: frames in {space!r}; give scene-linear frames in one of "
                        f"{list(LINEAR_SOURCES)}")  # fmt: skip
    return hlg_yuv420p10(hlg_signal(convert(frames, space, "lin_rec2020")))


def encode_hlg_segment(
    frames: Any,
    path: str | os.PathLike[str],
    fps: float | Fraction,
    *,
    space: str,
    crf: int = 12,
    preset: str = "veryfast",
    threads: int = 0,
    metadata: dict[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> None:
    """Encode scene-linear frames ``[F, H, W, 3]`` in `space` as one HLG HEVC ``.mp4`` segment at `path`.

    Frame ``k`` at ``k / fps`` seconds; ``threads`` as in `farm.media.video.encode_segment` (the bitstream
    depends on them). Written to a temp file and renamed into place;
    `root`: the folder from which no link is followed down to it (`farm.media.beneath.atomic_path`)."""
    where = f"encode_hlg_segment({os.fspath(path)!r})"
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or not np.issubdtype(frames.dtype, np.floating):
        raise FarmError(f"{where}: frames must be float [F, H, W, 3] scene-linear RGB, "
                        f"got {frames.dtype} {tuple(frames.shape)}")  # fmt: skip
    n, height, width, _ = frames.shape
    if n == 0 or height % 2 or width % 2 or not height or not width:
        raise FarmError(f"{where}: needs frames of an even, non-zero size, got {n} of {width}x{height} "
                        "(W x H)")  # fmt: skip
    if threads < 0:
        raise FarmError(f"{where}: encoder threads {threads} < 0; use 0 (the encoder's choice) or more")
    rate = Fraction(fps).limit_denominator(1001000)
    if rate <= 0:
        raise FarmError(f"{where}: fps must be positive, got {fps!r}")
    y, cb, cr = hlg_planes(frames, space)
    time_base = 1 / rate
    with atomic_path(path, root) as tmp, av.open(tmp, mode="w", format="mp4") as out:
        out.metadata.update(metadata or {})
        options = {"x265-params": _X265_HLG, "crf": str(crf), "preset": preset, **dict([CHROMA_CENTRE])}
        stream = out.add_stream("libx265", rate=rate, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, HLG_PIX_FMT
        stream.time_base = time_base
        ctx = stream.codec_context
        ctx.time_base = time_base
        ctx.thread_count = threads
        ctx.codec_tag = "hvc1"
        ctx.color_primaries, ctx.color_trc, ctx.colorspace = _BT2020, _ARIB_STD_B67, _BT2020_NCL
        ctx.color_range = int(ColorRange.MPEG)
        packets: list[av.Packet] = []
        for k in range(n):
            frame = av.VideoFrame(width, height, HLG_PIX_FMT)
            for plane, src in zip(frame.planes, (y[k], cb[k], cr[k]), strict=True):
                rows = np.frombuffer(memoryview(plane), dtype=np.uint16)  # a plane's rows are padded
                rows.reshape(plane.height, plane.line_size // 2)[:, : src.shape[1]] = src
            frame.color_primaries, frame.color_trc = _BT2020, _ARIB_STD_B67
            frame.colorspace, frame.color_range = _BT2020_NCL, int(ColorRange.MPEG)
            frame.pts, frame.time_base = k, time_base
            packets.extend(stream.encode(frame))
        packets.extend(stream.encode(None))
        out.mux(with_valid_decode_timestamps(packets))
