"""The Wan family (Wan 2.1, Wan 2.2): its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.wan.adapter import WanDecoder
from farm.decoders.wan.configs import WAN22, WAN22_MEAN, WAN22_STD, WAN22_TINY, WAN_TINY

__all__ = ["WanDecoder", "WAN22_MEAN", "WAN22_STD", "WAN22", "WAN_TINY", "WAN22_TINY"]
