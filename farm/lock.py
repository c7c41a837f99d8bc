"""One render at a time per output folder: a lock file that records its owner and survives its crashes."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.errors import FarmError
from farm.output import Output


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def output_lock(out_root: Path) -> Iterator[None]:
    """Hold ``OUT/.farm/lock`` for the duration; a lock whose owner process is gone is taken over."""
    path = Output(out_root).lock_file
    path.parent.mkdir(parents=True, exist_ok=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                owner = {}
            same_host = owner.get("host") == me["host"]
            if same_host and isinstance(owner.get("pid"), int) and not _alive(owner["pid"]):
                path.unlink(missing_ok=True)  # its holder died: a crashed render, take over
                continue
            raise FarmError(
                f"output {str(out_root)!r} is being written by another farm render "
                f"(pid {owner.get('pid')} on {owner.get('host')}); wait for it to finish, or, if that "
                f"render is gone, delete {str(path)!r}"
            ) from None
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        break
    try:
        yield
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()
        except (OSError, ValueError):
            pass
