"""HunyuanVideo's tiles with the whole shot's GroupNorm statistics, reduced round by round, against untiled.

A plan's tiles (spatial and temporal, each with its halo and context) decode HunyuanVideo as
`farm.decoders.hunyuanvideo.groupnorm_rounds` does: the middle block once over the whole shot, then one
round per GroupNorm of the up blocks and head, every tile summing its own region (float64), one
reduction giving the shot's statistics, every tile continuing from its carried activation. Compared with
the same shot decoded whole as farm decodes it untiled (the same rounds over one block, convolutions on the
shot's lattice: `HunyuanVideoDecoder.run_decoder`) and, for reference, with the tiles decoding from the
shared middle block alone (their up blocks' GroupNorms over the tile). `--against-diffusers` adds
diffusers' own ``vae.decode`` (framewise decoding off), its middle-block attention with the causal mask in
blocks of query rows (`farm.decoders.hunyuanvideo.chunked_attention`, exact): diffusers' one SDPA call over
the whole shot passes 2^32 mask elements at 16x60x104, where torch's efficient kernel is wrong
(pytorch/pytorch#187227; NaN on an H200).

Per row: PSNR over the clip and over the seam band (16 pixels / 8 frames either side), worst pixel (uint8
levels), the work (latent decoded over the shot's), the rounds, the largest activation a tile carries
between rounds, and on a GPU the peak memory of one tile's round.

Usage (from the repository root; RANDOM weights):

    python benchmarks/measure_groupnorm_rounds.py --decoder hunyuanvideo-tiny --shape 3,24,24 --halos 4,6,8
    python benchmarks/measure_groupnorm_rounds.py --decoder hunyuanvideo-tiny --shape 20,16,16 --grid 2,1,1 \\
        --halos 0 --contexts 2,4,8
    python benchmarks/measure_groupnorm_rounds.py --decoder hunyuanvideo --dtype bfloat16 --device cuda \\
        --shape 16,60,104 --halos 8,12
    python benchmarks/measure_groupnorm_rounds.py --decoder hunyuanvideo --dtype bfloat16 --device cuda \\
        --shape 5,60,104 --halos 8,12 --one-tile
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from measure_halo import (  # noqa: E402
    FLOOR,
    against_float32,
    compare,
    dtype_noise,
    float32_reference,
    float32_words,
    load_random,
    reaches_floor,
    seam_band,
)

from farm.decoders.hunyuanvideo import groupnorm_rounds as rounds  # noqa: E402
from farm.decoders.hunyuanvideo.whole_frame import rest_of_decoder, whole_frame_part  # noqa: E402
from farm.planning.tiling import ShotPlan, Tile, TileGrid, own_blocks, plan_shot  # noqa: E402


def place(full, decoder, tile: Tile, out) -> None:
    """The tile's own pixels of its decoded block, weighed and summed into `full` as a render blends."""
    import torch

    from farm.worker.tasks import drop_context

    pixels = drop_context(decoder.unit_pixels(out[0]), tile, decoder.geometry)
    wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32, device=pixels.device) for s in tile.pixels)
    pixels = pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
    (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
    full[:, f0:f1, h0:h1, w0:w1] += pixels


def decode_in_rounds(decoder, mid, plan: ShotPlan, cuda: bool) -> tuple[object, dict]:
    """The plan's tiles decoded from the shared middle block `mid` with the shot's GroupNorm statistics,
    one round per GroupNorm; the frames and the cost."""
    import torch

    model = decoder.model
    tiles = list(plan.tiles)
    blocks = [(slice(None), slice(None), *t.decode_slices()) for t in tiles]
    carried = [rounds.start(mid[b], own, t.decode_origin()[1:])
               for b, own, t in zip(blocks, own_blocks(plan), tiles, strict=True)]  # fmt: skip
    n_rounds = len(rounds.sites(model))
    carried_bytes = peak = 0
    with torch.inference_mode():
        for _ in range(n_rounds):
            partials = [rounds.partial_sums(model, c) for c in carried]  # type: ignore[arg-type]
            stats = rounds.combine(partials)
            moved = []
            for c in carried:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                assert isinstance(c, rounds.Carried)
                moved.append(rounds.advance(model, c, stats))
                if cuda:
                    peak = max(peak, torch.cuda.max_memory_allocated() - base)
            carried = moved
            for c in carried:
                if isinstance(c, rounds.Carried):
                    held = c.x.numel() * c.x.element_size()
                    if c.residual is not None and c.residual.data_ptr() != c.x.data_ptr():
                        held += c.residual.numel() * c.residual.element_size()
                    carried_bytes = max(carried_bytes, held)
    full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32, device=mid.device)
    for tile, out in zip(tiles, carried, strict=True):
        place(full, decoder, tile, out)
    return full, {"rounds": n_rounds, "carried_mib": round(carried_bytes / 2**20, 2),
                  "round_peak_mib": round(peak / 2**20, 1) if cuda else None}  # fmt: skip


def decode_mid_only(decoder, mid, plan: ShotPlan):
    """The plan's tiles decoded from the shared middle block, each up block's GroupNorm over its tile."""
    import torch

    full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32, device=mid.device)
    with torch.inference_mode():
        for tile in plan.tiles:
            out = rest_of_decoder(decoder.model, mid[(slice(None), slice(None), *tile.decode_slices())])
            place(full, decoder, tile, out)
    return full


def decode_as_diffusers(decoder, latent, whole, reference, cuda: bool) -> dict:
    """The shot through diffusers' own ``vae.decode`` (framewise decoding off; the middle block's masked
    attention in blocks of rows): its seconds and peak, and farm's untiled decode `whole` measured from it
    (and both from the float32 `reference`, if given)."""
    import torch

    clip = torch.zeros(whole.shape[1:], dtype=torch.bool, device=whole.device)
    with torch.inference_mode():
        z = decoder.decoder_input(latent)
        for _ in range(2):  # the second call timed: kernels loaded, cuDNN's choices made
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            theirs = decoder.unit_pixels(decoder.model.decode(z, return_dict=False)[0][0]).float()
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    row = {"seconds": round(seconds, 2), "peak_mib": peak,
           "farm_from_diffusers": compare(whole, theirs, clip)}  # fmt: skip
    if reference is not None:
        row["diffusers_from_float32"] = compare(theirs, reference, clip)
        row["farm_from_float32"] = compare(whole, reference, clip)
    print(f"  diffusers' vae.decode: {row['seconds']} s" + (f", peak {peak:.0f} MiB" if cuda else "")
          + f"; farm's untiled decode from it {row['farm_from_diffusers']}"
          + (f"; from float32: diffusers {row['diffusers_from_float32']}, farm {row['farm_from_float32']}"
             if reference is not None else ""), flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--decoder", default="hunyuanvideo-tiny", help="a HunyuanVideo named config")
    parser.add_argument("--dtype", default="float32", choices=sorted(FLOOR))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", required=True, help="latent F,H,W")
    parser.add_argument("--grid", default="1,2,2", help="tile counts F,H,W")
    parser.add_argument("--halos", default="6", help="spatial halos to sweep")
    parser.add_argument("--contexts", default=None, help="temporal contexts to sweep (default: the config's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype-noise", action="store_true",
                        help="also decode the shot whole in float32: the dtype's own noise, and each "
                        "row's tiles and whole decode measured from it")
    parser.add_argument("--one-tile", action="store_true",
                        help="also run the rounds over the whole shot as one tile (the tiles' arithmetic of "
                        "the statistics, no cut) and measure each row's tiles from it")
    parser.add_argument("--against-diffusers", action="store_true",
                        help="also decode the shot with diffusers' own forward (``vae.decode``, its "
                        "GroupNorms as torch computes them, convolutions as cuDNN picks): its time and peak, "
                        "and how far farm's untiled decode is from it (from float32: --dtype-noise)")
    parser.add_argument("--out-json", default=None)
    args = parser.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    grid = TileGrid(tuple(int(x) for x in args.grid.split(",")), (0, 0, 0))  # type: ignore[arg-type]

    import torch

    torch.manual_seed(args.seed)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.dtype != "float32"
    cuda = args.device.startswith("cuda")
    decoder = load_random(args.decoder, args.seed, args.dtype, args.device)
    base = decoder.geometry
    rng = np.random.default_rng(args.seed + 1)
    latent = torch.as_tensor(rng.standard_normal((decoder.latent_channels, *shape)), dtype=torch.float32)
    latent = latent.to(args.device)
    for _ in range(2):  # the second call timed: kernels loaded, cuDNN's choices made
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        whole = decoder.decode(latent, origin=(0, 0, 0)).float()
        if cuda:
            torch.cuda.synchronize()
        whole_s = time.perf_counter() - started
    whole_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    print(f"{args.decoder} {args.dtype} latent {tuple(latent.shape)} -> {tuple(whole.shape)}: whole decode "
          f"{whole_s:.1f} s" + (f", peak {whole_peak:.0f} MiB" if cuda else ""), flush=True)  # fmt: skip
    reference = None
    if args.dtype_noise and args.dtype != "float32":  # the dtype's own noise, and the tiles' beside it
        reference = float32_reference(args.decoder, args.seed, args.device, latent)
        dtype_noise(whole, reference, args.dtype)
    diffusers_row = None
    if args.against_diffusers:
        diffusers_row = decode_as_diffusers(decoder, latent, whole, reference, cuda)
    with torch.inference_mode():
        mid = whole_frame_part(decoder.model, decoder.decoder_input(latent))
    one_tile = None
    if args.one_tile:
        one_plan = plan_shot("probe", latent.shape, replace(base, halo=0), TileGrid((1, 1, 1), (0, 0, 0)))
        one_tile = decode_in_rounds(decoder, mid, one_plan, cuda)[0]
        band = seam_band(plan_shot("probe", latent.shape, base, grid), whole.device)
        print(f"  the rounds over one tile, from the whole decode: {compare(one_tile, whole, band)}",
              flush=True)  # fmt: skip
    rows = []
    contexts = [None] if args.contexts is None else [int(x) for x in args.contexts.split(",")]
    for halo in (int(x) for x in args.halos.split(",")):
        for context in contexts:
            geometry = replace(base, halo=halo, context=base.context if context is None else context)
            decoder.geometry = geometry
            plan = plan_shot("probe", latent.shape, geometry, grid)
            band = seam_band(plan, whole.device)
            started = time.perf_counter()
            tiled, cost = decode_in_rounds(decoder, mid, plan, cuda)
            seconds = time.perf_counter() - started
            row = {"halo": halo, "context": geometry.context, **compare(tiled, whole, band),
                   "redundancy": round(plan.redundancy, 3), **cost, "seconds": round(seconds, 2)}  # fmt: skip
            row["floor"] = reaches_floor(row, args.dtype)
            if reference is not None:
                row["float32"] = against_float32(tiled, whole, reference, band)
            if one_tile is not None:
                row["from_one_tile"] = compare(tiled, one_tile, band)
                print(f"  halo {halo}: from the rounds over one tile {row['from_one_tile']}", flush=True)
            del tiled
            mid_only = compare(decode_mid_only(decoder, mid, plan), whole, band)
            row["mid_block_only"] = mid_only
            rows.append(row)
            print(f"  halo {halo} context {geometry.context}: rounds {cost['rounds']}: PSNR "
                  f"{row['psnr_db']:.1f} dB, band {row['band_psnr_db']:.1f} dB, worst "
                  f"{row['worst_levels']:.0f} levels ({'floor' if row['floor'] else '-'}); mid block only: "
                  f"band {mid_only['band_psnr_db']:.1f} dB, worst {mid_only['worst_levels']:.0f}; work "
                  f"{row['redundancy']}x, carried "
                  f"{cost['carried_mib']} MiB per tile"
                  + (f", round peak {cost['round_peak_mib']} MiB" if cuda else "")
                  + f", {seconds:.1f} s" + float32_words(row.get("float32")), flush=True)  # fmt: skip
    if args.out_json:
        device = torch.cuda.get_device_name() if cuda else platform.processor() or "cpu"
        result = {"decoder": args.decoder, "dtype": args.dtype, "shape": list(shape),
                  "grid": list(grid.tiles), "weights": f"RANDOM (seed {args.seed})", "device": device,
                  "torch": torch.__version__, "date": str(date.today()), "whole_seconds": round(whole_s, 2),
                  "whole_peak_mib": whole_peak, "diffusers": diffusers_row, "rows": rows}  # fmt: skip
        Path(args.out_json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
