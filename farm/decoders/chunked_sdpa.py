"""Scaled dot-product attention with a mask, in calls torch computes correctly.

torch's memory-efficient SDPA kernel, given an explicit ``attn_mask``, addresses the mask with 32-bit
offsets: once ``queries x keys`` of one call passes 2^32, every query row past ``2^32 / keys`` reads the
wrong mask row and its output is silently wrong (pytorch/pytorch#187227; fully masked rows give NaN).
`chunked_sdpa` calls SDPA on blocks of query rows, with the same rows of the mask, each block below
`MAX_SCORES_PER_CALL` scores. Attention rows are independent, so the result is the one call's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# query rows x keys per SDPA call: below 2^31, clear of the kernel's 32-bit offsets
MAX_SCORES_PER_CALL = (1 << 31) - 1


def chunked_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(query, key, value, attn_mask=mask)`` over ``[b, heads, n, d]``, in
    blocks of query rows of at most `MAX_SCORES_PER_CALL` scores each."""
    import torch
    import torch.nn.functional as F

    rows, keys = query.shape[-2], key.shape[-2]
    step = max(1, MAX_SCORES_PER_CALL // max(1, keys))
    if rows <= step:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False
        )
    out = torch.empty((*query.shape[:-1], value.shape[-1]), dtype=query.dtype, device=query.device)
    for q0 in range(0, rows, step):
        q1 = min(q0 + step, rows)
        # a mask broadcast over query rows (size 1 there) applies to every block as it is
        block_mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., q0:q1, :]
        out[..., q0:q1, :] = F.scaled_dot_product_attention(
            query[..., q0:q1, :], key, value, attn_mask=block_mask, dropout_p=0.0, is_causal=False
        )
    return out
