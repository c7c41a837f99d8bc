"""How much halo and temporal context a tile needs to equal the untiled decode, per decoder config.

A tile of a plan decodes a halo of latent rows and columns beyond its own block (and context frames
before and after its own), then discards them (`farm.planning.tiling`). This measures, for a named
config with RANDOM weights (seeded), a shot decoded as farm's workers decode it (`decode_block` per tile,
`drop_context`, the tile's blend weights, summed in tile order) against the same shot decoded whole:

* ``halo``: a spatial grid (default 1x2x2, no overlap: no blending hides anything), halo swept;
* ``context``: two temporal tiles (no spatial split), the same amount of context before and after swept.

Per row: PSNR over the whole clip, over the band 16 pixels (spatial) or 8 frames (temporal) either side
of each seam, and the worst pixel, all on uint8 levels as a render writes them. The floor is the
dtype's noise: bfloat16 (and float16) ≥ 50 dB over the band with no pixel more than 8 levels off,
float32 ≥ 70 dB over the band; where the dtype's own noise (its whole decode against float32's,
`--dtype-noise`) is already below 50 dB, within 0.5 dB of that. The least value reaching it is what
the adapters record (``spatial_halo`` / ``measured_context``); `--stop` ends a sweep at the first
value that does.

``--whole-frame``: the tiles decode from the decoder's part that sees the whole frame, run once per
temporal range over the whole frame (`DiffusersVideoDecoder.whole_frame`, Wan's and HunyuanVideo's mid
block), as a render of a decoder with `shares_whole_frame` does.

Random weights make activations larger and seams wider than a trained decoder's: upper bounds.

The whole decode is farm's own decoder (`load_random`) run on the whole latent, so it runs what a worker's
model runs; for HunyuanVideo that includes the middle block's masked attention in blocks of query rows
(`farm.decoders.hunyuanvideo.chunked_attention`): diffusers' single SDPA call over a 16x60x104 latent
passes 2^32 mask elements, where torch's efficient kernel is wrong (pytorch/pytorch#187227) and returned
NaN on an H200, leaving nothing to measure against.

Usage (from the repository root):

    python benchmarks/measure_halo.py halo --decoder ltx2-tiny --shape 3,24,24 --halos 2,3,4,5,6,7,8 --stop
    python benchmarks/measure_halo.py halo --decoder ltx2 --dtype bfloat16 --device cuda --shape 16,34,60 \\
        --halos 0,2,4,6,8,10,12 --out-json halo-ltx2.json
    python benchmarks/measure_halo.py context --decoder ltx2 --dtype bfloat16 --device cuda \\
        --shape 31,22,38 --contexts 6,8,9,10,12,14
    python benchmarks/measure_halo.py halo --decoder wan-tiny --shape 3,24,24 --halos 4,6,8,10 --whole-frame
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from farm.inputs.synthetic import smooth_latent, synth_spec  # noqa: E402
from farm.planning.tiling import ShotPlan, TileGrid, plan_shot  # noqa: E402

FLOOR = {"bfloat16": (50.0, 8.0), "float16": (50.0, 8.0), "float32": (70.0, math.inf)}
BAND_PIXELS = 16  # each side of a spatial seam
BAND_FRAMES = 8  # each side of a temporal seam


def load_random(name: str, seed: int, dtype: str, device: str):
    """The named config's decoder with RANDOM weights, as a worker loads it."""
    from farm.decoders import decoder_class

    spec = synth_spec(name, seed=seed, dtype=dtype)
    return decoder_class(spec).load(spec, device)


def decode_plan(decoder, latent, plan: ShotPlan, whole_frame: bool = False):
    """The frames a render writes for `plan` (float32 [3, F, H, W], before clamping), decoded here.

    `whole_frame`: the decoder's whole-frame part run once over each temporal range the tiles decode
    (`DiffusersVideoDecoder.whole_frame`), each tile decoding the rest from its block of it."""
    import torch

    from farm.worker.tasks import decode_block, drop_context

    full = None
    shared: dict[tuple[int, int], torch.Tensor] = {}
    for tile in plan.tiles:
        frames, rows, cols = tile.decode_slices()
        if whole_frame:
            span = (frames.start, frames.stop)
            if span not in shared:
                shared[span] = decoder.whole_frame(latent[:, frames])
            block = shared[span][:, :, rows, cols]
            pixels = decoder.decode_shared(block, origin=tile.decode_origin()).float()
        else:
            block = latent[(slice(None), *tile.decode_slices())]
            pixels = decode_block(decoder, block, plan.chunk, origin=tile.decode_origin()).float()
        pixels = drop_context(pixels, tile, decoder.geometry)
        wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32, device=pixels.device) for s in tile.pixels)
        pixels = pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
        if full is None:
            full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32, device=pixels.device)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
        full[:, f0:f1, h0:h1, w0:w1] += pixels
        del pixels
    return full


def seam_band(plan: ShotPlan, device):
    """Boolean [F, H, W]: within the band of a seam between two tiles (any axis)."""
    import torch

    masks = []
    for axis, reach in enumerate((BAND_FRAMES, BAND_PIXELS, BAND_PIXELS)):
        extent = plan.pixel_shape[axis]
        m = torch.zeros(extent, dtype=torch.bool, device=device)
        for tile in plan.tiles:
            for edge in (tile.pixels[axis].start, tile.pixels[axis].stop):
                if 0 < edge < extent:
                    m[max(0, edge - reach) : edge + reach] = True
        masks.append(m)
    f, h, w = masks
    return f.view(-1, 1, 1) | h.view(1, -1, 1) | w.view(1, 1, -1)


def compare(tiled, whole, band) -> dict:
    """PSNR over the clip and over the band, worst pixel, on uint8 levels, a few frames at a time."""
    total = in_band = 0.0
    n_band = 0
    worst = 0.0
    for f0 in range(0, tiled.shape[1], 8):
        sl = slice(f0, f0 + 8)
        diff = (tiled[:, sl].clamp(0, 1) * 255).round().double() - (
            whole[:, sl].clamp(0, 1) * 255
        ).round().double()
        sq = diff**2
        total += float(sq.sum())
        worst = max(worst, float(diff.abs().max()))
        m = band[sl]
        in_band += float(sq[:, m].sum())
        n_band += int(m.sum()) * diff.shape[0]
    return {
        "psnr_db": psnr(total / tiled.numel()),
        "band_psnr_db": psnr(in_band / n_band) if n_band else math.inf,
        "worst_levels": worst,
    }


def psnr(mse_levels: float) -> float:
    return math.inf if mse_levels == 0 else 10 * math.log10(255.0**2 / mse_levels)


def reaches_floor(row: dict, dtype: str, noise_db: float | None = None) -> bool:
    """The floor, or where the dtype's own noise (`--dtype-noise`) is below it, within 0.5 dB of that."""
    band, worst = FLOOR[dtype]
    if noise_db is not None:
        band = min(band, noise_db - 0.5)
    return row["band_psnr_db"] >= band and row["worst_levels"] <= worst


def float32_reference(name: str, seed: int, device: str, latent):
    """The named config's whole decode of `latent` in float32 (TF32 off: float32 means float32), the
    reference that a lower dtype's decodes, whole or tiled, are measured from."""
    import torch

    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        exact = load_random(name, seed, "float32", device)
        reference = exact.decode(latent, origin=(0, 0, 0)).float()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    del exact
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return reference


def dtype_noise(whole, reference, dtype: str) -> dict:
    """The whole decode against the float32 reference over the clip (the dtype's own noise), said."""
    import torch

    noise = compare(whole, reference, torch.zeros(whole.shape[1:], dtype=torch.bool, device=whole.device))
    print(f"  {dtype} whole vs float32 whole: PSNR {noise['psnr_db']:.1f} dB, worst "
          f"{noise['worst_levels']:.0f} levels (the dtype's own noise)", flush=True)  # fmt: skip
    return noise


def against_float32(tiled, whole, reference, band) -> dict:
    """How far the tiled and the whole decode each are from the float32 reference, over the clip and the
    seam band: tiles that add nothing to the dtype's own noise are as close to it as the whole decode
    (`as_close`: the tiled band within 0.5 dB of the whole's)."""
    t, w = compare(tiled, reference, band), compare(whole, reference, band)
    return {"tiled": t, "whole": w, "as_close": t["band_psnr_db"] >= w["band_psnr_db"] - 0.5}


def float32_words(f32: dict | None) -> str:
    if f32 is None:
        return ""
    t, w = f32["tiled"], f32["whole"]
    return (f"; from float32: tiled {t['psnr_db']:.1f} / band {t['band_psnr_db']:.1f} dB (worst "
            f"{t['worst_levels']:.0f}), whole {w['psnr_db']:.1f} / {w['band_psnr_db']:.1f} dB (worst "
            f"{w['worst_levels']:.0f}){' as close' if f32['as_close'] else ''}")  # fmt: skip


def sweep(args, values: list[int], grid: TileGrid, geometry_for) -> list[dict]:
    import torch

    decoder = load_random(args.decoder, args.seed, args.dtype, args.device)
    base = decoder.geometry
    c = decoder.latent_channels
    rng = np.random.default_rng(args.seed + 1)
    shape = (c, *args.shape)
    latent = smooth_latent(rng, shape) if args.latent == "smooth" else rng.standard_normal(shape)
    latent = torch.as_tensor(latent, dtype=torch.float32).to(args.device)
    started = time.perf_counter()
    whole = decoder.decode(latent, origin=(0, 0, 0)).float()
    print(f"{args.decoder} {args.dtype} latent {tuple(latent.shape)} -> {tuple(whole.shape)}: whole decode "
          f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
    rows = []
    noise_db = None
    reference = None
    if args.dtype != "float32" and args.dtype_noise:  # the dtype's own noise: its whole decode vs float32's
        reference = float32_reference(args.decoder, args.seed, args.device, latent)
        noise = dtype_noise(whole, reference, args.dtype)
        rows.append({"value": "whole vs float32", **noise, "floor": None})
        noise_db = noise["psnr_db"]
    for value in values:
        decoder.geometry = geometry_for(base, value)
        plan = plan_shot("probe", latent.shape, decoder.geometry, grid)
        started = time.perf_counter()
        tiled = decode_plan(decoder, latent, plan, args.whole_frame)
        band = seam_band(plan, tiled.device)
        row = {"value": value, **compare(tiled, whole, band),
               "redundancy": round(plan.redundancy, 3),
               "seconds": round(time.perf_counter() - started, 2)}  # fmt: skip
        row["floor"] = reaches_floor(row, args.dtype, noise_db)
        if reference is not None:
            row["float32"] = against_float32(tiled, whole, reference, band)
        rows.append(row)
        words = float32_words(row.get("float32"))
        print(f"  {args.mode} {value:>3}: PSNR {row['psnr_db']:.1f} dB, band {row['band_psnr_db']:.1f} dB, "
              f"worst {row['worst_levels']:.0f} levels, redundancy {row['redundancy']}, "
              f"{'floor' if row['floor'] else '-'}{words}", flush=True)  # fmt: skip
        del tiled
        if args.stop and row["floor"]:
            break
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("halo", "context"))
    parser.add_argument("--decoder", required=True, help="a named config (ltx2, wan-tiny, ...)")
    parser.add_argument("--dtype", default="float32", choices=sorted(FLOOR))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", required=True, help="latent F,H,W")
    parser.add_argument("--grid", default=None, help="tile counts F,H,W (halo: 1,2,2; context: 2,1,1)")
    parser.add_argument("--halos", default="0,1,2,3,4,6,8", help="halo values to sweep (halo mode)")
    parser.add_argument(
        "--contexts", default="0,2,4,6,8,10,12", help="context values to sweep (context mode)"
    )
    parser.add_argument(
        "--halo", type=int, default=None, help="context mode: the spatial halo (default: none)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--latent",
        default="noise",
        choices=("noise", "smooth"),
        help="latent values: white noise (the harder case, default) or farm synth's smooth ones",
    )
    parser.add_argument("--whole-frame", action="store_true",
                        help="tiles decode from the decoder's whole-frame pass (Wan, HunyuanVideo), run "
                        "once per temporal range over the whole frame")
    parser.add_argument("--stop", action="store_true", help="stop at the first value reaching the floor")
    parser.add_argument("--dtype-noise", action="store_true",
                        help="also compare the whole decode with a float32 one: the dtype's own noise")
    parser.add_argument("--out-json", default=None)
    args = parser.parse_args(argv)
    args.shape = tuple(int(x) for x in args.shape.split(","))
    if args.mode == "halo":
        grid = TileGrid(tuple(int(x) for x in (args.grid or "1,2,2").split(",")), (0, 0, 0))  # type: ignore[arg-type]
        values = [int(x) for x in args.halos.split(",")]

        def geometry_for(base, m):
            return replace(base, halo=m)
    else:
        grid = TileGrid(tuple(int(x) for x in (args.grid or "2,1,1").split(",")), (0, 0, 0))  # type: ignore[arg-type]
        values = [int(x) for x in args.contexts.split(",")]
        halo = args.halo

        def geometry_for(base, m):
            return replace(base, context=m, lookahead=m, halo=base.halo if halo is None else halo)

    import torch

    torch.manual_seed(args.seed)
    # float32 means float32: cuDNN's default TF32 convolutions would put the floor near 65 dB on a GPU
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.dtype != "float32"
    rows = sweep(args, values, grid, geometry_for)
    least = next((r["value"] for r in rows if r["floor"]), None)  # the dtype-noise row's floor is None
    print(f"{args.decoder} {args.dtype}: least {args.mode} reaching the floor: {least}", flush=True)
    if args.out_json:
        device = (
            torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
        )
        result = {"mode": args.mode, "decoder": args.decoder, "dtype": args.dtype, "shape": list(args.shape),
                  "grid": list(grid.tiles), "whole_frame": args.whole_frame,
                  "weights": f"RANDOM (seed {args.seed})", "device": device,
                  "torch": torch.__version__, "date": str(date.today()), "least": least,
                  "rows": rows}  # fmt: skip
        Path(args.out_json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
