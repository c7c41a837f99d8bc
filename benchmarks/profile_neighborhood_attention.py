"""Where the blocked neighbourhood attention's time goes at the diffusion decoder's stage-5 shape.

Times, on one GPU, for one 121x704x1216 shot's stage 5 (grid 121x176x304, 4 heads of 64, an 11x11x11
window, bf16): the whole call at several block shapes and chunk sizes, and its parts (gathering the
keys' halos, building the mask, the SDPA call) for one chunk, scaled to the grid.

    python benchmarks/profile_neighborhood_attention.py [--grid 121,176,304] [--out profile.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, repeats: int = 3) -> float:  # noqa: ANN001
    import torch

    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from farm.decoders import neighborhood_attention as na

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="121,176,304")
    p.add_argument("--kernel", default="11,11,11")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--out")
    args = p.parse_args()
    grid = tuple(int(n) for n in args.grid.split(","))
    kernel = tuple(int(n) for n in args.kernel.split(","))
    q, k, v = (torch.randn(1, *grid, args.heads, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    rows: list[dict] = []

    def record(name: str, seconds: float, **extra: object) -> None:
        rows.append({"name": name, "s": seconds, **extra})
        print(f"{name}: {seconds:.4f} s {extra or ''}", flush=True)

    for block in ((4, 4, 4), (4, 4, 8), (8, 8, 8)):
        for chunk in (1 << 27, 1 << 29):
            try:
                s = timed(lambda b=block, c=chunk: na.neighborhood_attention(q, k, v, kernel, block=b,
                                                                             chunk_elements=c))  # fmt: skip
                record(f"whole call, block {block}, chunk 2^{chunk.bit_length() - 1}", s)
            except torch.OutOfMemoryError:
                record(f"whole call, block {block}, chunk 2^{chunk.bit_length() - 1}", float("nan"), oom=True)
            torch.cuda.empty_cache()

    # the parts, for one chunk of whole block rows along t at block (4, 4, 4)
    block = (4, 4, 4)
    at, ah, aw = (na.axis_blocks(n, kk, b, "cuda") for n, kk, b in zip(grid, kernel, block, strict=True))
    rows_t = 4
    ti, hi, wi = at.halo_index[:rows_t], ah.halo_index, aw.halo_index
    gather = (slice(None), ti[:, None, None, :, None, None], hi[None, :, None, None, :, None],
              wi[None, None, :, None, None, :])  # fmt: skip
    n_blocks = rows_t * ah.count * aw.count
    qb, kb = 64, at.halo * ah.halo * aw.halo
    scale = at.count / rows_t

    def halo() -> torch.Tensor:
        return k[gather].permute(0, 1, 2, 3, 7, 4, 5, 6, 8).reshape(n_blocks, args.heads, kb, 64)

    def mask() -> torch.Tensor:
        mt, mh, mw = at.mask[:rows_t], ah.mask, aw.mask
        m = (mt[:, None, None, :, None, None, :, None, None] & mh[None, :, None, None, :, None, None, :, None]
             & mw[None, None, :, None, None, :, None, None, :])  # fmt: skip
        return m.reshape(n_blocks, 1, qb, kb)

    record("part: gather K halo (x2 for V), per grid", timed(halo) * scale, blocks=n_blocks, keys=kb)
    record("part: build bool mask, per grid", timed(mask) * scale)
    K, V, M = halo(), halo(), mask()
    Q = torch.randn(n_blocks, args.heads, qb, 64, device="cuda", dtype=torch.bfloat16)
    bias = torch.zeros(M.shape, device="cuda", dtype=torch.bfloat16).masked_fill_(~M, float("-inf"))
    flops = 4 * n_blocks * args.heads * qb * kb * 64
    backends = (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("math", SDPBackend.MATH))  # fmt: skip
    for name, backend in backends:
        for label, m in (("bool mask", M), ("bf16 bias", bias), ("no mask", None)):
            try:
                with sdpa_kernel([backend]):
                    s = timed(lambda m=m: F.scaled_dot_product_attention(Q, K, V, attn_mask=m))
                record(f"part: sdpa {name}, {label}, per grid", s * scale, tflops=flops / s / 1e12)
            except Exception as exc:  # noqa: BLE001  (a backend that refuses the inputs)
                record(f"part: sdpa {name}, {label}", float("nan"), error=str(exc)[:120])
    # interior blocks share one mask: a [1, 1, q, k] broadcast
    shared = M[n_blocks // 2 : n_blocks // 2 + 1]
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        s = timed(lambda: F.scaled_dot_product_attention(Q, K, V, attn_mask=shared))
    record("part: sdpa efficient, one shared bool mask, per grid", s * scale, tflops=flops / s / 1e12)
    if args.out:
        Path(args.out).write_text(json.dumps({"grid": grid, "kernel": kernel, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
