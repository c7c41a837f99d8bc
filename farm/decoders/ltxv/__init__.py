"""The LTX-Video 0.9.x family: its adapter (`adapter`), named configs (`configs`) and its single files"
metadata as ltx-video reads it (`metadata`)."""

from farm.decoders.ltxv.adapter import LTXVideoDecoder
from farm.decoders.ltxv.configs import LTXV_091, LTXV_091_TINY, LTXV_095, LTXV_095_TINY, LTXV_TINY

__all__ = ["LTXVideoDecoder", "LTXV_091", "LTXV_095", "LTXV_TINY", "LTXV_091_TINY", "LTXV_095_TINY"]
