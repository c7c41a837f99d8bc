"""Video segments: encode each temporal batch independently, then join them without re-encoding.

Codecs (:data:`CODECS`, chosen by name):

===============  =========  =====  ===========  ===============================================
name             encoder    file   pix_fmt      notes
===============  =========  =====  ===========  ===============================================
``h264``         libx264    .mp4   yuv420p      default; ``crf``, ``preset``
``h265``         libx265    .mp4   yuv420p      ``crf``, ``preset``; tagged ``hvc1`` (QuickTime)
``prores_hq``    prores_ks  .mov   yuv422p10le  ProRes 422 HQ (profile 3, ``apch``), intra-only
``prores_4444``  prores_ks  .mov   yuv444p10le  ProRes 4444 (profile 4, ``ap4h``, no alpha), intra-only
===============  =========  =====  ===========  ===============================================

FFmpeg's ProRes decoder reports 4444 streams as ``yuv444p12le`` whatever the encoder was given.

Every segment is a complete file whose first frame is a key frame (IDR for H.264/H.265: closed GOPs,
no scene cuts, a GOP longer than any segment). Segments of one shot share size, frame rate and encoder
settings, so their stream headers (the ``avcC``/``hvcC`` extradata; ProRes has none) are byte-identical
and their packets can be concatenated into one stream: :func:`join_segments` only rewrites timestamps.
All files carry BT.709 colour tags (primaries, transfer, matrix; tv range) and the shot's frame rate,
except ProRes written in another colour space (``encode_segment(space=...)``, :data:`SPACE_TAGS`): its
frames converted by OpenColorIO (`farm.media.colour`), tagged with the primaries and transfer FFmpeg has
codes for, and the space named in the container's metadata, which :func:`join_segments` keeps.
H.264/H.265 streams also say where their chroma samples sit (``chroma_sample_location`` centre,
chroma_sample_loc_type 1 in the VUI): `farm.media.yuv` averages each 2×2 block, and RGB frames given here are
converted by the same function, so the tag is true for both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace
from av.video.stream import VideoStream

from farm.errors import FarmError
from farm.media.audio import Track
from farm.media.beneath import atomic_path
from farm.media.colour import convert, space_attributes, unit_float32
from farm.media.yuv import rgb_to_yuv420

__all__ = [
    "CODECS",
    "SPACE_TAGS",
    "Codec",
    "VideoInfo",
    "codec_for",
    "encode_segment",
    "join_segments",
    "probe",
    "read_frames",
]

# Fixed GOP structure and no scene-cut detection: headers and GOP layout depend only on the settings,
# never on the content, so independently encoded segments stay joinable. The GOP is longer than any
# sensible segment, so each segment is one closed GOP starting with an IDR frame.
_KEYINT = 250
# ``stitchable`` stops x264 tuning the PPS to rate control (e.g. pic_init_qp from crf), made for exactly this.
_X264_PARAMS = f"keyint={_KEYINT}:min-keyint={_KEYINT}:scenecut=0:open-gop=0:stitchable=1"
# The same for x265; ``info=0`` leaves out the SEI that records the encoder's command line.
X265_PARAMS = (
    f"keyint={_KEYINT}:min-keyint={_KEYINT}:scenecut=0:open-gop=0:repeat-headers=0:info=0:log-level=error"
)
# AVCOL_PRI_BT709, AVCOL_TRC_BT709, AVCOL_SPC_BT709 are all 1 in FFmpeg's enums.
_BT709 = 1
# (primaries, transfer) tags, in FFmpeg's codes, of a 10-bit video in each farm.media.colour space it can be
# written in: BT.709 (1), linear transfer (8); FFmpeg has no codes for ACES AP1 primaries or the ACEScct
# curve, so those stay unspecified (2) and only the metadata names the space. The matrix stays BT.709:
# it is the one the RGB → YCbCr conversion uses, whatever the RGB values mean.
SPACE_TAGS: dict[str, tuple[int, int]] = {
    "g24_rec709": (_BT709, _BT709), "lin_rec709": (_BT709, 8), "acescg": (2, 2), "acescct": (2, 2),
}  # fmt: skip
# The container metadata naming a video's colour space (farm.media.colour.space_attributes' keys); the mov
# muxer keeps keys outside QuickTime's own set only as mdta keys (movflags use_metadata_tags).
_SPACE_KEYS = frozenset(space_attributes("g24_rec709"))
_MDTA_KEYS = {"movflags": "use_metadata_tags"}
# farm.media.yuv's 4:2:0 chroma is centre-sited (the mean of each 2x2 block); without this tag, decoders
# assume left-sited chroma (H.264/H.265's default) and shift colour edges by a quarter pixel.
CHROMA_CENTRE = ("chroma_sample_location", "center")


@dataclass(frozen=True)
class Codec:
    """How one output kind is encoded: encoder, container, pixel format and bit depth."""

    name: str
    encoder: str
    container: str  # FFmpeg muxer: "mp4" or "mov"
    suffix: str  # file suffix of a video in this codec
    pix_fmt: str
    bit_depth: int  # 8: frames must be uint8; 10: uint8, uint16 or float [0, 1] frames
    rate_control: bool  # crf and preset apply
    options: tuple[tuple[str, str], ...] = ()
    codec_tag: str | None = None

    def stream_options(self, crf: int, preset: str) -> dict[str, str]:
        opts = dict(self.options)
        if self.rate_control:
            opts.update({"crf": str(crf), "preset": preset})
        return opts


CODECS: dict[str, Codec] = {
    c.name: c
    for c in (
        Codec("h264", "libx264", "mp4", ".mp4", "yuv420p", 8, True,
              (("x264-params", _X264_PARAMS), CHROMA_CENTRE)),
        Codec("h265", "libx265", "mp4", ".mp4", "yuv420p", 8, True,
              (("x265-params", X265_PARAMS), CHROMA_CENTRE), codec_tag="hvc1"),
        Codec("prores_hq", "prores_ks", "mov", ".mov", "yuv422p10le", 10, False,
              (("profile", "3"), ("vendor", "apl0"))),
        Codec("prores_4444", "prores_ks", "mov", ".mov", "yuv444p10le", 10, False,
              (("profile", "4"), ("vendor", "apl0"))),
    )
}  # fmt: skip
_CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".m4v": "mp4"}


def codec_for(name: str) -> Codec:
    """The codec called `name` (``h264``, ``h265``, ``prores_hq``, ``prores_4444``)."""
    if name not in CODECS:
        raise FarmError(f"unknown video codec {name!r}; choose one of {sorted(CODECS)}")
    return CODECS[name]


@dataclass(frozen=True)
class VideoInfo:
    """What :func:`probe` found in a video file (frame count by demuxing, not from the header)."""

    frames: int
    width: int
    height: int
    fps: Fraction
    codec: str
    pix_fmt: str
    metadata: dict[str, str]


def _fraction(value: Any) -> Fraction:
    """A ``Fraction`` from a ``Fraction`` (PyAV 18), an ``AVRational`` (PyAV 19) or ``None`` (-> 0)."""
    if value is None:
        return Fraction(0)
    return Fraction(int(value.numerator), int(value.denominator))


def _prepare_frames(frames: np.ndarray, codec: Codec, where: str) -> tuple[np.ndarray, str]:
    """Check frames ``[F, H, W, 3]`` and return them with the PyAV RGB format to feed the encoder."""
    frames = np.asarray(frames)
    ok_dtype = frames.dtype == np.uint8 or (
        codec.bit_depth > 8 and (frames.dtype == np.uint16 or np.issubdtype(frames.dtype, np.floating))
    )
    if frames.ndim != 4 or frames.shape[-1] != 3 or not ok_dtype:
        kinds = "uint8" if codec.bit_depth == 8 else "uint8, uint16 or float [0, 1]"
        raise FarmError(
            f"{where}: frames must be {kinds} [F, H, W, 3] RGB for {codec.name}, "
            f"got {frames.dtype} {tuple(frames.shape)}"
        )
    if frames.dtype == np.uint8:
        return frames, "rgb24"
    if frames.dtype != np.uint16:  # float [0, 1] → 16-bit, the encoder's swscale takes it to 10 bits
        frames = np.round(np.clip(frames.astype(np.float32), 0.0, 1.0) * 65535.0).astype(np.uint16)
    return frames, "rgb48le"


def _rgb_to_yuv420(frames: np.ndarray) -> np.ndarray:
    """uint8 RGB frames ``[F, H, W, 3]`` → yuv420p planes by `farm.media.yuv.rgb_to_yuv420` (on the CPU)."""
    import torch

    pixels = torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2).float().div_(255.0)
    return rgb_to_yuv420(pixels).numpy()


def _prepare_planes(planes: np.ndarray, codec: Codec, where: str) -> tuple[int, int, int]:
    """Check yuv420p planes ``[F, H * 3 / 2, W]`` (see :func:`farm.media.yuv.rgb_to_yuv420`): frames, H, W."""
    planes = np.asarray(planes)
    if codec.pix_fmt != "yuv420p":
        raise FarmError(
            f"{where}: {codec.name} encodes {codec.pix_fmt}; give it RGB frames, not yuv420p planes"
        )
    if planes.ndim != 3 or planes.dtype != np.uint8 or planes.shape[1] % 3:
        raise FarmError(
            f"{where}: yuv420p planes must be uint8 [F, H*3/2, W], got {planes.dtype} {planes.shape}"
        )
    return planes.shape[0], planes.shape[1] * 2 // 3, planes.shape[2]


def _space_tags(codec: Codec, space: str | None, where: str) -> tuple[tuple[int, int], dict[str, str]]:
    """The (primaries, transfer) tags and the container metadata of a segment in `space` (None: BT.709)."""
    if space is None:
        return (_BT709, _BT709), {}
    if codec.bit_depth == 8 or space not in SPACE_TAGS:
        raise FarmError(f"{where}: {codec.name} cannot be written in colour space {space!r}; ProRes "
                        f"takes one of {list(SPACE_TAGS)}, H.264/H.265 only BT.709 (no space)")  # fmt: skip
    return SPACE_TAGS[space], space_attributes(space)


def encode_segment(
    frames: np.ndarray | None,
    path: str | os.PathLike[str],
    fps: float | Fraction,
    *,
    codec: str = "h264",
    crf: int = 18,
    preset: str = "veryfast",
    metadata: dict[str, str] | None = None,
    yuv420: np.ndarray | None = None,
    threads: int = 0,
    space: str | None = None,
    frames_space: str = "g24_rec709",
    root: str | os.PathLike[str] | None = None,
) -> None:
    """Encode RGB frames ``[F, H, W, 3]`` as one independently decodable video file at ``path``.

    ``codec`` is a name in :data:`CODECS` (default H.264 mp4); ``crf``/``preset`` apply to H.264/H.265.
    8-bit codecs take uint8 frames; 10-bit ones (ProRes) also take uint16 or float frames in [0, 1].
    ``yuv420``: the frames already converted to BT.709 tv-range yuv420p planes (``farm.media.yuv``), fed to
    the encoder as they are instead of ``frames`` (H.264/H.265 only). BT.709 (tv range) tags, frame ``k`` at
    ``k / fps`` seconds. Written to a temp file in the same directory and renamed into place, so
    ``path`` is either complete or absent; `root`: the folder from which no link is followed down to it
    (`farm.media.beneath.atomic_path`). ``threads``: the encoder's threads (x264 and x265 slice
    threads: the bitstream depends on them); 0 lets the encoder choose from the machine's cores.
    ``space`` (ProRes only): the frames, in the `farm.media.colour` space ``frames_space``, converted into
    that space by OpenColorIO, clipped to [0, 1] and fed to the encoder at 16 bits; tagged per
    :data:`SPACE_TAGS`, the space named in the container metadata (`farm.media.colour.space_attributes`).
    """
    spec = codec_for(codec)
    where = f"encode_segment({os.fspath(path)!r})"
    (primaries, transfer), space_metadata = _space_tags(spec, space, where)
    if yuv420 is not None:
        n, height, width = _prepare_planes(yuv420, spec, where)
    else:
        if frames is None:
            raise FarmError(f"{where}: give RGB frames or yuv420p planes")
        if space is not None:
            frames = convert(unit_float32(np.asarray(frames)), frames_space, space)
        frames, rgb_format = _prepare_frames(frames, spec, where)
        n, height, width, _ = frames.shape
        if spec.pix_fmt == "yuv420p" and n and not (height % 2 or width % 2):
            yuv420 = _rgb_to_yuv420(frames)  # the blend's conversion: the same chroma siting
    if n == 0:
        raise FarmError(f"{where}: no frames to encode")
    needs_even = (height % 2 if spec.pix_fmt.startswith("yuv420") else 0) or (
        width % 2 if not spec.pix_fmt.startswith("yuv444") else 0
    )
    if needs_even or height == 0 or width == 0:
        raise FarmError(
            f"{where}: {spec.name} {spec.pix_fmt} needs an even, non-zero frame size, "
            f"got {width}x{height} (W x H); crop or pad to even dimensions"
        )
    rate = Fraction(fps).limit_denominator(1001000)
    if rate <= 0:
        raise FarmError(f"{where}: fps must be positive, got {fps!r}")
    time_base = 1 / rate

    with (
        atomic_path(path, root) as tmp,
        av.open(tmp, mode="w", format=spec.container, options=_MDTA_KEYS if space_metadata else None) as out,
    ):
        out.metadata.update({**(metadata or {}), **space_metadata})
        options = spec.stream_options(crf, preset)
        stream = cast(VideoStream, out.add_stream(spec.encoder, rate=rate, options=options))
        stream.width = width
        stream.height = height
        stream.pix_fmt = spec.pix_fmt
        stream.time_base = time_base
        ctx = stream.codec_context
        ctx.time_base = time_base
        if threads < 0:
            raise FarmError(f"{where}: encoder threads {threads} < 0; use 0 (the encoder's choice) or more")
        ctx.thread_count = threads
        if spec.codec_tag:
            ctx.codec_tag = spec.codec_tag
        ctx.color_primaries, ctx.color_trc = primaries, transfer
        ctx.colorspace = _BT709
        ctx.color_range = int(ColorRange.MPEG)
        packets: list[av.Packet] = []  # compressed, so a segment's worth is small
        for k in range(n):
            if yuv420 is not None:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(yuv420[k]), format="yuv420p")
                frame.colorspace = _BT709
                frame.color_range = int(ColorRange.MPEG)
            else:
                assert frames is not None  # checked above: RGB frames or planes
                rgb = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[k]), format=rgb_format)
                frame = rgb.reformat(
                    format=spec.pix_fmt, dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG
                )
            frame.color_primaries = primaries  # encoders that tag per frame (prores_ks) read these
            frame.color_trc = transfer
            frame.pts = k
            frame.time_base = time_base
            packets.extend(stream.encode(frame))
        packets.extend(stream.encode(None))
        out.mux(with_valid_decode_timestamps(packets))


def with_valid_decode_timestamps(packets: list[Any]) -> list[Any]:
    """``packets`` (in decode order) with decode timestamps the muxer accepts: increasing, never after pts.

    x265 leaves the dts of a two-frame clip uninitialised (its B-frame delay is measured only from a
    third frame), and the muxer then fails. Such packets get dts rebuilt from their pts: the k-th smallest
    pts, moved back by the least delay that keeps every dts at or before its own pts. Valid dts are kept.
    """
    pts = [p.pts for p in packets]
    dts = [p.dts for p in packets]
    valid = (
        None not in pts
        and None not in dts
        and all(d <= t for d, t in zip(dts, pts, strict=True))
        and all(a < b for a, b in zip(dts, dts[1:], strict=False))
        and (not dts or dts[0] >= min(pts) - len(packets))  # a reorder delay longer than the clip is noise
    )
    if valid or None in pts:
        return packets
    order = sorted(pts)
    delay = max([0, *(o - t for o, t in zip(order, pts, strict=True))])
    for p, o in zip(packets, order, strict=True):
        p.dts = o - delay
    return packets


@dataclass(frozen=True)
class _StreamParams:
    codec: str
    profile: str
    codec_tag: str
    width: int
    height: int
    pix_fmt: str
    fps: Fraction
    time_base: Fraction
    extradata: bytes


def _open_video(path: str | os.PathLike[str]) -> av.container.InputContainer:
    try:
        container = av.open(os.fspath(path))
    except (OSError, av.FFmpegError) as e:
        raise FarmError(f"cannot open video {os.fspath(path)!r}: {e}") from e
    if not container.streams.video:
        container.close()
        raise FarmError(f"{os.fspath(path)!r} has no video stream")
    return container


def _ts(timestamp: int | None) -> int:
    """A packet's pts or dts, which every packet farm reads back has (packets without pts are skipped)."""
    if timestamp is None:
        raise FarmError("a video packet has no timestamp; the segment is damaged: render its batch again")
    return timestamp


def _read_packets(path: str | os.PathLike[str]) -> tuple[_StreamParams, list[av.Packet], dict[str, str]]:
    """Demux the first video stream: its parameters, its (non-empty) packets and the container tags."""
    with _open_video(path) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        packets = [p for p in container.demux(stream) if p.size > 0 and p.pts is not None]
        time_base = _fraction(stream.time_base)
        start = min((_ts(p.pts) for p in packets), default=0)
        span = max((_ts(p.pts) + (p.duration or 0) for p in packets), default=0) - start
        # Exact frame rate from the timestamps (frames per second of stream time); header rate as fallback.
        fps = Fraction(len(packets)) / (span * time_base) if span > 0 and time_base else None
        params = _StreamParams(
            codec=ctx.name,
            profile=str(ctx.profile or ""),
            codec_tag=str(ctx.codec_tag or ""),
            width=ctx.width,
            height=ctx.height,
            pix_fmt=ctx.pix_fmt or "",
            fps=fps or _fraction(stream.average_rate) or _fraction(stream.guessed_rate),
            time_base=time_base,
            extradata=bytes(ctx.extradata or b""),
        )
        return params, packets, dict(container.metadata)


def join_segments(
    segments: Sequence[str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    metadata: dict[str, str] | None = None,
    sound: str | os.PathLike[str] | None = None,
    root: str | os.PathLike[str] | None = None,
) -> None:
    """Concatenate segments written by :func:`encode_segment`, in order, into one file, without re-encoding.

    `sound`: a sound file (`farm.media.audio`) muxed in as the file's audio track, cut or padded to the
    video's duration (AAC in mp4, 16-bit PCM in mov).

    All segments must share codec, profile, size, pixel format, frame rate, time base and extradata
    (SPS/PPS); otherwise FarmError names the first segment that differs and how. The container follows
    ``path``'s suffix (``.mov``: QuickTime, else mp4); ProRes needs ``.mov``. The first segment's colour
    space metadata (``encode_segment(space=...)``) is kept; its colour tags come with the stream. Atomic like
    :func:`encode_segment`.
    """
    if not segments:
        raise FarmError(f"join_segments({os.fspath(path)!r}): no segments to join")
    container = _CONTAINERS.get(Path(path).suffix.lower(), "mp4")
    read = [_read_packets(s) for s in segments]
    for seg, (_, packets, _) in zip(segments, read, strict=True):
        if not packets:
            raise FarmError(f"cannot join video segment {os.fspath(seg)!r}: it has no video packets")
    ref = read[0][0]
    if container == "mp4" and ref.codec == "prores":
        raise FarmError(
            f"join_segments({os.fspath(path)!r}): ProRes goes in a QuickTime file; name the output .mov"
        )
    for seg, (params, _, _) in zip(segments[1:], read[1:], strict=True):
        for name in _StreamParams.__dataclass_fields__:
            want, got = getattr(ref, name), getattr(params, name)
            if want != got:
                hint = ""
                if name == "extradata":
                    want, got = f"{len(want)} bytes {want.hex()}", f"{len(got)} bytes {got.hex()}"
                    hint = " (the SPS/PPS headers differ: another preset, encoder or libx264 version?)"
                raise FarmError(
                    f"cannot join video segment {os.fspath(seg)!r}: its {name} is {got}, but the first "
                    f"segment {os.fspath(segments[0])!r} has {want}{hint}; segments must be encoded with "
                    "identical settings to be joined without re-encoding"
                )
    # Each segment starts where the previous one ended. Its dts run ``delay`` ticks ahead of its pts (B-frame
    # reordering); a short segment can have less delay than the rest (one frame: none), so every segment's
    # dts are moved to the largest delay: dts stay <= pts and strictly increase across the joins.
    delays = [min(_ts(p.pts) for p in pk) - min(_ts(p.dts) for p in pk) for _, pk, _ in read]
    max_delay = max(delays)
    spaces = [{k: v for k, v in tags.items() if k in _SPACE_KEYS} for _, _, tags in read]
    for seg, space in zip(segments[1:], spaces[1:], strict=True):
        if space != spaces[0]:
            want = spaces[0].get("colour_space", "BT.709")
            raise FarmError(f"cannot join video segment {os.fspath(seg)!r}: its colour space is "
                            f"{space.get('colour_space', 'BT.709')!r}, the first segment's {want!r}; "
                            "segments must be encoded in one colour space to be joined")  # fmt: skip
    space_metadata = spaces[0]
    with (
        atomic_path(path, root) as tmp,
        _open_video(segments[0]) as first,
        av.open(tmp, mode="w", format=container, options=_MDTA_KEYS if space_metadata else None) as out,
    ):
        out.metadata.update({**(metadata or {}), **space_metadata})
        stream = out.add_stream_from_template(first.streams.video[0])
        stream.time_base = ref.time_base
        if ref.codec_tag:  # the template leaves the tag to the muxer: keep hvc1, ap4h, … as encoded
            stream.codec_context.codec_tag = ref.codec_tag
        # The muxer writes the timecode track (tmcd) only for a stream with a frame rate, which a ProRes
        # stream read back does not carry (H.264 carries its own): give it the segments' rate.
        stream.codec_context.framerate = ref.fps
        track = None
        if sound is not None:  # every stream exists before the first packet is muxed
            track = Track(out, container, sound)
        offset = 0
        last_dts: int | None = None
        for seg, (_, packets, _), delay in zip(segments, read, delays, strict=True):
            start = min(_ts(p.pts) for p in packets)
            end = start
            for p in packets:
                pts, dts = _ts(p.pts), _ts(p.dts)
                end = max(end, pts + (p.duration or 0))
                p.pts = pts + offset - start
                p.dts = dts = dts + offset - start - (max_delay - delay)
                if last_dts is not None and dts <= last_dts:
                    raise FarmError(
                        f"cannot join video segment {os.fspath(seg)!r}: its decode timestamps do not follow "
                        "the previous segment's (unexpected B-frame reordering)"
                    )
                last_dts = dts
                p.stream = stream
                out.mux(p)
            offset += end - start
        if track is not None:
            track.write(offset * ref.time_base)


def probe(path: str | os.PathLike[str]) -> VideoInfo:
    """Describe the first video stream of ``path``; frames are counted by demuxing every packet."""
    params, packets, tags = _read_packets(path)
    return VideoInfo(
        frames=len(packets),
        width=params.width,
        height=params.height,
        fps=params.fps,
        codec=params.codec,
        pix_fmt=params.pix_fmt,
        metadata=tags,
    )


def _to_rgb(frame: av.VideoFrame, rgb_format: str = "rgb24") -> np.ndarray:
    # Untagged video is assumed BT.709 (what encode_segment writes), not swscale's BT.601 default.
    colorspace = frame.colorspace if frame.colorspace not in (0, 2) else Colorspace.ITU709
    return frame.to_ndarray(format=rgb_format, src_colorspace=colorspace)


def read_frames(path: str | os.PathLike[str], *, depth: int = 8) -> np.ndarray:
    """Decode every frame of the first video stream of ``path`` as RGB ``[F, H, W, 3]``.

    ``depth`` 8 gives uint8; 16 gives uint16 (full range 0-65535), for 10-bit video such as ProRes.
    """
    if depth not in (8, 16):
        raise FarmError(f"read_frames: depth must be 8 or 16, got {depth!r}")
    rgb_format = "rgb24" if depth == 8 else "rgb48le"
    with _open_video(path) as container:
        stream = container.streams.video[0]
        rgb = [_to_rgb(f, rgb_format) for f in container.decode(stream)]
        if not rgb:
            raise FarmError(f"{os.fspath(path)!r} has no decodable video frames")
        return np.stack(rgb)
