"""The farm API: plan a job, render it on a cluster, make synthetic jobs.

>>> import farm.render as fr
>>> fr.synth("job.zarr", decoder="ltx2-tiny", shots=2, frames=17, height=128, width=192)  # doctest: +SKIP
>>> stats = fr.render("job.zarr", "out", workers=2)                                        # doctest: +SKIP
>>> stats.frames_written                                                                    # doctest: +SKIP
34
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import FAMILIES, DecoderSpec, compile_mode, decoder_class, spec_from_json
from farm.decoders.base import human_bytes
from farm.errors import FarmError
from farm.graph import ProgressCallback, RenderStats, ShotOutcome, run_graph, split_workers
from farm.lock import output_lock
from farm.store import (
    Job,
    Output,
    check_writable,
    create_job,
    drop_frames,
    identity_differences,
    latent_identity,
    open_job,
    prepare_output,
    record_identity,
    recorded_identity,
    remove_stale_temporaries,
    restart_shot,
    video_done,
    write_shot,
)
from farm.tasks import VideoSettings
from farm.tiling import (
    AXES,
    MIN_SPATIAL_CHUNK,
    ChunkSize,
    Geometry,
    ShotPlan,
    Tile,
    TileGrid,
    assign_round_robin,
    pending_plan,
    plan_chunks,
    plan_identity,
    plan_shot,
)

DEFAULT_OVERLAP = (1, 2, 2)  # latent units, used where an axis is split and no overlap was given
DEFAULT_BATCH_FRAMES = 32


AUTO = "auto"


@dataclass(frozen=True)
class PlanOptions:
    """How shots are tiled.

    ``tiles="auto"`` (the default) lets `farm.planner` choose per shot, for the job's shots and the
    worker count, between whole shots and tile grids, by predicted makespan; with auto, ``overlap``
    (if given) is the overlap it uses where it splits an axis, ``cost_model`` names the stored cost
    model (default: the decoder's, `farm.costmodel.default_name`) and ``worker_memory`` bounds one
    decode call in bytes (default: the cost model's worker memory). Explicit ``tiles`` always win.
    """

    tiles: tuple[int, int, int] | str = AUTO
    overlap: tuple[int, int, int] | None = None
    batch_frames: int = DEFAULT_BATCH_FRAMES
    chunk: ChunkSize = ChunkSize()
    cost_model: str | None = None
    worker_memory: int | None = None


def parse_tiles(text: str) -> tuple[int, int, int] | str:
    """``--tiles``: ``auto`` or three tile counts F,H,W."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return parse_triple(text, "--tiles", minimum=1)
    except FarmError:
        raise FarmError(
            f"--tiles {text!r} is invalid; give auto or three whole numbers ≥ 1 as F,H,W (e.g. 1,2,2)"
        ) from None


def grid_for(latent_fhw: Sequence[int], options: PlanOptions) -> TileGrid:
    """The tile grid for a shot: explicit overlaps as given; default overlaps shrunk to fit small axes."""
    if options.tiles == AUTO:
        raise ValueError("grid_for needs explicit tiles; auto grids come from plan_job (farm.planner)")
    if options.overlap is not None:
        return TileGrid(tuple(options.tiles), tuple(options.overlap))  # type: ignore[arg-type]
    overlap = []
    for size, count, default in zip(latent_fhw, options.tiles, DEFAULT_OVERLAP, strict=True):
        if count <= 1:
            overlap.append(0)
            continue
        o = default
        while o > 0 and o >= (size + (count - 1) * o) // count:
            o -= 1
        overlap.append(o)
    return TileGrid(tuple(options.tiles), tuple(overlap))  # type: ignore[arg-type]


def plan_job(
    job: Job,
    options: PlanOptions,
    n_workers: int,
    shots: Sequence[str] | None = None,
    *,
    fixed: Mapping[str, TileGrid] | None = None,
) -> list[ShotPlan]:
    """Plan every shot (or the named ones) and assign the tiles round-robin to `n_workers` slots.

    With ``options.tiles == "auto"`` the grids are chosen for all the named shots together on
    `n_workers` workers (one worker: whole shots unless memory forces a split); `fixed` shots keep the
    grid given (a resumed render keeps the grid its output was started with).
    """
    cls = decoder_class(job.spec)
    geometry = cls.geometry_for(job.spec.config)
    channels = cls.latent_channels_for(job.spec.config)
    names = list(job.shots) if shots is None else list(shots)
    for name in names:
        if name not in job.shots:
            raise FarmError(f"shot {name!r} is not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")
        info = job.shots[name]
        if len(info.latent_shape) != 4:
            raise FarmError(
                f"shot {name!r}: latent has shape {info.latent_shape}; expected 4 dimensions [C, F, H, W]"
            )
        if info.latent_shape[0] != channels:
            raise FarmError(
                f"shot {name!r}: latent has {info.latent_shape[0]} channels but the decoder "
                f"({job.spec.describe()}) takes {channels}; the latent and the decoder spec do not match"
            )
    auto = _auto_grids(job, options, n_workers, names, geometry, fixed) if options.tiles == AUTO else {}
    plans = []
    for name in names:
        info = job.shots[name]
        grid = auto[name] if options.tiles == AUTO else grid_for(info.latent_shape[1:], options)
        plan = plan_shot(name, info.latent_shape, geometry, grid, batch_frames=options.batch_frames,
                         chunk=options.chunk)  # fmt: skip
        check_tile_widths(plan)
        plans.append(plan)
    return assign_round_robin(plans, n_workers)


def check_tile_widths(plan: ShotPlan) -> None:
    """Decoders pad every tile spatially (reflect padding): a tile 1 latent unit wide cannot decode."""
    for axis in (1, 2):
        sizes = [iv.size for iv in {t.latent[axis] for t in plan.tiles}]
        if plan.grid.tiles[axis] > 1 and min(sizes) < MIN_SPATIAL_CHUNK:
            extent = plan.latent_shape[axis + 1]
            raise FarmError(
                f"shot {plan.shot!r}, {AXES[axis]}: {plan.grid.tiles[axis]} tiles over {extent} latent units "
                f"leave a tile {min(sizes)} unit wide, and decoders pad each tile (reflect padding), which "
                f"needs at least {MIN_SPATIAL_CHUNK}: use at most {max(1, extent // MIN_SPATIAL_CHUNK)} tiles"
            )


def _auto_grids(
    job: Job,
    options: PlanOptions,
    n_workers: int,
    names: Sequence[str],
    geometry: Geometry,
    fixed: Mapping[str, TileGrid] | None,
) -> dict[str, TileGrid]:
    from farm import costmodel, planner

    model = costmodel.load(options.cost_model or costmodel.default_name(job.spec))
    memory = options.worker_memory if options.worker_memory is not None else model.worker_memory_bytes
    return planner.choose_plans(
        {name: job.shots[name].latent_shape for name in names}, geometry, n_workers, model, memory, job.spec,
        min_overlap=options.overlap, batch_frames=options.batch_frames, chunk=options.chunk,
        fixed={k: v for k, v in (fixed or {}).items() if k in names},
    )  # fmt: skip


def plan_shots(
    job: Job, options: PlanOptions, shots: Sequence[str] | None = None
) -> tuple[list[ShotPlan], dict[str, FarmError]]:
    """Plan each shot on its own: a shot that cannot be planned is reported, the others still go."""
    names = list(job.shots) if shots is None else list(shots)
    unknown = [n for n in names if n not in job.shots]
    if unknown:
        raise FarmError(f"shots {unknown} are not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")
    try:  # all together first: shots of one shape share the auto planner's search
        return plan_job(job, options, 1, names), {}
    except FarmError:
        pass
    plans, errors = [], {}
    for name in names:  # some shot cannot be planned: find which, and plan the rest
        try:
            plans.extend(plan_job(job, options, 1, [name]))
        except FarmError as exc:
            errors[name] = exc
    if not plans and errors:
        raise next(iter(errors.values()))
    return plans, errors


def render(
    job_path: str | Path,
    out_path: str | Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    options: PlanOptions = PlanOptions(),
    shots: Sequence[str] | None = None,
    restart: bool = False,
    compile: bool | str = False,
    video: VideoSettings = VideoSettings(),
    window: int | None = None,
    log: Callable[[str], None] = print,
    on_progress: ProgressCallback | None = None,
    priority: int = 0,
    render_id: str | None = None,
    frames: str | None = None,
) -> RenderStats:
    """Render a job's shots to ``OUT/frames.zarr`` and ``OUT/videos``, resuming what OUT already holds.

    A rerun into the same OUT decodes only tiles that feed unfinished batches. OUT records what it is a
    render of (latents' hash, decoder spec, plan); a render of something else into it is refused unless
    `restart` (which starts the differing shots over). `compile` runs the decoder through
    torch.compile on GPU workers (each new tile shape compiles once per worker process); a string
    names the mode (`farm.decoders.COMPILE_MODES`, e.g. "reduce-overhead" for CUDA graphs).

    `frames` (e.g. ``"1-48"``, ``"1-100x2"``) renders only the batches holding those frame numbers and
    merges with what OUT already holds. `video` chooses the codec and an optional image sequence.

    `priority`: renders sharing a cluster run a higher priority's tasks first. `render_id` names the
    render on the cluster (task keys, the farm page, `farm cancel`; default: a new random id).
    """
    from farm.cluster import connect, dashboard_link
    from farm.monitor import install as install_monitor

    job = open_job(job_path)
    out = Output(Path(out_path), video.suffix)
    plans, shot_errors = plan_shots(job, options, shots)  # validates everything before a cluster starts
    decoder_class(job.spec).check_weights(job.spec)
    compile_mode(compile)
    check_writable(out)
    with (
        output_lock(out.root),
        connect(scheduler=scheduler, scheduler_file=scheduler_file, workers=workers) as client,
    ):
        remove_stale_temporaries(out)
        decode_workers = split_workers(client)[0]  # not the farm-io-* writers
        n_workers = len(decode_workers)
        if options.tiles == AUTO:  # the plan depends on the cluster: re-plan for its workers
            plans = plan_job(
                job, options, n_workers, [p.shot for p in plans], fixed=recorded_grids(out, plans, restart)
            )
        gpu_bytes = smallest_gpu_memory(client, decode_workers)
        warning = memory_warning(plans, job.spec, gpu_bytes)
        if warning:
            log(warning)
        if window is None:
            window = default_window(plans, job.spec, gpu_bytes, n_workers)
        per_worker = max(window or 2 * n_workers, 1) // max(n_workers, 1)
        host_need = host_peak_bytes(plans, per_worker, video)
        warning = host_memory_warning(host_need, smallest_memory_limit(client, decode_workers))
        if warning:
            log(warning)
        identities, unreadable = render_identities(job, plans, video)
        shot_errors.update(unreadable)  # unreadable or non-finite latents: those shots fail, the others go on
        plans = [p for p in plans if p.shot in identities]
        if not plans:
            raise next(iter(shot_errors.values()))
        pending, totals, finish = resume_points(
            out, plans, identities, restart=restart, video=video.enabled, log=log,
            frames=parse_frame_numbers(frames) if frames else None, first_frame=video.first_frame,
        )  # fmt: skip
        prepare_output(
            out, job, [(p.shot, p.pixel_shape, options.batch_frames) for p in plans], video.frames_dtype
        )
        for plan in plans:
            record_identity(out, plan.shot, identities[plan.shot], len(plan.batches))
        if job.spec.random_weights:
            log(f"warning: {job.spec.describe()}: the frames are not a real decode")
        stats = RenderStats()
        if pending:
            link = dashboard_link(client)
            page = install_monitor(client)
            render_id = render_id or uuid.uuid4().hex[:8]
            log(
                f"farm: {len(pending)} shot(s) to render, {n_workers} worker(s)"
                + (f", dashboard {link}" if link else "")
                + (f", farm page {page}" if page else "")
                + f", render id {render_id}"
            )
            metadata = {"comment": "farm render: " + job.spec.describe()}
            stats = run_graph(
                client, assign_round_robin(pending, n_workers), job_path=str(job.path),
                spec_json=job.spec.to_json(), out=out,
                fps={name: info.fps for name, info in job.shots.items()}, video=video,
                metadata=metadata, window=window, on_progress=on_progress, total_batches=totals,
                compile=compile, priority=priority, render_id=render_id,
                describe={"job": str(job.path), "out": str(out.root)}, finish=finish,
            )  # fmt: skip
    for plan in plans:
        if plan.shot not in stats.shots:  # finished by an earlier render
            video_path = str(out.video(plan.shot)) if video.enabled else None
            stats.shots[plan.shot] = ShotOutcome(plan.shot, len(plan.batches), len(plan.batches), video_path)
    for name, error in shot_errors.items():
        stats.shots[name] = ShotOutcome(name, 0, error=str(error))
    return stats


def recorded_grids(out: Output, plans: Sequence[ShotPlan], restart: bool) -> dict[str, TileGrid]:
    """Grids an earlier render of OUT used: an auto plan keeps them, so a resume on another number of
    workers continues the same tiles instead of being refused (unless restarting)."""
    if restart:
        return {}
    grids = {}
    for plan in plans:
        recorded = recorded_identity(out, plan.shot)
        if recorded and "plan" in recorded:
            grids[plan.shot] = TileGrid(tuple(recorded["plan"]["tiles"]), tuple(recorded["plan"]["overlap"]))
    return grids


def render_identities(
    job: Job, plans: Sequence[ShotPlan], video: VideoSettings
) -> tuple[dict[str, dict], dict[str, FarmError]]:
    """Each shot's render identity, and the error of each shot whose latent cannot be read or hashed.

    Shots are read and hashed on threads (Zarr reads, zstd and sha256 release the GIL): a job's latents
    are the largest part of a render's set-up, paid before the first decode starts.
    """
    from concurrent.futures import ThreadPoolExecutor

    def identity(plan: ShotPlan) -> dict | FarmError:
        try:
            return render_identity(job, plan, video)
        except FarmError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(8, max(len(plans), 1)), thread_name_prefix="farm-hash") as pool:
        results = dict(zip([p.shot for p in plans], pool.map(identity, plans), strict=True))
    identities = {k: v for k, v in results.items() if not isinstance(v, FarmError)}
    errors = {k: v for k, v in results.items() if isinstance(v, FarmError)}
    return identities, errors


def render_identity(job: Job, plan: ShotPlan, video: VideoSettings) -> dict:
    return {
        "latents": latent_identity(job, plan.shot),
        "decoder": job.spec.to_json(),
        "plan": plan_identity(plan),
        "outputs": {
            "video": video.codec if video.enabled else None,
            "sequence": video.sequence,
            "first_frame": video.first_frame if video.sequence else None,
            "frames_dtype": video.frames_dtype,
        },
    }


def resume_points(
    out: Output,
    plans: Sequence[ShotPlan],
    identities: dict[str, dict],
    *,
    restart: bool,
    video: bool = True,
    frames: Sequence[int] | None = None,
    first_frame: int = 1,
    log: Callable[[str], None],
) -> tuple[list[ShotPlan], dict[str, int], set[str]]:
    """What is left to do per shot, after checking OUT holds a render of the same job (or restarting).

    With `frames` (frame numbers, the first frame numbered `first_frame`) only the batches holding those
    frames are rendered; a shot's video is joined once all its batches are done. Returns the pending
    plans, each shot's batch count and the shots whose video can be joined by this render.
    """
    pending, totals, refused, finish = [], {}, [], set()
    for plan in plans:
        recorded = recorded_identity(out, plan.shot)
        if recorded is not None:
            differences = identity_differences(recorded, identities[plan.shot])
            if differences and not restart:
                refused.append(f"shot {plan.shot!r}: " + "; ".join(differences))
                continue
            if differences or restart:
                restart_shot(out, plan.shot)
                drop_frames(out, plan.shot)
                log(f"farm: shot {plan.shot!r} starts over" + (f" ({differences[0]})" if differences else ""))
        totals[plan.shot] = len(plan.batches)
        done = out.batches_done(plan.shot)
        if video_done(out, plan.shot) or (not video and len(done) == len(plan.batches)):
            continue
        skipped = set()
        if frames is not None:
            wanted = {n - first_frame for n in frames}
            last = plan.pixel_shape[0] - 1
            if not any(0 <= i <= last for i in wanted):
                raise FarmError(
                    f"--frames asks for no frame of shot {plan.shot!r}, whose frames are numbered "
                    f"{first_frame}-{first_frame + last}"
                )
            skipped = {b.index for b in plan.batches if not any(b.start <= i < b.stop for i in wanted)}
        if not skipped - done:  # every unfinished batch is rendered now: the video can be joined
            finish.add(plan.shot)
        if done:
            log(
                f"farm: shot {plan.shot!r}: resuming, {len(done)} of {len(plan.batches)} batches already done"
            )
        pending.append(pending_plan(plan, done | skipped))
    if refused:
        raise FarmError(
            f"output {str(out.root)!r} holds a render of something else: " + " | ".join(refused)
            + ". Use a new --out, or --restart to render those shots over (their finished work is discarded)"
        )  # fmt: skip
    return pending, totals, finish


def parse_frame_numbers(text: str) -> list[int]:
    """Render-farm frame lists: ``1-48``, ``1-100x2`` (every 2nd), ``7``, and commas between them."""
    numbers: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(-?\d+)(?:\s*-\s*(-?\d+)(?:\s*x\s*(\d+))?)?\s*", part)
        if not match:
            raise FarmError(
                f"--frames {text!r} is invalid at {part!r}; use frame numbers and ranges like 1-48, "
                "1-100x2 (every 2nd frame) or 1,5,10-20"
            )
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3) or 1)
        if stop < start or step < 1:
            raise FarmError(
                f"--frames {part!r} is an empty range; write FIRST-LAST with FIRST ≤ LAST, step ≥ 1"
            )
        numbers.extend(range(start, stop + 1, step))
    return sorted(set(numbers))


# --------------------------------------------------------------------------------------------------
# Synthetic jobs (demos, tests, benchmarks)
# --------------------------------------------------------------------------------------------------


def resolve_decoder(name: str) -> tuple[str, str]:
    """A named config ('ltx2-tiny') → (family, config name)."""
    for family, cls in FAMILIES.items():
        if name in cls.named_configs:
            return family, name
    known = sorted(n for cls in FAMILIES.values() for n in cls.named_configs)
    raise FarmError(f"unknown decoder {name!r}; choose one of {known}")


def synth_spec(
    decoder: str, *, seed: int = 0, dtype: str | None = None, weights: str | None = None
) -> DecoderSpec:
    family, config = resolve_decoder(decoder)
    raw = {
        "family": family,
        "config": config,
        "weights": {"path": str(weights)} if weights else {"random_seed": seed},
        "dtype": dtype or ("float32" if config.endswith("-tiny") else "bfloat16"),
    }
    return spec_from_json(raw, where="--decoder")


def synth(
    job_path: str | Path,
    *,
    decoder: str = "ltx2-tiny",
    shots: int = 1,
    frames: int = 17,
    height: int = 128,
    width: int = 192,
    seed: int = 0,
    fps: float = 24.0,
    dtype: str | None = None,
    weights: str | None = None,
    overwrite: bool = False,
) -> Job:
    """Write a job of `shots` random (smooth) latents sized to decode to frames x height x width pixels."""
    spec = synth_spec(decoder, seed=seed, dtype=dtype, weights=weights)
    cls = decoder_class(spec)
    g = cls.geometry_for(spec.config)
    channels = cls.latent_channels_for(spec.config)
    if shots < 1:
        raise FarmError(f"--shots {shots} is invalid; use 1 or more")
    valid_f = (frames - 1) % g.temporal_scale == 0 if g.causal else frames % g.temporal_scale == 0
    if frames < 1 or not valid_f:
        lo = (max(frames - 1, 0) // g.temporal_scale) * g.temporal_scale + 1
        raise FarmError(
            f"--frames {frames} cannot be produced by {decoder}: use 1 + {g.temporal_scale}k frames "
            f"(e.g. {lo} or {lo + g.temporal_scale})"
        )
    for name, value in (("--height", height), ("--width", width)):
        if value < g.spatial_scale or value % g.spatial_scale:
            raise FarmError(
                f"{name} {value} cannot be produced by {decoder}: use a multiple of {g.spatial_scale} "
                f"(e.g. {max(1, value // g.spatial_scale) * g.spatial_scale})"
            )
    f = (frames - 1) // g.temporal_scale + 1 if g.causal else frames // g.temporal_scale
    h, w = height // g.spatial_scale, width // g.spatial_scale
    create_job(job_path, spec, overwrite=overwrite)
    rng = np.random.default_rng(seed)
    for k in range(shots):
        write_shot(job_path, f"shot{k:03d}", smooth_latent(rng, (channels, f, h, w)), fps=fps,
                   attrs={"synthetic": True, "seed": seed})  # fmt: skip
    return open_job(job_path)


def smooth_latent(rng: np.random.Generator, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Random latents that vary slowly in space and time (a coarse grid, linearly interpolated)."""
    c, f, h, w = shape
    coarse = rng.standard_normal((c, max(2, math.ceil(f / 2) + 1), max(2, h // 2 + 1), max(2, w // 2 + 1)))
    out = coarse
    for axis, n in ((1, f), (2, h), (3, w)):
        src = np.linspace(0, out.shape[axis] - 1, n)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, out.shape[axis] - 1)
        t = (src - lo).reshape([-1 if a == axis else 1 for a in range(4)])
        out = np.take(out, lo, axis=axis) * (1 - t) + np.take(out, hi, axis=axis) * t
    return out.astype(np.float32)


def describe_plans(plans: Sequence[ShotPlan], spec: DecoderSpec, n_workers: int) -> str:
    """The `farm plan` table: tiles, workers, latent and pixel ranges, redundant work, memory per tile."""
    cls = decoder_class(spec)
    lines = [f"decoder: {spec.describe()}", f"workers: {n_workers}"]
    total_decoded = total_latent = 0
    for plan in plans:
        c, f, h, w = plan.latent_shape
        pf, ph, pw = plan.pixel_shape
        lines.append("")
        lines.append(
            f"shot {plan.shot}: latent {c}x{f}x{h}x{w} -> {pf} frames {pw}x{ph}; tiles "
            f"{'x'.join(map(str, plan.grid.tiles))} overlap {','.join(map(str, plan.grid.overlap))}; "
            f"{len(plan.batches)} batches; redundant work {plan.redundancy:.2f}x" + normalised_note(plan)
        )
        lines.append(
            f"  {'tile':>4} {'worker':>6}  {'latent F,H,W ranges':<28} {'pixel F,H,W ranges':<34} "
            f"{'peak mem':>10}"
        )
        for tile in plan.tiles:
            lat = " ".join(f"{iv.start}:{iv.end}" for iv in tile.latent)
            pix = " ".join(f"{s.start}:{s.stop}" for s in tile.pixels)
            mem = tile_peak_bytes(cls, spec, tile, plan.chunk)
            lines.append(f"  {tile.index:>4} {tile.worker:>6}  {lat:<28} {pix:<34} {human_bytes(mem):>10}")
        total_decoded += sum(t.latent_volume for t in plan.tiles)
        total_latent += f * h * w
    lines.append("")
    lines.append(
        f"job: {sum(len(p.tiles) for p in plans)} tiles, redundant work {total_decoded / total_latent:.2f}x"
    )
    return "\n".join(lines)


def normalised_note(plan: ShotPlan) -> str:
    axes = [a for a, done in zip(AXES, plan.complementary, strict=True) if not done]
    return f" (ramps normalised on {', '.join(axes)})" if axes else ""


def tile_peak_bytes(cls: type, spec: DecoderSpec, tile: Tile, chunk: ChunkSize) -> int:
    """Estimated peak device memory to decode a tile: its largest decode call, plus, when the tile is
    decoded in chunks, the float32 buffer the chunks are blended into (3 x 4 bytes per pixel-frame;
    measured on the H200: a chunked 121x704x1216 tile peaked at 4.46 GiB, 2.70 GiB for the call alone)."""
    geometry = cls.geometry_for(spec.config)
    chunks = plan_chunks([iv.size for iv in tile.latent], geometry, chunk)
    peak = cls.peak_bytes(spec, max(c.pixel_volume for c in chunks))
    return peak + (12 * tile.pixel_volume if len(chunks) > 1 else 0)


def smallest_gpu_memory(client: Any, workers: Sequence[str]) -> int | None:
    """Total memory of the smallest GPU among `workers` (None on a CPU cluster)."""
    sizes = [v for v in client.run(_gpu_memory_total, workers=list(workers)).values() if v]
    return min(sizes) if sizes else None


def _gpu_memory_total() -> int | None:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None


# Decoded tiles a GPU worker may hold at once. Each held tile keeps its weighted float32 pieces until
# every batch it feeds is written; holding more lets the GPU decode ahead while blends, transfers and
# writes finish. Measured on one H200, 8 shots of 121x704x1216 written to Zarr: 2 tiles 170 frames/s,
# 8 tiles 233 frames/s (peak 12.6 → 17.3 GiB) (docs/benchmarks.md).
MIN_TILES_PER_WORKER, MAX_TILES_PER_WORKER = 2, 8


def default_window(
    plans: Sequence[ShotPlan], spec: DecoderSpec, gpu_bytes: int | None, n_workers: int
) -> int | None:
    """Decoded tiles in flight when the user gives no --window: per worker, as many as fit in 90 % of
    the smallest GPU beside the largest decode (2 to 8); None on a CPU cluster (run_graph's default)."""
    if not gpu_bytes or not plans:
        return None
    decode, held = _decode_and_held_bytes(plans, spec)
    per_worker = int((0.9 * gpu_bytes - decode) // held)
    return max(1, n_workers) * min(MAX_TILES_PER_WORKER, max(MIN_TILES_PER_WORKER, per_worker))


def window_peak_bytes(plans: Sequence[ShotPlan], spec: DecoderSpec, tiles_per_worker: int) -> int:
    """Upper bound of a GPU worker's memory holding `tiles_per_worker` decoded tiles: the largest decode
    beside the pieces of the others (measured on the H200, 8 whole 704p shots: 17.3 GiB, bound 20.5)."""
    decode, held = _decode_and_held_bytes(plans, spec)
    return decode + max(0, tiles_per_worker - 1) * held


def _decode_and_held_bytes(plans: Sequence[ShotPlan], spec: DecoderSpec) -> tuple[int, int]:
    cls = decoder_class(spec)
    decode = max(tile_peak_bytes(cls, spec, t, p.chunk) for p in plans for t in p.tiles)
    held = max(12 * t.pixel_volume for p in plans for t in p.tiles)  # float32 RGB pieces of one tile
    return decode, held


def host_peak_bytes(plans: Sequence[ShotPlan], tiles_in_flight: int, video: VideoSettings) -> int:
    """Upper bound of a decode worker's host memory for blended batches: every batch the tiles in flight
    feed, blended (full frames: 3 bytes per pixel for uint8, 6 for float16, 1.5 more for the encoder's
    yuv420p planes) and held until its writes and encodes are done."""
    if not plans:
        return 0
    per_pixel = (3 if video.frames_dtype == "uint8" else 6) + (1.5 if video.takes_yuv420 else 0)
    largest = max(
        sum(b.frames for b in p.batches if t.index in b.tiles) * p.pixel_shape[1] * p.pixel_shape[2]
        for p in plans
        for t in p.tiles
    )
    return int(max(1, tiles_in_flight) * largest * per_pixel)


def host_memory_warning(need: int, limit: int | None) -> str | None:
    """A warning when blended batches could pass 60 % of a worker's memory limit (where Dask spills)."""
    if not limit or need <= 0.6 * limit:
        return None
    return (
        f"warning: blended batches may need up to {human_bytes(need)} of host memory per decode worker, "
        f"over 60% of its memory limit ({human_bytes(limit)}), where Dask starts spilling to disk; lower "
        "--window or --batch-frames, or give workers more memory"
    )


def smallest_memory_limit(client: Any, workers: Sequence[str]) -> int | None:
    """The smallest host-memory limit among `workers` (None when none has one)."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    limits = [int(info[w].get("memory_limit") or 0) for w in workers if w in info]
    limits = [v for v in limits if v > 0]
    return min(limits) if limits else None


def memory_warning(plans: Sequence[ShotPlan], spec: DecoderSpec, gpu_bytes: int | None) -> str | None:
    """A warning when the plan's largest tile is estimated to need more than 90 % of a worker's GPU."""
    if not gpu_bytes or not plans:
        return None
    cls = decoder_class(spec)
    need, shot = max((tile_peak_bytes(cls, spec, t, p.chunk), p.shot) for p in plans for t in p.tiles)
    if need <= 0.9 * gpu_bytes:
        return None
    return (
        f"warning: shot {shot!r}: a tile is estimated to need {human_bytes(need)} of GPU memory, more than "
        f"90% of the smallest worker GPU ({human_bytes(gpu_bytes)}); split it with --tiles or bound each "
        "decode call with --chunk F,H,W"
    )


def tile_chunk_volume(tile: Tile, chunk: ChunkSize, geometry: Geometry) -> int:
    """Pixel volume of the largest single decode call of a tile (its chunk, or the whole tile)."""
    chunks = plan_chunks([iv.size for iv in tile.latent], geometry, chunk)
    return max(c.pixel_volume for c in chunks)


def parse_triple(text: str, option: str, *, minimum: int) -> tuple[int, int, int]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < minimum:
        raise FarmError(
            f"{option} {text!r} is invalid; give three whole numbers ≥ {minimum} as F,H,W (e.g. 1,2,2)"
        )
    return values  # type: ignore[return-value]


__all__ = [
    "AUTO",
    "PlanOptions",
    "RenderStats",
    "describe_plans",
    "parse_tiles",
    "parse_triple",
    "plan_job",
    "render",
    "synth",
]
