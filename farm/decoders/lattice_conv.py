"""3-D convolutions computed in blocks laid on the shot's lattice, so a tile's outputs carry the whole
decode's bits.

cuDNN picks a convolution's algorithm from its input's shape, and the algorithms round differently. In
bf16 a tile (its block plus halo) convolved in one call gets other last bits than the untiled decode for
outputs far from its cut (HunyuanVideo on an H100: the first up block's convolution of a tile with halo 24
differs in 0.07 % of its outputs, over 80 % of its rows), and a decoder with random weights carries those
bits to the pixels (docs/fidelity.md "Bits of a tile"). Placed (`placed`), a convolution instead runs in
calls of one shape: output blocks of `BLOCK` latent rows and columns at the layer's scale, on the lattice
of such blocks counted from the shot's first row and column. The untiled decode and every tile then
compute each output with the same algorithm at the same place in its block: bit for bit the same, except
within a block or two of the cut, where the inputs differ anyway.

`install` rebinds ``_conv_forward`` on a model's ``nn.Conv3d`` instances (stride and dilation 1 across
space); outside `placed`, or where a layer's rows and columns are not a whole multiple of the decoded
latent block's, a convolution runs as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Latent rows and columns per output block: 64 pixels at a decoder's full resolution of 8x. HunyuanVideo's
# untiled decode of 17x480x832 in bf16 on an H100: 1.07 s with 8, 0.91 s with 16 (fewer, larger calls),
# 0.74 s with cuDNN's choice per shape. A decode computes up to a block less one beyond each side of what it
# decodes, which on a small clip is most of the work (a 9x64x96 clip on a CPU peaked at 82 MB with 8,
# 149 MB with 16).
BLOCK = 8


@dataclass(frozen=True)
class Place:
    """Where a decode call's latent block lies in its shot: its first latent row and column, its latent
    rows and columns, and the block size (latent units) of the lattice its convolutions run on."""

    origin: tuple[int, int]
    size: tuple[int, int]
    block: int


_PLACE: contextvars.ContextVar[Place | None] = contextvars.ContextVar("farm_lattice_place", default=None)


@contextlib.contextmanager
def placed(origin: tuple[int, int], size: tuple[int, int], block: int | None = None) -> Iterator[None]:
    """Convolutions of installed models run on the shot's lattice of `block` (default `BLOCK`) latent rows
    and columns while inside (this thread's context)."""
    place = Place((int(origin[0]), int(origin[1])), (int(size[0]), int(size[1])), int(block or BLOCK))
    token = _PLACE.set(place)
    try:
        yield
    finally:
        _PLACE.reset(token)


def _padded(conv: Any, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """`x` padded across space as `conv` pads it; the temporal padding left to the call (zeros) or done."""
    import torch.nn.functional as F

    from farm.decoders.reflect_pad import reflect_pad_hw

    pw, _, ph, _, pt, _ = conv._reversed_padding_repeated_twice
    if conv.padding_mode == "zeros":
        return (F.pad(x, (pw, pw, ph, ph)) if ph or pw else x), (pt, 0, 0)
    if conv.padding_mode == "reflect" and pt == 0:
        return (reflect_pad_hw(x, ph, pw) if ph or pw else x), (0, 0, 0)
    return F.pad(x, conv._reversed_padding_repeated_twice, mode=conv.padding_mode), (0, 0, 0)


def _window(x: torch.Tensor, top: int, left: int, rows: int, cols: int) -> torch.Tensor:
    """``x[..., top:top+rows, left:left+cols]`` as a contiguous tensor, zeros where it runs past `x`."""
    height, width = x.shape[-2:]
    if top >= 0 and left >= 0 and top + rows <= height and left + cols <= width:
        return x[..., top : top + rows, left : left + cols].contiguous()
    out = x.new_zeros((*x.shape[:-2], rows, cols))
    r0, r1, c0, c1 = max(0, top), min(height, top + rows), max(0, left), min(width, left + cols)
    if r0 < r1 and c0 < c1:
        out[..., r0 - top : r1 - top, c0 - left : c1 - left] = x[..., r0:r1, c0:c1]
    return out


def lattice_conv3d(conv: Any, x: torch.Tensor, weight: torch.Tensor, bias: Any, place: Place) -> Any:
    """`conv` over `x` in output blocks on the shot's lattice; None where the layer cannot be placed."""
    import torch.nn.functional as F

    padded, call_padding = _padded(conv, x)
    kh, kw = weight.shape[-2:]
    rows, cols = padded.shape[-2] - kh + 1, padded.shape[-1] - kw + 1
    if rows <= 0 or cols <= 0 or rows % place.size[0] or cols % place.size[1]:
        return None
    sh, sw = rows // place.size[0], cols // place.size[1]
    bh, bw = place.block * sh, place.block * sw
    top, left = place.origin[0] * sh, place.origin[1] * sw  # the shot's output row and column of local (0, 0)
    out = None
    for br in range(top // bh, (top + rows - 1) // bh + 1):
        i0 = br * bh - top  # the block's first output row, local
        for bc in range(left // bw, (left + cols - 1) // bw + 1):
            j0 = bc * bw - left
            piece = _window(padded, i0, j0, bh + kh - 1, bw + kw - 1)
            y = F.conv3d(piece, weight, bias, conv.stride, call_padding, conv.dilation, conv.groups)
            if out is None:
                out = y.new_empty((*y.shape[:-2], rows, cols))
            a0, a1, b0, b1 = max(0, -i0), min(bh, rows - i0), max(0, -j0), min(bw, cols - j0)
            out[..., i0 + a0 : i0 + a1, j0 + b0 : j0 + b1] = y[..., a0:a1, b0:b1]
    return out


def _placeable(conv: Any) -> bool:
    import torch.nn as nn

    return (
        isinstance(conv, nn.Conv3d) and not isinstance(conv.padding, str)
        and tuple(conv.stride[1:]) == (1, 1) and tuple(conv.dilation[1:]) == (1, 1)
    )  # fmt: skip


def _lattice_conv_forward(self: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    place = _PLACE.get()
    if place is not None:
        out = lattice_conv3d(self, input, weight, bias, place)
        if out is not None:
            return out
    return self._unplaced_conv_forward(input, weight, bias)


def install(model: Any) -> int:
    """Every placeable ``nn.Conv3d`` of `model` runs on the lattice inside `placed`; returns how many.
    A convolution's own ``_conv_forward`` (a class's, or one rebound before, as `reflect_pad`'s) runs
    outside and is kept."""
    count = 0
    for module in model.modules():
        if _placeable(module) and "_unplaced_conv_forward" not in module.__dict__:
            module._unplaced_conv_forward = module._conv_forward
            module._conv_forward = types.MethodType(_lattice_conv_forward, module)
            count += 1
    return count


def uninstall(model: Any) -> int:
    """Undo `install`: `model`'s convolutions run as cuDNN picks, placed or not; returns how many."""
    count = 0
    for module in model.modules():
        if "_unplaced_conv_forward" in module.__dict__:
            before = module.__dict__.pop("_unplaced_conv_forward")
            if getattr(before, "__func__", None) is type(module)._conv_forward:
                del module.__dict__["_conv_forward"]  # the class's own again
            else:
                module._conv_forward = before
            count += 1
    return count
