"""farm: decode video-diffusion latents on a Dask GPU farm."""

from importlib.metadata import PackageNotFoundError, version

from farm import config  # noqa: F401  (registers farm's defaults in dask.config)
from farm.errors import FarmError

DISTRIBUTION = "farm-decode"  # the name on the package index; the import name is farm

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

__all__ = ["FarmError", "__version__"]
