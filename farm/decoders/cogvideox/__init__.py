"""The CogVideoX family (CogVideoX-2b, -5b, 1.5): its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.cogvideox.adapter import CogVideoXDecoder
from farm.decoders.cogvideox.configs import COGVIDEOX_5B, COGVIDEOX_15, COGVIDEOX_TINY

__all__ = ["CogVideoXDecoder", "COGVIDEOX_5B", "COGVIDEOX_15", "COGVIDEOX_TINY"]
