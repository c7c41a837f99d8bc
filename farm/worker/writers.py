"""The worker task that writes each output kind of `farm.store.output_kinds`' table, and what it is
given: the driver's graph submits a batch's writers by looping over `batch_writers`, then the task
that marks the batch done once they all finished; a shot's outputs by their `SHOT_WRITERS` entry.

A new output kind is an entry in `farm.store.output_kinds` (its files, check and removal), a task
that writes it (in `farm.worker.tasks`), and its entry here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from farm import keys
from farm.media.settings import VideoSettings
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


@dataclass(frozen=True)
class ShotWriter:
    """A shot output's task (its arguments are the driver's: `farm.run.graph.Driver.submit_finish`,
    `submit_audio`)."""

    kind: ShotOutput
    task: Callable[..., Any]
    key: str


BATCH_WRITERS: tuple[BatchWriter, ...] = (
    BatchWriter(FRAMES, write_batch, keys.WRITE_BATCH, lambda w: (w.video.durable,), "write_s",
                alone=write_and_mark_batch),
    BatchWriter(SEGMENT, encode_batch, keys.ENCODE_SEGMENT, lambda w: (w.fps, w.video, w.metadata),
                "encode_s"),
    BatchWriter(SEQUENCE, write_sequence, keys.WRITE_SEQUENCE, lambda w: (w.video, w.fps, w.timecode), None),
)  # fmt: skip
SHOT_WRITERS: dict[str, ShotWriter] = {
    VIDEO.name: ShotWriter(VIDEO, finish_shot, keys.FINISH_SHOT),  # joins the shot's segments
    SOUND.name: ShotWriter(SOUND, decode_audio, keys.DECODE_AUDIO),  # decodes the shot's sound whole
}


@functools.lru_cache(maxsize=16)
def batch_writers(video: VideoSettings) -> tuple[BatchWriter, ...]:
    """The writers of the batch outputs a render of these settings asks for, in marker order."""
    asked = video.identity()
    return tuple(w for w in BATCH_WRITERS if w.kind.asked(asked))
