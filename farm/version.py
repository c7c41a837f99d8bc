"""farm's version: the installed distribution's, or ``0+unknown`` for a source tree on sys.path without an
install."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "farm-decode"  # the name on the package index; the import name is farm

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:
    __version__ = "0+unknown"
