"""The HunyuanVideo family: its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.hunyuanvideo.adapter import HunyuanVideoDecoder
from farm.decoders.hunyuanvideo.configs import HUNYUANVIDEO_TINY

__all__ = ["HunyuanVideoDecoder", "HUNYUANVIDEO_TINY"]
