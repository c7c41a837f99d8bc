"""What each family records for the installed diffusers, in its own folder: ``<family>/recorded.json``.

A family's recording holds its diffusers class's constructor defaults, and each named config's decoder
parameter count and decoder tensors (names and shapes, built on the meta device). Planning (a config
completed with the defaults, the weights' size) and the weight check (checkpoint headers against the
tensors) read them instead of importing torch and diffusers. `tools/record_decoder_defaults.py` writes
them; a recording made for another diffusers version is ignored (the class is then read itself).

Keeping the recording beside the adapter makes a new family one folder and one registry line.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
from pathlib import Path
from typing import Any

RECORDING_NAME = "recorded.json"


def recording_path(adapter: type) -> Path:
    """The recording of the family whose adapter class is `adapter`: beside the module defining it."""
    return Path(inspect.getfile(adapter)).with_name(RECORDING_NAME)


@functools.cache
def _read(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        installed = importlib.metadata.version("diffusers")
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return {}
    return record if record.get("diffusers") == installed else {}


def recorded_constructor_defaults(adapter: type) -> dict[str, Any] | None:
    """The constructor defaults of the adapter's diffusers class as recorded (JSON: tuples as lists), or
    None when none is recorded for the installed diffusers."""
    return _read(recording_path(adapter)).get("constructor_defaults")


def recorded_decoder_parameters(adapter: type, config_name: str) -> int | None:
    """A named config's decoder parameter count as recorded, or None."""
    return _read(recording_path(adapter)).get("decoder_parameters", {}).get(config_name)


def recorded_decoder_tensors(adapter: type, config_name: str) -> dict[str, tuple[int, ...]] | None:
    """A named config's decoder tensors' shapes as recorded, or None."""
    shapes = _read(recording_path(adapter)).get("decoder_tensors", {}).get(config_name)
    return None if shapes is None else {k: tuple(v) for k, v in shapes.items()}


def recording_text(record: dict[str, Any]) -> str:
    """A recording as written: sorted JSON, one tensor or setting a line."""
    text = json.dumps(record, sort_keys=True)
    return text.replace(', "', ',\n"') + "\n"
