"""Probe: does LTX-2's decoder stream a shot chunk by chunk, its causal state carried, as decoded whole?

Decodes one random latent whole, then in temporal chunks of N latent frames through farm's carried
decode (`farm.decoders.ltx2_carry`, what ``farm render --carry`` runs): every causal convolution keeps
its last ``kernel - 1`` input frames from the previous chunk (instead of padding each chunk with its
first frame) and the upsamplers drop their first ``stride - 1`` frames only in the first chunk, as a
whole decode does. Prints, per chunk size, the largest difference from the whole decode and whether
8-bit frames are equal. The decoder's other temporal operations are per frame (per-pixel RMS norms,
LayerNorm over channels), so nothing else carries state.

    python workflows/probe_causal_stream.py --config ltx2-tiny --frames 7 --chunks 1 2 3

Measured on the CPU (2026-12-01, ltx2-tiny, float32, 7 latent frames at 4x6): chunks of 1, 2 and 3
latent frames all give the whole decode's 49 frames to within 2.6e-6 (float rounding of convolutions
over other lengths); the LTX-2 architecture itself (random weights, 5 latent frames at 2x3, chunks of 2)
to within 1.2e-5. Not bit-identical: 8-bit frames differ in a few levels' roundings. On an H200 in
bf16 (121x704x1216): within 0.0127 of 1.0, docs/benchmarks.md.
"""

from __future__ import annotations

import argparse


def main() -> None:
    import torch

    from farm.decoders import load_decoder

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=["ltx2-tiny", "ltx2"], default="ltx2-tiny")
    p.add_argument("--frames", type=int, default=7, help="latent frames")
    p.add_argument("--size", default="4x6", help="latent height x width")
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 3], help="latent frames per chunk")
    args = p.parse_args()
    spec = {"family": "ltx2", "config": args.config, "weights": {"random_seed": 0}, "dtype": "float32"}
    decoder = load_decoder(spec, "cpu")
    h, w = (int(x) for x in args.size.split("x"))
    torch.manual_seed(0)
    z = torch.randn(decoder.latent_channels, args.frames, h, w)

    def levels(t: torch.Tensor) -> torch.Tensor:
        return (t.clamp(0, 1) * 255).round().to(torch.uint8)

    whole = decoder.decode(z)
    for n in args.chunks:
        parts, state = [], None
        for start in range(0, args.frames, n):
            pixels, state = decoder.decode_carried(z[:, start : start + n], state)
            parts.append(pixels)
        streamed = torch.cat(parts, dim=1)
        sizes = [part.shape[1] for part in parts]
        print(f"chunks of {n}: frames {sizes} (whole {whole.shape[1]}), largest "
              f"difference {(whole - streamed).abs().max().item():.2g}, 8-bit frames equal: "
              f"{torch.equal(levels(whole), levels(streamed))}")  # fmt: skip


if __name__ == "__main__":
    main()
