"""One render at a time per output folder: a kernel lock (``flock``) on ``OUT/.farm/lock``.

The kernel releases the lock when its holder exits, however it exits (a crash, SIGKILL, a lost node),
so no lock is ever left stale and no pid check can be fooled by a reused pid; two processes that find
the same leftover file race on ``flock`` and exactly one wins. The file also holds a JSON owner record
(pid, host, start time), only for the message a refused render prints.

The holder unlinks the file before it releases the lock; a process that locked a file which was
unlinked meanwhile (it opened the old one) sees the inode change and tries again, so two holders can
never lock two different files of the same path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.errors import FarmError
from farm.output import Output


def lock_path(out_root: Path) -> Path:
    return Output(out_root).lock_file


def _owner(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


@contextmanager
def output_lock(out_root: Path) -> Iterator[None]:
    """Hold the lock on ``OUT/.farm/lock`` for the duration, or refuse with who holds it.

    Creates ``OUT/.farm`` when needed; the lock file is gone again when the block ends (on success or
    failure), and the kernel drops the lock if this process dies inside the block.
    """
    path = lock_path(out_root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FarmError(f"output path {str(out_root)!r} is not writable: {exc.strerror or exc}") from None
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise FarmError(
                f"output {str(out_root)!r} is being written by another farm render "
                f"(pid {owner.get('pid', '?')} on {owner.get('host', '?')}); wait for it to finish or "
                "cancel it (the lock is released when that process ends)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file its holder had just unlinked: lock the current one
    try:
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # while still holding it: see the module docstring
        os.close(fd)  # releases the flock
