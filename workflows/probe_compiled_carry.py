"""Probe: can LTX-2's carried decode (``--carry``) run compiled, and what would it cost and gain?

farm's carried decode (`farm.decoders.ltx2_carry`) swaps new forwards into the decoder's causal
convolutions and temporal upsamplers for each call, which a compiled graph would not see, so carried
chunks decode eager even with ``--compile``. This probe, outside farm, installs carried forwards once
that take their padding and hand on their state through module attributes, compiles the decoder, and
decodes a latent in carried chunks (tapered as farm plans them, or even): per chunk the seconds of the
first call (compilation) and of later calls, how many graphs dynamo made, and the largest difference
from farm's eager carried decode.

    python workflows/probe_compiled_carry.py --config ltx2-tiny --size 4x6 --frames 16 --backend aot_eager
    python workflows/probe_compiled_carry.py --config ltx2 --device cuda --size 22x38 --dtype bfloat16

Measured on this project's 2-core CPU machine (2026-12-01, torch 2.13, ltx2-tiny, float32, 16 latent
frames at 4x6): chunks 4, 5, 4, 2, 1 (tapered) make 3 graphs (the first chunk's, the later chunks' at
one size, then a size-1 chunk), compiled with inductor in 22.4, 22.5 and 14.3 s, and then no
recompilation; even chunks 4, 4, 4, 4 make 2. With `aot_eager` the frames equal farm's eager carried
decode bit for bit, with inductor to within 3.8e-6.

On one H200 (2026-12-01, torch 2.11, the LTX-2 architecture, bf16, 16x22x38, tapered chunks of 5): the 3
graphs compiled in 28.2, 39.0 and 32.3 s cold; then 0.380-0.415 s per shot against 0.532 s eager with
diffusers' padding and 0.44-0.45 s with farm's padding by slices (docs/benchmarks.md):
too little for 99 s of compiling per worker, so farm's carried chunks stay eager.
"""

from __future__ import annotations

import argparse
import time
import types
from typing import Any


def install(module: Any) -> tuple[list, list]:
    """Carried forwards on `module`'s causal convolutions and upsamplers, once; off until switched on."""
    import torch
    from diffusers.models.autoencoders import autoencoder_kl_ltx2 as ltx2

    convs = [m for m in module.modules() if isinstance(m, ltx2.LTX2VideoCausalConv3d)]
    ups = [m for m in module.modules() if isinstance(m, ltx2.LTX2VideoUpsampler3d)]

    def conv_forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        if not self._carry:
            return type(self).forward(self, x, causal)
        k = self.kernel_size[0]
        pad = x[:, :, :1].repeat((1, 1, k - 1, 1, 1)) if self._before is None else self._before
        full = torch.cat([pad, x], dim=2)
        self._after = full[:, :, full.shape[2] - (k - 1) :].clone()
        return self.conv(full)

    def up_forward(self: Any, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        if not self._carry:
            return type(self).forward(self, x, causal)
        b, _, f, h, w = x.shape
        st, sh, sw = self.stride

        def to_space(t: torch.Tensor) -> torch.Tensor:
            t = t.reshape(b, -1, st, sh, sw, f, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
            t = t.flatten(6, 7).flatten(4, 5).flatten(2, 3)
            return t[:, :, st - 1 :] if self._first else t

        y = to_space(self.conv(x, causal=True))
        if self.residual:
            y = y + to_space(x).repeat(1, (st * sh * sw) // self.upscale_factor, 1, 1, 1)
        return y

    for conv in convs:
        conv._carry, conv._before, conv._after = False, None, None
        conv.forward = types.MethodType(conv_forward, conv)
    for up in ups:
        up._carry, up._first = False, True
        up.forward = types.MethodType(up_forward, up)
    return convs, ups


def carried_call(
    call: Any, convs: list, ups: list, z: Any, temb: Any, state: list | None
) -> tuple[Any, list]:
    first = state is None
    for i, conv in enumerate(convs):
        conv._carry, conv._before = True, None if first else state[i]
    for up in ups:
        up._carry, up._first = True, first
    try:
        out = call(z, temb, causal=True)
        after = [conv._after.clone() for conv in convs]  # a cudagraph's outputs are overwritten next call
    finally:
        for conv in convs:
            conv._carry, conv._before, conv._after = False, None, None
        for up in ups:
            up._carry = False
    return out, after


def main() -> None:
    import torch
    import torch._dynamo

    from farm.decoders import load_decoder
    from farm.tiling import carried_frames

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=["ltx2-tiny", "ltx2"], default="ltx2-tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--frames", type=int, default=16, help="latent frames")
    p.add_argument("--size", default="4x6", help="latent height x width")
    p.add_argument("--chunk", type=int, default=5, help="carried chunks of up to this many latent frames")
    p.add_argument("--even", action="store_true", help="even chunks (farm tapers them at the end)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: no codegen)")
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    spec = {"family": "ltx2", "config": args.config, "weights": {"random_seed": 0}, "dtype": args.dtype}
    decoder = load_decoder(spec, args.device)
    h, w = (int(x) for x in args.size.split("x"))
    torch.manual_seed(0)
    z = torch.randn(decoder.latent_channels, args.frames, h, w)
    sizes = carried_frames(args.frames, args.chunk, taper=not args.even)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def farm_eager() -> Any:  # farm's own carried decode
        parts, state = [], None
        for start, n in zip(starts, sizes, strict=True):
            pixels, state = decoder.decode_carried(z[:, start : start + n], state)
            parts.append(pixels)
        return torch.cat(parts, dim=1)

    def timed(run: Any) -> list[float]:
        times = []
        for _ in range(args.reps):
            sync()
            t0 = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - t0)
        return times

    # farm's eager carried decode first: it swaps its own forwards in and deletes them after each call,
    # which would remove the ones installed below
    eager = farm_eager()
    eager_times = timed(farm_eager)
    module = decoder.model.decoder
    convs, ups = install(module)
    compiled = torch.compile(module, backend=args.backend, mode=args.mode)
    temb = decoder._temb()

    def compiled_carried(first_calls: list[float] | None = None) -> Any:
        parts, state = [], None
        with torch.inference_mode():
            for start, n in zip(starts, sizes, strict=True):
                t0 = time.perf_counter()
                latent = decoder.decoder_input(z[:, start : start + n])
                pixels, state = carried_call(compiled, convs, ups, latent, temb, state)
                sync()
                if first_calls is not None:
                    first_calls.append(time.perf_counter() - t0)
                parts.append(decoder.unit_pixels(pixels[0]))
        return torch.cat(parts, dim=1)

    torch._dynamo.utils.counters.clear()
    first: list[float] = []
    out = compiled_carried(first)
    graphs = dict(torch._dynamo.utils.counters["stats"])
    print(f"chunks {sizes}: first calls {[round(s, 2) for s in first]} s; dynamo {graphs}")
    compiled_times = timed(compiled_carried)
    print(f"eager (farm): {min(eager_times):.3f}-{max(eager_times):.3f} s; compiled: "
          f"{min(compiled_times):.3f}-{max(compiled_times):.3f} s")  # fmt: skip
    diff = (out.float() - eager.float()).abs().max().item()
    print(f"dynamo after the timed runs: {dict(torch._dynamo.utils.counters['stats'])}; largest "
          f"difference from farm's eager carried decode {diff:.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
