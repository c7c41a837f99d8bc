"""What LTX-2's reflect padding costs an eager decode, and what padding by slices saves.

``reflection_pad3d`` takes about a quarter of an eager LTX-2 decode's GPU time (704x1216 on an H200,
docs/performance.md, "Reflect padding by slices"). This times, on the shapes one decode pads,
``F.pad(mode="reflect")`` against `farm.decoders.reflect_pad.reflect_pad_hw`, then the whole decode and
the carried decode with each, alternating, and checks that the frames are the same bit for bit.

    python benchmarks/reflect_pad.py --sizes 22x38 34x60
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from math import prod
from typing import Any


def padded_shapes(decoder: Any, latent: Any) -> Counter:
    """The input shapes of every reflect-padded convolution in one decode, with how often each occurs."""
    import torch.nn as nn

    seen: Counter = Counter()
    convs = [m for m in decoder.model.modules() if isinstance(m, nn.Conv3d) and m.padding_mode == "reflect"]
    hooks = [m.register_forward_pre_hook(lambda m, a: seen.update([(tuple(a[0].shape), m.padding)]))
             for m in convs]  # fmt: skip
    decoder.decode(latent)
    for h in hooks:
        h.remove()
    return seen


def gpu_ms(fn: Any, reps: int = 10) -> float:
    import torch

    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def pad_costs(shapes: Counter, dtype: Any) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    from farm.decoders.reflect_pad import reflect_pad_hw

    old = new = 0.0
    for (shape, padding), n in shapes.items():
        x = torch.randn(shape, device="cuda", dtype=dtype)
        _, ph, pw = padding
        assert torch.equal(F.pad(x, (pw, pw, ph, ph, 0, 0), mode="reflect"), reflect_pad_hw(x, ph, pw))
        t_old = gpu_ms(lambda: F.pad(x, (pw, pw, ph, ph, 0, 0), mode="reflect"))  # noqa: B023
        t_new = gpu_ms(lambda: reflect_pad_hw(x, ph, pw))  # noqa: B023
        print(f"  {shape} x{n}: F.pad {t_old:.3f} ms, slices {t_new:.3f} ms")
        old, new = old + n * t_old, new + n * t_new
    return old, new


def _constant_then_borders(x: Any, ph: int, pw: int) -> Any:
    """Variant: one ``F.pad`` with zeros (a single pass), then the border rows and columns copied in."""
    import torch.nn.functional as F

    out = F.pad(x, (pw, pw, ph, ph))
    height, width = x.shape[-2:]
    for i in range(ph):
        out[..., ph - 1 - i, :] = out[..., ph + 1 + i, :]
        out[..., ph + height + i, :] = out[..., ph + height - 2 - i, :]
    for j in range(pw):
        out[..., pw - 1 - j] = out[..., pw + 1 + j]
        out[..., pw + width + j] = out[..., pw + width - 2 - j]
    return out


def _cats(x: Any, ph: int, pw: int) -> Any:
    """Variant: rows by one ``cat``, then columns by another (two passes)."""
    import torch

    rows = [x[..., ph - i : ph - i + 1, :] for i in range(ph)]
    below = [x[..., -2 - i : x.shape[-2] - 1 - i, :] for i in range(ph)]
    x = torch.cat([*rows, x, *below], dim=-2)
    cols = [x[..., pw - j : pw - j + 1] for j in range(pw)]
    right = [x[..., -2 - j : x.shape[-1] - 1 - j] for j in range(pw)]
    return torch.cat([*cols, x, *right], dim=-1)


def variants(shapes: Counter, dtype: Any) -> None:
    """Other ways to pad by copies, on the two largest shapes: milliseconds each, checked equal."""
    import torch
    import torch.nn.functional as F

    from farm.decoders.reflect_pad import reflect_pad_hw

    for (shape, padding), _n in sorted(shapes.items(), key=lambda kv: -prod(kv[0][0]))[:2]:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        _, ph, pw = padding
        ref = F.pad(x, (pw, pw, ph, ph, 0, 0), mode="reflect")
        row = []
        ways = (("slices", reflect_pad_hw), ("zeros+borders", _constant_then_borders), ("cats", _cats),
                ("copy only", lambda x, ph, pw: x.clone()))  # fmt: skip
        for name, fn in ways:
            ok = name == "copy only" or torch.equal(fn(x, ph, pw), ref)
            row.append(f"{name} {gpu_ms(lambda: fn(x, ph, pw)):.3f} ms{'' if ok else ' (DIFFERS)'}")  # noqa: B023
        print(f"  variants {shape}: " + ", ".join(row))


def switch(decoder: Any, sliced: bool) -> None:
    from farm.decoders.reflect_pad import sliced_reflect_padding

    sliced_reflect_padding(decoder.model, on=sliced)


def measure(decoder: Any, size: str, frames: int, chunk: int, reps: int) -> None:
    """One latent size: the padding alone on its shapes, then the whole and the carried decode."""
    import torch

    from farm.planning.tiling import carried_frames

    h, w = (int(x) for x in size.split("x"))
    torch.manual_seed(0)
    z = torch.randn(decoder.latent_channels, frames, h, w)  # on the host, as farm reads it
    switch(decoder, False)
    shapes = padded_shapes(decoder, z)
    old, new = pad_costs(shapes, torch.bfloat16)
    variants(shapes, torch.bfloat16)
    print(f"{size}: {sum(shapes.values())} padded convolutions; padding alone, GPU time summed: "
          f"F.pad {old:.1f} ms, slices {new:.1f} ms")  # fmt: skip
    sizes = carried_frames(frames, chunk, taper=True)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]

    def carried() -> Any:
        parts, state = [], None
        for s, n in zip(starts, sizes, strict=True):
            pixels, state = decoder.decode_carried(z[:, s : s + n], state)
            parts.append(pixels)
        return torch.cat(parts, dim=1)

    for name, run in (("whole", lambda: decoder.decode(z)), ("carried", carried)):
        times: dict[bool, list[float]] = {False: [], True: []}
        outs = {}
        for rep in range(reps + 1):
            for sliced in (False, True):
                switch(decoder, sliced)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = run()
                torch.cuda.synchronize()
                if rep:
                    times[sliced].append(time.perf_counter() - t0)
                outs[sliced] = out
        same = torch.equal(outs[False], outs[True])
        print(f"{size} {name} decode: F.pad {min(times[False]):.3f}-{max(times[False]):.3f} s, slices "
              f"{min(times[True]):.3f}-{max(times[True]):.3f} s; same frames: {same}")  # fmt: skip
    torch.cuda.empty_cache()


def cost_samples(decoder: Any, reps: int) -> list[dict]:
    """The decode samples of the stored `ltx2-h200` cost model, timed again with each padding."""
    import torch

    from farm.planning import costmodel

    out = []
    for sample in costmodel.load("ltx2-h200").samples:
        z = torch.randn(decoder.latent_channels, *sample.latent)
        seconds = {}
        for sliced in (False, True):
            switch(decoder, sliced)
            decoder.decode(z)  # cuDNN picks its algorithms for the shape
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                decoder.decode(z)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            seconds["slices" if sliced else "F.pad"] = statistics.median(times)
        print(f"sample {sample.what} latent {sample.latent}: stored {sample.seconds:.3f} s, "
              f"F.pad {seconds['F.pad']:.4f} s, slices {seconds['slices']:.4f} s")  # fmt: skip
        out.append(
            {"what": sample.what, "latent": list(sample.latent), "pixels": list(sample.pixels), **seconds}
        )
    return out


def main() -> None:
    import json

    from farm.decoders import load_decoder

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="*", default=["22x38"], help="latent height x width")
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--chunk", type=int, default=5)
    p.add_argument("--samples", default=None, help="also time the cost model's samples; JSON to this path")
    args = p.parse_args()
    spec = {"family": "ltx2", "config": "ltx2", "weights": {"random_seed": 0}, "dtype": "bfloat16"}
    decoder = load_decoder(spec, "cuda")
    for size in args.sizes:
        measure(decoder, size, args.frames, args.chunk, args.reps)
    if args.samples:
        with open(args.samples, "w") as f:
            json.dump(cost_samples(decoder, args.reps), f, indent=1)


if __name__ == "__main__":
    main()
