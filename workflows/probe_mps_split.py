"""Probe: can one GPU stand in for two, by CUDA MPS giving each worker process half its SMs?

`nvidia-h200-x2` is often not lent; one H200 split by MPS (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) runs two
processes' kernels at the same time on disjoint shares of the SMs, where two processes without MPS take
turns on the whole GPU. This probe measures what such an emulation is worth before farm's renders use it:

1. the plain decode (farm's eager decoder, random weights) of one tile on the whole GPU, without MPS;
2. under MPS: one process at P % of the SMs alone, then two processes at P % each decoding at once (what
   two emulated GPUs decode side by side, measured rather than assumed: bandwidth and L2 stay shared);
3. a CUDA tensor shared by IPC handle between two MPS clients (farm's cross-worker pieces).

The MPS control daemon runs with its pipe and log folders under /tmp and is told to quit at the end; the
GPU's compute mode and other settings are left as they are.

    python workflows/probe_mps_split.py --latent 128,16,22,21 --percent 50 --reps 5 --out-json $OUT/mps.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MPS_DIRS = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/farm-mps/pipe", "CUDA_MPS_LOG_DIRECTORY": "/tmp/farm-mps/log"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def child(args: argparse.Namespace) -> None:
    """Decode one latent `reps` times after a barrier; print the seconds as one JSON line."""
    import torch

    from farm.decoders import load_decoder
    from farm.render import synth_spec

    decoder = load_decoder(synth_spec("ltx2").to_json(), "cuda", compile=False)
    shape = tuple(int(v) for v in args.latent.split(","))
    latent = torch.randn(*shape)
    decoder.decode(latent, origin=(0, 0, 0))
    torch.cuda.synchronize()
    if args.barrier:
        Path(args.barrier, f"ready-{os.getpid()}").touch()
        while not Path(args.barrier, "go").exists():
            time.sleep(0.001)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        decoder.decode(latent, origin=(0, 0, 0))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"pid": os.getpid(), "times": times}), flush=True)


def run_children(n: int, args: argparse.Namespace, env: dict[str, str], barrier: Path) -> list[list[float]]:
    shutil.rmtree(barrier, ignore_errors=True)
    barrier.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--child", "--latent", args.latent, "--reps", str(args.reps),
           "--barrier", str(barrier)]  # fmt: skip
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    deadline = time.time() + 300
    while len(list(barrier.glob("ready-*"))) < n and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.05)
    (barrier / "go").touch()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        results.append(json.loads(line[7:])["times"] if line else [])
    return results


def _share_child(q: Any, r: Any) -> None:
    t = q.get()
    r.put(float(t.sum()))


def ipc_check() -> dict[str, Any]:
    """A CUDA tensor made in this process, opened by a spawned one through torch's CUDA IPC reduction."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_share_child, args=(q, r))
    p.start()
    t = torch.arange(1_000_000, device="cuda", dtype=torch.float32)
    q.put(t)
    got = r.get(timeout=120)
    p.join(timeout=60)
    return {"expected": float(t.sum()), "got": got, "same": got == float(t.sum())}


@contextlib.contextmanager
def mps_daemon() -> Iterator[dict[str, str]]:
    """The MPS control daemon, its folders under /tmp, told to quit on exit (also when the block fails);
    yields the environment its clients need (add ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a share)."""
    env = dict(os.environ, **MPS_DIRS)
    for d in MPS_DIRS.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    started = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    log(f"MPS daemon started: exit {started.returncode} {started.stderr.strip()}")
    try:
        yield env
    finally:
        quit_ = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        log(f"MPS daemon told to quit: exit {quit_.returncode}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", action="store_true")
    p.add_argument("--latent", default="128,16,22,21", help="C,F,H,W of the decoded latent")
    p.add_argument("--percent", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--barrier", default="")
    p.add_argument("--out-json", default="")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    out: dict[str, Any] = {"latent": args.latent, "percent": args.percent}
    query = ["nvidia-smi", "--query-gpu=name,compute_mode,driver_version", "--format=csv,noheader"]
    smi = subprocess.run(query, capture_output=True, text=True, timeout=30)
    out["gpu"] = smi.stdout.strip()
    out["mps_control"] = shutil.which("nvidia-cuda-mps-control")
    log(f"gpu {out['gpu']}; MPS control {out['mps_control']}")
    base = dict(os.environ)
    out["whole_gpu_one"] = run_children(1, args, base, Path("/tmp/farm-mps/barrier"))
    out["whole_gpu_two"] = run_children(2, args, base, Path("/tmp/farm-mps/barrier"))
    log(f"whole GPU, one process: {out['whole_gpu_one']}; two at once: {out['whole_gpu_two']}")
    if out["mps_control"]:
        with mps_daemon() as env:
            share = dict(env, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(args.percent))
            out["mps_full_one"] = run_children(1, args, env, Path("/tmp/farm-mps/barrier"))
            out["mps_share_one"] = run_children(1, args, share, Path("/tmp/farm-mps/barrier"))
            out["mps_share_two"] = run_children(2, args, share, Path("/tmp/farm-mps/barrier"))
            log(f"MPS whole: {out['mps_full_one']}; {args.percent}% alone: {out['mps_share_one']}; "
                f"two at {args.percent}%: {out['mps_share_two']}")  # fmt: skip
            path = f"{Path(__file__).parent}:{env.get('PYTHONPATH', '')}"
            ipc = subprocess.run([sys.executable, "-c", "import probe_mps_split as m; print(m.ipc_check())"],
                                 env=dict(share, PYTHONPATH=path), capture_output=True, text=True,
                                 timeout=180)  # fmt: skip
            out["mps_ipc"] = [ipc.returncode, ipc.stdout[-500:], ipc.stderr[-1500:]]
            log(f"IPC between MPS clients: {out['mps_ipc']}")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
