"""Writing files so that none is ever seen half-written: a temp file renamed into place (`atomic_path`),
fsync of files and folders (`fsync_path`, several side by side: `fsync_all`), and the permissions the
umask gives.

Temporaries are named from `farm.names.TEMP_SUFFIX` (``.<name>.XXXX.tmp<suffix>``), a suffix no shot
name may carry, so clean-up (`farm.output.Output.stale_temporaries`) never meets a user's file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.names import TEMP_SUFFIX

# Threads of this process' pool for fsyncs (and the writes they follow): a disk completes many flushes
# at once far faster than one after another (docs/benchmarks.md, durable writes).
SYNC_THREADS = 16
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid that made it, pool)
_pool_lock = threading.Lock()


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


def sync_pool() -> ThreadPoolExecutor:
    """This process' thread pool for fsyncs, made on first use (and again in a forked child, whose copy
    of the parent's pool has no threads)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="farm-fsync"))
        return _pool[1]


def run_side_by_side(work: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``work(item)`` for every item, run on the sync pool, in the items' order; the first error is
    raised once every item has finished (none is left running behind the caller's back)."""
    futures = [sync_pool().submit(work, item) for item in items]
    errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


def fsync_all(files: Iterable[Path], folders: Iterable[Path] = ()) -> None:
    """fsync `files` side by side, then `folders` deepest first (a folder's entries before its parent's),
    so that once this returns every file's data and every name created in the folders is durable."""
    run_side_by_side(fsync_path, list(files))
    for folder in sorted(set(folders), key=lambda p: -len(Path(p).parts)):
        fsync_path(folder)
