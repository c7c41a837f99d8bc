"""3-D neighbourhood attention as one fused Triton kernel: the window is computed in the kernel.

Same definition as `farm.decoders.ltx2_diffusion.neighborhood_attention` (NATTEN's and diffusers'): along an
axis of ``n`` positions the query at ``i`` sees keys ``[s, s + k)`` with ``s = clamp(i - k // 2, 0, n - k)``.
Each program takes a 3-D tile of queries of one head and walks the keys' halo (the union of its queries'
windows, at most ``tile + k - 1`` an axis) in runs of ``BLOCK_K`` keys in raster order, with an online softmax
in float32; a key outside a query's window is masked from the query's row in registers. Nothing is gathered or
materialised: no halo copies of K and V, no bias tensor; memory is the output alone.

Queries may be a run of frames inside a larger key grid (``q_frame_offset``): a chunk of frames attends to the
keys of its windows, which is how a decode holds one chunk's Q/K/V at a time
(`farm.decoders.ltx2_diffusion.device.ltx2_diffusion_chunked`). A window is computed against the key grid's
own frames; a caller gives the key frames ``[s(t0), s(t1 - 1) + k)`` of the whole grid, and the windows are
then the whole grid's.

Triton runs on CUDA devices, and on the CPU under ``TRITON_INTERPRET=1`` (numpy; the tests check the kernel
against the reference there). Import this module only where `available()` says so.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from typing import Any

import torch

# Queries a program holds, and keys it scores at once (measured on an H200, docs/performance.md).
BLOCK_Q = 128
BLOCK_K = 64


@functools.cache
def available() -> bool:
    """Whether the kernel can run: Triton installed (for CUDA, or its interpreter on the CPU). Triton is
    imported only when the kernel is first built: its interpreter is chosen by ``TRITON_INTERPRET`` at
    import."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def usable_on(device: Any) -> bool:
    """The kernel runs on tensors of `device`: a CUDA device with Triton, or any device interpreted."""
    if not available():
        return False
    return interpreted() or torch.device(device).type == "cuda"


Shape = tuple[int, int, int]


def query_tile(grid: Shape, kernel: Shape, queries: int) -> Shape:
    """The tile of `queries` queries (powers of two an axis) whose halo holds the fewest keys per query."""
    best: tuple[float, tuple[int, int, int]] | None = None
    sizes = [1, 2, 4, 8, 16, 32, 64, 128]
    for tile in itertools.product(sizes, repeat=3):
        if math.prod(tile) != queries:
            continue
        held = math.prod(min(b, n) for b, n in zip(tile, grid, strict=True))
        halo = math.prod(min(b, n) + min(k, n) - 1 for b, n, k in zip(tile, grid, kernel, strict=True))
        score = halo / held + (0.0 if held == queries else 1e3)  # a tile the grid cannot fill wastes lanes
        if best is None or score < best[0]:
            best = (score, tile)  # type: ignore[assignment]
    assert best is not None
    return best[1]


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def na3d_forward(
        Q, K, V, O,  # noqa: E741
        sqb, sqt, sqh, sqw, sqn,
        skb, skt, skh, skw, skn,
        svb, svt, svh, svw, svn,
        sob, sot, soh, sow, son,
        heads, q_frames, q_offset, frames, height, width, scale, shift_h, shift_w,
        KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
        BT: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
        D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
        IEEE: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)
        bn = tl.program_id(1)  # offsets along t and b in int64: a stage-5 grid passes 2**31 elements
        b = bn // heads
        n = bn % heads
        tiles_h = (height + shift_h + BH - 1) // BH
        tiles_w = (width + shift_w + BW - 1) // BW
        t0 = (tile // (tiles_h * tiles_w)) * BT + q_offset  # in the key grid's frames
        h0 = ((tile // tiles_w) % tiles_h) * BH - shift_h  # the first tiles may start before the grid
        w0 = (tile % tiles_w) * BW - shift_w
        qi = tl.arange(0, BLOCK_Q)
        qt = t0 + qi // (BH * BW)
        qh = h0 + (qi // BW) % BH
        qw = w0 + qi % BW
        q_valid = ((qi < BT * BH * BW) & (qt < q_offset + q_frames) & (qh >= 0) & (qh < height)
                   & (qw >= 0) & (qw < width))  # fmt: skip
        # windows of the queries (padded queries take the nearest real one's)
        qt = tl.minimum(qt, q_offset + q_frames - 1)
        qh = tl.maximum(tl.minimum(qh, height - 1), 0)
        qw = tl.maximum(tl.minimum(qw, width - 1), 0)
        st = tl.minimum(tl.maximum(qt - KT // 2, 0), frames - KT)
        sh = tl.minimum(tl.maximum(qh - KH // 2, 0), height - KH)
        sw = tl.minimum(tl.maximum(qw - KW // 2, 0), width - KW)
        # the halo: from the first query's window start to the last query's window end, per axis
        t_last = tl.minimum(t0 + BT - 1, q_offset + q_frames - 1)
        h_last = tl.minimum(h0 + BH - 1, height - 1)
        w_last = tl.minimum(w0 + BW - 1, width - 1)
        ht0 = tl.minimum(tl.maximum(t0 - KT // 2, 0), frames - KT)
        hh0 = tl.minimum(tl.maximum(h0 - KH // 2, 0), height - KH)
        hw0 = tl.minimum(tl.maximum(w0 - KW // 2, 0), width - KW)
        halo_t = tl.minimum(tl.maximum(t_last - KT // 2, 0), frames - KT) + KT - ht0
        halo_h = tl.minimum(tl.maximum(h_last - KH // 2, 0), height - KH) + KH - hh0
        halo_w = tl.minimum(tl.maximum(w_last - KW // 2, 0), width - KW) + KW - hw0

        d = tl.arange(0, BLOCK_D)
        d_valid = d < D
        q_rows = Q + b.to(tl.int64) * sqb + (qt - q_offset).to(tl.int64) * sqt + qh * sqh + qw * sqw + n * sqn
        q = tl.load(q_rows[:, None] + d[None, :], mask=q_valid[:, None] & d_valid[None, :], other=0.0)
        k_base = K + b.to(tl.int64) * skb + n * skn
        v_base = V + b.to(tl.int64) * svb + n * svn

        m_i = tl.full([BLOCK_Q], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
        qk_scale = scale * 1.4426950408889634  # log2(e): exp2 below
        halo_hw = halo_h * halo_w
        total = halo_t * halo_hw
        for start in range(0, total, BLOCK_K):
            lin = start + tl.arange(0, BLOCK_K)
            k_valid = lin < total
            kt = ht0 + lin // halo_hw
            kh = hh0 + (lin // halo_w) % halo_h
            kw = hw0 + lin % halo_w
            kv_mask = k_valid[:, None] & d_valid[None, :]
            k_rows = k_base + kt.to(tl.int64) * skt + kh * skh + kw * skw
            v_rows = v_base + kt.to(tl.int64) * svt + kh * svh + kw * svw
            k = tl.load(k_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            seen = (
                k_valid[None, :]
                & (kt[None, :] >= st[:, None]) & (kt[None, :] < st[:, None] + KT)
                & (kh[None, :] >= sh[:, None]) & (kh[None, :] < sh[:, None] + KH)
                & (kw[None, :] >= sw[:, None]) & (kw[None, :] < sw[:, None] + KW)
            )  # fmt: skip
            s = tl.where(seen, s * qk_scale, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.where(seen, tl.exp2(s - m_new[:, None]), 0.0)
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / l_i[:, None]
        o_rows = O + b.to(tl.int64) * sob + (qt - q_offset).to(tl.int64) * sot + qh * soh + qw * sow + n * son
        o_mask = q_valid[:, None] & d_valid[None, :]
        tl.store(o_rows[:, None] + d[None, :], out.to(O.dtype.element_ty), mask=o_mask)

    return na3d_forward


def neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel: tuple[int, int, int],
    *,
    scale: float | None = None,
    q_frame_offset: int = 0,
    grid_origin: tuple[int, int] = (0, 0),
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    tile: tuple[int, int, int] | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of every query to its window: ``[B, T, H, W, heads, d]`` in and out. `key` and `value`
    may hold more frames than `query`: the queries are then frames ``q_frame_offset + [0, T)`` of theirs.

    `grid_origin`: the row and column of the grid's first query in a larger grid it was cut from (a spatial
    tile's place in the shot). The kernel's tiles of queries are laid on that larger grid's lattice, so a
    query away from the cut sees its keys in the same runs, and gets the same bits, as in the larger grid."""
    batch, q_frames, height, width, heads, dim = query.shape
    frames = key.shape[1]
    if key.shape != value.shape or key.shape[0] != batch or key.shape[2:] != query.shape[2:]:
        raise ValueError(f"keys {tuple(key.shape)} and values {tuple(value.shape)} do not fit queries "
                         f"{tuple(query.shape)}")  # fmt: skip
    if not 0 <= q_frame_offset <= frames - q_frames:
        raise ValueError(f"queries' frames {q_frame_offset}+{q_frames} lie outside the keys' {frames}")
    kt, kh, kw = (min(k, n) for k, n in zip(kernel, (frames, height, width), strict=True))
    tile = tile or query_tile((q_frames, height, width), (kt, kh, kw), block_q)
    query, key, value = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value))
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    shift_h, shift_w = grid_origin[0] % tile[1], grid_origin[1] % tile[2]
    lattice = (q_frames, height + shift_h, width + shift_w)
    tiles = math.prod(-(-n // b) for n, b in zip(lattice, tile, strict=True))
    _kernel()[(tiles, batch * heads)](
        query, key, value, out,
        *query.stride()[:5], *key.stride()[:5], *value.stride()[:5], *out.stride()[:5],
        heads, q_frames, q_frame_offset, frames, height, width,
        float(dim**-0.5 if scale is None else scale), shift_h, shift_w,
        KT=kt, KH=kh, KW=kw, BT=tile[0], BH=tile[1], BW=tile[2],
        D=dim, BLOCK_D=max(16, 1 << (dim - 1).bit_length()), BLOCK_Q=block_q, BLOCK_K=block_k,
        IEEE=query.dtype == torch.float32, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
