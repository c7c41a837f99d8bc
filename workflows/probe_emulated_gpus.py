"""Probe: one shot on one and two emulated GPUs, each a share of one GPU's SMs given by CUDA MPS.

When the 2-GPU machine is not lent, one GPU stands in for two: under the MPS control daemon each GPU
worker process runs at ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of the SMs, and two such processes run their
kernels at the same time on disjoint shares (without MPS they take turns on the whole GPU, which says
nothing about two GPUs). Memory bandwidth and L2 stay shared, so two emulated GPUs decode ≈ 13 % slower
each than one alone (`workflows/probe_mps_split.py`): the emulation is pessimistic, not a 2-GPU figure.
Pieces cross between the two workers by CUDA IPC handle, as on two GPUs of one host (here without a
peer link to cross).

For each GPU-worker count (a TCP cluster of that many workers on GPU 0, or with ``--percent 0`` on a
machine of as many GPUs one on each, as `farm cluster` starts them, and `--io-workers` I/O workers):
the plain decode of the whole shot on one emulated GPU, then each case's renders (the first warms the
chunk shapes), with when each worker's GPU started and finished, and the tasks after the last chunk.

    python workflows/probe_emulated_gpus.py --percent 50 --sizes 704x1216 1088x1920 --runs 3 --out-json x.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def mps(percent: int) -> Any:
    """The MPS control daemon, with every process started meanwhile at `percent` % of the SMs."""
    from probe_mps_split import mps_daemon

    saved = dict(os.environ)
    with mps_daemon() as env:
        os.environ.update(env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(percent))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


@contextlib.contextmanager
def gpu_workers(n: int, io_workers: int, each_own_gpu: bool) -> Any:
    """A TCP cluster of `n` GPU workers and `io_workers` I/O workers: one per GPU (`each_own_gpu`, as
    `farm cluster` starts them), or all on GPU 0 (copies of dask-cuda's worker spec)."""
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    from farm import transport
    from farm.cluster import add_io_workers

    visible = ",".join(str(i) for i in range(n)) if each_own_gpu else "0"
    with dask.config.set({"distributed.scheduler.work-stealing": False}):
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=visible, protocol="tcp", host="127.0.0.1",
                                   threads_per_worker=8, dashboard_address="127.0.0.1:0")  # fmt: skip
        try:
            if not each_own_gpu:
                ((_, spec),) = cluster.worker_spec.items()
                for i in range(1, n):
                    cluster.worker_spec[f"gpu0-copy{i}"] = copy.deepcopy(spec)
                cluster.sync(cluster._correct_state)
            add_io_workers(cluster, io_workers, "auto")
            client = Client(cluster)
            client.wait_for_workers(n + io_workers, timeout=180)
            transport.install(client)
            yield client
            client.close()
        finally:
            cluster.close()


def plain_on_worker(frames: int, height: int, width: int, reps: int) -> list[float]:
    """On a GPU worker: seconds of farm's eager decode of a whole random latent, after a first call."""
    import torch
    from benchmark_output import _timed_plain

    from farm.decoders import load_decoder
    from farm.render import synth_spec

    decoder = load_decoder(synth_spec("ltx2").to_json(), "cuda", compile=False)
    latent = torch.randn(128, (frames - 1) // 8 + 1, height // 32, width // 32)
    return _timed_plain(decoder, latent, reps, f"{height}x{width} on this worker", frames)["all"]


def install_hops() -> str:
    """On a GPU worker: time each piece shared (`share_piece`), each piece opened by IPC, each blend and
    its copy to the host (which waits for the blend's kernels and the pieces' events)."""
    import farm.ipc as ipc
    import farm.tasks as tasks

    # the records live in the worker's farm.tasks: this script runs as __main__, so its own globals
    # would be shipped by value with each call
    hops = tasks.__dict__.setdefault("_probe_hops", [])  # (what, wall start, wall end)
    if not getattr(tasks, "_hops_installed", False):

        def timed(what: str, fn: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                t0 = time.time()
                try:
                    return fn(*a, **k)
                finally:
                    hops.append((what, t0, time.time()))

            return run

        tasks.share_piece = timed("share piece", tasks.share_piece)
        tasks.blend_batch = timed("blend", tasks.blend_batch)
        tasks._to_host = timed("  copy to host", tasks._to_host)
        ipc.SharedPiece.open = timed("  open by IPC", ipc.SharedPiece.open)
        tasks._hops_installed = True
    hops.clear()
    return "installed"


def collect_hops() -> list[tuple[str, float, float]]:
    import farm.tasks as tasks

    return list(tasks.__dict__.get("_probe_hops", []))


def one_render(client: Any, job: Path, dest: Path, options: Any, timeline: bool) -> dict[str, Any]:
    from benchmark_output import frames_hash
    from distributed import get_task_stream
    from probe_one_shot_gpu import collect, install, print_timeline

    from farm.graph import split_workers
    from farm.render import render
    from farm.tasks import VideoSettings

    decoders, _ = split_workers(client)
    client.run(install, workers=decoders)
    client.run(install_hops, workers=decoders)
    shutil.rmtree(dest, ignore_errors=True)
    t0 = time.time()
    with get_task_stream(client=client) as ts:
        stats = render(str(job), str(dest), scheduler=client.scheduler.address, log=lambda _m: None,
                       options=options, video=VideoSettings(enabled=False))  # fmt: skip
    wall = time.time() - t0
    chunks = client.run(collect, workers=decoders)
    gpu = {w.rsplit(":", 1)[-1]: (c[0][2] - t0, c[-1][3] - t0, sum(x[3] - x[2] for x in c), len(c))
           for w, c in chunks.items() if c}  # fmt: skip
    last: dict[str, float] = {}
    for d in ts.data:
        kind = "-".join(str(d["key"][0] if isinstance(d["key"], tuple) else d["key"]).split("-")[:2])
        for s in d["startstops"]:
            last[kind] = max(last.get(kind, 0.0), s["stop"] - t0)
    if timeline and gpu:
        starts, ends = [g[0] for g in gpu.values()], [g[1] for g in gpu.values()]
        print_timeline(ts.data, t0, min(starts), max(ends), [], stats, [])
        for worker, hops in client.run(collect_hops, workers=decoders).items():
            for what, a, b in sorted(hops, key=lambda h: h[1]):
                if b - t0 > max(ends) - 0.4:
                    print(f"    hop :{worker.rsplit(':', 1)[-1]} {a - t0:7.3f} {b - t0:7.3f} {what}")
    return {"wall_s": wall, "setup_s": stats.setup_s, "graph_s": stats.seconds, "failed": len(stats.failed),
            "gpu": gpu, "last": last, "sha": frames_hash(dest)}  # fmt: skip


def set_launch_lead(lead: int) -> int:
    """On a GPU worker: `lead` (``farm.launch-lead``) for the decoders loaded here (paced from now on if
    they were loaded unpaced) and those to come."""
    import dask

    from farm.decoders import _cache

    dask.config.set({"farm.launch-lead": lead})
    for decoder in _cache.values():
        if hasattr(decoder, "pace"):
            decoder.pace(lead)
    return sum(getattr(d, "pacer", None) is not None for d in _cache.values())


def run_case(client: Any, n: int, size: str, job: Path, case: str, args: Any, results: dict) -> None:
    """A case's renders on a cluster of `n` GPU workers: the first warms the chunk shapes, then each run
    renders once per launch lead, the leads interleaved (one machine, one cluster, side by side)."""
    from benchmark_output import plan_options

    from farm.graph import split_workers

    if case == "auto":
        options = plan_options((0, 0, 0), 0, 8)
    else:
        f, hh, ww, chunk, batch = case.split(",")
        options = plan_options((int(f), int(hh), int(ww)), chunk, int(batch))
    decoders, _ = split_workers(client)
    leads = [int(x) for x in args.leads.split(",")]
    for run, lead in [(0, leads[0])] + [(r, lead) for r in range(1, args.runs + 1) for lead in leads]:
        client.run(set_launch_lead, lead, workers=decoders)
        last = args.timeline and run > 0
        if last:
            print(f"TIMELINE {n} workers {size} {case} lead {lead}")
        row = one_render(client, job, Path(args.work) / "out", options, last)
        row.update({"workers": n, "size": size, "case": case, "run": run, "lead": lead})
        results["rows"].append(row)
        Path(args.out_json).write_text(json.dumps(results, indent=1, default=str))
        gpu = {w: tuple(round(x, 3) for x in g[:3]) for w, g in row["gpu"].items()}
        ends = {k: round(v, 3) for k, v in row["last"].items()}
        log(f"{n}w {size} {case} lead {lead} run {run}: wall {row['wall_s']:.3f} setup {row['setup_s']:.3f} "
            f"GPU {gpu} last {ends} sha {row['sha'][:10]}")  # fmt: skip


def main() -> None:
    from farm.cluster import detect_gpus
    from farm.synthetic import synth

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--percent", type=int, default=50, help="SM share per GPU worker; 0: no MPS")
    p.add_argument("--gpu-workers", default="1,2")
    p.add_argument("--sizes", nargs="+", default=["704x1216", "1088x1920"])
    p.add_argument("--cases", nargs="+", default=["1:1,1,1,5c,8", "1:1,1,2,5c,8", "2:1,1,2,5c,8", "2:auto"],
                   help="WORKERS:F,H,W,CHUNK,BATCH (as benchmark_output) or WORKERS:auto")  # fmt: skip
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--io-workers", type=int, default=8)
    p.add_argument("--plain-reps", type=int, default=3)
    p.add_argument("--leads", default="0", help="farm.launch-lead values, interleaved run by run: 0,6,16")
    p.add_argument("--timeline", action="store_true", help="each timed run's tasks and hops at its tail")
    p.add_argument("--work", default="/tmp/farm-probe-emulated")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    work = Path(args.work)
    results: dict[str, Any] = {"args": vars(args), "plain": {}, "rows": []}
    jobs = {}
    for size in args.sizes:
        h, w = (int(x) for x in size.split("x"))
        jobs[size] = work / f"one-{size}.zarr"
        synth(jobs[size], decoder="ltx2", shots=1, overwrite=True, frames=121, height=h, width=w)
    with mps(args.percent) if args.percent else contextlib.nullcontext():
        for n in (int(x) for x in args.gpu_workers.split(",")):
            each_own_gpu = not args.percent and detect_gpus() >= n  # real GPUs: one worker on each
            with gpu_workers(n, args.io_workers, each_own_gpu) as client:
                from farm.graph import split_workers

                decoders, _ = split_workers(client)
                share = f"on GPU 0, {args.percent or 100} % each"
                log(f"{n} GPU worker(s) {'each on a GPU of its own' if each_own_gpu else share}: {decoders}")
                if n == 1 and args.plain_reps:  # 0: no plain decode (saves a minute a cluster)
                    for size in args.sizes:
                        h, w = (int(x) for x in size.split("x"))
                        t = client.run(plain_on_worker, 121, h, w, args.plain_reps, workers=decoders[:1])
                        results["plain"][size] = next(iter(t.values()))
                        log(f"plain decode {size} on one worker: {[round(x, 3) for x in t[decoders[0]]]}")
                for size, job in jobs.items():
                    for case in (c.split(":", 1)[1] for c in args.cases if int(c.split(":")[0]) == n):
                        run_case(client, n, size, job, case, args, results)
    summarize(results, args)


def summarize(results: dict, args: Any) -> None:
    """Walls per size, case, worker count and lead; whether each grid wrote one set of bytes throughout."""
    for size in args.sizes:
        for case in args.cases:
            n, c = case.split(":", 1)
            shas = {r["sha"] for r in results["rows"] if (r["size"], r["case"]) == (size, c)}
            for lead in (int(x) for x in args.leads.split(",")):
                key = (size, c, int(n), lead)
                rows = [r for r in results["rows"] if (r["size"], r["case"], r["workers"], r["lead"]) == key]
                walls = [round(r["wall_s"], 3) for r in rows if r["run"] > 0]
                log(f"SUMMARY {size} {n}w {c} lead {lead}: walls {walls}; frames {len(shas)} distinct")


if __name__ == "__main__":
    main()
