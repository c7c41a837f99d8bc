"""Probe: one shot split over two GPU workers, its pieces crossing by value (UCX) or by CUDA IPC handle.

Renders single shots on a grid of two spatial tiles (each decoded in carried chunks) on two GPU workers,
alternating ``farm.cuda-ipc`` off (pieces sent by value: UCX synchronises the whole device on both ends
of every CUDA transfer, inside the workers' event loops) and on (`farm.ipc`), and records wall and graph
seconds, when the last decode, blend and write ended, and a hash of the frames (the two modes must
write the same bytes). With one GPU the two workers share it (two copies of dask-cuda's worker for GPU
0); with two or more, one worker per GPU as ``farm render`` starts them.

    python workflows/probe_cross_gpu_pieces.py --sizes 704x1216 1088x1920 --reps 3 --out-json $OUT/x.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def two_gpu_workers(io_workers: int, protocol: str = "ucx") -> Any:
    """A client of two GPU workers (sharing GPU 0 when there is only one) and `io_workers` I/O workers."""
    import dask
    from distributed import Client

    from farm import transport
    from farm.cluster import add_io_workers, connect, detect_gpus

    if detect_gpus() >= 2:
        with connect(workers=2, io_workers=io_workers) as client:
            yield client
        return
    from dask_cuda import LocalCUDACluster

    with dask.config.set({"distributed-ucxx.create-cuda-context": True,
                          "distributed.scheduler.work-stealing": False}):  # fmt: skip
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", n_workers=1, protocol=protocol, host="127.0.0.1",
                                   threads_per_worker=8, dashboard_address="127.0.0.1:0")  # fmt: skip
        try:
            # dask-cuda runs one worker per visible device: a second on GPU 0 is a copy of the first's spec
            ((_, spec),) = cluster.worker_spec.items()
            cluster.worker_spec["gpu0-second"] = copy.deepcopy(spec)
            cluster.sync(cluster._correct_state)
            if io_workers:
                add_io_workers(cluster, io_workers, "auto")
            client = Client(cluster)
            client.wait_for_workers(2 + io_workers, timeout=120)
            transport.install(client)
            yield client
            client.close()
        finally:
            cluster.close()


def _gpu_allocated() -> int:
    """Bytes torch holds allocated on this worker's GPU (0 on a worker without one)."""
    import torch

    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def main() -> None:
    import dask
    from benchmark_output import plan_options, timed_farm

    from farm.render import synth
    from farm.tasks import VideoSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["704x1216", "1088x1920"])
    p.add_argument("--cases", nargs="+", default=["1,1,2,5c,8"], help="F,H,W,CHUNK,BATCH as benchmark_output")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--shots", type=int, default=1, help="shots per job (each split as the case says)")
    p.add_argument("--protocol", default="ucx", help="one GPU: ucx, or tcp (by value through host)")
    p.add_argument("--io-workers", type=int, default=8)
    p.add_argument("--work", default="/tmp/farm-probe-ipc")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    args.compile, args.frames_hash = False, True
    work = Path(args.work)
    results: dict[str, Any] = {"args": vars(args), "rows": []}
    jobs = {}
    for size in args.sizes:
        h, w = (int(x) for x in size.split("x"))
        jobs[size] = work / f"one-{size}.zarr"
        synth(jobs[size], decoder="ltx2", shots=args.shots, overwrite=True, frames=121, height=h, width=w)
    with two_gpu_workers(args.io_workers, args.protocol) as client:
        log(f"cluster: {len(client.scheduler_info(n_workers=-1)['workers'])} workers")
        for size, job in jobs.items():
            for case in args.cases:
                f, hh, ww, chunk, batch = case.split(",")
                options = plan_options((int(f), int(hh), int(ww)), chunk, int(batch))
                for rep in range(args.reps + 1):  # the first of each mode warms the tile shapes
                    for ipc in (False, True):
                        with dask.config.set({"farm.cuda-ipc": ipc}):
                            row = timed_farm(client, job, work / "out", options, VideoSettings(enabled=False),
                                             args)  # fmt: skip
                        tasks = row.pop("tasks")
                        row["gpu_allocated_after"] = client.run(_gpu_allocated)  # pieces all released?
                        row.update({"size": size, "case": case, "ipc": ipc, "rep": rep,
                                    **{f: {k: round(v[f], 3) for k, v in tasks.items()}
                                       for f in ("last", "transfer_s", "compute_s")}})  # fmt: skip
                        results["rows"].append(row)
                        Path(args.out_json).write_text(json.dumps(results, indent=1, default=str))
                        log(f"{size} {case} ipc={ipc} rep {rep}: wall {row['wall_s']:.3f} s graph "
                            f"{row['graph_s']:.3f} s last {row['last']} transfer {row['transfer_s']} "
                            f"sha {str(row['frames_sha256'])[:12]} failed {row['failed']}")  # fmt: skip
    for size, case in ((size, case) for size in args.sizes for case in args.cases):
        rows = [r for r in results["rows"] if (r["size"], r["case"]) == (size, case)]
        same = len({r["frames_sha256"] for r in rows}) == 1  # one grid: the same bytes either way
        for ipc in (False, True):
            walls = sorted(r["wall_s"] for r in rows if r["ipc"] == ipc and r["rep"] > 0)
            log(f"SUMMARY {size} {case} ipc={ipc}: walls {[round(x, 3) for x in walls]}; same bytes: {same}")
    for r in results["rows"]:
        held = {w: round(b / 2**20) for w, b in r["gpu_allocated_after"].items() if b}
        log(f"MEMORY {r['size']} {r['case']} ipc={r['ipc']} rep {r['rep']}: MiB allocated after {held}")


if __name__ == "__main__":
    main()
