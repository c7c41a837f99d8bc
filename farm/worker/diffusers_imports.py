"""diffusers' model code imported in a decode worker without transformers' and peft's.

When transformers and peft are installed (as they are wherever a diffusers video pipeline runs: its text
encoders are transformers models), diffusers' model modules import transformers' registry of models, its
quantizers and image processors, and peft (for single-file pipeline loading, LoRA and quantized text
encoders). On a 2-core CPU that is 0.9-1.1 s of the 1.05-1.26 s a fresh worker spends importing the LTX-2
VAE class after ``diffusers.models.modeling_utils`` (0.15 s without). A decode worker builds video VAEs
only, which use none of it (diffusers' one autoencoder that does, ``AutoencoderRAE``, encodes images
through a transformers model and is no video VAE). So before a decode worker imports diffusers' model
code, it tells diffusers that transformers and peft are absent (what ``is_transformers_available()`` and
``is_peft_available()`` return), a configuration diffusers supports: both are optional to it.

diffusers' shared model code also tries ``import transformers`` outright (for its quantization config's
base class, with a fallback when that fails): the worker forkserver, which imports that code for every
worker, finds the two packages absent while it does (`hiding_unused_packages`), another 0.45 s of the
2.2 s that import took on the same CPU.

Only farm's decode workers do this: the worker forkserver (`farm.run.forkserver_imports`) and a
worker's warm-up (`farm.worker.warmup`). A user's own process (the pipeline hook, `farm ingest`) imports
diffusers as installed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

MODEL_CODE = "diffusers.models.modeling_utils"  # the first of diffusers' modules that asks
UNUSED_PACKAGES = ("transformers", "peft")  # what a decode worker's diffusers is told is absent


def import_without_unused_packages() -> bool:
    """Tell diffusers `UNUSED_PACKAGES` are absent, unless its model code is already imported (then it
    has imported them); True when diffusers will import its model code without them."""
    if MODEL_CODE in sys.modules:
        return False
    try:
        import diffusers.utils.import_utils as import_utils
    except Exception:  # no diffusers: the decode that needs it raises in words
        return False
    flags = [f"_{name}_available" for name in UNUSED_PACKAGES]
    if not all(isinstance(getattr(import_utils, flag, None), bool) for flag in flags):
        return False  # a diffusers that keeps the answers elsewhere: imported as installed
    for flag in flags:
        setattr(import_utils, flag, False)
    return True


class _Hidden(importlib.abc.MetaPathFinder):
    """An import finder that finds `UNUSED_PACKAGES` and their modules absent."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        if fullname.partition(".")[0] in UNUSED_PACKAGES:
            raise ModuleNotFoundError(f"No module named {fullname!r} (a decode worker does without it)",
                                      name=fullname)  # fmt: skip
        return None  # the finders after this one look


@contextlib.contextmanager
def hiding_unused_packages() -> Iterator[None]:
    """For the block, `UNUSED_PACKAGES` are absent to diffusers and to any import not done before
    (`import_without_unused_packages`, then an import finder ahead of the others), unless diffusers'
    model code was imported before it. A module imported in the block that tried them keeps its fallback;
    afterwards they import as installed."""
    if not import_without_unused_packages():
        yield
        return
    finder = _Hidden()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
