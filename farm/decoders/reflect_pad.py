"""Reflection padding for the decoders' 3-D convolutions, copied in slices instead of by
``F.pad(mode="reflect")``.

LTX-2's decoder pads every convolution's input spatially by reflection (``nn.Conv3d`` with
``padding_mode="reflect"``: ``F.pad`` first, then the convolution without padding). On an H200 the
eager decode spends about a quarter of its GPU time in ``reflection_pad3d``, a gather kernel that
computes a source index per output element. The same padded tensor is one strided copy of the input
into the middle of a new tensor plus a few thin copies for the borders, each a plain memory-bound copy.
The padded tensor is the same bit for bit, so the convolution's output is too.

`sliced_reflect_padding` rebinds ``_conv_forward`` on each such convolution of a model (instances
only: the classes stay as they are), or puts the class's back.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def reflect_pad_hw(x: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """``F.pad(x, (pad_w, pad_w, pad_h, pad_h), mode="reflect")`` for ``[..., H, W]``: the rows first,
    then the columns of the padded rows (which reflects the corners as ``F.pad`` does)."""
    height, width = x.shape[-2:]
    if pad_h >= height or pad_w >= width:
        raise ValueError(f"reflect padding ({pad_h}, {pad_w}) needs more than that many rows and columns, "
                         f"got {height}x{width}")  # fmt: skip
    out = x.new_empty((*x.shape[:-2], height + 2 * pad_h, width + 2 * pad_w))
    out[..., pad_h : pad_h + height, pad_w : pad_w + width] = x
    for i in range(pad_h):
        out[..., pad_h - 1 - i, pad_w : pad_w + width] = x[..., i + 1, :]
        out[..., pad_h + height + i, pad_w : pad_w + width] = x[..., height - 2 - i, :]
    for j in range(pad_w):
        out[..., pad_w - 1 - j] = out[..., pad_w + 1 + j]
        out[..., pad_w + width + j] = out[..., pad_w + width - 2 - j]
    return out


def _sliced_conv_forward(self: Any, input: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    import torch.nn.functional as F

    pad_w, _, pad_h, _, _, _ = self._reversed_padding_repeated_twice
    padded = reflect_pad_hw(input, pad_h, pad_w)
    return F.conv3d(padded, weight, bias, self.stride, 0, self.dilation, self.groups)


def _padding_is_sliceable(conv: Any) -> bool:
    import torch.nn as nn

    if not isinstance(conv, nn.Conv3d) or conv.padding_mode != "reflect" or isinstance(conv.padding, str):
        return False
    pad_w0, pad_w1, pad_h0, pad_h1, pad_d0, pad_d1 = conv._reversed_padding_repeated_twice
    return pad_w0 == pad_w1 and pad_h0 == pad_h1 and pad_d0 == pad_d1 == 0 and (pad_w0 > 0 or pad_h0 > 0)


def sliced_reflect_padding(model: Any, on: bool = True) -> int:
    """Every reflect-padded ``nn.Conv3d`` in `model` (spatial padding only, the same on both sides)
    pads by slices from now on (`on`), or by ``F.pad`` again. Returns how many convolutions it set."""
    changed = 0
    for module in model.modules():
        if _padding_is_sliceable(module):
            if on:
                module._conv_forward = types.MethodType(_sliced_conv_forward, module)
            else:
                module.__dict__.pop("_conv_forward", None)
            changed += 1
    return changed
