"""Where a carried segment's decode task spends its time, outside Dask.

In a render, each carried segment's decode task took ≈ 0.16 s at 1088x1920 whatever its chunk's
frames (0.07 s at 704x1216), while a whole-tile decode task took 0.09 s (docs/benchmarks.md):
tasks that only queue GPU work should return long before the GPU finishes it. This calls
`farm.tasks.decode_tile` segment after segment in one process, as a GPU worker's task threads do
(each takes the previous segment's result), times when each call returns and when the GPU is done,
then profiles one pass (torch.profiler, CPU side) and prints the calls that took the most time.

    python workflows/probe_carried_tasks.py --size 1088x1920 --chunk 4 --taper 1 0
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def segments_of(job_path: Path, chunk: int, taper: bool, batch: int) -> tuple:
    from farm.graph import _cuts
    from farm.jobplan import plan_shots
    from farm.options import PlanOptions
    from farm.schedule import make_schedule
    from farm.store import open_job
    from farm.tiling import ChunkSize, assign_round_robin

    job = open_job(job_path)
    options = PlanOptions(tiles=(1, 1, 1), batch_frames=batch,
                          chunk=ChunkSize(frames=chunk, carry=True, taper=taper))  # fmt: skip
    plans, _ = plan_shots(job, options)
    plans = assign_round_robin(plans, 1)
    schedule = make_schedule(plans, n_decode=1, n_io=1)
    steps = [(plans[s.shot].tiles[s.tile], _cuts(plans[s.shot], s), s.segment) for s in schedule.decodes]
    return job, plans[0].chunk, steps


def one_pass(job: object, chunk: object, steps: list) -> dict:
    import torch

    from farm.tasks import decode_tile

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    returned, previous, results = [], None, []
    for tile, cuts, segment in steps:
        previous = decode_tile(str(job.path), job.spec.to_json(), tile, chunk, cuts, False, segment, previous)  # type: ignore[attr-defined]
        results.append(previous)
        returned.append(time.perf_counter() - t0)
    sync()
    return {"returned": returned, "gpu_done": time.perf_counter() - t0}


def main() -> None:
    import torch

    from farm.render import synth
    from farm.tasks import on_decode_thread

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoder", default="ltx2")
    p.add_argument("--size", default="1088x1920")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--chunk", type=int, default=4)
    p.add_argument("--taper", type=int, nargs="+", default=[1, 0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--work", default="/tmp/farm-probe-carried")
    args = p.parse_args()
    h, w = (int(x) for x in args.size.split("x"))
    job_path = Path(args.work) / "job.zarr"
    synth(job_path, decoder=args.decoder, shots=1, frames=args.frames, height=h, width=w, overwrite=True)
    for taper in args.taper:
        job, chunk, steps = segments_of(job_path, args.chunk, bool(taper), args.batch)
        for _ in range(2):  # warm: model load, cuDNN algorithms, allocator caches
            one_pass(job, chunk, steps)
        for _ in range(2):
            r = one_pass(job, chunk, steps)
            print(f"taper {taper}: calls returned at " + ", ".join(f"{t:.3f}" for t in r["returned"])
                  + f" s; GPU done at {r['gpu_done']:.3f} s", flush=True)  # fmt: skip
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)  # runtime calls: syncs, mallocs
        prof = torch.profiler.profile(activities=activities)
        try:
            on_decode_thread(prof.__enter__)  # the decodes run on the decode thread: profile that thread
            one_pass(job, chunk, steps)
            on_decode_thread(prof.__exit__, None, None, None)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16), flush=True)
        except Exception as exc:  # the profiler is a diagnosis: the timings above stand without it
            print(f"profiler failed: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
