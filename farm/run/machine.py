"""What this machine offers a local cluster: its CUDA devices and their memory, its cores, whether UCX is
installed, and ``farm.cpu-decode-threads``. Read without importing torch, dask-cuda or UCX: the driver
of a render does not need them."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from pathlib import Path

from farm import config
from farm.errors import FarmError


def cpu_decode_threads() -> int | None:
    """``farm.cpu-decode-threads``: torch's intra-op threads in each worker of a local CPU cluster, or
    None for ``auto`` (the cores split between the workers).

    The same count on every worker, whatever their number, keeps the frames byte-identical across
    worker counts: torch's CPU convolutions (oneDNN's, and MKL's without it) sum in another order with
    another thread count on some CPUs (a level off in a few pixels of a tiny test render on a Xeon with
    AMX), so 1 worker of 2 threads and 3 workers of 1 can write different bytes. ``auto`` is faster with
    fewer workers than cores, at that cost."""
    value = config.get("cpu-decode-threads")
    if value == "auto":
        return None
    whole = isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).isdigit()
    if not whole or int(value) < 1:
        raise FarmError(
            f"farm.cpu-decode-threads is {value!r}; it takes a whole number of threads (at least 1) or "
            "auto (the cores split between the workers)"
        )
    return int(value)


def detect_gpus() -> int:
    """Number of CUDA devices this process may use (0 on a CPU-only machine or with a CPU build of
    torch), found without importing torch (seconds the driver of a render does not need): the CUDA
    driver's own count, which honours ``CUDA_VISIBLE_DEVICES``."""
    if not _torch_has_cuda():
        return 0
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return int(count.value)


def local_gpu_memory(count: int | None = None) -> int | None:
    """Total memory of the smallest of this machine's first `count` CUDA devices (all by default), read
    from the CUDA driver without importing torch: the GPUs a local CUDA cluster would run on. None
    without GPUs (a local cluster then decodes on CPU workers)."""
    gpus = detect_gpus()
    if not gpus:
        return None
    libcuda = ctypes.CDLL("libcuda.so.1")
    sizes = []
    for index in range(min(gpus, count or gpus)):
        device, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if libcuda.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        if libcuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) == 0 and total.value:
            sizes.append(int(total.value))
    return min(sizes) if sizes else None


def _torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from its ``version.py`` without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return False
    match = re.search(r"^cuda\b[^=]*=\s*(.+)$", text, flags=re.MULTILINE)
    return match is not None and match.group(1).strip() != "None"


def ucx_available() -> bool:
    """Whether distributed's UCX backend (package distributed-ucxx, module ``distributed_ucxx``) is
    installed. Looks the module up without importing it."""
    try:
        return importlib.util.find_spec("distributed_ucxx") is not None
    except (ImportError, ValueError):
        return False


def cpu_count() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1
