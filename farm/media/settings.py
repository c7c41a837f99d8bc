"""What a render writes besides the Zarr frames, and how: one `VideoSettings` from the command line
to the tasks that write (codec and quality, image sequence, frame numbering, frame dtype, sound).

Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from farm import config
from farm.errors import FarmError
from farm.media.colour import frames_colour_attributes
from farm.media.hdr import decoded_space, hdr_transfer

HLG_MASTER = "hevc_hlg"  # what an HDR render's identity records as its video (farm.media.hlg)
HLG_MASTER_SUFFIX = ".mp4"
# the codecs --crf and --preset apply to (farm.media.video.CODECS' rate_control), and the values a render
# identity leaves unrecorded (farm.yaml's defaults), so outputs rendered before they were recorded resume
RATE_CONTROLLED = ("h264", "h265")
UNRECORDED_CRF, UNRECORDED_PRESET = 18, "veryfast"


@dataclass(frozen=True)
class VideoSettings:
    """What a render writes besides the Zarr frames: a video (codec) and/or an image sequence.

    The defaults of the fields marked "farm.KEY" are dask.config's (`farm.config`)."""

    crf: int = field(default_factory=lambda: config.whole_number("crf", 0))  # farm.crf
    preset: str = field(default_factory=lambda: str(config.get("preset")))  # farm.preset
    # threads of each segment's encode (farm.encoder-threads; 0: the encoder's own choice, which for
    # x264 is 1.5 per core: the bytes then depend on the encoding worker's cores, a fixed count not)
    encoder_threads: int = field(default_factory=lambda: config.whole_number("encoder-threads", 0))
    enabled: bool = True  # False: frames to Zarr only, no segments or video
    # h264, h265 (mp4) or prores_hq, prores_4444 (mov): farm.media.video.CODECS; farm.codec
    codec: str = field(default_factory=lambda: str(config.get("codec")))
    sequence: str | None = None  # png8, png16 or exr: <shot>.####.<ext> under OUT/sequences/<shot>/
    # number of a shot's first frame in sequence file names and the Zarr frame coordinate; farm.first-frame
    first_frame: int = field(default_factory=lambda: config.whole_number("first-frame", 0))
    # the Zarr master copy: uint8 levels or float16 in [0, 1]; farm.frames-dtype
    frames_dtype: str = field(default_factory=lambda: str(config.get("frames-dtype")))
    # start timecode of every shot's first frame (HH:MM:SS:FF, ;FF drop-frame), instead of the job's
    timecode: str | None = None
    # fsync a batch's chunk files, segment and images before its done marker (False: faster on a disk
    # that cannot keep up, at the risk of a batch marked done with frames lost in a power cut)
    durable: bool = True
    # EXR sequences: "display" (as decoded, BT.709-encoded) or "linear"; farm.exr-values
    exr_values: str = field(default_factory=lambda: str(config.get("exr-values")))
    # the most MiB of frames in one Zarr chunk of a new frames array (farm.frame-chunk-mib): a batch's
    # chunks compress and reach the disk side by side, so smaller chunks write one batch sooner
    frame_chunk_mib: int = field(default_factory=lambda: config.whole_number("frame-chunk-mib", 1))
    # shots with sound (LTX-2 audio latents in the job): OUT/audio/<shot>.<format> and a track in the video
    audio: bool = True
    audio_format: str = "wav"  # "wav" or "flac" (farm.media.audio.FORMATS)
    # HDR render: the decoded values' transfer, "acescct" or "logc3" (farm.media.hdr; --hdr, or the
    # decoder spec's "hdr"); frames.zarr then holds float16 scene-linear values, and the shot's video is
    # its 10-bit BT.2020 HLG HEVC master (farm.media.hlg) whatever the codec
    hdr: str | None = None
    # the farm.media.colour space EXR sequences and an SDR render's ProRes video are written in
    # (--colorspace; None: as decoded)
    colorspace: str | None = None

    def identity(self) -> dict[str, Any]:
        """What a render identity records of these settings (its "outputs"): the outputs asked for and
        the settings their bytes depend on. Output kinds read what is asked for from it."""
        return {
            "video": (HLG_MASTER if self.hdr else self.codec) if self.enabled else None,
            "sequence": self.sequence,
            "first_frame": self.first_frame if self.sequence else None,
            "frames_dtype": self.frames_dtype,
            # only when not the default, so outputs rendered before the option existed still resume
            **({"exr_values": self.exr_values}
               if self.sequence == "exr" and self.exr_values != "display" else {}),  # fmt: skip
            **self._rate_control_identity(),
            **({"hdr": self.hdr} if self.hdr else {}),
            **({"colorspace": self.colorspace} if self.colorspace else {}),
            # the video's tmcd track, EXR headers and timeline clips carry it; None: the job's timecode
            **({"timecode": self.timecode} if self.timecode else {}),
        }

    def _rate_control_identity(self) -> dict[str, Any]:
        """--crf and --preset of an H.264/H.265 video, each where not farm.yaml's default."""
        if not self.enabled or self.hdr or self.codec not in RATE_CONTROLLED:
            return {}
        return {**({"crf": self.crf} if self.crf != UNRECORDED_CRF else {}),
                **({"preset": self.preset} if self.preset != UNRECORDED_PRESET else {})}  # fmt: skip

    @property
    def writes_video(self) -> bool:
        """A video is encoded (an HDR render's is its HLG master)."""
        return self.enabled

    @property
    def frames_space(self) -> str:
        """The `farm.media.colour` space of the blended frames: an SDR decode's, or the HDR transfer's
        scene-linear space."""
        return decoded_space(self.hdr)

    @property
    def exr_space(self) -> str | None:
        """The space EXR frames are converted to and labelled with: --colorspace; an HDR render's own
        scene-linear space by default; None (as decoded, the labels of `exr_values`) otherwise."""
        return self.colorspace or (self.frames_space if self.hdr else None)

    @property
    def video_space(self) -> str | None:
        """The space the video's frames are converted to, tagged and labelled with: --colorspace for an SDR
        render's ProRes video; None (as decoded, BT.709 tags) for H.264/H.265 and an HDR render's master."""
        from farm.media.video import codec_for  # PyAV: off the planning path

        ten_bit = codec_for(self.codec).bit_depth > 8
        return self.colorspace if self.enabled and self.hdr is None and ten_bit else None

    @property
    def colour_attributes(self) -> dict[str, Any]:
        """What frames.zarr's frames arrays say of their colour (an HDR or --colorspace render only, so
        an SDR render's store is as it always was); a None value: no such attribute."""
        if self.hdr is None and self.colorspace is None:
            return {}
        return {**frames_colour_attributes(self.frames_space), **({"hdr": self.hdr} if self.hdr else {})}

    @property
    def suffix(self) -> str:
        from farm.media.video import codec_for  # PyAV: off the planning path

        return HLG_MASTER_SUFFIX if self.hdr else codec_for(self.codec).suffix

    @property
    def takes_yuv420(self) -> bool:
        """The video codec encodes yuv420p, so blends can hand it converted planes."""
        from farm.media.video import codec_for  # PyAV: off the planning path

        return self.enabled and self.hdr is None and codec_for(self.codec).pix_fmt == "yuv420p"


def with_decoder_hdr(video: VideoSettings, spec_hdr: str | None) -> VideoSettings:
    """The settings of a render of a job whose decoder spec records `spec_hdr`: HDR when either the spec
    or --hdr says so (a conflict between them refused in one line); an HDR render keeps float16 frames
    (and decodes in float32: `farm.run.render`)."""
    if video.hdr is not None:
        hdr_transfer(video.hdr, "--hdr")
        if spec_hdr is not None and spec_hdr != video.hdr:
            raise FarmError(f"--hdr {video.hdr}: the job's decoder spec records 'hdr': {spec_hdr!r}; give "
                            f"--hdr {spec_hdr} or leave --hdr out")  # fmt: skip
    hdr = video.hdr or spec_hdr
    return video if hdr is None else replace(video, hdr=hdr, frames_dtype="float16")
