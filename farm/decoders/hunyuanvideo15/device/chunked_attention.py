"""HunyuanVideo 1.5's middle-block attention with its causal mask, in calls torch computes correctly.

diffusers' ``HunyuanVideo15AttnBlock`` attends (one head) over every latent position of its input
(``n = F*H*W``) with a dense causal mask ``[n, n]`` built row by row in Python, in one SDPA call. Past
2^32 mask elements (``n`` > 65 536, e.g. a 16x60x104 latent: 99 840) torch's efficient kernel reads the
wrong mask rows (pytorch/pytorch#187227, `farm.decoders.chunked_sdpa`).

`ChunkedHunyuanVideo15AttnBlock` computes the same (the same norm, projections and mask values: 0 where the
key's frame is not after the query's, else -inf) but builds the mask's rows per block of queries and calls
SDPA per block, below 2^31 scores each. Imported where a model is loaded (it imports torch and diffusers).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

from farm.decoders import chunked_sdpa as limits
from farm.decoders.chunked_sdpa import chunked_sdpa


def causal_mask_rows(rows: range, per_frame: int, keys: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Rows `rows` of diffusers' ``prepare_causal_attention_mask(frames, per_frame)``: ``[rows, keys]``."""
    query_frame = torch.arange(rows.start, rows.stop, device=device) // per_frame
    key_frame = torch.arange(keys, device=device) // per_frame
    mask = torch.where(key_frame[None, :] <= query_frame[:, None], 0.0, float("-inf"))
    return mask.to(dtype)


def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, per_frame: int
) -> torch.Tensor:
    """SDPA of ``[b, 1, n, c]`` under the causal mask, each block of query rows with its own mask rows."""
    n = query.shape[-2]
    step = max(1, limits.MAX_SCORES_PER_CALL // n)
    out = torch.empty_like(query)
    for q0 in range(0, n, step):
        rows = range(q0, min(q0 + step, n))
        # [b, rows, n], the shape diffusers passes: torch's CPU kernels round differently for a 2-D mask
        mask = causal_mask_rows(rows, per_frame, n, query.dtype, query.device).expand(query.shape[0], -1, -1)
        block = slice(rows.start, rows.stop)
        out[..., block, :] = chunked_sdpa(query[..., block, :], key, value, mask)
    return out


class ChunkedHunyuanVideo15AttnBlock(HunyuanVideo15AttnBlock):
    """``HunyuanVideo15AttnBlock`` (the same parameters) whose attention runs by `masked_attention`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        x = self.norm(x)
        query, key, value = self.to_q(x), self.to_k(x), self.to_v(x)
        batch_size, channels, frames, height, width = query.shape

        def tokens(t: torch.Tensor) -> torch.Tensor:
            flat = t.reshape(batch_size, channels, frames * height * width)
            return flat.permute(0, 2, 1).unsqueeze(1).contiguous()

        x = masked_attention(tokens(query), tokens(key), tokens(value), height * width)
        x = x.squeeze(1).reshape(batch_size, frames, height, width, channels).permute(0, 4, 1, 2, 3)
        return self.proj_out(x) + identity


def install(model: Any) -> None:
    """Make every attention block of `model`'s decoder middle block a `ChunkedHunyuanVideo15AttnBlock`."""
    for attn in getattr(model.decoder.mid_block, "attentions", ()):
        if type(attn) is HunyuanVideo15AttnBlock:
            attn.__class__ = ChunkedHunyuanVideo15AttnBlock
