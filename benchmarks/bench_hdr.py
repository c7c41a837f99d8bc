"""What an HDR render costs beside an SDR one, through fresh `farm` commands on one machine.

Every row is a fresh ``farm render`` with its own cluster (wall seconds timed from outside, and the
graph seconds ``farm render`` reports), on one synthetic shot decoded with random weights:

- ``sdr-bf16``: the default render (bf16 decode, frames.zarr in uint8, an H.264 mp4);
- ``sdr-fp32``: the same in float32 (what HDR's precision alone costs);
- ``hdr-zarr``: ``--hdr acescct --no-video`` (float32 decode, frames.zarr in float16 scene-linear ACEScg);
- ``hdr``: ``--hdr acescct`` (float32 decode, frames.zarr in float16 scene-linear ACEScg, the HLG master);
- ``hdr-exr``: the same with a half-float ACEScg EXR sequence (``--sequence exr --colorspace acescg``);
- ``prores``: the SDR render with a ProRes 4444 video (``--codec prores_4444``), bf16;
- ``prores-acescct``: the same converted to ACEScct by OpenColorIO (``--colorspace acescct``).

Writes ``hdr.json`` and ``hdr.md`` under ``--out``.

    python benchmarks/bench_hdr.py --out /tmp/hdr                                   # LTX-2, 121×704×1216
    python benchmarks/bench_hdr.py --out /tmp/hdr --decoder ltx2-tiny --frames 17 --height 128 --width 192
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROWS = {
    "sdr-bf16": ("bfloat16", []),
    "sdr-fp32": ("float32", []),
    "hdr-zarr": ("float32", ["--hdr", "acescct", "--no-video"]),
    "hdr": ("float32", ["--hdr", "acescct"]),
    "hdr-exr": ("float32", ["--hdr", "acescct", "--sequence", "exr", "--colorspace", "acescg"]),
    "prores": ("bfloat16", ["--codec", "prores_4444"]),
    "prores-acescct": ("bfloat16", ["--codec", "prores_4444", "--colorspace", "acescct"]),
}


def farm(*args: str, log: Path, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = 124, str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.perf_counter() - started
    log.write_text(f"$ farm {' '.join(args)}\nrc {code}, {wall:.2f} s\n"
                   f"--- stdout\n{out}\n--- stderr\n{err}\n")
    graph = re.search(r"in ([\d.]+) s \(\+ ([\d.]+) s set-up, ([\d.]+) s finishing\)", out)
    row = {"rc": code, "wall_s": round(wall, 2)}
    if graph:
        row.update(graph_s=float(graph[1]), setup_s=float(graph[2]), finish_s=float(graph[3]))
    ready = re.search(r"decoder ready ([\d.]+) s", err)  # the worker's, under -v
    if graph and ready:  # the worker starts with the set-up: what the outputs cost comes after this
        after = row["setup_s"] + row["graph_s"] - float(ready[1])
        row.update(ready_s=float(ready[1]), after_ready_s=round(after, 2))
    print(f"  {log.stem}: {row}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--decoder", default="ltx2")
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--height", type=int, default=704)
    parser.add_argument("--width", type=int, default=1216)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for name in dict.fromkeys(args.rows.split(",")):
        dtype, options = ROWS[name]
        job = root / f"job-{dtype}.zarr"
        if not job.exists():
            farm("synth", str(job), "--decoder", args.decoder, "--shots", "1", "--frames", str(args.frames),
                 "--height", str(args.height), "--width", str(args.width), "--dtype", dtype,
                 log=root / f"synth-{dtype}.log", timeout=args.timeout)  # fmt: skip
        results[name] = [
            farm("-v", "render", str(job), "--out", str(root / f"out-{name}-{rep}"), *options,
                 log=root / f"{name}-{rep}.log", timeout=args.timeout)  # fmt: skip
            for rep in range(args.reps)
        ]
    (root / "hdr.json").write_text(json.dumps(results, indent=1))
    lines = ["| row | wall (s) | graph (s) | set-up (s) | decoder ready (s) | after it (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, rows in results.items():
        cells = [", ".join(f"{r.get(k, float('nan')):.2f}" for r in rows)
                 for k in ("wall_s", "graph_s", "setup_s", "ready_s", "after_ready_s")]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    (root / "hdr.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["rc"] == 0 for rows in results.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
