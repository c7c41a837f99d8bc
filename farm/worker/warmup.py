"""A Dask worker preload that starts loading what decoding needs as soon as the worker process starts.

A fresh GPU worker spends seconds importing torch and diffusers' model code and creating its CUDA
context before its first decode (FINDINGS.md: torch + ``diffusers.models`` 8.7-9.1 s on an H200 node).
Started from the preload, that runs on a background thread while the worker connects to its scheduler
and the client finishes its set-up, instead of after the first decode task arrives. A task that needs a
module still being imported waits for it (Python's import lock); a failed import is left for that task
to raise.

When the cluster was started for one render, the render names its decoder (`DECODER_HINT`, a dask
setting each worker process receives from its Nanny as it spawns): the warm-up then builds that decoder
too, weights read onto the worker's device, and the render's tasks find it built
(`farm.decoders.load_decoder`, which builds a decoder once per process). A hint no task asks for is
dropped at the first other decoder asked for (`farm.decoders.preloads`); one that cannot be built is left
for the task that needs it to raise in words.

farm's local clusters (`farm render`, `farm cluster`) start their decode workers with it; workers a
user starts take it with ``dask worker --preload farm.worker.warmup`` (or ``dask cuda worker``).
"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

import dask.config

from farm.worker.diffusers_imports import defer_package_inits, import_without_unused_packages

# What a decode needs, in import order: torch, diffusers' shared model code (the bulk of its import), and
# farm's decoder adapters. The decoder a render names is built after torch: its weights are read onto
# the device while its build imports the rest (`farm.decoders.weights.reading_ahead`).
MODULES = ("torch", "diffusers.models.modeling_utils", "farm.decoders.diffusers_vae")
# The dask setting naming the decoder a render's own cluster preloads: {"spec": the worker spec's JSON, as
# the render's tasks give it, "compile": its compile mode}. Set while the cluster starts (its workers'
# Nannies copy the configuration then), never in a configuration file.
DECODER_HINT = "farm.warmup-decoder"

_timings: dict[str, float] = {}  # seconds per step ("import torch", …, "cuda context"), as they finish
_started = threading.Event()
_done = threading.Event()


def dask_setup(worker: Any) -> None:
    """distributed's preload hook: start the warm-up thread (once per process)."""
    start()


def start() -> threading.Thread | None:
    """Start the warm-up on a daemon thread, unless it already started in this process."""
    if any(t.name == "farm-warmup" for t in threading.enumerate()) or _done.is_set():
        return None
    thread = threading.Thread(target=warm_up, name="farm-warmup", daemon=True)
    _started.set()
    thread.start()
    return thread


def warm_up() -> None:
    """Import torch, create the CUDA context when this process has a GPU, build the decoder
    `DECODER_HINT` names, if any, then import the rest of `MODULES` (those its build has not); each step
    timed."""
    try:
        if not _imported(MODULES[0]):
            return
        import torch

        import_without_unused_packages()  # before the decoder's build imports diffusers' model code
        defer_package_inits()  # the build imports its class's module, not every model of its kind

        if torch.cuda.is_available():
            started = time.perf_counter()
            torch.empty(1, device="cuda")  # the worker's one GPU (dask-cuda sets CUDA_VISIBLE_DEVICES)
            _timings["cuda context"] = time.perf_counter() - started
        hint = dask.config.get(DECODER_HINT, None)
        if isinstance(hint, dict) and isinstance(hint.get("spec"), dict):
            preload_decoder(hint["spec"], hint.get("compile", False))
        for name in MODULES[1:]:
            if not _imported(name):
                break
    finally:
        _done.set()


def _imported(name: str) -> bool:
    """Import `name`, timed; False when it fails (the decode that needs it raises the real error, with
    its context)."""
    started = time.perf_counter()
    try:
        importlib.import_module(name)
    except Exception:
        return False
    _timings[f"import {name}"] = time.perf_counter() - started
    return True


def preload_decoder(spec_json: dict[str, Any], compile: bool | str = False) -> None:
    """Build the decoder for `spec_json` on this worker's device, as a task would
    (`farm.worker.tasks.prepare_decoder`: the GPU-memory budget held around it), marked as preloaded."""
    from farm.decoders import preload_decoder as build
    from farm.worker.device import worker_device
    from farm.worker.gpu_budget import built_within_budget

    started = time.perf_counter()

    def timed() -> None:  # recorded before a task can take the decoder (and report these timings)
        _timings["decoder preloaded"] = time.perf_counter() - started

    try:
        built_within_budget(build, spec_json, worker_device(), compile=compile, on_built=timed)
    except Exception:  # weights changed, a spec this worker cannot build: its task says so, in words
        return


def wait_for_warm_up() -> None:
    """Wait until this process's warm-up, when one started, has finished: a task that needs the decoder
    then finds the one the warm-up built from the hint instead of building it beside it (a task would
    wait for the warm-up's imports all the same)."""
    if _started.is_set():
        _done.wait()


def warm_up_finished() -> bool:
    """Whether this process's warm-up has run to its end."""
    return _done.is_set()


def warmup_timings() -> dict[str, float]:
    """The warm-up's seconds per step in this process, for the steps that finished."""
    return dict(_timings)
