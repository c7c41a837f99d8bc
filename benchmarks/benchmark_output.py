"""farm's output path against the host's own ceilings, measured side by side in one run.

Measures, on the machine it runs on:
- ``plain``: the plain in-process decode on one GPU: diffusers' eager decode, farm's decoder eager (padding by
  slices, the same frames) and, with ``--compile``, compiled;
- ``zarr``: the host's Zarr write ceiling: P processes writing farm's batches (its array layout, codec
  and chunks, the same noise frames a random-weight decode gives) into one output, with and without
  fsync of every chunk (farm's way, or with ``--sync-modes serial`` also the chunks written whole and
  fsync'd one after another, as farm did before), for each P and each folder in ``--dirs``;
- ``encode``: the video encode ceiling per x264 preset, P processes encoding 32-frame segments (with
  ``--encode-zarr`` also writing each batch to Zarr first, durable: the ceiling of a render writing both);
- ``farm``: farm renders of ``--shots`` shots on 1 … ``--gpus`` GPU workers, Zarr only and with video,
  each printed as a fraction of ``min(decode ceiling, output ceiling)``.

Every script that starts processes needs the ``__main__`` guard (spawn).

    python benchmarks/benchmark_output.py --parts zarr,encode,farm --gpus 2 --shots 24 \\
        --dirs /tmp/farm-out --out-json $OUT/out.json --out-md $OUT/out.md
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 32
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmark_gpu's helpers


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def noise_frames(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


# --------------------------------------------------------------------------------------------------
# Host ceilings
# --------------------------------------------------------------------------------------------------


def _write_serial(out: Any, shot: str, start: int, frames: np.ndarray) -> None:
    """A durable batch written whole, then its chunk files and folders fsync'd one after another (farm's
    write until 2026-12-01), to measure against `farm.store.frames.write_frames`."""
    import zarr

    from farm.media.files import fsync_path
    from farm.store.frames import chunk_files, chunk_folders

    path = out.frames_array(shot)
    arr = zarr.open_array(store=str(path), mode="r+")
    arr[start : start + len(frames)] = frames
    chunks = [c for c in chunk_files(path, arr, start, start + len(frames)) if c.exists()]
    for chunk in chunks:
        fsync_path(chunk)
    for folder in sorted(chunk_folders(path, chunks), key=lambda p: -len(p.parts)):
        fsync_path(folder)


def _zarr_writer(args: tuple) -> tuple[float, float]:
    """One writer process: write `batches` of farm's batches into its own shot of the output."""
    root, shot, batches, height, width, durable, pipeline = args
    from farm.store.frames import write_frames
    from farm.store.output import Output

    if pipeline == "zarrs":
        import zarr

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    frames = noise_frames(BATCH, height, width, seed=hash(shot) % 1000)
    out = Output(Path(root))
    t0 = time.perf_counter()
    for k in range(batches):
        if durable == "serial":
            _write_serial(out, shot, k * BATCH, frames)
        else:
            write_frames(out, shot, k * BATCH, frames, durable=bool(durable))
    return t0, time.perf_counter()


def zarr_ceiling(folder: Path, procs: int, frames_total: int, height: int, width: int,
                 durable: bool | str, pipeline: str) -> dict[str, Any]:  # fmt: skip
    """Aggregate frames/s of `procs` processes writing `frames_total` frames of farm batches."""
    from farm.store.frames import create_frames_array

    shutil.rmtree(folder, ignore_errors=True)
    batches = max(1, frames_total // (BATCH * procs))
    shots = [f"w{i}" for i in range(procs)]
    for shot in shots:
        create_frames_array(folder / "frames.zarr", shot, (batches * BATCH, height, width), BATCH)
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:
        pool.map(time.sleep, [0] * procs)  # processes up and importing before the clock starts
        tasks = [(str(folder), s, batches, height, width, durable, pipeline) for s in shots]
        spans = pool.map(_zarr_writer, tasks)
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    n = batches * BATCH * procs
    shutil.rmtree(folder, ignore_errors=True)
    return {"procs": procs, "frames": n, "seconds": wall, "frames_per_s": n / wall, "durable": durable,
            "pipeline": pipeline, "dir": str(folder)}  # fmt: skip


PRESETS = ("ultrafast", "veryfast")


def _encoder(args: tuple) -> tuple[float, float]:
    """One encoding process: `segments` of farm's segments; with `zarr`, each batch is first written to
    its own shot of a Zarr output and the segment fsync'd, as a durable farm render's I/O worker does."""
    folder, i, segments, height, width, preset, threads, zarr = args
    import torch

    from farm.media.files import fsync_path
    from farm.media.video import encode_segment
    from farm.media.yuv import rgb_to_yuv420
    from farm.store.frames import write_frames
    from farm.store.output import Output

    rgb = noise_frames(BATCH, height, width, seed=i)
    planes = rgb_to_yuv420(torch.from_numpy(rgb).permute(3, 0, 1, 2).float().div(255)).numpy()
    out = Output(Path(folder))
    t0 = time.perf_counter()
    for k in range(segments):
        if zarr:
            write_frames(out, f"w{i}", k * BATCH, rgb, durable=True)
        segment = Path(folder) / f"p{i}-{k}.mp4"
        encode_segment(rgb, segment, 24.0, codec="h264", crf=18, preset=preset, metadata={}, yuv420=planes,
                       threads=threads)  # fmt: skip
        if zarr:
            fsync_path(segment)
    return t0, time.perf_counter()


def encode_ceiling(
    folder: Path, procs: int, frames_total: int, height: int, width: int, preset: str, threads: int = 0,
    zarr: bool = False,
) -> dict:  # fmt: skip
    """Aggregate frames/s of `procs` processes encoding farm's segments, `threads` each (0: x264's);
    with `zarr`, each process also writes every batch to Zarr first, durable (the ceiling of a render
    that writes both, on one host's cores)."""
    from farm.store.frames import create_frames_array

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    segments = max(1, frames_total // (BATCH * procs))
    if zarr:
        for i in range(procs):
            create_frames_array(folder / "frames.zarr", f"w{i}", (segments * BATCH, height, width), BATCH)
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(time.sleep, [0] * procs)
        work = [(str(folder), i, segments, height, width, preset, threads, zarr) for i in range(procs)]
        spans = pool.map(_encoder, work)
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    n = segments * BATCH * procs
    shutil.rmtree(folder, ignore_errors=True)
    return {"procs": procs, "preset": preset, "threads": threads, "frames": n, "seconds": wall,
            "frames_per_s": n / wall, "zarr": zarr}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Plain decode and farm renders
# --------------------------------------------------------------------------------------------------


def carried_decode(decoder: Any, latent: Any, n: str, reps: int) -> dict[str, Any]:
    """Seconds of a whole-shot decode done as carried chunks of up to `n` latent frames (`--carry`;
    ``4``: tapered as farm plans them, ``4e``: even), and the largest difference from the unchunked
    decode."""
    import torch

    from farm.planning.tiling import carried_frames

    sizes = carried_frames(latent.shape[1], int(n.rstrip("e")), taper=not n.endswith("e"))

    def run() -> Any:
        state, parts, start = None, [], 0
        for size in sizes:
            pixels, state = decoder.decode_carried(latent[:, start : start + size], state)
            parts.append(pixels)
            start += size
        return torch.cat(parts, dim=1)

    run()  # first call: cuDNN picks algorithms for the chunk shapes
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pixels = run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    whole = decoder.decode(latent, origin=(0, 0, 0))
    diff = float((pixels - whole).abs().max())
    s = float(np.median(times))
    log(f"plain carried chunks of {n}: {s:.3f} s, largest difference from the whole decode {diff:.3g}")
    return {"seconds": s, "all": times, "max_difference": diff}


def _timed_plain(decoder: Any, latent: Any, reps: int, label: str, frames: int) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    decoder.decode(latent, origin=(0, 0, 0))
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        decoder.decode(latent, origin=(0, 0, 0))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    s = float(np.median(times))
    log(f"plain {label}: {s:.3f} s ({frames / s:.1f} frames/s), first call {first:.1f} s")
    return {"seconds": s, "frames_per_s": frames / s, "first_call_s": first, "all": times}


def plain_decode(args: argparse.Namespace) -> dict[str, Any]:
    """The in-process decode: ``eager`` is diffusers' own (its ``F.pad`` reflect padding), the baseline
    of the targets; ``eager-farm`` is farm's decoder as its workers run it (padding by slices, the same
    frames); ``compiled`` with ``--compile``."""
    import torch

    from farm.decoders import load_decoder
    from farm.decoders.reflect_pad import sliced_reflect_padding
    from farm.inputs.synthetic import synth_spec

    spec = synth_spec(args.decoder).to_json()
    out: dict[str, Any] = {}
    for mode in ["eager"] + (["compiled"] if args.compile else []):
        decoder = load_decoder(spec, "cuda", compile=args.compile if mode == "compiled" else False)
        c = decoder.latent_channels if hasattr(decoder, "latent_channels") else 128
        g = decoder.geometry
        lf = (args.frames - 1) // g.temporal_scale + 1
        latent = torch.randn(c, lf, args.height // g.spatial_scale, args.width // g.spatial_scale)
        if mode == "eager" and hasattr(decoder, "model"):
            sliced_reflect_padding(decoder.model, on=False)
            lead = decoder.pacer.lead if decoder.pacer is not None else 0
            decoder.pace(0)  # diffusers' own decode queues its kernels unpaced
            out["eager"] = _timed_plain(decoder, latent, args.reps, "eager (diffusers)", args.frames)
            sliced_reflect_padding(decoder.model, on=True)
            decoder.pace(lead)
            mode = "eager-farm"
        out[mode] = _timed_plain(decoder, latent, args.reps, mode, args.frames)
        if mode.startswith("eager"):
            for n in args.plain_carry:  # the same decode in carried chunks of n latent frames, in order
                out[f"carried-{n}"] = carried_decode(decoder, latent, n, args.reps)
        del decoder
        torch.cuda.empty_cache()
    return out


def farm_renders(args: argparse.Namespace, work: Path, results: dict, save: Any) -> None:
    """Renders on 1 … N GPU workers: the batch of shots per output (``--batch-outputs``), and single
    shots per size and case (``--one-sizes``, ``--one-cases``: tiles, chunk frames, batch frames), with
    ``--ipc-ab`` the multi-GPU ones also with pieces sent by value."""
    import dask
    from bench_clusters import cluster

    from farm.inputs.synthetic import synth
    from farm.media.settings import VideoSettings
    from farm.run.cluster import connect

    job = work / "job.zarr"
    if args.shots:
        synth(job, decoder=args.decoder, shots=args.shots, overwrite=True, frames=args.frames,
              height=args.height, width=args.width)  # fmt: skip
    ones = {}
    for size in args.one_sizes:
        h, w = (int(x) for x in size.split("x"))
        ones[size] = work / f"one-{size}.zarr"
        synth(ones[size], decoder=args.decoder, shots=1, overwrite=True, frames=args.frames,
              height=h, width=w)  # fmt: skip
    videos = {"zarr": VideoSettings(enabled=False),
              "zarr-nofsync": VideoSettings(enabled=False, durable=False),
              # Zarr chunks of up to 8 frames whatever their size (farm.frame-chunk-mib before it existed)
              "zarr-c64": VideoSettings(enabled=False, frame_chunk_mib=64),
              **{p: VideoSettings(preset=p) for p in PRESETS},
              **{f"{p}-t0": VideoSettings(preset=p, encoder_threads=0) for p in PRESETS}}  # fmt: skip
    runs = results.setdefault("farm", [])
    warm_ups = results.setdefault("warm_ups", [])
    sources = ([job] if args.shots else []) + list(ones.values())
    settings = [(int(g), io, kind) for g in args.gpu_counts.split(",") for io in args.io_workers.split(",")
                for kind in args.clusters.split(",")]  # fmt: skip
    for gpus, io, kind in settings:
        t0 = time.perf_counter()
        io_workers = None if io == "default" else int(io)
        with cluster(kind, work / "cluster", gpus, io_workers) as client:
            log(f"{gpus} GPU {kind} cluster (I/O workers: {io}) up in {time.perf_counter() - t0:.1f} s")
            warm_ups.append(warm_up(client, sources, work, args, f"{gpus} GPU cluster, I/O workers {io}"))
            cases = [("batch", job, (1, 1, 1), 0, 32, label, True)
                     for label in args.batch_outputs if args.shots]  # fmt: skip
            for size, src in ones.items():
                for case in args.one_cases:
                    (f, h, w), chunk, batch, label = parse_case(case)
                    auto = f * h * w == 0  # 0,0,0: --tiles auto, on every GPU count (it may carry)
                    several = f * h * w != 1
                    on_one = not several or auto or args.multi_tile_on_one
                    if (gpus == 1 and on_one) or (gpus > 1 and several):
                        cases.append((f"one shot {size}", src, (f, h, w), chunk, batch, label, True))
                        if args.ipc_ab and gpus > 1:  # the same case, pieces between GPUs by value
                            cases.append((f"one shot {size}", src, (f, h, w), chunk, batch, label, False))
            checked = set()
            for what, src, tiles, chunk, batch, label, ipc in cases:
                dest = Path(args.dirs[0]) / f"r{gpus}"
                options = plan_options(tiles, chunk, batch)
                with dask.config.set({"farm.cuda-ipc": ipc}):
                    row = timed_farm(client, src, dest, options, videos[label], args)
                row["cuda_ipc"] = ipc
                check = not (args.checks_once and (what, tiles, chunk, batch) in checked)
                checked.add((what, tiles, chunk, batch))
                if check and options.chunk.carry:  # how far carried chunks are from whole tiles
                    row["levels_from_unchunked"] = levels_from_unchunked(client, src, dest, options)
                if check and options.chunk.frames:  # streamed: the plan decoded whole, the same bytes
                    row["same_bytes_as_unstreamed"] = same_bytes_unstreamed(client, src, dest, options)
                shutil.rmtree(dest, ignore_errors=True)
                row.update({"gpus": gpus, "io_workers": io, "cluster": kind, "what": what, "output": label,
                            "chunk_frames": options.chunk.frames, "carry": options.chunk.carry,
                            "taper": options.chunk.carry and options.chunk.taper})  # fmt: skip
                row["batch"] = batch
                runs.append(row)
                save()
                same = row.get("same_bytes_as_unstreamed")
                same_note = "" if same is None else f"same bytes as unstreamed: {same} "
                log(f"farm {gpus} GPU {kind} io {io} {what} tiles {tiles} chunk {chunk} batch {batch} {label}"
                    f"{'' if ipc else ' (pieces by value)'}: "
                    f"{row.get('levels_from_unchunked', '')} {same_note}"
                    f"{row['wall_s']:.2f} s (graph {row['graph_s']:.2f} s), "
                    f"{row['frames_per_s']:.1f} frames/s; set-up {row['setup_s']:.2f} s, first task at "
                    f"{row['first_task_s']:.2f} s, {row['after_last_task_s']:.2f} s after the last "
                    f"({', '.join(f'{k} {v:.2f}' for k, v in row['setup_phases'].items())}); "
                    f"predicted {row['predicted_s'] or 0:.2f} s graph, grids {row['grids']} "
                    f"{row['failed'] or ''}")  # fmt: skip
        if args.fresh_cluster and kind == "inproc":  # the same shapes, new worker processes: inductor's cache
            with connect(workers=gpus, io_workers=io_workers) as client:
                warm_ups.append(warm_up(client, sources, work, args, f"{gpus} GPU cluster, fresh"))


def warm_up(client: Any, sources: list[Path], work: Path, args: argparse.Namespace, label: str) -> dict:
    """Render each source once (models built, compiled on a first call per tile shape) and return what
    the workers paid: build seconds and compiled first calls (`farm.decoders.decoder_timings`)."""
    from farm.decoders import decoder_timings
    from farm.media.settings import VideoSettings
    from farm.run.render import render

    t0 = time.perf_counter()
    for src in sources:
        shutil.rmtree(work / "warm", ignore_errors=True)
        render(str(src), str(work / "warm"), scheduler=client.scheduler.address, log=lambda _m: None,
               compile=args.compile, video=VideoSettings(enabled=False))  # fmt: skip
    seconds = time.perf_counter() - t0
    timings = {w: t for w, t in client.run(decoder_timings).items() if t["load_s"]}
    log(f"warm-up renders, {label}: {seconds:.1f} s; per worker {json.dumps(timings)}")
    return {"label": label, "seconds": seconds, "workers": timings}


def frames_hash(dest: Path, shots: int = 2) -> str:
    """sha256 of the frames of the first `shots` shots (by name) a render wrote."""
    import hashlib

    import zarr

    group = zarr.open_group(str(dest / "frames.zarr"), mode="r")
    digest = hashlib.sha256()
    for shot in sorted(group.group_keys())[:shots]:
        digest.update(np.ascontiguousarray(group[shot]["frames"][...]).data)
    return digest.hexdigest()


def check_same_frames(runs: list[dict]) -> list[str]:
    """Renders of one job, grid and output on different GPU counts must have written the same bytes."""
    seen: dict[tuple, tuple[int, str]] = {}
    lines = []
    for row in runs:
        if not row.get("frames_sha256") or "auto" in str(row.get("grids")):
            continue
        key = (row["what"], tuple(row["grids"]), row["output"])
        first = seen.setdefault(key, (row["gpus"], row["frames_sha256"]))
        if first[0] != row["gpus"]:
            same = first[1] == row["frames_sha256"]
            verdict = "same bytes" if same else "DIFFERENT BYTES"
            lines.append(f"{key}: {first[0]} vs {row['gpus']} GPUs: {verdict}")
    return lines


def same_bytes_unstreamed(client: Any, job: Path, dest: Path, options: Any) -> bool:
    import numpy as np
    import zarr

    from farm.run.render import render

    other = dest.with_name(dest.name + "-whole")
    shutil.rmtree(other, ignore_errors=True)
    render(str(job), str(other), scheduler=client.scheduler.address, log=lambda _m: None, stream=False,
           options=options, video=_zarr_only())  # fmt: skip
    a, b = (zarr.open_group(str(d / "frames.zarr"), mode="r") for d in (dest, other))
    same = all(np.array_equal(a[s]["frames"][...], b[s]["frames"][...]) for s in a.group_keys())
    shutil.rmtree(other, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    return same


def _zarr_only() -> Any:
    from farm.media.settings import VideoSettings

    return VideoSettings(enabled=False)


def parse_case(case: str) -> tuple[tuple[int, int, int], str, int, str]:
    """``F,H,W,CHUNK,BATCH[,OUTPUT]`` → tiles, chunk (latent frames; a trailing ``c`` carries the state
    in tapered chunks, ``e`` in even ones), batch, output (a ``--batch-outputs`` label; zarr)."""
    f, h, w, chunk, batch, *output = case.split(",")
    return (int(f), int(h), int(w)), chunk, int(batch), (output or ["zarr"])[0]


def plan_options(tiles: tuple, chunk: str | int, batch_frames: int) -> Any:
    from farm.planning.options import AUTO, PlanOptions
    from farm.planning.tiling import ChunkSize

    frames = int(str(chunk).rstrip("ce"))
    carry, taper = str(chunk).endswith(("c", "e")), not str(chunk).endswith("e")
    size = ChunkSize(frames=frames, carry=carry, taper=taper) if frames else ChunkSize()
    return PlanOptions(tiles=AUTO if 0 in tiles else tiles, chunk=size, batch_frames=batch_frames)


def levels_from_unchunked(client: Any, job: Path, dest: Path, options: Any) -> dict[str, float]:
    """8-bit level differences between a render (`dest`) and the same tiles decoded without chunks."""
    import dataclasses

    import zarr

    from farm.planning.tiling import ChunkSize
    from farm.run.render import render

    other = dest.with_name(dest.name + "-unchunked")
    shutil.rmtree(other, ignore_errors=True)
    render(str(job), str(other), scheduler=client.scheduler.address, log=lambda _m: None,
           options=dataclasses.replace(options, chunk=ChunkSize()), video=_zarr_only())  # fmt: skip
    a, b = (zarr.open_group(str(d / "frames.zarr"), mode="r") for d in (dest, other))
    diffs = [np.abs(a[s]["frames"][...].astype(np.int16) - b[s]["frames"][...]) for s in a.group_keys()]
    shutil.rmtree(other, ignore_errors=True)
    return {"max": float(max(d.max() for d in diffs)), "mean": float(np.mean([d.mean() for d in diffs])),
            "differing": float(np.mean([(d > 0).mean() for d in diffs]))}  # fmt: skip


def timed_farm(
    client: Any, job: Path, dest: Path, options: Any, video: Any, args: argparse.Namespace
) -> dict[str, Any]:
    from benchmark_gpu import task_summary
    from distributed import get_task_stream

    from farm.run.graph import split_workers
    from farm.run.render import render

    shutil.rmtree(dest, ignore_errors=True)
    t0, epoch = time.perf_counter(), time.time()
    with get_task_stream(client=client) as ts:
        stats = render(str(job), str(dest), scheduler=client.scheduler.address, log=lambda _m: None,
                       compile=args.compile, video=video, options=options)  # fmt: skip
    wall = time.perf_counter() - t0
    spans = [s for d in ts.data for s in d["startstops"]]
    first_task = min((s["start"] for s in spans), default=epoch) - epoch
    last_task = max((s["stop"] for s in spans), default=epoch) - epoch
    grids = recorded_grid_names(dest, job)
    story = first_decode_story(client, ts.data, epoch)
    digest = frames_hash(dest) if args.frames_hash else None
    if not options.chunk.frames:
        shutil.rmtree(dest, ignore_errors=True)
    failed = [s.error for s in stats.failed]
    fps = stats.frames_written / wall
    return {"tiles": options.tiles, "grids": grids, "frames": stats.frames_written,
            "wall_s": wall, "frames_per_s": fps, "graph_s": stats.seconds, "setup_s": stats.setup_s,
            "setup_phases": stats.setup_phases, "finish_s": stats.finish_s, "first_task_s": first_task,
            "after_last_task_s": wall - last_task,
            "first_decode_story": story, "decodes": stats.tiles_total, "failed": failed,
            "frames_sha256": digest,
            "tasks": task_summary(ts.data),
            "window": stats.window,
            "predicted_s": predicted_seconds(job, options, *map(len, split_workers(client)), video,
                                             decode_scale=getattr(args, "decode_scale", 1.0),
                                             window=stats.window or None)}  # fmt: skip


def first_decode_story(client: Any, stream: list[dict], epoch: float) -> list[tuple[float, str]]:
    """The first decode task's story on the scheduler and its worker (seconds after the render's start,
    what happened): where the time between submitting it and its start goes."""
    decodes = [d for d in stream if "decode" in str(d["key"])]
    if not decodes:
        return []
    first = min(decodes, key=lambda d: min(s["start"] for s in d["startstops"]))
    try:
        entries = client.story(first["key"])
    except Exception as exc:  # diagnostics only
        return [(0.0, f"no story: {exc}")]
    out = []
    for entry in entries:
        stamp = next((x for x in reversed(entry) if isinstance(x, float) and x > 1e9), None)
        if stamp is not None:
            out.append((round(stamp - epoch, 4), repr(entry[1:-1])[:160]))
    return sorted(out)


def recorded_grid_names(dest: Path, job: Path) -> list[str]:
    """The tile grids the render used (as recorded in OUT), one per shot, e.g. ``1x1x2``, or
    ``1x1x1 5c`` with carried chunks of up to 5 latent frames (auto may choose them)."""
    from farm.run.resume import RecordedLayout, recorded_layout
    from farm.store.job import open_job
    from farm.store.output import Output

    shots = list(open_job(str(job)).shots)
    recorded = recorded_layout(Output(dest), shots, False) if dest.exists() else RecordedLayout()
    grids, chunks = recorded.grids, recorded.chunks

    def name(shot: str) -> str:
        carried = f" {chunks[shot].frames}c" if shot in chunks and chunks[shot].carry else ""
        return "x".join(str(n) for n in grids[shot].tiles) + carried

    return sorted({name(shot) for shot in grids})


def predicted_seconds(
    job: Path,
    options: Any,
    n_workers: int,
    n_io: int,
    video: Any,
    decode_scale: float = 1.0,
    window: int | None = None,
) -> float | None:
    """What the planner predicts for this render's graph on `n_workers` decode and `n_io` I/O workers
    (no encodes when the render writes Zarr only; decodes scaled by `decode_scale`, the compiled / eager
    plain decode of this call when the renders are compiled, as `refit_output_costs.py` does), through
    the `window` the render held (its memory budget sets it; the default otherwise)."""
    from farm.decoders import memory_model
    from farm.planning import planner
    from farm.planning.costmodel import DecodeCost, cost_model
    from farm.planning.jobplan import plan_job
    from farm.store.job import open_job

    opened = open_job(str(job))
    n = max(1, n_workers)
    plans = plan_job(opened, options, n, n_io=n_io, video=video.enabled)
    model = cost_model(opened.spec, options.cost_model)
    if not video.enabled:
        model = model.with_(encode_s_per_pixel=0.0)
    if decode_scale != 1.0:
        scaled = {k: v * decode_scale for k, v in model.decode.coefficients.items()}
        model = model.with_(decode=DecodeCost(scaled))
    memory = memory_model(opened.spec)
    return planner.predict(plans, n, model, memory=memory, n_io=n_io, window=window).makespan_s


def farm_version() -> str:
    """farm's version and, in a git checkout, its commit (the figures belong to that code)."""
    import subprocess

    import farm

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{farm.__version__} {commit}".strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="plain,zarr,encode,farm")
    p.add_argument("--decoder", default="ltx2")
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1216)
    p.add_argument("--shots", type=int, default=24)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        metavar="MODE",
        help="torch.compile the decoder (a mode, e.g. reduce-overhead, or torch's default)",
    )
    p.add_argument("--gpu-counts", default="1,2")
    p.add_argument("--clusters", default="inproc",
                   help="clusters to render on: inproc (started in this process, as farm render "
                        "starts its own), daemon (farm cluster in its own process)")  # fmt: skip
    p.add_argument("--io-workers", default="default", help="I/O worker counts to try, e.g. default,0")
    p.add_argument("--fresh-cluster", action="store_true", help="warm up a second, fresh cluster too")
    p.add_argument("--batch-outputs", nargs="*", default=["zarr", "zarr-nofsync", "ultrafast"])
    p.add_argument("--plain-carry", nargs="*", default=[],
                   help="also time the plain decode in carried chunks of up to these latent frames "
                        "(4: tapered as farm plans them, 4e: even)")  # fmt: skip
    p.add_argument("--one-sizes", nargs="*", default=[], help="single-shot sizes HxW, e.g. 704x1216")
    p.add_argument(
        "--one-cases",
        nargs="*",
        default=["1,1,1,0,32", "1,1,1,6,16", "1,1,2,0,32", "1,1,2,6,16"],
        help="single-shot cases F,H,W,CHUNK_FRAMES,BATCH_FRAMES (tiles, 0,0,0 for auto; streamed "
        "chunk, e.g. 6, or 4c for carried chunks of up to 4 latent frames, tapered at the end, 4e even; "
        "batch)",
    )
    p.add_argument("--ipc-ab", action="store_true",
                   help="run each multi-tile single-shot case on several GPUs twice: pieces between GPUs by "
                        "CUDA IPC handle (farm.cuda-ipc, the default) and by value")  # fmt: skip
    p.add_argument("--checks-once", action="store_true",
                   help="check a streamed case's bytes (and carried levels) on its first run")  # fmt: skip
    p.add_argument(
        "--multi-tile-on-one",
        action="store_true",
        help="run the single-shot cases of several tiles on 1 GPU too (same grid, any GPU count)",
    )
    p.add_argument(
        "--frames-hash",
        action="store_true",
        help="record a sha256 of each render's frames (first two shots) and check that renders of "
        "one job and grid on different GPU counts wrote the same bytes",
    )
    p.add_argument("--presets", nargs="*", default=["ultrafast"])
    p.add_argument("--encoder-threads", type=int, nargs="*", default=[0],
                   help="threads per encode for the encode ceilings (0: x264's own); renders take "
                        "farm.encoder-threads, or 0 with an output named PRESET-t0")  # fmt: skip
    p.add_argument("--encode-zarr", action="store_true",
                   help="also measure each encode ceiling with every batch written to Zarr (durable) first, "
                        "as a render that writes both does")  # fmt: skip
    p.add_argument("--procs", default="8,16")
    p.add_argument("--pipelines", default="default")
    p.add_argument("--ceiling-frames", type=int, default=3072)
    p.add_argument("--sync-modes", default="", help="more durable writes to measure: serial (the old way)")
    p.add_argument("--dirs", nargs="+", default=["/tmp/farm-bench-out"])
    p.add_argument("--work", default="/tmp/farm-bench")
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", default=None)
    args = p.parse_args()
    parts = set(args.parts.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                           "platform": platform.platform()}, "args": vars(args),
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "farm_version": farm_version()}  # fmt: skip
    procs = [int(x) for x in args.procs.split(",")]

    def save() -> None:
        Path(args.out_json).write_text(json.dumps(results, indent=1, default=str))

    if "plain" in parts:
        results["plain"] = plain_decode(args)
        # the cost model's decode is farm's eager one: scale the printed predictions to a compiled decode
        if args.compile and {"eager-farm", "compiled"} <= set(results["plain"]):
            plain = results["plain"]
            args.decode_scale = plain["compiled"]["seconds"] / plain["eager-farm"]["seconds"]
        save()
    if "zarr" in parts:
        rows = results.setdefault("zarr", [])
        for d in args.dirs:
            for pipeline in args.pipelines.split(","):
                for n in procs:
                    modes: list[bool | str] = [False, True, *filter(None, args.sync_modes.split(","))]
                    for durable in modes:
                        r = zarr_ceiling(Path(d) / "ceiling", n, args.ceiling_frames, args.height, args.width,
                                         durable, pipeline)  # fmt: skip
                        rows.append(r)
                        log(f"zarr {pipeline} P={n} durable={durable} {d}: {r['frames_per_s']:.0f} frames/s")
                        save()
    if "encode" in parts:
        rows = results.setdefault("encode", [])
        for preset in args.presets:
            for threads in args.encoder_threads:
                for n in procs:
                    for zarr in [False, True] if args.encode_zarr else [False]:
                        r = encode_ceiling(work / "enc", n, args.ceiling_frames // 2, args.height, args.width,
                                           preset, threads, zarr)  # fmt: skip
                        rows.append(r)
                        what = f"encode{' + Zarr, durable' if zarr else ''} {preset} threads {threads} P={n}"
                        log(f"{what}: {r['frames_per_s']:.0f} frames/s")
                        save()
    if "farm" in parts:
        farm_renders(args, work, results, save)
        results["same_frames"] = check_same_frames(results.get("farm", []))
        for line in results["same_frames"]:
            log(line)
        save()


if __name__ == "__main__":
    main()
