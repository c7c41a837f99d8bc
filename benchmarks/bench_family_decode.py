"""One family's decode through farm beside diffusers' plain ``vae.decode`` of the same latent.

For a named config (RANDOM weights, seeded) and a latent shape, in one process:

* farm: the adapter a render's decode task uses (`farm.worker.tasks.decode_block` on the whole shot, the
  chunking of an untiled plan, the model as `load` prepares it: decode-only, the spec's dtype, farm's
  padding and pacing);
* diffusers: the same model (the same seeded weights: one build, copied) as a user's script holds it
  (``.to(device, dtype)`` with the class's ``_keep_in_fp32_modules`` kept in float32, as
  ``from_pretrained(torch_dtype=...)`` keeps them), ``vae.decode(z)`` under ``torch.inference_mode``.

Both decode the same seeded latent (denormalized: as the pipeline hands it to ``vae.decode``). After one
untimed full-size call each (farm's first; their seconds reported as ``warmup_s``), the two alternate
``--reps`` times; reported: the median seconds, the peak memory of a decode above what was allocated before it
(``torch.cuda.max_memory_allocated`` on a GPU; the resident-set high-water mark on a CPU, an upper
bound there), and the PSNR of farm's uint8 frames against diffusers' (the adapter's own conversion to
[0, 1] applied to both). Prints one JSON line; ``--out-json`` writes it too.

    python benchmarks/bench_family_decode.py --decoder cogvideox --shape 13,60,90 --dtype bfloat16 \\
        --device cuda --out-json decode-cogvideox.json
    python benchmarks/bench_family_decode.py --decoder cosmos-tiny --shape 3,8,8 --reps 1   # a CPU check
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import resource
import statistics
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _allocated(device: str) -> int:
    import torch

    if device.startswith("cuda"):
        return int(torch.cuda.memory_allocated())
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(run: Any, device: str) -> tuple[Any, float, int]:
    """`run()`'s result, its seconds, and its peak memory above what was allocated before it."""
    import torch

    _synchronize(device)
    before = _allocated(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    out = run()
    _synchronize(device)
    seconds = time.perf_counter() - started
    if device.startswith("cuda"):
        peak = int(torch.cuda.max_memory_allocated()) - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return out, seconds, peak


def plain_model(model: Any, device: str, dtype: str) -> Any:
    """The model as a user's script holds it: cast, with the class's float32 modules kept float32."""
    import torch

    model = model.to(device=device, dtype=getattr(torch, dtype))
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, tensor in model.named_parameters():
        if keep.intersection(name.split(".")):
            tensor.data = tensor.data.float()
    return model.eval()


def uint8_psnr(a: Any, b: Any) -> tuple[float, float]:
    """PSNR (dB) and the worst difference, in uint8 levels, of two [3, F, H, W] frames in [0, 1]."""
    total, worst = 0.0, 0.0
    for f0 in range(0, a.shape[1], 8):
        x, y = ((t[:, f0 : f0 + 8].float().clamp(0, 1) * 255).round().double() for t in (a, b))
        diff = x - y
        total += float((diff**2).sum())
        worst = max(worst, float(diff.abs().max()))
    mse = total / a.numel()
    return (math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)), worst


def bench(
    decoder_name: str, shape: tuple[int, int, int], dtype: str, device: str, reps: int, seed: int
) -> dict:
    import numpy as np
    import torch

    from farm.decoders import decoder_class
    from farm.inputs.synthetic import smooth_latent, synth_spec
    from farm.planning.tiling import TileGrid, plan_shot
    from farm.worker.tasks import decode_block

    spec = replace(synth_spec(decoder_name, seed=seed, dtype=dtype), latents="denormalized")
    cls = decoder_class(spec)
    cls.check_spec(spec)
    started = time.perf_counter()
    built = cls.build(spec)  # float32 on the CPU, seeded: what `load` builds for random weights
    build_s = time.perf_counter() - started
    diffusers_vae = plain_model(copy.deepcopy(built), device, dtype)
    farm_decoder = cls.from_model(spec, built, device)
    channels = cls.latent_channels_for(spec.config)
    latent = torch.from_numpy(smooth_latent(np.random.default_rng(seed + 1), (channels, *shape)))
    on_device = latent.to(device)
    z = on_device.to(getattr(torch, dtype))[None]
    untiled = plan_shot("bench", tuple(latent.shape), farm_decoder.geometry, TileGrid((1, 1, 1), (0, 0, 0)))

    def farm_decode() -> Any:
        return decode_block(farm_decoder, on_device, untiled.chunk, origin=(0, 0, 0))

    def diffusers_decode() -> Any:
        with torch.inference_mode():
            return diffusers_vae.decode(z, return_dict=False)[0]

    sides = {"farm": farm_decode, "diffusers": diffusers_decode}
    first = {}  # farm's call first: diffusers' then finds the kernels loaded
    for side, run in sides.items():
        out, seconds, _ = timed(run, device)
        first[side] = round(seconds, 3)
        del out
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    peaks: dict[str, int] = {}
    outs: dict[str, Any] = {}
    for _ in range(max(reps, 1)):  # alternated, so drift in the machine falls on both sides alike
        for side, run in sides.items():
            outs.pop(side, None)
            out, s, peak = timed(run, device)
            seconds[side].append(s)
            peaks[side] = max(peaks.get(side, 0), peak)
            outs[side] = out
    farm_pixels = outs["farm"]
    diffusers_pixels = cls.unit_pixels(outs["diffusers"][0])
    psnr_db, worst = uint8_psnr(farm_pixels, diffusers_pixels)
    median = {side: statistics.median(v) for side, v in seconds.items()}
    gpu = device.startswith("cuda")
    return {
        "decoder": decoder_name, "family": spec.family, "dtype": dtype, "device": device,
        "device_name": torch.cuda.get_device_name() if gpu else platform.processor() or "cpu",
        "latent": list(shape), "pixels": list(farm_pixels.shape[1:]),
        "weights": f"RANDOM (seed {seed})", "build_s": round(build_s, 2), "reps": max(reps, 1),
        "farm_s": round(median["farm"], 4), "diffusers_s": round(median["diffusers"], 4),
        "farm_over_diffusers": round(median["farm"] / median["diffusers"], 3),
        "farm_all_s": [round(s, 4) for s in seconds["farm"]],
        "diffusers_all_s": [round(s, 4) for s in seconds["diffusers"]],
        "warmup_s": first,
        "farm_peak_gib": round(peaks["farm"] / 2**30, 3),
        "diffusers_peak_gib": round(peaks["diffusers"] / 2**30, 3),
        "peak_measure": "max_memory_allocated above before" if gpu else "ru_maxrss above before",
        "psnr_farm_vs_diffusers_db": psnr_db, "worst_levels": worst,
        "torch": torch.__version__, "date": str(date.today()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--decoder", required=True, help="a named config (cogvideox, mochi-tiny, ...)")
    parser.add_argument("--shape", required=True, help="latent F,H,W")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per side, alternated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-json", default=None)
    args = parser.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 3:
        parser.error(f"--shape takes latent frames, rows and columns (F,H,W), got {args.shape!r}")
    import torch

    torch.manual_seed(args.seed)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # as a CPU worker decodes
    result = bench(args.decoder, shape, args.dtype, args.device, args.reps, args.seed)  # type: ignore[arg-type]
    line = json.dumps(result)
    print(line, flush=True)
    if args.out_json:
        Path(args.out_json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
