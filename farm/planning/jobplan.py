"""A job's shot plans: the tile grid of each shot (explicit, or chosen by `farm.planning.planner`),
checked against the decoder, with the tiles assigned to worker slots. Pure planning: no cluster, no
torch."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from farm.decoders import DecoderSpec, decoder_class, memory_model
from farm.errors import FarmError
from farm.media.rates import RANGE_TEXT, parse_timecode, read_rate
from farm.media.settings import VideoSettings
from farm.planning import planner
from farm.planning.budgets import default_window, tile_peak_bytes
from farm.planning.costmodel import CostModel, cost_model, for_encoding, without_video
from farm.planning.options import AUTO, DEFAULT_OVERLAP, PlanOptions
from farm.planning.planner import Prediction
from farm.planning.tiling import (
    AXES,
    MIN_SPATIAL_CHUNK,
    ChunkSize,
    Geometry,
    ShotPlan,
    TileGrid,
    assign_round_robin,
    plan_shot,
)
from farm.store.claims import shape_problem
from farm.store.job import Job, open_job


def grid_for(latent_fhw: Sequence[int], options: PlanOptions, spatial_overlap: int | None = None) -> TileGrid:
    """The tile grid for a shot: explicit overlaps as given; default overlaps (1 frame, `spatial_overlap`
    rows and columns: the decoder's, `spatial_overlap_for`) shrunk to fit small axes."""
    tiles = options.tiles
    if isinstance(tiles, str):
        raise ValueError("grid_for needs explicit tiles; auto grids come from plan_job (planning.planner)")
    if options.overlap is not None:
        return TileGrid(_triple(tiles), _triple(options.overlap))
    o = DEFAULT_OVERLAP[1] if spatial_overlap is None else spatial_overlap
    defaults = (DEFAULT_OVERLAP[0], o, o)
    overlap = []
    for size, count, default in zip(latent_fhw, tiles, defaults, strict=True):
        if count <= 1:
            overlap.append(0)
            continue
        o = default
        while o > 0 and o >= (size + (count - 1) * o) // count:
            o -= 1
        overlap.append(o)
    return TileGrid(_triple(tiles), _triple(overlap))


def _triple(values: Sequence[int]) -> tuple[int, int, int]:
    """F, H, W values as a tuple (options built by hand may hold lists)."""
    f, h, w = values
    return (f, h, w)


def plan_job(
    job: Job | str | os.PathLike[str],
    options: PlanOptions,
    n_workers: int,
    shots: Sequence[str] | None = None,
    *,
    fixed: Mapping[str, TileGrid] | None = None,
    fixed_chunks: Mapping[str, ChunkSize] | None = None,
    n_io: int = 0,
    video: bool | VideoSettings = True,
) -> list[ShotPlan]:
    """Plan every shot (or the named ones) and assign the tiles round-robin to `n_workers` slots.

    With ``options.tiles == "auto"`` the grids are chosen for all the named shots together on
    `n_workers` workers (one worker: whole shots unless memory forces a split); `fixed` shots keep the
    grid given (a resumed render keeps the grid its output was started with). Auto tiles without a
    ``--chunk`` may also carry temporal chunks (`auto_chunks`; `n_io` I/O workers beside the decoders
    and `video` encodes or not in its prediction), and `fixed_chunks` shots keep the chunking their
    output was started with. `job`: a `Job`, or the path of a job store (opened here).
    """
    job = job if isinstance(job, Job) else open_job(job)
    cls = decoder_class(job.spec)
    geometry = cls.geometry_for_spec(job.spec)
    channels = cls.latent_channels_for(job.spec.config)
    names = list(job.shots) if shots is None else list(shots)
    for name in names:
        if name not in job.shots:
            raise FarmError(f"shot {name!r} is not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")
    errors = check_shots(job, names, channels)  # fps, latent dtype and shape, before any planning
    if errors:
        raise next(iter(errors.values()))
    if options.tiles == AUTO:
        grids = _auto_grids(job, options, n_workers, names, geometry, fixed)
    else:
        overlap = cls.spatial_overlap_for(job.spec.config)
        frames_split = options.tiles[0] != 1  # explicit tiles here (auto above)
        if cls.statistics_exact(job.spec.config) and not frames_split and not any(options.chunk.limits()):
            overlap = 0  # its tiles take the shot's statistics in rounds and equal the untiled decode
        grids = {name: grid_for(job.shots[name].latent_shape[1:], options, overlap) for name in names}
    chunks = {name: options.chunk for name in names}
    if options.tiles == AUTO and options.chunk == ChunkSize():
        chunks.update({k: v for k, v in (fixed_chunks or {}).items() if k in chunks})
        free = [n for n in names if n not in (fixed_chunks or {})]
        chunks.update(auto_chunks(job, options, n_workers, grids, chunks, free, geometry, n_io, video))
    plans = []
    for name in names:
        plan = plan_shot(name, job.shots[name].latent_shape, geometry, grids[name],
                         batch_frames=options.batch_frames, chunk=chunks[name])  # fmt: skip
        check_tile_widths(plan)
        plans.append(plan)
    return assign_round_robin(plans, n_workers)


def predict_render(
    plans: Sequence[ShotPlan], spec: DecoderSpec, model: CostModel, n_workers: int, n_io: int
) -> tuple[Prediction, int | None]:
    """The planner's prediction of `plans` (assigned to `n_workers` slots) as `farm render` runs them:
    through the window the memory budget gives each worker on the cost model's GPU (returned too; None
    on a CPU cluster), with `n_io` I/O workers. A window of 2 and no I/O workers predicted a streamed
    704p shot at 1.7 s; it ran in 0.8 s."""
    window = default_window(plans, spec, model.worker_memory_bytes, 1)
    prediction = planner.predict(plans, n_workers, model, memory=memory_model(spec), n_io=n_io,
                                 window=window * n_workers if window else None)  # fmt: skip
    return prediction, window


# Carried chunks auto chooses: of up to 5 latent frames, tapered. Measured on one H200 (LTX-2, bf16),
# the fastest of 4 and 5, even and tapered, for single shots of 704x1216 and 1088x1920
# (docs/performance.md).
AUTO_CARRY = ChunkSize(frames=5, carry=True)


def auto_chunks(
    job: Job,
    options: PlanOptions,
    n_workers: int,
    grids: Mapping[str, TileGrid],
    chunks: Mapping[str, ChunkSize],
    free: Sequence[str],
    geometry: Geometry,
    n_io: int,
    video: bool | VideoSettings = True,
) -> dict[str, ChunkSize]:
    """Carried temporal chunks (`AUTO_CARRY`) for the `free` shots when the job's predicted makespan
    with them beats the one without by more than the planner's `MIN_GAIN`, else nothing.

    Carrying streams a shot's writes behind its own decode: it pays where nothing else hides them (a
    lone shot, the last shots of a job) and costs a few decode calls' overhead everywhere else. Only
    for decoders that carry their state and GPU cost models (on CPU workers the decode dwarfs the
    writes), within the worker memory the grids were chosen for; each way is predicted as `farm plan`
    predicts a render: through the window its memory allows, with `n_io` I/O workers, encoding video
    segments unless not `video`.
    (With 32-frame batches and video, one 1088x1920 shot on one GPU gains 4.9 %: not enough; with
    8-frame batches 20 %.)"""
    model = render_cost_model(job.spec, options, video)
    if not free or not geometry.carries or model.decode_on_host:
        return {}
    budget = options.worker_memory if options.worker_memory is not None else model.worker_memory_bytes
    cls = decoder_class(job.spec)

    def predicted(chosen: Mapping[str, ChunkSize], names: Sequence[str]) -> float | None:
        try:
            plans = [plan_shot(n, job.shots[n].latent_shape, geometry, grids[n], chunk=chosen[n],
                               batch_frames=options.batch_frames) for n in names]  # fmt: skip
        except FarmError:  # e.g. temporal tiles across workers: no temporal chunks inside them
            return None
        if budget and any(tile_peak_bytes(cls, job.spec, t, p.chunk) > budget * planner.MEMORY_HEADROOM
                          for p in plans for t in p.tiles):  # fmt: skip
            return None
        prediction, _ = predict_render(assign_round_robin(plans, n_workers), job.spec, model, n_workers, n_io)
        return prediction.makespan_s

    def pays(names: Sequence[str]) -> bool:
        base, with_carry = predicted(chunks, names), predicted(carried, names)
        return base is not None and with_carry is not None and with_carry < base * (1.0 - planner.MIN_GAIN)

    carried = {n: AUTO_CARRY if n in free else chunks[n] for n in grids}
    names = list(grids)
    # the job's last rounds first, as the grid search does: carrying gains only where a worker's
    # queue ends, so where the suffix gains nothing the whole job gains less (and costs far less to ask)
    suffix = names[len(names) - ((len(names) % n_workers) + 2 * n_workers) :]
    if not pays(suffix) or (len(suffix) < len(names) and not pays(names)):
        return {}
    return {n: AUTO_CARRY for n in free}


def render_cost_model(spec: DecoderSpec, options: PlanOptions, video: bool | VideoSettings) -> CostModel:
    """The cost model a render of `spec` is predicted with: `options.cost_model` (default: the decoder's),
    its encodes those of `video` (True: the configured codec and preset; False: no video) of frames
    written at `options.encoded_bits_per_pixel` (None: the frames the model was measured on)."""
    model = cost_model(spec, options.cost_model)
    settings = encoded_video(video)
    if settings is None:
        return without_video(model)
    codec = "h265" if settings.hdr else settings.codec  # an HDR render's video is its x265 HLG master
    return for_encoding(model, codec, settings.preset, options.encoded_bits_per_pixel)


def encoded_video(video: bool | VideoSettings) -> VideoSettings | None:
    """The video a render encodes (True: the configured codec and preset), or None when it encodes none."""
    settings = VideoSettings() if video is True else video
    return settings if settings is not False and settings.writes_video else None


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
    model = cost_model(job.spec, options.cost_model)
    memory = options.worker_memory if options.worker_memory is not None else model.worker_memory_bytes
    return planner.choose_plans(
        {name: job.shots[name].latent_shape for name in names}, geometry, n_workers, model, memory, job.spec,
        min_overlap=options.overlap, batch_frames=options.batch_frames, chunk=options.chunk,
        fixed={k: v for k, v in (fixed or {}).items() if k in names},
    )  # fmt: skip


def plan_shots(
    job: Job,
    options: PlanOptions,
    shots: Sequence[str] | None = None,
    *,
    fixed: Mapping[str, TileGrid] | None = None,
    fixed_chunks: Mapping[str, ChunkSize] | None = None,
    n_workers: int = 1,
    n_io: int = 0,
    video: bool | VideoSettings = True,
) -> tuple[list[ShotPlan], dict[str, FarmError]]:
    """Plan each shot on its own: a shot that cannot be planned is reported, the others still go.
    `fixed` shots keep the grid given and `fixed_chunks` shots the chunking (with auto tiles: those OUT
    was started with); `n_workers`, `n_io` and `video` as `plan_job` takes them (auto tiles plan for
    them; before a cluster is known, one decode worker)."""
    names = list(job.shots) if shots is None else list(shots)
    unknown = [n for n in names if n not in job.shots]
    if unknown:
        raise FarmError(f"shots {unknown} are not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")

    def plan(some: list[str]) -> list[ShotPlan]:
        return plan_job(job, options, n_workers, some, fixed=fixed, fixed_chunks=fixed_chunks, n_io=n_io,
                        video=video)  # fmt: skip

    try:  # all together first: shots of one shape share the auto planner's search
        return plan(names), {}
    except FarmError:
        pass
    plans, errors = [], {}
    for name in names:  # some shot cannot be planned: find which, and plan the rest
        try:
            plans.extend(plan([name]))
        except FarmError as exc:
            errors[name] = exc
    if not plans and errors:
        raise next(iter(errors.values()))
    return assign_round_robin(plans, n_workers), errors


# the highest frame rate a shot may declare
MAX_FPS = 1000.0


def _floating(dtype: str) -> bool:
    try:
        return bool(np.issubdtype(np.dtype(dtype), np.floating))
    except TypeError:  # a Zarr data type numpy does not know (strings, structs)
        return False


def _timecode_problem(info: Any) -> str | None:
    raw = info.attrs.get("timecode")
    if raw is None:
        return None
    try:
        parse_timecode(raw, info.rate, where="timecode attribute")
    except FarmError as exc:
        return str(exc)
    return None


def check_shots(job: Job, names: Sequence[str], channels: int) -> dict[str, FarmError]:
    """An error for each named shot whose values cannot render (fps, latent dtype and shape)."""
    errors = {}
    for name in names:
        info = job.shots[name]
        problem = None
        raw_fps = info.attrs.get("fps", info.fps)
        shape = info.latent_shape
        if info.problem is not None:
            errors[name] = FarmError(info.problem)
            continue
        if info.rate is None or not (math.isfinite(info.fps) and 0 < info.fps <= MAX_FPS):
            # the attribute that is wrong: 'fps' (which wins) unless only 'rate' is there or fps is fine
            field = "rate" if "rate" in info.attrs and read_rate({"fps": raw_fps}) is not None else "fps"
            raw = info.attrs["rate"] if field == "rate" else raw_fps
            problem = (f"{field} {raw!r} is invalid; set the shot's 'fps' attribute (or 'rate', a ratio such "
                       f"as \"24000/1001\") to frames per second {RANGE_TEXT}")  # fmt: skip
        elif (timecode_problem := _timecode_problem(info)) is not None:
            problem = timecode_problem
        elif not _floating(info.latent_dtype):
            problem = (f"latent dtype {info.latent_dtype} is not a floating-point type; store the latent "
                       "as float16 or float32")  # fmt: skip
        elif len(shape) != 4:
            problem = f"latent has shape {tuple(shape)}; expected 4 dimensions [C, F, H, W]"
        elif claim := shape_problem(shape, info.latent_chunks, np.dtype(info.latent_dtype).itemsize):
            problem = claim  # refused by what it claims, before any plan or read sized by the claim
        elif shape[0] != channels:
            problem = (f"latent has {shape[0]} channels but the decoder ({job.spec.describe()}) takes "
                       f"{channels}; the latent and the decoder spec do not match")  # fmt: skip
        elif shape[1] < 1 or min(shape[2:]) < MIN_SPATIAL_CHUNK:
            problem = (f"latent has shape {tuple(shape)}: it needs at least 1 latent frame and "
                       f"{MIN_SPATIAL_CHUNK} latent rows and columns (decoders pad each side)")  # fmt: skip
        if problem:
            errors[name] = FarmError(f"shot {name!r}: {problem}")
    return errors
