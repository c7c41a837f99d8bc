"""Seamless tiles through `farm render`, as a user runs it: a shot rendered with ``--gpu-memory`` (tiles
with their halo, chosen by the planner to fit the budget) against the same shot rendered untiled.

Fresh commands in fresh processes (`farm synth`, `farm plan`, `farm render`, each with its own local
cluster), RANDOM weights (seeded), float16 frames in Zarr (no video). While the tiled render runs,
`nvidia-smi` is polled for the GPU's memory in use: its peak (worker processes, CUDA contexts included)
is reported beside the budget, which each worker's allocator is held to.

Reported: PSNR over the whole clip and over the band 16 pixels either side of each spatial seam, and the worst
pixel in levels of 255, each on uint8 levels (as an 8-bit render writes them) and on the float16 frames as
written; the plan.

    python benchmarks/bench_seamless.py --decoder ltx2 --frames 121 --height 1088 --width 1920 \\
        --gpu-memory 24GiB --out-json seamless-ltx2-1080p.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BAND = 16


def farm(*args: str, timeout: float) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"farm {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout + done.stderr


class GpuMemoryPeak:
    """The largest memory.used nvidia-smi reports (MiB, GPU 0) while the context is open."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s, self.peak_mib, self._stop = every_s, 0, threading.Event()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]
                out = subprocess.run(query, capture_output=True, text=True)
            except OSError:  # no GPU here
                return
            if out.returncode == 0 and out.stdout.strip():
                self.peak_mib = max(self.peak_mib, int(out.stdout.split()[0]))
            self._stop.wait(self.every_s)

    def __enter__(self) -> GpuMemoryPeak:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def frames(out: Path, shot: str):
    """The shot's frames array in OUT (read a few frames at a time: a 4K clip is 24 GB as float64)."""
    import zarr

    return zarr.open_group(str(out / "frames.zarr"), mode="r")[f"{shot}/frames"]


def psnr(sq_sum: float, count: int, peak: float) -> float:
    return math.inf if sq_sum == 0 else 10 * math.log10(peak**2 * count / sq_sum)


def seam_band(plan, shape: tuple[int, ...]) -> np.ndarray:
    """Boolean [H, W]: within BAND pixels of a spatial seam between two tiles."""
    height, width = shape[1:3]
    rows, cols = np.zeros(height, dtype=bool), np.zeros(width, dtype=bool)
    for tile in plan.tiles:
        for mask, span, extent in ((rows, tile.pixels[1], height), (cols, tile.pixels[2], width)):
            for edge in (span.start, span.stop):
                if 0 < edge < extent:
                    mask[max(0, edge - BAND) : edge + BAND] = True
    return rows[:, None] | cols[None, :]


def compare(tiled, whole, band: np.ndarray, step: int = 8) -> dict:
    """Frames [F, H, W, 3] in [0, 1]: PSNR whole and in the band and the worst pixel, on uint8 levels (as an
    8-bit render writes them) and on the float16 frames as written, in levels of 255 (as the decoder's
    output is compared untiled against tiled; a rounding to uint8 alone can put two frames a level apart)."""
    total = in_band = exact = exact_band = 0.0
    worst = worst_exact = 0.0
    for f0 in range(0, tiled.shape[0], step):
        a, b = (np.clip(np.asarray(x[f0 : f0 + step], dtype=np.float64), 0, 1) for x in (tiled, whole))
        diff_levels = np.round(a * 255) - np.round(b * 255)
        diff_exact = (a - b) * 255
        total += float((diff_levels**2).sum())
        in_band += float((diff_levels[:, band] ** 2).sum())
        exact += float((diff_exact**2).sum())
        exact_band += float((diff_exact[:, band] ** 2).sum())
        worst = max(worst, float(np.abs(diff_levels).max()))
        worst_exact = max(worst_exact, float(np.abs(diff_exact).max()))
    n = math.prod(tiled.shape)
    n_band = tiled.shape[0] * int(band.sum()) * tiled.shape[3]
    return {
        "psnr_db": psnr(total, n, 255.0),
        "band_psnr_db": psnr(in_band, n_band, 255.0),
        "worst_levels": worst,
        "psnr_float16_db": psnr(exact, n, 255.0),
        "band_psnr_float16_db": psnr(exact_band, n_band, 255.0),
        "worst_float16_levels": round(worst_exact, 2),
        "band_fraction": float(band.mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--decoder", default="ltx2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--height", type=int, default=1088)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--gpu-memory", default="24GiB")
    parser.add_argument("--tiles", default="auto", help="tiles of the budgeted render (default: auto)")
    parser.add_argument("--work", default="/tmp/farm-seamless")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out-json", default=None)
    args = parser.parse_args(argv)

    from farm.config import parse_size
    from farm.planning.jobplan import plan_job
    from farm.planning.options import PlanOptions, parse_tiles
    from farm.store.job import open_job

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    job = work / "job.zarr"
    farm("synth", str(job), "--decoder", args.decoder, "--dtype", args.dtype, "--frames", str(args.frames),
         "--height", str(args.height), "--width", str(args.width), "-q", timeout=args.timeout)  # fmt: skip
    common = ("--workers", "1", "--no-video", "--frames-dtype", "float16")
    _, plan_text = farm("plan", str(job), "--workers", "1", "--tiles", args.tiles, "--gpu-memory",
                        args.gpu_memory, timeout=args.timeout)  # fmt: skip
    print(plan_text, flush=True)
    whole_s, _ = farm("render", str(job), "--out", str(work / "whole"), "--tiles", "1,1,1", *common,
                      timeout=args.timeout)  # fmt: skip
    with GpuMemoryPeak() as peak:
        tiled_s, tiled_log = farm("render", str(job), "--out", str(work / "tiled"), "--tiles", args.tiles,
                                  "--gpu-memory", args.gpu_memory, *common, timeout=args.timeout)  # fmt: skip
    budget = parse_size(args.gpu_memory, "--gpu-memory")
    plan = plan_job(open_job(job), PlanOptions(tiles=parse_tiles(args.tiles), worker_memory=budget), 1)[0]
    whole, tiled = frames(work / "whole", plan.shot), frames(work / "tiled", plan.shot)
    result = {
        "decoder": args.decoder, "dtype": args.dtype, "shape": [args.frames, args.height, args.width],
        "gpu_memory": args.gpu_memory, "grid": list(plan.grid.tiles), "overlap": list(plan.grid.overlap),
        "halo": max(max(t.halo) for t in plan.tiles), "redundancy": round(plan.redundancy, 3),
        "whole_render_s": round(whole_s, 1), "tiled_render_s": round(tiled_s, 1),
        "nvidia_smi_peak_gib": round(peak.peak_mib / 1024, 2), "budget_gib": round(budget / 2**30, 2),
        **compare(tiled, whole, seam_band(plan, tiled.shape)), "date": str(date.today()),
    }  # fmt: skip
    print(json.dumps(result, indent=1), flush=True)
    print(tiled_log[-1500:], flush=True)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
