"""LTX-2 as it ships, on one GPU: sound beside picture, and the LTX-2.5 diffusion decoder through farm.

One 121x704x1216 shot (latent [128, 16, 22, 38]; 5.04 s of sound, audio latent [8, 126, 16]), RANDOM
weights (seeded), bf16. Each step runs in a process of its own under a timeout (a step that runs out of
memory or time is a row saying so, and the next step starts on a clean GPU):

* ``audio``: farm's audio decoder (`AutoencoderKLLTX2Audio.decode`, then `LTX2Vocoder`), first call and
  the median of warm calls;
* ``video``: farm's convolutional LTX-2 decoder on the whole shot, first and warm;
* ``diffusion``: the diffusion decoder through farm's decoder on the whole shot, its FlexAttention compiled
  for the attention call alone with block masks built once per tile shape (`farm.decoders.ltx2_diffusion`);
* ``diffusion-tiles``: the same shot as farm's 1x2x2 grid (overlap 2), tiles decoded and blended as a
  worker does (`decode_block`, blend ramps), first pass (compiles) and a second.

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
STEPS = ("audio", "video", "diffusion", "diffusion-tiles")
SHOT = (121, 704, 1216)  # pixel frames, height, width
LATENT = (128, 16, 22, 38)
AUDIO_LATENT = (8, 126, 16)
# --tiny: the same steps on tiny configs and a small shot (a check of the script itself, e.g. on a CPU)
TINY = {"shot": (17, 128, 192), "latent": (8, 3, 4, 6), "audio_latent": (4, 18, 4)}
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

    from farm.decoders.ltx2_audio import load_audio_decoder

    spec = {"config": "ltx2-audio" + SUFFIX, "weights": {"random_seed": 0}, "dtype": _dtype()}
    started = time.perf_counter()
    decoder = load_audio_decoder(spec, DEVICE)
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

    from farm.synthetic import smooth_latent

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
    return load_decoder(spec, DEVICE, compile=True)  # on a GPU: FlexAttention compiled alone


def step_diffusion(repeats: int) -> dict:
    decoder = _diffusion_decoder()
    z = _latent()
    first = _timed(lambda: decoder.decode(z, (0, 0, 0)))
    warm = [_timed(lambda: decoder.decode(z, (0, 0, 0))) for _ in range(repeats)]
    return {"first_s": first, "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}


def step_diffusion_tiles(repeats: int) -> dict:
    import torch

    from farm.tasks import decode_block, drop_context
    from farm.tiling import TileGrid, plan_shot

    decoder = _diffusion_decoder()
    z = _latent()
    plan = plan_shot("shot", z.shape, decoder.geometry, TileGrid((1, 2, 2), (0, 2, 2)))

    def render() -> None:
        full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32, device=DEVICE)
        for tile in plan.tiles:
            block = z[(slice(None), *tile.decode_slices())]
            decoded = decode_block(decoder, block, plan.chunk, origin=tile.decode_origin()).float()
            pixels = drop_context(decoded, tile, decoder.geometry.temporal_scale)
            wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32, device=DEVICE) for s in tile.pixels)
            (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
            full[:, f0:f1, h0:h1, w0:w1] += pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)

    first = _timed(render)
    warm = [_timed(render) for _ in range(repeats)]
    return {"tiles": len(plan.tiles), "redundancy": plan.redundancy, "first_s": first,
            "warm_s": statistics.median(warm), "peak_gib": _peak_gib()}  # fmt: skip


RUNNERS = {"audio": step_audio, "video": step_video, "diffusion": step_diffusion,
           "diffusion-tiles": step_diffusion_tiles}  # fmt: skip


def run_step(name: str, timeout: float, repeats: int) -> dict:
    """One step in a child process, bounded by `timeout` seconds."""
    started = time.perf_counter()
    command = [sys.executable, __file__, "--child", name, "--repeats", str(repeats), "--device", DEVICE,
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
        notes = {
            k: v for k, v in r.items() if k in ("samples", "sample_rate", "tiles", "redundancy", "load_s")
        }

        def num(key: str, r: dict = r) -> str:
            return f"{r[key]:.3f}" if key in r else ""

        cells = [r["step"], r["status"], num("first_s"), num("warm_s"), num("peak_gib"), json.dumps(notes)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON file for the results")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds each step may take")
    p.add_argument("--repeats", type=int, default=3, help="warm calls per step (median reported)")
    p.add_argument("--device", default="cuda", help="where to decode (default cuda)")
    p.add_argument("--tiny", action="store_true", help="tiny configs and a small shot: checks the script")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    global DEVICE, SUFFIX, SHOT, LATENT, AUDIO_LATENT
    DEVICE, SUFFIX = args.device, "-tiny" if args.tiny else ""
    if args.tiny:
        SHOT, LATENT, AUDIO_LATENT = TINY["shot"], TINY["latent"], TINY["audio_latent"]
    if args.child:  # one step, in this process: its result as one JSON line
        print(json.dumps(RUNNERS[args.child](args.repeats)), flush=True)
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
