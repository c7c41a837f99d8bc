"""A render's editorial timeline: ``OUT/timeline.otio`` (OpenTimelineIO), one clip per shot in job order.

Each clip lasts its shot's frames at the shot's rate, its source range starting at the shot's start
timecode (00:00:00:00 without one). A finished shot's clip references its video (an ExternalReference)
and, where the render wrote an image sequence, the sequence too (an ImageSequenceReference, the
alternative media; OpenTimelineIO 0.16+ keeps several references per clip, one of them active). A shot
not finished yet keeps its place with a MissingReference, so the cut does not move as shots finish.
References are URLs relative to the timeline's folder (OUT), so the folder can move as a whole.

`timeline` builds the timeline (pure); `write_timeline` writes it, whole or not at all (temp file and
rename), as often as shots finish. OpenTimelineIO is optional: ``pip install 'farm-decode[editorial]'``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.media.beneath import atomic_path
from farm.media.rates import parse_timecode, rate_text, timecode_to_frames
from farm.safe_read import read_json

TIMELINE_FILE = "timeline.otio"
VIDEO_KEY = "video"  # the clips' media reference keys
SEQUENCE_KEY = "image_sequence"


@dataclass(frozen=True)
class SequenceFiles:
    """A shot's image sequence: ``<folder>/<prefix><number padded to `padding`><suffix>``, frames
    numbered from `first_frame` (e.g. ``sequences/sh010/``, ``sh010.``, ``.exr``, 1001, 4)."""

    folder: str  # relative to OUT
    prefix: str
    suffix: str
    first_frame: int
    padding: int = 4


@dataclass(frozen=True)
class TimelineShot:
    """What the timeline says of one shot: paths are relative to OUT (`video`: ``videos/sh010.mp4``)."""

    name: str
    frames: int
    rate: Fraction
    timecode: str | None  # the start timecode of its first frame (HH:MM:SS:FF, ;FF drop-frame)
    video: str | None
    sequence: SequenceFiles | None
    finished: bool


def timeline_available() -> bool:
    """Whether OpenTimelineIO (the `editorial` extra) is installed, so a render can write its timeline."""
    import importlib.util

    return importlib.util.find_spec("opentimelineio") is not None


def _farm_clips(path: str | os.PathLike[str]) -> list[dict[str, Any]] | None:
    """The clips' farm metadata of the timeline at `path`, read as JSON, when it is an OpenTimelineIO
    timeline whose clips all carry farm's metadata; None for anything else, or no file."""
    try:
        data = read_json(path, f"timeline {os.fspath(path)}")
        clips = [c for track in data["tracks"]["children"] for c in track["children"]]
        farms = all("farm" in clip["metadata"] for clip in clips)
        if not (str(data["OTIO_SCHEMA"]).startswith("Timeline.") and farms):
            return None
        return [clip["metadata"]["farm"] for clip in clips]
    except (OSError, FarmError, KeyError, TypeError):
        return None


def written_by_farm(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` is a timeline farm wrote (an OpenTimelineIO timeline whose clips all
    carry farm's metadata), read as JSON: it can be replaced. False for anything else, or no file."""
    return _farm_clips(path) is not None


def timeline_problem(path: str | os.PathLike[str], finished: Sequence[str]) -> str | None:
    """What is wrong with the timeline at `path` of an OUT whose `finished` shots are done (`farm status
    --verify`): not a timeline farm wrote, or one whose clips do not show a finished shot as finished;
    None when it is right, or when there is none (a render without OpenTimelineIO writes none)."""
    if not os.path.lexists(path):
        return None
    clips = _farm_clips(path)
    if clips is None:
        return ("is not a timeline farm wrote (unreadable, or changed by another program): renders leave it "
                "as it is; move it away and the next render writes it again")  # fmt: skip
    shown = {clip.get("shot") for clip in clips if clip.get("finished")}
    missing = [shot for shot in finished if shot not in shown]
    if missing:
        return (f"does not show finished shot(s) {missing} as finished: the next render into this output "
                "writes it again")  # fmt: skip
    return None


def _otio() -> Any:
    try:
        import opentimelineio
    except ImportError:
        raise FarmError(
            "writing timeline.otio needs OpenTimelineIO, which is not installed: "
            "pip install 'farm-decode[editorial]' (or pip install opentimelineio)"
        ) from None
    return opentimelineio


def source_range(shot: TimelineShot) -> Any:
    """The shot's frames as an OpenTimelineIO TimeRange at its rate, from its start timecode (counted as
    farm counts it, `farm.media.rates`: the same frame as ``otio.opentime.from_timecode`` where SMPTE
    timecode has the rate, and a count at any other rate)."""
    otio = _otio()
    rate = float(shot.rate)
    start = 0
    if shot.timecode:
        checked = parse_timecode(shot.timecode, shot.rate, where=f"timeline: shot {shot.name!r}: timecode")
        start = timecode_to_frames(checked, shot.rate)
    return otio.opentime.TimeRange(otio.opentime.RationalTime(start, rate),
                                   otio.opentime.RationalTime(shot.frames, rate))  # fmt: skip


def _references(shot: TimelineShot, available: Any) -> dict[str, Any]:
    otio = _otio()
    refs = {}
    if shot.video:
        refs[VIDEO_KEY] = otio.schema.ExternalReference(target_url=_url(shot.video),
                                                        available_range=available)  # fmt: skip
    if shot.sequence:
        seq = shot.sequence
        refs[SEQUENCE_KEY] = otio.schema.ImageSequenceReference(
            target_url_base=_url(seq.folder).rstrip("/") + "/", name_prefix=seq.prefix,
            name_suffix=seq.suffix, start_frame=seq.first_frame, frame_step=1, rate=float(shot.rate),
            frame_zero_padding=seq.padding, available_range=available,
        )  # fmt: skip
    return refs


def _url(relative: str) -> str:
    """A relative URL for a path under OUT (shot names are URL-safe: `farm.media.names`)."""
    return Path(relative).as_posix()


def timeline(shots: Sequence[TimelineShot], name: str) -> Any:
    """The render's timeline (pure): one video track, a clip per shot in the order given (the job's)."""
    otio = _otio()
    track = otio.schema.Track(name="shots", kind=otio.schema.TrackKind.Video)
    for shot in shots:
        if shot.frames < 1 or shot.rate <= 0:
            raise FarmError(f"timeline: shot {shot.name!r} has {shot.frames} frames at {shot.rate} fps; a "
                            "clip needs at least one frame at a positive rate")  # fmt: skip
        available = source_range(shot)
        clip = otio.schema.Clip(name=shot.name, source_range=available)
        refs = _references(shot, available) if shot.finished else {}
        if refs:
            clip.set_media_references(refs, VIDEO_KEY if VIDEO_KEY in refs else SEQUENCE_KEY)
        else:  # not finished (or nothing written): its place in the cut, no media yet
            clip.media_reference = otio.schema.MissingReference(available_range=available)
        clip.metadata["farm"] = {"shot": shot.name, "finished": shot.finished, "rate": rate_text(shot.rate),
                                 "timecode": shot.timecode}  # fmt: skip
        track.append(clip)
    result = otio.schema.Timeline(name=name)
    result.tracks.append(track)
    return result


def write_timeline(out: str | os.PathLike[str], shots: Sequence[TimelineShot], name: str) -> Path:
    """Write ``OUT/timeline.otio`` for `shots` (in job order), replacing the one there in one rename;
    returns its path. Call it again as shots finish: the file is always whole."""
    otio = _otio()
    text = otio.adapters.write_to_string(timeline(shots, name), "otio_json")
    path = Path(out) / TIMELINE_FILE
    with atomic_path(path, out) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path
