"""Renders into one output folder: a kernel lock (``flock``) per shot, and a short one for what they share.

A render holds ``OUT/.farm/locks/<shot>`` for each shot it renders, from before its cluster starts to
its end, so renders of different shots of one job write into one OUT at once (a render manager's tasks
on many hosts) while a render of a shot another render holds is refused, naming the shot and its
holder. ``OUT/.farm/lock`` is held only for moments, around what every render of OUT shares: taking
shot locks (and the checks that must see every other render: one job per OUT), the Zarr root's
attributes, the timeline, the removal of the temporaries a killed render left.

The kernel releases a lock when its holder exits, however it exits (a crash, SIGKILL, a lost node), so
no lock is ever left stale and no pid check can be fooled by a reused pid; two processes that find the
same leftover file race on ``flock`` and exactly one wins. A shot's file also holds a JSON owner record
(pid, host, start time, job, render id; once the render is on its cluster, its scheduler address), for
the message a refused render prints and for ``farm cancel OUT``, which reads them (`lock_owners`).

The holder unlinks a file before it releases its lock; a process that locked a file which was unlinked
meanwhile (it opened the old one) sees the inode change and tries again, so two holders can never lock
two different files of the same path.

A render's tasks that write into OUT on a worker of a shared cluster may start after the render has
gone (an interrupt does not wait for a task the busy cluster has not started): such a task writes only
inside `guarded_writes`, under the render's guard file (``OUT/.farm/guards/<name>``, `render_guard`),
which the render locks and removes before it releases its shot locks.
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
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from farm import logs
from farm.errors import FarmError
from farm.media import beneath
from farm.store.output import Output

SHARED_WAIT_S = 120.0  # the short lock is held for moments: waiting this long means its holder is stuck


def lock_path(out_root: Path) -> Path:
    """The short lock on what OUT's renders share."""
    return Output(out_root).lock_file


def shot_lock_path(out_root: Path, shot: str) -> Path:
    return Output(out_root).shot_lock_file(shot)


def _owner(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _held_record(path: Path) -> dict | None:
    """The owner record of the lock file `path` while a live process holds it; None when none does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
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


def held_shots(out_root: Path) -> dict[str, dict]:
    """Each shot of OUT a live render holds, with that render's owner record (pid, host, started, job,
    render; scheduler once it records it)."""
    folder = Output(out_root).shot_locks_dir
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    held = {}
    for name in names:
        record = _held_record(folder / name)
        if record is not None:
            held[name] = record
    return held


def lock_owners(out_root: Path) -> list[dict]:
    """The owner records of the renders writing into OUT now (one per render, its shots under
    ``"shots"``), oldest first; empty when none is."""
    renders: dict[tuple, dict] = {}
    for shot, record in held_shots(out_root).items():
        key = (record.get("host"), record.get("pid"), record.get("render"))
        renders.setdefault(key, {**record, "shots": []})["shots"].append(shot)
    return sorted(renders.values(), key=lambda r: r.get("started") or 0)


def other_renders(out_root: Path) -> list[dict]:
    """`lock_owners` but this process: the other renders writing into OUT now."""
    me = (os.getpid(), socket.gethostname())
    return [owner for owner in lock_owners(out_root) if (owner.get("pid"), owner.get("host")) != me]


def lock_owner(out_root: Path) -> dict | None:
    """The owner record of the oldest render writing into OUT now (`lock_owners`), or None."""
    owners = lock_owners(out_root)
    return owners[0] if owners else None


def cancel_command(out_root: Path) -> str:
    """The command that cancels the renders writing into OUT (`farm cancel` reads OUT's shot locks)."""
    return f"farm cancel {shlex.quote(str(out_root))}"


def describe_owner(owner: dict) -> str:
    """``pid P on HOST, render R``: who holds a lock, for a message."""
    rid = f", render {owner['render']}" if owner.get("render") else ""
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}{rid}"


class LockHolder:
    """The holder's side of a render's shot locks: `record` adds fields (the scheduler) to the owner
    record a refused render and ``farm cancel OUT`` read."""

    def __init__(self, fds: Sequence[int], record: dict) -> None:
        self.fds, self.fields = list(fds), dict(record)

    def record(self, **fields: object) -> None:
        self.fields.update(fields)
        text = json.dumps(self.fields).encode()
        for fd in self.fds:
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))


class _Held(Exception):
    """The lock file is held by a live process, whose owner record this carries."""

    def __init__(self, owner: dict) -> None:
        self.owner = owner


def _state_folder(out_root: Path, folder: Path) -> int:
    """A descriptor of `folder` under OUT (made when missing), never reached through a link."""
    try:
        Path(out_root).mkdir(parents=True, exist_ok=True)
        return beneath.open_folder(Path(out_root), folder, create=True)
    except OSError as exc:
        raise FarmError(f"output path {str(out_root)!r} is not writable: {exc.strerror or exc}") from None


def _lock_file(out_root: Path, path: Path, dir_fd: int, *, wait: float = 0.0) -> int:
    """The descriptor of `path` (in the folder `dir_fd`), exclusively locked: waiting up to `wait`
    seconds for a live holder, then `_Held` with its record."""
    deadline = time.monotonic() + wait
    while True:
        try:
            # never through a link: truncating and writing the owner record would hit its target
            flags = os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(path.name, flags, 0o644, dir_fd=dir_fd)
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
            if time.monotonic() >= deadline:
                raise _Held(owner) from None
            time.sleep(0.005)
            continue
        except BaseException:  # an interrupt (Ctrl-C, SIGTERM): no lost descriptor left holding the lock
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        except BaseException:  # as above: this process would wait on its own lock at its clean-up
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)  # we locked a file its holder had just unlinked: lock the current one


def _release(path: Path, dir_fd: int, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path.name, dir_fd=dir_fd)  # while still holding it: see the module docstring
    os.close(fd)  # releases the flock


@contextmanager
def shared_lock(out_root: Path, *, wait: float = SHARED_WAIT_S) -> Iterator[None]:
    """Hold ``OUT/.farm/lock``, the short lock on what OUT's renders share, for the block (moments:
    waiting up to `wait` seconds for another holder, then refusing with who holds it)."""
    path = lock_path(out_root)
    state = _state_folder(out_root, path.parent)
    try:
        try:
            fd = _lock_file(out_root, path, state, wait=wait)
        except _Held as held:
            raise FarmError(
                f"output {str(out_root)!r}: {str(path)!r} has been held for {wait:.0f} s by "
                f"{describe_owner(held.owner)}; it is held only for moments, so that process is stuck: "
                "end it and run again"
            ) from None
        try:
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
            yield
        finally:
            _release(path, state, fd)
    finally:
        os.close(state)


def _same_job(a: object, b: str) -> bool:
    if not isinstance(a, str):
        return True  # a record without a job (being written): the check runs again once it has one
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


@contextmanager
def output_lock(
    out_root: Path, shots: Sequence[str], *, job: str | os.PathLike[str], render: str = "",
    check: Callable[[], None] | None = None, wait: float = SHARED_WAIT_S,
) -> Iterator[LockHolder]:  # fmt: skip
    """Hold the locks of `shots` in OUT for the duration, or refuse, naming the shots another render
    holds and who holds them, or the render of another job writing into OUT (one job per OUT).

    They are taken under the shared lock (`shared_lock`, waiting up to `wait` s), after `check()` (what
    must see every other render's claim: the job OUT records); each shot's file records this render's
    owner (`job`, `render`). The files are gone again when the block ends (on success or failure), and
    the kernel drops the locks if this process dies inside the block.
    """
    job = os.fspath(job)
    folder = Output(out_root).shot_locks_dir
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "job": job,
              "render": render}  # fmt: skip
    fds: list[tuple[Path, int]] = []
    with shared_lock(out_root, wait=wait):
        locks = _state_folder(out_root, folder)
        try:
            others = held_shots(out_root)
            foreign = next((o for o in others.values() if not _same_job(o.get("job"), job)), None)
            if foreign is not None:
                raise FarmError(
                    f"output {str(out_root)!r} is being written by a farm render of job "
                    f"{foreign.get('job')!r} "
                    f"({describe_owner(foreign)}), not of {job!r}; an output folder holds one job's render. "
                    f"Nothing was changed: use a new --out, or wait for it to finish or cancel it with "
                    f"`{cancel_command(out_root)}`"
                )
            if check is not None:
                check()
            _take(out_root, locks, list(dict.fromkeys(shots)), fds)
        except BaseException:
            for path, fd in fds:
                _release(path, locks, fd)
            os.close(locks)
            raise
    try:
        holder = LockHolder([fd for _, fd in fds], record)
        holder.record()
        yield holder
    finally:
        for path, fd in fds:
            _release(path, locks, fd)
        os.close(locks)


def _take(out_root: Path, locks: int, shots: Sequence[str], fds: list[tuple[Path, int]]) -> None:
    """Lock each shot's file into `fds`, or refuse naming every shot another render holds."""
    held: dict[str, dict] = {}
    for shot in shots:
        path = Output(out_root).shot_lock_file(shot)
        try:
            fds.append((path, _lock_file(out_root, path, locks)))
        except _Held as exc:
            held[shot] = exc.owner
    if held:
        by_owner: dict[str, list[str]] = {}
        for shot, owner in held.items():
            by_owner.setdefault(describe_owner(owner), []).append(shot)
        who = "; ".join(f"shot(s) {', '.join(map(repr, names))} by {owner}"
                        for owner, names in by_owner.items())  # fmt: skip
        raise FarmError(
            f"output {str(out_root)!r} is being written by another farm render: {who}. Nothing was changed: "
            "render other shots (--shots), wait for it to finish or cancel it with "
            f"`{cancel_command(out_root)}` (the lock is released when that process ends)"
        )


# what names a render in its shot locks' owner record: a later render with the same render id is another
OWNER_IDENTITY = ("pid", "host", "started", "render")


@contextmanager
def render_guard(
    out_root: Path, owner: Mapping[str, object], *, wait: float = SHARED_WAIT_S
) -> Iterator[str]:  # fmt: skip
    """A guard on what the render's tasks write into OUT (`guarded_writes`), for the block: yields its name.
    Taken inside `output_lock` (`owner`: its record, which the guard keeps for `stale_guards`): when the
    block ends, the guard is locked (waiting up to `wait` s for a task writing under it) and removed,
    before the shot locks are released."""
    state = _state_folder(out_root, Output(out_root).guards_dir)
    name = uuid.uuid4().hex
    try:
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(name, flags, 0o644, dir_fd=state)
            try:
                os.write(fd, json.dumps(_identity(owner)).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise FarmError(f"output path {str(out_root)!r} is not writable: {exc.strerror or exc}") from None
        try:
            yield name
        finally:
            _retire_guard(out_root, name, state, wait)
    finally:
        os.close(state)


def _retire_guard(out_root: Path, name: str, state: int, wait: float) -> None:
    """Lock the guard `name` (a task writing under it finishes first: up to `wait` s) and remove it: a task
    that locks it afterwards finds it unlinked and writes nothing."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=state)
    except OSError:
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logs.LOGGER.warning(
                        "output %r: a task of this render has been writing its output arrays for %.0f s; "
                        "the render ends without waiting for it", str(out_root), wait,
                    )  # fmt: skip
                    break
                time.sleep(0.01)
            except OSError:  # no flock on this file system: the removal alone tells later tasks
                break
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=state)
    finally:
        os.close(fd)


@contextmanager
def guarded_writes(
    out_root: Path, guard: str, owner: Mapping[str, object], shots: Sequence[str]
) -> Iterator[bool]:  # fmt: skip
    """For a task writing into OUT for a render away from the render's process (an I/O worker): yields
    whether that render still holds OUT (its guard `guard` in place, each of `shots`' locks carrying the
    `owner` record it took them with). The guard stays locked for the block, so the render cannot let
    OUT go meanwhile: it waits for the block (`render_guard`) before releasing its locks."""
    state = fd = -1
    try:
        holding = False
        try:
            state = beneath.open_folder(Path(out_root), Output(out_root).guards_dir)
            fd = os.open(guard, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=state)
        except (OSError, FarmError):  # removed: the render let OUT go (a guard is never made again)
            pass
        else:
            with contextlib.suppress(OSError):  # no flock on this file system: the checks below alone
                fcntl.flock(fd, fcntl.LOCK_EX)  # the render holds it only while removing the guard
            holding = _guard_in_place(guard, state, fd) and _owns_shots(out_root, owner, shots)
        yield holding
    finally:
        for open_fd in (fd, state):
            if open_fd >= 0:
                os.close(open_fd)


def _guard_in_place(name: str, state: int, fd: int) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(name, dir_fd=state, follow_symlinks=False).st_ino
    except OSError:
        return False


def _identity(owner: Mapping[str, object]) -> dict[str, object]:
    return {key: owner.get(key) for key in OWNER_IDENTITY}


def _owns_shots(out_root: Path, owner: Mapping[str, object], shots: Sequence[str]) -> bool:
    """Whether each of `shots`' locks is held with `owner`'s record (a render killed with SIGKILL left its
    guard behind, but the kernel released its shot locks)."""
    for shot in shots:
        record = _held_record(shot_lock_path(out_root, shot))
        if record is None or _identity(record) != _identity(owner):
            return False
    return True


def stale_guards(out_root: Path) -> list[Path]:
    """The guards (`render_guard`) of renders that are not live: killed ones' (a render removes its own).
    A guard whose record is not written yet is its render's, live."""
    folder = Output(out_root).guards_dir
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    owners = lock_owners(out_root)
    if any(owner.get("pid") is None for owner in owners):  # a record read while being rewritten: not now
        return []
    live = [_identity(owner) for owner in owners]
    stale = []
    for name in names:
        try:
            record = json.loads(beneath.read_file(Path(out_root), folder / name) or b"null")
        except (OSError, ValueError, FarmError):
            continue
        if isinstance(record, dict) and _identity(record) not in live:
            stale.append(folder / name)
    return stale


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
