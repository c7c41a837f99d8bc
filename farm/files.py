"""Writing files so that none is ever seen half-written: a temp file renamed into place (`atomic_path`),
fsync of files and folders (`fsync_path`), and the permissions the umask gives.

Temporaries are named from `farm.names.TEMP_SUFFIX` (``.<name>.XXXX.tmp<suffix>``), a suffix no shot
name may carry, so clean-up (`farm.output.Output.stale_temporaries`) never meets a user's file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from farm.errors import FarmError
from farm.names import TEMP_SUFFIX


def process_umask() -> int:
    """This process' umask, read without changing it (os.umask sets it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    current = os.umask(0o022)  # no /proc (not Linux): set and restore
    os.umask(current)
    return current


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temp path next to ``path``; move it into place on success, delete it on failure."""
    final = Path(path)
    try:
        suffix = TEMP_SUFFIX + final.suffix
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=suffix, dir=final.parent)
    except OSError as e:
        raise FarmError(f"cannot write {os.fspath(path)!r}: {e}") from e
    try:
        os.fchmod(fd, 0o666 & ~process_umask())  # mkstemp makes 0600; outputs get what open() would give
    finally:
        os.close(fd)
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder's fsync makes the names created in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
