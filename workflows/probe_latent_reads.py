"""Probe: a carried segment's latent read, through zarr-python's codec pipeline and through `zarrs`.

A GPU worker that has written frames runs the `zarrs` pipeline for the Zarr arrays it opens
(`farm.output.use_fast_codecs`); `farm.store.read_latent` opens latents with zarr-python's own. This
times, in fresh processes, the reads a 121-frame shot's carried segments make (and a whole latent) with
the array opened under each pipeline, and with farm's `read_latent` under a process set to zarrs.

    python workflows/probe_latent_reads.py --size 704x1216 --reps 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REGIONS = {"frames 0-3": (0, 4, None), "frames 4-8": (4, 9, None), "frames 0-3, half width": (0, 4, 0.55),
           "whole": (0, None, None)}  # fmt: skip


def timed_reads(job: str, how: str, reps: int) -> None:
    """In this process: median seconds of each region's read, `how` = zarr-python, zarrs or farm."""
    import numpy as np
    import zarr

    from farm.output import ZARRS_PIPELINE
    from farm.store import ZARR_PYTHON_PIPELINE, read_latent

    zarr.config.set({"codec_pipeline.path": ZARR_PYTHON_PIPELINE if how == "zarr-python" else ZARRS_PIPELINE})
    width = zarr.open_array(store=f"{job}/shot000/latent", mode="r").shape[3]
    out = []
    for name, (first, stop, share) in REGIONS.items():
        region = (slice(first, stop), slice(None), slice(0, int(width * share) if share else None))

        def read(region: tuple = region) -> None:
            if how == "farm":
                read_latent(job, "shot000", region)
            else:
                arr = zarr.open_array(store=f"{job}/shot000/latent", mode="r")
                np.asarray(arr[(slice(None), *region)])

        read()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            read()
            times.append(time.perf_counter() - t0)
        out.append(f"{name} {statistics.median(times) * 1e3:.1f}")
    print(f"{how:12s} " + "; ".join(out) + f" ms (median of {reps})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="704x1216")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", default="/tmp/farm-probe-latent-reads")
    p.add_argument("--child", nargs=3, metavar=("JOB", "HOW", "REPS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        timed_reads(args.child[0], args.child[1], int(args.child[2]))
        return
    from farm.synthetic import synth

    h, w = (int(x) for x in args.size.split("x"))
    job = Path(args.work) / f"job-{args.size}.zarr"
    synth(job, decoder="ltx2", shots=1, overwrite=True, frames=121, height=h, width=w)
    for _ in range(args.rounds):
        for how in ("zarr-python", "zarrs", "farm"):
            subprocess.run([sys.executable, __file__, "--child", str(job), how, str(args.reps)], check=True,
                           timeout=300)  # fmt: skip


if __name__ == "__main__":
    main()
