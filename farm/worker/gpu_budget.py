"""Hold a GPU worker's allocator to the render's GPU-memory budget (``--gpu-memory``, farm.gpu-memory).

A plan made for a 24 GiB GPU must fail on an H200 where it would fail on the 24 GiB GPU, not pass
because 141 GiB were there: torch's caching allocator is capped at the budget's fraction of the device,
and an allocation beyond it raises torch's out-of-memory error in the tile's task.
"""

from __future__ import annotations

from farm import config

_held: dict[int, int] = {}  # device index -> the budget its allocator is held to


def hold_gpu_memory(budget: int | None = None) -> int | None:
    """Cap this process' current CUDA device at `budget` bytes (default: farm.gpu-memory as this task
    sees it). Returns the cap in bytes, or None (no budget, no GPU, or a budget above the device's)."""
    budget = config.byte_size("gpu-memory") if budget is None else budget
    if not budget:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.cuda.current_device()
    if _held.get(device) == budget:
        return budget
    fraction = memory_fraction(budget, torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    _held[device] = budget
    return budget if fraction < 1.0 else None


def memory_fraction(budget: int, total: int) -> float:
    """The share of a device of `total` bytes torch's allocator may hold for a `budget` (at most all)."""
    return min(1.0, budget / total)
