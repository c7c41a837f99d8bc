"""Benchmark farm on one GPU: plain diffusers decode vs farm end to end, two workers on one GPU, chunking.

Parts (each runs even if an earlier one failed; errors are recorded per part):

1. ``plain``     in-process eager diffusers ``AutoencoderKLLTX2Video`` (farm's weights: same spec, same
                 seed), one untiled decode of a whole shot, timed after a warm-up: frames/s, peak memory.
2. ``farm``      ``farm.run.render.render`` on an embedded one-worker cluster (LocalCUDACluster, UCX when
                 installed), started before timing; a warm-up render of one shot loads the model, then
                 renders of 1 and N shots are timed from ``render()`` call to frames in Zarr + mp4 written.
3. ``two``       two workers sharing the one GPU render one shot split into tiles (1,2,1), so decoded
                 pieces travel between workers; ``farm.worker.transport.transport_stats`` per worker.
4. ``chunk``     one shot rendered with intra-GPU chunking: peak memory per worker against
                 ``LTX2Decoder.peak_bytes`` of the largest chunk, and against the untiled render's peak.

GPU run (figures in docs/performance.md, "Memory" and "Decoded tiles in flight")::

    PYTHONUNBUFFERED=1 python benchmarks/benchmark_gpu.py --out-json $OUT/bench.json --out-md $OUT/bench.md

CPU smoke test (tiny decoder, small sizes)::

    python benchmarks/benchmark_gpu.py --decoder ltx2-tiny --frames 17 --height 128 --width 192 \\
        --shots 2 --chunk 2,3 --out-json /tmp/b.json --out-md /tmp/b.md
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------------
# Functions run on workers through client.run (cloudpickle sends functions of __main__ by value)
# --------------------------------------------------------------------------------------------------


def worker_reset_peak() -> int:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return 0


def worker_peak() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "max_allocated": 0, "allocated": 0}
    return {
        "device": torch.cuda.get_device_name(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
    }


def worker_reset_transport() -> None:
    from farm.worker.transport import reset_transport_stats

    reset_transport_stats()


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

GiB = 1024**3


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def log(msg: str) -> None:
    print(msg, flush=True)


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "host_cpus": os.cpu_count(),
    }
    for mod in ("dask", "distributed", "dask_cuda", "distributed_ucxx", "diffusers", "zarr", "av"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 (report what is missing)
            info[mod] = f"not importable: {type(exc).__name__}"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["torch_cuda"] = torch.version.cuda
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["nvidia_smi"] = smi.stdout.strip()
        except Exception as exc:  # noqa: BLE001
            info["nvidia_smi"] = f"failed: {exc}"
    return info


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def record_error(results: dict, part: str, exc: BaseException) -> None:
    results.setdefault("errors", {})[part] = f"{type(exc).__name__}: {exc}"
    log(f"!! part {part} failed: {type(exc).__name__}: {exc}")
    traceback.print_exc()


def per_worker(client: Any, fn: Any) -> dict[str, Any]:
    return client.run(fn)


def stats_dict(stats: Any) -> dict[str, Any]:
    return {
        "seconds": stats.seconds,
        "tiles_total": stats.tiles_total,
        "tiles_decoded": stats.tiles_decoded,
        "batches_written": stats.batches_written,
        "batches_total": stats.batches_total,
        "frames_written": stats.frames_written,
        "write_s": stats.write_s,
        "encode_s": stats.encode_s,
        "window": stats.window,
        "max_tiles_held": stats.max_tiles_held,
        "failed": [f"{s.shot}: {s.error}" for s in stats.failed],
        "videos": [s.video for s in stats.shots.values()],
    }


COMPILE = False  # set from --compile: farm's workers torch.compile the decoder
VIDEO: Any = None  # farm.worker.tasks.VideoSettings from --preset / --no-video
VARIANTS: list[tuple[str, Any]] = []  # (label, VideoSettings) of each farm render, from --videos
TILES: Any = (1, 1, 1)  # --tiles: the farm renders' tile grid, or "auto"
WINDOW: int | None = None  # --window: decoded tiles in flight (farm's default when None)


def timed_render(
    job: Path, out: Path, scheduler: str, options: Any, quiet: bool = True, video: Any = None
) -> dict[str, Any]:
    """Render `job` on the running cluster; wall time from the call to frames and videos written."""
    import zarr
    from distributed import get_task_stream

    from farm.run.render import render

    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    with get_task_stream() as ts:  # the benchmark's client (the default one)
        stats = render(
            str(job), str(out), scheduler=scheduler, options=options, log=(lambda _m: None) if quiet else log,
            compile=COMPILE, video=video or VIDEO, window=WINDOW,
        )  # fmt: skip
    wall = time.perf_counter() - t0
    d = stats_dict(stats)
    d["tasks"] = task_summary(ts.data)
    d["wall_s"] = wall
    d["frames_per_s"] = stats.frames_written / wall if wall > 0 else 0.0
    videos = [Path(v) for v in d["videos"] if v]
    d["videos_ok"] = len(videos) == len(stats.shots) and all(
        v.exists() and v.stat().st_size > 0 for v in videos
    )
    root = zarr.open_group(store=str(out / "frames.zarr"), mode="r")
    d["zarr_frames"] = sum(root[name]["frames"].shape[0] for name in stats.shots)
    if d["failed"]:
        raise RuntimeError(f"render of {job.name} had failed shots: {d['failed']}")
    return d


def task_summary(records: list[dict]) -> dict[str, dict[str, float]]:
    """Per task kind (the key's first element): count, compute and transfer seconds, first start and
    last stop (seconds after the first task started), from Dask's task stream."""
    starts = [ss["start"] for r in records for ss in r.get("startstops", ())]
    origin = min(starts) if starts else 0.0
    out: dict[str, dict[str, float]] = {}
    for r in records:
        key = r.get("key")
        kind = str(key[0] if isinstance(key, tuple) else key).split("-")[0:2]
        s = out.setdefault(
            "-".join(kind), {"n": 0, "compute_s": 0.0, "transfer_s": 0.0, "first": 1e9, "last": 0.0}
        )
        s["n"] += 1
        for ss in r.get("startstops", ()):
            name = "compute_s" if ss["action"] == "compute" else "transfer_s"
            s[name] += ss["stop"] - ss["start"]
            s["first"] = min(s["first"], ss["start"] - origin)
            s["last"] = max(s["last"], ss["stop"] - origin)
    return out


# --------------------------------------------------------------------------------------------------
# Part 1: plain in-process decode
# --------------------------------------------------------------------------------------------------


def timed_reps(decode: Any, reps: int) -> list[float]:
    """Wall seconds of `reps` calls of `decode`, each bracketed by a device synchronisation."""
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        out = decode()
        sync()
        times.append(time.perf_counter() - t0)
        del out
    return times


def part_plain(args: argparse.Namespace, results: dict) -> None:
    import torch

    from farm.decoders import decoder_class
    from farm.inputs.synthetic import synth_spec

    spec = synth_spec(args.decoder)
    cls = decoder_class(spec)
    geometry = cls.geometry_for(spec.config)
    channels = cls.latent_channels_for(spec.config)
    f = (args.frames - 1) // geometry.temporal_scale + 1
    h, w = args.height // geometry.spatial_scale, args.width // geometry.spatial_scale
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, spec.dtype)

    t0 = time.perf_counter()
    model = cls.build(spec)  # same weights as farm's workers (same spec, same seed)
    build_s = time.perf_counter() - t0
    model.encoder = torch.nn.Identity()  # as farm's workers: decode only, encoder weights not on the GPU
    model.to(device, dtype)
    sync()
    weights_bytes = torch.cuda.memory_allocated() if device == "cuda" else 0
    gen = torch.Generator().manual_seed(0)
    z = torch.randn((1, channels, f, h, w), generator=gen).to(device, dtype)
    temb = None
    if model.config.timestep_conditioning:
        temb = torch.tensor([0.0], device=device, dtype=dtype)

    def decode() -> Any:
        with torch.inference_mode():
            return model.decode(z, temb=temb, return_dict=False)[0]

    out = decode()  # warm-up
    sync()
    shape = list(out.shape)
    del out
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = timed_reps(decode, args.reps)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    med = statistics.median(times)
    results["plain"] = {
        "device": device,
        "dtype": spec.dtype,
        "latent": [1, channels, f, h, w],
        "output": shape,
        "frames": shape[2],
        "build_s": build_s,
        "times_s": times,
        "median_s": med,
        "frames_per_s": shape[2] / med,
        "weights_bytes": weights_bytes,
        "peak_bytes": peak,
    }
    log(
        f"plain decode {shape}: median {med:.3f} s over {args.reps} ({shape[2] / med:.1f} frames/s), "
        f"peak {gib(peak)} GiB, weights {gib(weights_bytes)} GiB"
    )
    if args.compile and device == "cuda":
        from farm.decoders import compile_mode

        mode = compile_mode(args.compile)
        model.decoder = torch.compile(model.decoder, mode=None if mode == "default" else mode)
        t0 = time.perf_counter()
        decode()  # reduce-overhead records its CUDA graph on a later call than the first
        sync()
        decode()
        sync()
        compile_s = time.perf_counter() - t0
        times = timed_reps(decode, args.reps)
        med = statistics.median(times)
        results["plain_compiled"] = {"compile_s": compile_s, "median_s": med, "frames_per_s": shape[2] / med}
        log(f"plain decode, torch.compile: first call {compile_s:.1f} s, median {med:.3f} s "
            f"({shape[2] / med:.1f} frames/s)")  # fmt: skip
    model = z = None  # free the GPU memory before the clusters start
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# Parts 2 and 4: one worker
# --------------------------------------------------------------------------------------------------


def part_farm_and_chunk(args: argparse.Namespace, results: dict, work: Path) -> None:
    from farm.decoders import decoder_class
    from farm.inputs.synthetic import synth
    from farm.planning.budgets import tile_chunk_volume
    from farm.planning.jobplan import plan_job
    from farm.planning.options import PlanOptions
    from farm.planning.tiling import ChunkSize
    from farm.run.cluster import connect
    from farm.run.render import render
    from farm.store.job import open_job

    sizes = {"frames": args.frames, "height": args.height, "width": args.width}
    jobs: dict[int, Path] = {}
    t0 = time.perf_counter()
    for n in sorted({1, args.shots, args.workers}):
        jobs[n] = work / f"job{n}.zarr"
        synth(jobs[n], decoder=args.decoder, shots=n, overwrite=True, **sizes)
    log(f"synth jobs {sorted(jobs)} in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    with connect(workers=args.workers) as client:
        startup = time.perf_counter() - t0
        address = client.scheduler.address
        results["farm"] = {"cluster_start_s": startup, "scheduler": address, "runs": {}}
        log(f"cluster (1 worker) started in {startup:.1f} s at {address}")
        runs = results["farm"]["runs"]

        # warm-up: model load and CUDA init on the worker
        t0 = time.perf_counter()
        # one shot per worker, so every worker loads (and compiles) its model before the timed runs
        stats = render(
            str(jobs[args.workers]), str(work / "out-warm"), scheduler=address, log=lambda _m: None,
            compile=COMPILE, options=PlanOptions(tiles=TILES),
        )  # fmt: skip
        results["farm"]["warmup_s"] = time.perf_counter() - t0
        log(
            f"warm-up render (1 shot, includes model load) {results['farm']['warmup_s']:.1f} s, "
            f"{stats.frames_written} frames"
        )

        results["farm"]["workers"] = sorted(
            str(w.get("name")) for w in client.scheduler_info(n_workers=-1)["workers"].values()
        )
        for (label, video), n in ((v, n) for v in VARIANTS for n in sorted(jobs)):
            try:
                per_worker(client, worker_reset_peak)
                d = timed_render(jobs[n], work / f"out-{n}", address, PlanOptions(tiles=TILES), video=video)
                d["peak_per_worker"] = per_worker(client, worker_peak)
                d["video"] = label
                runs[f"{n} {label}" if len(VARIANTS) > 1 else str(n)] = d
                peaks = [v["max_allocated"] for v in d["peak_per_worker"].values()]
                log(
                    f"farm {n} shot(s), {label}: {d['frames_written']} frames in {d['wall_s']:.2f} s "
                    f"({d['frames_per_s']:.1f} frames/s; run_graph {d['seconds']:.2f} s) "
                    ""
                    f"write {d['write_s']:.2f} s encode {d['encode_s']:.2f} s; peak/worker "
                    f"{[gib(p) for p in peaks]} GiB; zarr frames {d['zarr_frames']}, "
                    f"videos ok {d['videos_ok']}"
                )
                for kind, t in sorted(d["tasks"].items(), key=lambda kv: kv[1]["first"]):
                    log(
                        f"    {kind:16s} n={t['n']:3d} compute {t['compute_s']:6.2f} s transfer "
                        f"{t['transfer_s']:5.2f} s span {t['first']:5.2f}-{t['last']:5.2f} s"
                    )
            except Exception as exc:  # noqa: BLE001
                record_error(results, f"farm-{n}", exc)

        # Part 4: intra-GPU chunking, same worker
        try:
            if "chunk" not in args.parts.split(","):
                return
            chunk = ChunkSize(height=args.chunk[0], width=args.chunk[1])
            options = PlanOptions(chunk=chunk)
            job = open_job(jobs[1])
            cls = decoder_class(job.spec)
            geometry = cls.geometry_for(job.spec.config)
            plan = plan_job(job, options, 1)[0]
            plan_plain = plan_job(job, PlanOptions(tiles=(1, 1, 1)), 1)[0]
            est = max(
                cls.peak_bytes(job.spec, tile_chunk_volume(t, plan.chunk, geometry)) for t in plan.tiles
            )
            est_plain = max(
                cls.peak_bytes(job.spec, tile_chunk_volume(t, plan_plain.chunk, geometry))
                for t in plan_plain.tiles
            )
            from farm.planning.tiling import plan_chunks

            chunks = plan_chunks([iv.size for iv in plan.tiles[0].latent], geometry, chunk)
            per_worker(client, worker_reset_peak)
            d = timed_render(jobs[1], work / "out-chunk", address, options)
            d["peak_per_worker"] = per_worker(client, worker_peak)
            d.update(
                chunk={"height": chunk.height, "width": chunk.width, "overlap": list(chunk.overlap)},
                n_chunks=len(chunks),
                chunk_latent=[[iv.start, iv.end] for iv in chunks[0].latent],
                chunk_pixel_volume=max(c.pixel_volume for c in chunks),
                estimate_bytes=est,
                estimate_untiled_bytes=est_plain,
                weight_bytes_estimate=cls.weight_bytes(job.spec),
            )
            results["chunk"] = d
            peaks = [v["max_allocated"] for v in d["peak_per_worker"].values()]
            log(
                f"chunked {chunk}: {len(chunks)} chunks, {d['wall_s']:.2f} s "
                f"({d['frames_per_s']:.1f} frames/s); "
                f"peak/worker {[gib(p) for p in peaks]} GiB vs estimate {gib(est)} GiB "
                f"(untiled estimate {gib(est_plain)} GiB)"
            )
        except Exception as exc:  # noqa: BLE001
            record_error(results, "chunk", exc)


# --------------------------------------------------------------------------------------------------
# Part 3: two workers on one GPU
# --------------------------------------------------------------------------------------------------


def _wait_for_file(path: Path, procs: list[subprocess.Popen], timeout: float) -> None:
    t0 = time.perf_counter()
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"process {p.args[:3]} exited with {p.returncode} before {path} appeared")
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.2)


def start_subprocess_cluster(work: Path, protocol: str, gpu: bool) -> tuple[str, list[subprocess.Popen]]:
    """A scheduler and two worker processes (``dask cuda worker`` when `gpu`), all on one device."""
    sched_file = work / "scheduler.json"
    sched_file.unlink(missing_ok=True)
    env = dict(os.environ)
    if gpu:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    logs = []
    procs: list[subprocess.Popen] = []

    def spawn(name: str, argv: list[str]) -> None:
        fh = open(work / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        logs.append(fh)
        procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT))

    spawn(
        "scheduler",
        [
            sys.executable,
            "-c",
            "from distributed.cli.dask_scheduler import main; main()",
            "--protocol",
            protocol,
            "--host",
            "127.0.0.1",
            "--scheduler-file",
            str(sched_file),
            "--dashboard-address",
            "127.0.0.1:0",
        ],
    )
    _wait_for_file(sched_file, procs, 60)
    worker_main = (
        "from dask_cuda.cli import worker as main" if gpu else "from distributed.cli.dask_worker import main"
    )
    for i in range(2):
        spawn(
            f"worker{i}",
            [
                sys.executable,
                "-c",
                f"{worker_main}; main()",
                "--scheduler-file",
                str(sched_file),
                "--nthreads",
                "1",
                "--name",
                f"w{i}",
                "--host",
                "127.0.0.1",
                "--no-dashboard",
            ],
        )
    return str(sched_file), procs


def stop_processes(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def part_two_workers(args: argparse.Namespace, results: dict, work: Path) -> None:
    import torch
    from distributed import Client

    from farm.inputs.synthetic import synth
    from farm.planning.options import PlanOptions
    from farm.run.cluster import connect, ucx_available
    from farm.worker import transport

    gpu = torch.cuda.is_available()
    protocol = "ucx" if (gpu and ucx_available()) else "tcp"
    job = work / "job-two.zarr"
    synth(
        job,
        decoder=args.decoder,
        shots=1,
        frames=args.frames,
        height=args.height,
        width=args.width,
        overwrite=True,
    )
    part: dict[str, Any] = {"protocol": protocol, "attempts": []}
    results["two"] = part

    # The simplest first: LocalCUDACluster with the same GPU listed twice.
    cluster = None
    procs: list[subprocess.Popen] = []
    client = None
    t0 = time.perf_counter()
    if gpu and args.two_mode in ("auto", "local-cuda"):
        try:
            import dask
            from dask_cuda import LocalCUDACluster

            with dask.config.set({"distributed-ucxx.create-cuda-context": True}):
                cluster = LocalCUDACluster(
                    CUDA_VISIBLE_DEVICES="0,0",
                    n_workers=2,
                    protocol=protocol,
                    threads_per_worker=1,
                    host="127.0.0.1",
                    dashboard_address="127.0.0.1:0",
                )
            client = Client(cluster)
            transport.install(client)
            part["attempts"].append({"how": 'LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0")', "ok": True})
        except Exception as exc:  # noqa: BLE001
            part["attempts"].append(
                {
                    "how": 'LocalCUDACluster(CUDA_VISIBLE_DEVICES="0,0")',
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
            log(f"LocalCUDACluster(CUDA_VISIBLE_DEVICES='0,0') failed: {type(exc).__name__}: {exc}")
            if cluster is not None:
                cluster.close()
                cluster = None
    if client is None and args.two_mode in ("auto", "subprocess"):
        how = (
            "two `dask cuda worker` processes, CUDA_VISIBLE_DEVICES=0"
            if gpu
            else "two `dask worker` processes"
        ) + f", scheduler subprocess, {protocol}"
        try:
            sched_file, procs = start_subprocess_cluster(work, protocol, gpu)
            client = Client(scheduler_file=sched_file)
            client.wait_for_workers(2, timeout=120)
            transport.install(client)
            part["attempts"].append({"how": how, "ok": True})
        except Exception as exc:  # noqa: BLE001
            part["attempts"].append({"how": how, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            log(f"{how} failed: {type(exc).__name__}: {exc}")
            for name in ("scheduler", "worker0", "worker1"):
                p = work / f"{name}.log"
                if p.exists():
                    log(f"--- {name}.log (tail)\n" + "\n".join(p.read_text().splitlines()[-30:]))
            if client is not None:
                client.close()
                client = None
            stop_processes(procs)
            procs = []
    if client is None and args.two_mode == "cpu":
        cm = connect(workers=2)
        client = cm.__enter__()
        part["attempts"].append({"how": "farm.run.cluster.connect(workers=2) (CPU, tcp)", "ok": True})
    if client is None:
        raise RuntimeError(f"no two-worker cluster could be started: {part['attempts']}")
    part["cluster_start_s"] = time.perf_counter() - t0
    try:
        address = client.scheduler.address
        part["scheduler"] = address
        part["workers"] = {
            a: w.get("name") for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
        }
        log(f"two-worker cluster up in {part['cluster_start_s']:.1f} s: {part['workers']}")
        options = PlanOptions(tiles=(1, 2, 1))
        client.run(worker_reset_transport)
        warm = timed_render(job, work / "out-two-warm", address, options)  # model load on both workers
        part["warmup_s"] = warm["wall_s"]
        part["warmup_transport"] = client.run(transport.transport_stats)
        log(f"two workers, warm-up render (model load on both) {warm['wall_s']:.1f} s")
        per_worker(client, worker_reset_peak)
        client.run(worker_reset_transport)
        d = timed_render(job, work / "out-two", address, options)
        d["transport"] = client.run(transport.transport_stats)
        d["peak_per_worker"] = per_worker(client, worker_peak)
        part["render"] = d
        log(
            f"two workers, tiles 1,2,1: {d['frames_written']} frames in {d['wall_s']:.2f} s "
            f"({d['frames_per_s']:.1f} frames/s, after warm-up); transport per worker:"
        )
        for addr, st in d["transport"].items():
            log(f"  {addr}: {st}")
        totals = {
            k: sum(st[k] for st in d["transport"].values()) for k in next(iter(d["transport"].values()))
        }
        part["transport_totals"] = totals
        log(
            f"  totals: device_frames {totals['device_frames']} device_bytes {totals['device_bytes']} "
            f"host_copies {totals['host_copies']} device_to_host {totals['device_to_host']}"
        )
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
        stop_processes(procs)
        if args.two_mode == "cpu":
            cm.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def markdown(results: dict) -> str:
    lines: list[str] = []
    plain = results.get("plain")
    if plain:
        lines += [
            "| plain diffusers decode | value |",
            "| --- | --- |",
            f"| latent → output | {plain['latent']} → {plain['output']} "
            f"({plain['dtype']}, {plain['device']}) |",
            f"| time (median of {len(plain['times_s'])}, after warm-up) | {plain['median_s']:.3f} s "
            f"(all: {', '.join(f'{t:.3f}' for t in plain['times_s'])}) |",
            f"| frames/s | {plain['frames_per_s']:.1f} |",
            f"| peak GPU memory (max_memory_allocated) | {gib(plain['peak_bytes'])} GiB |",
            f"| weights on GPU (decoder only) | {gib(plain['weights_bytes'])} GiB |",
        ]
        comp = results.get("plain_compiled")
        if comp:
            lines.append(
                f"| torch.compile ({results['args']['compile']}): first calls / median | "
                f"{comp['compile_s']:.1f} s / {comp['median_s']:.3f} s "
                f"({comp['frames_per_s']:.1f} frames/s) |"
            )
        lines.append("")
    farm = results.get("farm")
    if farm:
        base = plain["frames_per_s"] if plain else None
        lines += [
            f"Cluster start-up {farm['cluster_start_s']:.1f} s; "
            "warm-up render of 1 shot (model load, CUDA init) "
            f"{farm.get('warmup_s', float('nan')):.1f} s. Both excluded below.",
            "",
            "| shots | frames | wall s | frames/s | vs plain | run_graph s | write s (sum) "
            "| encode s (sum) | peak GPU mem / worker GiB | zarr frames | mp4 ok |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for n, d in farm["runs"].items():
            peaks = ", ".join(gib(v["max_allocated"]) for v in d["peak_per_worker"].values())
            ratio = f"{d['frames_per_s'] / base:.2f}×" if base else "-"
            lines.append(
                f"| {n} | {d['frames_written']} | {d['wall_s']:.2f} | {d['frames_per_s']:.1f} | {ratio} | "
                f"{d['seconds']:.2f} | {d['write_s']:.2f} | {d['encode_s']:.2f} | "
                f"{peaks} | "
                f"{d['zarr_frames']} | {d['videos_ok']} |"
            )
        lines.append("")
    two = results.get("two")
    if two:
        lines += ["| two workers, one GPU | value |", "| --- | --- |"]
        for a in two["attempts"]:
            lines.append(f"| tried: {a['how']} | {'worked' if a['ok'] else 'failed: ' + a['error']} |")
        if "render" in two:
            d = two["render"]
            lines.append(f"| protocol | {two['protocol']} |")
            lines.append(
                f"| warm-up render (model load on both workers) | {two.get('warmup_s', float('nan')):.2f} s |"
            )
            lines.append(
                f"| render, tiles 1,2,1, after warm-up | {d['frames_written']} frames, "
                f"{d['wall_s']:.2f} s ({d['frames_per_s']:.1f} frames/s) |"
            )
            peaks = ", ".join(gib(v["max_allocated"]) for v in d["peak_per_worker"].values())
            lines.append(f"| peak GPU memory / worker | {peaks} GiB |")
            for addr, st in d["transport"].items():
                keys = (
                    "device_frames",
                    "device_bytes",
                    "host_copies",
                    "device_to_host",
                    "host_to_device",
                    "cuda_deserialized",
                    "dask_deserialized",
                )
                lines.append(f"| transport_stats {addr} | " + ", ".join(f"{k} {st[k]}" for k in keys) + " |")
        lines.append("")
    chunk = results.get("chunk")
    if chunk:
        peaks = ", ".join(gib(v["max_allocated"]) for v in chunk["peak_per_worker"].values())
        untiled = farm["runs"].get("1") if farm else None
        untiled_peak = (
            ", ".join(gib(v["max_allocated"]) for v in untiled["peak_per_worker"].values())
            if untiled
            else "-"
        )
        c = chunk["chunk"]
        lines += [
            "| intra-GPU chunking | value |",
            "| --- | --- |",
            f"| ChunkSize | height {c['height']}, width {c['width']}, overlap {c['overlap']} (latent) → "
            f"{chunk['n_chunks']} decode calls, largest {chunk['chunk_pixel_volume']:,} pixel-frames |",
            f"| wall s / frames/s | {chunk['wall_s']:.2f} / {chunk['frames_per_s']:.1f} |",
            f"| peak GPU memory / worker, chunked | {peaks} GiB |",
            f"| estimate (LTX2Decoder.peak_bytes of the largest chunk) | "
            f"{gib(chunk['estimate_bytes'])} GiB |",
            f"| peak GPU memory / worker, untiled render (1 shot) | {untiled_peak} GiB |",
            f"| estimate, untiled | {gib(chunk['estimate_untiled_bytes'])} GiB |",
            "",
        ]
    if results.get("errors"):
        lines += ["| part | error |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in results["errors"].items()]
    return "\n".join(lines) + "\n"


def save(results: dict, args: argparse.Namespace) -> None:
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(results, indent=1, default=str))
    Path(args.out_md).write_text(markdown(results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--decoder", default="ltx2")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1216)
    p.add_argument("--shots", type=int, default=8, help="shots of the larger farm render (also renders 1)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions of the plain decode")
    p.add_argument("--chunk", default="11,19", help="intra-GPU chunk as latent HEIGHT,WIDTH")
    p.add_argument("--parts", default="plain,farm,chunk,two", help="comma list of plain, farm, chunk, two")
    p.add_argument("--two-mode", default="auto", choices=["auto", "local-cuda", "subprocess", "cpu"])
    p.add_argument("--work", default=None, help="scratch folder for jobs and outputs (default: a temp dir)")
    p.add_argument("--workers", type=int, default=1, help="GPUs (dask-cuda workers) for the farm renders")
    p.add_argument(
        "--compile", nargs="?", const=True, default=False, metavar="MODE",
        help="torch.compile the decoder (farm and plain); MODE as farm render --compile",
    )  # fmt: skip
    p.add_argument("--preset", default="veryfast", help="x264 preset of the farm renders")
    p.add_argument("--no-video", action="store_true", help="farm renders write Zarr only")
    p.add_argument(
        "--videos", default="", help="comma list of x264 presets and/or 'none' (Zarr only): each is "
        "rendered on the same warm cluster (default: --preset, or none with --no-video)",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=None, help="decoded tiles in flight (render --window)")
    p.add_argument("--tiles", default="1,1,1", help="tile grid F,H,W of the farm renders, or auto")
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    args = p.parse_args()
    global COMPILE, VIDEO, VARIANTS, TILES, WINDOW
    from farm.media.settings import VideoSettings

    COMPILE = args.compile
    VIDEO = VideoSettings(preset=args.preset, enabled=not args.no_video)
    labels = args.videos.split(",") if args.videos else ["none" if args.no_video else args.preset]
    VARIANTS = [
        (lb, VideoSettings(enabled=False) if lb == "none" else VideoSettings(preset=lb)) for lb in labels
    ]
    WINDOW = args.window
    TILES = "auto" if args.tiles == "auto" else tuple(int(x) for x in args.tiles.split(","))
    args.chunk = tuple(int(x) for x in args.chunk.split(","))
    parts = set(args.parts.split(","))

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="farm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}, "argv": sys.argv}
    results["machine"] = machine_info()
    log(json.dumps(results["machine"], indent=1))
    t_all = time.perf_counter()
    for name, fn in (("plain", part_plain), ("farm", part_farm_and_chunk), ("two", part_two_workers)):
        if name not in parts:
            continue
        t0 = time.perf_counter()
        log(f"=== part {name}")
        try:
            if name == "plain":
                fn(args, results)
            else:
                fn(args, results, work)
        except Exception as exc:  # noqa: BLE001
            record_error(results, name, exc)
        results.setdefault("part_seconds", {})[name] = time.perf_counter() - t0
        save(results, args)
    results["total_seconds"] = time.perf_counter() - t_all
    save(results, args)
    log("\n" + markdown(results))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
