"""Writing files so that none is ever seen half-written: temporaries to rename into place (`temp_file`;
`farm.media.beneath.atomic_path` writes through them), fsync of files and folders (`fsync_path`,
several side by side: `fsync_all`), and the permissions the umask gives.

Temporaries are named ``.<name>.farm-XXXXXXXX.tmp<suffix>`` (`farm.media.names.FARM_TEMP`, `temp_file`), a
form no shot name takes, and clean-up (`farm.store.output.Output.stale_temporaries`) removes nothing else.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.media.names import FARM_TEMP_TAG, TEMP_SUFFIX

# Threads of this process' pool for fsyncs (and the writes they follow): a disk completes many flushes
# at once far faster than one after another (docs/performance.md, durable writes).
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


def temp_file(final: Path, suffix: str = "") -> tuple[int, str]:
    """A new temporary beside `final`, named in farm's form (`farm.media.names.FARM_TEMP`): (fd, path)."""
    try:
        return tempfile.mkstemp(prefix=f".{final.name}{FARM_TEMP_TAG}", suffix=TEMP_SUFFIX + suffix,
                                dir=final.parent)  # fmt: skip
    except OSError as e:
        raise FarmError(f"cannot write {os.fspath(final)!r}: {e.strerror or e}") from None


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``): True once swapped,
    False where the kernel or file system cannot (the caller then renames in two steps)."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a))


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
