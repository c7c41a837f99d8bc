"""Reading a JSON file that a user or another program may have put in farm's way.

Every JSON file farm reads from a user (a scheduler file, a cost model, a decoder spec) or from OUT
(the timeline, done markers) is read here: only from a regular file (never a FIFO, a device or through
a symbolic link, which could hang a command or feed it without end), at most `MAX_JSON_BYTES`, and
nested at most `MAX_JSON_DEPTH` deep. What fails any of these is a `FarmError` in one line naming the
file, so a caller that trusts nothing it cannot read turns it into "not there" or "damaged".
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from farm.errors import FarmError

MAX_JSON_BYTES = 64 * 1024 * 1024  # far above any file farm writes or reads (a timeline of 10^5 shots)
MAX_JSON_DEPTH = 64  # a decoder spec, the deepest JSON farm reads, nests fewer than 10 levels
_STRUCTURE = re.compile(rb'\\.|[][{}"]', re.DOTALL)  # an escape (two bytes), a bracket or a quote


def read_regular_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file at `path` (not followed through a link, never blocking on a FIFO or
    a device), at most `limit` of them; FileNotFoundError when there is none, FarmError for anything else
    that cannot be read: `what` names the file in the message (``scheduler file x.json``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if os.path.islink(path):
            raise FarmError(f"{what} is a symbolic link; farm reads it only as a regular file") from None
        raise FarmError(f"{what} cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FarmError(f"{what} is not a regular file (a FIFO, device or folder); give a file")
        if info.st_size > limit:
            raise FarmError(f"{what} is {info.st_size} bytes, more than farm reads ({limit}); is it the "
                            "right file?")  # fmt: skip
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while read
                raise FarmError(f"{what} is more than {limit} bytes, more than farm reads; is it the right "
                                "file?")  # fmt: skip
        return b"".join(chunks)
    except OSError as exc:
        raise FarmError(f"{what} cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def parse_json(text: str | bytes, what: str, depth: int = MAX_JSON_DEPTH) -> Any:
    """`text` parsed as JSON nested at most `depth` deep; FarmError naming `what` for anything else."""
    if nesting(text) > depth:
        raise FarmError(f"{what} nests too deep to read (JSON more than {depth} levels deep)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FarmError(f"{what} is not valid JSON ({str(exc).splitlines()[0][:200]})") from None


def read_json(path: str | os.PathLike[str], what: str | None = None, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in the regular file at `path` (see `read_regular_bytes` and `parse_json`);
    FileNotFoundError when there is no file, FarmError naming it for anything else."""
    what = what or f"{os.fspath(path)}"
    return parse_json(read_regular_bytes(path, what, limit), what)


def nesting(text: str | bytes) -> int:
    """How deeply the arrays and objects in JSON `text` nest (brackets inside strings not counted)."""
    data = text.encode() if isinstance(text, str) else text
    deepest = level = 0
    in_string = False
    for found in _STRUCTURE.finditer(data):
        token = found.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or len(token) == 2:  # inside a string, or an escaped character
            continue
        elif token in (b"[", b"{"):
            level += 1
            deepest = max(deepest, level)
        else:
            level -= 1
    return deepest
