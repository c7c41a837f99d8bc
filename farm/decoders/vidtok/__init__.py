"""The VidTok family: its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.vidtok.adapter import VidTokDecoder
from farm.decoders.vidtok.configs import VIDTOK_TINY

__all__ = ["VidTokDecoder", "VIDTOK_TINY"]
