"""Time a fresh process getting the LTX-2 decoder ready from files: diffusers' ``from_pretrained(folder)
.to(device, dtype)`` beside farm's load (decoder built on the meta device, its tensors read straight onto
the device in the decode dtype), from the diffusers folder and from an original-layout single file.

    python benchmarks/bench_decoder_load.py --device cuda --weights /tmp/ltx2-vae \
        [--single-file /tmp/ltx2.safetensors]

The folder is written first when it does not exist: the default LTX-2 architecture
(``AutoencoderKLLTX2Video()``, RANDOM weights) saved with ``save_pretrained``. ``--single-file`` writes the
same weights, when that file does not exist, as LTX-2's full checkpoint names them (``vae.`` prefix,
Lightricks' names, ``per_channel_statistics``; the decoder's tensors and the statistics only), and adds
farm's load of it. Every measurement runs in a fresh subprocess (imports timed apart from loading);
``--repeat`` runs each several times (the first may read from disk, later ones from the page cache).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def child_diffusers(folder: str, device: str, dtype: str, config: str) -> dict[str, float]:
    t0 = time.perf_counter()
    import diffusers
    import torch

    t1 = time.perf_counter()
    model = diffusers.AutoencoderKLLTX2Video.from_pretrained(folder)  # `config` is the folder's
    t2 = time.perf_counter()
    model.to(device, getattr(torch, dtype))
    _sync(device)
    t3 = time.perf_counter()
    return {"import": t1 - t0, "from_pretrained": t2 - t1, "to(device, dtype)": t3 - t2, "ready": t3 - t1}


def child_farm(path: str, device: str, dtype: str, config: str) -> dict[str, float]:
    t0 = time.perf_counter()
    import diffusers  # noqa: F401 (timed here, as the diffusers child imports it)
    import torch  # noqa: F401

    from farm.decoders import decoder_class, load_decoder, spec_from_json

    t1 = time.perf_counter()
    spec = spec_from_json({"family": "ltx2", "config": config, "weights": {"path": path}, "dtype": dtype})
    spec = decoder_class(spec).check_weights(spec)
    t2 = time.perf_counter()
    load_decoder(spec, device)
    _sync(device)
    t3 = time.perf_counter()
    return {"import": t1 - t0, "check_weights": t2 - t1, "load": t3 - t2, "ready": t3 - t2}


def write_folder(folder: Path, config: str) -> None:
    import diffusers
    import torch

    from farm.decoders.ltx2 import LTX2Decoder

    torch.manual_seed(0)
    started = time.perf_counter()
    diffusers.AutoencoderKLLTX2Video(**LTX2Decoder.named_configs[config]).save_pretrained(folder)
    print(f"wrote {folder} (LTX-2 architecture, RANDOM weights) in {time.perf_counter() - started:.1f} s")


def write_single_file(folder: Path, path: Path, config: str) -> None:
    from safetensors.torch import load_file, save_file

    from farm.decoders import checkpoints as C
    from farm.decoders.ltx2 import LTX2Decoder

    full = LTX2Decoder._full_config(LTX2Decoder.named_configs[config])
    state = {}
    for f in C.weight_files(folder):
        state.update(load_file(str(f)))
    keep = LTX2Decoder.decoder_tensor_shapes(LTX2Decoder.named_configs[config])
    out = {
        "vae." + LTX2Decoder.original_name(k, "ltx-original", full): v for k, v in state.items() if k in keep
    }
    save_file(out, str(path))
    print(f"wrote {path} ({len(out)} tensors, LTX-2 original layout under vae.)")


def run_child(kind: str, path: str, device: str, dtype: str, config: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", kind, "--path", path, "--device", device, "--dtype", dtype,
           "--config", config]  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return {**json.loads(out), "process wall": time.perf_counter() - started}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--weights", default="/tmp/farm-bench-ltx2-vae", help="diffusers folder (written if absent)"
    )
    p.add_argument("--single-file", help="original-layout single file (written if absent) to time as well")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument(
        "--config", default="ltx2", choices=["ltx2", "ltx2-tiny"], help="ltx2-tiny: a CPU check of the script"
    )
    p.add_argument("--child", choices=["diffusers", "farm"], help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = child_diffusers if args.child == "diffusers" else child_farm
        print(json.dumps(fn(args.path, args.device, args.dtype, args.config)))
        return
    folder = Path(args.weights)
    if not folder.exists():
        write_folder(folder, args.config)
    runs = [
        ("diffusers from_pretrained(folder).to", "diffusers", str(folder)),
        ("farm load, folder", "farm", str(folder)),
    ]
    if args.single_file:
        if not Path(args.single_file).exists():
            write_single_file(folder, Path(args.single_file), args.config)
        runs.append(("farm load, original single file", "farm", args.single_file))
    rows = []
    for k in range(args.repeat):
        for label, kind, path in runs:
            rows.append((k, label, run_child(kind, path, args.device, args.dtype, args.config)))
    print(f"\n{args.device}, {args.dtype}; seconds (ready: the decoder on the device, imports excluded)")
    print(f"{'run':>3}  {'what':<38} {'import':>7} {'check':>7} {'ready':>7} {'process':>8}  steps")
    for k, label, t in rows:
        steps = ", ".join(f"{name} {v:.2f}" for name, v in t.items()
                          if name not in ("import", "check_weights", "ready", "process wall"))  # fmt: skip
        print(
            f"{k:>3}  {label:<38} {t['import']:7.2f} {t.get('check_weights', 0.0):7.2f} {t['ready']:7.2f} "
            f"{t['process wall']:8.2f}  {steps}"
        )
    for k in range(args.repeat):
        base = next(t["ready"] for j, label, t in rows if j == k and label.startswith("diffusers"))
        for j, label, t in rows:
            if j == k and label.startswith("farm"):
                print(f"run {k}: {label}: {t['ready'] / base:.2f}x diffusers' ready time")


if __name__ == "__main__":
    main()
