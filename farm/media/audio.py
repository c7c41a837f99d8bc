"""A shot's sound as files: the waveform fitted to its video's duration, written as WAV or FLAC
(16-bit PCM, lossless), and muxed into the shot's video (AAC in mp4, PCM in mov).

Levels are 16-bit as LTX-2's own export writes them (diffusers ``encode_video``: clipped to [-1, 1],
times 32767, truncated toward zero), so the WAV holds exactly the samples diffusers would mux.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from farm.errors import FarmError
from farm.media.beneath import atomic_path

# Sound file formats: name → (file suffix, FFmpeg muxer, codec).
FORMATS: dict[str, tuple[str, str, str]] = {"wav": (".wav", "wav", "pcm_s16le"),
                                            "flac": (".flac", "flac", "flac")}  # fmt: skip
# The track in each video container: AAC in mp4 (what players take), 16-bit PCM in QuickTime (lossless,
# what editors take beside ProRes).
VIDEO_AUDIO_CODECS = {"mp4": "aac", "mov": "pcm_s16le"}
AAC_BITRATE = 192_000


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise FarmError(f"unknown audio format {name!r}; choose one of {sorted(FORMATS)}")
    return name


def audio_suffix(name: str) -> str:
    return FORMATS[check_format(name)][0]


def to_levels(waveform: np.ndarray) -> np.ndarray:
    """Float waveform ``[channels, samples]`` → int16 levels, as diffusers' ``encode_video`` converts."""
    return (np.clip(waveform.astype(np.float32), -1.0, 1.0) * 32767.0).astype(np.int16)


def fit_length(waveform: np.ndarray, samples: int) -> np.ndarray:
    """`waveform` ``[channels, n]`` cut or padded with silence to exactly `samples` samples."""
    channels, n = waveform.shape
    if n >= samples:
        return np.ascontiguousarray(waveform[:, :samples])
    return np.concatenate([waveform, np.zeros((channels, samples - n), waveform.dtype)], axis=1)


def stereo(levels: np.ndarray) -> np.ndarray:
    """Mono becomes both channels of stereo (as diffusers' export does); stereo stays."""
    if levels.shape[0] == 1:
        return np.repeat(levels, 2, axis=0)
    if levels.shape[0] != 2:
        raise FarmError(f"sound with {levels.shape[0]} channels; farm writes mono or stereo")
    return levels


def _frame(levels: np.ndarray, sample_rate: int) -> av.AudioFrame:
    """Interleaved s16 stereo frame of all `levels` ``[2, samples]``."""
    packed = np.ascontiguousarray(stereo(levels).T).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(packed, format="s16", layout="stereo")
    frame.sample_rate = sample_rate
    frame.pts = 0
    frame.time_base = Fraction(1, sample_rate)
    return frame


def add_stream(container: Any, sample_rate: int, codec: str) -> Any:
    """A stereo audio stream in an open output `container` (before anything is muxed into it)."""
    stream = container.add_stream(codec, rate=sample_rate)
    stream.codec_context.layout = "stereo"
    stream.codec_context.time_base = Fraction(1, sample_rate)
    if codec == "aac":
        stream.codec_context.bit_rate = AAC_BITRATE
    return stream


def encode_stream(container: Any, stream: Any, levels: np.ndarray) -> None:
    """Encode all of int16 `levels` ``[channels, samples]`` into `stream` (the encoder's format and frame
    size through a resampler) and flush it."""
    ctx = stream.codec_context
    rate = ctx.sample_rate
    resampler = av.AudioResampler(format=ctx.format or "s16", layout="stereo", rate=rate,
                                  frame_size=ctx.frame_size or None)  # fmt: skip
    for frame in [*resampler.resample(_frame(levels, rate)), *resampler.resample(None)]:
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def write_audio(path: str | os.PathLike[str], levels: np.ndarray, sample_rate: int, fmt: str = "wav",
                root: str | os.PathLike[str] | None = None) -> None:
    """Write int16 `levels` ``[channels, samples]`` as a WAV or FLAC file, atomically (renamed in whole);
    `root`: the folder from which no link is followed down to it (`farm.media.beneath.atomic_path`)."""
    _, muxer, codec = FORMATS[check_format(fmt)]
    if root is None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, root) as tmp, av.open(tmp, mode="w", format=muxer) as out:
        encode_stream(out, add_stream(out, sample_rate, codec), levels)


@dataclass(frozen=True)
class Sound:
    levels: np.ndarray  # int16 [2, samples]
    sample_rate: int


def read_audio(path: str | os.PathLike[str], stream: int = 0) -> Sound:
    """The first (or `stream`-th) audio stream of a file as int16 stereo ``[2, samples]`` (AAC decoded
    and converted to 16-bit)."""
    try:
        container = av.open(os.fspath(path))
    except (OSError, av.FFmpegError) as exc:
        raise FarmError(f"cannot open {os.fspath(path)!r}: {exc}") from exc
    with container:
        if len(container.streams.audio) <= stream:
            raise FarmError(f"{os.fspath(path)!r} has no audio stream")
        audio = container.streams.audio[stream]
        rate = audio.codec_context.sample_rate
        resampler = av.AudioResampler(format="s16", layout="stereo", rate=rate)
        chunks = [f.to_ndarray().reshape(-1, 2).T for frame in container.decode(audio)
                  for f in resampler.resample(frame)]  # fmt: skip
        chunks += [f.to_ndarray().reshape(-1, 2).T for f in resampler.resample(None)]
    levels = np.concatenate(chunks, axis=1) if chunks else np.zeros((2, 0), np.int16)
    return Sound(levels.astype(np.int16), int(rate))


class Track:
    """A sound file on its way into a video: `Track(container, fmt, file)` adds the audio stream (before
    any packet is muxed), `write(seconds)` encodes the sound cut or padded to that duration (``mp4``:
    AAC, ``mov``: 16-bit PCM)."""

    def __init__(self, container: Any, container_format: str, sound_file: str | os.PathLike[str]) -> None:
        self.container, self.sound = container, read_audio(sound_file)
        codec = VIDEO_AUDIO_CODECS.get(container_format, "aac")
        self.stream = add_stream(container, self.sound.sample_rate, codec)

    def write(self, seconds: Fraction) -> None:
        samples = round(seconds * self.sound.sample_rate)
        encode_stream(self.container, self.stream, fit_length(self.sound.levels, samples))
