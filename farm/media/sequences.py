"""Image sequences: one file per frame, named ``<shot>.####.<ext>``, written per temporal batch.

Formats (:data:`FORMATS`):

* ``png8``: 8-bit RGB PNG; ``png16``: 16-bit RGB PNG (uint8 levels are scaled by 257, so 255 → 65535);
* ``exr``: OpenEXR, RGB half-float, ZIP compression by default (needs the ``openexr`` package,
  ``pip install 'farm-decode[exr]'``). By default (``exr_values="display"``) values are the decoder's
  output as is: display-referred BT.709 values nominally in [0, 1], not linear, which the header says
  (``colorInteropID`` ``g24_rec709_display`` and ``colorEncoding``), against EXR's scene-linear
  convention. ``exr_values="linear"`` inverts the BT.709 transfer function (ITU-R BT.709 OETF) and
  writes scene-linear Rec. 709 values (``lin_rec709_scene``). Both carry Rec. 709 chromaticities and,
  given the shot's fps, ``framesPerSecond``. ``exr_space`` (a `farm.media.colour` space: ``lin_rec709``,
  ``acescg``, ``acescct``, ``g24_rec709``) writes the frames converted by OpenColorIO from
  ``frames_space`` (an SDR decode's ``g24_rec709`` by default; an HDR render's scene-linear space), with
  that space's chromaticities, ``colorInteropID``, ``colorEncoding`` and ``colorSpace`` (its OpenColorIO
  name); it needs the ``opencolorio`` package (``pip install 'farm-decode[colour]'``).

Colour: PNGs carry a ``cICP`` chunk (BT.709 primaries and transfer, RGB, full range) and, for older
readers, ``cHRM`` and ``gAMA``, written by FFmpeg's PNG encoder from the frame's colour properties.

Frames come as ``[F, H, W, 3]`` arrays of uint8, uint16 or float (float16 from a float master copy);
each format converts: floats are clipped to [0, 1] and rounded for PNG, written unchanged for EXR.

Frame numbers: the shot's frame ``i`` (0-based, as in the Zarr frames) is written as number
``first_frame + i`` with at least ``padding`` digits, e.g. ``shot010.1001.exr`` for ``first_frame=1001``.
A batch passes its ``start`` (its first frame's index in the shot), so batches write their files
independently and in parallel. Every file is written to a temporary name in its folder and renamed
into place: a file under its final name is complete.

Example:
    >>> paths = write_frames(frames, "out/seq/sh010", "sh010", start=8, first_frame=1001, format="exr")
    >>> paths[0].name
    'sh010.1009.exr'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import FarmError
from farm.media.beneath import atomic_path, make_folders
from farm.media.colour import SPACES, colour_available, colour_space, convert, unit_float32
from farm.media.rates import timecode_at

__all__ = [
    "FORMATS",
    "SequenceFormat",
    "exr_available",
    "frame_path",
    "png_bit_depth",
    "read_image",
    "read_sequence",
    "sequence_files",
    "write_frames",
]


@dataclass(frozen=True)
class SequenceFormat:
    name: str
    ext: str
    bit_depth: int  # 8 or 16 bits per channel; 16 for half-float EXR


FORMATS: dict[str, SequenceFormat] = {
    f.name: f
    for f in (
        SequenceFormat("png8", "png", 8),
        SequenceFormat("png16", "png", 16),
        SequenceFormat("exr", "exr", 16),
    )
}
EXR_COMPRESSIONS = ("none", "zip", "zips", "piz", "rle", "dwaa", "dwab")
# EXR value encodings: the Color Interop Forum's ID (OpenEXR's colorInteropID) and a plain description.
EXR_VALUES = {
    "display": ("g24_rec709_display",
                "display-referred: BT.709 primaries and transfer (as decoded, as in the video), not linear"),
    "linear": ("lin_rec709_scene", "scene-linear: BT.709 primaries, BT.709 transfer function inverted"),
}  # fmt: skip
# FFmpeg's AVCOL_PRI_BT709 and AVCOL_TRC_BT709: the PNG encoder writes cICP, cHRM and gAMA from them.
_BT709 = 1
# Rec. 709 / sRGB primaries and D65 white: red xy, green xy, blue xy, white xy.
REC709_CHROMATICITIES = (0.64, 0.33, 0.30, 0.60, 0.15, 0.06, 0.3127, 0.3290)


def exr_available() -> bool:
    """Whether the ``openexr`` package is installed (EXR sequences need it)."""
    try:
        import OpenEXR  # noqa: F401
    except ImportError:
        return False
    return True


def frame_path(directory: str | os.PathLike[str], shot: str, number: int, ext: str, padding: int = 4) -> Path:
    """``<directory>/<shot>.<number padded to `padding` digits>.<ext>``."""
    return Path(directory) / f"{shot}.{number:0{padding}d}.{ext}"


# ---- conversion ----------------------------------------------------------------------------------


def _check_frames(frames: Any, where: str) -> np.ndarray:
    frames = np.asarray(frames)
    ok = frames.dtype in (np.uint8, np.uint16) or np.issubdtype(frames.dtype, np.floating)
    if frames.ndim != 4 or frames.shape[-1] != 3 or not ok or 0 in frames.shape[1:3]:
        raise FarmError(
            f"{where}: frames must be [F, H, W, 3] RGB of uint8, uint16 or float, "
            f"got {frames.dtype} {tuple(frames.shape)}"
        )
    return frames


def _to_uint(frames: np.ndarray, bits: int) -> np.ndarray:
    top = (1 << bits) - 1
    dtype = np.uint8 if bits == 8 else np.uint16
    if frames.dtype == dtype:
        return frames
    if frames.dtype in (np.uint8, np.uint16):
        src_top = 255 if frames.dtype == np.uint8 else 65535
        if top % src_top == 0:  # 8 → 16 bits: exact (x * 257)
            return (frames.astype(np.uint32) * (top // src_top)).astype(dtype)
        return np.round(frames.astype(np.float64) * (top / src_top)).astype(dtype)
    return np.round(np.clip(frames.astype(np.float32), 0.0, 1.0) * top).astype(dtype)


def _to_half(frames: np.ndarray) -> np.ndarray:
    if frames.dtype == np.uint8:
        return (frames.astype(np.float32) / 255.0).astype(np.float16)
    if frames.dtype == np.uint16:
        return (frames.astype(np.float32) / 65535.0).astype(np.float16)
    return frames.astype(np.float16)


# ---- writing -------------------------------------------------------------------------------------


def encode_png(image: np.ndarray) -> bytes:
    import av

    height, width, _ = image.shape
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height = width, height
    if image.dtype == np.uint8:
        ctx.pix_fmt = "rgb24"
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
    else:
        ctx.pix_fmt = "rgb48be"
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb48le")
        frame = frame.reformat(format="rgb48be")  # PNG stores big-endian samples
    frame.color_primaries = _BT709
    frame.color_trc = _BT709
    packets = ctx.encode(frame) + ctx.encode(None)
    return b"".join(bytes(p) for p in packets)


def bt709_to_linear(values: np.ndarray) -> np.ndarray:
    """Invert the BT.709 transfer function (ITU-R BT.709-6 1.2): encoded [0, 1] → scene-linear."""
    v = values.astype(np.float32)
    return np.where(v < 0.081, v / 4.5, np.power(np.maximum(v + 0.099, 0.0) / 1.099, 1 / 0.45))


def _write_exr(
    image: np.ndarray, path: str, compression: str, fps: Any, values: str, timecode: str | None = None,
    space: str | None = None,
) -> None:
    import OpenEXR

    interop_id, description = EXR_VALUES[values]
    header = {
        "compression": getattr(OpenEXR, f"{compression.upper()}_COMPRESSION"),
        "type": OpenEXR.scanlineimage,
        "chromaticities": REC709_CHROMATICITIES,
        "colorInteropID": interop_id,
        "colorEncoding": description,
    }
    if space is not None:
        named = SPACES[space]
        header.update(chromaticities=named.chromaticities, colorInteropID=named.interop_id,
                      colorEncoding=named.description, colorSpace=named.ocio)  # fmt: skip
    if fps:
        header["framesPerSecond"] = Fraction(fps).limit_denominator(1001)
    if timecode:  # the frame's own SMPTE timecode (timeCode attribute)
        header["timeCode"] = exr_timecode(OpenEXR, timecode)
    channels = {"RGB": np.ascontiguousarray(image)}
    with OpenEXR.File(header, channels) as f:
        f.write(path)


def exr_timecode(openexr: Any, timecode: str) -> Any:
    """An OpenEXR ``TimeCode`` for ``HH:MM:SS:FF`` (``;FF``: the drop-frame flag set)."""
    tc = openexr.TimeCode()
    hours, minutes, seconds, frame = (int(x) for x in timecode.replace(";", ":").split(":"))
    tc.hours, tc.minutes, tc.seconds, tc.frame = hours, minutes, seconds, frame
    tc.dropFrame = ";" in timecode
    return tc


def write_frames(
    frames: Any,
    directory: str | os.PathLike[str],
    shot: str,
    *,
    start: int = 0,
    first_frame: int = 1,
    format: str = "png8",
    padding: int = 4,
    exr_compression: str = "zip",
    fps: Any = None,
    exr_values: str = "display",
    timecode: str | None = None,
    exr_space: str | None = None,
    frames_space: str = "g24_rec709",
    root: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Write ``frames[k]`` as ``<directory>/<shot>.<first_frame + start + k>.<ext>``; returns the paths.

    ``start`` is the index of ``frames[0]`` in the shot (a temporal batch's first frame). The folder is
    created if needed. Each file is written atomically (temp file + rename). EXR only: ``fps`` goes in
    ``framesPerSecond``; ``exr_values`` is ``"display"`` or ``"linear"`` (see the module doc); with
    ``timecode`` (the shot's first frame's, `farm.media.rates`) each file's ``timeCode`` is its own frame's.
    ``exr_space``: write the values converted from ``frames_space`` into that colour space, labelled so
    (then ``exr_values`` is not used). ``root``: the folder from which no link is followed down to the
    files (`farm.media.beneath.atomic_path`).
    """
    where = f"write_frames({shot!r}, {os.fspath(directory)!r})"
    if format not in FORMATS:
        raise FarmError(f"{where}: unknown image format {format!r}; choose one of {sorted(FORMATS)}")
    if not 1 <= padding <= 12:
        raise FarmError(f"{where}: frame number padding {padding} is invalid; use 1 to 12 digits")
    if start < 0 or first_frame < 0:
        raise FarmError(
            f"{where}: frame numbers must not be negative (start {start}, first frame {first_frame})"
        )
    if format == "exr":
        if exr_values not in EXR_VALUES:
            raise FarmError(f"{where}: EXR values {exr_values!r}; choose one of {list(EXR_VALUES)}")
        if exr_compression not in EXR_COMPRESSIONS:
            raise FarmError(
                f"{where}: EXR compression {exr_compression!r}; choose one of {list(EXR_COMPRESSIONS)}"
            )
        if exr_space is not None:
            colour_space(exr_space, f"{where}: EXR colour space")
            colour_space(frames_space, f"{where}: the frames' colour space")
            if exr_space != frames_space and not colour_available():
                raise FarmError(f"{where}: EXR frames in {exr_space!r} need the 'opencolorio' package; "
                                "install it with pip install 'farm-decode[colour]'")  # fmt: skip
        if not exr_available():
            raise FarmError(
                f"{where}: EXR output needs the 'openexr' package; install it with "
                "pip install 'farm-decode[exr]'"
            )
    frames = _check_frames(frames, where)
    fmt = FORMATS[format]
    out_dir = Path(directory)
    try:
        if root is None:
            out_dir.mkdir(parents=True, exist_ok=True)
        else:
            make_folders(Path(root), out_dir)
    except OSError as e:
        raise FarmError(f"{where}: cannot create the folder: {e}") from e
    if format == "exr":
        if exr_space is not None:
            data = convert(unit_float32(frames), frames_space, exr_space).astype(np.float16)
        else:
            data = _to_half(frames)
        if exr_space is None and exr_values == "linear":
            data = bt709_to_linear(data).astype(np.float16)
    else:
        data = _to_uint(frames, fmt.bit_depth)
    paths = []
    for k in range(data.shape[0]):
        path = frame_path(out_dir, shot, first_frame + start + k, fmt.ext, padding)
        with atomic_path(path, root) as tmp:
            if format == "exr":
                label = timecode_at(timecode, Fraction(fps), start + k) if timecode and fps else None
                _write_exr(data[k], tmp, exr_compression, fps, exr_values, label, exr_space)
            else:
                Path(tmp).write_bytes(encode_png(data[k]))
        paths.append(path)
    return paths


# ---- reading (tests, checks) ---------------------------------------------------------------------


def png_bit_depth(path: str | os.PathLike[str]) -> int:
    """Bits per channel from a PNG's IHDR chunk."""
    head = Path(path).read_bytes()[:33]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise FarmError(f"{os.fspath(path)!r} is not a PNG file")
    return head[24]


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """One image as ``[H, W, 3]``: PNG as uint8 or uint16 (by its bit depth), EXR as float16 (or float32)."""
    path = Path(path)
    if path.suffix.lower() == ".exr":
        import OpenEXR

        with OpenEXR.File(str(path)) as f:
            channels = f.channels()
            if "RGB" in channels:
                return np.asarray(channels["RGB"].pixels)
            return np.stack([np.asarray(channels[c].pixels) for c in "RGB"], axis=-1)
    import av

    depth = png_bit_depth(path)
    ctx = av.CodecContext.create("png", "r")
    frames = ctx.decode(av.Packet(path.read_bytes()))
    if not frames:
        raise FarmError(f"{str(path)!r}: no image decoded")
    if depth == 16:
        return frames[0].to_ndarray(format="rgb48le")
    return frames[0].to_ndarray(format="rgb24")


def sequence_files(directory: str | os.PathLike[str], shot: str, ext: str) -> dict[int, Path]:
    """The files ``<shot>.<digits>.<ext>`` in `directory`, by frame number (temp files excluded)."""
    pattern = re.compile(rf"^{re.escape(shot)}\.(\d+)\.{re.escape(ext)}$")
    found = {}
    for p in Path(directory).iterdir():
        m = pattern.match(p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def read_sequence(directory: str | os.PathLike[str], shot: str, ext: str) -> tuple[list[int], np.ndarray]:
    """Frame numbers and stacked images ``[F, H, W, 3]`` of a shot's sequence, in frame order."""
    files = sequence_files(directory, shot, ext)
    if not files:
        raise FarmError(f"no {shot}.####.{ext} files in {os.fspath(directory)!r}")
    return list(files), np.stack([read_image(p) for p in files.values()])
