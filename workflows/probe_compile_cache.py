"""Why does a fresh process still compile the decoder for tens of seconds? Compiles farm's decoder in
fresh child processes with a shared (or fresh) inductor cache folder, optionally saving and loading
torch's portable cache artifacts, and prints each child's first-call seconds and inductor counters.

    python workflows/probe_compile_cache.py --work /tmp/probe --out-json probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    import torch
    from torch._dynamo.utils import counters

    from farm.decoders import load_decoder
    from farm.render import synth_spec

    if args.load_artifacts:
        t0 = time.perf_counter()
        info = torch.compiler.load_cache_artifacts(Path(args.load_artifacts).read_bytes())
        loaded = time.perf_counter() - t0
    else:
        info, loaded = None, 0.0
    spec = synth_spec(args.decoder).to_json()
    decoder = load_decoder(spec, "cuda", compile=False if args.mode == "eager" else args.mode)
    g = decoder.geometry
    shape = [int(x) for x in args.latent.split(",")]
    latent = torch.randn(getattr(decoder, "latent_channels", 128), *shape)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    decoder.decode(latent, origin=(0, 0, 0))
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    decoder.decode(latent, origin=(0, 0, 0))
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    saved = None
    if args.save_artifacts:
        got = torch.compiler.save_cache_artifacts()
        if got is not None:
            Path(args.save_artifacts).write_bytes(got[0])
            saved = len(got[0])
    out = {
        "first_s": first,
        "second_s": second,
        "artifacts_loaded_s": loaded,
        "artifacts_saved_bytes": saved,
        "loaded_info": str(info)[:400],
        "geometry": str(g),
        "counters": {
            k: dict(v)
            for k, v in counters.items()
            if k in ("inductor", "aot_autograd", "graph_break", "stats")
        },
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        # where a compiled first call's seconds went (dynamo's tracing, AOT, inductor, cache loads)
        "compile_times": torch._dynamo.utils.compile_times(repr="str")[-3000:],
    }
    print("RESULT " + json.dumps(out))


def run_child(
    name: str, env_extra: dict, extra: list[str], args: argparse.Namespace, mode: str | None = None
) -> dict:
    env = dict(os.environ, **env_extra)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--decoder",
        args.decoder,
        "--latent",
        args.latent,
        "--mode",
        mode or args.mode,
        *extra,
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    res: dict = {"name": name, "wall_s": wall, "rc": p.returncode}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res.update(json.loads(line[7:]))
    if p.returncode:
        res["stderr"] = p.stderr[-3000:]
    print(
        f"{name}: wall {wall:.1f} s first call {res.get('first_s', -1):.1f} s "
        f"inductor {res.get('counters', {}).get('inductor', {}).get('fxgraph_cache_hit')} hits "
        f"{res.get('counters', {}).get('inductor', {}).get('fxgraph_cache_miss')} misses",
        flush=True,
    )
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--decoder", default="ltx2")
    p.add_argument("--latent", default="16,22,38", help="latent frames,height,width")
    p.add_argument("--mode", default="default", help="a torch.compile mode, or eager (no compile)")
    p.add_argument("--load-artifacts", default=None)
    p.add_argument("--save-artifacts", default=None)
    p.add_argument("--work", default="/tmp/probe-compile")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--out-json", default=None)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    d1, d2 = str(work / "cache1"), str(work / "cache2")
    art = str(work / "artifacts.bin")
    rows = [
        run_child(
            "cold, cache1, save artifacts", {"TORCHINDUCTOR_CACHE_DIR": d1}, ["--save-artifacts", art], args
        ),
        run_child("warm cache1", {"TORCHINDUCTOR_CACHE_DIR": d1}, [], args),
        # what any first call pays in a fresh process (CUDA libraries, cuDNN's choices): not compilation
        run_child("eager, fresh process", {"TORCHINDUCTOR_CACHE_DIR": d1}, [], args, mode="eager"),
        run_child(
            "fresh cache2 + artifacts", {"TORCHINDUCTOR_CACHE_DIR": d2}, ["--load-artifacts", art], args
        ),
    ]
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
