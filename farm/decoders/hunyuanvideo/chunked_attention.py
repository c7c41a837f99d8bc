"""HunyuanVideo's middle-block attention with its causal mask, in calls torch computes correctly.

diffusers runs the VAE's middle-block ``Attention`` over every latent position of the input (``n = F*H*W``)
with a dense causal mask ``[n, n]``. torch's memory-efficient SDPA kernel, given an explicit mask, computes
with 32-bit offsets: once ``queries x keys`` passes 2^32 (``n`` > 65 536 here) every query row past
``2^32 / n`` reads the wrong mask row and its output is silently wrong (pytorch/pytorch#187227); rows that
read a fully masked row come out NaN. A 16x60x104 latent (``n`` = 99 840, a 61x480x832 shot) decoded in
bfloat16 on an H200 returned NaN everywhere.

`ChunkedMaskAttnProcessor` computes what diffusers' ``AttnProcessor2_0`` computes, but calls SDPA on blocks
of query rows (with the same rows of the mask) so that no call holds more than 2^31 query-key pairs
(`farm.decoders.chunked_sdpa`). Attention rows are independent of each other: the blocks change nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from farm.decoders.chunked_sdpa import chunked_sdpa

if TYPE_CHECKING:
    import torch


class ChunkedMaskAttnProcessor:
    """diffusers' ``AttnProcessor2_0`` (self- or cross-attention, optional mask, group norm, residual) with
    its one SDPA call split by `chunked_sdpa`."""

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        hidden_states = chunked_sdpa(query, key, value, attention_mask)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return hidden_states / attn.rescale_output_factor


def install(model: Any) -> None:
    """Give every attention of `model`'s decoder middle block the chunked processor."""
    for attn in getattr(model.decoder.mid_block, "attentions", ()):
        if attn is not None:
            attn.set_processor(ChunkedMaskAttnProcessor())
