"""A decode call's peak device memory as a model of its output shape: weights, a fixed part, bytes
per pixel, per frame pixel and per attended pair (each adapter's ``memory_terms``).

Pure (no torch): the planner (`farm.planning.planner`, `farm.planning.budgets`) and the adapters share it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# torch's CPU 3-D convolution takes its native path (an unfolded copy of its input: input channels x 27
# floats per output position) instead of oneDNN when batch x channels x frames x rows of its padded input
# is at most this (aten/src/ATen/native/Convolution.cpp, `use_mkldnn`): small inputs of narrow layers.
CPU_NATIVE_CONV_LIMIT = 20480


@dataclass(frozen=True)
class MemoryModel:
    """Peak device memory of one decode call of ``(frames, height, width)`` output pixels: weights, a
    fixed part, bytes per output pixel-frame and per pixel of one frame (decoders that decode frame by
    frame hold a frame's activations, whatever the clip's length), or, where a decoder attends over all
    latent positions of a call with a dense mask, ``pair_bytes`` per pair of positions
    (``pixels_per_position`` output pixel-frames each) when that is larger.

    ``native_conv``: (input channels, bytes per output pixel-frame) of full-resolution 3x3x3 convolutions
    (padded by one pixel and two frames), added while torch runs them through its CPU native path
    (:data:`CPU_NATIVE_CONV_LIMIT`; the largest that applies, as they run one after another). Only
    models measured on a CPU have them."""

    weight_bytes: int
    bytes_per_pixel: float
    pair_bytes: float = 0.0
    pixels_per_position: float = 1.0
    const_bytes: float = 0.0
    bytes_per_frame_pixel: float = 0.0
    native_conv: tuple[tuple[int, float], ...] = ()

    def peak_bytes(self, pixels: Sequence[int] | int) -> int:
        """Peak bytes of a decode call of ``(frames, height, width)`` pixels (or a pixel volume, for
        models whose terms do not depend on the shape)."""
        if isinstance(pixels, int | float):
            if self.bytes_per_frame_pixel or self.native_conv:
                raise ValueError("this memory model depends on the decode call's shape: give (f, h, w)")
            f, h, w = float(pixels), 1.0, 1.0
        else:
            f, h, w = (float(x) for x in pixels)
        volume = f * h * w
        native = (b for c, b in self.native_conv if c * (f + 2) * (h + 2) <= CPU_NATIVE_CONV_LIMIT)
        per_pixel = self.bytes_per_pixel + max(native, default=0.0)
        linear = self.const_bytes + per_pixel * volume + self.bytes_per_frame_pixel * h * w
        positions = volume / self.pixels_per_position
        return int(self.weight_bytes + max(linear, self.pair_bytes * positions * positions))

    @classmethod
    def from_terms(cls, terms: Mapping[str, Any]) -> MemoryModel:
        """The model from a decoder adapter's ``memory_terms`` (`farm.decoders.memory_model`)."""
        return cls(
            weight_bytes=int(terms["weight_bytes"]),
            bytes_per_pixel=float(terms["bytes_per_pixel"]),
            pair_bytes=float(terms.get("pair_bytes", 0.0)),
            pixels_per_position=float(terms.get("pixels_per_position", 1.0)),
            const_bytes=float(terms.get("const_bytes", 0.0)),
            bytes_per_frame_pixel=float(terms.get("bytes_per_frame_pixel", 0.0)),
            native_conv=tuple((int(c), float(b)) for c, b in terms.get("native_conv", ())),
        )
