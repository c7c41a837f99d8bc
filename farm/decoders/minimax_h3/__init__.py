"""The MiniMax-H3 family: its adapter (`adapter`), named configs (`configs`), and its sound (`audio`)."""

from farm.decoders.minimax_h3.adapter import MiniMaxH3Decoder
from farm.decoders.minimax_h3.configs import MINIMAX_H3, MINIMAX_H3_TINY

__all__ = ["MiniMaxH3Decoder", "MINIMAX_H3", "MINIMAX_H3_TINY"]
