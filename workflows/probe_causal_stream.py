"""Probe: can LTX-2's decoder stream a shot chunk by chunk without re-decoding its causal context?

Decodes one random latent whole, then in temporal chunks of N latent frames, where every causal
convolution keeps its last ``kernel - 1`` input frames from the previous chunk (instead of padding each
chunk with its first frame) and the upsamplers drop their first ``stride - 1`` frames only in the first
chunk, as a whole decode does. Prints, per chunk size, the largest difference from the whole decode
and whether 8-bit frames are equal. The decoder's other temporal operations are per frame (per-pixel
RMS norms, LayerNorm over channels), so nothing else carries state.

    python workflows/probe_causal_stream.py --config ltx2-tiny --frames 7 --chunks 1 2 3

Measured on the CPU (2026-12-01, ltx2-tiny, float32, 7 latent frames at 4x6): chunks of 1, 2 and 3
latent frames all give the whole decode's 49 frames to within 2.6e-6 (float rounding of convolutions
over other lengths); the LTX-2 architecture itself (random weights, 5 latent frames at 2x3, chunks of 2)
to within 1.2e-5. Not bit-identical: 8-bit frames differ in a few levels' roundings.
"""

from __future__ import annotations

import argparse
import types
from typing import Any


def carry_state(decoder: Any) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
    """Make `decoder`'s causal convolutions and upsamplers stream; returns the shared state (set
    ``state["first"] = False`` after the first chunk) and what to restore."""
    import torch
    from diffusers.models.autoencoders import autoencoder_kl_ltx2 as ltx2

    state: dict[str, Any] = {"first": True, "tails": {}}
    restore = []

    def conv_forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        k = self.kernel_size[0]
        tail = state["tails"].get(id(self))
        pad = x[:, :, :1].repeat((1, 1, k - 1, 1, 1)) if tail is None else tail
        full = torch.cat([pad, x], dim=2)
        state["tails"][id(self)] = full[:, :, full.shape[2] - (k - 1) :].clone()
        return self.conv(full)

    def upsample_forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        b, _, f, h, w = x.shape
        st, sh, sw = self.stride

        def to_space(t: torch.Tensor) -> torch.Tensor:
            t = t.reshape(b, -1, st, sh, sw, f, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            t = t.flatten(6, 7).flatten(4, 5).flatten(2, 3)
            return t[:, :, st - 1 :] if state["first"] else t

        y = to_space(self.conv(x, causal=causal))
        if self.residual:
            y = y + to_space(x).repeat(1, (st * sh * sw) // self.upscale_factor, 1, 1, 1)
        return y

    for module in decoder.modules():
        if isinstance(module, ltx2.LTX2VideoCausalConv3d):
            restore.append((module, module.forward))
            module.forward = types.MethodType(conv_forward, module)
        elif isinstance(module, ltx2.LTX2VideoUpsampler3d):
            restore.append((module, module.forward))
            module.forward = types.MethodType(upsample_forward, module)
    return state, restore


def main() -> None:
    import torch
    from diffusers.models.autoencoders import autoencoder_kl_ltx2 as ltx2

    from farm.decoders.ltx2 import LTX2_TINY

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=["ltx2-tiny", "ltx2"], default="ltx2-tiny")
    p.add_argument("--frames", type=int, default=7, help="latent frames")
    p.add_argument("--size", default="4x6", help="latent height x width")
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 3], help="latent frames per chunk")
    args = p.parse_args()
    torch.manual_seed(0)
    vae = ltx2.AutoencoderKLLTX2Video(**(LTX2_TINY if args.config == "ltx2-tiny" else {})).eval()
    h, w = (int(x) for x in args.size.split("x"))
    z = torch.randn(1, vae.config.latent_channels, args.frames, h, w)

    def levels(t: torch.Tensor) -> torch.Tensor:
        return ((t.clamp(-1, 1) + 1) / 2 * 255).round().to(torch.uint8)

    with torch.inference_mode():
        whole = vae.decoder(z)
        for n in args.chunks:
            state, restore = carry_state(vae.decoder)
            parts = []
            for start in range(0, args.frames, n):
                parts.append(vae.decoder(z[:, :, start : start + n]))
                state["first"] = False
            for module, forward in restore:
                module.forward = forward
            streamed = torch.cat(parts, dim=2)
            sizes = [part.shape[2] for part in parts]
            print(f"chunks of {n}: frames {sizes} (whole {whole.shape[2]}), largest "
                  f"difference {(whole - streamed).abs().max().item():.2g}, 8-bit frames equal: "
                  f"{torch.equal(levels(whole), levels(streamed))}")  # fmt: skip


if __name__ == "__main__":
    main()
