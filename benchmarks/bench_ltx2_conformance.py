"""farm's LTX-2 decode beside Lightricks' ltx-core, same weights from one file, same latent.

Writes an LTX-2 video VAE file as Lightricks ship it (original tensor names under ``vae.``, the config in
the safetensors metadata; the released structure, seeded RANDOM weights unless ``--weights`` names a real
file), then in one process per step:

* ``ltx-core``: ltx-core's ``VideoDecoder`` built from the file by its configurator, untiled, and its
  tiled decode with its recommended sizes for the shot (``TileSizeConfig`` is 1.2.0's; 1.0.0 gets the
  same sizes as a ``TilingConfig``): first call, warm median, peak memory, frames kept for the PSNR;
* ``farm``: farm's decoder (`farm.decoders.load_decoder`) from the same file, ``"latents":
  "normalized"`` (ltx-core un-normalizes inside its decoder), untiled;
* ``farm-causal``: the same with ``decoder_causal: true`` (diffusers' constructor default, what farm's
  ``ltx2`` config was before revision 2), to show what a wrong config costs.

The latent frames a temporal tile of the real config needs before and after a seam are measured by
``benchmarks/measure_seams.py context --decoders ltx2 --device cuda``.

Then PSNR (uint8 levels) of each against ltx-core's untiled decode. Needs ltx-core (1.0.0 from the
package index, ``pip install --no-deps ltx-core einops``: it pins an older torch)::

    python benchmarks/bench_ltx2_conformance.py --out conformance.json [--version 2.3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("ltx-core", "farm", "farm-causal")
SHOT = (121, 704, 1216)
LATENT = (128, 16, 22, 38)
# the released LTX-2 (2.0) video VAE as its file's metadata gives it to ltx-core
RELEASED_VAE = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "latent_channels": 128,
    "decoder_blocks": [
        ["res_x", {"num_layers": 5, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 5, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 5, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 5, "inject_noise": False}],
    ],
    "norm_layer": "pixel_norm",
    "patch_size": 4,
    "causal_decoder": False,
    "timestep_conditioning": False,
    "spatial_padding_mode": "reflect",
    "decoder_base_channels": 128,
}
# LTX-2.3's video VAE as its file's metadata gives it (four stages, no residual upsamplers, zero padding)
RELEASED_VAE_23 = {
    **RELEASED_VAE,
    "decoder_blocks": [
        ["res_x", {"num_layers": 4}], ["compress_space", {"multiplier": 2}],
        ["res_x", {"num_layers": 6}], ["compress_time", {"multiplier": 2}],
        ["res_x", {"num_layers": 4}], ["compress_all", {"multiplier": 1}],
        ["res_x", {"num_layers": 2}], ["compress_all", {"multiplier": 2}],
        ["res_x", {"num_layers": 2}],
    ],
    "spatial_padding_mode": "zeros",
}  # fmt: skip
TINY_VAE = {**RELEASED_VAE, "latent_channels": 8, "decoder_base_channels": 4,
            "decoder_blocks": [[n, {**c, "num_layers": 1} if n == "res_x" else c]
                               for n, c in RELEASED_VAE["decoder_blocks"]]}  # fmt: skip


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def write_file(path: Path, vae: dict, seed: int) -> None:
    """ltx-core's decoder with seeded weights, saved as an LTX single file (bf16 tensors)."""
    import torch
    from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    decoder = VideoDecoderConfigurator.from_config({"vae": vae})
    stats = decoder.per_channel_statistics
    c = vae["latent_channels"]
    with torch.no_grad():
        stats.get_buffer("mean-of-means").copy_(torch.randn(c) * 0.5)
        stats.get_buffer("std-of-means").copy_(torch.rand(c) + 0.5)
    tensors = {("vae." if k.startswith("per_channel_statistics.") else "vae.decoder.") + k:
               v.to(torch.bfloat16).contiguous() for k, v in decoder.state_dict().items()}  # fmt: skip
    save_file(tensors, str(path), metadata={"config": json.dumps({"vae": vae})})


def ltx_core_decoder(path: Path, device: str, dtype: str):
    import torch
    from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["config"])
        state = {}
        for key in f.keys():  # noqa: SIM118 (a safetensors handle)
            if key.startswith("vae.decoder."):
                state[key[len("vae.decoder.") :]] = f.get_tensor(key)
            elif key.startswith("vae.per_channel_statistics."):
                state[key[len("vae.") :]] = f.get_tensor(key)
    decoder = VideoDecoderConfigurator.from_config(config)
    decoder.load_state_dict(state, strict=True)
    return decoder.to(device=device, dtype=getattr(torch, dtype)).eval()


def timed(fn, repeats: int) -> tuple[Any, float, float]:
    """(last result, first call seconds, warm median seconds)."""
    import torch

    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    first = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        out = None
        t0 = time.perf_counter()
        out = fn()
        _sync()
        warm.append(time.perf_counter() - t0)
    return out, first, statistics.median(warm) if warm else first


def to_levels(pixels_m1_1) -> Any:
    """[1 or none, 3, F, H, W] in [-1, 1] → uint8 numpy [F, H, W, 3] rounded as farm rounds."""
    import torch

    p = pixels_m1_1[0] if pixels_m1_1.dim() == 5 else pixels_m1_1
    levels = ((p.float() + 1) / 2).clamp_(0, 1).mul_(255).round_().to(torch.uint8)
    return levels.permute(1, 2, 3, 0).cpu().numpy()


def step_ltx_core(args, path: Path, latent_file: Path, out: Path) -> dict:
    import numpy as np
    import torch

    decoder = ltx_core_decoder(path, args.device, args.dtype)
    z = torch.from_numpy(np.load(latent_file)).to(args.device, getattr(torch, args.dtype))[None]
    with torch.inference_mode():
        pixels, first, warm = timed(lambda: decoder(z), args.repeats)
        peak = _peak_gib()
        np.save(out / "ltx-core.npy", to_levels(pixels))
        del pixels
        row = {"step": "ltx-core", "first_s": first, "warm_s": warm, "peak_gib": peak}
        try:  # its tiled decode with the sizes its pipelines use for a shot this size
            from ltx_core.model.video_vae.tiling import (
                SpatialTilingConfig,
                TemporalTilingConfig,
                TilingConfig,
            )

            tiling = TilingConfig(SpatialTilingConfig(768, 64), TemporalTilingConfig(80, 24))
            tiled, tfirst, twarm = timed(lambda: torch.cat(list(decoder.tiled_decode(z, tiling)), dim=2),
                                         args.repeats)  # fmt: skip
            np.save(out / "ltx-core-tiled.npy", to_levels(tiled))
            row |= {"tiled_first_s": tfirst, "tiled_warm_s": twarm, "tiled_peak_gib": _peak_gib()}
        except Exception as exc:  # a reference's tiling failing is a result, not a crash
            row["tiled_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def step_farm(args, path: Path, latent_file: Path, out: Path, causal: bool) -> dict:
    import numpy as np
    import torch

    from farm.decoders import decoder_class, spec_from_json
    from farm.decoders.ltx2 import LTX2Decoder

    config: Any = "ltx2-tiny" if args.tiny else "ltx2.3" if args.version == "2.3" else "ltx2"
    if causal:
        config = {**LTX2Decoder.named_configs[config], "decoder_causal": True}
    spec = spec_from_json({"family": "ltx2", "config": config, "weights": {"path": str(path)},
                           "dtype": args.dtype, "latents": "normalized"})  # fmt: skip
    cls = decoder_class(spec)
    if causal:  # the file says not causal, and farm refuses the contradiction: decode as the old config did
        cls.check_file_config = classmethod(lambda *_: None)  # type: ignore[method-assign]
    spec = cls.check_weights(spec)
    decoder = cls.load(spec, args.device)
    z = torch.from_numpy(np.load(latent_file)).to(args.device)
    with torch.inference_mode():
        pixels, first, warm = timed(lambda: decoder.decode(z), args.repeats)  # [3, F, H, W] in [0, 1]
    levels = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 3, 0).cpu().numpy()
    np.save(out / ("farm-causal.npy" if causal else "farm.npy"), levels)
    name = "farm-causal" if causal else "farm"
    return {"step": name, "first_s": first, "warm_s": warm, "peak_gib": _peak_gib()}


def psnr(a, b) -> tuple[float, int]:
    import numpy as np

    d = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(d**2))
    return (float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)), int(np.abs(d).max())


def run_step(name: str, argv: list[str], timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--step", name, *argv]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"step": name, "error": f"timed out after {timeout} s"}
    if done.returncode != 0:
        return {"step": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="JSON file for the rows")
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weights", help="a real LTX-2 single file (default: write one with RANDOM weights)")
    p.add_argument("--version", choices=("2.0", "2.3"), default="2.0", help="LTX-2 or LTX-2.3's video VAE")
    p.add_argument("--tiny", action="store_true", help="ltx2-tiny and a small shot (a check of the script)")
    p.add_argument("--work", help="folder for the file, latent and frames (default: a temporary one)")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--step", help=argparse.SUPPRESS)
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="ltx2-conformance-"))
    work.mkdir(parents=True, exist_ok=True)
    path = Path(args.weights) if args.weights else work / "ltx-2-video-vae.safetensors"
    latent_file = work / "latent.npy"
    if args.step:
        row = {"ltx-core": lambda: step_ltx_core(args, path, latent_file, work),
               "farm": lambda: step_farm(args, path, latent_file, work, causal=False),
               "farm-causal": lambda: step_farm(args, path, latent_file, work, causal=True)}[args.step]()
        print(json.dumps(row))
        return 0
    import numpy as np

    if not args.weights:
        released = RELEASED_VAE_23 if args.version == "2.3" else RELEASED_VAE
        write_file(path, TINY_VAE if args.tiny else released, args.seed)
    shape = (8, 3, 4, 6) if args.tiny else LATENT
    np.save(latent_file, np.random.default_rng(args.seed).standard_normal(shape).astype(np.float32))
    argv = ["--dtype", args.dtype, "--device", args.device, "--repeats", str(args.repeats),
            "--work", str(work), "--weights", str(path), "--version", args.version,
            *(["--tiny"] if args.tiny else [])]  # fmt: skip
    rows = [run_step(s, argv, args.timeout) for s in args.steps.split(",")]
    reference = np.load(work / "ltx-core.npy") if (work / "ltx-core.npy").exists() else None
    for row in rows:
        name = {"ltx-core": "ltx-core-tiled.npy"}.get(row["step"], f"{row['step']}.npy")
        if reference is not None and (work / name).exists():
            key = "tiled_" if row["step"] == "ltx-core" else ""  # ltx-core's tiled decode against its own
            row[key + "psnr_db"], row[key + "max_levels"] = psnr(np.load(work / name), reference)
    import platform

    import torch

    result = {"version": args.version, "shot": list(SHOT), "latent": list(shape), "dtype": args.dtype,
              "device": args.device,
              "weights": args.weights or f"RANDOM (seed {args.seed})", "machine": platform.node(),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "date": time.strftime("%Y-%m-%d"), "rows": rows}  # fmt: skip
    print(f"{'step':<12} {'first s':>8} {'warm s':>8} {'peak GiB':>9} {'PSNR vs ltx-core':>17} {'max lv':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['step']:<12} error: {r['error']}")
            continue
        print(f"{r['step']:<12} {r['first_s']:>8.3f} {r['warm_s']:>8.3f} {r['peak_gib']:>9.2f} "
              f"{r.get('psnr_db', float('nan')):>17.2f} {r.get('max_levels', -1):>6}")  # fmt: skip
        if "tiled_warm_s" in r:
            print(f"{'  tiled':<12} {r['tiled_first_s']:>8.3f} {r['tiled_warm_s']:>8.3f} "
                  f"{r['tiled_peak_gib']:>9.2f} {r.get('tiled_psnr_db', float('nan')):>17.2f} "
                  f"{r.get('tiled_max_levels', -1):>6}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
