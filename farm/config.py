"""farm's settings in Dask's configuration, under the ``farm`` namespace.

The defaults live in ``farm/farm.yaml`` and are registered with :func:`dask.config.update_defaults`
when farm is imported (as dask-cuda and distributed register theirs), so the usual Dask sources set
them: a YAML file with a top-level ``farm:`` key in ``~/.config/dask/`` (or ``$DASK_CONFIG``), the
environment (``DASK_FARM__BATCH_FRAMES=16``, read when dask is imported) or ``dask.config.set``.
Command-line options and explicit API arguments win over all of them.

Dask's own ``scheduler-address`` (``DASK_SCHEDULER_ADDRESS``) is honoured too: with it set and no
``--scheduler``/``--scheduler-file``/``--workers``, farm joins that cluster (`farm.run.cluster.connect`).

>>> get("batch-frames")
32
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dask.config
import yaml

from farm.errors import FarmError

DEFAULTS_FILE = Path(__file__).with_name("farm.yaml")
NAMESPACE = "farm"


def _register() -> None:
    with open(DEFAULTS_FILE, encoding="utf-8") as fh:
        defaults = yaml.safe_load(fh)
    dask.config.update_defaults(defaults)


def defaults() -> dict[str, Any]:
    """The packaged defaults (before any YAML file, variable or ``dask.config.set``)."""
    with open(DEFAULTS_FILE, encoding="utf-8") as fh:
        return dict(yaml.safe_load(fh)[NAMESPACE])


def get(key: str) -> Any:
    """The current value of ``farm.<key>`` (e.g. ``get("crf")``)."""
    return dask.config.get(f"{NAMESPACE}.{key}")


def option(key: str) -> Any:
    """``farm.<key>`` as a command-line default: a list or tuple (``DASK_FARM__TILES=1,1,2`` reads as
    one) becomes the comma-separated text the option takes."""
    value = get(key)
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


def whole_number(key: str, minimum: int | None = 0) -> int:
    """``farm.<key>`` as a whole number (≥ `minimum` unless None), or a FarmError naming where the bad
    value was set (the ``DASK_FARM__*`` variable, else the setting in Dask's configuration)."""
    value = get(key)
    try:
        number = int(value)
        ok = not isinstance(value, bool) and str(number) == str(value).strip()
    except (TypeError, ValueError):
        ok = False
    if ok and (minimum is None or number >= minimum):
        return number
    packaged = defaults().get(key)
    wanted = "a whole number" if minimum is None else f"a whole number ≥ {minimum}"
    raise FarmError(f"{source(key)} is {value!r}, not {wanted}; set it to one, or unset it for the default "
                    f"({'none' if packaged is None else packaged})")


def byte_size(key: str) -> int | None:
    """``farm.<key>`` as a number of bytes (``24GiB``, ``48 GB``, a whole number), or None when unset."""
    value = get(key)
    if value is None:
        return None
    return parse_size(str(value), source(key))


def parse_size(text: str, where: str) -> int:
    """A memory size as Dask writes them (``24GiB``, ``48GB``, ``2e10``) in bytes, at least 1 MiB."""
    from dask.utils import parse_bytes

    try:
        number = int(parse_bytes(text.strip()))
    except (ValueError, TypeError, KeyError, OverflowError):
        number = -1
    if number < 2**20 or number > 2**50:
        raise FarmError(f"{where} {text!r} is not a memory size; give one like 24GiB or 48GB "
                        "(from 1 MiB to 1 PiB)")  # fmt: skip
    return number


def source(key: str) -> str:
    """Where ``farm.<key>`` was set, in words: its environment variable when one is set, else the key."""
    variable = f"DASK_{NAMESPACE}__{key}".upper().replace("-", "_")
    if variable in os.environ:
        return f"environment variable {variable}"
    return f"{NAMESPACE}.{key} in Dask's configuration"


# Settings read where the work runs (on workers), not by the command: compile-cache and launch-lead when
# a decoder loads, zarrs when frames are written. A render takes those this process sets (a YAML file,
# DASK_FARM__* or dask.config.set here, differing from the packaged defaults) along with its tasks; the
# others are each worker's own (its YAML file or DASK_FARM__* variables).
WORKER_SETTINGS = ("compile-cache", "launch-lead", "zarrs", "gpu-memory")


def worker_settings() -> dict[str, Any]:
    """The `WORKER_SETTINGS` this process sets to other than the packaged defaults, as dask.config keys."""
    packaged = defaults()
    return {f"{NAMESPACE}.{k}": get(k) for k in WORKER_SETTINGS if get(k) != packaged.get(k)}


def run_with(settings: dict[str, Any], fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` with `settings` (dask.config keys) in force (on a worker, for one task)."""
    with dask.config.set(settings):
        return fn(*args, **kwargs)


def scheduler_address() -> str | None:
    """Dask's ``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``), or None when unset."""
    address = dask.config.get("scheduler-address", None)
    return str(address) if address else None


def scheduler_to_join(scheduler: str | None, scheduler_file: str | None, workers: int | None) -> str | None:
    """The scheduler address `connect` joins: `scheduler`, or with neither it, `scheduler_file` nor
    ``workers`` Dask's ``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``)."""
    if scheduler is None and scheduler_file is None and workers is None:
        return scheduler_address()
    return scheduler


def joins_running_cluster(scheduler: str | None, scheduler_file: str | None, workers: int | None) -> bool:
    """Whether `connect` with these arguments joins a running cluster (starts none)."""
    return scheduler_file is not None or scheduler_to_join(scheduler, scheduler_file, workers) is not None


_register()
