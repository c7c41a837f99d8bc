"""Joined videos carry the shot's start timecode as a QuickTime timecode track (`tmcd`) in every
container and codec: ProRes .mov with and without sound, as H.264 mp4 does; read back with PyAV."""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest

from farm.media.audio import write_audio
from farm.media.video import encode_segment, join_segments, probe, read_frames


def _timecode_tracks(path) -> list[str]:
    """The timecode of each timecode track: FFmpeg reads a ``tmcd`` track as a data stream with the
    timecode in its metadata (the file then holds a ``tmcd`` sample description)."""
    with av.open(str(path)) as container:
        found = [s.metadata["timecode"] for s in container.streams.data if "timecode" in s.metadata]
    assert bool(found) == (b"tmcd" in path.read_bytes())
    return found


@pytest.mark.parametrize("codec, suffix", [("prores_hq", ".mov"), ("prores_4444", ".mov"), ("h264", ".mp4")])
@pytest.mark.parametrize("with_sound", [False, True])
@pytest.mark.parametrize(
    "fps, timecode", [(Fraction(24), "01:00:00:00"), (Fraction(30000, 1001), "00:59:59;28")]
)
def test_joined_videos_carry_the_timecode(tmp_path, codec, suffix, with_sound, fps, timecode):
    frames = (np.random.default_rng(1).random((6, 64, 96, 3)) * 255).astype(np.uint8)
    segments = [tmp_path / f"seg{k}{suffix}" for k in range(2)]
    for k, segment in enumerate(segments):
        encode_segment(frames[3 * k : 3 * k + 3], segment, fps, codec=codec)
    sound = None
    if with_sound:
        sound = tmp_path / "sound.wav"
        write_audio(sound, (np.random.default_rng(2).random((2, 12000)) * 2000).astype(np.int16), 48000)
    video = tmp_path / f"shot{suffix}"
    join_segments(segments, video, metadata={"timecode": timecode}, sound=sound)
    assert _timecode_tracks(video) == [timecode]
    with av.open(str(video)) as container:
        assert container.streams.video[0].metadata["timecode"] == timecode
        assert len(container.streams.audio) == int(with_sound)
    info = probe(video)
    assert info.frames == 6 and info.fps == fps
    assert read_frames(video).shape == (6, 64, 96, 3)


def test_without_a_timecode_no_timecode_track_is_written(tmp_path):
    frames = np.zeros((3, 64, 96, 3), np.uint8)
    encode_segment(frames, tmp_path / "seg.mov", 24, codec="prores_hq")
    join_segments([tmp_path / "seg.mov"], tmp_path / "shot.mov")
    assert _timecode_tracks(tmp_path / "shot.mov") == []
