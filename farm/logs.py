"""farm's messages: Python `logging` on the ``farm`` logger, shown by the command on stderr.

stdout is for what a script would parse (output paths, ids, tables); progress messages and warnings
go to stderr through :func:`setup`. The library itself only logs: an application using the API
chooses what to show (without a handler, Python shows warnings and errors only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import Any, NoReturn, TextIO

LOGGER = logging.getLogger("farm")

# What distributed logs as a command stops, that is no fault of the render (hidden unless -v), per logger:
# - the nanny warns whenever a worker process takes more than a few seconds to exit as a local cluster
#   closes; the process is then killed, which is the intended end of a render;
# - a Ctrl-C that lands in `distributed.utils.sync` before its future exists makes sync's cancel callback
#   fail with a NameError (a race in distributed), logged by tornado; the render stops as asked.
SHUTDOWN_NOISE = {
    "distributed.nanny": ("Worker process still alive after",),
    "tornado.application": ("Exception in callback functools.partial(<function sync.<locals>.cancel",),
}


def message(text: str) -> None:
    """Log one of farm's human messages: ``"warning: …"`` as a warning, anything else as info."""
    body = text.removeprefix("farm: ")
    if body.startswith("warning: "):
        LOGGER.warning(body.removeprefix("warning: "))
    else:
        LOGGER.info(body)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage().removeprefix("farm: ")  # one prefix, however the message was written
        if record.levelno >= logging.ERROR:
            return f"farm: error: {text}"
        if record.levelno >= logging.WARNING:
            return f"farm: warning: {text}"
        if record.levelno <= logging.DEBUG:
            where = record.name.removeprefix("farm").lstrip(".")  # farm.workflow → "workflow: "
            return f"farm: debug: {where + ': ' if where else ''}{text}"
        return f"farm: {text}"


class _DropShutdownNoise(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def level_for(verbosity: int) -> int:
    """``-q`` (-1): warnings and errors; ``-qq``: errors only; default: info; ``-v``: debug."""
    if verbosity <= -2:
        return logging.ERROR
    return {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)


def setup(verbosity: int = 0, stream: TextIO | None = None) -> None:
    """Show farm's messages on `stream` (stderr) at the level `verbosity` asks for (see `level_for`),
    Python warnings as farm warnings, and, unless ``-v``, without distributed's shutdown noise."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Formatter())
    LOGGER.handlers = [handler]
    LOGGER.setLevel(level_for(verbosity))
    LOGGER.propagate = False

    def show_warning(message: Any, category: Any, filename: str, lineno: int, *_: Any, **__: Any) -> None:
        LOGGER.warning(str(message))

    warnings.showwarning = show_warning
    for name, prefixes in SHUTDOWN_NOISE.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _DropShutdownNoise)]:
            logger.removeFilter(old)
        if verbosity < 1:
            logger.addFilter(_DropShutdownNoise(prefixes))
    if verbosity <= -1:  # -q: distributed's own info lines too
        logging.getLogger("distributed").setLevel(logging.WARNING)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's ``/proc``; None elsewhere): what `farm -v` reports of
    the time before a command's own clock starts (the interpreter's start and the imports)."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            started_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


def end_process(code: int) -> NoReturn:
    """End this process with `code` now, its standard streams flushed, without the interpreter's teardown
    (freeing every module and object: about a second once torch and diffusers are imported). Whatever
    else must run first (exit handlers, logging's flush) is the caller's to have run."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)
