"""Probe: does the GIL's switch interval on the GPU workers shorten one shot's render?

A GPU worker's decode thread launches kernels with the GIL held; its event loop (task starts, results,
transfers) and its blend and write threads wait for the GIL meanwhile, up to Python's switch interval
(5 ms) each time. One shot's render is a chain of such steps. This renders single shots (carried chunks
of 5, 8-frame batches) on one GPU worker with ``sys.setswitchinterval`` set on every worker to each
value in turn, alternating, and prints the walls.

    python workflows/probe_switch_interval.py --sizes 704x1216 1088x1920 --reps 3 --out-json $OUT/si.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _set_interval(seconds: float) -> float:
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return before


def main() -> None:
    from benchmark_output import plan_options, timed_farm

    from farm.cluster import connect
    from farm.render import synth
    from farm.tasks import VideoSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["704x1216", "1088x1920"])
    p.add_argument("--intervals", nargs="+", type=float, default=[0.005, 0.0005])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch-shots", type=int, default=0, help="also render this many 704x1216 shots whole")
    p.add_argument("--batch-intervals", nargs="+", type=float, default=[0.005, 0.0005])
    p.add_argument("--work", default="/tmp/farm-probe-si")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    args.compile, args.frames_hash = False, False
    work = Path(args.work)
    rows: list[dict[str, Any]] = []
    options = plan_options((1, 1, 1), "5c", 8)
    with connect(workers=1) as client:
        for size in args.sizes:
            h, w = (int(x) for x in size.split("x"))
            job = work / f"one-{size}.zarr"
            synth(job, decoder="ltx2", shots=1, overwrite=True, frames=121, height=h, width=w)
            timed_farm(client, job, work / "out", options, VideoSettings(enabled=False), args)  # warm
            for rep in range(args.reps):
                for interval in args.intervals:
                    client.run(_set_interval, interval)
                    row = timed_farm(client, job, work / "out", options, VideoSettings(enabled=False), args)
                    row.pop("tasks")
                    row.update({"size": size, "interval": interval, "rep": rep})
                    rows.append(row)
                    Path(args.out_json).write_text(json.dumps(rows, indent=1, default=str))
                    log(f"{size} interval {interval}: wall {row['wall_s']:.3f} s, "
                        f"graph {row['graph_s']:.3f} s, set-up {row['setup_s']:.3f} s")  # fmt: skip
        if args.batch_shots:  # throughput: whole shots, 32-frame batches, one tile each
            job = work / "batch.zarr"
            synth(job, decoder="ltx2", shots=args.batch_shots, overwrite=True, frames=121, height=704,
                  width=1216)  # fmt: skip
            whole = plan_options((1, 1, 1), 0, 32)
            timed_farm(client, job, work / "out", whole, VideoSettings(enabled=False), args)  # warm
            for rep in range(2):
                for interval in args.batch_intervals:
                    client.run(_set_interval, interval)
                    row = timed_farm(client, job, work / "out", whole, VideoSettings(enabled=False), args)
                    row.pop("tasks")
                    row.update({"size": f"{args.batch_shots} shots", "interval": interval, "rep": rep})
                    rows.append(row)
                    Path(args.out_json).write_text(json.dumps(rows, indent=1, default=str))
                    log(f"{args.batch_shots} shots interval {interval}: {row['frames_per_s']:.1f} frames/s")
        client.run(_set_interval, 0.005)
    for size in {r["size"]: None for r in rows}:
        for interval in sorted({r["interval"] for r in rows if r["size"] == size}, reverse=True):
            walls = sorted(r["wall_s"] for r in rows if r["size"] == size and r["interval"] == interval)
            log(f"SUMMARY {size} interval {interval}: walls {[round(x, 3) for x in walls]}")


if __name__ == "__main__":
    main()
