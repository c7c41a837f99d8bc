"""farm's settings in Dask's configuration, under the ``farm`` namespace.

The defaults live in ``farm/farm.yaml`` and are registered with :func:`dask.config.update_defaults`
when farm is imported (as dask-cuda and distributed register theirs), so the usual Dask sources set
them: a YAML file with a top-level ``farm:`` key in ``~/.config/dask/`` (or ``$DASK_CONFIG``), the
environment (``DASK_FARM__BATCH_FRAMES=16``, read when dask is imported) or ``dask.config.set``.
Command-line options and explicit API arguments win over all of them.

Dask's own ``scheduler-address`` (``DASK_SCHEDULER_ADDRESS``) is honoured too: with it set and no
``--scheduler``/``--scheduler-file``/``--workers``, farm joins that cluster (`farm.cluster.connect`).

>>> get("batch-frames")
32
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml

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


def scheduler_address() -> str | None:
    """Dask's ``scheduler-address`` setting (``DASK_SCHEDULER_ADDRESS``), or None when unset."""
    address = dask.config.get("scheduler-address", None)
    return str(address) if address else None


_register()
