"""Probe: what slows a GPU worker's decodes while the same process blends and sends batches?

In farm renders a streamed (carried) shot's decode tasks took ≈ 20 % longer than the same chunks
decoded alone in a plain process (docs/benchmarks.md). This decodes one LTX-2 shot
in carried chunks in this process, alone and beside one background thread at a time that does what a
GPU worker does beside its decodes, and prints the decode seconds of each:

- ``python``: pure-Python work holding the GIL in slices (the worker's event loop, task bookkeeping,
  serialisation), at the interpreter's switch interval and at a shorter one;
- ``blend``: every 40 ms, a blend-sized tensor turned into 8-bit frames on a side stream and copied to
  (pageable) host memory, as `farm.tasks.blend_batch` does; ``blend-pinned``: the same into pinned
  memory, non-blocking, waited on with an event;
- ``memcpy``: host copies of 41 MB (the GIL released), as sending a batch does.

    python workflows/probe_decode_contention.py --height 704 --width 1216 --chunk 4
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def background(
    kind: str, stop: threading.Event, device: Any, frames: int, h: int, w: int
) -> Callable[[], None]:
    import numpy as np
    import torch

    if kind.startswith("python"):

        def work() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 0.002:  # 2 ms of bytecode, then a short rest
                    sum(range(200))
                time.sleep(0.002)

        return work
    if kind.startswith("blend"):
        pinned = kind == "blend-pinned"
        src = torch.rand(3, frames, h, w, device=device)
        host = torch.empty((frames, h, w, 3), dtype=torch.uint8, pin_memory=pinned)
        stream = torch.cuda.Stream(device=device)

        def work() -> None:
            while not stop.is_set():
                with torch.cuda.stream(stream):
                    frames8 = (src * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 3, 0)
                    if pinned:
                        host.copy_(frames8, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(stream)
                        event.synchronize()
                    else:
                        host.copy_(frames8.cpu())
                time.sleep(0.04)

        return work
    if kind == "memcpy":
        a = np.ones(41 * 2**20, dtype=np.uint8)
        b = np.empty_like(a)

        def work() -> None:
            while not stop.is_set():
                np.copyto(b, a)
                time.sleep(0.005)

        return work
    raise ValueError(kind)


def main() -> None:
    import numpy as np
    import torch

    from farm.decoders import load_decoder
    from farm.render import synth_spec

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--decoder", default="ltx2")
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1216)
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--chunk", type=int, default=4, help="latent frames per carried chunk (0: whole)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kinds", nargs="*", default=["alone", "python", "python-0.5ms", "blend", "blend-pinned",
                                                  "memcpy"])  # fmt: skip
    args = p.parse_args()
    decoder = load_decoder(synth_spec(args.decoder).to_json(), "cuda")
    g = decoder.geometry
    lf = (args.frames - 1) // g.temporal_scale + 1
    latent = torch.randn(
        decoder.latent_channels, lf, args.height // g.spatial_scale, args.width // g.spatial_scale
    )

    def decode() -> None:
        if not args.chunk:
            decoder.decode(latent)
            return
        state = None
        for start in range(0, lf, args.chunk):
            _, state = decoder.decode_carried(latent[:, start : start + args.chunk], state)

    decode()
    torch.cuda.synchronize()
    interval = sys.getswitchinterval()
    for kind in args.kinds:
        stop = threading.Event()
        thread = None
        if kind != "alone":
            work = background(kind, stop, torch.device("cuda"), 16, args.height, args.width)
            thread = threading.Thread(target=work, daemon=True)
            thread.start()
        sys.setswitchinterval(0.0005 if kind.endswith("0.5ms") else interval)
        times = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            decode()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        stop.set()
        if thread is not None:
            thread.join()
        sys.setswitchinterval(interval)
        print(
            f"{kind:>14}: decode {np.median(times):.3f} s (runs {', '.join(f'{t:.3f}' for t in times)})",
            flush=True,
        )


if __name__ == "__main__":
    main()
