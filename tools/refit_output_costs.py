"""Refit a stored cost model's output figures (Zarr write seconds per pixel-frame, output streams, the
send of a blended batch to its I/O worker)
from farm renders measured by `benchmarks/benchmark_output.py`, and print every render measured beside
what the planner predicts for it, before and after.

    python tools/refit_output_costs.py a.json b.json --model ltx2-h200 [--write]

The decode figures stay (they come from plain decodes, `benchmark_gpu.py`); rows of a compiled
benchmark are predicted with the decode scaled by that run's compiled / eager plain decode. Only rows
written to Zarr with fsync (farm's default) are fitted; the others are shown. The disk term
(`disk_s_per_pixel`) of each durable row is its own run's fsync'd Zarr ceiling (the disks of machines of
one kind differ); rows not durable have none; the stored model keeps the median of the runs' ceilings.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

from farm.decoders import decoder_class
from farm.inputs.synthetic import synth_spec
from farm.planning import costmodel, planner
from farm.planning.costmodel import CostModel, DecodeCost
from farm.planning.tiling import ChunkSize, TileGrid, assign_round_robin, plan_shot
from farm.run.backends.local_cuda import io_workers_beside_gpus


def row_plans(row: dict, run: dict) -> tuple[list, int, int]:
    """The measured render's shot plans, decode workers and I/O workers."""
    args = run["args"]
    spec = synth_spec(args["decoder"])
    cls = decoder_class(spec)
    geometry = cls.geometry_for(spec.config)
    channels = cls.latent_channels_for(spec.config)
    if row["what"] == "batch":
        shots, (h, w) = int(args["shots"]), (int(args["height"]), int(args["width"]))
    else:
        shots, (h, w) = 1, (int(x) for x in row["what"].split()[-1].split("x"))
    frames = int(args["frames"])
    latent = (channels, (frames - 1) // geometry.temporal_scale + 1, h // geometry.spatial_scale,
              w // geometry.spatial_scale)  # fmt: skip
    grid_name, *carried = row["grids"][0].split()  # "1x1x2", or "1x1x1 5c": auto chose carried chunks
    counts = tuple(int(x) for x in grid_name.split("x"))
    overlap = tuple(0 if n == 1 else o for n, o in zip(counts, (0, 2, 2), strict=True))
    grid = TileGrid(counts, overlap)  # type: ignore[arg-type]
    carry = bool(row.get("carry"))
    taper = bool(row.get("taper", False))  # rows from before tapering carried even chunks
    chunk = (ChunkSize(frames=row["chunk_frames"], carry=carry, taper=taper) if row.get("chunk_frames")
             else ChunkSize())  # fmt: skip
    if carried and not row.get("chunk_frames"):
        chunk = ChunkSize(frames=int(carried[0].rstrip("c")), carry=True)
    plans = [plan_shot(f"shot{i:03d}", latent, geometry, grid, batch_frames=row.get("batch", 32), chunk=chunk)
             for i in range(shots)]  # fmt: skip
    gpus = int(row["gpus"])
    io = row.get("io_workers", "default")
    cpus = int(run["machine"]["cpus"])
    n_io = (
        io_workers_beside_gpus(gpus, cpus)
        if io == "default"
        else int(io)
    )
    return assign_round_robin(plans, gpus), gpus, n_io


def decode_scale(run: dict) -> float:
    """A compiled run's decode against the eager one the model holds (farm's decoder: ``eager-farm``).
    Runs from before farm padded by slices have only diffusers' ``eager``, what their renders ran; their
    eager renders are predicted with farm's decode, about 1/1.2 of theirs."""
    plain = run.get("plain", {})
    eager = plain.get("eager-farm", plain.get("eager"))
    if run["args"].get("compile") and "compiled" in plain and eager:
        return plain["compiled"]["seconds"] / eager["seconds"]
    return 1.0


def disk_s_per_pixel(run: dict) -> float | None:
    """The run's own fsync'd Zarr ceiling (its most processes) as seconds per output pixel-frame."""
    durable = [z for z in run.get("zarr", []) if z.get("durable") is True]
    if not durable:
        return None
    best = max(durable, key=lambda z: z["procs"])
    return 1.0 / (best["frames_per_s"] * int(run["args"]["height"]) * int(run["args"]["width"]))


def predicted(model: CostModel, row: dict, run: dict, own_disk: bool = True) -> float:
    """The makespan `model` predicts for a measured render; `own_disk`: with its run's disk ceiling."""
    plans, gpus, n_io = row_plans(row, run)
    if row["output"].startswith("zarr"):  # no video: no encode tasks
        model = model.with_(encode_s_per_pixel=0.0)
    disk = disk_s_per_pixel(run) if own_disk else None
    if row["output"] == "zarr-nofsync":
        model = model.with_(disk_s_per_pixel=0.0)
    elif disk is not None:
        model = model.with_(disk_s_per_pixel=disk)
    scale = decode_scale(run)
    if scale != 1.0:
        coefficients = {k: v * scale for k, v in model.decode.coefficients.items()}
        model = model.with_(decode=DecodeCost(coefficients))
    return planner.predict(plans, gpus, model, n_io=n_io, window=row.get("window") or None).makespan_s


def relative_rms(model: CostModel, rows: list[tuple[dict, dict]], own_disk: bool = True) -> float:
    errors = [(predicted(model, r, run, own_disk) - r["graph_s"]) / r["graph_s"] for r, run in rows]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def blend_seconds_per_pixel(rows: list[tuple[dict, dict]]) -> float:
    """The blend tasks' seconds over the pixel-frames they blended, summed over `rows`."""
    seconds = pixels = 0.0
    for r, run in rows:
        plans, _, _ = row_plans(r, run)
        seconds += r["tasks"].get("blend-batch", {}).get("compute_s", 0.0)
        pixels += sum(math.prod(p.pixel_shape) for p in plans)
    return seconds / pixels if pixels else 0.0


def median_rows(rows: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """One row per case of a run (the same render repeated), with the median of its graph seconds and
    `runs`, how many: the first render of a case on a fresh cluster pays its new shapes, an outlier the
    lower median leaves out."""
    cases: dict[tuple, list[dict]] = {}
    run_of: dict[tuple, dict] = {}
    for r, run in rows:
        key = (id(run), *(str(r.get(k)) for k in CASE_KEYS))
        cases.setdefault(key, []).append(r)
        run_of[key] = run
    out = []
    for key, same in cases.items():
        seconds = sorted(r["graph_s"] for r in same)
        median = seconds[(len(seconds) - 1) // 2]
        out.append(({**same[-1], "graph_s": median, "runs": len(same)}, run_of[key]))
    return out


CASE_KEYS = ("gpus", "io_workers", "what", "grids", "tiles", "output", "batch", "chunk_frames", "carry",
             "taper", "window")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="benchmark_output.py JSON files")
    p.add_argument("--model", default="ltx2-h200")
    p.add_argument("--write", action="store_true",
                   help="store the refitted model in farm/planning/costmodels/")
    p.add_argument("--keep-blend", action="store_true",
                   help="keep the stored blend cost (blends submitted with their decode wait for it, "
                        "so a blend task's seconds include that wait)")  # fmt: skip
    args = p.parse_args()
    runs = [json.loads(Path(f).read_text()) for f in args.runs]
    rows = median_rows([(r, run) for run in runs for r in run.get("farm", [])
                        if r.get("grids") and not r.get("failed")])  # fmt: skip
    fitted = [(r, run) for r, run in rows if r["output"] == "zarr"]
    old = costmodel.load(args.model)  # as stored: "before"
    # measured directly: the blend tasks' own seconds (unless they include waiting for their decode)
    blend = old.blend_s_per_pixel if args.keep_blend else blend_seconds_per_pixel(fitted)
    disks = sorted(d for d in (disk_s_per_pixel(run) for run in runs) if d is not None)
    disk = disks[len(disks) // 2] if disks else old.disk_s_per_pixel  # for runs that measured none
    # write seconds per pixel-frame of one stream, streams per worker, send seconds per pixel-frame (the
    # per-shot overhead is the video join's: Zarr-only renders have none to fit it on)
    grid = itertools.product(
        [w * 1e-9 for w in (2, 3, 4, 6, 8, 10, 12, 16)], (2, 4, 8), [s * 1e-9 for s in (0, 1, 2, 3, 4, 6)]
    )

    def model_for(choice: tuple[float, int, float]) -> CostModel:
        return old.with_(blend_s_per_pixel=blend, write_s_per_pixel=choice[0], disk_s_per_pixel=disk,
                         output_streams_per_worker=choice[1], send_s_per_pixel=choice[2])  # fmt: skip

    best = min(grid, key=lambda choice: relative_rms(model_for(choice), fitted))
    new = model_for(best)
    print(f"fitted on {len(fitted)} Zarr (durable) renders: blend_s_per_pixel {old.blend_s_per_pixel:.3g} -> "
          f"{blend:.3g}, write_s_per_pixel {old.write_s_per_pixel:.3g} -> {best[0]:.3g}, "
          f"output_streams_per_worker {old.output_streams_per_worker} -> {best[1]}, send_s_per_pixel "
          f"{old.send_s_per_pixel:.3g} -> {best[2]:.3g}, disk_s_per_pixel {old.disk_s_per_pixel:.3g} -> "
          f"{disk:.3g} (each run's own where it measured one); relative RMS error "
          f"{relative_rms(old, fitted, own_disk=False):.0%} -> {relative_rms(new, fitted):.0%}")  # fmt: skip
    header = ["GPUs", "I/O workers", "render", "grid", "output", "batch", "runs", "measured graph s (median)",
              "predicted before", "predicted now"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r, run in rows:
        what = r["what"] + (" (compiled)" if decode_scale(run) != 1 else "")
        grid = r["grids"][0] + (" (auto)" if r["tiles"] == "auto" else "")
        before, now = predicted(old, r, run, own_disk=False), predicted(new, r, run)
        cells = [r["gpus"], r.get("io_workers", "default"), what, grid, r["output"], r.get("batch", 32),
                 r["runs"], f"{r['graph_s']:.2f}", f"{before:.2f}", f"{now:.2f}"]  # fmt: skip
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.write:
        path = Path(__file__).resolve().parents[1] / "farm" / "costmodels" / f"{args.model}.json"
        raw = new.to_json()
        refitted = (
            "write_s_per_pixel",
            "blend_s_per_pixel",
            "output_streams_per_worker",
            "disk_s_per_pixel",
            "send_s_per_pixel",
        )
        blend_note = ("blend kept (blend tasks wait for their decode)" if args.keep_blend
                      else "blend from the blend tasks' own seconds")  # fmt: skip
        raw["notes"] = [n for n in raw["notes"] if not n.startswith(refitted)] + [
            ", ".join(refitted)
            + f": refitted by tools/refit_output_costs.py on {len(fitted)} cases of farm renders to Zarr "
            "with fsync (zarrs codecs; the median of each case's runs) on nvidia-h200, "
            f"{time.strftime('%Y-%m-%d')} (docs/performance.md); {blend_note}; write_s_per_pixel is one "
            "output stream's rate, streams run side by side; disk_s_per_pixel from the median fsync'd "
            "Zarr ceiling of the runs (0: none measured); send_s_per_pixel: a batch's frames to its I/O "
            "worker, one at a time per sender"
        ]
        path.write_text(json.dumps(raw, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
