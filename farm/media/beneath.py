"""Files created, replaced and removed beneath a root folder (OUT) without ever following a link.

Every operation walks from the root's descriptor down, one folder at a time, each opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to the one above it (``openat``), and then acts on the last name
relative to its folder's descriptor: a file is created with ``O_EXCL | O_NOFOLLOW`` under a temporary
name of farm's form (`farm.media.names.FARM_TEMP`) and renamed over its final name with ``renameat``
(which replaces a link instead of following it), a removal is ``unlinkat``. A symbolic link anywhere
below the root, put there before the render or swapped in while it writes, is met as a link and refused
in one line naming it (`LinkInOutput`, a FarmError); nothing is written through it. The root itself may
be a link (an OUT the user points at through one).

Encoders that want a path (PyAV, OpenEXR) get ``/proc/self/fd/N`` of the temporary farm created: it
reopens that very file, whatever its name or folders become meanwhile (Linux; elsewhere they get the
temporary's path).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from farm.errors import FarmError
from farm.media.files import process_umask, run_side_by_side
from farm.media.names import FARM_TEMP_TAG, TEMP_SUFFIX

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_PROC_FD = Path("/proc/self/fd")


class LinkInOutput(FarmError):
    """A symbolic link (or a file) where farm writes a folder or file beneath OUT."""


def parts_beneath(root: Path, path: Path) -> tuple[str, ...]:
    """The names leading from `root` to `path` (which must lie beneath it, `..` nowhere)."""
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        raise FarmError(f"{str(path)!r} is not inside {str(root)!r}; farm writes only inside OUT") from None
    if any(p in ("..", ".") for p in parts):
        raise FarmError(f"{str(path)!r} leaves {str(root)!r}; farm writes only inside OUT")
    return parts


def _refused(root: Path, where: Path) -> LinkInOutput:
    try:
        mode = os.lstat(where).st_mode
    except OSError:
        mode = 0
    if stat.S_ISLNK(mode):
        with contextlib.suppress(OSError):
            target = os.readlink(where)
            return LinkInOutput(
                f"output {str(root)!r}: {str(where)!r} is a symbolic link (to {target!r}) where farm writes; "
                "farm never writes through a link, and wrote nothing there. Remove it and run again"
            )
        return LinkInOutput(f"output {str(root)!r}: {str(where)!r} is a symbolic link where farm writes; "
                            "farm never writes through a link, and wrote nothing there. Remove it and run "
                            "again")  # fmt: skip
    return LinkInOutput(f"output {str(root)!r}: {str(where)!r} is not a folder, and farm writes a folder "
                        "there; nothing was written there. Move it away and run again")  # fmt: skip


def open_folder(root: Path, path: Path, *, create: bool = False) -> int:
    """A descriptor of the folder `path` beneath `root`, reached without following a link (`create`:
    making the folders that are missing). The caller closes it. FileNotFoundError when a folder is
    missing and not `create`; `LinkInOutput` for a link (or a file) on the way."""
    root = Path(root)
    names = parts_beneath(root, path)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    where = root
    try:
        for name in names:
            where = where / name
            # `fd` names the open folder until the child is open: an interrupt (Ctrl-C, SIGTERM) raised
            # anywhere in the step closes one descriptor once, never one already closed
            child = _step(fd, name, root, where, create)
            fd, parent = child, fd
            os.close(parent)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(fd: int, name: str, root: Path, where: Path, create: bool) -> int:
    """Open folder `name` in folder `fd` (left open), making it first when `create` and missing."""
    for _ in range(8):  # a folder removed between its mkdir and its open is made again
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(where)) from None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=fd)
            continue
        except NotADirectoryError:
            raise _refused(root, where) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused(root, where) from None
            raise
        return child
    raise FarmError(f"output {str(root)!r}: {str(where)!r} kept disappearing while farm made it; "
                    "nothing was written there. Run again")  # fmt: skip


@contextlib.contextmanager
def folder(root: Path, path: Path, *, create: bool = False) -> Iterator[int]:
    """`open_folder` for the block."""
    fd = open_folder(root, path, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def make_folders(root: Path, path: Path) -> None:
    """``mkdir -p path`` beneath `root`, never through a link."""
    with folder(root, path, create=True):
        pass


def _new_temporary(dir_fd: int, final: str, suffix: str) -> tuple[int, str]:
    """A new empty file in `dir_fd` named in farm's temporary form, with the umask's permissions."""
    for _ in range(100):
        tag = "".join(secrets.choice(_TEMP_CHARS) for _ in range(8))
        name = f".{final}{FARM_TEMP_TAG}{tag}{TEMP_SUFFIX}{suffix}"
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666 & ~process_umask(), dir_fd=dir_fd)  # fmt: skip
        except FileExistsError:
            continue
        return fd, name
    raise FileExistsError(errno.EEXIST, "no free temporary name", final)


def _fd_path(fd: int, fallback: Path) -> str:
    """A path that opens the file of descriptor `fd` itself (`fallback` where /proc is missing)."""
    proc = _PROC_FD / str(fd)
    return str(proc) if _PROC_FD.is_dir() else str(fallback)


@contextlib.contextmanager
def _temporary(
    root: Path, path: Path, suffix: str, durable: bool, exclusive: bool
) -> Iterator[tuple[int, str]]:
    """A new temporary beside `path` for the block to write to (its descriptor and name), renamed over
    `path` (`exclusive`: linked, FileExistsError when `path` exists) when the block succeeds, removed when it
    fails; `durable`: the file, then the rename, fsync'd."""
    with folder(root, path.parent, create=True) as dir_fd:
        fd, tmp = _new_temporary(dir_fd, path.name, suffix)
        try:
            try:
                yield fd, tmp
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                os.link(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=dir_fd)
            else:
                os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        if durable:
            os.fsync(dir_fd)


@contextlib.contextmanager
def replacing(root: Path, path: Path, suffix: str = "", *, durable: bool = False) -> Iterator[str]:
    """Yield a path to write `path`'s new content to: a temporary farm created beneath `root`, as
    ``/proc/self/fd/N`` (that very file, whatever its folders become meanwhile). It is renamed over
    `path` when the block succeeds, removed when it fails; `durable`: the file and the rename are
    fsync'd. The folders up to `path` are made as needed, none followed when a link."""
    path = Path(path)
    with _temporary(root, path, suffix, durable, exclusive=False) as (fd, tmp):
        yield _fd_path(fd, path.parent / tmp)


def write_file(root: Path, path: Path, data: bytes | bytearray | memoryview, *, durable: bool = False,
               exclusive: bool = False) -> None:  # fmt: skip
    """Create or replace `path` beneath `root` with `data`, atomically (see `replacing`); `exclusive`:
    FileExistsError instead of replacing an existing `path`."""
    with _temporary(root, Path(path), "", durable, exclusive) as (fd, _):
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view) :]


def read_file(root: Path, path: Path) -> bytes | None:
    """`path`'s bytes, reached beneath `root` without following a link; None when there is no such file
    (or a folder or link is there)."""
    path = Path(path)
    try:
        with folder(root, path.parent) as dir_fd:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except (FileNotFoundError, LinkInOutput, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read()


def unlink(root: Path, path: Path) -> bool:
    """Remove the file (or link) `path` beneath `root`, following no link on the way: True when one was
    removed, False when there was none (nor its folder)."""
    path = Path(path)
    try:
        with folder(root, path.parent) as dir_fd:
            os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_folder(root: Path, path: Path) -> bool:
    """Remove the empty folder `path` beneath `root`: True when removed; False when it is missing, not
    empty or not a folder (a link is not removed)."""
    path = Path(path)
    try:
        with folder(root, path.parent) as dir_fd:
            os.rmdir(path.name, dir_fd=dir_fd)
    except (FileNotFoundError, LinkInOutput, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
            return False
        raise
    return True


def remove_tree(root: Path, path: Path) -> None:
    """Remove the folder `path` beneath `root` and all in it; links in it are removed, never followed."""
    import shutil

    path = Path(path)
    try:
        with folder(root, path.parent) as dir_fd:
            shutil.rmtree(path.name, dir_fd=dir_fd)  # fd-based on Linux: follows no link in the tree
    except (FileNotFoundError, LinkInOutput):
        return


def fsync(root: Path, path: Path) -> None:
    """fsync the file or folder `path` beneath `root` (a folder's fsync makes the names in it durable);
    one that is gone since farm wrote it (moved away, or its folder) fails in one line naming it."""
    path = Path(path)
    try:
        if path == Path(root):
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            with folder(root, path.parent) as dir_fd:
                fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FarmError(f"output {str(root)!r}: {str(path)!r} was moved or removed while farm wrote it; "
                        "run again to write it") from None  # fmt: skip
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(Path(root), path) from None
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(root: Path, files: Iterable[Path], folders: Iterable[Path] = ()) -> None:
    """`fsync` `files` side by side, then `folders` deepest first (`farm.media.files.fsync_all`, beneath
    `root`)."""
    run_side_by_side(lambda p: fsync(root, p), list(files))
    for path in sorted(set(folders), key=lambda p: -len(Path(p).parts)):
        fsync(root, path)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None, *,
                durable: bool = False) -> Iterator[str]:  # fmt: skip
    """Yield a temp path next to ``path``; move it into place on success, delete it on failure.

    `root`: the folder (OUT) from which every folder down to ``path`` is reached without following a
    link, made where missing (`farm.media.beneath`); by default ``path``'s own folder. `durable`: the
    file and its name are fsync'd before this returns."""
    final = Path(path)
    within = final.parent if root is None else Path(root)
    with contextlib.ExitStack() as stack:
        try:
            tmp = stack.enter_context(replacing(within, final, final.suffix, durable=durable))
        except OSError as e:  # making the temporary: a missing or unwritable folder
            raise FarmError(f"cannot write {os.fspath(final)!r}: {e.strerror or e}") from None
        yield tmp
