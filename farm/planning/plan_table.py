"""The `farm plan` table: each shot's tiles, their workers, latent and pixel ranges, redundant work and
estimated memory per tile."""

from __future__ import annotations

from collections.abc import Sequence

from farm.decoders import DecoderSpec, decoder_class
from farm.decoders.base import human_bytes
from farm.planning.budgets import tile_peak_bytes
from farm.planning.tiling import (
    AXES,
    ShotPlan,
    carried_frames,
    takes_statistics_rounds,
    takes_whole_frame_pass,
)


def describe_plans(plans: Sequence[ShotPlan], spec: DecoderSpec, n_workers: int) -> str:
    """The `farm plan` table: tiles, workers, latent and pixel ranges, redundant work, memory per tile."""
    cls = decoder_class(spec)
    note = cls.plan_note(spec)
    lines = [f"decoder: {spec.describe()}", *([f"  {note}"] if note else []), f"workers: {n_workers}"]
    total_decoded = total_latent = 0
    for plan in plans:
        c, f, h, w = plan.latent_shape
        pf, ph, pw = plan.pixel_shape
        lines.append("")
        lines.append(
            f"shot {plan.shot}: latent {c}x{f}x{h}x{w} -> {pf} frames {pw}x{ph}; tiles "
            f"{'x'.join(map(str, plan.grid.tiles))} overlap {','.join(map(str, plan.grid.overlap))}; "
            f"{len(plan.batches)} batches; redundant work {plan.redundancy:.2f}x"
            + normalised_note(plan)
            + chunk_note(plan)
        )
        rounds = cls.statistics_round_count(spec.config) if cls.shares_statistics(spec.config) else 0
        if rounds and not takes_statistics_rounds(plan):
            seams = seam_note(plan, False)  # the tiles decode whole: the pass alone loses to the blend
        elif rounds:
            seams = statistics_note(plan, rounds, cls.statistics_exact(spec.config))
        else:
            shared = takes_whole_frame_pass(cls, spec.config, plan)
            seams = seam_note(plan, cls.halo_is_exact(spec.config), shared)
        if seams:
            lines.append(f"  {seams}")
        lines.append(
            f"  {'tile':>4} {'worker':>6}  {'latent F,H,W ranges':<28} {'pixel F,H,W ranges':<34} "
            f"{'peak mem':>10}  {'context':>7}  {'halo':>11}"
        )
        for tile in plan.tiles:
            lat = " ".join(f"{iv.start}:{iv.end}" for iv in tile.latent)
            pix = " ".join(f"{s.start}:{s.stop}" for s in tile.pixels)
            mem = tile_peak_bytes(cls, spec, tile, plan.chunk)
            warm = f"{tile.context},{tile.lookahead}"
            halo = ",".join(map(str, tile.halo))
            lines.append(
                f"  {tile.index:>4} {tile.worker:>6}  {lat:<28} {pix:<34} {human_bytes(mem):>10}  {warm:>7}"
                f"  {halo:>11}"
            )
        total_decoded += sum(t.latent_volume for t in plan.tiles)
        total_latent += f * h * w
    lines.append("")
    lines.append(
        "context: latent frames a tile decodes before, after its own and discards (they warm the decoder's "
        "temporal state; never blended; counted in the redundant work)"
    )
    lines.append(
        "halo: latent rows above, below, columns left, right a tile decodes beyond its own and discards (so "
        "its pixels see what a whole-frame decode sees; counted in the redundant work)"
    )
    lines.append(
        f"job: {sum(len(p.tiles) for p in plans)} tiles, redundant work {total_decoded / total_latent:.2f}x"
    )
    return "\n".join(lines)


def chunk_note(plan: ShotPlan) -> str:
    """How each tile is split into decode calls inside its worker (``--chunk``, ``--carry``)."""
    if plan.chunk.limits() == (None, None, None):
        return ""
    limits = ",".join("-" if v is None else str(v) for v in plan.chunk.limits())
    carried = ""
    if plan.chunk.carry and plan.chunk.frames is not None:
        first = min(plan.tiles, key=lambda t: t.grid_pos)
        sizes = carried_frames(first.latent[0].size, plan.chunk.frames, plan.chunk.taper)
        carried = (f"; temporal chunks carried, in order, no overlap or context: "
                   f"{', '.join(map(str, sizes))} latent frames")  # fmt: skip
    return f"; decode calls up to {limits} latent units{carried}"


def normalised_note(plan: ShotPlan) -> str:
    axes = [a for a, done in zip(AXES, plan.complementary, strict=True) if not done]
    return f" (ramps normalised on {', '.join(axes)})" if axes else ""


def statistics_note(plan: ShotPlan, rounds: int, exact: bool) -> str:
    """The spatial seams of a plan whose tiles take the shot's GroupNorm statistics in rounds."""
    halo = max((max(t.halo) for t in plan.tiles), default=0)
    overlap = max(plan.grid.overlap[1:])
    blend = f"a blend over overlap {overlap}" if overlap else "no blend"
    how = (f"the decoder's part that sees the whole frame runs once over it, and the whole shot's GroupNorm "
           f"statistics are shared by its tiles in {rounds} rounds")  # fmt: skip
    if exact:
        return (f"spatial seams: halo {halo}, {blend}, exact by shared statistics (each tile equals the "
                f"untiled decode to the dtype's noise): {how}")  # fmt: skip
    return (f"spatial seams: halo {halo}, {blend}; {how} (this config's rounds are not measured to reach the "
            "dtype's noise)")  # fmt: skip


def seam_note(plan: ShotPlan, halo_exact: bool, whole_frame: bool = False) -> str:
    """How the shot's spatial seams are made: by the halo alone (each tile equals the untiled decode to
    the dtype's noise), or by the halo and a blend (the decoder sees the whole frame somewhere); with
    `whole_frame`, the tiles decode from the decoder's part that sees the whole frame, run once over it."""
    if plan.grid.tiles[1:] == (1, 1):
        return ""
    halo = max((max(t.halo) for t in plan.tiles), default=0)
    overlap = max(plan.grid.overlap[1:])
    shared = "; the decoder's part that sees the whole frame runs once over it for every tile" * whole_frame
    if halo and halo_exact and not overlap:
        return (f"spatial seams: halo {halo}, no blend (each tile equals the untiled decode to the dtype's "
                f"noise){shared}")  # fmt: skip
    if halo and halo_exact:
        return (f"spatial seams: halo {halo} and a blend over overlap {overlap} (the halo alone would "
                f"do){shared}")  # fmt: skip
    if halo and whole_frame:
        blend = f"and a blend over overlap {overlap}" if overlap else "and no blend"
        return (f"spatial seams: halo {halo} {blend}{shared} (not the untiled decode: a part of the decoder "
                "after it still sees the whole tile, or the halo alone is not measured to reach the dtype's "
                "noise)")  # fmt: skip
    if halo:
        return (f"spatial seams: halo {halo} and a blend over overlap {overlap} (this decoder sees the whole "
                "frame somewhere, which no halo reaches)")  # fmt: skip
    return f"spatial seams: blended over overlap {overlap}, no halo (this decoder's halo is not measured)"
