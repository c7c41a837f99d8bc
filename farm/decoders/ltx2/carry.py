"""LTX-2's decoder run on a temporal chunk with its causal state carried in from the chunk before.

A causal LTX-2 decoder looks back in time only through its causal 3-D convolutions: each pads its
input on the left with ``kernel - 1`` copies of the first frame, and each temporal upsampler drops its
first ``stride - 1`` output frames (the first latent frame decodes to one pixel frame). Everything
else works frame by frame (per-pixel RMS norms, channel norms, the timestep's scale and shift). So a
shot decodes chunk after chunk, equal to the whole decode up to float rounding, when every causal
convolution pads a later chunk with the last ``kernel - 1`` input frames it saw in the chunk before
(instead of copies of the chunk's first frame), and only the first chunk's upsamplers drop frames.

`decode_with_state` swaps in those forwards for one call (the model is used by one thread at a time:
the adapter's lock) and puts the originals back. The state is a list of tensors, one per causal
convolution in module order, on the decoder's device: at the LTX-2 architecture, ≈ 2 frames of every
layer's activations (a few hundred MB for a 704x1216 tile in bf16).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

State = list  # list[torch.Tensor]: each causal convolution's last input frames, in module order


def decode_with_state(
    decoder: Any, z: torch.Tensor, temb: torch.Tensor | None, state: State | None
) -> tuple[torch.Tensor, State]:
    """``decoder(z, temb)`` (a causal `LTX2VideoDecoder3d`) for a chunk that follows the one `state`
    came from (None: the tile's first chunk). Returns the chunk's output and the state after it."""
    from diffusers.models.autoencoders import autoencoder_kl_ltx2 as ltx2

    first = state is None
    convs = [m for m in decoder.modules() if isinstance(m, ltx2.LTX2VideoCausalConv3d)]
    upsamplers = [m for m in decoder.modules() if isinstance(m, ltx2.LTX2VideoUpsampler3d)]
    if state is not None and len(state) != len(convs):
        raise ValueError(f"carried state of {len(state)} convolutions; this decoder has {len(convs)}")
    before: State = [None] * len(convs) if state is None else state
    after: State = [None] * len(convs)
    for i, conv in enumerate(convs):
        conv.forward = types.MethodType(_carried_conv(i, before[i], after), conv)  # type: ignore[method-assign]
    for up in upsamplers:
        up.forward = types.MethodType(_carried_upsample(first), up)  # type: ignore[method-assign]
    try:
        out = decoder(z, temb, causal=True)
    finally:
        for module in (*convs, *upsamplers):
            del module.forward  # the class's forward again
    return out, after


def _carried_conv(i: int, before: torch.Tensor | None, after: State) -> Any:
    def forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        import torch

        k = self.kernel_size[0]
        pad = x[:, :, :1].repeat((1, 1, k - 1, 1, 1)) if before is None else before
        full = torch.cat([pad, x], dim=2)
        # a copy: a view would keep the whole activation alive until the next chunk
        after[i] = full[:, :, full.shape[2] - (k - 1) :].clone()
        return self.conv(full)

    return forward


def _carried_upsample(first: bool) -> Any:
    def forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        b, _, f, h, w = x.shape
        st, sh, sw = self.stride

        def to_space(t: torch.Tensor) -> torch.Tensor:  # as the class's forward, frames dropped only first
            t = t.reshape(b, -1, st, sh, sw, f, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            t = t.flatten(6, 7).flatten(4, 5).flatten(2, 3)
            return t[:, :, st - 1 :] if first else t

        y = to_space(self.conv(x, causal=True))
        if self.residual:
            y = y + to_space(x).repeat(1, (st * sh * sw) // self.upscale_factor, 1, 1, 1)
        return y

    return forward
