"""LTX-2 as it ships, on one GPU: sound beside picture, and the LTX-2.5 diffusion decoder through farm.

One 121x704x1216 shot (latent [128, 16, 22, 38]; 5.04 s of sound, audio latent [8, 126, 16]), RANDOM
weights (seeded), bf16. Each step runs in a process of its own under a timeout (a step that runs out of
memory or time is a row saying so, and the next step starts on a clean GPU):

* ``audio``: farm's audio decoder (`AutoencoderKLLTX2Audio.decode`, then `LTX2Vocoder`), first call and
  the median of warm calls;
* ``video``: farm's convolutional LTX-2 decoder on the whole shot, first and warm;
* ``attention``: farm's blocked neighbourhood attention on the GPU against the dense windowed definition
  (float32 and bf16 error, a stage-4-sized grid), and its time at stage 5's shape;
* ``diffusion``: the diffusion decoder through farm's decoder on the whole shot
  (`farm.decoders.ltx2_diffusion`, blocked neighbourhood attention), first and warm;
* ``diffusion-sizes``: the same decoder on smaller tiles of the shot: peak memory and seconds against
  decoded pixel-frames (the points its memory and cost models are fitted to);
* ``diffusion-tiles``: the same shot as farm's 1x2x2 grid (overlap 2), tiles decoded and blended as a
  worker does (`decode_block`, blend ramps), first pass and a second;
* ``diffusers``: diffusers' own decode (its FlexAttention processor, as shipped) on a ladder of shapes,
  smallest first, each in its own process, beside farm's decoder on the same latent: the largest shape
  diffusers decodes gives the ratio;
* ``farm-one``, ``farm-batch``: ``farm render`` (a fresh command, its own cluster) of one shot and of
  ``--batch`` shots of the diffusion decoder, from ``farm synth`` job stores.

Prints a table and writes JSON:

    python benchmarks/bench_ltx2_shipped.py --out ltx2-shipped-h200.json [--timeout 540] [--steps audio,video]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("attention", "audio", "video", "diffusion", "diffusion-sizes", "diffusion-tiles", "diffusers",
         "farm-one", "farm-batch")
SHOT = (121, 704, 1216)  # pixel frames, height, width
LATENT = (128, 16, 22, 38)
AUDIO_LATENT = (8, 126, 16)
# --tiny: the same steps on tiny configs and a small shot (a check of the script itself, e.g. on a CPU)
TINY = {"shot": (17, 128, 192), "latent": (8, 3, 4, 6), "audio_latent": (2, 18, 16)}
# diffusers' ladder: latent frames, rows, columns (the shot's channels), smallest first
# (its windows need 3x7x7 latent units; diffusers' scores grow with the square of its tokens)
LADDER = ((3, 7, 7), (3, 7, 10), (3, 8, 12), (3, 10, 14))
TINY_LADDER = ((2, 3, 3), (2, 3, 4))
BATCH = 32
DEVICE, SUFFIX = "cuda", ""


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Any) -> float:
    _sync()
    started = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - started


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def step_audio(repeats: int) -> dict:
    import numpy as np

    from farm.decoders.sound import load_sound_decoder

    spec = {"config": "ltx2-audio" + SUFFIX, "weights": {"random_seed": 0}, "dtype": _dtype()}
    started = time.perf_counter()
    decoder = load_sound_decoder(spec, DEVICE)
    load_s = time.perf_counter() - started
    latent = np.random.default_rng(0).standard_normal(AUDIO_LATENT).astype(np.float32)
    out: list = []
    first = _timed(lambda: out.append(decoder.decode(latent)))
    warm = [_timed(lambda: decoder.decode(latent)) for _ in range(repeats)]
    return {"load_s": load_s, "first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib(),
            "samples": int(out[0].shape[1]), "sample_rate": decoder.sample_rate}  # fmt: skip


def _dtype() -> str:
    return "float32" if SUFFIX else "bfloat16"


def _latent() -> Any:
    import numpy as np
    import torch

    from farm.inputs.synthetic import smooth_latent

    return torch.from_numpy(smooth_latent(np.random.default_rng(0), LATENT))


def step_video(repeats: int) -> dict:
    from farm.decoders import load_decoder

    decoder = load_decoder({"family": "ltx2", "config": "ltx2" + SUFFIX, "weights": {"random_seed": 0},
                            "dtype": _dtype()}, DEVICE)  # fmt: skip
    z = _latent()
    first = _timed(lambda: decoder.decode(z, (0, 0, 0)))
    warm = [_timed(lambda: decoder.decode(z, (0, 0, 0))) for _ in range(repeats)]
    return {"first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}


def _diffusion_decoder() -> Any:
    from farm.decoders import load_decoder

    spec = {"family": "ltx2-diffusion", "config": "ltx2-diffusion" + SUFFIX, "weights": {"random_seed": 0},
            "dtype": _dtype()}  # fmt: skip
    return load_decoder(spec, DEVICE)


def step_diffusion(repeats: int) -> dict:
    decoder = _diffusion_decoder()
    z = _latent()
    first = _timed(lambda: decoder.decode(z, (0, 0, 0)))
    warm = [_timed(lambda: decoder.decode(z, (0, 0, 0))) for _ in range(repeats)]
    return {"first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}


def step_attention(repeats: int) -> dict:
    import torch

    from farm.decoders.ltx2_diffusion.neighborhood_attention import neighborhood_attention

    def reference(q: Any, k: Any, v: Any, kernel: tuple) -> Any:  # dense, the window as the mask
        _, t, h, w, heads, d = q.shape
        pos = torch.stack(torch.meshgrid(*(torch.arange(n, device=q.device) for n in (t, h, w)),
                                         indexing="ij"), -1).reshape(-1, 3)  # fmt: skip
        allowed = torch.ones(len(pos), len(pos), dtype=torch.bool, device=q.device)
        for axis, (n, kk) in enumerate(zip((t, h, w), kernel, strict=True)):
            lo = (pos[:, axis] - kk // 2).clamp(0, n - kk)[:, None]
            allowed &= (pos[None, :, axis] >= lo) & (pos[None, :, axis] < lo + kk)
        flat = [x.reshape(1, -1, heads, d).transpose(1, 2) for x in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*flat, attn_mask=allowed)
        return out.transpose(1, 2).reshape(q.shape)

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    grid, kernel = (9, 22, 38), (3, 5, 5)
    q, k, v = (torch.randn(1, *grid, 8, 64, generator=gen, device=DEVICE) for _ in range(3))
    want = reference(q, k, v, kernel)
    err32 = (neighborhood_attention(q, k, v, kernel) - want).abs().max().item()
    bf = [x.bfloat16() for x in (q, k, v)]
    err16 = (neighborhood_attention(*bf, kernel).float() - want).abs().max().item()
    stage5 = [torch.randn(1, *SHOT[:1], SHOT[1] // 4, SHOT[2] // 4, 4, 64, device=DEVICE,
                          dtype=torch.bfloat16) for _ in range(3)]  # fmt: skip
    first = _timed(lambda: neighborhood_attention(*stage5, (11, 11, 11)))
    warm = [_timed(lambda: neighborhood_attention(*stage5, (11, 11, 11))) for _ in range(repeats)]
    return {"max_error_float32": err32, "max_error_bf16": err16, "stage5_grid": list(stage5[0].shape[1:4]),
            "first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}  # fmt: skip


def step_diffusion_sizes(repeats: int) -> dict:
    import torch

    decoder = _diffusion_decoder()
    z = _latent()
    c, f, h, w = z.shape
    points = []
    hf, hh, hw = (max(3, n // 2) for n in (f, h, w))  # the smallest windows need 3 latent units an axis
    for shape in ((f, h, w), (hf, h, w), (f, hh, hw), (hf, hh, hw)):
        block = z[:, : shape[0], : shape[1], : shape[2]].contiguous()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        decoded: list = []
        seconds = _timed(lambda b=block, d=decoded: d.append(decoder.decode(b, (0, 0, 0))))
        pixel_frames = decoded[0].shape[1] * decoded[0].shape[2] * decoded[0].shape[3]
        decoded.clear()
        points.append({"latent": list(shape), "pixel_frames": pixel_frames, "s": seconds,
                       "peak_gib": _peak_gib() - base})  # fmt: skip
    return {"points": points, "first_s": points[0]["s"], "peak_gib": max(p["peak_gib"] for p in points)}


def _diffusers_child(shape: tuple, which: str) -> dict:
    """One decode of a `shape` latent by diffusers (as shipped) or farm, first and warm, in this process."""
    import torch

    from farm.decoders.ltx2_diffusion import LTX2DiffusionDecoder

    decoder = _diffusion_decoder()
    z = _latent()[:, : shape[0], : shape[1], : shape[2]].contiguous()
    if which == "farm":
        run = lambda: decoder.decode(z, (0, 0, 0))  # noqa: E731
    else:
        model = LTX2DiffusionDecoder.build(decoder.spec)  # with diffusers' own attention processors
        model = model.to(DEVICE, decoder.torch_dtype)
        model.load_state_dict(decoder.model.state_dict())
        del decoder
        zz = z[None].to(DEVICE, model.dtype)

        def run() -> Any:
            with torch.inference_mode():
                return model.decode(zz, generator=torch.Generator(device=DEVICE).manual_seed(0))

    first = _timed(run)
    warm = [_timed(run) for _ in range(2)]
    return {"first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}


def step_diffusers(repeats: int) -> dict:
    ladder, rows = (TINY_LADDER if SUFFIX else LADDER), []
    for shape in ladder:
        row: dict = {"latent": list(shape)}
        for which in ("diffusers", "farm"):
            result = run_step(f"diffusers-child:{which}:{','.join(map(str, shape))}", CHILD_TIMEOUT, repeats)
            row[which] = {k: v for k, v in result.items() if k in ("status", "first_s", "warm_s", "peak_gib")}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if row["diffusers"]["status"] != "ok":
            break
    done = [r for r in rows if r["diffusers"]["status"] == "ok" and r["farm"]["status"] == "ok"]
    best = done[-1] if done else None
    ratio = best["diffusers"]["warm_s"] / best["farm"]["warm_s"] if best else None
    return {"ladder": rows, "largest_diffusers_decodes": best and best["latent"],
            "speedup_warm": ratio}  # fmt: skip


def _farm(*args: str, timeout: float) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"farm {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return {"wall_s": time.perf_counter() - started, "log": done.stderr.strip().splitlines()[-3:]}


def _farm_render(shots: int, repeats: int) -> dict:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="farm-diffusion-"))
    frames, height, width = SHOT
    _farm("synth", str(work / "job.zarr"), "--decoder", "ltx2-diffusion" + SUFFIX, "--shots", str(shots),
          "--frames", str(frames), "--height", str(height), "--width", str(width), "--dtype", _dtype(),
          timeout=300)  # fmt: skip
    plan = subprocess.run([sys.executable, "-m", "farm", "plan", str(work / "job.zarr")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    result = _farm("-v", "render", str(work / "job.zarr"), "--out", str(work / "out"), timeout=CHILD_TIMEOUT)
    return {"shots": shots, "first_s": result["wall_s"], "render_log": result["log"],
            "plan": plan.stdout.strip().splitlines()[-6:]}  # fmt: skip


def step_farm_one(repeats: int) -> dict:
    return _farm_render(1, repeats)


def step_farm_batch(repeats: int) -> dict:
    return _farm_render(BATCH, repeats)


def step_diffusion_tiles(repeats: int) -> dict:
    import torch

    from farm.planning.tiling import TileGrid, plan_shot
    from farm.worker.tasks import decode_block, drop_context

    decoder = _diffusion_decoder()
    z = _latent()
    plan = plan_shot("shot", z.shape, decoder.geometry, TileGrid((1, 2, 2), (0, 2, 2)))

    def render() -> None:
        full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32, device=DEVICE)
        for tile in plan.tiles:
            block = z[(slice(None), *tile.decode_slices())]
            decoded = decode_block(decoder, block, plan.chunk, origin=tile.decode_origin()).float()
            pixels = drop_context(decoded, tile, decoder.geometry)
            wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32, device=DEVICE) for s in tile.pixels)
            (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
            full[:, f0:f1, h0:h1, w0:w1] += pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)

    first = _timed(render)
    warm = [_timed(render) for _ in range(repeats)]
    return {"tiles": len(plan.tiles), "redundancy": plan.redundancy, "first_s": first,
            "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}  # fmt: skip


RUNNERS = {"attention": step_attention, "audio": step_audio, "video": step_video, "diffusion": step_diffusion,
           "diffusion-sizes": step_diffusion_sizes, "diffusion-tiles": step_diffusion_tiles,
           "diffusers": step_diffusers, "farm-one": step_farm_one, "farm-batch": step_farm_batch}  # fmt: skip
CHILD_TIMEOUT = 540.0


def run_child(name: str, repeats: int) -> dict:
    if name.startswith("diffusers-child:"):
        _, which, shape = name.split(":")
        return _diffusers_child(tuple(int(n) for n in shape.split(",")), which)
    return RUNNERS[name](repeats)


def run_step(name: str, timeout: float, repeats: int) -> dict:
    """One step in a child process, bounded by `timeout` seconds."""
    started = time.perf_counter()
    command = [sys.executable, __file__, "--child", name, "--repeats", str(repeats), "--device", DEVICE,
               "--batch", str(BATCH), "--timeout", str(CHILD_TIMEOUT),
               *(["--tiny"] if SUFFIX else [])]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {
            "step": name,
            "status": f"timed out after {timeout:.0f} s",
            "wall_s": time.perf_counter() - started,
        }
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        status = "out of memory" if "OutOfMemory" in done.stderr else f"failed: {tail[:160]}"
        return {"step": name, "status": status, "wall_s": time.perf_counter() - started}
    return {"step": name, "status": "ok", "wall_s": time.perf_counter() - started, **json.loads(lines[-1])}


def table(rows: list[dict]) -> str:
    head = "| step | status | first s | warm s | peak GiB | notes |\n| --- | --- | --- | --- | --- | --- |"
    out = [head]
    for r in rows:
        notes = {k: v for k, v in r.items() if k not in ("step", "status", "wall_s", "first_s", "warm_s",
                                                          "peak_gib", "render_log", "plan")}  # fmt: skip

        def num(key: str, r: dict = r) -> str:
            return f"{r[key]:.3f}" if key in r else ""

        cells = [r["step"], r["status"], num("first_s"), num("warm_s"), num("peak_gib"), json.dumps(notes)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    global DEVICE, SUFFIX, SHOT, LATENT, AUDIO_LATENT, BATCH, CHILD_TIMEOUT
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file for the results")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds each step may take")
    p.add_argument("--repeats", type=int, default=3, help="warm calls per step (median reported)")
    p.add_argument("--device", default="cuda", help="where to decode (default cuda)")
    p.add_argument("--batch", type=int, default=BATCH, help="shots of the farm-batch step")
    p.add_argument("--tiny", action="store_true", help="tiny configs and a small shot: checks the script")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    DEVICE, SUFFIX, BATCH, CHILD_TIMEOUT = args.device, "-tiny" if args.tiny else "", args.batch, args.timeout
    if args.tiny:
        SHOT, LATENT, AUDIO_LATENT = TINY["shot"], TINY["latent"], TINY["audio_latent"]
    if args.child:  # one step, in this process: its result as one JSON line
        print(json.dumps(run_child(args.child, args.repeats)), flush=True)
        return
    import platform

    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in RUNNERS]
    if unknown:
        p.error(f"unknown steps {unknown}; choose from {', '.join(STEPS)}")
    rows = []
    for name in steps:
        rows.append(run_step(name, args.timeout, args.repeats))
        print(f"{name}: {rows[-1]['status']} ({rows[-1]['wall_s']:.1f} s)", flush=True)
    print(table(rows))
    result = {"what": "LTX-2 as it ships: audio and video decode, the diffusion decoder through farm",
              "shot": list(SHOT), "latent": list(LATENT), "audio_latent": list(AUDIO_LATENT),
              "weights": "RANDOM (seed 0)", "dtype": _dtype(), "device": DEVICE, "host": platform.node(),
              "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
