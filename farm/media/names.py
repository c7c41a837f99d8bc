"""Names users give (shots, jobs) that become file names: the one rule they follow, and paths built from
them that provably stay inside their parent folder.

A name is letters, digits, ``_``, ``-`` and ``.``, starting with a letter, digit or ``_`` (so never a
hidden file like farm's temporaries ``.<name>.farm-XXXXXXXX.tmp<suffix>``, never ``.``/``..``, never something
a command line reads as an option), at most 200 characters, and not ending in farm's temporary suffix
``.tmp`` nor holding ``.tmp.`` (what stale-temporary clean-up removes). So no name reaches farm's own
files: ``OUT/.farm`` and temporaries are hidden, and each shot has its own folder under every output
kind (``frames.zarr/<shot>``, ``sequences/<shot>``, ``.farm/done/<shot>``, ``.farm/segments/<shot>``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TypeGuard

from farm.errors import FarmError

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
TEMP_SUFFIX = ".tmp"  # no name ends in it or holds ".tmp."
# farm's temporaries: ".<final name>.farm-XXXXXXXX.tmp[<suffix>]", XXXXXXXX from tempfile (8 of
# [a-z0-9_]); clean-up removes only names of exactly this form (`is_farm_temporary`).
FARM_TEMP_TAG = ".farm-"
FARM_TEMP = re.compile(r"\..+" + re.escape(FARM_TEMP_TAG) + r"[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX)
                       + r"(\.[A-Za-z0-9]+)?")  # fmt: skip


def is_farm_temporary(name: str) -> bool:
    """Whether a file name is one of farm's temporaries (`FARM_TEMP`), never a user's ordinary file."""
    return FARM_TEMP.fullmatch(name) is not None


def is_valid_name(name: object) -> TypeGuard[str]:
    """Whether `name` follows the rule above."""
    return (
        isinstance(name, str)
        and NAME.fullmatch(name) is not None
        and not name.endswith(TEMP_SUFFIX)
        and TEMP_SUFFIX + "." not in name
    )


def check_name(name: object, what: str = "shot name") -> str:
    """`name` if it follows the rule above, else a FarmError saying what would be valid."""
    if not is_valid_name(name):
        raise FarmError(
            f"{what} {name!r} is not allowed: use letters, digits, '_', '-' and '.', starting with a letter, "
            f"digit or '_', at most 200 characters, not ending in {TEMP_SUFFIX!r} nor holding "
            f"{TEMP_SUFFIX + '.'!r} (farm's temporary files)"
        )
    return name


def child_path(parent: Path, name: str, suffix: str = "", what: str = "shot name") -> Path:
    """``parent / (name + suffix)`` for a checked `name`, proven to be a direct child of `parent`."""
    path = Path(parent) / (check_name(name, what) + suffix)
    if os.path.dirname(os.path.normpath(path)) != os.path.normpath(parent):  # cannot fail for a checked name
        raise FarmError(f"{what} {name!r} would leave the folder {str(parent)!r}")
    return path
