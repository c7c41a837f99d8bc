"""Done markers under OUT/.farm/done: written durably once what they mark is in place, holding what
they mark (the sha256 of files), and read back to tell whether those files are still unchanged.

A marker is trusted only while what it records is still on disk unchanged: a missing, truncated or
altered file is rendered again (`farm.store.output_kinds` says what each kind's marker records).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.media.beneath import write_file
from farm.safe_read import parse_json, read_regular_bytes

# a batch marker holds a sha256 per chunk file of its frames: a few hundred bytes per chunk
MAX_MARKER_BYTES = 16 * 1024 * 1024


def mark_done(path: Path, record: dict | None = None, *, root: Path | None = None) -> None:
    """Create a marker file durably (fsync'd, its name too) so it only exists once what it marks is in
    place; `record` (what it marks: checksums) is its JSON content. `root`: OUT, from which its folders
    are reached (made where missing) without following a link (`farm.media.beneath`); without it, the
    marker's own folder (made where missing)."""
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path.parent if root is None else root, path, json.dumps(record).encode() if record else b"",
               durable=True)  # fmt: skip


def file_digest(path: Path) -> str | None:
    """sha256 of a regular file's bytes; None when there is no such file, or it is not a regular file
    (a link, a FIFO, a device or a folder where a marker names a file) or cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return hashlib.file_digest(fh, "sha256").hexdigest()
        except OSError:
            return None


def read_marker(path: Path) -> dict[str, Any] | None:
    """A done marker's record: {} for a marker without one (written before markers held checksums), None
    for no marker or one that cannot be read (not a regular file, too large, too deep, not a JSON
    object): a damaged marker marks nothing done."""
    try:
        text = read_regular_bytes(path, f"done marker {path}", MAX_MARKER_BYTES)
    except (OSError, FarmError):
        return None
    if not text:
        return {}
    try:
        record = parse_json(text, f"done marker {path}")
    except FarmError:
        return None
    return record if isinstance(record, dict) else None


def file_record(path: Path) -> dict[str, Any]:
    """What a done marker of one whole file records: its name, sha256 and size."""
    return {"name": path.name, "sha256": file_digest(path), "size": path.stat().st_size}


def file_intact(marker: Path, path: Path) -> bool:
    """Whether `marker` exists and `path` is, byte for byte, the file it records."""
    record = read_marker(marker)
    if record is None:
        return False
    if not record:  # a marker without a checksum: at least a non-empty regular file
        return path.is_file() and not path.is_symlink() and path.stat().st_size > 0
    return record.get("name") == path.name and file_digest(path) == record.get("sha256")


def markers_in(folder: Path, shot_markers: Collection[str]) -> list[Path]:
    """The done markers in a shot's done folder: its batches' (named by number) and the shot markers
    named in `shot_markers`. A link is never one of them, nor anything in a folder that is a link."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return [entry for entry in folder.iterdir() if (entry.name.isdigit() or entry.name in shot_markers)
            and entry.is_file() and not entry.is_symlink()]  # fmt: skip
