"""Imported by farm's worker forkserver (`farm.run.worker_forkserver`) after torch: diffusers' model code,
which every worker forked from the server then finds imported. Imported by any other process it imports
nothing more.

Several workers on a few cores would otherwise each import it at once, and a GPU worker would import it
after its fork, on the way to its first decode. Measured on an H100 (docs/performance.md "Cold start"), a
cold one-shot render with the server importing it took a median 20.0 s beside 22.3 s with each GPU worker
importing it after the fork (reading its weights meanwhile), the plain script 18.1 s.

The server imports it with torch's CUDA check asking NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``, set by
`farm.run.worker_forkserver` for the server alone): imported so in a process that then forks, the child
uses CUDA; imported without it, diffusers' import asks CUDA's runtime and a forked child's first CUDA call
fails ("Cannot re-initialize CUDA in forked subprocess"). A module that fails to import is skipped: the
worker imports it again, and its decode raises in words.
"""

from __future__ import annotations

import contextlib
import importlib

from farm.run.forkserver_exit import IN_SERVER
from farm.worker.diffusers_imports import defer_package_inits, hiding_unused_packages
from farm.worker.warmup import MODULES

# what a worker's warm-up imports after torch: diffusers' shared model code, the bulk of its import, and
# farm's adapters over it
DECODER_MODULES = MODULES[1:]


def import_decoder_code() -> list[str]:
    """Import `DECODER_MODULES`, diffusers' model code without transformers' and peft's
    (`farm.worker.diffusers_imports`), its packages of every model of a kind left for the names asked of
    them (`defer_package_inits`); the modules imported."""
    defer_package_inits()
    done = []
    with hiding_unused_packages():
        for name in DECODER_MODULES:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
                done.append(name)
    return done


if IN_SERVER:
    import_decoder_code()
