"""One render at a time per output folder: a kernel lock (``flock``) on ``OUT/.farm/lock``.

The kernel releases the lock when its holder exits, however it exits (a crash, SIGKILL, a lost node),
so no lock is ever left stale and no pid check can be fooled by a reused pid; two processes that find
the same leftover file race on ``flock`` and exactly one wins. The file also holds a JSON owner record
(pid, host, start time; once the render is on its cluster, its render id and scheduler address), for
the message a refused render prints and for ``farm cancel OUT``, which reads it (`lock_owner`).

The holder unlinks the file before it releases the lock; a process that locked a file which was
unlinked meanwhile (it opened the old one) sees the inode change and tries again, so two holders can
never lock two different files of the same path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.errors import FarmError
from farm.media import beneath
from farm.store.output import Output


def lock_path(out_root: Path) -> Path:
    return Output(out_root).lock_file


def _owner(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def lock_owner(out_root: Path) -> dict | None:
    """The owner record of the render holding OUT's lock (pid, host, started; render id and scheduler
    once it records them), or None when no render holds it: no lock file, or one whose holder died
    (the kernel dropped its lock) and left the file."""
    try:
        fd = os.open(lock_path(out_root), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:  # a shared lock granted: nobody holds the exclusive one
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _owner(fd)
        except OSError:  # no flock on this file system: trust the file
            return _owner(fd)
        return None
    finally:
        os.close(fd)


def cancel_command(out_root: Path) -> str:
    """The command that cancels the render writing into OUT (`farm cancel` reads OUT's lock)."""
    return f"farm cancel {shlex.quote(str(out_root))}"


class LockHolder:
    """The holder's side of OUT's lock: `record` adds fields (the render id, the scheduler) to the owner
    record a refused render and ``farm cancel OUT`` read."""

    def __init__(self, fd: int, record: dict) -> None:
        self.fd, self.fields = fd, dict(record)

    def record(self, **fields: object) -> None:
        self.fields.update(fields)
        text = json.dumps(self.fields).encode()
        os.pwrite(self.fd, text, 0)
        os.ftruncate(self.fd, len(text))


@contextmanager
def output_lock(out_root: Path) -> Iterator[LockHolder]:
    """Hold the lock on ``OUT/.farm/lock`` for the duration, or refuse with who holds it.

    Creates ``OUT/.farm`` when needed; the lock file is gone again when the block ends (on success or
    failure), and the kernel drops the lock if this process dies inside the block.
    """
    path = lock_path(out_root)
    try:
        Path(out_root).mkdir(parents=True, exist_ok=True)
        state = beneath.open_folder(Path(out_root), path.parent, create=True)  # OUT/.farm, never a link
    except OSError as exc:
        raise FarmError(f"output path {str(out_root)!r} is not writable: {exc.strerror or exc}") from None
    try:
        with _locked(out_root, path, state) as holder:
            yield holder
    finally:
        os.close(state)


@contextmanager
def _locked(out_root: Path, path: Path, state: int) -> Iterator[LockHolder]:
    """`output_lock` in the folder of descriptor `state` (OUT/.farm)."""
    while True:
        try:
            # never through a link: truncating and writing the owner record would hit its target
            flags = os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(path.name, flags, 0o644, dir_fd=state)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FarmError(
                    f"output {str(out_root)!r}: {str(path)!r} is a symbolic link where farm keeps its lock; "
                    "farm never writes through a link. Remove the link"
                ) from None
            raise FarmError(f"output path {str(out_root)!r} is not writable: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            rid = f", render {owner['render']}" if owner.get("render") else ""
            raise FarmError(
                f"output {str(out_root)!r} is being written by another farm render "
                f"(pid {owner.get('pid', '?')} on {owner.get('host', '?')}{rid}); wait for it to finish or "
                f"cancel it with `{cancel_command(out_root)}` (the lock is released when that process ends)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path.name, dir_fd=state, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file its holder had just unlinked: lock the current one
    try:
        holder = LockHolder(fd, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        holder.record()
        yield holder
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path.name, dir_fd=state)  # while still holding it: see the module docstring
        os.close(fd)  # releases the flock


@contextmanager
def job_read_lock(job: str | os.PathLike[str]) -> Iterator[None]:
    """A shared kernel lock on the job store's folder while a render reads it: `ingest --replace` of its
    shots (`job_replace_lock`) is refused meanwhile, so a render reads one version of every latent. No
    lock where the folder cannot be opened (it is refused later, by name) or locked (some network file
    systems)."""
    try:
        fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for a replace's renames
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def job_replace_lock(job: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive lock on the job store's folder while shots are replaced, or refuse while a render
    reads the job (`job_read_lock`)."""
    try:
        fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FarmError(f"cannot open the job store {os.fspath(job)!r}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FarmError(
                f"job store {os.fspath(job)!r} is being read by a farm render; replacing its shots now would "
                "mix two versions of their latents in that render. Nothing was changed: run again once the "
                "render ends (or ingest under new shot names)"
            ) from None
        except OSError:
            pass  # no flock on this file system: nothing to coordinate with
        yield
    finally:
        os.close(fd)
