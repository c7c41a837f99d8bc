"""Memory and window budgets: what a plan's tiles need of a GPU and of a worker's host memory, the
default window (decoded tiles in flight) and the warnings when a plan may not fit."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from farm.decoders import DecoderSpec, decoder_class
from farm.decoders.base import VideoDecoder, human_bytes
from farm.errors import FarmError
from farm.planning.tiling import ChunkSize, Geometry, ShotPlan, Tile, plan_chunks, takes_statistics_rounds

if TYPE_CHECKING:
    from farm.media.settings import VideoSettings


def tile_peak_bytes(cls: type[VideoDecoder], spec: DecoderSpec, tile: Tile, chunk: ChunkSize) -> int:
    """Estimated peak device memory to decode a tile: its largest decode call, plus, when the tile is
    decoded in chunks, the float32 buffer the chunks are blended into (3 x 4 bytes per pixel-frame;
    measured on the H200: a chunked 121x704x1216 tile peaked at 4.46 GiB, 2.70 GiB for the call alone),
    and, for carried temporal chunks, two decoder states: the one a chunk starts from and the one it
    hands on (`carried_state_bytes`, per spatial chunk)."""
    geometry = cls.geometry_for_spec(spec)
    chunks = plan_chunks(tile.decoded_fhw, geometry, chunk)  # context frames included
    peak = max(cls.peak_bytes(spec, geometry.pixel_shape(c.decoded_fhw)) for c in chunks)
    states = 0
    if chunk.carry and len({c.grid_pos[0] for c in chunks}) > 1:
        first = [c for c in chunks if c.grid_pos[0] == 0]  # one state per spatial chunk
        states = 2 * sum(cls.carried_state_bytes(spec, (c.latent[1].size, c.latent[2].size)) for c in first)
    return peak + (12 * tile.pixel_volume if len(chunks) > 1 else 0) + states


def tile_chunk_volume(tile: Tile, chunk: ChunkSize, geometry: Geometry) -> int:
    """Pixel volume of the largest single decode call of a tile (its chunk, or the whole tile)."""
    chunks = plan_chunks(tile.decoded_fhw, geometry, chunk)  # context frames included
    return max(c.pixel_volume for c in chunks)


# Decoded tiles a GPU worker may hold at once. Each held tile keeps its weighted float32 pieces until
# every batch it feeds is written; holding more lets the GPU decode ahead while blends, transfers and
# writes finish. Measured on one H200, 8 shots of 121x704x1216 written to Zarr: 2 tiles 170 frames/s,
# 8 tiles 233 frames/s (peak 12.6 → 17.3 GiB) (docs/performance.md).
MIN_TILES_PER_WORKER, MAX_TILES_PER_WORKER = 2, 8


def default_window(
    plans: Sequence[ShotPlan], spec: DecoderSpec, gpu_bytes: int | None, n_workers: int
) -> int | None:
    """Decoded tiles in flight when the user gives no --window: per worker, as many as fit in 90 % of
    the smallest GPU beside the largest decode (2 to 8); None on a CPU cluster (run_graph's default)."""
    if not gpu_bytes or not plans:
        return None
    decode, held = _decode_and_held_bytes(plans, spec)
    per_worker = int((0.9 * gpu_bytes - decode) // held)
    return max(1, n_workers) * min(MAX_TILES_PER_WORKER, max(MIN_TILES_PER_WORKER, per_worker))


def window_peak_bytes(plans: Sequence[ShotPlan], spec: DecoderSpec, tiles_per_worker: int) -> int:
    """Upper bound of a GPU worker's memory holding `tiles_per_worker` decoded tiles: the largest decode
    beside the pieces of the others (measured on the H200, 8 whole 704p shots: 17.3 GiB, bound 20.5)."""
    decode, held = _decode_and_held_bytes(plans, spec)
    return decode + max(0, tiles_per_worker - 1) * held


def _decode_and_held_bytes(plans: Sequence[ShotPlan], spec: DecoderSpec) -> tuple[int, int]:
    cls = decoder_class(spec)
    decode = max(tile_peak_bytes(cls, spec, t, p.chunk) for p in plans for t in p.tiles)
    held = max(12 * t.pixel_volume for p in plans for t in p.tiles)  # float32 RGB pieces of one tile
    return decode, held


def memory_warning(plans: Sequence[ShotPlan], spec: DecoderSpec, gpu_bytes: int | None) -> str | None:
    """A warning when the plan's largest tile is estimated to need more than 90 % of a worker's GPU."""
    if not gpu_bytes or not plans:
        return None
    cls = decoder_class(spec)
    need, shot = max((tile_peak_bytes(cls, spec, t, p.chunk), p.shot) for p in plans for t in p.tiles)
    if need <= 0.9 * gpu_bytes:
        return None
    return (
        f"warning: shot {shot!r}: a tile is estimated to need {human_bytes(need)} of GPU memory, more than "
        f"90% of the smallest worker GPU ({human_bytes(gpu_bytes)}); split it with --tiles or bound each "
        "decode call with --chunk F,H,W"
    )


def check_fits(plans: Sequence[ShotPlan], spec: DecoderSpec, gpu_bytes: int | None) -> None:
    """Refuse, before any decode, a plan whose largest tile (with what its worker's other tiles carry
    between statistics rounds, `worker_peak_bytes`) is estimated to need more memory than any worker has:
    the smallest worker GPU's whole memory, or on CPU workers this machine's whole RAM."""
    if not plans:
        return
    cls = decoder_class(spec)
    need, shot, alone = max(
        (worker_peak_bytes(cls, spec, p, t), p.shot, tile_peak_bytes(cls, spec, t, p.chunk))
        for p in plans for t in p.tiles
    )  # fmt: skip
    capacity: int | None
    if gpu_bytes:
        capacity, what = gpu_bytes, "GPU memory, more than the smallest worker GPU has"
    else:
        capacity, what = host_memory_bytes(), "memory, more than this machine has"
    if capacity and need > capacity and alone <= capacity:
        raise FarmError(
            f"shot {shot!r}: a tile, beside what its worker's other tiles carry between the GroupNorm rounds "
            f"their shot's tiles share, is estimated to need {human_bytes(need)} of {what} "
            f"({human_bytes(capacity)}); give the render more workers (each carries only its own tiles) or "
            "more GPU memory, or split frames too with --tiles F,H,W (tiles then decode alone, with a blend)"
        )
    if capacity and need > capacity:
        raise FarmError(
            f"shot {shot!r}: a tile is estimated to need {human_bytes(need)} of {what} "
            f"({human_bytes(capacity)}); split it with --tiles F,H,W or bound each decode call with "
            "--chunk F,H,W (farm plan shows the tiles)"
        )


def worker_peak_bytes(cls: type[VideoDecoder], spec: DecoderSpec, plan: ShotPlan, tile: Tile) -> int:
    """Estimated peak device memory of `tile`'s worker while decoding it: its `tile_peak_bytes`, plus,
    where the plan's tiles share the shot's statistics in rounds, what the worker's other tiles of the
    shot carry between rounds meanwhile (all of a shot's tiles advance round by round together)."""
    peak = tile_peak_bytes(cls, spec, tile, plan.chunk)
    if cls.shares_statistics(spec.config) and takes_statistics_rounds(plan):
        geometry = cls.geometry_for_spec(spec)
        others = [t for t in plan.tiles if t.worker == tile.worker and t.index != tile.index]
        peak += sum(cls.statistics_carried_bytes(spec, math.prod(geometry.pixel_shape(t.decoded_fhw)))
                    for t in others)  # fmt: skip
    return peak


def host_memory_bytes() -> int | None:
    """This machine's RAM (None when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_peak_bytes(plans: Sequence[ShotPlan], tiles_in_flight: int, video: VideoSettings) -> int:
    """Upper bound of a decode worker's host memory for blended batches: every batch the tiles in flight
    feed, blended (full frames: 3 bytes per pixel for uint8, 6 for float16, 1.5 more for the encoder's
    yuv420p planes) and held until its writes and encodes are done."""
    if not plans:
        return 0
    per_pixel = (3 if video.frames_dtype == "uint8" else 6) + (1.5 if video.takes_yuv420 else 0)
    largest = max(
        sum(b.frames for b in p.batches if t.index in b.tiles) * p.pixel_shape[1] * p.pixel_shape[2]
        for p in plans
        for t in p.tiles
    )
    return int(max(1, tiles_in_flight) * largest * per_pixel)


def host_memory_warning(need: int, limit: int | None) -> str | None:
    """A warning when blended batches could pass 60 % of a worker's memory limit (where Dask spills)."""
    if not limit or need <= 0.6 * limit:
        return None
    return (
        f"warning: blended batches may need up to {human_bytes(need)} of host memory per decode worker, "
        f"over 60% of its memory limit ({human_bytes(limit)}), where Dask starts spilling to disk; lower "
        "--window or --batch-frames, or give workers more memory"
    )
