"""Hold a GPU worker's allocator to the render's GPU-memory budget (``--gpu-memory``, farm.gpu-memory).

A plan made for a 24 GiB GPU must fail on an H200 where it would fail on the 24 GiB GPU, not pass
because 141 GiB were there: torch's caching allocator is capped at the budget's fraction of the device,
and an allocation beyond it raises torch's out-of-memory error in the tile's task.

The budget is the GPU's memory as nvidia-smi counts it, so the cap leaves out what the process holds
beside torch's allocator: its CUDA context, kernels loaded as they are first used, a transport's buffers.
That is measured each time a task holds the budget, as the device's memory in use less what torch's
allocator has reserved (a worker owns its GPU, as dask-cuda starts one per GPU; on a GPU shared with other
work their memory counts too, so the cap errs low), and the cap only ever comes down. A task holds it
again once its decoder is on the device (loading the weights loads kernels too), and the cap keeps
`FIRST_USE_ALLOWANCE` for the kernels a decode loads the first time it runs, after the cap was set.

Under a budget the allocator also grows its segments in place (torch's expandable segments), since the
cap counts what it reserves: with fixed segments, the LTX-2.5 diffusion decoder's 1080p tile of a
24GiB plan ran out with 3.2 GiB reserved but unallocated between them. Set by farm unless the worker was
started with allocator settings of its own (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF), which stand.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from farm import config
from farm.decoders import load_decoder
from farm.decoders.base import human_bytes
from farm.errors import FarmError
from farm.worker.device import worker_device

if TYPE_CHECKING:
    from farm.decoders.base import VideoDecoder

# Kept beside the allocator's cap for what a worker's first decode loads outside it (its kernels, as they
# are first used). LTX-2.3's 1080p tile of a 24GiB plan loads 12 MiB in its first decode on an H100, its
# weights' load 92 MiB before it (`benchmarks/diagnose_gpu.py peaks --init-on-device`); the load's is
# measured once the decoder is on the device (`load_within_budget`), the decode's is not until it ran.
FIRST_USE_ALLOWANCE = 128 * 2**20
ALLOCATOR_SETTINGS_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch's; either is read

T = TypeVar("T")
_held: dict[int, tuple[int, int]] = {}  # device index -> (the budget, the memory outside the allocator)
_expanding = False  # whether this process's allocator was told to grow its segments in place


def hold_gpu_memory(budget: int | None = None) -> int | None:
    """Cap this process' current CUDA device at `budget` bytes (default: farm.gpu-memory as this task
    sees it), less what it holds outside torch's allocator. Returns the allocator's cap in bytes, or None
    (no budget, no GPU, or a budget above the device's)."""
    budget = config.byte_size("gpu-memory") if budget is None else budget
    if not budget:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    expand_segments()
    device = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(device)  # makes the CUDA context first, if there was none
    outside = outside_allocator_bytes(total - free, torch.cuda.memory_reserved(device))
    held_budget, held_outside = _held.get(device, (None, 0))
    if held_budget == budget:
        outside = max(outside, held_outside)  # the cap only comes down
    cap = allocator_cap(budget, outside + FIRST_USE_ALLOWANCE, total)
    if _held.get(device) != (budget, outside):
        torch.cuda.set_per_process_memory_fraction(memory_fraction(cap, total), device)
        _held[device] = (budget, outside)
    return cap if cap < total else None


def expand_segments() -> bool:
    """Let torch's allocator in this process grow its segments in place from now on (segments it holds
    already stay as they are), unless the process was started with allocator settings of its own. True
    when it does. Pieces shared with other processes by CUDA IPC (`farm.worker.ipc`) then come from such
    segments, which torch shares through their file descriptors."""
    global _expanding
    if any(os.environ.get(name) for name in ALLOCATOR_SETTINGS_VARIABLES):
        return False
    if not _expanding:
        import torch

        # torch.cuda.memory._set_allocator_settings warns that it is deprecated from torch 2.12 for this one
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        (setter or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")
        _expanding = True
    return True


def built_within_budget(build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`build(*args, **kwargs)` (a decoder put on this worker's device), the budget held before (the
    weights' memory is the allocator's, and capped) and again after (what loading them loaded beside the
    allocator)."""
    hold_gpu_memory()
    built = build(*args, **kwargs)
    hold_gpu_memory()
    return built


def load_within_budget(spec_json: dict[str, Any], compile: bool | str = False) -> VideoDecoder:
    """The task's decoder on this worker's device (`farm.decoders.load_decoder`), within the budget."""
    return built_within_budget(load_decoder, spec_json, worker_device(), compile=compile)


def outside_allocator_bytes(used: int, reserved: int) -> int:
    """Device memory in use beyond what torch's caching allocator has reserved."""
    return max(0, used - reserved)


def allocator_cap(budget: int, outside: int, total: int) -> int:
    """What torch's allocator may hold for a `budget` when `outside` bytes of it are held beside it, on a
    device of `total` bytes (at most all of it). Raises FarmError when nothing would be left."""
    cap = budget - outside
    if cap <= 0:
        raise FarmError(
            f"the GPU-memory budget ({human_bytes(budget)}, --gpu-memory or farm.gpu-memory) leaves nothing "
            f"for decoding: this worker already holds {human_bytes(outside)} of its GPU outside torch's "
            "allocator (its CUDA context and loaded kernels); give a budget above that"
        )
    return min(cap, total)


def memory_fraction(budget: int, total: int) -> float:
    """The share of a device of `total` bytes torch's allocator may hold for a `budget` (at most all)."""
    return min(1.0, budget / total)
