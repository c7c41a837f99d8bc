"""Probe: the host's floor for writing one shot's frames, durable, as farm's I/O workers write them.

A streamed shot cannot end before its frames are on disk, whatever the GPU count: this times, on the
machine it runs on, `P` writer processes (farm's I/O workers are 8 by default) writing one shot of
colour-noise frames in farm's batches (`farm.output.write_frames`, its chunk layout and codec pipeline,
fsync'd before returning), the batches dealt round-robin, all of them handed out at once. The wall, from
the start signal to the last batch's return, is the least time any render can write that shot in; a
render's frames arrive as its decode produces them, so it is a floor, not a target.

    python workflows/probe_shot_write.py --sizes 704x1216 1088x1920 --procs 4,8,16 --reps 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np


def _writer(args: tuple) -> tuple[float, float]:
    """One writer process: wait for the start time, then write its batches of the shot."""
    root, shot, starts, batch, height, width, durable, begin = args
    from farm.output import Output, write_frames

    frames = np.random.default_rng(len(starts)).integers(0, 256, (batch, height, width, 3), dtype=np.uint8)
    out = Output(Path(root))
    while time.time() < begin:
        time.sleep(0.0005)
    t0 = time.time()
    for start in starts:
        write_frames(out, shot, start, frames[: min(batch, FRAMES - start)], durable=durable)
    return t0, time.time()


FRAMES = 121


def shot_write(pool: Any, folder: Path, procs: int, height: int, width: int, batch: int, durable: bool,
               rep: int) -> dict[str, Any]:  # fmt: skip
    from farm.output import create_frames_array

    shutil.rmtree(folder, ignore_errors=True)
    shot = f"s{rep}"
    create_frames_array(folder / "frames.zarr", shot, (FRAMES, height, width), batch)
    starts = list(range(0, FRAMES, batch))
    begin = time.time() + 0.2
    dealt = [starts[i::procs] for i in range(procs)]
    tasks = [(str(folder), shot, mine, batch, height, width, durable, begin) for mine in dealt if mine]
    spans = pool.map(_writer, tasks)
    wall = max(e for _, e in spans) - begin
    return {"procs": procs, "size": f"{height}x{width}", "durable": durable, "seconds": wall,
            "mb": FRAMES * height * width * 3 / 1e6}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["704x1216", "1088x1920"])
    p.add_argument("--procs", default="4,8,16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default="/tmp/farm-probe-shot-write")
    p.add_argument("--out-json", default=None)
    args = p.parse_args()
    rows = []
    ctx = mp.get_context("spawn")
    for procs in (int(x) for x in args.procs.split(",")):
        with ctx.Pool(procs) as pool:
            pool.map(time.sleep, [0] * procs)  # processes up before the clock starts
            pool.map(_writer, [(args.dir + "-warm", "w", [], 8, 8, 8, False, 0)] * procs)  # imports
            for size in args.sizes:
                h, w = (int(x) for x in size.split("x"))
                for durable in (True, False):
                    walls = []
                    for rep in range(args.reps):
                        r = shot_write(pool, Path(args.dir), procs, h, w, args.batch, durable, rep)
                        rows.append(r)
                        walls.append(round(r["seconds"], 3))
                    mb = rows[-1]["mb"]
                    print(f"{size} P={procs} {'durable' if durable else 'page cache'}: {walls} s "
                          f"({mb:.0f} MB; {mb / 1e3 / min(walls):.2f} GB/s at best)", flush=True)  # fmt: skip
    shutil.rmtree(args.dir, ignore_errors=True)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
