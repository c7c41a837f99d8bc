"""The render output folder OUT: where every file of a render goes (`Output`), and the operations on
paths alone (writable, the temporaries a killed render left, removal of farm's own files).

    OUT/frames.zarr/                  attrs: {"farm": {"format": 1, "decoder": {...}, "random_weights": bool}}
      <shot>/frames                   [F, H, W, 3] uint8 levels or float16 in [0, 1], one chunk per
                                      temporal batch; attrs "render" (its identity, farm.run.resume),
                                      "batches"; dimension_names (frame, y, x, channel), colour attributes
      <shot>/frame, <shot>/channel    coordinates: frame numbers (from --first-frame), "R", "G", "B"
      <shot>/valid                    bool [F]: True where the frame's batch is done (a reader's mask)
    OUT/videos/<shot>.mp4|.mov        the shot's video (farm.media.video.CODECS: H.264, H.265, ProRes), with
                                      the shot's sound muxed in when it has sound (AAC in mp4, PCM in mov)
    OUT/audio/<shot>.wav|.flac        the shot's sound (16-bit stereo), as long as its video (media.audio)
    OUT/sequences/<shot>/<shot>.NNNN.png|.exr   optional image sequence (farm.media.sequences)
    OUT/.farm/lock                    the short lock on what OUT's renders share (farm.store.lock)
    OUT/.farm/locks/<shot>            the lock of the render writing the shot, its owner record
    OUT/.farm/guards/<name>           a render's guard on what its tasks write into OUT (farm.store.lock),
                                      removed before its shot locks are released
    OUT/.farm/segments/<shot>/NNNNN.mp4   per-batch segments, joined into the video (then removed)
    OUT/.farm/done/<shot>/NNNNN       marker written once batch NNNNN's frames, segment, images are in place:
                                      the sha256 of each of its chunk files and of its segment
    OUT/.farm/done/<shot>/video       marker written after the shot's video is joined: the video's sha256
    OUT/.farm/done/<shot>/audio       marker written after the shot's sound file is in place: its sha256
    OUT/.farm/done/<shot>/cancelled   a shot `farm cancel` stopped (removed when a render resumes it)
    OUT/.farm/renders/<render>.jsonl  each render's history: its set-up, every event of its state machine
                                      with the instructions it led to, how it ended (farm.store.render_logs)

`Output` is the only place these paths are spelled; temporaries (``.<name>.farm-XXXXXXXX.tmp<suffix>``,
`farm.media.files.temp_file`) are found by `Output.stale_temporaries`. The Zarr frames are
`farm.store.frames`'; the done markers `farm.store.markers`'; what each output kind owns, how it is
checked and removed, `farm.store.output_kinds`'.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.media import beneath
from farm.media.names import child_path, is_farm_temporary

STATE_DIR = ".farm"  # farm's own bookkeeping under OUT: lock, segments, done markers
SEGMENT_NAME = re.compile(r"\d{5}\.(mp4|mov)")
FRAMES_ARRAY = "frames"  # a shot's frames array in its Zarr group
RENDER_LOG_SUFFIX = ".jsonl"  # a render's history, one JSON object a line
CANCELLED_MARKER = "cancelled"  # in a shot's done folder: `farm cancel` stopped the shot


def batch_marker_name(batch: int) -> str:
    """The name of batch `batch`'s done marker in its shot's done folder."""
    return f"{batch:05d}"


@dataclass(frozen=True)
class ShotFolders:
    """A shot's folders that opening OUT for a render clears (`Output.shot_folders`)."""

    group: Path  # frames.zarr/<shot>: its Zarr group
    frames: Path  # frames.zarr/<shot>/frames: its frames array
    done: Path  # .farm/done/<shot>: its done markers


@dataclass(frozen=True)
class Output:
    """Every path under a render output folder; `video_suffix` is ".mp4", or ".mov" for ProRes."""

    root: Path
    video_suffix: str = ".mp4"

    @property
    def frames_zarr(self) -> Path:
        return self.root / "frames.zarr"

    def shot_folders(self, shot: str) -> ShotFolders:
        """The shot's folders that opening OUT for a render clears, resolved together (as `shot_group`,
        `frames_array` and `done_dir` resolve each)."""
        group = child_path(self.frames_zarr, shot)
        return ShotFolders(group=group, frames=group / FRAMES_ARRAY, done=child_path(self.done_root, shot))

    def shot_group(self, shot: str) -> Path:
        """The shot's Zarr group in frames.zarr (its attrs hold the render identity)."""
        return child_path(self.frames_zarr, shot)

    def frames_array(self, shot: str) -> Path:
        return self.shot_group(shot) / FRAMES_ARRAY

    @property
    def videos_dir(self) -> Path:
        return self.root / "videos"

    def video(self, shot: str, suffix: str | None = None) -> Path:
        """The shot's video; `suffix` another codec's (".mp4", ".mov") instead of this output's."""
        return child_path(self.videos_dir, shot, self.video_suffix if suffix is None else suffix)

    @property
    def sequences_dir(self) -> Path:
        return self.root / "sequences"

    def sequence_dir(self, shot: str) -> Path:
        return child_path(self.sequences_dir, shot)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "lock"

    @property
    def shot_locks_dir(self) -> Path:
        return self.state_dir / "locks"

    def shot_lock_file(self, shot: str) -> Path:
        return child_path(self.shot_locks_dir, shot)

    @property
    def guards_dir(self) -> Path:
        return self.state_dir / "guards"

    @property
    def renders_dir(self) -> Path:
        return self.state_dir / "renders"

    def render_log(self, render_id: str) -> Path:
        """The history of render `render_id` (`farm.store.render_logs`)."""
        return child_path(self.renders_dir, render_id, RENDER_LOG_SUFFIX, what="render id")

    @property
    def write_probe(self) -> Path:
        """A file created and removed to check OUT is writable."""
        return self.state_dir / "write-test"

    @property
    def segments_root(self) -> Path:
        return self.state_dir / "segments"

    def segments_dir(self, shot: str) -> Path:
        return child_path(self.segments_root, shot)

    def segment(self, shot: str, batch: int) -> Path:
        return self.segments_dir(shot) / f"{batch:05d}{self.video_suffix}"

    @property
    def done_root(self) -> Path:
        return self.state_dir / "done"

    def done_dir(self, shot: str) -> Path:
        return child_path(self.done_root, shot)

    def done_marker(self, shot: str, batch: int) -> Path:
        return self.done_dir(shot) / batch_marker_name(batch)

    def video_done_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / "video"

    @property
    def audio_dir(self) -> Path:
        return self.root / "audio"

    def audio_file(self, shot: str, suffix: str = ".wav") -> Path:
        """The shot's sound file (".wav" or ".flac")."""
        return child_path(self.audio_dir, shot, suffix)

    def audio_done_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / "audio"

    def cancelled_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / CANCELLED_MARKER

    def batches_done(self, shot: str, total: int | None = None) -> set[int]:
        """The batches of the shot marked done; with `total` (the batches its plan has), only those below
        it: a marker of a batch the plan does not have (`stray_markers`) marks nothing."""
        folder = self.done_dir(shot)
        marked = {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()
        return marked if total is None else {k for k in marked if k < total}

    def stray_markers(self, shot: str, total: int) -> list[Path]:
        """Batch done markers of the shot for batches its plan of `total` batches does not have."""
        folder = self.done_dir(shot)
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.name.isdigit() and int(p.name) >= total)

    def stale_temporaries(self) -> list[Path]:
        """Temp files a killed render left behind (never final outputs: those are renamed into place only
        when complete)."""
        folders = (self.videos_dir, self.segments_root, self.done_root, self.sequences_dir, self.audio_dir)
        return [tmp for folder in folders if folder.exists() for tmp in folder.rglob(".*")
                if is_farm_temporary(tmp.name) and tmp.is_file() and not tmp.is_symlink()]  # fmt: skip


@contextlib.contextmanager
def os_errors_in_one_line(what: str) -> Iterator[None]:
    """An OSError inside the block (a full disk, a permission) as a one-line FarmError naming `what` and
    the file, instead of a traceback through Zarr."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise FarmError(f"{what}: {exc.strerror or exc}{where}") from None


def check_writable(out: Output) -> None:
    try:
        out.root.mkdir(parents=True, exist_ok=True)
        beneath.make_folders(out.root, out.videos_dir)
        probe = out.write_probe
        with beneath.folder(out.root, probe.parent, create=True) as state:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(probe.name, flags, 0o644, dir_fd=state))
            with contextlib.suppress(FileNotFoundError):  # another render's probe of OUT removed it first
                os.unlink(probe.name, dir_fd=state)
    except OSError as exc:
        raise FarmError(f"output path {str(out.root)!r} is not writable: {exc.strerror or exc}") from None


def remove_own_files(folder: Path, own: Any, *, root: Path, recursive: bool = False) -> None:
    """Remove the files in `folder` whose names `own(name)` accepts (and farm's temporaries), in its
    sub-folders too when `recursive` (only those whose names it accepts), then every folder so emptied:
    a file farm did not write stays, and so does the folder holding it. `root`: OUT, from which each
    removal is reached without following a link (`farm.media.beneath`)."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.is_symlink() or not (own(entry.name) or is_farm_temporary(entry.name)):
            continue
        if entry.is_file():
            beneath.unlink(root, entry)
        elif recursive and entry.is_dir():
            remove_own_files(entry, own, root=root, recursive=True)
    beneath.remove_folder(root, folder)  # only when nothing else is in it


def _entries(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


@contextlib.contextmanager
def removed_if_left_empty(out: Output) -> Iterator[None]:
    """When OUT did not exist and the block fails, remove the empty folders it left (never a file), so a
    render that could not start leaves no empty OUT behind (left as it is while another render's shot
    locks are there: that render started writing into it meanwhile)."""
    existed = out.root.exists()
    try:
        yield
    except BaseException:
        if not existed and out.root.is_dir() and not _entries(out.shot_locks_dir):
            for folder, _, _ in sorted(os.walk(out.root), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)  # fails, harmlessly, on any folder that holds something
        raise
