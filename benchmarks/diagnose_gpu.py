"""GPU diagnostics behind figures of the docs, each a subcommand printing JSON lines:

    fork     whether importing diffusers' model code and farm's decoders in a parent leaves CUDA usable in a
             forked child (farm's worker forkserver could then import them before forking GPU workers)
    peaks    a decoder's peak allocated and reserved device memory per decode call shape, beside the
             planner's model (`peak_bytes`), and the memory the process holds outside torch's allocator
             (CUDA context, kernels loaded on first use) before and after each call
    nonfinite  the first modules of a whole decode whose outputs are not finite (forward hooks)
    crop-bits  the share of a crop's outputs whose bits differ from the whole's where the crop holds an
             output's inputs whole, in bf16: a 3-D convolution (cuDNN default, deterministic, off), a
             linear layer over a slice of rows, and the fused neighbourhood attention of a crop off the
             query tiles' lattice, told its place (`grid_origin`) or not
    tile-bits  where a HunyuanVideo tile's bits part from the rounds over the whole shot as one tile: the
             top-left tile of a 1x2x2 grid with its halo, both given the whole's statistics, every module's
             output compared over the tile's interior (latent rows and columns further than `--reach` from
             its cut, so untouched by the cut through the up blocks' receptive field)
    lattice-cost  what computing an LTX decoder's convolutions on the shot's lattice
             (`farm.decoders.lattice_conv`) costs and gives: the whole shot and the left tile of its 1x1x2
             split with its halo, each decoded in one call, with cuDNN choosing per shape and then on the
             lattice: seconds of the second of two decodes, and the tile's own pixels against the whole's
             (PSNR over the tile, over the 32 pixels left of its cut, over the columns beyond the halo's
             reach; worst pixel in levels)

Usage (from the repository root, on a GPU):

    python benchmarks/diagnose_gpu.py fork
    python benchmarks/diagnose_gpu.py peaks --decoder ltx2-diffusion --shapes 16,34,23 16,34,31
    python benchmarks/diagnose_gpu.py nonfinite --decoder hunyuanvideo --shape 16,60,104
    python benchmarks/diagnose_gpu.py crop-bits
    python benchmarks/diagnose_gpu.py tile-bits --decoder hunyuanvideo --shape 5,60,104 --halo 16
    python benchmarks/diagnose_gpu.py lattice-cost --decoder ltx2.3 --shape 16,34,60 --halo 12
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fork_check() -> None:
    started = time.perf_counter()
    import torch

    t_torch = time.perf_counter() - started
    import diffusers.models.modeling_utils  # noqa: F401

    import farm.decoders  # noqa: F401
    import farm.decoders.diffusers_vae  # noqa: F401

    t_all = time.perf_counter() - started
    parent = {"torch_import_s": round(t_torch, 2), "imports_s": round(t_all, 2),
              "cuda_initialized_in_parent": torch.cuda.is_initialized()}  # fmt: skip
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            x = torch.ones(1024, 1024, device="cuda")
            result = {"child_ok": bool(torch.isfinite(x @ x).all().item())}
        except Exception as exc:  # noqa: BLE001
            result = {"child_ok": False, "child_error": repr(exc)[:300]}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = json.loads(os.read(read, 4096).decode() or "{}")
    print(json.dumps({"check": "fork", **parent, **child}), flush=True)


def load(name: str, dtype: str, device: str, init_on_device: bool = False):
    """The named config's decoder with RANDOM weights; `init_on_device`: initialised on `device` (seconds
    on a GPU, where the CPU's initialisation of a released config takes minutes)."""
    from farm.decoders import decoder_class
    from farm.inputs.synthetic import synth_spec

    spec = synth_spec(name, seed=0, dtype=dtype)
    cls = decoder_class(spec)
    if not init_on_device:
        return spec, cls, cls.load(spec, device)
    import torch

    torch.manual_seed(0)
    with torch.device(device):
        model = cls.model_class()(**spec.config).eval()
    cls._fix_compression_ratios(model, spec)
    decoder = cls.from_model(spec, model, device)
    torch.cuda.empty_cache()
    return spec, cls, decoder


def latent(spec, cls, fhw):
    import numpy as np
    import torch

    from farm.inputs.synthetic import smooth_latent

    channels = cls.latent_channels_for(spec.config)
    return torch.from_numpy(smooth_latent(np.random.default_rng(0), (channels, *fhw)))


def outside_gib() -> float:
    """The device's memory in use beyond what torch's allocator has reserved (`farm.worker.gpu_budget`)."""
    import torch

    from farm.worker.gpu_budget import outside_allocator_bytes

    free, total = torch.cuda.mem_get_info()
    return round(outside_allocator_bytes(total - free, torch.cuda.memory_reserved()) / 2**30, 3)


def peaks(name: str, dtype: str, shapes: list[tuple[int, int, int]], init_on_device: bool = False) -> None:
    import torch

    torch.empty(1, device="cuda")
    print(json.dumps({"check": "peaks", "outside_after_context_gib": outside_gib()}), flush=True)
    spec, cls, decoder = load(name, dtype, "cuda", init_on_device)
    print(json.dumps({"check": "peaks", "outside_after_load_gib": outside_gib()}), flush=True)
    geometry = cls.geometry_for_spec(spec)
    for fhw in shapes:
        z = latent(spec, cls, fhw)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        outside_before = outside_gib()
        started = time.perf_counter()
        pixels = decoder.decode(z, origin=(0, 0, 0))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        out = tuple(pixels.shape[1:])
        del pixels
        pix = geometry.pixel_shape(fhw)
        print(json.dumps({"check": "peaks", "decoder": name, "latent": fhw, "pixels": out,
                          "allocated_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          "reserved_peak_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
                          "before_gib": round(base / 2**30, 2), "outside_before_gib": outside_before,
                          "outside_after_gib": outside_gib(),
                          "predicted_gib": round(cls.peak_bytes(spec, pix) / 2**30, 2),
                          "seconds": round(seconds, 2)}), flush=True)  # fmt: skip


def nonfinite(name: str, dtype: str, fhw: tuple[int, int, int], limit: int) -> None:
    import torch

    spec, cls, decoder = load(name, dtype, "cuda")
    found: list[dict] = []
    names = {m: n for n, m in decoder.model.named_modules()}

    def hook(module, inputs, output):
        if len(found) >= limit:
            return
        out = output[0] if isinstance(output, tuple) else output
        sample = getattr(out, "sample", out)
        if not isinstance(sample, torch.Tensor) or sample.is_floating_point() is False:
            return
        if not bool(torch.isfinite(sample.sum(dtype=torch.float32))):
            ins = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
            found.append({"module": names.get(module, type(module).__name__), "type": type(module).__name__,
                          "out_shape": list(sample.shape), "out_numel": sample.numel(),
                          "inputs_finite": [bool(torch.isfinite(t.sum(dtype=torch.float32))) for t in ins],
                          "inputs_absmax": [float(t.abs().max()) for t in ins]})  # fmt: skip

    handles = [m.register_forward_hook(hook) for m in decoder.model.modules()]
    z = latent(spec, cls, fhw)
    started = time.perf_counter()
    pixels = decoder.decode(z)
    torch.cuda.synchronize()
    for h in handles:
        h.remove()
    print(json.dumps({"check": "nonfinite", "decoder": name, "latent": fhw, "dtype": dtype,
                      "output_finite": bool(torch.isfinite(pixels).all()),
                      "seconds": round(time.perf_counter() - started, 2),
                      "first": found}), flush=True)  # fmt: skip


def unequal(a, b) -> float:
    return float((a != b).float().mean())


def crop_bits() -> None:
    import torch

    from farm.decoders.ltx2_diffusion.device import na_triton as na

    bf16, gen = torch.bfloat16, torch.Generator(device="cuda").manual_seed(0)
    for cudnn in ("default", "deterministic", "off"):
        torch.backends.cudnn.enabled = cudnn != "off"
        torch.backends.cudnn.deterministic = cudnn == "deterministic"
        for channels, (f, h, w) in ((512, (5, 60, 104)), (256, (9, 120, 208)), (128, (17, 240, 416))):
            conv = torch.nn.Conv3d(channels, channels, 3).to("cuda", bf16)
            x = torch.randn(1, channels, f, h, w, device="cuda", dtype=bf16, generator=gen)
            with torch.inference_mode():
                whole, crop = conv(x), conv(x[..., : h // 2 + 2, : w // 2 + 2])
            share = unequal(whole[..., : h // 2, : w // 2], crop)
            print(json.dumps({"op": "conv3d", "cudnn": cudnn, "channels": channels, "shape": [f, h, w],
                              "unequal": share}), flush=True)  # fmt: skip
    torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic = True, False
    sizes = ((512, 1536, 400_000), (1024, 1024, 100_000), (2048, 512, 60_000), (128, 384, 2_000_000))
    for cin, cout, rows in sizes:
        linear = torch.nn.Linear(cin, cout).to("cuda", bf16)
        x = torch.randn(rows, cin, device="cuda", dtype=bf16, generator=gen)
        with torch.inference_mode():
            whole = linear(x)
            for a, b in ((0, rows // 2), (rows // 4, rows // 4 + rows // 3), (7, rows - 13)):
                print(json.dumps({"op": "linear", "in": cin, "out": cout, "rows": rows, "slice": [a, b],
                                  "unequal": unequal(whole[a:b], linear(x[a:b]))}), flush=True)  # fmt: skip
    q, k, v = (torch.randn(1, 5, 96, 160, 4, 64, device="cuda", dtype=bf16, generator=gen) for _ in range(3))
    kernel = (3, 3, 3)
    whole = na.neighborhood_attention(q, k, v, kernel)
    tile = na.query_tile((5, 96, 160), kernel, na.BLOCK_Q)
    r, c = 35, 67  # off the lattice of the query tiles
    i, j = -r % tile[1] + 2, -c % tile[2] + 2  # from the lattice's first whole tile, past the cut's windows
    qc, kc, vc = (x[:, :, r:, c:] for x in (q, k, v))
    for origin in ((0, 0), (r, c)):
        crop = na.neighborhood_attention(qc, kc, vc, kernel, grid_origin=origin)
        share = unequal(whole[:, :, r + i :, c + j :], crop[:, :, i:, j:])
        print(json.dumps({"op": "neighbourhood attention", "query_tile": tile, "crop_at": [r, c],
                          "grid_origin": origin, "unequal": share}), flush=True)  # fmt: skip


def tile_bits(
    name: str, dtype: str, fhw: tuple[int, int, int], halo: int, reach: int, device: str, lattice: bool
) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure_halo import load_random

    from farm.decoders.hunyuanvideo import groupnorm_rounds as rounds
    from farm.decoders.hunyuanvideo.whole_frame import whole_frame_part
    from farm.decoders.lattice_conv import uninstall

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = dtype != "float32"
    decoder = load_random(name, 0, dtype, device)
    model = decoder.model
    f, h, w = fhw
    gen = torch.Generator().manual_seed(1)
    latent = torch.randn(decoder.latent_channels, f, h, w, generator=gen).to(device)
    rows, cols = h // 2 + halo, w // 2 + halo  # the top-left tile's decoded block
    keep = (max(1, min(h // 2, rows - reach)), max(1, min(w // 2, cols - reach)))  # its interior, compared
    if not lattice:
        print(json.dumps({"convolutions taken off the lattice": uninstall(model)}), flush=True)
    names = {m: n for n, m in model.named_modules()}
    state = {"phase": "whole", "calls": {}}
    kept: dict[tuple[str, int], torch.Tensor] = {}

    def crop(x: torch.Tensor, block_hw: tuple[int, int]) -> torch.Tensor:
        sh, sw = x.shape[-2] // block_hw[0], x.shape[-1] // block_hw[1]
        return x[..., : keep[0] * sh, : keep[1] * sw]

    def report(what: str, whole: torch.Tensor, tile: torch.Tensor) -> None:
        differ = whole != tile
        rows_differing = differ.flatten(0, -3).any(0).any(-1).float()
        print(json.dumps({"where": what, "shape": list(tile.shape), "unequal": float(differ.float().mean()),
                          "max_abs": float((whole.float() - tile.float()).abs().max()),
                          "rows_differing": float(rows_differing.mean())}), flush=True)  # fmt: skip

    def hook(module, inputs, output) -> None:
        if not isinstance(output, torch.Tensor) or output.dim() != 5:
            return
        key = names.get(module, type(module).__name__)
        calls = state["calls"].setdefault(state["phase"], {})
        k = calls[key] = calls.get(key, -1) + 1
        if state["phase"] == "whole":
            kept[(key, k)] = crop(output, (h, w)).clone()
        else:
            report(f"{key}#{k}", kept.pop((key, k)), crop(output, (rows, cols)))

    with torch.inference_mode():
        mid = whole_frame_part(model, decoder.decoder_input(latent))
        for _ in range(2):  # the whole shot's rounds as one tile, timed (the second: warm)
            torch.cuda.synchronize() if device.startswith("cuda") else None
            started = time.perf_counter()
            pixels = rounds.decode_alone(model, mid)
            torch.cuda.synchronize() if device.startswith("cuda") else None
            print(json.dumps({"whole_rounds_seconds": round(time.perf_counter() - started, 3)}), flush=True)
        del pixels
        whole = rounds.start(mid, ((0, f), (0, h), (0, w)))
        tile = rounds.start(mid[..., :rows, :cols], ((0, f), (0, h // 2), (0, w // 2)))
        handles = [m.register_forward_hook(hook) for m in model.decoder.modules()]
        for site in rounds.sites(model):
            assert isinstance(whole, rounds.Carried) and isinstance(tile, rounds.Carried)
            report(f"input of {site}", crop(whole.x, (h, w)), crop(tile.x, (rows, cols)))
            stats = rounds.combine([rounds.partial_sums(model, whole)])
            state["phase"] = "whole"
            whole = rounds.advance(model, whole, stats)
            state["phase"] = "tile"
            tile = rounds.advance(model, tile, stats)
        for handle in handles:
            handle.remove()
        report("pixels", crop(whole, (h, w)), crop(tile, (rows, cols)))  # type: ignore[arg-type]


def lattice_cost(name: str, dtype: str, shape: tuple[int, int, int], halo: int, device: str) -> None:
    import math

    import torch

    from farm.decoders import load_decoder
    from farm.decoders.lattice_conv import install, placed

    decoder = load_decoder({"family": "ltx2", "config": name, "weights": {"random_seed": 0}, "dtype": dtype},
                           device)  # fmt: skip
    z = torch.randn(decoder.latent_channels, *shape, generator=torch.Generator().manual_seed(1)).to(device)
    cut, scale = shape[2] // 2, decoder.geometry.spatial_scale

    def decode(block: torch.Tensor, lattice: bool) -> tuple[torch.Tensor, float]:
        seconds = 0.0
        for _ in range(2):  # the second call's seconds: the first one's include cuDNN's and torch's set-up
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with placed((0, 0), tuple(block.shape[2:])) if lattice else contextlib.nullcontext():
                pixels = decoder.decode(block, (0, 0, 0))
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        return pixels.float(), seconds

    def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
        mse = float(((a.clamp(0, 1) - b.clamp(0, 1)) * 255).pow(2).mean())
        return round(10 * math.log10(255**2 / mse), 1) if mse else math.inf

    wholes = {}
    for lattice in (False, True):
        if lattice:
            install(decoder.model)
        whole, whole_s = decode(z, lattice)
        tile, tile_s = decode(z[..., : cut + halo], lattice)
        own, ref = tile[..., : cut * scale], whole[..., : cut * scale]
        seam, beyond = slice(cut * scale - 32, cut * scale), slice(0, max(1, (cut - halo) * scale))
        print(json.dumps({
            "check": "lattice-cost", "decoder": name, "dtype": dtype, "shape": shape, "halo": halo,
            "lattice": lattice, "whole_s": round(whole_s, 3), "tile_s": round(tile_s, 3),
            "tile_psnr_db": psnr(own, ref), "seam_psnr_db": psnr(own[..., seam], ref[..., seam]),
            "beyond_halo_psnr_db": psnr(own[..., beyond], ref[..., beyond]),
            "worst_levels": round(float((own - ref).abs().max()) * 255, 2),
        }), flush=True)  # fmt: skip
        wholes[lattice] = whole
    apart = psnr(wholes[True], wholes[False])
    print(json.dumps({"check": "lattice-cost", "whole_lattice_against_cudnn_db": apart}), flush=True)


def fhw(text: str) -> tuple[int, int, int]:
    f, h, w = (int(x) for x in text.split(","))
    return f, h, w


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="check", required=True)
    sub.add_parser("fork")
    p = sub.add_parser("peaks")
    p.add_argument("--decoder", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--shapes", nargs="+", type=fhw, required=True)
    p.add_argument("--init-on-device", action="store_true", help="initialise the random weights on the GPU")
    n = sub.add_parser("nonfinite")
    n.add_argument("--decoder", required=True)
    n.add_argument("--dtype", default="bfloat16")
    n.add_argument("--shape", type=fhw, required=True)
    n.add_argument("--limit", type=int, default=8)
    sub.add_parser("crop-bits")
    t = sub.add_parser("tile-bits")
    t.add_argument("--decoder", default="hunyuanvideo")
    t.add_argument("--dtype", default="bfloat16")
    t.add_argument("--shape", type=fhw, required=True)
    t.add_argument("--halo", type=int, default=16)
    t.add_argument("--reach", type=int, default=14, help="latent rows and columns left out beside the cut")
    t.add_argument("--device", default="cuda")
    t.add_argument("--block", type=int, default=None, help="the lattice's block, latent rows and columns "
                   "(default: farm.decoders.lattice_conv.BLOCK)")
    t.add_argument("--no-lattice", action="store_true", help="convolutions as cuDNN picks for each shape, "
                   "not on the shot's lattice (farm.decoders.lattice_conv)")
    c = sub.add_parser("lattice-cost")
    c.add_argument("--decoder", default="ltx2.3", help="an ltx2 family config")
    c.add_argument("--dtype", default="bfloat16")
    c.add_argument("--shape", type=fhw, required=True)
    c.add_argument("--halo", type=int, default=12)
    c.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.check == "fork":
        fork_check()
    elif args.check == "crop-bits":
        crop_bits()
    elif args.check == "tile-bits":
        lattice = not args.no_lattice
        if args.block:
            from farm.decoders import lattice_conv

            lattice_conv.BLOCK = args.block
        tile_bits(args.decoder, args.dtype, args.shape, args.halo, args.reach, args.device, lattice)
    elif args.check == "lattice-cost":
        lattice_cost(args.decoder, args.dtype, args.shape, args.halo, args.device)
    elif args.check == "peaks":
        peaks(args.decoder, args.dtype, args.shapes, args.init_on_device)
    else:
        nonfinite(args.decoder, args.dtype, args.shape, args.limit)


if __name__ == "__main__":
    main()
