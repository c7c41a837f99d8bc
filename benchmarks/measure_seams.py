"""Seam quality as a number: a tiled decode against the untiled decode of the same latent.

Every tiled decode here runs in this process the way a farm worker does it (`farm.worker.tasks.decode_block`
per tile, multiplied by the tile's separable blend weights, summed in tile order), so what is measured is
the plan, not the cluster. Untiled is one `decode_block` of the whole latent.

Three measurements:

* ``overlaps``: for each axis, the latent split into two tiles along that axis only, with overlaps
  0, 1, 2, ... latent units. This is what the planner's minimum overlap per axis
  (`farm.planning.planner.min_overlap_for`) was read from.
* ``edges``: how far from a tile's edge its decode differs from the untiled one (after a temporal
  tile's causal start, and after a spatial cut), per latent unit.
* ``spatial``: every family, two tiles along height and then width, spatial overlap swept; the least
  overlap whose seam-band PSNR (uint8 frames) reaches the target on both axes is what the adapters record
  as ``spatial_overlap``, the default overlap of explicit and auto tiles.
* ``plans``: for full-size shots (1216x704x121 and 1920x1088x121 by default), each compared plan (LTX-2's
  shipped grids with overlap 4, and the auto planner's choice for 2, 4 and 8 workers under a cost model).

Metrics, all on frames clamped to [0, 1] as a render writes them (before the uint8 rounding):
PSNR over the whole video (peak 1.0), PSNR over the seam band only (pixels within one latent unit of a
tile edge, plus the overlaps), and the largest absolute difference in uint8 levels (x255).

On a CPU there are no real weights here: the decoders have RANDOM weights (seeded). Random weights make
a decoder's output noise-like and its activations larger than a trained model's; seams measured on them
are worse than seams of a trained decoder, and the numbers compare plans with each other, not with what
an audience would see. ``ltx2`` is the real LTX-2 architecture (slow on a CPU: use small latents),
``ltx2-tiny`` the same class with a few channels and one layer per block (a much smaller receptive field
than the real decoder, so its seams are narrower).

Usage (from the repository root, venv active):

    python benchmarks/measure_seams.py overlaps --decoder ltx2-tiny --out-json seams-tiny.json
    python benchmarks/measure_seams.py overlaps --decoder ltx2 --overlaps 0,2,4,6,8 --long 20 --short 4 \
        --frames-short 2 --out-json seams-ltx2.json
    python benchmarks/measure_seams.py edges --decoder ltx2
    python benchmarks/measure_seams.py plans --decoder ltx2-tiny --out-json seams-plans.json
    python benchmarks/measure_seams.py spatial --threads 1 --out-md spatial.md
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.decoders.base import SEAM_TARGET_DB  # noqa: E402
from farm.inputs.synthetic import smooth_latent, synth_spec  # noqa: E402
from farm.planning.tiling import AXES, ChunkSize, Geometry, ShotPlan, TileGrid, plan_shot  # noqa: E402

# Shipped LTX-2 multi-GPU grids (latent units): 2x2 and 2x4 (height x width) with overlap 4, and the
# documentation's "8 height tiles, overlap 4".
SHIPPED = {
    "ltx2 2x2 o4 (4 GPUs)": TileGrid((1, 2, 2), (0, 4, 4)),
    "ltx2 2x4 o4 (8 GPUs)": TileGrid((1, 2, 4), (0, 4, 4)),
    "ltx2 8 height o4": TileGrid((1, 8, 1), (0, 4, 0)),
}
SHAPES = {"1216x704x121": (16, 22, 38), "1920x1088x121": (16, 34, 60)}


def build_decoder(name: str, seed: int, dtype: str = "float32"):
    import torch

    from farm.decoders.ltx2 import LTX2Decoder

    spec = synth_spec(name, seed=seed, dtype=dtype)
    model = LTX2Decoder.build(spec)
    model.encoder = torch.nn.Identity()
    model.to(dtype=getattr(torch, dtype))
    return LTX2Decoder(spec, model, "cpu")


def decode_plan(decoder, latent, plan: ShotPlan):
    """The render's frames for `plan` as float32 [3, F, H, W] (before clamping), decoded in this process."""
    import torch

    from farm.worker.tasks import decode_block, drop_context

    full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32)
    for tile in plan.tiles:
        block = latent[(slice(None), *tile.decode_slices())]
        pixels = decode_block(decoder, block, plan.chunk, origin=tile.decode_origin()).float()
        pixels = drop_context(pixels, tile, decoder.geometry)
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
        pixels = pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        full[:, f0:f1, h0:h1, w0:w1] += pixels
        del pixels
        release_memory()
    return full


def release_memory() -> None:
    """Give freed decode buffers back to the OS (glibc keeps them otherwise; full-size shots need it)."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def seam_mask(plan: ShotPlan, geometry: Geometry):
    """Pixels within one latent unit of a tile edge inside the shot, and every overlap (boolean [F, H, W])."""
    import torch

    masks = []
    for axis in range(3):
        extent = plan.pixel_shape[axis]
        scale = geometry.temporal_scale if axis == 0 else geometry.spatial_scale
        m = torch.zeros(extent, dtype=torch.bool)
        coverage = torch.zeros(extent, dtype=torch.int32)
        seen = set()
        for tile in plan.tiles:
            span = tile.pixels[axis]
            if (span.start, span.stop) in seen:
                continue
            seen.add((span.start, span.stop))
            coverage[span.start : span.stop] += 1
            for edge in (span.start, span.stop):
                if 0 < edge < extent:
                    m[max(0, edge - scale) : min(extent, edge + scale)] = True
        m |= coverage > 1
        masks.append(m)
    f, h, w = masks
    return f.view(-1, 1, 1) | h.view(1, -1, 1) | w.view(1, 1, -1)


def compare(tiled, reference, mask=None, *, frames_per_step: int = 8) -> dict:
    """PSNR, seam-band PSNR and max error of clamped frames, a few frames at a time (bounded memory)."""
    total = band = 0.0
    n_band = 0
    worst = 0.0
    for f0 in range(0, tiled.shape[1], frames_per_step):
        sl = slice(f0, f0 + frames_per_step)
        diff = tiled[:, sl].clamp(0, 1).double() - reference[:, sl].clamp(0, 1).double()
        sq = diff**2
        total += float(sq.sum())
        worst = max(worst, float(diff.abs().max()))
        if mask is not None:
            m = mask[sl]
            band += float(sq[:, m].sum())
            n_band += int(m.sum()) * diff.shape[0]
    out = {"psnr_db": psnr(total / tiled.numel()), "max_err_levels": worst * 255}
    if mask is not None and n_band:
        out["seam_psnr_db"] = psnr(band / n_band)
        out["seam_fraction"] = float(mask.float().mean())
    return out


def psnr(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def fmt_db(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.1f}"


def machine() -> str:
    import torch

    return (
        f"{platform.node() or 'host'}: {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )


def measurement(what: str, args, rows: list[dict], **extra) -> dict:
    """A measurement's rows with what was measured, on which decoder and machine, and when."""
    return {"what": what, "decoder": args.decoder, "weights": f"RANDOM (seed {args.seed})", **extra,
            "machine": machine(), "date": str(date.today()), "rows": rows}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# overlaps: two tiles along one axis, overlap swept
# --------------------------------------------------------------------------------------------------


def run_overlaps(args) -> dict:
    import torch

    decoder = build_decoder(args.decoder, args.seed)
    g = decoder.geometry
    c = decoder.latent_channels
    rng = np.random.default_rng(args.seed)
    overlaps = [int(x) for x in args.overlaps.split(",")]
    long, short = args.long, args.short
    rows = []
    for axis in [AXES.index(a) for a in args.axes.split(",")]:
        fhw = [args.frames_short, short, short]
        fhw[axis] = long
        latent = torch.from_numpy(smooth_latent(rng, (c, *fhw)))
        t0 = time.perf_counter()
        whole = plan_shot("x", (c, *fhw), g)
        reference = decode_plan(decoder, latent, whole)
        t_ref = time.perf_counter() - t0
        print(f"{AXES[axis]}: latent {fhw}, untiled decode {t_ref:.1f} s", flush=True)
        for o in overlaps:
            tiles = [1, 1, 1]
            tiles[axis] = 2
            ov = [0, 0, 0]
            ov[axis] = o
            plan = plan_shot("x", (c, *fhw), g, TileGrid(tuple(tiles), tuple(ov)))  # type: ignore[arg-type]
            t0 = time.perf_counter()
            tiled = decode_plan(decoder, latent, plan)
            row = {
                "axis": AXES[axis],
                "latent": fhw,
                "overlap": o,
                "redundancy": plan.redundancy,
                **compare(tiled, reference, seam_mask(plan, g)),
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            print(
                f"  overlap {o}: PSNR {fmt_db(row['psnr_db'])} dB, seam PSNR "
                f"{fmt_db(row.get('seam_psnr_db', math.inf))} dB, max error {row['max_err_levels']:.1f}/255",
                flush=True,
            )
    return measurement("two tiles along one axis vs untiled, overlap swept", args, rows)


def overlaps_markdown(result: dict) -> str:
    lines = [
        f"Decoder `{result['decoder']}`, {result['weights']} weights, float32, {result['machine']}.",
        "",
        "| axis | latent F,H,W | overlap | redundancy | PSNR dB | seam-band PSNR dB | max error /255 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['axis']} | {','.join(map(str, r['latent']))} | {r['overlap']} | {r['redundancy']:.2f} | "
            f"{fmt_db(r['psnr_db'])} | {fmt_db(r.get('seam_psnr_db', math.inf))} | "
            f"{r['max_err_levels']:.1f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# edges: how far from a tile's edge its decode differs from the untiled one
# --------------------------------------------------------------------------------------------------


def run_edges(args) -> dict:
    """Largest difference per latent unit from a tile's edge: after a temporal tile's (causal) start,
    and after a spatial cut, each against the untiled decode."""
    import torch

    decoder = build_decoder(args.decoder, args.seed)
    c = decoder.latent_channels
    t, k = decoder.geometry.temporal_scale, decoder.geometry.spatial_scale
    rng = np.random.default_rng(args.seed)
    rows = []
    frames, start = 24, 6
    z = torch.from_numpy(smooth_latent(rng, (c, frames, 4, 4)))
    whole, tile = decoder.decode(z), decoder.decode(z[:, start:])  # the tile starts at latent frame 6
    err = (tile - whole[:, start * t :]).abs()
    for j in range(frames - start):
        lo, hi = (0, 1) if j == 0 else (1 + (j - 1) * t, 1 + j * t)  # pixel frames of latent frame j
        rows.append(
            {"axis": "frames", "units_from_edge": j, "max_err_levels": float(err[:, lo:hi].max() * 255)}
        )
    cut = 8
    z = torch.from_numpy(smooth_latent(rng, (c, 2, 4, 20)))
    whole, tile = decoder.decode(z), decoder.decode(z[..., cut:])  # the tile starts at latent column 8
    err = (tile - whole[..., cut * k :]).abs()
    for j in range(12):
        rows.append({"axis": "width", "units_from_edge": j,
                     "max_err_levels": float(err[..., j * k : (j + 1) * k].max() * 255)})  # fmt: skip
    for r in rows:
        print(f"  {r['axis']:<7} {r['units_from_edge']:>3} latent units from the edge: "
              f"max error {r['max_err_levels']:.1f}/255", flush=True)  # fmt: skip
    return measurement("difference from the untiled decode per latent unit from a tile's edge", args, rows)


def edges_markdown(result: dict) -> str:
    by_axis: dict[str, list[str]] = {}
    for r in result["rows"]:
        by_axis.setdefault(r["axis"], []).append(f"{r['max_err_levels']:.1f}")
    lines = [f"Decoder `{result['decoder']}`, {result['weights']} weights, {result['machine']}.", ""]
    lines += [
        f"- {axis}: max error /255 at 0, 1, 2, ... latent units: {', '.join(v)}"
        for axis, v in by_axis.items()
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# context: how many latent frames a temporal tile must decode before (after) its own
# --------------------------------------------------------------------------------------------------


def any_decoder(name: str, seed: int, dtype: str = "float32", device: str = "cpu"):
    """Any family's decoder with RANDOM weights, decoding each tile on its own (no context frames)."""
    from farm.decoders import decoder_class

    spec = synth_spec(name, seed=seed, dtype=dtype)
    decoder = decoder_class(spec).load(spec, device)
    decoder.geometry = decoder.geometry.without_context()
    return decoder


def warmup_errors(
    decoder, z, seam: int, *, before: bool, stop_below: float = 0.0
) -> list[tuple[int, float, list[float]]]:
    """Per amount of context (before=True) or lookahead, the largest error (uint8 levels) of the frames a
    tile keeps against the whole decode, overall and per latent frame from the seam.

    A tile starting at latent frame `seam` decodes ``[seam - c, F)`` and keeps pixel frames from
    ``seam * t``; a tile ending there decodes ``[0, seam + a)`` and keeps frames up to ``1 + (seam - 1) t``.
    """
    t = decoder.geometry.temporal_scale
    frames = z.shape[1]
    whole = decoder.decode(z, origin=(0, 0, 0)).float()
    rows = []
    for k in range(0, (seam if before else frames - seam) + 1):
        if before:
            out = decoder.decode(z[:, seam - k :], origin=(seam - k, 0, 0)).float()[:, k * t :]
            ref = whole[:, seam * t :]
        else:
            keep = 1 + (seam - 1) * t
            out, ref = decoder.decode(z[:, : seam + k], origin=(0, 0, 0)).float()[:, :keep], whole[:, :keep]
        err = (out - ref).abs().amax(dim=(0, 2, 3)) * 255
        n = err.shape[0] // t
        per_frame = [float(err[max(0, 1 + (j - 1) * t) : 1 + j * t].max()) for j in range(1, n)]
        if before:
            per_frame = [float(err[0])] + per_frame
        rows.append((k, float(err.max()), per_frame if before else per_frame[::-1]))
        if float(err.max()) < stop_below:
            break
    return rows


def run_context(args) -> dict:
    import torch

    torch.backends.cudnn.allow_tf32 = False  # TF32 convolutions would bury float rounding under noise
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name in args.decoders.split(","):
        decoder = any_decoder(name, args.seed, args.dtype, args.device)
        rng = np.random.default_rng(args.seed)
        z = torch.from_numpy(smooth_latent(rng, (decoder.latent_channels, args.frames, args.size, args.size)))
        z = z.to(args.device)
        seam = args.frames // 2
        found = {}
        for before in (True, False):
            errs = warmup_errors(decoder, z, seam, before=before, stop_below=args.threshold)
            need = next((k for k, worst, _ in errs if worst < args.threshold), None)
            found["context" if before else "lookahead"] = need
            for k, worst, per_frame in errs:
                steps = " ".join(f"{x:.2g}" for x in per_frame[:10])
                what = "context" if before else "lookahead"
                print(f"{name} {what} {k:>2}: max {worst:8.3g} levels; from the seam {steps}", flush=True)
        rows.append({"decoder": name, "latent": [args.frames, args.size, args.size], "seam": seam,
                     "threshold_levels": args.threshold, **found})  # fmt: skip
        print(f"{name}: context {found['context']}, lookahead {found['lookahead']}", flush=True)
    return {"what": "latent frames of context / lookahead for a temporal tile to match the whole decode",
            "weights": f"RANDOM (seed {args.seed})", "dtype": args.dtype, "device": args.device,
            "machine": machine(), "date": str(date.today()), "rows": rows}  # fmt: skip


def context_markdown(result: dict) -> str:
    lines = [
        f"{result['weights']} weights, {result['dtype']} on {result['device']}, {result['machine']}.",
        "",
        "| decoder | latent F,H,W (seam) | context | lookahead | (max error below, levels) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['decoder']} | {','.join(map(str, r['latent']))} ({r['seam']}) | {r['context']} | "
                     f"{r['lookahead']} | {r['threshold_levels']} |")  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# fidelity: every family, farm's tiles vs diffusers' enable_tiling, against the untiled decode
# --------------------------------------------------------------------------------------------------

# decoder → clip (pixel frames, height, width): the sizes docs/fidelity.md reports
FIDELITY_CLIPS = {
    "ltx2-tiny": (49, 256, 384),
    "ltxv-tiny": (49, 256, 384),
    "wan-tiny": (33, 128, 192),  # smaller: Wan's frame-by-frame decode is slow on a CPU
    "hunyuanvideo-tiny": (33, 128, 192),
}


def levels(pixels):
    """Float frames [3, F, H, W] → uint8 levels as float64 (what a render writes)."""
    return (pixels.clamp(0, 1) * 255).round().double()


def frame_psnrs(a, b) -> list[float]:
    mse = ((a - b) ** 2).mean(dim=(0, 2, 3))
    return [psnr(float(m) / 255**2) for m in mse]


def diffusers_tiled(decoder, z, *, spatial_overlap: int | None = None, temporal: bool = False):
    """diffusers' own tiling of the same model: a 2x2 spatial split with `spatial_overlap` latent units
    blended, or 2 temporal tiles (Wan has none: its frame-by-frame cache decodes any length exactly)."""
    model, g = decoder.model, decoder.geometry
    f, h, w = z.shape[1:]
    s, t = g.spatial_scale, g.temporal_scale
    settings = {}
    if spatial_overlap is not None:
        th, tw = -(-h // 2), -(-w // 2)
        settings = {
            "tile_sample_min_height": (th + spatial_overlap) * s,
            "tile_sample_stride_height": th * s,
            "tile_sample_min_width": (tw + spatial_overlap) * s,
            "tile_sample_stride_width": tw * s,
        }
    names = (*settings, "use_tiling", "use_framewise_decoding", "tile_sample_min_num_frames",
             "tile_sample_stride_num_frames")  # fmt: skip
    saved = {k: getattr(model, k, None) for k in names}
    try:
        for k, v in settings.items():
            setattr(model, k, v)
        model.use_tiling = spatial_overlap is not None
        if temporal:
            stride = -(-f // 2)
            model.use_framewise_decoding = True
            model.tile_sample_min_num_frames, model.tile_sample_stride_num_frames = (
                (stride + 1) * t,
                stride * t,
            )
        elif hasattr(model, "use_framewise_decoding"):
            model.use_framewise_decoding = False
        return decoder.decode(z, origin=(0, 0, 0)).float(), (-(-f // 2)) * t if temporal else 0
    finally:
        for k, v in saved.items():
            setattr(model, k, v)


def fidelity_row(rows: list, name: str, fhw, ref, method: str, split: str, out, seam: int = 0,
                 redundancy: float | None = None) -> None:  # fmt: skip
    """One tiled decode against the untiled one: whole clip and the worst frame from the seam on."""
    per_frame = frame_psnrs(levels(out), ref)
    whole = psnr(float(((levels(out) - ref) ** 2).mean()) / 255**2)
    worst = min(per_frame[seam:])
    rows.append({"decoder": name, "latent": list(fhw), "method": method, "split": split, "psnr_db": whole,
                 "worst_after_seam_db": worst, "seam_frame": seam, "redundancy": redundancy})  # fmt: skip
    print(f"  {method:<24} {split:<24} PSNR {fmt_db(whole)} dB, worst after the seam {fmt_db(worst)} dB",
          flush=True)  # fmt: skip


def run_fidelity(args) -> dict:
    import torch

    args.decoder = args.decoders
    rows = []
    for name in args.decoders.split(","):
        decoder = any_decoder(name, args.seed)
        plain = decoder.geometry
        warm = type(decoder).geometry_for(decoder.spec.config)
        pf, ph, pw = FIDELITY_CLIPS[name]
        t, k = plain.temporal_scale, plain.spatial_scale
        fhw = (1 + (pf - 1) // t, ph // k, pw // k)
        rng = np.random.default_rng(args.seed)
        z = torch.from_numpy(smooth_latent(rng, (decoder.latent_channels, *fhw)))
        t0 = time.perf_counter()
        ref = levels(decode_plan(decoder, z, plan_shot("x", z.shape, plain)))
        print(f"{name}: latent {fhw}, untiled decode {time.perf_counter() - t0:.1f} s", flush=True)

        row = functools.partial(fidelity_row, rows, name, fhw, ref)

        for o in (2, 4):
            decoder.geometry = plain
            plan = plan_shot("x", z.shape, plain, TileGrid((1, 2, 2), (0, o, o)))
            row("farm", f"spatial 2x2 overlap {o}", decode_plan(decoder, z, plan), redundancy=plan.redundancy)
            row(
                "diffusers enable_tiling",
                f"spatial 2x2 overlap {o}",
                diffusers_tiled(decoder, z, spatial_overlap=o)[0],
            )
        for label, g in (("farm, no context", plain), ("farm", warm)):
            decoder.geometry = g
            plan = plan_shot("x", z.shape, g, TileGrid((2, 1, 1), (1, 0, 0)))
            seam = plan.tiles[-1].pixels[0].start
            row(label, "temporal 2 tiles", decode_plan(decoder, z, plan), seam, plan.redundancy)
        decoder.geometry = plain
        if name.startswith("wan"):
            row("diffusers (frame cache)", "temporal: exact", decoder.decode(z, origin=(0, 0, 0)).float())
        else:
            out, seam = diffusers_tiled(decoder, z, temporal=True)
            row("diffusers framewise", "temporal 2 tiles", out, seam)
    return measurement("tiled decodes vs untiled, farm and diffusers, every family", args, rows)


def fidelity_markdown(result: dict) -> str:
    lines = [
        f"{result['weights']} weights, float32, {result['machine']}, {result['date']}; PSNR of uint8 frames "
        "against the untiled decode of the same latent.",
        "",
        "| decoder | latent F,H,W | split | method | redundancy | PSNR dB | worst frame after the seam dB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        red = "" if r["redundancy"] is None else f"{r['redundancy']:.2f}"
        lines.append(f"| {r['decoder']} | {','.join(map(str, r['latent']))} | {r['split']} | {r['method']} | "
                     f"{red} | {fmt_db(r['psnr_db'])} | {fmt_db(r['worst_after_seam_db'])} |")  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# spatial: the overlap each family needs for a target seam PSNR
# --------------------------------------------------------------------------------------------------


def band_psnr(tiled, reference, mask) -> float:
    """PSNR of the uint8 frames a render writes, over the seam band only."""
    diff = levels(tiled) - levels(reference)
    return psnr(float((diff[:, mask] ** 2).mean()) / 255**2)


def run_spatial(args) -> dict:
    """Per decoder: two tiles along height, then width, spatial overlap swept; each row's seam-band PSNR
    (uint8 frames against the untiled decode), and the smallest overlap whose seam meets the target on
    both axes (what the adapters record as ``spatial_overlap``)."""
    import torch

    args.decoder = args.decoders
    overlaps = [int(x) for x in args.overlaps.split(",")]
    rows: list[dict] = []
    chosen, reached = {}, {}
    for name in args.decoders.split(","):
        decoder = any_decoder(name, args.seed)
        g, c = decoder.geometry, decoder.latent_channels
        worst: dict[int, float] = {}
        for axis in (1, 2):
            fhw = [args.frames, args.short, args.short]
            fhw[axis] = args.long
            rng = np.random.default_rng(args.seed)
            latent = torch.from_numpy(smooth_latent(rng, (c, *fhw)))
            reference = decode_plan(decoder, latent, plan_shot("x", (c, *fhw), g))
            for o in overlaps:
                tiles, ov = [1, 1, 1], [0, 0, 0]
                tiles[axis], ov[axis] = 2, o
                plan = plan_shot("x", (c, *fhw), g, TileGrid(tuple(tiles), tuple(ov)))  # type: ignore[arg-type]
                tiled = decode_plan(decoder, latent, plan)
                seam_db = band_psnr(tiled, reference, seam_mask(plan, g))
                whole_db = psnr(float(((levels(tiled) - levels(reference)) ** 2).mean()) / 255**2)
                worst[o] = min(worst.get(o, math.inf), seam_db)
                rows.append({"decoder": name, "axis": AXES[axis], "latent": fhw, "overlap": o,
                             "redundancy": plan.redundancy, "psnr_db": whole_db,
                             "seam_psnr_db": seam_db})  # fmt: skip
                print(f"{name} {AXES[axis]:<6} overlap {o}: seam {fmt_db(seam_db)} dB, "
                      f"clip {fmt_db(whole_db)} dB", flush=True)  # fmt: skip
        # the least overlap meeting the target; where none in the sweep does (HunyuanVideo: its GroupNorms
        # take statistics over the whole tile, so its error is not only at the seam), the least within
        # 1 dB of the sweep's best seam
        meets = [o for o in overlaps if worst[o] >= args.target]
        best = max(worst.values())
        chosen[name] = meets[0] if meets else next(o for o in overlaps if worst[o] >= best - 1.0)
        reached[name] = bool(meets)
        print(f"{name}: overlap {chosen[name]} ({'meets' if meets else 'does not reach'} {args.target} dB)",
              flush=True)  # fmt: skip
    return measurement("spatial overlap per family for a target seam PSNR", args, rows,
                       target_db=args.target, chosen=chosen, reached=reached)  # fmt: skip


def spatial_markdown(result: dict) -> str:
    overlaps = sorted({r["overlap"] for r in result["rows"]})
    lines = [
        f"{result['weights']} weights, float32, {result['machine']}, {result['date']}; seam-band PSNR (dB) "
        "of uint8 frames, two tiles along one axis against the untiled decode; target "
        f"{result['target_db']} dB.",
        "",
        "| decoder | axis | latent F,H,W | " + " | ".join(f"overlap {o}" for o in overlaps) + " | chosen |",
        "| --- | --- | --- | " + " | ".join("---" for _ in overlaps) + " | --- |",
    ]
    by_key: dict[tuple[str, str], dict[int, dict]] = {}
    for r in result["rows"]:
        by_key.setdefault((r["decoder"], r["axis"]), {})[r["overlap"]] = r
    for (name, axis), cells in by_key.items():
        latent = ",".join(map(str, next(iter(cells.values()))["latent"]))
        dbs = " | ".join(fmt_db(cells[o]["seam_psnr_db"]) if o in cells else "" for o in overlaps)
        mark = "" if result["reached"][name] else " (target not reached)"
        lines.append(f"| {name} | {axis} | {latent} | {dbs} | {result['chosen'][name]}{mark} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# groupnorm: tiles normalised with statistics of the whole frame (xDiT) against blending, at equal work
# --------------------------------------------------------------------------------------------------


def groupnorm_statistics(decoder, latent) -> list:
    """Mean and variance per sample and group of every GroupNorm's input, in call order, in a decode."""
    import torch

    stats: list = []

    def record(module, inputs, _output) -> None:
        x = inputs[0].float().reshape(inputs[0].shape[0], module.num_groups, -1)
        stats.append((x.mean(-1), x.var(-1, unbiased=False)))

    norms = [m for m in decoder.model.modules() if isinstance(m, torch.nn.GroupNorm)]
    hooks = [m.register_forward_hook(record) for m in norms]
    try:
        decoder.decode(latent, origin=(0, 0, 0))
    finally:
        for h in hooks:
            h.remove()
    return stats


def with_shared_statistics(decoder, stats):
    """A context in which every GroupNorm of `decoder` normalises with `stats` (call order), not its
    input's."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def shared():
        norms = [m for m in decoder.model.modules() if isinstance(m, torch.nn.GroupNorm)]
        calls = iter(range(len(stats)))

        def forward(module, x):
            mean, var = stats[next(calls)]
            shape = (x.shape[0], module.num_groups, -1)
            y = (x.float().reshape(shape) - mean[..., None]) / torch.sqrt(var[..., None] + module.eps)
            y = y.reshape(x.shape)
            if module.affine:
                view = (1, -1) + (1,) * (x.dim() - 2)
                y = y * module.weight.view(view) + module.bias.view(view)
            return y.to(x.dtype)

        saved = {m: m.forward for m in norms}
        for m in norms:
            m.forward = functools.partial(forward, m)
        try:
            yield
        finally:
            for m, f in saved.items():
                m.forward = f

    return shared


def decode_plan_shared(decoder, latent, plan: ShotPlan, stats):
    """`decode_plan` with every tile normalised by `stats` (the same for every tile, in call order)."""
    import torch

    from farm.worker.tasks import drop_context

    full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32)
    for tile in plan.tiles:
        block = latent[(slice(None), *tile.decode_slices())]
        with with_shared_statistics(decoder, stats)():
            pixels = decoder.decode(block, origin=tile.decode_origin()).float()
        pixels = drop_context(pixels, tile, decoder.geometry)
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        full[:, f0:f1, h0:h1, w0:w1] += pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
    return full


def owned_columns(plan: ShotPlan, tile, axis: int) -> tuple[float, float]:
    """The part of `tile` along `axis` (1 or 2) it owns, tile-local latent units: up to the middle of
    each overlap with a neighbour (xDiT's rows without their halo)."""
    spans = sorted({(t.latent[axis].start, t.latent[axis].end) for t in plan.tiles})
    k = spans.index((tile.latent[axis].start, tile.latent[axis].end))
    lo = 0.0 if k == 0 else (spans[k][0] + spans[k - 1][1]) / 2
    hi = float(plan.latent_shape[axis + 1]) if k == len(spans) - 1 else (spans[k + 1][0] + spans[k][1]) / 2
    return lo - spans[k][0], hi - spans[k][0]


def decode_plan_lockstep(decoder, latent, plan: ShotPlan):
    """`decode_plan` with the tiles decoded at once, one thread each, every GroupNorm normalising with
    statistics summed over what each tile owns (an all-reduce per GroupNorm, as xDiT's row sharding)."""
    import threading

    import torch

    from farm.worker.tasks import drop_context

    tiles = plan.tiles
    barrier, local = threading.Barrier(len(tiles)), threading.local()
    partial: dict[tuple[int, int], tuple] = {}

    def owned(x, tile):
        """x [B, C, T, H, W] → its owned rows and columns (the tile's latent block scaled to x's size)."""
        for axis in (1, 2):
            size = tile.latent[axis].size
            r = x.shape[2 + axis] / size
            lo, hi = owned_columns(plan, tile, axis)
            x = x.narrow(2 + axis, round(lo * r), round(hi * r) - round(lo * r))
        return x

    def forward(module, x):
        tile, k = tiles[local.index], local.calls
        local.calls += 1
        b, ch = x.shape[:2]
        full = x.float()
        if full.dim() == 3:  # attention's norm over a flattened [B, C, T*H*W] sequence at latent size
            f, h, w = tile.decoded_fhw
            full = full.reshape(b, ch, -1, h, w)
        own = owned(full, tile).reshape(b, module.num_groups, -1)
        partial[(k, local.index)] = (own.sum(-1), (own * own).sum(-1), own.shape[-1])
        barrier.wait()
        parts = [partial[(k, i)] for i in range(len(tiles))]
        n = sum(p[2] for p in parts)
        mean = sum(p[0] for p in parts) / n
        var = sum(p[1] for p in parts) / n - mean * mean
        y = x.float().reshape(b, module.num_groups, -1) - mean[..., None]
        y = (y / torch.sqrt(var[..., None] + module.eps)).reshape(x.shape)
        view = (1, -1) + (1,) * (x.dim() - 2)
        return (y * module.weight.view(view) + module.bias.view(view)).to(x.dtype)

    outs: dict[int, torch.Tensor] = {}

    def run(i: int) -> None:
        local.index, local.calls = i, 0
        block = latent[(slice(None), *tiles[i].decode_slices())]
        with torch.inference_mode():
            z = block.to(dtype=decoder.torch_dtype)[None]
            outs[i] = (decoder.run_decoder(z, tiles[i].decode_origin())[0].float() + 1.0) / 2.0

    norms = [m for m in decoder.model.modules() if isinstance(m, torch.nn.GroupNorm)]
    saved = {m: m.forward for m in norms}
    for m in norms:
        m.forward = functools.partial(forward, m)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tiles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for m, f in saved.items():
            m.forward = f
    full_frames = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32)
    for i, tile in enumerate(tiles):
        pixels = drop_context(outs[i], tile, decoder.geometry)
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        weights = wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
        full_frames[:, f0:f1, h0:h1, w0:w1] += pixels * weights
    return full_frames


def run_groupnorm(args) -> dict:
    """Two tiles along width: blended tiles with their own statistics; tiles normalised with the whole
    frame's statistics (exact: from the untiled decode, as xDiT's all-reduce gives; or estimated from a
    decode of every other latent row and column, a quarter of the work); blending at more overlap."""
    import torch

    args.decoder = args.decoders
    rows: list[dict] = []
    for name in args.decoders.split(","):
        decoder = any_decoder(name, args.seed)
        g, c = decoder.geometry, decoder.latent_channels
        fhw = (args.frames, args.short, args.long)
        latent = torch.from_numpy(smooth_latent(np.random.default_rng(args.seed), (c, *fhw)))
        reference = decode_plan(decoder, latent, plan_shot("x", (c, *fhw), g))
        exact = groupnorm_statistics(decoder, latent)
        coarse = groupnorm_statistics(decoder, latent[:, :, ::2, ::2])
        for o in [int(x) for x in args.overlaps.split(",")]:
            plan = plan_shot("x", (c, *fhw), g, TileGrid((1, 1, 2), (0, 0, o)))
            mask = seam_mask(plan, g)
            for method, work, stats in (
                ("blend", plan.redundancy, None),
                ("shared statistics, all-reduce over owned columns", plan.redundancy, "lockstep"),
                ("statistics of the untiled decode", None, exact),
                ("statistics of a 1/4 decode", plan.redundancy + 0.25, coarse),
            ):
                if stats is None:
                    tiled = decode_plan(decoder, latent, plan)
                elif stats == "lockstep":
                    tiled = decode_plan_lockstep(decoder, latent, plan)
                else:
                    tiled = decode_plan_shared(decoder, latent, plan, stats)
                clip = psnr(float(((levels(tiled) - levels(reference)) ** 2).mean()) / 255**2)
                row = {"decoder": name, "latent": list(fhw), "overlap": o, "method": method, "work": work,
                       "seam_psnr_db": band_psnr(tiled, reference, mask), "psnr_db": clip}  # fmt: skip
                rows.append(row)
                print(f"{name} overlap {o} {method:<32} work {work or float('nan'):.2f}: seam "
                      f"{fmt_db(row['seam_psnr_db'])} dB, clip {fmt_db(clip)} dB", flush=True)  # fmt: skip
    return measurement("GroupNorm statistics shared across spatial tiles vs blending", args, rows)


def groupnorm_markdown(result: dict) -> str:
    lines = [
        f"{result['weights']} weights, float32, {result['machine']}, {result['date']}; two tiles along width "
        "against the untiled decode, uint8 frames.",
        "",
        "| decoder | latent F,H,W | overlap | method | work (decoded / shot latent) | seam-band PSNR dB | "
        "clip PSNR dB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        work = "(the untiled decode's)" if r["work"] is None else f"{r['work']:.2f}"
        latent = ",".join(map(str, r["latent"]))
        lines.append(f"| {r['decoder']} | {latent} | {r['overlap']} | {r['method']} | {work} | "
                     f"{fmt_db(r['seam_psnr_db'])} | {fmt_db(r['psnr_db'])} |")  # fmt: skip
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# plans: full-size shots, shipped grids vs auto
# --------------------------------------------------------------------------------------------------


def compared_plans(latent_fhw, cost_model_name: str) -> dict[str, TileGrid]:
    """The shipped LTX-2 grids and the auto planner's grid for one shot on 2, 4 and 8 workers."""
    from farm.decoders import memory_model
    from farm.planning import costmodel, planner

    model = costmodel.load(cost_model_name)
    spec = synth_spec("ltx2", dtype="bfloat16")
    from farm.decoders import decoder_class

    g = decoder_class(spec).geometry_for(spec.config)
    memory = memory_model(spec)
    out = dict(SHIPPED)
    for n in (2, 4, 8):
        grid = planner.choose_plans(
            {"shot": (128, *latent_fhw)}, g, n, model, model.worker_memory_bytes, memory=memory
        )["shot"]
        out.setdefault(f"auto {n} workers", grid)
    return out


def run_plans(args) -> dict:
    import torch

    decoder = build_decoder(args.decoder, args.seed)
    g = decoder.geometry
    c = decoder.latent_channels
    rows = []
    for label in args.shapes.split(","):
        fhw = SHAPES[label]
        rng = np.random.default_rng(args.seed)
        latent = torch.from_numpy(smooth_latent(rng, (c, *fhw)))
        t0 = time.perf_counter()
        # kept clamped in float16 (error < 2.5e-4, a PSNR floor near 72 dB) to leave memory for decodes
        reference = decode_plan(decoder, latent, plan_shot("x", (c, *fhw), g)).clamp(0, 1).half()
        release_memory()
        print(f"{label}: latent {fhw}, untiled decode {time.perf_counter() - t0:.1f} s", flush=True)
        grids = compared_plans(fhw, args.cost_model)
        done: dict[TileGrid, dict] = {}
        for name, grid in grids.items():
            plan = plan_shot("x", (c, *fhw), g, grid, chunk=ChunkSize())
            if grid not in done:
                t0 = time.perf_counter()
                tiled = decode_plan(decoder, latent, plan)
                done[grid] = {**compare(tiled, reference, seam_mask(plan, g)),
                              "seconds": time.perf_counter() - t0}  # fmt: skip
                del tiled
                release_memory()
            row = {"shape": label, "plan": name, "tiles": list(grid.tiles), "overlap": list(grid.overlap),
                   "redundancy": plan.redundancy, **done[grid]}  # fmt: skip
            rows.append(row)
            print(
                f"  {name:<22} tiles {grid.tiles} overlap {grid.overlap}: redundancy {plan.redundancy:.2f}, "
                f"PSNR {fmt_db(row['psnr_db'])} dB, "
                f"seam PSNR {fmt_db(row.get('seam_psnr_db', math.inf))} dB, "
                f"max error {row['max_err_levels']:.1f}/255",
                flush=True,
            )
    what = "full-size shots: tiled decode vs untiled, per plan"
    return measurement(what, args, rows, cost_model=args.cost_model)


def plans_markdown(result: dict) -> str:
    lines = [
        f"Decoder `{result['decoder']}`, {result['weights']} weights, float32, {result['machine']}; "
        f"auto grids chosen with cost model `{result['cost_model']}`.",
        "",
        "| shot | plan | tiles F,H,W | overlap F,H,W | redundancy | PSNR dB | seam-band PSNR dB "
        "| max error /255 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['shape']} | {r['plan']} | {','.join(map(str, r['tiles']))} | "
            f"{','.join(map(str, r['overlap']))} | {r['redundancy']:.2f} | {fmt_db(r['psnr_db'])} | "
            f"{fmt_db(r.get('seam_psnr_db', math.inf))} | {r['max_err_levels']:.1f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("overlaps", help="two tiles along each axis, overlap swept")
    p.add_argument("--decoder", default="ltx2-tiny")
    p.add_argument("--axes", default="frames,height,width")
    p.add_argument("--overlaps", default="0,1,2,3,4,5,6")
    p.add_argument("--long", type=int, default=16, help="latent units along the split axis")
    p.add_argument("--short", type=int, default=6, help="latent units along the other spatial axes")
    p.add_argument("--frames-short", type=int, default=5, help="latent frames when frames are not split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("edges", help="difference per latent unit from a tile's edge (frames, width)")
    p.add_argument("--decoder", default="ltx2-tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("plans", help="full-size shots: shipped grids and auto vs untiled")
    p.add_argument("--decoder", default="ltx2-tiny")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--cost-model", default="ltx2-h200")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("context", help="latent frames of context / lookahead a temporal tile needs")
    p.add_argument("--decoders", default="ltx2-tiny,ltxv-tiny,wan-tiny,hunyuanvideo-tiny")
    p.add_argument("--frames", type=int, default=48, help="latent frames (the seam is in the middle)")
    p.add_argument("--size", type=int, default=2, help="latent rows and columns")
    p.add_argument(
        "--threshold",
        type=float,
        default=0.01,
        help="largest error counted as exact (uint8 levels; 0.01: float rounding only)",
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("spatial", help="every family: spatial overlap swept, the least meeting a seam PSNR")
    p.add_argument("--decoders", default=",".join(FIDELITY_CLIPS))
    p.add_argument("--overlaps", default="0,1,2,3,4,5,6")
    p.add_argument("--target", type=float, default=SEAM_TARGET_DB, help="seam-band PSNR to meet, dB")
    p.add_argument("--frames", type=int, default=3, help="latent frames")
    p.add_argument("--long", type=int, default=16, help="latent units along the split axis")
    p.add_argument("--short", type=int, default=8, help="latent units along the other spatial axis")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("groupnorm", help="GroupNorm statistics shared across tiles vs blending")
    p.add_argument("--decoders", default="hunyuanvideo-tiny")
    p.add_argument("--overlaps", default="0,2,4,6")
    p.add_argument("--frames", type=int, default=3, help="latent frames")
    p.add_argument("--long", type=int, default=16, help="latent columns (split in two)")
    p.add_argument("--short", type=int, default=8, help="latent rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    p = sub.add_parser("fidelity", help="every family: farm vs diffusers tiling vs untiled")
    p.add_argument("--decoders", default=",".join(FIDELITY_CLIPS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    run, markdown = {
        "overlaps": (run_overlaps, overlaps_markdown),
        "edges": (run_edges, edges_markdown),
        "plans": (run_plans, plans_markdown),
        "context": (run_context, context_markdown),
        "fidelity": (run_fidelity, fidelity_markdown),
        "spatial": (run_spatial, spatial_markdown),
        "groupnorm": (run_groupnorm, groupnorm_markdown),
    }[args.mode]
    result = run(args)
    md = markdown(result)
    print()
    print(md)
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=1) + "\n")
    if args.out_md:
        Path(args.out_md).write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
