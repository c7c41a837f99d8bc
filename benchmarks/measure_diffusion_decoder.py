"""The LTX-2.5 diffusion decoder (`ltx2-diffusion`) tiled: receptive field, seams, and fidelity.

Every decode runs in this process as a farm worker runs it (`measure_seams.decode_plan`: each tile decoded
on its own with its noise drawn by pixel position, weighted by its blend ramps, summed in tile order).

* context: latent frames a temporal tile must decode before (after) its own so its kept frames match the
  whole decode (neighbourhood attention looks both ways in time);
* fidelity: farm's splits (spatial 2x2 at overlaps 1 and 2, temporal 2 tiles with that context) against
  the untiled decode (PSNR of uint8 frames, whole clip and worst frame), beside diffusers' own
  ``enable_tiling`` at the same grid against diffusers' untiled decode with the same generator (its
  single-step tiles each draw their own noise).

RANDOM weights (seeded): seams measured on them are worse than a trained decoder's.

    python benchmarks/measure_diffusion_decoder.py --out-json diffusion-tiny.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure_seams import (  # noqa: E402
    any_decoder,
    decode_plan,
    fmt_db,
    frame_psnrs,
    levels,
    machine,
    psnr,
    warmup_errors,
)

from farm.inputs.synthetic import smooth_latent  # noqa: E402
from farm.planning.tiling import TileGrid, plan_shot  # noqa: E402


def compare(out, ref, seam: int = 0) -> tuple[float, float]:
    a = levels(out)
    return psnr(float(((a - ref) ** 2).mean()) / 255**2), min(frame_psnrs(a, ref)[seam:])


def diffusers_tiling(model, z, overlap: int, seed: int):
    """diffusers' own decode of `z`, untiled and with ``enable_tiling`` at a 2x2 grid of `overlap` latent
    units (same generator seed), as [3, F, H, W] in [0, 1]."""
    import torch

    _, h, w = z.shape[1:]
    th, tw = -(-h // 2), -(-w // 2)
    with torch.inference_mode():
        model.disable_tiling()
        whole = model.decode(z[None], generator=torch.Generator().manual_seed(seed), return_dict=False)[0]
        model.enable_tiling(
            tile_sample_min_height=(th + overlap) * 32, tile_sample_stride_height=th * 32,
            tile_sample_min_width=(tw + overlap) * 32, tile_sample_stride_width=tw * 32,
        )  # fmt: skip
        tiled = model.decode(z[None], generator=torch.Generator().manual_seed(seed), return_dict=False)[0]
        model.disable_tiling()
    return (whole[0].float() + 1) / 2, (tiled[0].float() + 1) / 2


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoder", default="ltx2-diffusion-tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latent", default="5,4,6", help="latent frames, rows, columns of the fidelity clip")
    p.add_argument("--context-frames", type=int, default=8)
    p.add_argument("--out-json")
    args = p.parse_args()
    torch.set_num_threads(1)
    decoder = any_decoder(args.decoder, args.seed)  # tiles without context: measured here
    rng = np.random.default_rng(args.seed)

    # context and lookahead: a tile starting (ending) at the middle latent frame, against the whole decode
    z = torch.from_numpy(smooth_latent(rng, (decoder.latent_channels, args.context_frames, 3, 3)))
    seam = args.context_frames // 2
    found = {}
    for before in (True, False):
        errors = warmup_errors(decoder, z, seam, before=before, stop_below=0.5)
        what = "context" if before else "lookahead"
        for k, worst, _ in errors:
            print(f"{what} {k}: max {worst:.3g} levels", flush=True)
        found[what] = next((k for k, worst, _ in errors if worst < 0.5), None)

    # fidelity
    fhw = tuple(int(x) for x in args.latent.split(","))
    z = torch.from_numpy(smooth_latent(rng, (decoder.latent_channels, *fhw)))
    plain = decoder.geometry
    warm = type(decoder).geometry_for(decoder.spec.config)
    started = time.perf_counter()
    ref = levels(decode_plan(decoder, z, plan_shot("x", z.shape, plain)))
    untiled_s = time.perf_counter() - started
    rows = []
    for overlap in (1, 2):
        plan = plan_shot("x", z.shape, plain, TileGrid((1, 2, 2), (0, overlap, overlap)))
        whole, worst = compare(decode_plan(decoder, z, plan), ref)
        rows.append({"split": f"spatial 2x2 overlap {overlap}", "method": "farm", "psnr_db": whole,
                     "worst_db": worst, "redundancy": plan.redundancy})  # fmt: skip
        d_whole, d_tiled = diffusers_tiling(decoder.model, z, overlap, args.seed)
        dw, dworst = compare(d_tiled, levels(d_whole))
        rows.append({"split": f"spatial 2x2 overlap {overlap}", "method": "diffusers enable_tiling",
                     "psnr_db": dw, "worst_db": dworst, "redundancy": None})  # fmt: skip
    for label, g in (("farm, no context", plain), ("farm", warm)):
        decoder.geometry = g
        plan = plan_shot("x", z.shape, g, TileGrid((2, 1, 1), (1, 0, 0)))
        seam_frame = plan.tiles[-1].pixels[0].start
        whole, worst = compare(decode_plan(decoder, z, plan), ref, seam_frame)
        rows.append({"split": "temporal 2 tiles", "method": label, "psnr_db": whole, "worst_db": worst,
                     "redundancy": plan.redundancy})  # fmt: skip
    decoder.geometry = plain
    for r in rows:
        red = "" if r["redundancy"] is None else f"{r['redundancy']:.2f}"
        print(f"| {r['split']} | {r['method']} | {red} | {fmt_db(r['psnr_db'])} | {fmt_db(r['worst_db'])} |")
    result = {"decoder": args.decoder, "weights": f"RANDOM (seed {args.seed})", "machine": machine(),
              "latent": list(fhw), "untiled_s": untiled_s, **found, "rows": rows}  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
