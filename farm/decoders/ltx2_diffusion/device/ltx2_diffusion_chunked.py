"""LTX-2.5's diffusion decoder (diffusers' `LTX2VideoDiffusionDecoder3d`) run in runs of frames, so that
a decode holds its stage's residual stream, the context and one run's temporaries, never a whole stage's.

The same computation as diffusers' forward, reordered: every part of a block but the attention is
pointwise over tokens, so it runs on one run of frames at a time (the SwiGLU's hidden width, the norms'
float32 copies, the upsamplers' pixel shuffles). The attention of a run of frames ``[t0, t1)`` reads the
keys of its windows, frames ``[s(t0), s(t1 - 1) + k)``: their Q/K/V are projected for those frames alone
(rotary positions are the frames' places in the whole grid, so the scores are the whole grid's), and its
output is added to the residual stream once no later run reads those frames' old values. A spatial tile is
told its place in the shot (`origin`): its rotary positions and the attention kernel's tiles of queries are
then the shot's, so it rounds as the untiled decode does wherever its inputs are the untiled decode's.

Attention: `farm.decoders.ltx2_diffusion.device.na_triton` (one fused kernel, queries of the run against the
key frames) where Triton runs; elsewhere the blocked SDPA path
(`farm.decoders.ltx2_diffusion.neighborhood_attention`) over the key frames, keeping the run's rows. Both are
the windowed definition; the decode equals diffusers' within float summation order
(`tests/test_diffusion_decoder.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from farm.decoders.ltx2_diffusion.device import na_triton
from farm.decoders.ltx2_diffusion.neighborhood_attention import neighborhood_attention as blocked_attention

# Tokens a run of frames holds (its key frames hold up to a window more): bounds the temporaries.
CHUNK_TOKENS = 1 << 21
# Fewest frames a run holds, whatever the frame size: a run's keys reach a window's half beyond it on
# each side, so short runs re-project most of their keys. Runs are whole multiples of it, so they start on
# the attention kernel's lattice of query tiles (at most 8 frames deep) in a spatial tile as in the shot.
MIN_CHUNK_FRAMES = 8
# Tokens of one SwiGLU call: its two hidden-width tensors are the largest temporaries of a block.
MLP_TOKENS = 1 << 19


def chunk_frames(frames: int, height: int, width: int, tokens: int = CHUNK_TOKENS) -> int:
    size = max(MIN_CHUNK_FRAMES, tokens // (height * width))
    return max(1, min(frames, size - size % MIN_CHUNK_FRAMES))


def runs(frames: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, frames)) for a in range(0, frames, size)]


def window_start(i: int, n: int, k: int) -> int:
    return min(max(i - k // 2, 0), n - k)


def key_frames(t0: int, t1: int, frames: int, kernel_t: int) -> tuple[int, int]:
    """The frames the windows of queries ``[t0, t1)`` cover."""
    k = min(kernel_t, frames)
    return window_start(t0, frames, k), window_start(t1 - 1, frames, k) + k


def rotate(attn: Any, x: torch.Tensor, first_frame: int, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """diffusers' 3-D rotary embedding of `x` ``[B, T, H, W, heads, d]`` whose frames start at
    `first_frame` of the grid and whose rows and columns at `origin` of the shot's (diffusers' own forward
    numbers a tensor's positions from 0). Scores depend on the positions' differences alone; the shot's
    positions give a spatial tile the rotated values, and so the rounding, of the untiled decode."""
    rope = attn.rope
    dim_t, dim_h, _ = rope.rope_dim_split
    frames, height, width = x.shape[1:4]
    device = x.device
    inv_t, inv_h, inv_w = (rope._inv_freqs(dim, device) for dim in rope.rope_dim_split)
    pos_t = torch.arange(first_frame, first_frame + frames, dtype=torch.float32, device=device)
    pos_h = torch.arange(origin[0], origin[0] + height, dtype=torch.float32, device=device)
    pos_w = torch.arange(origin[1], origin[1] + width, dtype=torch.float32, device=device)
    return torch.cat([rope._rotate_axis(x[..., :dim_t], pos_t, inv_t, axis=1),
                      rope._rotate_axis(x[..., dim_t : dim_t + dim_h], pos_h, inv_h, axis=2),
                      rope._rotate_axis(x[..., dim_t + dim_h :], pos_w, inv_w, axis=3)], dim=-1)  # fmt: skip


def attend(attn: Any, h: torch.Tensor, first_key_frame: int, q_offset: int, q_frames: int,
           origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """`attn`'s output (after its out projection) for frames ``q_offset + [0, q_frames)`` of `h`, the
    normalised input of the key frames that start at `first_key_frame` of the grid, its first row and
    column at `origin` of the shot's grid."""
    batch, frames, height, width, _ = h.shape
    shape = (batch, -1, height, width, attn.heads, attn.head_dim)
    fused = na_triton.usable_on(h.device)
    hq = h[:, q_offset : q_offset + q_frames] if fused else h
    query = rotate(attn, attn.norm_q(attn.to_q(hq).view(shape)) * attn.scale,
                   first_key_frame + (q_offset if fused else 0), origin)  # fmt: skip
    key = rotate(attn, attn.norm_k(attn.to_k(h).view(shape)), first_key_frame, origin)
    value = attn.to_v(h).view(shape)
    kernel = tuple(attn.kernel_size)
    if fused:
        out = na_triton.neighborhood_attention(query, key, value, kernel, scale=1.0, q_frame_offset=q_offset,
                                               grid_origin=origin)  # fmt: skip
    else:
        out = blocked_attention(query, key, value, kernel, scale=1.0)[:, q_offset : q_offset + q_frames]
    del query, key, value
    return attn.to_out[0](out.reshape(batch, q_frames, height, width, attn.heads * attn.head_dim))


def add_attention(attn: Any, x: torch.Tensor, prenorm: Callable[[torch.Tensor], torch.Tensor],
                  tokens: int, origin: tuple[int, int] = (0, 0)) -> None:  # fmt: skip
    """``x += attn(prenorm(x))`` in place, a run of frames at a time; `x`'s first row and column lie at
    `origin` of the shot's grid."""
    frames, height, width = x.shape[1:4]
    if any(n < k for n, k in zip((frames, height, width), attn.kernel_size, strict=True)):
        raise ValueError(  # diffusers' refusal, word for word (`LTX2VideoVaeNeighborhoodAttention.forward`)
            "Neighborhood attention requires each spatial dim to be at least its kernel size; got "
            f"(T, H, W) = ({frames}, {height}, {width}) with kernel_size {tuple(attn.kernel_size)}."
        )
    spans = runs(frames, chunk_frames(frames, height, width, tokens))
    keys = [key_frames(a, b, frames, attn.kernel_size[0]) for a, b in spans]
    pending: list[tuple[int, int, torch.Tensor]] = []
    for i, ((t0, t1), (k0, k1)) in enumerate(zip(spans, keys, strict=True)):
        delta = attend(attn, prenorm(x[:, k0:k1]), k0, t0 - k0, t1 - t0, origin)
        pending.append((t0, t1, delta))
        next_k0 = keys[i + 1][0] if i + 1 < len(spans) else frames
        while pending and pending[0][1] <= next_k0:  # no later run reads these frames' old values
            a, b, d = pending.pop(0)
            x[:, a:b] += d
    assert not pending


def add_pointwise(x: torch.Tensor, fn: Callable[[int, int], torch.Tensor], tokens: int) -> None:
    """``x[:, a:b] += fn(a, b)`` over runs of frames (a token-wise residual branch)."""
    frames, height, width = x.shape[1:4]
    for a, b in runs(frames, max(1, tokens // (height * width))):
        x[:, a:b] += fn(a, b)


def swiglu(mlp: Any, h: torch.Tensor) -> torch.Tensor:
    gate = mlp.w_gate(h)
    F.silu(gate, inplace=True)
    gate *= mlp.w_up(h)
    return mlp.w_down(gate)


def na_block(block: Any, x: torch.Tensor, tokens: int, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """diffusers' `LTX2VideoVaeNABlock.forward`, in place on `x`."""
    add_attention(block.attn, x, block.norm1, tokens, origin)
    add_pointwise(x, lambda a, b: swiglu(block.mlp, block.norm2(x[:, a:b])), MLP_TOKENS)
    return x


def diffusion_block(block: Any, x: torch.Tensor, context: torch.Tensor, modulation: tuple[torch.Tensor, ...],
                    tokens: int, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """diffusers' `LTX2VideoVaeDiffusionNABlock.forward`, in place on `x`."""
    table = block.scale_shift_table
    mods = [modulation[i] + table[i].view(1, 1, 1, 1, -1) for i in range(block.num_mod_params)]
    scale_msa, shift_msa, _, scale_mlp, shift_mlp, _, _ = mods
    add_pointwise(x, lambda a, b: block.context_proj(context[:, a:b]), tokens)
    add_attention(block.attn, x, lambda h: block.norm1(h) * (1 + scale_msa) + shift_msa, tokens, origin)
    add_pointwise(x, lambda a, b: swiglu(block.mlp, block.norm2(x[:, a:b]) * (1 + scale_mlp) + shift_mlp),
                  MLP_TOKENS)  # fmt: skip
    return x


def scaled(origin: tuple[int, int], sh: int, sw: int) -> tuple[int, int]:
    """A row and column at a grid `sh` and `sw` times as fine (the upsamplers' strides multiply)."""
    return origin[0] * sh, origin[1] * sw


def upsample(up: Any, x: torch.Tensor, drop_leading_frame: bool, tokens: int) -> torch.Tensor:
    """diffusers' `LTX2VideoVaePixelShuffleUpsampler.forward`, its projection a run of frames at a time."""
    batch, frames, height, width, _ = x.shape
    st, sh, sw = up.stride
    out = torch.empty((batch, frames * st, height * sh, width * sw, up.out_channels), dtype=x.dtype,
                      device=x.device)  # fmt: skip
    for a, b in runs(frames, max(1, tokens // (height * width * math.prod(up.stride)))):
        y = up.proj(x[:, a:b]).reshape(batch, b - a, height, width, up.out_channels, st, sh, sw)
        out[:, a * st : b * st] = y.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(
            batch, (b - a) * st, height * sh, width * sw, up.out_channels
        )
    return out[:, 1:] if st == 2 and drop_leading_frame else out


def context(decoder: Any, z: torch.Tensor, tokens: int = CHUNK_TOKENS, origin: tuple[int, int] = (0, 0)
            ) -> torch.Tensor:  # fmt: skip
    """`forward_stage_4(forward_stages_1_to_3(z))`: the latent ``[B, C, T, H, W]`` to stage 5's context;
    `origin`: the latent's first row and column in the shot's latent."""
    x = early_stages(decoder, z, len(decoder.det_stages), tokens, origin)
    return late_stages(decoder, x, len(decoder.det_stages), z.shape[3:], tokens, origin)


def early_stages(decoder: Any, z: torch.Tensor, stages: int, tokens: int = CHUNK_TOKENS,
                 origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """The latent ``[B, C, T, H, W]`` (its trailing frames padded, as diffusers does) through ``conv_in``
    and the blocks of the first `stages` stages, each stage but the last followed by its upsampler:
    channels last ``[B, T', H', W', C']``."""
    pad = decoder.trailing_pad_latent_frames
    if pad > 0:
        z = torch.cat([z, z[:, :, -1:].expand(-1, -1, pad, -1, -1)], dim=2)
    x = decoder.conv_in(z.permute(0, 2, 3, 4, 1))
    for stage in range(stages):
        if stage:
            x = upsample(decoder.upsamples[stage - 1], x, True, tokens)
        at = scaled(origin, x.shape[2] // z.shape[3], x.shape[3] // z.shape[4])
        for block in decoder.det_stages[stage]:
            x = na_block(block, x, tokens, at)
    return x


def late_stages(decoder: Any, x: torch.Tensor, stages: int, latent_hw: Sequence[int],
                tokens: int = CHUNK_TOKENS, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """`early_stages`' output after its first `stages` stages → stage 5's context (the trailing pad
    dropped); `latent_hw`: the latent's rows and columns, `origin` its first row and column in the shot's."""
    pad = decoder.trailing_pad_latent_frames
    last = len(decoder.det_stages) - 1
    for stage in range(stages - 1, len(decoder.det_stages)):
        if stage >= stages:
            at = scaled(origin, x.shape[2] // latent_hw[0], x.shape[3] // latent_hw[1])
            for block in decoder.det_stages[stage]:
                x = na_block(block, x, tokens, at)
        x = upsample(decoder.upsamples[stage], x, True, tokens)
        if stage == last and pad > 0:
            x = x[:, : -pad * decoder.temporal_compression_ratio]
    return x


def diffusion_step(decoder: Any, ctx: torch.Tensor, x_t: torch.Tensor, timestep: torch.Tensor,
                   tokens: int = CHUNK_TOKENS, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """`forward_diffusion_step`: the model's prediction ``[B, C, F, H, W]``; `origin`: the context's first
    row and column in the shot's context grid."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import _patchify, _unpatchify

    t_emb = decoder.t_embedder(
        decoder.timestep_scale_multiplier * timestep,
        resolution=None,
        aspect_ratio=None,
        batch_size=timestep.shape[0],
        hidden_dtype=ctx.dtype,
    )
    modulation = decoder.shared_adaln(t_emb)
    x = decoder.conv_in_x_t(_patchify(x_t, decoder.patch_size).permute(0, 2, 3, 4, 1))
    for block in decoder.diff_blocks:
        x = diffusion_block(block, x, ctx, modulation, tokens, origin)
    batch, frames, height, width, _ = x.shape
    out = torch.empty((batch, frames, height, width, decoder.conv_out.out_features), dtype=x.dtype,
                      device=x.device)  # fmt: skip
    for a, b in runs(frames, max(1, tokens // (height * width))):
        out[:, a:b] = decoder.conv_out(decoder.norm_out(x[:, a:b]))
    del x
    return _unpatchify(out.permute(0, 4, 1, 2, 3).contiguous(), decoder.patch_size)


def denoise(decoder: Any, ctx: torch.Tensor, x_t: torch.Tensor, steps: int,
            tokens: int = CHUNK_TOKENS, origin: tuple[int, int] = (0, 0)) -> torch.Tensor:  # fmt: skip
    """`LTX2VideoDiffusionDecoder3d.denoise` with `diffusion_step`; `origin` as `diffusion_step`'s."""
    batch = ctx.shape[0]
    timesteps = torch.linspace(1.0, 1.0 / steps, steps, device=ctx.device, dtype=torch.float32)
    if steps == 1 and decoder.model_output_type == "x0":
        return diffusion_step(decoder, ctx, x_t, timesteps[:1].expand(batch), tokens, origin)
    for i in range(steps):
        t_now = timesteps[i].expand(batch)
        t_next = timesteps[i + 1] if i + 1 < steps else torch.zeros_like(t_now)
        model_out = diffusion_step(decoder, ctx, x_t, t_now, tokens, origin).float()
        x_f = x_t.float()
        if decoder.model_output_type == "x0":
            model_out = (x_f - model_out) / t_now.view(-1, *([1] * (x_t.ndim - 1)))
        x_t = (x_f - (t_now - t_next).view(-1, *([1] * (x_t.ndim - 1))) * model_out).to(x_t.dtype)
    return x_t


def to_latent_grid(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """Channels-last ``[B, T, h*sh, w*sw, C]`` → ``[B, C*sh*sw, T, h, w]``: each latent position's
    ``sh x sw`` finer positions as channels, so the tensor is indexed (cropped, sliced) like the latent."""
    batch, frames, height, width, channels = x.shape
    x = x.reshape(batch, frames, height // sh, sh, width // sw, sw, channels)
    x = x.permute(0, 6, 3, 5, 1, 2, 4)
    return x.reshape(batch, channels * sh * sw, frames, height // sh, width // sw)


def from_latent_grid(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """`to_latent_grid`'s inverse."""
    batch, packed, frames, height, width = x.shape
    x = x.reshape(batch, packed // (sh * sw), sh, sw, frames, height, width)
    return x.permute(0, 4, 5, 2, 6, 3, 1).reshape(batch, frames, height * sh, width * sw, packed // (sh * sw))
