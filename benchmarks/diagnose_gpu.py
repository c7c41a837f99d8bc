"""GPU diagnostics behind three pending figures, each a subcommand printing JSON lines:

    fork     whether importing diffusers' model code and farm's decoders in a parent leaves CUDA usable in a
             forked child (farm's worker forkserver could then import them before forking GPU workers)
    peaks    a decoder's peak allocated and reserved device memory per decode call shape, beside the
             planner's model (`peak_bytes`), and the memory the process holds outside torch's allocator
             (CUDA context, kernels loaded on first use) before and after each call
    nonfinite  the first modules of a whole decode whose outputs are not finite (forward hooks)

Usage (from the repository root, on a GPU):

    python benchmarks/diagnose_gpu.py fork
    python benchmarks/diagnose_gpu.py peaks --decoder ltx2-diffusion --shapes 16,34,23 16,34,31
    python benchmarks/diagnose_gpu.py nonfinite --decoder hunyuanvideo --shape 16,60,104
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args()
    if args.check == "fork":
        fork_check()
    elif args.check == "peaks":
        peaks(args.decoder, args.dtype, args.shapes, args.init_on_device)
    else:
        nonfinite(args.decoder, args.dtype, args.shape, args.limit)


if __name__ == "__main__":
    main()
