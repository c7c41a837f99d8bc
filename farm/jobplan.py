"""A job's shot plans: the tile grid of each shot (explicit, or chosen by `farm.planner`), checked against
the decoder, with the tiles assigned to worker slots. Pure planning: no cluster, no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from farm.decoders import decoder_class
from farm.errors import FarmError
from farm.options import AUTO, DEFAULT_OVERLAP, PlanOptions
from farm.store import Job
from farm.tiling import AXES, MIN_SPATIAL_CHUNK, Geometry, ShotPlan, TileGrid, assign_round_robin, plan_shot
from farm.validate import check_shots


def grid_for(latent_fhw: Sequence[int], options: PlanOptions, spatial_overlap: int | None = None) -> TileGrid:
    """The tile grid for a shot: explicit overlaps as given; default overlaps (1 frame, `spatial_overlap`
    rows and columns: the decoder's, `spatial_overlap_for`) shrunk to fit small axes."""
    tiles = options.tiles
    if isinstance(tiles, str):
        raise ValueError("grid_for needs explicit tiles; auto grids come from plan_job (farm.planner)")
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
    errors = check_shots(job, names, channels)  # fps, latent dtype and shape, before any planning
    if errors:
        raise next(iter(errors.values()))
    auto = _auto_grids(job, options, n_workers, names, geometry, fixed) if options.tiles == AUTO else {}
    overlap = cls.spatial_overlap_for(job.spec.config)
    plans = []
    for name in names:
        info = job.shots[name]
        grid = auto[name] if options.tiles == AUTO else grid_for(info.latent_shape[1:], options, overlap)
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
    from farm import planner
    from farm.decoders import cost_model

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
) -> tuple[list[ShotPlan], dict[str, FarmError]]:
    """Plan each shot on its own: a shot that cannot be planned is reported, the others still go.
    `fixed` shots keep the grid given (with auto tiles: the grid OUT was started with)."""
    names = list(job.shots) if shots is None else list(shots)
    unknown = [n for n in names if n not in job.shots]
    if unknown:
        raise FarmError(f"shots {unknown} are not in the job {str(job.path)!r}; shots: {sorted(job.shots)}")
    try:  # all together first: shots of one shape share the auto planner's search
        return plan_job(job, options, 1, names, fixed=fixed), {}
    except FarmError:
        pass
    plans, errors = [], {}
    for name in names:  # some shot cannot be planned: find which, and plan the rest
        try:
            plans.extend(plan_job(job, options, 1, [name], fixed=fixed))
        except FarmError as exc:
            errors[name] = exc
    if not plans and errors:
        raise next(iter(errors.values()))
    return plans, errors
