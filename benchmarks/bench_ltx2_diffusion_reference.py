"""LTX-2.5's diffusion decoder: farm beside Lightricks' own (ltx-core 1.2.0 `DiffusionVideoDecoder`), one GPU.

Both decoders hold the same weights (RANDOM, seed 0: farm's `ltx2-diffusion` model, its tensors renamed
into ltx-core's modules) and decode the same latent in bf16; farm is given ltx-core's stage-5 noise (the
generator's draw for the same shape), so the outputs differ only by arithmetic. Each step runs in a
process of its own under a timeout:

* ``kernel``: the fused Triton neighbourhood attention (`farm.decoders.ltx2_diffusion.device.na_triton`)
  against the blocked SDPA path on the GPU: largest error (float32 and bf16) on a small grid, and times at
  stage 5's shape (121x176x304, 4 heads of 64, 11x11x11) for a few kernel configurations;
* ``decode:704``, ``decode:1088``: 121 frames at 704x1216 and 1088x1920: ltx-core ``combined`` and
  ``chunked_eager`` with its Triton na3d (its paths without NATTEN), then farm's decode
  (`farm.decoders.ltx2_diffusion.decode_with_noise`): first call, median warm call, peak memory above the
  weights, PSNR of farm's output against each of ltx-core's (peak-to-peak 2, outputs in [-1, 1]);
* ``sizes``: farm's peak above the weights and seconds at several decode shapes (the memory model's fit);
* ``render:1088``, ``render:4k``: ``farm render`` of one 121-frame shot with the default plan on a one-GPU
  cluster: wall time, the plan's predicted GPU memory per worker and the worker's measured peak.

ltx-core 1.2.0 is not on the package index: build its wheel from the Lightricks/LTX-2 repository
(``git archive HEAD packages``, ``pip wheel --no-deps packages/ltx-core``) and install it with
``--no-deps`` (it needs einops); without it the ltx-core rows say so.

    python benchmarks/bench_ltx2_diffusion_reference.py --out F.json [--steps kernel,decode:704]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("kernel", "decode:704", "decode:1088", "sizes", "render:1088", "render:4k")
SHOTS = {"704": (121, 704, 1216), "1088": (121, 1088, 1920), "4k": (121, 2176, 3840)}
REPEATS = 2


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _timed(fn: Any) -> tuple[float, Any]:
    _sync()
    started = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - started, out


def _first_and_warm(fn: Any) -> dict:
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    first, out = _timed(fn)
    del out
    warm = [_timed(fn)[0] for _ in range(REPEATS)]
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return {"first_s": first, "warm_s": statistics.median(warm), "peak_gib": peak}


# ---- kernel ---------------------------------------------------------------------------------------


def step_kernel() -> dict:
    import torch

    from farm.decoders.ltx2_diffusion.device import na_triton
    from farm.decoders.ltx2_diffusion.neighborhood_attention import neighborhood_attention as blocked

    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict[str, Any] = {}
    for grid, kernel in (((13, 22, 38), (11, 11, 11)), ((9, 22, 38), (3, 7, 7))):
        q, k, v = (torch.randn(1, *grid, 4, 64, generator=gen, device="cuda") for _ in range(3))
        want = blocked(q.double(), k.double(), v.double(), kernel).float()
        got32 = na_triton.neighborhood_attention(q, k, v, kernel)
        got16 = na_triton.neighborhood_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), kernel).float()
        ref16 = blocked(q.bfloat16(), k.bfloat16(), v.bfloat16(), kernel).float()
        out[f"error {grid} {kernel}"] = {
            "fused_float32": (got32 - want).abs().max().item(),
            "fused_bf16": (got16 - want).abs().max().item(),
            "blocked_sdpa_bf16": (ref16 - want).abs().max().item(),
        }
    grid = (121, 176, 304)
    q, k, v = (
        torch.randn(1, *grid, 4, 64, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3)
    )
    kernel = (11, 11, 11)
    times = {}
    times["blocked sdpa"] = _first_and_warm(lambda: blocked(q, k, v, kernel))["warm_s"]
    for bq, bk, warps, stages in ((128, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 2),
                                  (128, 32, 4, 3), (64, 128, 4, 2), (128, 64, 4, 3)):  # fmt: skip
        name = f"fused q{bq} k{bk} w{warps} s{stages}"
        try:
            times[name] = _first_and_warm(
                lambda bq=bq, bk=bk, w=warps, s=stages: na_triton.neighborhood_attention(
                    q, k, v, kernel, block_q=bq, block_k=bk, num_warps=w, num_stages=s
                )
            )["warm_s"]
        except Exception as exc:  # noqa: BLE001  (a configuration the compiler refuses)
            times[name] = str(exc)[:100]
    useful = 4 * math.prod(grid) * 4 * 1331 * 64
    best = min((t for t in times.values() if isinstance(t, float)), default=None)
    out["stage5_times_s"] = times
    out["useful_tflops_best"] = useful / best / 1e12 if best else None
    return out


# ---- decode beside ltx-core ----------------------------------------------------------------------


def _farm_model() -> Any:
    from farm.decoders import load_decoder

    spec = {"family": "ltx2-diffusion", "config": "ltx2-diffusion", "weights": {"random_seed": 0},
            "dtype": "bfloat16"}  # fmt: skip
    return load_decoder(spec, "cuda").model


def ltx_core_name(name: str) -> str:
    """A diffusers `LTX2VideoDiffusionDecoderModel` tensor's name in ltx-core's `DiffusionVideoDecoder`."""
    name = name.removeprefix("decoder.")
    for new, old in ((".attn.to_q.", ".attn.qkv.to_q."), (".attn.to_k.", ".attn.qkv.to_k."),
                     (".attn.to_v.", ".attn.qkv.to_v."), (".attn.to_out.0.", ".attn.proj."),
                     (".attn.norm_q.", ".attn.q_norm."), (".attn.norm_k.", ".attn.k_norm.")):  # fmt: skip
        name = name.replace(new, old)
    return name


def _ltx_core_decoder(model: Any, mode: str, device: str = "cuda", attention: str = "TRITON") -> Any:
    """ltx-core's decoder with `model`'s weights, its blocks as `mode` ("combined" or "chunked_eager")
    builds them, its neighbourhood attention `attention` (TRITON: its na3d kernel; EAGER_SDPA)."""
    from ltx_core.model.video_vae.diffusion_video_decoder import DiffusionVideoDecoder
    from ltx_core.model.video_vae.transformer.apply import apply_diffvae_config
    from ltx_core.model.video_vae.transformer.config import (
        DiffVAEBlockKind,
        DiffVAEConfig,
        DiffVAEMode,
        NAttentionKind,
    )

    c = model.config
    decoder = DiffusionVideoDecoder(
        in_channels=c.latent_channels, out_channels=3, patch_size=c.patch_size, head_dim=c.decoder_head_dim,
        stage_channels=tuple(c.decoder_stage_channels), stage_depths=tuple(c.decoder_stage_depths),
        # one kernel a stage, stage 5's last (ltx-core reads stage 5's from stage5_kernel)
        stage_kernels=tuple(tuple(k) for k in [*c.decoder_stage_kernels, c.decoder_stage5_kernel]),
        upsamples=tuple((tuple(s), r) for s, r in zip(c.decoder_upsample_strides,
                                                      c.decoder_upsample_channel_reductions, strict=True)),
        stage5_kernel=tuple(c.decoder_stage5_kernel), t_emb_dim=c.decoder_t_emb_dim,
        default_num_inference_steps=c.decoder_num_inference_steps,
        timestep_scale_multiplier=c.decoder_timestep_scale_multiplier,
        model_output_type=c.decoder_model_output_type,
    )  # fmt: skip
    state = {ltx_core_name(k): v for k, v in model.state_dict().items() if k.startswith("decoder.")}
    missing, unexpected = decoder.load_state_dict(state, strict=False)
    missing = [m for m in missing if "per_channel_statistics" not in m]
    if missing or unexpected:
        raise RuntimeError(f"ltx-core names: missing {missing[:4]}, unexpected {unexpected[:4]}")
    decoder = decoder.to(device, model.dtype).eval()
    kind = NAttentionKind[attention]
    if mode == "combined":
        cfg = DiffVAEConfig(block=DiffVAEBlockKind.COMBINED, w_chunks=1, natten_backend=None,
                            attention=kind, compile_blocks=False, compile_det_stages=False)  # fmt: skip
    else:  # its pipelines' default; NATTEN's recipe, with Triton na3d where NATTEN is missing
        cfg = replace(DiffVAEMode.CHUNKED_EAGER.resolve(), attention=kind, natten_backend=None)
    return apply_diffvae_config(decoder, cfg)


def step_decode(which: str) -> dict:
    import numpy as np
    import torch

    from farm.decoders.ltx2_diffusion.adapter import decode_with_noise
    from farm.inputs.synthetic import smooth_latent

    frames, height, width = SHOTS[which]
    latent = (128, (frames - 1) // 8 + 1, height // 32, width // 32)
    z = torch.from_numpy(smooth_latent(np.random.default_rng(0), latent))[None].to("cuda", torch.bfloat16)
    model = _farm_model()
    rows: dict[str, Any] = {"latent": list(latent)}
    outputs: dict[str, torch.Tensor] = {}

    def reference_noise(shape: tuple, _origin: tuple) -> torch.Tensor:
        gen = torch.Generator(device="cuda").manual_seed(0)
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    for mode in ("combined", "chunked_eager"):
        try:
            decoder = _ltx_core_decoder(model, mode)
        except ImportError as exc:
            rows[f"ltx-core {mode}"] = {"status": f"ltx-core not installed ({exc})"}
            continue
        with torch.inference_mode():
            try:
                run = lambda d=decoder: d(z, generator=torch.Generator(device="cuda").manual_seed(0))  # noqa: E731
                rows[f"ltx-core {mode}"] = _first_and_warm(run)
                outputs[mode] = run().float().cpu()
            except torch.OutOfMemoryError:
                rows[f"ltx-core {mode}"] = {"status": "out of memory"}
        del decoder
        torch.cuda.empty_cache()
    with torch.inference_mode():
        run = lambda: decode_with_noise(model, z, reference_noise, (0, 0, 0), 1)  # noqa: E731
        rows["farm"] = _first_and_warm(run)
        got = run().float().cpu()
    for mode, want in outputs.items():
        if want.shape != got.shape:
            rows[f"psnr vs {mode}"] = f"shapes differ: {list(want.shape)} / {list(got.shape)}"
            continue
        mse = (got - want).pow(2).mean().item()
        rows[f"psnr vs {mode}"] = 10 * math.log10(4 / mse) if mse else float("inf")
    base = rows.get("ltx-core combined", {}).get("warm_s") or rows.get("ltx-core chunked_eager", {}).get(
        "warm_s"
    )
    if base:
        fastest = min(r["warm_s"] for k, r in rows.items() if k.startswith("ltx-core") and "warm_s" in r)
        rows["farm speed-up over ltx-core's fastest"] = fastest / rows["farm"]["warm_s"]
    return rows


def step_sizes() -> dict:
    import numpy as np
    import torch

    from farm.decoders.ltx2_diffusion.adapter import decode_with_noise
    from farm.inputs.synthetic import smooth_latent

    model = _farm_model()
    noise = lambda shape, _o: torch.zeros(shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    points = []
    for latent in ((16, 22, 38), (8, 22, 38), (16, 11, 19), (16, 34, 60), (8, 34, 60), (16, 68, 60)):
        z = torch.from_numpy(smooth_latent(np.random.default_rng(0), (128, *latent)))[None]
        z = z.to("cuda", torch.bfloat16)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            seconds, out = _timed(lambda z=z: decode_with_noise(model, z, noise, (0, 0, 0), 1))
        f, h, w = out.shape[2:]
        del out
        points.append({"latent": list(latent), "pixels": [f, h, w], "s": seconds,
                       "peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30})  # fmt: skip
    return {"points": points}


# ---- render ---------------------------------------------------------------------------------------


def _worker_reset() -> int:
    import torch

    if not torch.cuda.is_available():  # an I/O worker
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _worker_peak() -> int:
    import torch

    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0


def step_render(which: str) -> dict:
    import tempfile

    from farm.inputs.synthetic import synth
    from farm.run.cluster import connect
    from farm.run.render import render

    frames, height, width = SHOTS[which]
    work = Path(tempfile.mkdtemp(prefix="farm-diffusion-"))
    job = work / "job.zarr"
    synth(job, decoder="ltx2-diffusion", shots=1, frames=frames, height=height, width=width, dtype="bfloat16")
    plan = subprocess.run([sys.executable, "-m", "farm", "plan", str(job), "--workers", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    with connect(workers=1) as client:
        client.run(_worker_reset)
        started = time.perf_counter()
        stats = render(str(job), str(work / "out"), scheduler=client.scheduler.address, log=lambda _m: None)
        wall = time.perf_counter() - started
        peaks = client.run(_worker_peak)
    return {"wall_s": wall, "frames_written": stats.frames_written, "tiles": stats.tiles_total,
            "failed": [f"{s.shot}: {s.error}" for s in stats.failed],
            "worker_peak_gib": max(p / 2**30 for p in peaks.values()),
            "plan": (plan.stdout + plan.stderr).strip().splitlines()[-12:]}  # fmt: skip


# ---- driver ---------------------------------------------------------------------------------------


def run_child(name: str) -> dict:
    if name == "kernel":
        return step_kernel()
    if name == "sizes":
        return step_sizes()
    kind, which = name.split(":")
    return step_decode(which) if kind == "decode" else step_render(which)


def run_step(name: str, timeout: float) -> dict:
    started = time.perf_counter()
    command = [sys.executable, __file__, "--child", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"step": name, "status": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-3:]
        status = "out of memory" if "OutOfMemory" in done.stderr else f"failed: {tail}"
        return {"step": name, "status": status, "wall_s": time.perf_counter() - started}
    return {"step": name, "status": "ok", "wall_s": time.perf_counter() - started, **json.loads(lines[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file for the results")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each step may take")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        print(json.dumps(run_child(args.child)), flush=True)
        return
    import platform

    rows = []
    for name in (s for s in args.steps.split(",") if s):
        if name not in STEPS:
            p.error(f"unknown step {name!r}; choose from {', '.join(STEPS)}")
        rows.append(run_step(name, args.timeout))
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            result = {"what": "LTX-2.5 diffusion decoder: farm beside ltx-core 1.2.0",
                      "weights": "RANDOM (seed 0)", "dtype": "bfloat16", "host": platform.node(),
                      "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
