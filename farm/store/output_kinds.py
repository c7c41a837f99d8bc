"""What a render writes into OUT, as a table: one entry per output kind, saying where its files live
under OUT, whether a render asks for it, what its done marker records, how that is checked, and how its
files are removed when a shot starts over or a damaged batch is forgotten.

    kind       scope   files under OUT                              checked by
    frames     batch   frames.zarr/<shot>/{frames,frame,channel,    the sha256 of each chunk file, in the
                       valid}                                        batch's marker ("chunks")
    segment    batch   .farm/segments/<shot>/NNNNN.mp4|.mov         its sha256 in the batch's marker
                       (joined into the video, then removed)         ("segment"), until the video is joined
    sequence   batch   sequences/<shot>/<shot>.NNNN.<ext>           not recorded (rewritten with its batch)
    video      shot    videos/<shot>.mp4|.mov                       .farm/done/<shot>/video: its sha256
    sound      shot    audio/<shot>.wav|.flac                       .farm/done/<shot>/audio: its sha256
    timeline   render  timeline.otio                                an OpenTimelineIO timeline of farm's
                       (one clip per shot, written by the driver)    (its clips carry farm's metadata)

A batch output adds its part to the batch's marker (.farm/done/<shot>/NNNNN, written once every batch
output is in place); a shot output has a marker of its own. The worker task that writes each kind is
bound to its entry in `farm.worker.writers` (the layer that runs tasks); the driver's graph, resume,
the opening of OUT for a render (`open_for_render`: restart, forget) and `farm status --verify` loop
over these entries. Whether a render asks for a kind is read from the "outputs" of its identity
(`farm.media.settings.VideoSettings.identity`, and "audio" for a shot with sound).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.media import beneath
from farm.media.files import run_side_by_side
from farm.media.sequences import FORMATS as SEQUENCE_FORMATS
from farm.media.sequences import frame_path
from farm.media.timeline import TIMELINE_FILE, timeline_available, written_by_farm
from farm.store.frames import VALID, chunk_files, drop_frames, remove_chunks, unfinished_chunks
from farm.store.markers import file_digest, file_intact, markers_in, read_marker
from farm.store.output import (
    CANCELLED_MARKER,
    SEGMENT_NAME,
    Output,
    batch_marker_name,
    os_errors_in_one_line,
    remove_own_files,
)

Outputs = dict[str, Any]  # a render identity's "outputs": what the render was asked to write
Recorded = dict[str, Any] | None  # the render identity OUT records for a shot (None: none recorded)


@dataclass(frozen=True)
class BatchOutput:
    """An output written batch by batch; each batch's part of it is recorded in the batch's marker."""

    name: str
    asked: Callable[[Outputs], bool]
    record: Callable[[Output, str, int, int, int], dict[str, Any]]  # (out, shot, batch, start, stop)
    intact: Callable[[Output, str, int, dict[str, Any]], bool]  # (out, shot, batch, its marker's record)
    forget: Callable[[Output, str, int, dict[str, Any]], None]  # a damaged batch's files, from its record
    remove: Callable[[Output, str, Recorded], None]  # every file of the shot (it starts over)
    joined_into: str | None = None  # the shot output it is joined into (then it need not be checked)

    scope = "batch"


@dataclass(frozen=True)
class ShotOutput:
    """One file per shot, in one of several formats (its suffix), with a done marker of its own."""

    name: str
    asked: Callable[[Outputs], bool]
    file: Callable[[Output, str, str], Path]  # (out, shot, suffix)
    # the suffixes a render into `out` writes (and the render `recorded` says wrote)
    suffixes: Callable[[Output, Recorded], tuple[str, ...]]
    every_suffix: Callable[[], tuple[str, ...]]  # every one it may have
    marker: Callable[[Output, str], Path]  # (out, shot): its done marker
    written_suffix: Callable[[Output, Outputs], str]  # (out, outputs): the suffix a render of outputs writes

    scope = "shot"

    def files(self, out: Output, shot: str, recorded: Recorded = None) -> list[Path]:
        """The files a render into `out` (or the render `recorded` says) writes for the shot."""
        return [self.file(out, shot, suffix) for suffix in self.suffixes(out, recorded)]

    def intact(self, out: Output, shot: str, suffix: str | None = None) -> bool:
        """Marked done, and the file the marker records is there, byte for byte, in this output's format
        (in the format of `suffix`, when given)."""
        paths = [self.file(out, shot, suffix)] if suffix else self.files(out, shot)
        return any(file_intact(self.marker(out, shot), path) for path in paths)

    def present(self, out: Output, shot: str) -> bool:
        """Marked done, and a file of it is there in some format (unchecked)."""
        return self.marker(out, shot).exists() and any(
            self.file(out, shot, suffix).exists() for suffix in self.every_suffix()
        )

    def damaged(self, out: Output, shot: str) -> bool:
        """Marked done, but no file of it in any format is the one the marker records."""
        marker = self.marker(out, shot)
        paths = [self.file(out, shot, suffix) for suffix in self.every_suffix()]
        return marker.exists() and not any(file_intact(marker, path) for path in paths)

    def remove(self, out: Output, shot: str, recorded: Recorded) -> None:
        for path in self.files(out, shot, recorded):
            beneath.unlink(out.root, path)


@dataclass(frozen=True)
class RenderOutput:
    """One file for the whole render, written by the driver (not a worker task: two workers would race)
    as the render starts and again as each shot finishes; no marker, it is rewritten whole each time."""

    name: str
    available: Callable[[], bool]  # whether this installation can write it (an optional package)
    file: Callable[[Output], Path]
    intact: Callable[[Output], bool]  # there, and farm's (then it may be replaced)

    scope = "render"

    def remove(self, out: Output) -> None:
        beneath.unlink(out.root, self.file(out))


# -- frames ------------------------------------------------------------------------------------------


def _frames_record(out: Output, shot: str, batch: int, start: int, stop: int) -> dict[str, Any]:
    """The sha256 of each chunk file holding frames [start, stop) (None: not stored, all fill value)."""
    import zarr

    array_dir = out.frames_array(shot)
    arr = zarr.open_array(store=str(array_dir), mode="r")
    chunks = chunk_files(array_dir, arr, start, stop)
    digests = run_side_by_side(file_digest, chunks)
    return {"chunks": {str(c.relative_to(array_dir)): d for c, d in zip(chunks, digests, strict=True)}}


def _frames_intact(out: Output, shot: str, batch: int, record: dict[str, Any]) -> bool:
    return isinstance(record.get("chunks", {}), dict) and not damaged_chunks(out, shot, record)


def damaged_chunks(out: Output, shot: str, record: dict[str, Any]) -> list[Path]:
    """The chunk files a batch's marker `record` names that are missing, truncated or altered."""
    array_dir = out.frames_array(shot)
    damaged = []
    chunks = record.get("chunks")
    for name, digest in (chunks if isinstance(chunks, dict) else {}).items():
        chunk = array_dir / name
        if digest is None:
            if chunk.exists() and chunk.stat().st_size == 0:
                damaged.append(chunk)
        elif file_digest(chunk) != digest:
            damaged.append(chunk)
    return damaged


def _forget_frames(out: Output, shot: str, batch: int, record: dict[str, Any]) -> None:
    """The chunk files the batch's record names, and its chunk of the ``valid`` array (it reads False)."""
    import zarr

    array_dir = out.frames_array(shot)
    chunks = record.get("chunks")
    for name in chunks if isinstance(chunks, dict) else {}:
        chunk = array_dir / name
        if chunk.resolve().is_relative_to(array_dir.resolve()) and re.fullmatch(r"c(/\d+)+", name):
            beneath.unlink(out.root, chunk)
    valid_dir = out.shot_group(shot) / VALID
    if (valid_dir / "zarr.json").exists():
        size = zarr.open_array(store=str(valid_dir), mode="r").chunks[0]
        remove_chunks(valid_dir, [(batch * size, batch * size + 1)], root=out.root)


# -- segments ----------------------------------------------------------------------------------------


def _video_suffixes() -> tuple[str, ...]:
    from farm.media.video import CODECS  # PyAV: off the planning and status paths

    return tuple(dict.fromkeys(codec.suffix for codec in CODECS.values()))


def _segment_record(out: Output, shot: str, batch: int, start: int, stop: int) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for suffix in _video_suffixes():
        segment = Output(out.root, suffix).segment(shot, batch)
        if segment.exists():
            record["segment"] = {"name": segment.name, "sha256": file_digest(segment)}
    return record


def _segment_intact(out: Output, shot: str, batch: int, record: dict[str, Any]) -> bool:
    if not record:  # a marker without checksums (an older render's): its segment at least is there, not empty
        segments = [Output(out.root, s).segment(shot, batch) for s in _video_suffixes()]
        return any(p.is_file() and not p.is_symlink() and p.stat().st_size > 0 for p in segments)
    segment = record.get("segment")
    if not isinstance(segment, dict) or not SEGMENT_NAME.fullmatch(str(segment.get("name"))):
        return False
    return file_digest(out.segments_dir(shot) / segment["name"]) == segment.get("sha256")


def _remove_segments(out: Output, shot: str, recorded: Recorded) -> None:
    remove_own_files(out.segments_dir(shot), lambda name: SEGMENT_NAME.fullmatch(name) is not None,
                     root=out.root)  # fmt: skip


# -- image sequences ---------------------------------------------------------------------------------


def _remove_sequence(out: Output, shot: str, recorded: Recorded) -> None:
    """The image files the recorded sequence settings named (format, first frame and frame count), so
    no file of the old settings is left beside the new ones; then the folder, when nothing else is in it."""
    outputs = (recorded or {}).get("outputs") or {}
    sequence, first = outputs.get("sequence"), outputs.get("first_frame")
    shape = ((recorded or {}).get("plan") or {}).get("pixel_shape")
    frames = shape[0] if isinstance(shape, list) and shape else None
    folder = out.sequence_dir(shot)
    recorded_range = (first, frames) if isinstance(first, int) and isinstance(frames, int) else None
    if sequence in SEQUENCE_FORMATS and recorded_range is not None and folder.is_dir():
        start, count = recorded_range
        # the folder's own entries, checked against the recorded range: OUT's record is not trusted to
        # bound a loop (a damaged one could claim 10^10 frames)
        ext = SEQUENCE_FORMATS[sequence].ext
        for entry in folder.iterdir():
            number = entry.name.removeprefix(f"{shot}.").removesuffix(f".{ext}")
            if not (number.isdigit() and start <= int(number) < start + count):
                continue
            if entry.name == frame_path(folder, shot, int(number), ext).name:
                beneath.unlink(out.root, entry)  # never through a link
        beneath.remove_folder(out.root, folder)  # only when nothing else is in it


def _nothing_recorded(out: Output, shot: str, batch: int, start: int, stop: int) -> dict[str, Any]:
    return {}


def _always_intact(out: Output, shot: str, batch: int, record: dict[str, Any]) -> bool:
    return True


def _nothing_to_forget(out: Output, shot: str, batch: int, record: dict[str, Any]) -> None:
    return None


# -- shot files --------------------------------------------------------------------------------------


def _video_written(out: Output, recorded: Recorded) -> tuple[str, ...]:
    """This output's video suffix, and the recorded render's codec's."""
    from farm.media.video import CODECS  # PyAV: off the planning and status paths

    codec = ((recorded or {}).get("outputs") or {}).get("video")
    return tuple(dict.fromkeys([out.video_suffix, *([CODECS[codec].suffix] if codec in CODECS else [])]))


def _sound_suffixes() -> tuple[str, ...]:
    from farm.media.audio import FORMATS  # PyAV: off the planning and status paths

    return tuple(suffix for suffix, _, _ in FORMATS.values())


def _sound_suffix(out: Output, outputs: Outputs) -> str:
    """The suffix of the sound format a render's "audio" output names."""
    from farm.media.audio import audio_suffix  # PyAV: off the planning and status paths

    return audio_suffix((outputs.get("audio") or {}).get("format", "wav"))


FRAMES = BatchOutput(
    "frames", asked=lambda outputs: True, record=_frames_record, intact=_frames_intact,
    forget=_forget_frames, remove=lambda out, shot, recorded: drop_frames(out, shot),
)  # fmt: skip
SEGMENT = BatchOutput(
    "segment", asked=lambda outputs: outputs.get("video") is not None, record=_segment_record,
    intact=_segment_intact, forget=_nothing_to_forget, remove=_remove_segments, joined_into="video",
)  # fmt: skip
SEQUENCE = BatchOutput(
    "sequence", asked=lambda outputs: outputs.get("sequence") is not None, record=_nothing_recorded,
    intact=_always_intact, forget=_nothing_to_forget, remove=_remove_sequence,
)  # fmt: skip
VIDEO = ShotOutput(
    "video", asked=lambda outputs: outputs.get("video") is not None,
    file=lambda out, shot, suffix: out.video(shot, suffix), suffixes=_video_written,
    every_suffix=_video_suffixes, marker=Output.video_done_marker,
    written_suffix=lambda out, outputs: out.video_suffix,
)  # fmt: skip
SOUND = ShotOutput(
    "sound", asked=lambda outputs: outputs.get("audio") is not None,
    file=lambda out, shot, suffix: out.audio_file(shot, suffix),
    suffixes=lambda out, recorded: _sound_suffixes(), every_suffix=_sound_suffixes,
    marker=Output.audio_done_marker, written_suffix=_sound_suffix,
)  # fmt: skip

TIMELINE = RenderOutput(
    "timeline", available=timeline_available, file=lambda out: out.root / TIMELINE_FILE,
    intact=lambda out: written_by_farm(out.root / TIMELINE_FILE),
)  # fmt: skip

BATCH_OUTPUTS: tuple[BatchOutput, ...] = (FRAMES, SEGMENT, SEQUENCE)  # in marker order
SHOT_OUTPUTS: tuple[ShotOutput, ...] = (VIDEO, SOUND)
ALL_OUTPUTS: tuple[BatchOutput | ShotOutput, ...] = (*BATCH_OUTPUTS, *SHOT_OUTPUTS)
OUTPUT_KINDS: dict[str, BatchOutput | ShotOutput] = {k.name: k for k in ALL_OUTPUTS}
SHOT_KIND: dict[str, ShotOutput] = {k.name: k for k in SHOT_OUTPUTS}
RENDER_OUTPUTS: tuple[RenderOutput, ...] = (TIMELINE,)


# -- the loops over the table ------------------------------------------------------------------------


def batch_record(out: Output, shot: str, index: int, start: int, stop: int) -> dict[str, Any]:
    """What a batch's done marker records: each batch output's part (the sha256 of its frames' chunk
    files, and of its video segment when there is one)."""
    record: dict[str, Any] = {}
    for kind in BATCH_OUTPUTS:
        record.update(kind.record(out, shot, index, start, stop))
    return record


def batch_checks(joined: Iterable[str] = ()) -> tuple[BatchOutput, ...]:
    """The batch outputs a finished batch must still have intact: all but those already joined into
    the shot outputs named in `joined` (a joined video's segments are gone)."""
    done = set(joined)
    return tuple(k for k in BATCH_OUTPUTS if k.joined_into is None or k.joined_into not in done)


def batch_intact(out: Output, shot: str, batch: int, kinds: Iterable[BatchOutput]) -> bool:
    """Whether batch `batch` is marked done and each of `kinds` is, as its marker records it, unchanged
    on disk (frames' chunk files none missing, truncated or altered; a segment byte for byte)."""
    record = read_marker(out.done_marker(shot, batch))
    return record is not None and all(kind.intact(out, shot, batch, record) for kind in kinds)


def verified_batches(
    out: Output, shot: str, kinds: Iterable[BatchOutput], total: int | None = None
) -> tuple[set[int], set[int]]:
    """The shot's batches marked done (of its `total`, when given): (intact, damaged), checked side by
    side (`batch_intact`)."""
    kinds = tuple(kinds)
    marked = sorted(out.batches_done(shot, total))
    intact = run_side_by_side(lambda k: batch_intact(out, shot, k, kinds), marked)
    return ({k for k, ok in zip(marked, intact, strict=True) if ok},
            {k for k, ok in zip(marked, intact, strict=True) if not ok})  # fmt: skip


@dataclass(frozen=True)
class Opening:
    """What opening OUT for a render removes, as plain values (the run layer decides them:
    `farm.run.resume.plan_opening`). `restarts`: the shots started over, each with the render identity
    it replaces (None: none recorded); `damaged`: per shot, the damaged batches to forget and the names
    of its shot outputs to forget (`SHOT_KIND`); `unfinished`: per shot, the frame ranges [start, stop)
    of the batches about to be rendered again."""

    restarts: Mapping[str, Recorded] = field(default_factory=dict)
    damaged: Mapping[str, tuple[Collection[int], Collection[str]]] = field(default_factory=dict)
    unfinished: Mapping[str, Collection[tuple[int, int]]] = field(default_factory=dict)

    @property
    def shots(self) -> list[str]:
        return list(dict.fromkeys([*self.restarts, *self.damaged, *self.unfinished]))


def open_for_render(out: Output, opening: Opening, *, stale: bool = True) -> None:
    """Open OUT for a render whose inputs are known good: remove the temporaries a killed render left
    (unless not `stale`: the caller has, knowing no other render writes into OUT);
    start the shots `opening` restarts over (every output the render it replaces made, and nothing
    else); forget its damaged batches and shot outputs (unmarked, and each batch output's files their
    markers name, so they render again from nothing: a 0-byte chunk would fail a partial write); and
    remove the chunks of the batches about to be rendered (`unfinished_chunks`).

    Everything to remove is found first (each shot's folders resolved once, the markers listed and
    read, the chunks located), then removed: a shot's done markers before the files they mark."""
    with os_errors_in_one_line(f"cannot clear what this render replaces in {str(out.root)!r}"):
        temporaries = out.stale_temporaries() if stale else []
        folders = {shot: out.shot_folders(shot) for shot in opening.shots}
        restarted = {}  # a restarted shot's done markers: its batches', its shot outputs', its cancellation
        for shot in opening.restarts:
            names = {kind.marker(out, shot).name for kind in SHOT_OUTPUTS} | {CANCELLED_MARKER}
            restarted[shot] = markers_in(folders[shot].done, names)
        records = {(shot, batch): read_marker(folders[shot].done / batch_marker_name(batch)) or {}
                   for shot, (batches, _) in opening.damaged.items() for batch in batches}  # fmt: skip
        chunks = [chunk for shot, ranges in opening.unfinished.items()
                  for chunk in unfinished_chunks(folders[shot], ranges)]  # fmt: skip

        for path in temporaries:
            beneath.unlink(out.root, path)
        for shot, recorded in opening.restarts.items():
            for marker in restarted[shot]:
                beneath.unlink(out.root, marker)
            beneath.remove_folder(out.root, folders[shot].done)  # only when nothing else is in it
            for kind in ALL_OUTPUTS:
                kind.remove(out, shot, recorded)
        for (shot, batch), record in records.items():  # each damaged batch: its marker, then its files
            beneath.unlink(out.root, folders[shot].done / batch_marker_name(batch))
            for batch_kind in BATCH_OUTPUTS:
                batch_kind.forget(out, shot, batch, record)
        for shot, (_, shot_outputs) in opening.damaged.items():
            for name in shot_outputs:
                beneath.unlink(out.root, SHOT_KIND[name].marker(out, shot))
        for chunk in chunks:
            beneath.unlink(out.root, chunk)
