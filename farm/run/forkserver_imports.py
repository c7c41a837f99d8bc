"""Imported by farm's worker forkserver (`farm.run.worker_forkserver`) after torch: diffusers' model code,
for the workers that share it, decided in the server itself. Imported by any other process it imports
nothing more.

CPU workers (a machine with no GPU) find it imported, once for all of them: several workers on a few cores
would otherwise each import it at once. GPU workers fork before it, and each imports it on its warm-up
(`farm.worker.warmup`) while it creates its CUDA context and reads its decoder's weights onto its GPU
(`farm.decoders.weights.reading_ahead`): those seconds then pass beside the import instead of after it.
The server asks NVML's library alone whether there is a GPU (`gpus_visible`), so no CUDA state is
forked. A module that fails to import is skipped: the worker imports it again, and its decode raises in
words.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os

from farm.run.forkserver_exit import IN_SERVER
from farm.worker.warmup import MODULES

# what CPU workers share: what a worker's warm-up imports after torch (diffusers' shared model code, the
# bulk of its import, and farm's adapters over it)
DECODER_MODULES = MODULES[1:]


def import_decoder_code(gpus: bool | None = None) -> list[str]:
    """Import `DECODER_MODULES` unless the workers have `gpus` (None: whether this machine shows one,
    `gpus_visible`); the modules imported."""
    if gpus is None:
        gpus = gpus_visible()
    if gpus:
        return []
    done = []
    for name in DECODER_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            done.append(name)
    return done


def gpus_visible() -> bool:
    """Whether this process's torch is a CUDA build, CUDA_VISIBLE_DEVICES hides not every device, and NVML
    counts a GPU: asked of NVML's library alone, so that neither CUDA's driver nor its runtime starts in
    a process whose children are forked (torch's own check falls back to CUDA's runtime when NVML fails)."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if torch.version.cuda is None or (visible is not None and visible.strip() in ("", "-1")):
        return False
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    if nvml.nvmlInit_v2() != 0:
        return False
    try:
        count = ctypes.c_uint(0)
        return nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 and count.value > 0
    finally:
        nvml.nvmlShutdown()


if IN_SERVER:
    import_decoder_code()
