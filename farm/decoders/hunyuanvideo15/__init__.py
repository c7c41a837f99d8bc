"""The HunyuanVideo 1.5 family: its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.hunyuanvideo15.adapter import HunyuanVideo15Decoder
from farm.decoders.hunyuanvideo15.configs import HUNYUANVIDEO15_TINY

__all__ = ["HunyuanVideo15Decoder", "HUNYUANVIDEO15_TINY"]
