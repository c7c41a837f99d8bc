"""The worker task that writes each output kind of `farm.store.output_kinds`' table, and what it is
given: the driver's graph submits a batch's writers by looping over `batch_writers`, then the task
that marks the batch done once they all finished; a shot's outputs by looping over `shot_writers` of
each timing: at the shot's start (once OUT's outputs exist) and after its last batch. A shot writer says
when and where its task runs, which other shot outputs it waits for, and how its arguments are built
from the render's targets and the shot's plan (`ShotContext`).

A new output kind is an entry in `farm.store.output_kinds` (its files, check and removal), a task
that writes it (in `farm.worker.tasks`), and its entry here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol

from farm import keys
from farm.media.settings import VideoSettings
from farm.planning.tiling import ShotPlan
from farm.store.output import Output
from farm.store.output_kinds import FRAMES, SEGMENT, SEQUENCE, SOUND, VIDEO, BatchOutput, ShotOutput
from farm.worker.tasks import (
    decode_audio,
    encode_batch,
    finish_shot,
    write_and_mark_batch,
    write_batch,
    write_sequence,
)


@dataclass(frozen=True)
class ShotWriting:
    """What a shot's batch writers are given beside the batch and its frames (the same for each batch)."""

    video: VideoSettings
    fps: Fraction | float
    metadata: dict[str, str]
    timecode: str | None = None


@dataclass(frozen=True)
class BatchWriter:
    """A batch output's task: ``task(out, batch, frames, *args(writing))``, returning its seconds."""

    kind: BatchOutput
    task: Callable[..., Any]
    key: str  # its tasks' key name (farm.keys)
    args: Callable[[ShotWriting], tuple[Any, ...]]
    seconds: str | None  # the render statistic its seconds add to ("write_s", "encode_s"), if any
    # writes and marks the batch in one task (no scheduler round trip) when it is its only output
    alone: Callable[..., Any] | None = None


class SoundView(Protocol):
    """What shot writers read of a render's sound (`farm.run.graph.Sound`)."""

    @property
    def spec_json(self) -> dict: ...
    @property
    def shots(self) -> frozenset[str]: ...  # the shots whose videos carry sound
    @property
    def format(self) -> str: ...


class TargetsView(Protocol):
    """What shot writers read of a render's targets (`farm.run.graph.RenderTargets`, a layer above)."""

    @property
    def job_path(self) -> str: ...
    @property
    def out(self) -> Output: ...
    @property
    def fps(self) -> Mapping[str, Fraction | float]: ...
    @property
    def video(self) -> VideoSettings: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...
    @property
    def total_batches(self) -> Mapping[str, int]: ...
    @property
    def sound(self) -> SoundView | None: ...
    @property
    def timecodes(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class ShotContext:
    """What a shot writer's arguments are built from: the render's targets and the shot's plan."""

    targets: TargetsView
    plan: ShotPlan

    @property
    def shot(self) -> str:
        return self.plan.shot


def _no_keywords(context: ShotContext) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ShotWriter:
    """A shot output's task: ``task(*args(context), *waited, **keywords(context))``, where ``waited`` are
    the tasks of the `waits_on` kinds this render submitted for the shot.

    `when`: "start", once OUT's outputs exist (the shot's batches need not be written), or "end", after
    the shot's last batch. `where`: "decode", on a decode worker chosen by the shot (others may take
    it), retried as decodes are; "any", where the scheduler puts it. `reports`: the key of the task's
    result that names the file it wrote."""

    kind: ShotOutput
    task: Callable[..., Any]
    key: str  # its task's key name (farm.keys)
    when: Literal["start", "end"]
    where: Literal["decode", "any"]
    args: Callable[[ShotContext], tuple[Any, ...]]
    reports: str
    keywords: Callable[[ShotContext], dict[str, Any]] = _no_keywords
    waits_on: tuple[str, ...] = ()  # the names of the shot outputs it waits for


def _video_args(c: ShotContext) -> tuple[Any, ...]:
    t = c.targets
    timecode = {"timecode": t.timecodes[c.shot]} if c.shot in t.timecodes else {}
    return t.out, c.shot, t.total_batches[c.shot], {**t.metadata, **timecode}


def _video_keywords(c: ShotContext) -> dict[str, Any]:
    """Its file's durability, and the shot's sound file to mux in (formats are named as their suffixes)."""
    t, sound = c.targets, c.targets.sound
    muxed = sound is not None and c.shot in sound.shots
    return {"durable": t.video.durable,
            "sound": str(t.out.audio_file(c.shot, "." + sound.format)) if sound and muxed else None}


def _sound_args(c: ShotContext) -> tuple[Any, ...]:
    t, sound = c.targets, c.targets.sound
    assert sound is not None  # asked for only where the job has sound
    return (t.job_path, sound.spec_json, t.out, c.shot, c.plan.pixel_shape[0], t.fps[c.shot], sound.format,
            t.video.durable)  # fmt: skip


BATCH_WRITERS: tuple[BatchWriter, ...] = (
    BatchWriter(FRAMES, write_batch, keys.WRITE_BATCH, lambda w: (w.video.durable,), "write_s",
                alone=write_and_mark_batch),
    BatchWriter(SEGMENT, encode_batch, keys.ENCODE_SEGMENT, lambda w: (w.fps, w.video, w.metadata),
                "encode_s"),
    BatchWriter(SEQUENCE, write_sequence, keys.WRITE_SEQUENCE, lambda w: (w.video, w.fps, w.timecode), None),
)  # fmt: skip
SHOT_WRITERS: dict[str, ShotWriter] = {
    # joins the shot's segments, with its sound muxed in
    VIDEO.name: ShotWriter(VIDEO, finish_shot, keys.FINISH_SHOT, when="end", where="any", args=_video_args,
                           keywords=_video_keywords, waits_on=(SOUND.name,), reports="video"),
    # decodes the shot's sound whole, on a GPU (it is small beside any tile)
    SOUND.name: ShotWriter(SOUND, decode_audio, keys.DECODE_AUDIO, when="start", where="decode",
                           args=_sound_args, reports="audio"),
}  # fmt: skip


def shot_writers(when: Literal["start", "end"]) -> tuple[ShotWriter, ...]:
    """The shot writers that run at `when`, in table order."""
    return tuple(w for w in SHOT_WRITERS.values() if w.when == when)


@functools.lru_cache(maxsize=16)
def batch_writers(video: VideoSettings) -> tuple[BatchWriter, ...]:
    """The writers of the batch outputs a render of these settings asks for, in marker order."""
    asked = video.identity()
    return tuple(w for w in BATCH_WRITERS if w.kind.asked(asked))
