"""HunyuanVideo's causal upsamplers with their nearest-neighbour interpolation in calls of bounded size.

diffusers' ``HunyuanVideoUpsampleCausal3D`` interpolates a block's first frame and its other frames in one
``F.interpolate`` call each and concatenates them. Decoding a 16x60x104 latent (a 61x480x832 shot) whole in
bfloat16 on an H100 (torch 2.11), the second up block's upsampler took finite activations (largest 8.4)
and handed its convolution NaN: one tensor of 256 x 61 x 480 x 832 = 6.2e9 elements, past 2^32, so every
frame that decode wrote was NaN. `upsample_causal` computes the same tensor channel by channel, each call
under `MAX_ELEMENTS_PER_CALL` output elements, written into one preallocated output (nearest-neighbour
interpolation treats every channel alone: the result is the same, bit for bit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# output elements per interpolation call: below 2^31, clear of 32-bit offsets
MAX_ELEMENTS_PER_CALL = (1 << 31) - 1


def upsample_causal(
    upsampler: Any, hidden_states: torch.Tensor, limit: int = MAX_ELEMENTS_PER_CALL
) -> torch.Tensor:
    """``HunyuanVideoUpsampleCausal3D.forward`` with the interpolation in channel blocks of at most `limit`
    output elements each."""
    import torch
    import torch.nn.functional as F

    b, c, f, h, w = hidden_states.shape
    ft, fh, fw = (int(s) for s in upsampler.upsample_factor)
    frames = 1 + (f - 1) * ft
    out = torch.empty((b, c, frames, h * fh, w * fw), dtype=hidden_states.dtype, device=hidden_states.device)
    per_channel = max(1, out.numel() // max(1, c))
    step = max(1, limit // per_channel)
    for c0 in range(0, c, step):
        block = hidden_states[:, c0 : c0 + step]
        first = F.interpolate(block[:, :, 0], scale_factor=(fh, fw), mode="nearest")
        out[:, c0 : c0 + step, :1] = first[:, :, None]
        if f > 1:
            out[:, c0 : c0 + step, 1:] = F.interpolate(
                block[:, :, 1:].contiguous(), scale_factor=(ft, fh, fw), mode="nearest"
            )
    return upsampler.conv(out)


def install(model: Any) -> None:
    """Give every causal upsampler of `model`'s decoder `upsample_causal` as its forward."""
    for block in model.decoder.up_blocks:
        for upsampler in getattr(block, "upsamplers", None) or ():
            upsampler.forward = upsample_causal.__get__(upsampler)
