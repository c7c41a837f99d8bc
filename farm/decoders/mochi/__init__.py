"""The Mochi family (Mochi 1): its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.mochi.adapter import MochiDecoder
from farm.decoders.mochi.configs import MOCHI_TINY

__all__ = ["MochiDecoder", "MOCHI_TINY"]
