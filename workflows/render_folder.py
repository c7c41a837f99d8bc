"""Render every job store in a folder, each with its own overrides.

Submit it to a running cluster (foreground, or ``--detach`` to let it run on the cluster)::

    farm submit workflows/render_folder.py --scheduler-file F [--detach] [--priority P] -- \\
        JOBS/ --out RENDERS/ [--overrides overrides.toml] [--tiles auto] [--batch-frames 32] [--parallel 2]

or run it directly (``python workflows/render_folder.py JOBS/ --out RENDERS/ --workers 2`` starts a local
cluster; ``--scheduler``/``--scheduler-file`` join one). Every direct child of JOBS that is a farm job store
(``JOBS/<name>.zarr``) renders to ``RENDERS/<name>``; a rerun resumes what is already there. The overrides
file (TOML or JSON) sets options for all jobs and per job (by name, with or without ``.zarr``); a job's own
table beats the command line, which beats ``[defaults]``::

    [defaults]
    batch_frames = 16

    [jobs.hero]
    tiles = [1, 2, 2]        # or "1,2,2", or "auto"
    dtype = "bfloat16"       # decoder compute dtype for this render
    priority = 5             # its tiles go before lower priorities' on a shared cluster
    shots = ["sh010", "sh020"]

Keys: tiles, overlap, chunk, carry, batch_frames, shots, priority, window, dtype, video, crf, preset,
restart, compile, skip (``carry = true`` with a temporal ``chunk``: `farm render --carry`). A ``dtype``
different from the job's decoder spec renders through a view of the job store
(``RENDERS/.views/<name>.<dtype>.zarr``: its own metadata, the shots linked to the original latents).
Exit code: 0 when every shot rendered, 1 if any failed (the other jobs still render), 2 for bad input,
130 when cancelled (``farm cancel <submission>``).
"""

from __future__ import annotations

import argparse
import contextvars
import json
import sys
import time
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm import workflow
from farm.errors import FarmError

KEYS = {
    "tiles", "overlap", "chunk", "carry", "batch_frames", "shots", "priority", "window", "dtype", "video",
    "crf", "preset", "restart", "compile", "skip",
}  # fmt: skip
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class JobResult:
    name: str
    out: Path
    stats: Any = None
    error: str | None = None
    seconds: float = 0.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="render_folder.py", description="Render every job store in a folder.")
    p.add_argument("folder", help="folder holding job stores (JOBS/<name>.zarr)")
    p.add_argument("--out", required=True, help="folder for the renders (RENDERS/<name>)")
    p.add_argument("--overrides", help="TOML or JSON file: [defaults] and [jobs.<name>] options")
    p.add_argument("--tiles", default=None, help="default tiles: auto or F,H,W")
    p.add_argument("--overlap", default=None, help="default overlap F,H,W in latent units")
    p.add_argument("--batch-frames", type=int, default=None, help="default pixel frames per batch")
    p.add_argument("--priority", type=int, default=None, help="default priority (farm submit --priority)")
    p.add_argument("--parallel", type=int, default=1, help="jobs rendered at once (default 1)")
    p.add_argument("--no-video", action="store_true", help="frames to Zarr only")
    p.add_argument("--restart", action="store_true", help="render over outputs of other inputs or plans")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="when run directly: join this scheduler")
    g.add_argument("--scheduler-file", help="when run directly: join the cluster of this scheduler file")
    g.add_argument("--workers", type=int, help="when run directly: start a local cluster of N workers")
    args = p.parse_args(list(argv))
    if args.parallel < 1:
        raise FarmError(f"--parallel {args.parallel} is invalid; use 1 or more")
    return args


def load_overrides(path: str | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(defaults, per-job options) from a TOML or JSON file, every key checked."""
    if path is None:
        return {}, {}
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise FarmError(f"overrides file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if file.suffix == ".json" else "TOML"
        raise FarmError(f"overrides file {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"defaults", "jobs"}:
        raise FarmError(f"overrides file {path}: expected tables 'defaults' and 'jobs', found {sorted(data)}")
    defaults = data.get("defaults", {})
    jobs = data.get("jobs", {})
    for where, table in [("defaults", defaults), *((f"jobs.{k}", v) for k, v in jobs.items())]:
        if not isinstance(table, dict):
            raise FarmError(f"overrides file {path}: {where} must be a table of options")
        unknown = set(table) - KEYS
        if unknown:
            raise FarmError(f"overrides file {path}: {where}: unknown option(s) {sorted(unknown)}; "
                            f"known: {sorted(KEYS)}")  # fmt: skip
        if "dtype" in table and table["dtype"] not in DTYPES:
            raise FarmError(f"overrides file {path}: {where}: dtype {table['dtype']!r}; use one of {DTYPES}")
    return defaults, {k.removesuffix(".zarr"): v for k, v in jobs.items()}


def find_jobs(folder: Path) -> dict[str, Path]:
    """Job stores directly inside `folder`, by name (``hero.zarr`` → ``hero``)."""
    from farm.media.names import check_name
    from farm.store.job import open_job

    if not folder.is_dir():
        raise FarmError(f"job folder {str(folder)!r} does not exist or is not a folder")
    jobs = {}
    for child in sorted(folder.iterdir()):
        if not (child.is_dir() and (child / "zarr.json").exists()):
            continue
        name = child.name.removesuffix(".zarr")
        try:
            check_name(name, "job name")  # RENDERS/<name> must stay inside RENDERS and clear of .views
            open_job(child)
        except FarmError as exc:
            workflow.log(f"render_folder: skipping {child.name}: {exc}")
            continue
        if name in jobs:
            raise FarmError(
                f"{str(jobs[name])!r} and {str(child)!r} would both render to {name!r}: rename one"
            )
        jobs[name] = child
    if not jobs:
        raise FarmError(f"no farm job stores in {str(folder)!r} (looked for folders holding zarr.json)")
    return jobs


def _triple(value: Any, what: str, minimum: int) -> tuple[int, int, int]:
    from farm.planning.options import parse_triple

    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return parse_triple(text, what, minimum=minimum)


def plan_options(opts: dict[str, Any], name: str) -> Any:
    from farm.planning.options import PlanOptions
    from farm.planning.tiling import ChunkSize

    kwargs: dict[str, Any] = {}
    if opts.get("tiles") is not None:
        tiles = opts["tiles"]
        kwargs["tiles"] = "auto" if str(tiles).lower() == "auto" else _triple(tiles, f"{name}: tiles", 1)
    if opts.get("overlap") is not None:
        kwargs["overlap"] = _triple(opts["overlap"], f"{name}: overlap", 0)
    if opts.get("batch_frames") is not None:
        kwargs["batch_frames"] = int(opts["batch_frames"])
    carry = opts.get("carry", False)
    if not isinstance(carry, bool):
        raise FarmError(f"{name}: carry = {carry!r} is invalid; use true or false")
    if opts.get("chunk") is not None:
        f, h, w = (v or None for v in _triple(opts["chunk"], f"{name}: chunk", 0))
        kwargs["chunk"] = ChunkSize(frames=f, height=h, width=w, carry=carry)
    elif carry:
        raise FarmError(f"{name}: carry = true needs a temporal chunk, e.g. chunk = [4, 0, 0]")
    return PlanOptions(**kwargs)


def job_view(job: Path, dtype: str, views: Path) -> Path:
    """`job` with its decoder's compute dtype set to `dtype`: a group of its own whose shots link to the
    original shots (nothing is copied). Returns `job` itself when the dtype is already that."""
    from farm.decoders import spec_from_json
    from farm.media.names import child_path
    from farm.store.job import open_job

    spec = open_job(job).spec
    if spec.dtype == dtype:
        return job
    raw = {**spec.to_json(), "dtype": dtype}
    spec_from_json(raw, where=f"{job}: dtype override")  # validates
    view = child_path(views, job.name.removesuffix(".zarr"), f".{dtype}.zarr", what="job name")
    view.mkdir(parents=True, exist_ok=True)
    meta = json.loads((job / "zarr.json").read_text())
    meta.setdefault("attributes", {})["farm"] = {**meta["attributes"]["farm"], "decoder": raw,
                                                 "view_of": str(job.resolve())}  # its shots may lead there
    (view / "zarr.json").write_text(json.dumps(meta, indent=2))
    for old in view.iterdir():
        if old.is_symlink():
            old.unlink()
    for shot in job.iterdir():
        if shot.is_dir() and (shot / "zarr.json").exists():
            child_path(view, shot.name).symlink_to(shot.resolve(), target_is_directory=True)
    return view


def render_one(
    name: str, job: Path, out_root: Path, opts: dict[str, Any], base: argparse.Namespace
) -> JobResult:
    from farm.media.names import child_path
    from farm.media.settings import VideoSettings

    out = child_path(out_root, name, what="job name")
    result = JobResult(name, out)
    started = time.perf_counter()
    try:
        source = job_view(job, opts["dtype"], out_root / ".views") if opts.get("dtype") else job
        shots = opts.get("shots")
        if isinstance(shots, str):
            shots = [s for s in shots.split(",") if s]
        cluster = {k: getattr(base, k) for k in ("scheduler", "scheduler_file", "workers")
                   if getattr(base, k)}  # fmt: skip
        video = VideoSettings(
            crf=int(opts.get("crf", 18)), preset=str(opts.get("preset", "veryfast")),
            enabled=bool(opts.get("video", not base.no_video)),
        )  # fmt: skip
        workflow.log(f"render_folder: {name}: rendering {source} -> {out}")
        result.stats = workflow.render(
            source, out, render_id=workflow.context().next_render_id(name), options=plan_options(opts, name),
            shots=shots, video=video, priority=opts.get("priority"), window=opts.get("window"),
            restart=bool(opts.get("restart", base.restart)), compile=bool(opts.get("compile", False)),
            **cluster,
        )  # fmt: skip
        failed = result.stats.failed
        if failed:
            result.error = "; ".join(f"{s.shot}: {s.error}" for s in failed)
    except workflow.Cancelled:
        raise
    except FarmError as exc:
        result.error = str(exc)
    result.seconds = time.perf_counter() - started
    return result


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    defaults, per_job = load_overrides(args.overrides)
    jobs = find_jobs(Path(args.folder))
    unknown = set(per_job) - set(jobs)
    if unknown:
        raise FarmError(f"overrides name jobs that are not in {args.folder}: {sorted(unknown)}; "
                        f"jobs: {sorted(jobs)}")  # fmt: skip
    command_line = {"tiles": args.tiles, "overlap": args.overlap, "batch_frames": args.batch_frames,
                    "priority": args.priority}  # fmt: skip
    out_root = Path(args.out)
    work = []
    for name, job in jobs.items():
        given = {k: v for k, v in command_line.items() if v is not None}
        opts = {**defaults, **given, **per_job.get(name, {})}
        if opts.get("skip"):
            workflow.log(f"render_folder: {name}: skipped (overrides)")
            continue
        work.append((name, job, opts))
    if args.parallel == 1:
        results = [render_one(name, job, out_root, opts, args) for name, job, opts in work]
    else:
        with ThreadPoolExecutor(args.parallel) as pool:  # each job its own copy of the workflow context
            futures = [
                pool.submit(contextvars.copy_context().run, render_one, name, job, out_root, opts, args)
                for name, job, opts in work
            ]
            results = [f.result() for f in futures]
    workflow.log(f"{'job':<24} {'shots':>5} {'batches':>9} {'frames':>7} {'seconds':>8}  result")
    for r in results:
        shots = len(r.stats.shots) if r.stats else 0
        batches = f"{r.stats.batches_written}/{r.stats.batches_total}" if r.stats else "-"
        frames = r.stats.frames_written if r.stats else 0
        outcome = "ok" if r.error is None else f"FAILED: {r.error}"
        workflow.log(f"{r.name:<24} {shots:>5} {batches:>9} {frames:>7} {r.seconds:>8.1f}  {outcome}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(workflow.run(main))
