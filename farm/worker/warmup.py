"""A Dask worker preload that starts loading what decoding needs as soon as the worker process starts.

A fresh GPU worker spends seconds importing torch and diffusers' model code and creating its CUDA
context before its first decode (FINDINGS.md: torch + ``diffusers.models`` 8.7-9.1 s on an H200 node).
Started from the preload, that runs on a background thread while the worker connects to its scheduler
and the client finishes its set-up, instead of after the first decode task arrives. A task that needs a
module still being imported waits for it (Python's import lock); a failed import is left for that task
to raise.

farm's local GPU clusters (`farm render`, `farm cluster`) start their decode workers with it; workers a
user starts take it with ``dask worker --preload farm.worker.warmup`` (or ``dask cuda worker``).
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

# What a decode needs first, in import order: torch, diffusers' shared model code (the bulk of its
# import), and farm's decoder adapters.
MODULES = ("torch", "diffusers.models.modeling_utils", "farm.decoders.diffusers_vae")

_timings: dict[str, float] = {}  # seconds per step ("import torch", …, "cuda context"), as they finish
_done = threading.Event()


def dask_setup(worker: Any) -> None:
    """distributed's preload hook: start the warm-up thread (once per process)."""
    start()


def start() -> threading.Thread | None:
    """Start the warm-up on a daemon thread, unless it already started in this process."""
    if any(t.name == "farm-warmup" for t in threading.enumerate()) or _done.is_set():
        return None
    thread = threading.Thread(target=warm_up, name="farm-warmup", daemon=True)
    thread.start()
    return thread


def warm_up() -> None:
    """Import `MODULES`, then create the CUDA context when this process has a GPU; each step timed."""
    try:
        for name in MODULES:
            started = time.perf_counter()
            try:
                importlib.import_module(name)
            except Exception:  # the decode that needs it raises the real error, with its context
                return
            _timings[f"import {name}"] = time.perf_counter() - started
        import torch

        if torch.cuda.is_available():
            started = time.perf_counter()
            torch.empty(1, device="cuda")  # the worker's one GPU (dask-cuda sets CUDA_VISIBLE_DEVICES)
            _timings["cuda context"] = time.perf_counter() - started
    finally:
        _done.set()


def warmup_timings() -> dict[str, float]:
    """The warm-up's seconds per step in this process, for the steps that finished."""
    return dict(_timings)
