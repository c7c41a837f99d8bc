"""The render's timeline, kept by the driver: ``OUT/timeline.otio`` written as the render starts (every
shot; those finished earlier marked finished) and again as each shot finishes (`farm.media.timeline`).

It covers the job's shots in job order: the shots this render plans, and every other shot OUT holds a
render of (a render of some shots keeps the others' clips, and renders of other shots writing into OUT
at the same time keep each other's), each as OUT records it. Written by the driver alone (two workers
finishing shots would race), atomically, under OUT's shared lock (`farm.store.lock.shared_lock`), from
what OUT holds at that moment: the last render to write it lists every shot. Without OpenTimelineIO (the
``editorial`` extra) the render says so once and writes no timeline; a ``timeline.otio`` in OUT that
farm did not write is left alone, with a warning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.media.names import is_valid_name
from farm.media.rates import start_timecode
from farm.media.sequences import FORMATS
from farm.media.settings import HLG_MASTER, HLG_MASTER_SUFFIX, VideoSettings
from farm.media.timeline import SequenceFiles, TimelineShot, write_timeline
from farm.planning.tiling import ShotPlan
from farm.run.resume import recorded_identity
from farm.store.job import Job
from farm.store.lock import shared_lock
from farm.store.output import Output
from farm.store.output_kinds import TIMELINE, VIDEO


def exact_rate(rate: Fraction | float) -> Fraction | None:
    """A shot's rate as a fraction (a float rate, where a job records one, to the nearest 1/1001 step);
    None for a rate that is no positive number (a shot that fails by name is left off the timeline)."""
    if isinstance(rate, Fraction):
        return rate if rate > 0 else None
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        return None
    return Fraction(rate).limit_denominator(1001)


def timeline_shot(
    out: Output, shot: str, frames: int, rate: Fraction, timecode: str | None, outputs: Mapping[str, Any],
    finished: bool,
) -> TimelineShot:  # fmt: skip
    """What the timeline says of one shot rendered with `outputs` (a render identity's "outputs"): its
    video (an HDR render's HLG master) the active media, its image sequence the other."""
    from farm.media.video import CODECS  # imports PyAV: only where a timeline is written

    codec, sequence = outputs.get("video"), outputs.get("sequence")
    suffix = HLG_MASTER_SUFFIX if codec == HLG_MASTER else CODECS[codec].suffix if codec in CODECS else None
    video = f"{out.videos_dir.name}/{shot}{suffix}" if suffix else None
    files = None
    if sequence in FORMATS and isinstance(outputs.get("first_frame"), int):
        folder = out.sequence_dir(shot).relative_to(out.root).as_posix()
        files = SequenceFiles(folder, f"{shot}.", "." + FORMATS[sequence].ext, outputs["first_frame"])
    return TimelineShot(shot, frames, rate, timecode, video, files, finished)


class RenderTimeline:
    """`OUT/timeline.otio` for one render: `start` as it starts, `shot_finished` after each shot, `end`."""

    def __init__(
        self, job: Job, out: Output, plans: Sequence[ShotPlan], video: VideoSettings,
        timecodes: Mapping[str, str], log: Callable[[str], None],
    ) -> None:  # fmt: skip
        self.job, self.out, self.video, self.timecodes, self.log = job, out, video, timecodes, log
        self.frames = {p.shot: p.pixel_shape[0] for p in plans}
        self.finished: set[str] = set()
        self.on = self._can_write()

    def _can_write(self) -> bool:
        path = TIMELINE.file(self.out)
        if not TIMELINE.available():
            self.log("farm: OpenTimelineIO is not installed: no timeline.otio is written "
                     "(pip install 'farm-decode[editorial]')")  # fmt: skip
            return False
        if path.exists() and not TIMELINE.intact(self.out):
            self.log(f"farm: {str(path)!r} is not a timeline farm wrote: it is left as it is, and no "
                     "timeline is written (move it away to have one)")  # fmt: skip
            return False
        return True

    def shots(self) -> list[TimelineShot]:
        """The timeline's shots in job order: this render's, then any other OUT holds, as recorded."""
        shots = []
        for name, info in self.job.shots.items():
            rate, timecode = exact_rate(info.rate or info.fps), self.timecodes.get(name)
            if rate is None:
                continue
            if name in self.frames:
                shots.append(timeline_shot(self.out, name, self.frames[name], rate, timecode,
                                           self.video.identity(), name in self.finished))  # fmt: skip
                continue
            recorded = recorded_identity(self.out, name)
            frames = ((recorded or {}).get("plan") or {}).get("pixel_shape", [0])[0]
            if recorded and isinstance(frames, int) and frames > 0:
                outputs = recorded.get("outputs") or {}
                if isinstance(outputs.get("timecode"), str):  # the --timecode that shot was rendered with
                    timecode = start_timecode(info.rate, info.timecode, outputs["timecode"])
                done = name in self.finished
                shots.append(timeline_shot(self.out, name, frames, rate, timecode, outputs, done))
        return shots

    def write(self) -> Path | None:
        """Write it now (whole, in one rename); a file system error is said once and ends the timeline's
        writes, not the render."""
        if not self.on:
            return None
        try:
            with shared_lock(self.out.root):  # other renders of OUT's shots write it too
                self.finished |= {s for s in self._others() if s not in self.finished
                                  and finished_in_out(self.out, s)}  # fmt: skip
                return write_timeline(self.out.root, self.shots(), name=Path(self.job.path).stem)
        except OSError as exc:
            self.on = False
            path = str(TIMELINE.file(self.out))
            self.log(f"farm: cannot write {path!r}: {exc.strerror or exc}; the render goes on without it")
            return None
        except FarmError as exc:  # OUT's shared lock not had
            self.on = False
            self.log(f"farm: the timeline is not written: {exc}; the render goes on without it")
            return None

    def start(self, finished: set[str]) -> Path | None:
        """Write it as the render starts: this render's shots in `finished` (finished earlier, nothing
        left to do) and the other shots OUT holds finished marked finished."""
        self.finished = set(finished)
        return self.write()

    def shot_finished(self, shot: str) -> None:
        self.finished.add(shot)
        self.write()

    def end(self) -> Path | None:
        """Write it once more from what OUT holds (a shot without a video finishes with its last batch)."""
        self.finished |= {s for s in self.frames if finished_in_out(self.out, s)}
        return self.write()

    def _others(self) -> list[str]:
        return [s for s in self.job.shots if s not in self.frames]


def finished_in_out(out: Output, shot: str) -> bool:
    """Whether OUT holds the shot finished: its video marked done, or without a video every batch."""
    import zarr

    if not is_valid_name(shot) or not out.shot_group(shot).exists():  # a name OUT cannot hold: not in it
        return False
    try:
        attrs = dict(zarr.open_group(store=str(out.shot_group(shot)), mode="r").attrs)
    except Exception:  # no group, or one being made: not finished
        return False
    identity, batches = attrs.get("render"), attrs.get("batches")
    if not isinstance(identity, dict):
        return False
    if (identity.get("outputs") or {}).get("video") is not None:
        return VIDEO.present(out, shot)
    return isinstance(batches, int) and len(out.batches_done(shot, batches)) >= batches
