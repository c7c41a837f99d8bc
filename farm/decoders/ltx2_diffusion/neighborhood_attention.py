"""3-D neighbourhood attention as blocks of queries against their keys' halo, through fused SDPA kernels.

Each query of a ``T x H x W`` grid attends to the ``kt x kh x kw`` window of keys centred on it, shifted
inward at the borders (NATTEN's and diffusers' definition: along an axis of ``n`` positions a query at
``i`` sees ``[s, s + k)`` with ``s = clamp(i - k // 2, 0, n - k)``).

diffusers states the window as a FlexAttention block mask over the raster order of the grid: without
``torch.compile`` it materialises every score, and a compiled mask over millions of tokens takes longer to
build than the decode. Here the grid is cut into 3-D blocks of queries (``block``); every query of a block
looks inside one halo of at most ``b + k - 1`` positions an axis, so a block is one dense attention call of
``prod(b)`` queries against ``prod(b + k - 1)`` keys, with an additive bias that keeps each query's own
window (one bias shared by the blocks no border shifts). All blocks of a chunk go to
`torch.nn.functional.scaled_dot_product_attention` as one batch (a fused kernel on a GPU), so memory grows
with the chunk, never with the grid squared. The result equals the windowed definition up to float
summation order.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Halo keys (x heads x head dim) gathered for one SDPA call: bounds a call's K and V copies and its mask.
DEFAULT_CHUNK_ELEMENTS = 1 << 27
# Queries a block holds at most (512 ran LTX-2.5's stage 5 on an H200 in under half the time of 64,
# docs/performance.md).
BLOCK_QUERIES = 512


@dataclass(frozen=True)
class AxisBlocks:
    """One axis of the grid cut into blocks: ``count`` blocks of ``size`` queries (the last padded), each
    reading the keys ``halo_start[j] + arange(halo)``; ``mask[j, i, l]``: query ``i`` of block ``j`` sees
    halo key ``l``."""

    size: int
    count: int
    halo: int
    halo_index: torch.Tensor  # [count, halo] key positions
    mask: torch.Tensor  # [count, size, halo] bool


def axis_blocks(n: int, kernel: int, size: int, device: Any) -> AxisBlocks:
    import torch

    k, b = min(kernel, n), min(size, n)
    count = -(-n // b)
    halo = min(b + k - 1, n)
    queries = torch.arange(count * b, device=device).clamp(max=n - 1).view(count, b)  # padded queries repeat
    window_start = (queries - k // 2).clamp(0, n - k)  # [count, b]
    halo_start = window_start[:, :1].clamp(max=n - halo)  # [count, 1]
    halo_index = halo_start + torch.arange(halo, device=device)  # [count, halo]
    offset = halo_index[:, None, :] - window_start[:, :, None]  # [count, b, halo]
    return AxisBlocks(b, count, halo, halo_index, (offset >= 0) & (offset < k))


def block_shape(grid: tuple[int, ...], kernel: tuple[int, ...], queries: int) -> tuple[int, ...]:
    """The block of the most queries up to `queries` (powers of two an axis, cut to the grid) whose halo
    holds the fewest keys. Large blocks pay: each key is gathered once per block that reads it, and the
    gathers cost more than the attention's extra scores (docs/performance.md)."""
    best: tuple[tuple[int, int], tuple[int, ...]] | None = None
    sizes = [sorted({min(s, n) for s in (1, 2, 4, 8, 16, 32, 64)}) for n in grid]
    for block in itertools.product(*sizes):
        held = math.prod(block)
        if held > queries:
            continue
        halo = math.prod(min(b + min(k, n) - 1, n) for b, n, k in zip(block, grid, kernel, strict=True))
        score = (-held, halo)
        if best is None or score < best[0]:
            best = (score, block)
    assert best is not None
    return best[1]


def interior(axis: AxisBlocks) -> tuple[int, int]:
    """The blocks ``[lo, hi)`` whose windows are not shifted by a border: they all see their halo alike."""
    middle = axis.count // 2
    same = (axis.mask == axis.mask[middle]).flatten(1).all(dim=1).tolist()
    lo = hi = middle
    while lo > 0 and same[lo - 1]:
        lo -= 1
    while hi < axis.count and same[hi]:
        hi += 1
    return lo, hi


def chunk_boxes(
    axes: tuple[AxisBlocks, AxisBlocks, AxisBlocks], block_elements: int, chunk_elements: int
) -> list[tuple[tuple[int, int], tuple[int, int], tuple[int, int], bool]]:
    """Boxes of blocks, one SDPA call each: the interior box (``True``: one shared mask) and the border
    boxes around it, each cut along t, then h, so a call gathers about `chunk_elements` halo elements."""
    segments = []
    for axis in axes:
        lo, hi = interior(axis)
        parts = ((0, lo), (lo, hi), (hi, axis.count))
        segments.append([(a, b, (a, b) == (lo, hi)) for a, b in parts if b > a])
    boxes = []
    for (t0, t1, it), (h0, h1, ih), (w0, w1, iw) in itertools.product(*segments):
        row = (h1 - h0) * (w1 - w0) * block_elements  # one block row along t
        rows_t = max(1, chunk_elements // row)
        rows_h = (h1 - h0) if rows_t > 1 else max(1, chunk_elements // ((w1 - w0) * block_elements))
        for a in range(t0, t1, rows_t):
            for b in range(h0, h1, rows_h):
                boxes.append(((a, min(a + rows_t, t1)), (b, min(b + rows_h, h1)), (w0, w1), it and ih and iw))
    return boxes


Ranges = tuple[tuple[int, int], ...]  # [start, stop) of blocks along each axis


def halos(x: torch.Tensor, axes: tuple[AxisBlocks, ...], ranges: Ranges) -> torch.Tensor:
    """The keys (or values) ``[B, T, H, W, heads, d]`` each block of `ranges` reads, gathered as
    ``[B * blocks, heads, halo keys, d]``."""
    ti, hi, wi = (axis.halo_index[a:b] for axis, (a, b) in zip(axes, ranges, strict=True))
    gathered = x[:, ti[:, None, None, :, None, None], hi[None, :, None, None, :, None],
                 wi[None, None, :, None, None, :]]  # fmt: skip
    batch, *_, heads, dim = gathered.shape  # [B, ct, ch, cw, Lt, Lh, Lw, heads, d]
    blocks = math.prod(gathered.shape[1:4])
    return gathered.permute(0, 1, 2, 3, 7, 4, 5, 6, 8).reshape(batch * blocks, heads, -1, dim)


def window_bias(axes: tuple[AxisBlocks, ...], ranges: Ranges, dtype: Any) -> torch.Tensor:
    """0 where a query of a block of `ranges` sees a halo key, -inf elsewhere: ``[blocks, 1, queries,
    keys]``. An additive bias: the kernels read it as it is, where a boolean mask is converted per call."""
    import torch

    mt, mh, mw = (axis.mask[a:b] for axis, (a, b) in zip(axes, ranges, strict=True))
    mask = (mt[:, None, None, :, None, None, :, None, None]
            & mh[None, :, None, None, :, None, None, :, None]
            & mw[None, None, :, None, None, :, None, None, :])  # fmt: skip
    blocks, queries = math.prod(mask.shape[:3]), math.prod(mask.shape[3:6])
    mask = mask.reshape(blocks, 1, queries, -1)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def neighborhood_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kernel: tuple[int, int, int],
    *,
    block: tuple[int, int, int] | None = None,
    scale: float | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Attention of every query to its window: ``[B, T, H, W, heads, d]`` in and out."""
    import torch
    import torch.nn.functional as F

    batch, t, h, w, heads, dim = query.shape
    grid = (t, h, w)
    sizes = block or block_shape(grid, kernel, BLOCK_QUERIES)
    at, ah, aw = (axis_blocks(n, k, b, query.device) for n, k, b in zip(grid, kernel, sizes, strict=True))
    queries_per_block = at.size * ah.size * aw.size
    keys_per_block = at.halo * ah.halo * aw.halo

    padded = F.pad(query, (0, 0, 0, 0, 0, aw.count * aw.size - w, 0, ah.count * ah.size - h,
                           0, at.count * at.size - t))  # fmt: skip
    blocks = padded.reshape(batch, at.count, at.size, ah.count, ah.size, aw.count, aw.size, heads, dim)
    blocks = blocks.permute(0, 1, 3, 5, 7, 2, 4, 6, 8)  # [B, nt, nh, nw, heads, bt, bh, bw, d]
    out = torch.empty_like(blocks)

    block_elements = keys_per_block * heads * dim * batch
    shared_bias = None  # the interior's, built once for all its chunks
    for (t0, t1), (h0, h1), (w0, w1), shared in chunk_boxes((at, ah, aw), block_elements, chunk_elements):
        ranges = ((t0, t1), (h0, h1), (w0, w1))
        n_blocks = (t1 - t0) * (h1 - h0) * (w1 - w0)
        if not shared:
            bias = window_bias((at, ah, aw), ranges, query.dtype).repeat(batch, 1, 1, 1)
        elif shared_bias is None:
            bias = shared_bias = window_bias((at, ah, aw), tuple((i, i + 1) for i, _ in ranges), query.dtype)
        else:
            bias = shared_bias
        q = blocks[:, t0:t1, h0:h1, w0:w1].reshape(batch * n_blocks, heads, queries_per_block, dim)
        k, v = (halos(x, (at, ah, aw), ranges) for x in (key, value))
        with attention_backends(query.device):
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        out[:, t0:t1, h0:h1, w0:w1] = attended.reshape(batch, t1 - t0, h1 - h0, w1 - w0, heads, at.size,
                                                       ah.size, aw.size, dim)  # fmt: skip
    out = out.permute(0, 1, 5, 2, 6, 3, 7, 4, 8).reshape(
        batch, at.count * at.size, ah.count * ah.size, aw.count * aw.size, heads, dim
    )
    return out[:, :t, :h, :w]


def attention_backends(device: Any) -> Any:
    """On a GPU, cuDNN's fused attention first (the fastest with a bias on an H200, docs/performance.md),
    then the memory-efficient kernel; elsewhere PyTorch's own choice."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch before 2.6: no priorities, the kernels allowed in torch's own order
        return sdpa_kernel(order)


class BlockedNeighborhoodAttention:
    """A processor for diffusers' `LTX2VideoVaeNeighborhoodAttention` that runs `neighborhood_attention`."""

    def __init__(self, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> None:
        self.chunk_elements = chunk_elements

    def __call__(self, attn: Any, hidden_states: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        b, t, h, w, _ = hidden_states.shape
        query, key, value = attn.project_qkv(hidden_states)  # [B, T, H, W, heads, d], query pre-scaled
        out = neighborhood_attention(
            query, key, value, tuple(attn.kernel_size), scale=1.0, chunk_elements=self.chunk_elements
        )
        return attn.to_out[0](out.reshape(b, t, h, w, attn.heads * attn.head_dim))


def use_blocked_attention(model: Any, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> None:
    """Every neighbourhood attention of `model` through `BlockedNeighborhoodAttention`; no block masks."""
    processor = BlockedNeighborhoodAttention(chunk_elements)
    for module in model.modules():
        if type(module).__name__ == "LTX2VideoVaeNeighborhoodAttention":
            module.processor = processor
            module.build_block_mask = lambda hidden_states: None
