"""How long one batch takes to reach the disk, by the size of its Zarr chunks.

The end of a single-shot render waits for its last batch's durable write (docs/benchmarks.md: ≈ 0.2 s
for 8 frames of 1088x1920 in 8-frame chunks). A batch is written chunk by chunk, side by side, so
smaller chunks should put one batch on disk sooner. This times `farm.output.write_frames` (durable,
as a render's write task does) for each chunk limit (`farm.frame-chunk-mib`), one batch at a time, on
colour-noise frames (the benchmarks' frames), and prints the median seconds per batch.

    python workflows/probe_batch_write.py --sizes 704x1216 1088x1920 --chunk-mib 64 8 4 --out-json r.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np


def batch_seconds(root: Path, size: tuple[int, int], batch: int, chunk_mib: int, reps: int) -> dict:
    from farm.output import Output, chunk_frames, create_frames_array, use_fast_codecs, write_frames

    use_fast_codecs()
    h, w = size
    shutil.rmtree(root, ignore_errors=True)
    out = Output(root)
    create_frames_array(out.frames_zarr, "s", (batch * (reps + 1), h, w), batch, "uint8", 24.0, chunk_mib)
    frames = np.random.default_rng(0).integers(0, 256, (batch, h, w, 3), dtype=np.uint8)
    times = []
    for k in range(reps + 1):  # the first batch warms the pools and the codec up
        t0 = time.perf_counter()
        write_frames(out, "s", k * batch, frames, durable=True)
        times.append(time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)
    return {"size": f"{h}x{w}", "batch": batch, "chunk_mib": chunk_mib,
            "chunk_frames": chunk_frames(batch, h * w * 3, chunk_mib),
            "seconds": float(np.median(times[1:])), "all": times[1:]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["704x1216", "1088x1920"])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 16])
    p.add_argument("--chunk-mib", type=int, nargs="+", default=[64, 16, 8, 4])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default="/tmp/farm-probe-write")
    p.add_argument("--out-json", default=None)
    args = p.parse_args()
    rows = []
    for size in args.sizes:
        h, w = (int(x) for x in size.split("x"))
        for batch in args.batches:
            for mib in args.chunk_mib:
                row = batch_seconds(Path(args.dir), (h, w), batch, mib, args.reps)
                rows.append(row)
                s = row["seconds"]
                print(f"{size} batch {batch}: chunks of {row['chunk_frames']} frames (≤ {mib} MiB): "
                      f"{s:.3f} s per batch, {batch / s:.0f} frames/s", flush=True)  # fmt: skip
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
