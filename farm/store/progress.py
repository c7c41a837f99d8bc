"""A render's progress read from OUT alone (`farm status`): per shot, its batches and outputs done,
and with `verify` every finished output checked against what its marker records (the output kinds'
checks, `farm.store.output_kinds`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from farm.decoders import FAMILIES
from farm.decoders.base import superseded_config
from farm.decoders.sound import superseded_sound
from farm.errors import FarmError
from farm.store.markers import read_marker
from farm.store.output import Output
from farm.store.output_kinds import SHOT_OUTPUTS, VIDEO, batch_checks, damaged_chunks, verified_batches


@dataclass(frozen=True)
class ShotProgress:
    shot: str
    batches_done: int
    batches_total: int | None
    frames: int
    video: bool
    finished: bool = False  # every output asked for is done (the video, or every batch without one)
    damaged: int | None = None  # with verify: finished batches (and video) found missing or altered
    cancelled: bool = False  # stopped by `farm cancel` before it finished (a rerun resumes it)
    superseded: str | None = None  # decoded with an earlier revision of its named decoder config: why
    # with verify: each damaged output in words, one line each (``batch 2: frames.zarr/shot000/c/2/0/0/0
    # altered or missing``), paths relative to OUT
    damaged_outputs: tuple[str, ...] = ()


def rendered_frames(identity: dict, batches_done: Iterable[int]) -> int:
    """Frames in the finished batches of a shot whose recorded render `identity` gives its plan."""
    plan = identity.get("plan") or {}
    size, total = plan.get("batch_frames"), (plan.get("pixel_shape") or [0])[0]
    if not isinstance(size, int) or not isinstance(total, int) or size < 1:
        return 0
    return sum(max(0, min(size, total - k * size)) for k in batches_done)


def output_progress(out_root: str | os.PathLike, *, verify: bool = False) -> list[ShotProgress]:
    """Per-shot progress read from a render output alone (no job store, no cluster); `verify`: check
    every finished batch and shot output (video, sound) against the checksums their markers record."""
    import zarr

    out = Output(Path(out_root))
    if not out.frames_zarr.exists():
        raise FarmError(f"{str(out.root)!r} is not a farm render output (no frames.zarr inside)")
    try:
        root = zarr.open_group(store=str(out.frames_zarr), mode="r")
        groups = sorted(root.groups())
    except Exception as exc:  # damaged metadata: zarr raises many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise FarmError(
            f"{str(out.frames_zarr)!r} cannot be read ({type(exc).__name__}: {first}): damaged metadata"
        ) from None
    progress = []
    for name, group in groups:
        total = group.attrs.get("batches")
        identity = group.attrs.get("render")
        identity = identity if isinstance(identity, dict) else {}
        wants_video = (identity.get("outputs") or {}).get("video") is not None
        batches = total if isinstance(total, int) and not isinstance(total, bool) else None
        marked = out.batches_done(name, batches)  # a stray marker (no such batch) marks nothing
        frames = rendered_frames(identity, marked)
        video = VIDEO.present(out, name)
        damaged: int | None = None
        damaged_outputs: tuple[str, ...] = ()
        if verify:  # the frames of each finished batch; what batches are joined into, as the shot's own
            joined = batch_checks(joined=[k.name for k in SHOT_OUTPUTS])
            _, bad = verified_batches(out, name, joined, batches)
            strays = out.stray_markers(name, batches) if batches is not None else []
            damaged = len(bad) + len(strays) + sum(kind.damaged(out, name) for kind in SHOT_OUTPUTS)
            damaged_outputs = damaged_in_words(out, name, bad) + tuple(
                f"{marker.relative_to(out.root)} marks a batch the shot does not have ({batches} batches): "
                "ignored; remove it" for marker in strays
            )
            video = video and not VIDEO.damaged(out, name)
        finished = (video if wants_video else batches is not None and len(marked) >= batches) and not damaged
        cancelled = not finished and out.cancelled_marker(name).exists()
        superseded = superseded_config(identity.get("decoder"), FAMILIES) or superseded_sound(identity)
        progress.append(ShotProgress(name, len(marked), batches, frames, video, bool(identity) and finished,
                                     damaged, cancelled, superseded, damaged_outputs))  # fmt: skip
    return progress


def damaged_in_words(out: Output, shot: str, batches: Iterable[int]) -> tuple[str, ...]:
    """A line for each damaged file of the shot's damaged `batches` (their frames' chunk files) and of
    its damaged shot outputs (video, sound), paths relative to OUT."""
    lines = []
    for batch in sorted(batches):
        chunks = damaged_chunks(out, shot, read_marker(out.done_marker(shot, batch)) or {})
        lines += [f"batch {batch}: {chunk.relative_to(out.root)} altered or missing" for chunk in chunks]
        lines += [] if chunks else [f"batch {batch}: its done marker is unreadable"]
    for kind in SHOT_OUTPUTS:
        if kind.damaged(out, shot):
            files = [kind.file(out, shot, s) for s in kind.every_suffix() if kind.file(out, shot, s).exists()]
            lines += [f"{kind.name}: {f.relative_to(out.root)} differs from its recorded checksum"
                      for f in files]  # fmt: skip
            lines += [] if files else [f"{kind.name}: missing"]
    return tuple(lines)
