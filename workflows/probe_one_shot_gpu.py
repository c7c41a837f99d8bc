"""Probe: where one carried shot's render leaves the GPU idle, on a real 1-GPU cluster.

On the GPU worker, each carried chunk's decode (`decode_carried`) is bracketed by CUDA events on its
stream, placed on the wall clock against an event recorded when the probe was installed. Beside Dask's
task stream, this gives when the GPU started and finished each chunk, the gaps between chunks, and how
long after the GPU's last chunk the render ended (blend, copy, write and mark of the last batch).

    python workflows/probe_one_shot_gpu.py --size 704x1216 --runs 3 --clusters inproc daemon

``--clusters``: ``inproc`` starts the cluster in this process (as ``farm render`` without a scheduler
does: the scheduler's event loop shares this process's GIL with the render's driver); ``daemon`` runs
``farm cluster --gpus 1`` in a process of its own and renders into it by its scheduler file, as a
studio's long-lived cluster is used.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any


def install() -> str:
    """On a GPU worker: wrap the LTX-2 decoder's carried decode with CUDA events (once)."""
    import torch

    from farm.decoders.ltx2 import LTX2Decoder

    # the probe's state lives on the class in the worker: this function is shipped by value each call
    if not hasattr(LTX2Decoder, "_probe_records"):
        ref = torch.cuda.Event(enable_timing=True)
        ref.record()
        ref.synchronize()
        LTX2Decoder._probe_ref = (ref, time.time())  # type: ignore[attr-defined]
        LTX2Decoder._probe_records = []  # type: ignore[attr-defined]
        plain = LTX2Decoder.decode_carried

        def timed(self: Any, latent: Any, state: Any, origin: Any = None) -> Any:
            t0 = time.time()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = plain(self, latent, state, origin)
            end.record()
            LTX2Decoder._probe_records.append((t0, time.time(), start, end, int(latent.shape[1])))
            return out

        LTX2Decoder.decode_carried = timed  # type: ignore[method-assign]
        _install_hops(LTX2Decoder)
    LTX2Decoder._probe_records.clear()
    LTX2Decoder._probe_hops.clear()
    return "installed"


def _install_hops(holder: Any) -> None:
    """Wall-clock times of the steps before a chunk's kernels: the decoder's lookup, the latent's read from
    the job store, the task handing its decode to the decode thread, the thread starting it, and the
    latent's copy to the GPU (`decoder_input`)."""
    import farm.tasks as tasks

    holder._probe_hops = []
    plain_on, plain_input = tasks.on_decode_thread, holder.decoder_input

    def timed_on(fn: Any, *args: Any) -> Any:
        handed = time.time()

        def run(*a: Any) -> Any:
            started = time.time()
            out = fn(*a)
            holder._probe_hops.append(("decode thread", handed, started, time.time()))
            return out

        return plain_on(run, *args)

    def timed_input(self: Any, latent: Any) -> Any:
        t0 = time.time()
        out = plain_input(self, latent)
        holder._probe_hops.append(("latent to GPU", t0, t0, time.time()))
        return out

    def timed(what: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t0 = time.time()
            out = fn(*a, **k)
            holder._probe_hops.append((what, t0, t0, time.time()))
            return out

        return run

    import farm.decoders as decoders

    tasks.on_decode_thread = timed_on
    holder.decoder_input = timed_input
    tasks._read_tile_latent = timed("read latent", tasks._read_tile_latent)
    decoders.load_decoder = timed("load decoder", decoders.load_decoder)


def hops() -> list[tuple[str, float, float, float]]:
    from farm.decoders.ltx2 import LTX2Decoder

    return list(LTX2Decoder._probe_hops)


def collect() -> list[tuple[float, float, float, float, int]]:
    """Each chunk's (call, return, GPU start, GPU end) on the wall clock, and its latent frames."""
    from farm.decoders.ltx2 import LTX2Decoder

    ref, t_ref = LTX2Decoder._probe_ref
    out = []
    for t0, t1, start, end, frames in LTX2Decoder._probe_records:
        end.synchronize()
        out.append(
            (t0, t1, t_ref + ref.elapsed_time(start) / 1e3, t_ref + ref.elapsed_time(end) / 1e3, frames)
        )
    return out


def one_render(
    client: Any, job: Path, dest: Path, options: Any, timeline: bool = False, settle: float = 0
) -> None:
    from distributed import get_task_stream

    from farm.graph import split_workers
    from farm.render import render
    from farm.tasks import VideoSettings

    decoders, _ = split_workers(client)
    client.run(install, workers=decoders)
    shutil.rmtree(dest, ignore_errors=True)
    if settle:  # the last render's files deleted and flushed before this one's fsyncs start
        os.sync()
        time.sleep(settle)
    seen: list[tuple[float, int]] = []  # when the driver saw each batch written

    def progress(stats: Any) -> None:
        seen.append((time.time(), stats.batches_written))

    t0 = time.time()
    with get_task_stream(client=client) as ts:
        stats = render(str(job), str(dest), scheduler=client.scheduler.address, log=lambda _m: None,
                       options=options, video=VideoSettings(enabled=False), on_progress=progress)  # fmt: skip
    wall = time.time() - t0
    chunks = next(iter(client.run(collect, workers=decoders).values()))
    steps = next(iter(client.run(hops, workers=decoders).values())) if timeline else []
    last: dict[str, float] = {}
    for d in ts.data:
        kind = str(d["key"][0] if isinstance(d["key"], tuple) else d["key"]).split("-")[:2]
        for s in d["startstops"]:
            last["-".join(kind)] = max(last.get("-".join(kind), 0.0), s["stop"] - t0)
    gpu_start, gpu_end = chunks[0][2] - t0, chunks[-1][3] - t0
    busy = sum(c[3] - c[2] for c in chunks)
    print(f"wall {wall:.3f} s (set-up {stats.setup_s:.3f}, graph {stats.seconds:.3f}); GPU first chunk at "
          f"{gpu_start:.3f}, last ends {gpu_end:.3f} s: busy {busy:.3f} s of {gpu_end - gpu_start:.3f}; "
          f"after the GPU: {wall - gpu_end:.3f} s")  # fmt: skip
    for t_call, t_ret, g0, g1, frames in chunks:
        print(f"  chunk of {frames}: called {t_call - t0:.3f}, returned {t_ret - t0:.3f}, GPU {g0 - t0:.3f}"
              f"-{g1 - t0:.3f} ({g1 - g0:.3f} s)")  # fmt: skip
    if timeline:
        print_timeline(ts.data, t0, gpu_start, gpu_end, seen, stats, steps)
    print(
        "  last task ends: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(last.items(), key=lambda kv: kv[1]))
    )


def print_timeline(data: list[dict], t0: float, gpu_start: float, gpu_end: float,
                   seen: list[tuple[float, int]], stats: Any, steps: list) -> None:
    """Every task that ran before the GPU's first chunk or after its last one (start, stop, worker, what
    it did), and when the driver saw the last batches written: where the render's head and tail go."""
    print(f"  set-up phases: {', '.join(f'{k} {v:.3f}' for k, v in stats.setup_phases.items())}; "
          f"finish {stats.finish_s:.3f} s")  # fmt: skip
    rows = []
    for d in data:
        key = d["key"]
        name = "-".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
        for s in d["startstops"]:
            start, stop = s["start"] - t0, s["stop"] - t0
            if start < gpu_start + 0.005 or stop > gpu_end - 0.005 or "decode" in name or "blend" in name:
                rows.append((start, stop, s["action"], d["worker"].rsplit(":", 1)[-1], name[-60:]))
    for what, handed, started, ended in steps:
        rows.append((started - t0, ended - t0, "worker", "gpu", f"{what} (handed {handed - t0:.3f})"))
    for start, stop, action, worker, name in sorted(rows):
        print(f"    {start:7.3f} {stop:7.3f} {action:9s} :{worker:6s} {name}")
    for when, written in seen[-3:]:
        print(f"    driver saw {written} batches written at {when - t0:.3f}")


def main() -> None:
    from bench_clusters import KINDS, cluster

    from farm.options import PlanOptions
    from farm.synthetic import synth
    from farm.tiling import ChunkSize

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="704x1216")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--chunk", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", default="/tmp/farm-probe-one-shot")
    p.add_argument("--clusters", nargs="+", default=["inproc"], choices=KINDS)
    p.add_argument("--timeline", action="store_true", help="print the tasks of the render's head and tail")
    p.add_argument("--timelines", action="store_true", help="print every run's head and tail")
    p.add_argument("--settle", type=float, default=0.0,
                   help="after deleting the last run's output: sync, then wait so many seconds")  # fmt: skip
    args = p.parse_args()
    h, w = (int(x) for x in args.size.split("x"))
    work = Path(args.work)
    job = work / "job.zarr"
    synth(job, decoder="ltx2", shots=1, overwrite=True, frames=args.frames, height=h, width=w)
    options = PlanOptions(tiles=(1, 1, 1), batch_frames=args.batch,
                          chunk=ChunkSize(frames=args.chunk, carry=True))  # fmt: skip
    for kind in args.clusters:
        with cluster(kind, work, 1) as client:
            print(f"cluster {kind}: workers {sorted(client.scheduler_info()['workers'])}")
            for run in range(args.runs + 1):
                print(f"{kind} run {run}" + (" (warms the chunk shapes)" if run == 0 else ""))
                timeline = args.timelines or (args.timeline and run == args.runs)
                one_render(client, job, work / "out", options, timeline, args.settle)


if __name__ == "__main__":
    main()
