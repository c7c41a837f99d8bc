"""Decode seconds and peak memory of every decoder family, against what farm's plan assumes.

For each named config: one decode of a reference clip (median of a few timed calls after a warm-up) and
the peak memory of that decode above what the process held before it, next to the adapter's estimate
(``peak_bytes``, what `farm plan` prints per tile) and the seconds the cost model farm would plan with
(`farm.planning.costmodel.cost_model`). Every decode runs in a fresh process, so peaks do not mix:

* CPU: the process' resident-set high-water mark (``ru_maxrss``) after the decode, minus the resident
  set before it (the model loaded and warmed up on a small clip), with glibc unmapping freed blocks of
  64 KiB and more; one torch thread, as a CPU worker runs;
* CUDA: ``torch.cuda.max_memory_allocated`` during the decode, minus the memory allocated before it.

    python tools/measure_families.py --out-json families-cpu.json
    python tools/measure_families.py --decoders hunyuanvideo-tiny --reps 0 --fit \
        --clip "9,64,96;9,128,192;17,128,192;33,96,128;33,192,256;9,256,384;17,256,384"
    python tools/measure_families.py --device cuda --decoders ltx2,ltxv,wan,hunyuanvideo \
        --clip 33,512,768 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY = "ltx2-tiny,ltxv-tiny,ltxv-0.9.1-tiny,wan-tiny,wan2.2-tiny,hunyuanvideo-tiny"


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_one(name: str, clip: tuple[int, int, int], device: str, dtype: str, reps: int) -> dict:
    """Seconds and peak bytes of one decode of `clip` pixels (frames, height, width), in this process."""
    import resource

    import numpy as np
    import torch

    from farm.decoders import decoder_class
    from farm.inputs.synthetic import smooth_latent, synth_spec

    torch.set_num_threads(1)
    spec = synth_spec(name, seed=0, dtype=dtype)
    cls = decoder_class(spec)
    decoder = cls.load(spec, device)
    g = decoder.geometry
    frames, height, width = clip
    fhw = (1 + (frames - 1) // g.temporal_scale, height // g.spatial_scale, width // g.spatial_scale)
    rng = np.random.default_rng(0)
    z = torch.from_numpy(smooth_latent(rng, (decoder.latent_channels, *fhw))).to(device)
    decoder.decode(z[:, :2, :2, :2], origin=(0, 0, 0))  # warm-up: allocator, kernels, lazy imports
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    out = decoder.decode(z, origin=(0, 0, 0))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    pixels = tuple(out.shape[1:])
    del out
    times = [float("nan")]
    for _ in range(reps):
        t0 = time.perf_counter()
        decoder.decode(z, origin=(0, 0, 0))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {
        "decoder": name,
        "dtype": dtype,
        "latent": list(fhw),
        "pixels": list(pixels),
        "seconds": float(np.median(times[1:] or times)),
        "measured_peak_bytes": int(peak),
        "weight_bytes": int(cls.weight_bytes(spec)),
        "estimated_peak_bytes": int(cls.peak_bytes(spec, pixels) - cls.weight_bytes(spec)),
    }


def fit(name: str, rows: list[dict]) -> dict:
    """The adapter's `memory_measured` terms for config `name`, fitted to its measured peaks (float32, CPU).

    The adapter names the terms to fit (``memory_fit_terms``: a fixed part, bytes per pixel-frame, per
    pixel of one frame) and the input channels of its full-resolution 3-D convolutions: decodes where
    torch runs one of those through its CPU native path (`farm.decoders.memory.CPU_NATIVE_CONV_LIMIT`) are
    left out of the affine fit, and each channel count's extra bytes per pixel-frame is the median of what the
    affine part leaves of the decodes where it is the largest native convolution."""
    import statistics

    from farm.decoders import decoder_class
    from farm.decoders.memory import CPU_NATIVE_CONV_LIMIT, MemoryModel
    from farm.inputs.synthetic import synth_spec
    from farm.planning.costmodel import fit_memory

    spec = synth_spec(name, seed=0)
    cls = decoder_class(spec)
    channels = sorted(cls.cpu_native_conv_channels(spec.config), reverse=True)

    def native(pixels) -> int | None:
        f, h, _ = pixels
        return next((c for c in channels if c * (f + 2) * (h + 2) <= CPU_NATIVE_CONV_LIMIT), None)

    plain = [(r["pixels"], r["measured_peak_bytes"]) for r in rows if native(r["pixels"]) is None]
    terms: dict = fit_memory(plain, cls.memory_fit_terms)
    affine = MemoryModel.from_terms({"weight_bytes": 0, **terms})
    extra = []
    for c in channels:
        left = [(r["measured_peak_bytes"] - affine.peak_bytes(r["pixels"])) / math.prod(r["pixels"])
                for r in rows if native(r["pixels"]) == c]  # fmt: skip
        if left:
            extra.append((c, round(statistics.median(left), 1)))
    if extra:
        terms["native_conv"] = extra
    return {k: v if k == "native_conv" else round(v, 1) for k, v in terms.items()}


def _child(queue, *args) -> None:
    queue.put(measure_one(*args))


def measure(name: str, clip, device: str, dtype: str, reps: int) -> dict:
    import os

    # glibc serves blocks above this from mmap and unmaps them when freed, so the resident set follows the
    # live tensors instead of keeping freed heap (which made peaks vary by 20-40 % with the clip size)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 16))
    ctx = multiprocessing.get_context("spawn")  # a fresh process per decode: peaks do not mix
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, name, clip, device, dtype, reps))
    proc.start()
    row = queue.get()
    proc.join()
    return row


def planned_seconds(row: dict, device: str) -> float:
    from farm.inputs.synthetic import synth_spec
    from farm.planning.costmodel import cost_model

    spec = synth_spec(row["decoder"], seed=0, dtype=row["dtype"])
    return cost_model(spec).decode_seconds(row["pixels"])


def markdown(result: dict) -> str:
    mib = 2**20
    lines = [
        f"{result['device']}, {result['machine']}, {result['date']}; one decode call per row.",
        "",
        "| decoder | dtype | pixels F,H,W | seconds | planned seconds | peak above weights MiB | "
        "planned MiB | planned / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        ratio = r["estimated_peak_bytes"] / max(r["measured_peak_bytes"], 1)
        lines.append(
            f"| {r['decoder']} | {r['dtype']} | {','.join(map(str, r['pixels']))} | {r['seconds']:.3f} | "
            f"{r['planned_seconds']:.3f} | {r['measured_peak_bytes'] / mib:.1f} | "
            f"{r['estimated_peak_bytes'] / mib:.1f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--decoders", default=TINY)
    parser.add_argument("--clip", default="33,256,384",
                        help="pixel frames, height, width; several clips separated by ';'")  # fmt: skip
    parser.add_argument("--fit", action="store_true",
                        help="fit each decoder's memory terms (memory_measured) to its peaks")  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out-json")
    parser.add_argument("--out-md")
    args = parser.parse_args(argv)
    clips = [tuple(int(x) for x in c.split(",")) for c in args.clip.split(";")]
    rows, fits = [], {}
    for name in args.decoders.split(","):
        for clip in clips:
            row = measure(name, clip, args.device, args.dtype, args.reps)
            row["planned_seconds"] = planned_seconds(row, args.device)
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.fit:
            fits[name] = fit(name, [r for r in rows if r["decoder"] == name])
            print(f"{name}: memory_measured {json.dumps(fits[name])}", flush=True)
    import torch

    result = {"device": args.device, "machine": f"{platform.machine()}, torch {torch.__version__}",
              "date": str(date.today()), "rows": rows}  # fmt: skip
    if fits:
        result["fits"] = fits
    md = markdown(result)
    print(md)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=1) + "\n")
    if args.out_md:
        Path(args.out_md).write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
