"""Zarr write throughput of uint8 frame batches: compressors x writer threads (one process).

python benchmarks/bench_zarr_write.py --frames 32 --height 704 --width 1216 --threads 1,8 --out /tmp/zz
"""

from __future__ import annotations

import argparse
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

COMPRESSORS = {
    "none": None,
    "zstd-default": "auto",
    "zstd-1": [ZstdCodec(level=1)],
    "blosc-lz4": [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle")],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=32, help="frames per batch")
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1216)
    p.add_argument("--threads", default="1,8")
    p.add_argument("--out", default="/tmp/farm-zarr-bench")
    args = p.parse_args()
    frames = np.random.default_rng(0).integers(0, 256, (args.frames, args.height, args.width, 3), np.uint8)
    print("| compressor | threads | frames/s | MB/s |")
    print("| --- | --- | --- | --- |")
    for name, comp in COMPRESSORS.items():
        for threads in (int(t) for t in args.threads.split(",")):
            shutil.rmtree(args.out, ignore_errors=True)
            z = zarr.create_array(
                args.out, shape=(args.frames * args.batches, *frames.shape[1:]),
                chunks=(8, *frames.shape[1:]), dtype="uint8", compressors=comp,
            )  # fmt: skip
            t0 = time.perf_counter()

            def write(k: int, z=z) -> None:
                z[k * args.frames : (k + 1) * args.frames] = frames

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(write, range(args.batches)))
            dt = time.perf_counter() - t0
            n = args.frames * args.batches
            print(
                f"| {name} | {threads} | {n / dt:.0f} | {n * frames[0].nbytes / dt / 1e6:.0f} |", flush=True
            )
    shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
