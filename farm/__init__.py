"""farm: decode video-diffusion latents on a Dask GPU farm."""

from farm.errors import FarmError

__all__ = ["FarmError"]
__version__ = "0.1.0"
