"""Farm-scale figures on paper: the auto planner against LTX-2's shipped grids, predicted by a cost model.

Every figure here is a prediction of `farm.planning.planner.predict` (a discrete-event simulation of farm's
task graph: pinned round-robin decodes, piece transfers, blends with output writing, shot finishing, the
bounded window) driven by a stored cost model (default `ltx2-h200`, fitted to measured H200 decodes;
see farm/planning/costmodels/ltx2-h200.json for every figure and assumption). Nothing is decoded.

Compared plans, per shot (latent units; LTX-2's shipped multi-GPU grids use overlap 4):

* ``auto``: `farm.planning.planner.choose_plans` for the job's shots and workers;
* ``ltx2 2x2`` (4 GPUs; on 2 workers its 4 tiles take turns), ``ltx2 2x4`` (8 GPUs) and
  ``ltx2 8 strips`` (the documentation's "8 height tiles, overlap 4");
* ``whole``: one task per shot, no splitting at all (farm's old default).

Usage:
    python benchmarks/simulate_farm.py                                  # tables to stdout
    python benchmarks/simulate_farm.py --seams seams-plans.json --out-md planner.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.decoders import memory_model  # noqa: E402
from farm.decoders.memory import MemoryModel  # noqa: E402
from farm.inputs.synthetic import synth_spec  # noqa: E402
from farm.planning import costmodel, planner  # noqa: E402
from farm.planning.tiling import Geometry, TileGrid, assign_round_robin, plan_shot  # noqa: E402

G = Geometry(spatial_scale=32, temporal_scale=8, causal=True)
SHAPES = {"1216x704x121": (128, 16, 22, 38), "1920x1088x121": (128, 16, 34, 60)}
LTX2_2X2 = TileGrid((1, 2, 2), (0, 4, 4))
LTX2_2X4 = TileGrid((1, 2, 4), (0, 4, 4))
LTX2_STRIPS = TileGrid((1, 8, 1), (0, 4, 0))
WHOLE = TileGrid()
SHIPPED_FOR = {2: ("ltx2 2x2", LTX2_2X2), 4: ("ltx2 2x2", LTX2_2X2), 8: ("ltx2 2x4", LTX2_2X4)}


class Farm:
    def __init__(self, model: costmodel.CostModel, memory: MemoryModel) -> None:
        self.model = model
        self.memory = memory
        self.plan_cache: dict = {}

    def plans(self, shots: dict[str, tuple], grids: dict[str, TileGrid], n_workers: int):
        out = []
        for name, shape in shots.items():
            key = (shape, grids[name])
            if key not in self.plan_cache:
                self.plan_cache[key] = plan_shot("", shape, G, grids[name])
            from dataclasses import replace

            out.append(replace(self.plan_cache[key], shot=name))
        return assign_round_robin(out, n_workers)

    def predict(self, shots, grids, n_workers) -> planner.Prediction:
        plans = self.plans(shots, grids, n_workers)
        return planner.predict(plans, n_workers, self.model, memory=self.memory, geometry=G)

    def auto(self, shots, n_workers) -> dict[str, TileGrid]:
        return planner.choose_plans(
            shots, G, n_workers, self.model, self.model.worker_memory_bytes, memory=self.memory
        )


def grid_text(grids: dict[str, TileGrid]) -> str:
    """A job's grids in short: '1x2x4 o0,4,4' or 'whole', with counts when they differ."""
    counts: dict[TileGrid, int] = {}
    for g in grids.values():
        counts[g] = counts.get(g, 0) + 1

    def one(g: TileGrid) -> str:
        if g.tiles == (1, 1, 1):
            return "whole"
        return "x".join(map(str, g.tiles)) + " o" + ",".join(map(str, g.overlap))

    if len(counts) == 1:
        return one(next(iter(counts)))
    return " + ".join(f"{n}x[{one(g)}]" for g, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def seam_lookup(path: str | None) -> dict:
    if not path:
        return {}
    rows = json.loads(Path(path).read_text())["rows"]
    return {(r["shape"], tuple(r["tiles"]), tuple(r["overlap"])): r for r in rows}


def seam_text(seams: dict, shape: str, grids: dict[str, TileGrid]) -> str:
    if not seams:
        return ""
    if all(g.tiles == (1, 1, 1) for g in grids.values()):
        return "exact"
    split = {g for g in grids.values() if g.tiles != (1, 1, 1)}
    if len(split) != 1:
        return "n/a"
    g = next(iter(split))
    row = seams.get((shape, g.tiles, g.overlap))
    return f"{row['psnr_db']:.1f}" if row else "n/a"


def row(case, workers, label, grids, pred: planner.Prediction, seam: str | None) -> list[str]:
    out = [
        case,
        str(workers),
        label,
        grid_text(grids),
        f"{pred.redundancy:.2f}",
        f"{pred.makespan_s:.3f}",
        f"{pred.decode_makespan_s:.3f}",
        f"{pred.utilisation:.0%}",
        f"{pred.peak_bytes / 2**30:.1f}",
    ]
    if seam is not None:
        out.append(seam)
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def issue_rows(farm: Farm, seams: dict) -> tuple[list[list[str]], list[str]]:
    """Single shots on 2, 4, 8 workers; batches of 8 and 64 shots on 8 workers."""
    rows, failures = [], []
    seam_col = bool(seams)
    for label, shape in SHAPES.items():
        for n in (2, 4, 8):
            shots = {"a": shape}
            auto = farm.auto(shots, n)
            p_auto = farm.predict(shots, auto, n)
            name, shipped = SHIPPED_FOR[n]
            compared = [("auto", auto, p_auto)]
            for lbl, g in ((name, shipped), ("ltx2 8 strips", LTX2_STRIPS), ("whole", WHOLE)):
                compared.append((lbl, {"a": g}, farm.predict(shots, {"a": g}, n)))
            for lbl, grids, pred in compared:
                s = seam_text(seams, label, grids) if seam_col else None
                rows.append(row(f"1 shot {label}", n, lbl, grids, pred, s))
            for lbl, _, pred in compared[1:3]:
                if pred.redundancy < p_auto.redundancy - 1e-9 or pred.makespan_s < p_auto.makespan_s - 1e-9:
                    failures.append(f"1 shot {label} on {n}: {lbl} beats auto")
    for count in (8, 64):
        shape = SHAPES["1216x704x121"]
        shots = {f"s{k:02d}": shape for k in range(count)}
        auto = farm.auto(shots, 8)
        p_auto = farm.predict(shots, auto, 8)
        compared = [("auto", auto, p_auto)]
        for lbl, g in (("ltx2 2x4", LTX2_2X4), ("ltx2 8 strips", LTX2_STRIPS)):
            grids = {k: g for k in shots}
            compared.append((lbl, grids, farm.predict(shots, grids, 8)))
        for lbl, grids, pred in compared:
            s = seam_text(seams, "1216x704x121", grids) if seam_col else None
            rows.append(row(f"{count} shots 1216x704x121", 8, lbl, grids, pred, s))
        for lbl, _, pred in compared[1:]:
            if pred.redundancy < p_auto.redundancy - 1e-9 or pred.makespan_s < p_auto.makespan_s - 1e-9:
                failures.append(f"{count} shots: {lbl} beats auto")
        # with several shots a worker, whole shots keep every GPU busy with no redundant work; with one
        # shot a worker, splitting it lets its first part's writes run under the rest's decode
        if count > 8 and any(g.tiles != (1, 1, 1) for g in auto.values()):
            failures.append(f"{count} shots: auto did not decode whole shots")
    return rows, failures


def scale_rows(farm: Farm, gpus: list[int], shot_counts: list[int]) -> list[list[str]]:
    """Larger farms: 8-GPU nodes, a job of N shots of 1216x704x121."""
    shape = SHAPES["1216x704x121"]
    frames = 121
    rows = []
    for n in gpus:
        for count in shot_counts:
            shots = {f"s{k:05d}": shape for k in range(count)}
            t0 = time.perf_counter()
            auto = farm.auto(shots, n)
            t_plan = time.perf_counter() - t0
            for lbl, grids in (
                ("auto", auto),
                ("whole", {k: WHOLE for k in shots}),
                ("ltx2 2x4", {k: LTX2_2X4 for k in shots}),
            ):
                pred = farm.predict(shots, grids, n)
                rows.append([
                    f"{count}", f"{n} ({math.ceil(n / farm.model.workers_per_node)})", lbl, grid_text(grids),
                    f"{pred.redundancy:.3f}", f"{pred.makespan_s:.1f}",
                    f"{count * frames / pred.makespan_s:,.0f}",
                    f"{pred.utilisation:.0%}", f"{pred.thread_utilisation:.0%}",
                    f"{t_plan:.1f}" if lbl == "auto" else "",
                ])  # fmt: skip
            print(f"  {count} shots on {n} GPUs planned in {t_plan:.1f} s", file=sys.stderr, flush=True)
    return rows


def transport_rows(farm: Farm) -> list[list[str]]:
    """One 1216x704x121 shot on 8 workers: UCX against TCP, auto against the shipped 2x4."""
    rows = []
    shots = {"a": SHAPES["1216x704x121"]}
    base = farm.model
    for protocol in ("ucx", "tcp"):
        farm.model = base.with_(protocol=protocol)
        auto = farm.auto(shots, 8)
        for lbl, grids in (("auto", auto), ("ltx2 2x4", {"a": LTX2_2X4}), ("whole", {"a": WHOLE})):
            pred = farm.predict(shots, grids, 8)
            rows.append([protocol, lbl, grid_text(grids), f"{pred.redundancy:.2f}", f"{pred.makespan_s:.3f}",
                         f"{pred.decode_makespan_s:.3f}", f"{pred.transfer_bytes / 1e9:.2f}"])  # fmt: skip
    farm.model = base
    return rows


# Measured on one H200 (nvidia-h200, 2026-11-29) by benchmarks/benchmark_gpu.py, with writes and encodes on
# I/O task threads of the GPU worker: one worker, torch.compile'd
# decoder (plain decode 0.304 s compiled against 0.491 s eager in that run), shots of 1216x704x121.
H200_MEASURED = [
    ("1 shot, H.264 veryfast", 1, True, 2.37),
    ("8 shots, H.264 veryfast", 8, True, 13.06),
    ("8 shots, Zarr only (--no-video)", 8, False, 10.16),
]
COMPILED = 0.304 / 0.491


def h200_rows(farm: Farm) -> list[list[str]]:
    """Predicted against measured for the H200 renders above (decode scaled to the compiled rate)."""
    base = farm.model
    decode = costmodel.DecodeCost({k: v * COMPILED for k, v in base.decode.coefficients.items()})
    rows = []
    for label, count, video, measured in H200_MEASURED:
        farm.model = base.with_(decode=decode, encode_s_per_pixel=base.encode_s_per_pixel if video else 0.0)
        shots = {f"s{k}": SHAPES["1216x704x121"] for k in range(count)}
        pred = farm.predict(shots, {k: WHOLE for k in shots}, 1)
        rows.append(
            [label, f"{pred.makespan_s:.2f}", f"{measured:.2f}", f"{pred.makespan_s / measured - 1:+.0%}"]
        )
    farm.model = base
    return rows


def cpu_validation(reps: int = 3) -> list[list[str]]:
    """Measured against predicted on this machine: real renders of ltx2-tiny jobs on a 2-worker local
    CPU cluster, each plan predicted with the `ltx2-tiny-cpu` cost model (median of `reps` renders)."""
    import statistics
    import tempfile

    from farm.inputs.synthetic import synth
    from farm.planning.jobplan import plan_job
    from farm.planning.options import PlanOptions
    from farm.run.cluster import connect
    from farm.run.render import render

    model = costmodel.load("ltx2-tiny-cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="farm-validate-") as tmp:
        root = Path(tmp)
        jobs = {
            "1 shot 33x256x384": synth(root / "one.zarr", shots=1, frames=33, height=256, width=384),
            "4 shots 33x256x384": synth(root / "four.zarr", shots=4, frames=33, height=256, width=384),
        }
        with connect(workers=2) as client:
            address = client.scheduler.address
            quiet = {"scheduler": address, "log": lambda _: None}
            render(
                jobs["1 shot 33x256x384"].path,
                root / "warm",
                options=PlanOptions(tiles=(1, 1, 1)),
                **quiet,
            )
            run = 0
            for case, job in jobs.items():
                memory = memory_model(job.spec)
                auto = plan_job(job, PlanOptions(), 2)
                grids = {p.grid for p in auto}
                options = [("auto", PlanOptions(tiles=auto[0].grid.tiles, overlap=auto[0].grid.overlap))]
                if len(grids) > 1:
                    options = []  # mixed auto grids cannot be given as one explicit option; skip
                options += [
                    ("whole", PlanOptions(tiles=(1, 1, 1))),
                    ("1x2x2 o0,2,2", PlanOptions(tiles=(1, 2, 2), overlap=(0, 2, 2))),
                ]
                for label, opts in options:
                    plans = plan_job(job, opts, 2)
                    pred = planner.predict(plans, 2, model, memory=memory)
                    seconds = []
                    for _ in range(reps):
                        run += 1
                        stats = render(job.path, root / f"out-{run}", options=opts, **quiet)
                        seconds.append(stats.seconds)
                    measured = statistics.median(seconds)
                    rows.append([
                        case, label, grid_text({p.shot: p.grid for p in plans}), f"{pred.redundancy:.2f}",
                        f"{pred.makespan_s:.2f}", f"{measured:.2f}", f"{pred.makespan_s / measured - 1:+.0%}",
                    ])  # fmt: skip
                    print(f"  {case} {label}: predicted {pred.makespan_s:.2f} s, measured {measured:.2f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cost-model", default="ltx2-h200")
    parser.add_argument("--seams", help="JSON from `measure_seams.py plans` for a seam PSNR column")
    parser.add_argument("--gpus", default="8,32,64,128,256")
    parser.add_argument("--shots", default="100,1000,10000")
    parser.add_argument("--out-md")
    parser.add_argument(
        "--validate-cpu", action="store_true",
        help="also render ltx2-tiny jobs on a 2-worker local CPU cluster: measured against predicted",
    )  # fmt: skip
    args = parser.parse_args(argv)

    model = costmodel.load(args.cost_model)
    memory = memory_model(synth_spec("ltx2", dtype="bfloat16"))
    farm = Farm(model, memory)
    seams = seam_lookup(args.seams)

    out = []
    head = ["case", "workers", "plan", "grid (tiles F,H,W, overlap)", "redundant work", "makespan s",
            "decode+gather s", "GPU decode util.", "peak GiB/worker"]  # fmt: skip
    if seams:
        head.append("seam PSNR dB (ltx2-tiny, random weights)")
    rows, failures = issue_rows(farm, seams)
    out.append("### Single shots and batches\n\n" + table(head, rows))
    out.append(
        "### Transport: one 1216x704x121 shot on 8 workers\n\n"
        + table(
            [
                "protocol",
                "plan",
                "grid",
                "redundant work",
                "makespan s",
                "decode+gather s",
                "GB between workers",
            ],
            transport_rows(farm),
        )  # fmt: skip
    )
    scale = scale_rows(farm, [int(x) for x in args.gpus.split(",")], [int(x) for x in args.shots.split(",")])
    out.append(
        "### Larger farms: N shots of 1216x704x121 on 8-GPU nodes\n\n"
        + table(
            [
                "shots",
                "GPUs (nodes)",
                "plan",
                "grids",
                "redundant work",
                "makespan s",
                "frames/s",
                "GPU decode util.",
                "task threads busy",
                "auto planning s",
            ],
            scale,
        )  # fmt: skip
    )
    out.append(
        "### Measured against predicted: one H200 worker (nvidia-h200, 2026-11-29)\n\n"
        + table(["render", "predicted s", "measured s", "model error"], h200_rows(farm))
    )
    if args.validate_cpu:
        out.append(
            "### Measured against predicted: ltx2-tiny on this machine's 2-worker CPU cluster\n\n"
            + table(
                ["job", "plan", "grid", "redundant work", "predicted s", "measured s", "model error"],
                cpu_validation(),
            )  # fmt: skip
        )
    text = "\n\n".join(out)
    print(text)
    print()
    print("target (auto no worse than shipped in redundant work and makespan; whole shots for batches of "
          "more shots than workers): "
          + ("met in every row" if not failures else "NOT met: " + "; ".join(failures)))  # fmt: skip
    if args.out_md:
        Path(args.out_md).write_text(text + "\n")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
