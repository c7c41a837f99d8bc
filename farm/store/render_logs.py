"""Render histories on disk: ``OUT/.farm/renders/<render-id>.jsonl``, one per render, written line by line.

Each render appends to its own file (renders writing one OUT at once never share one), each line in one
``write`` on a descriptor opened for appending, so a render killed at any point leaves every line it
reached, whole. The files get the umask's permissions, as OUT's other files do, and farm never removes
them. What a line holds is `farm.planning.render_events`'; its lines are read back here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm import logs
from farm.errors import FarmError
from farm.media import beneath
from farm.media.files import process_umask
from farm.store.output import RENDER_LOG_SUFFIX, Output

MAX_HISTORY_BYTES = 512 * 1024 * 1024  # a history read back past this is read up to it


class RenderLogFile:
    """The history file of one render, open for appending; a file that cannot be written is warned of
    once and then left alone: a render never fails for its history."""

    def __init__(self, out: Output, render_id: str) -> None:
        self.path: Path | None = None
        self.fd: int | None = None
        try:
            path = out.render_log(render_id)
            with beneath.folder(out.root, path.parent, create=True) as folder:
                self.fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, 0o666 & ~process_umask(), dir_fd=folder)  # fmt: skip
            self.path = path
        except (OSError, FarmError) as exc:
            logs.LOGGER.warning(f"farm: render {render_id!r} keeps no history in {str(out.root)!r}: {exc}")

    def write(self, line: str) -> None:
        """Append `line` (one JSON object and its newline) in one write."""
        if self.fd is None:
            return
        data = line.encode()
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError as exc:
            logs.LOGGER.warning(f"farm: the render's history {str(self.path)!r} stopped here: {exc}")
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class StoredHistory:
    """One history file read back: its render id (the file's name), its lines, its last change."""

    render_id: str
    path: Path
    records: list[dict[str, Any]]
    modified: float


def history_paths(out: Output) -> list[Path]:
    """OUT's history files, by name."""
    folder = out.renders_dir
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    except OSError as exc:
        what = f"the render histories in {str(folder)!r}"
        raise FarmError(f"cannot list {what}: {exc.strerror or exc}") from None
    return [folder / n for n in names if n.endswith(RENDER_LOG_SUFFIX) and not n.startswith(".")]


def read_history(path: Path) -> StoredHistory:
    """A history file's records (a line cut short by a kill is left out)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise FarmError(f"cannot read the render history {str(path)!r}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        modified = os.fstat(fd).st_mtime
        text = fh.read(MAX_HISTORY_BYTES).decode(errors="replace")
    return StoredHistory(path.name.removesuffix(RENDER_LOG_SUFFIX), path, parse_lines(text), modified)


def read_histories(out: Output) -> Iterator[StoredHistory]:
    for path in history_paths(out):
        yield read_history(path)


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a history's lines; a line that is not one (cut short by a kill) is skipped."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
