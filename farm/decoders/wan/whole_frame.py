"""Wan's decoder in two parts: what sees the whole frame, and what a tile decodes with its halo.

diffusers' ``AutoencoderKLWan`` decodes latent frame by frame, each causal convolution keeping the last
frames of its input in a cache (``feat_cache``, one slot per convolution, filled in call order). The
middle block's self-attention spans the whole frame; everything after it (the up blocks, the output
norm, which normalises over channels only, and the output convolution) reaches a bounded number of
latent rows and columns. So:

* `whole_frame_part`: ``post_quant_conv``, ``conv_in`` and the middle block over the whole frame, frame by
  frame with their own cache: ``[1, C, f, h, w]`` at latent resolution;
* `rest_of_decoder`: the up blocks and the head over a tile's block (plus halo) of that tensor, frame by
  frame with a cache of their own (its slots are only storage: starting them at 0 is the same decode).

Both loops follow ``WanDecoder3d.forward`` and ``AutoencoderKLWan._decode`` (diffusers 0.36).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CACHE_T = 2  # frames each causal convolution keeps (diffusers' CACHE_T)


def _cached_conv(conv: Any, x: torch.Tensor, cache: list, idx: list[int]) -> torch.Tensor:
    """One causal convolution of the decoder's top level, as ``WanDecoder3d.forward`` caches it."""
    import torch

    i = idx[0]
    cache_x = x[:, :, -CACHE_T:].clone()
    if cache_x.shape[2] < 2 and cache[i] is not None:
        cache_x = torch.cat([cache[i][:, :, -1:].to(cache_x.device), cache_x], dim=2)
    out = conv(x, cache[i])
    cache[i] = cache_x
    idx[0] += 1
    return out


def _conv_slots(model: Any) -> int:
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    return sum(isinstance(m, WanCausalConv3d) for m in model.decoder.modules())


def whole_frame_part(model: Any, z: torch.Tensor) -> torch.Tensor:
    """``[1, C, f, h, w]`` (as ``vae.decode`` takes it) → the middle block's output ``[1, C', f, h, w]``."""
    import torch

    decoder = model.decoder
    x = model.post_quant_conv(z)
    cache: list = [None] * _conv_slots(model)
    frames = []
    for i in range(x.shape[2]):
        idx = [0]
        h = _cached_conv(decoder.conv_in, x[:, :, i : i + 1], cache, idx)
        frames.append(decoder.mid_block(h, feat_cache=cache, feat_idx=idx))
    return torch.cat(frames, 2)


def rest_of_decoder(model: Any, shared: torch.Tensor) -> torch.Tensor:
    """A block of `whole_frame_part`'s output ``[1, C', f, h, w]`` → pixels ``[1, 3, F, H, W]`` in
    [-1, 1], as ``vae.decode`` returns them for the same block."""
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    decoder = model.decoder
    cache: list = [None] * _conv_slots(model)
    frames = []
    for i in range(shared.shape[2]):
        idx = [0]
        x = shared[:, :, i : i + 1]
        for up_block in decoder.up_blocks:
            x = up_block(x, feat_cache=cache, feat_idx=idx, first_chunk=i == 0)
        x = decoder.nonlinearity(decoder.norm_out(x))
        frames.append(_cached_conv(decoder.conv_out, x, cache, idx))
    out = torch.cat(frames, 2)
    if model.config.patch_size is not None:
        out = unpatchify(out, patch_size=model.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0)
