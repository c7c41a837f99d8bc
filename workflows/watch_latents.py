"""Watch a folder for new ComfyUI `.latent` files, ingest each into a job store and render it as it arrives.

    farm submit workflows/watch_latents.py --scheduler-file F --detach -- ~/ComfyUI/output/latents \\
        --job /shows/ep01/comfy.zarr --out /shows/ep01/renders/comfy --decoder ltxv --weights /models/ltxv-vae

    python workflows/watch_latents.py FOLDER --job JOB --out OUT [--decoder D --weights W] [--workers N]
        [--interval S] [--settle S] [--stop-after N] [--idle-timeout S] [--tiles F,H,W] [--no-video]

Every `--interval` seconds it lists FOLDER (not recursively) for `.latent` files it has not ingested yet.
A file is taken once its size and modification time have not changed for `--settle` seconds (ComfyUI
writes in place, not by rename); one that still cannot be read (a half-written file, a broken one) is
reported and tried again when it changes. Each file becomes shots by `farm ingest`'s rules (the job is
created from `--decoder`/`--weights` on the first file), then the new shots are rendered into OUT; files
arriving meanwhile are taken by the next round. Files already in the job (their shots record the source
file) are not ingested again, so a restarted watch carries on. It stops after `--stop-after` files, after
`--idle-timeout` seconds without a new file, or when cancelled (`farm cancel`, Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from farm import workflow
from farm.errors import FarmError

Stamp = tuple[int, int]  # size, mtime in ns


def settled(now_stamps: Mapping[Path, Stamp], first_seen: Mapping[Path, tuple[Stamp, float]], now: float,
            settle: float) -> list[Path]:  # fmt: skip
    """Files whose (size, mtime) has not changed for `settle` seconds (pure; `first_seen` holds when each
    file was first seen with its current stamp)."""
    return sorted(
        p for p, stamp in now_stamps.items()
        if p in first_seen and first_seen[p][0] == stamp and now - first_seen[p][1] >= settle
    )  # fmt: skip


def stamps_of(folder: Path) -> dict[Path, Stamp]:
    out = {}
    for path in folder.glob("*.latent"):
        try:
            st = path.stat()
        except FileNotFoundError:  # gone since the listing
            continue
        if not path.name.startswith("."):
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


def ingested_sources(job: Path) -> set[str]:
    """The source files the job's shots came from (resolved paths)."""
    if not job.exists():
        return set()
    from farm.store.job import open_job

    return {str(info.attrs.get("source", {}).get("file")) for info in open_job(job).shots.values()}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="watch_latents.py", description="Ingest and render new .latent files.")
    p.add_argument("folder", help="folder ComfyUI saves latents to")
    p.add_argument("--job", required=True, help="job store to create or add to")
    p.add_argument("--out", required=True, help="render output")
    p.add_argument("--decoder", help="decoder for a new job: named config (with --weights) or JSON spec")
    p.add_argument("--weights", help="decoder weights (a diffusers VAE folder or one .safetensors file)")
    p.add_argument("--latents", choices=["normalized", "denormalized"], help="override the files' convention")
    p.add_argument("--fps", type=float, help="frames per second (default: the workflow's, else 24)")
    p.add_argument("--name", help="shot name pattern (farm ingest --name)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between looks (default 2)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds a file must stay unchanged (default 2)")
    p.add_argument("--stop-after", type=int, help="stop after ingesting this many files")
    p.add_argument("--idle-timeout", type=float, help="stop after this many seconds without a new file")
    p.add_argument("--tiles", help="F,H,W or auto (default: farm's)")
    p.add_argument("--batch-frames", type=int, help="pixel frames per batch")
    p.add_argument("--no-video", action="store_true", help="frames to Zarr only")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="when run directly: join this scheduler")
    g.add_argument("--scheduler-file", help="when run directly: join the cluster of this scheduler file")
    g.add_argument("--workers", type=int, help="when run directly: start a local cluster of N workers")
    args = p.parse_args(list(argv))
    folder = Path(args.folder)
    if not folder.is_dir():
        raise FarmError(f"{folder}: no such folder to watch")
    if args.workers:  # one local cluster for the whole watch, not one per render
        from farm.run.cluster import connect

        with connect(workers=args.workers) as client:
            return watch(args, folder, {"scheduler": client.scheduler.address})
    cluster = {k: getattr(args, k) for k in ("scheduler", "scheduler_file") if getattr(args, k)}
    return watch(args, folder, cluster)


def watch(args: argparse.Namespace, folder: Path, cluster: dict[str, Any]) -> int:
    job = Path(args.job)
    done = ingested_sources(job)
    first_seen: dict[Path, tuple[Stamp, float]] = {}
    failed: dict[Path, Stamp] = {}  # unreadable files, until they change
    files = failures = 0
    last_new = time.monotonic()
    workflow.log(f"watch_latents: watching {folder} for .latent files → {job} → {args.out}")
    while True:
        now = time.monotonic()
        stamps = {q: st for q, st in stamps_of(folder).items() if str(q.resolve()) not in done}
        first_seen = {q: first_seen[q] if q in first_seen and first_seen[q][0] == st else (st, now)
                      for q, st in stamps.items()}  # fmt: skip
        ready = [q for q in settled(stamps, first_seen, now, args.settle) if failed.get(q) != stamps[q]]
        shots: list[str] = []
        for path in ready:
            if args.stop_after is not None and files >= args.stop_after:
                break
            try:
                shots += ingest_one(args, job, path)
            except FarmError as exc:
                failed[path] = stamps[path]
                failures += 1
                workflow.log(f"watch_latents: {path.name}: not ingested (tried again when it changes): {exc}")
                continue
            done.add(str(path.resolve()))
            files += 1
            last_new = time.monotonic()
        if shots:
            render_shots(args, job, shots, cluster)
        if args.stop_after is not None and files >= args.stop_after:
            break
        if args.idle_timeout is not None and time.monotonic() - last_new > args.idle_timeout:
            workflow.log(f"watch_latents: no new file for {args.idle_timeout:g} s")
            break
        time.sleep(args.interval)
    workflow.log(f"watch_latents: {files} file(s) ingested and rendered, {failures} refusal(s)")
    return 0


def ingest_one(args: argparse.Namespace, job: Path, path: Path) -> list[str]:
    from farm.inputs.ingest import ingest

    result = ingest(job, [path], decoder=None if job.exists() else args.decoder, weights=args.weights,
                    fps=args.fps, name=args.name, latents=args.latents)  # fmt: skip
    for line in result.warnings:
        workflow.log(f"watch_latents: warning: {line}")
    workflow.log(f"watch_latents: {path.name} → shot(s) {', '.join(result.shots)}")
    return result.shots


def render_shots(args: argparse.Namespace, job: Path, shots: list[str], cluster: dict[str, Any]) -> None:
    from farm.media.settings import VideoSettings
    from farm.planning.options import PlanOptions, parse_tiles

    options: dict = {}
    if args.tiles:
        options["tiles"] = parse_tiles(args.tiles)
    if args.batch_frames:
        options["batch_frames"] = args.batch_frames
    stats = workflow.render(job, args.out, shots=shots, options=PlanOptions(**options),
                            video=VideoSettings(enabled=not args.no_video), **cluster)  # fmt: skip
    for shot in stats.shots.values():
        state = f"{shot.batches_written}/{shot.batches_total} batches"
        state = f"FAILED: {shot.error}" if shot.error else state
        workflow.log(f"watch_latents: rendered {shot.shot}: {state}")


if __name__ == "__main__":
    sys.exit(workflow.run(main))
