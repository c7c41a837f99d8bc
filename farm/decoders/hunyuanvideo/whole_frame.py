"""HunyuanVideo's decoder in two parts: what sees the whole clip at latent resolution, and the rest.

diffusers' ``HunyuanVideoDecoder3D`` runs ``conv_in``, a middle block (GroupNorms over the whole input,
and self-attention over every latent position, causally masked in time), the up blocks and the output
norm. `whole_frame_part` runs ``post_quant_conv``, ``conv_in`` and the middle block over the whole frame;
`rest_of_decoder` runs the up blocks and the head over a tile's block (plus halo) of its output. The up
blocks' and output norm's GroupNorms still take their statistics over what they are given (a tile), so
the split is exact only up to those statistics (docs/fidelity.md "Whole-frame pass": sharing them would
take a reduction across the tiles per GroupNorm, one after another).

The middle block's attention is computed frame by frame (each frame's queries against the keys of its
own and earlier frames: the causal mask's meaning), in blocks of queries, so a whole frame never builds
diffusers' dense ``[n, n]`` mask (1.6 TB for 33 latent frames of 90x160). With no mask and at most
`QUERY_BLOCK_ELEMENTS` scores per call it is also clear of torch's masked-kernel bug past 2^32 scores
(`chunked_attention`, what a tile's own middle block runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

QUERY_BLOCK_ELEMENTS = 1 << 28  # scores computed at once: queries x keys (1 GiB in float32)


def causal_frame_attention(attn: Any, x: torch.Tensor) -> torch.Tensor:
    """diffusers' ``Attention`` (``AttnProcessor2_0`` with the middle block's settings: group norm,
    residual connection) over ``[1, C, f, h, w]``, each frame attending to itself and the frames before."""
    import torch
    import torch.nn.functional as F

    b, c, f, h, w = x.shape
    hidden = x.permute(0, 2, 3, 4, 1).flatten(1, 3)  # [b, f*h*w, c], as HunyuanVideoMidBlock3D flattens
    residual = hidden
    if attn.group_norm is not None:
        hidden = attn.group_norm(hidden.transpose(1, 2)).transpose(1, 2)
    query, key, value = attn.to_q(hidden), attn.to_k(hidden), attn.to_v(hidden)
    head = key.shape[-1] // attn.heads

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, -1, attn.heads, head).transpose(1, 2)

    query, key, value = heads(query), heads(key), heads(value)
    out = torch.empty_like(query)
    per_frame = h * w
    for i in range(f):
        keys = (i + 1) * per_frame
        step = max(1, min(per_frame, QUERY_BLOCK_ELEMENTS // keys))
        for q0 in range(i * per_frame, (i + 1) * per_frame, step):
            q1 = min(q0 + step, (i + 1) * per_frame)
            out[:, :, q0:q1] = F.scaled_dot_product_attention(
                query[:, :, q0:q1], key[:, :, :keys], value[:, :, :keys], dropout_p=0.0, is_causal=False
            )
    hidden = out.transpose(1, 2).reshape(b, -1, attn.heads * head).to(query.dtype)
    hidden = attn.to_out[1](attn.to_out[0](hidden))
    if attn.residual_connection:
        hidden = hidden + residual
    hidden = hidden / attn.rescale_output_factor
    return hidden.unflatten(1, (f, h, w)).permute(0, 4, 1, 2, 3)


def whole_frame_part(model: Any, z: torch.Tensor) -> torch.Tensor:
    """``[1, C, f, h, w]`` (as ``vae.decode`` takes it) → the middle block's output ``[1, C', f, h, w]``."""
    decoder = model.decoder
    mid = decoder.mid_block
    x = mid.resnets[0](decoder.conv_in(model.post_quant_conv(z)))
    for attn, resnet in zip(mid.attentions, mid.resnets[1:], strict=True):
        if attn is not None:
            x = causal_frame_attention(attn, x)
        x = resnet(x)
    return x


def rest_of_decoder(model: Any, shared: torch.Tensor) -> torch.Tensor:
    """A block of `whole_frame_part`'s output → pixels ``[1, 3, F, H, W]`` in [-1, 1]."""
    decoder = model.decoder
    x = shared
    for up_block in decoder.up_blocks:
        x = up_block(x)
    x = decoder.conv_act(decoder.conv_norm_out(x))
    return decoder.conv_out(x)
