"""diffusers' model code imported in a decode worker without transformers', peft's and scipy's, and without
the models a decode does not use.

When transformers and peft are installed (as they are wherever a diffusers video pipeline runs: its text
encoders are transformers models), diffusers' model modules import transformers' registry of models, its
quantizers and image processors, and peft (for single-file pipeline loading, LoRA and quantized text
encoders). On a 2-core CPU that is 0.9-1.1 s of the 1.05-1.26 s a fresh worker spends importing the LTX-2
VAE class after ``diffusers.models.modeling_utils`` (0.15 s without). A decode worker builds video VAEs
only, which use none of it (diffusers' one autoencoder that does, ``AutoencoderRAE``, encodes images
through a transformers model and is no video VAE). So before a decode worker imports diffusers' model
code, it tells diffusers that transformers and peft are absent (what ``is_transformers_available()`` and
``is_peft_available()`` return), a configuration diffusers supports: both are optional to it.

The same holds for scipy: a VAE class's module imports diffusers' single-file loading, which imports its
schedulers, which import ``scipy.stats`` where scipy is installed (1.3 s of a GPU worker's class import on
an H100 node); a decode uses no scheduler, and scipy is optional to diffusers too.

diffusers' shared model code also tries ``import transformers`` outright (for its quantization config's
base class, with a fallback when that fails): the worker forkserver, which imports that code for every
worker, finds those packages absent while it does (`hiding_unused_packages`), another 0.45 s of the
2.2 s that import took on the same CPU.

diffusers' ``autoencoders``, ``unets`` and ``transformers`` packages each import every model of their kind
in their ``__init__``: the module of one video VAE class imports the three of them (its module imports the
shared VAE code, which imports a UNet block module, which imports two transformer modules), and with them
a hundred model modules and what they import where it is installed (scipy's statistics, torchvision,
cupy's test helpers and pytest). On an H100 node that was 3.5-4.3 s of a GPU worker's way to its first
decode, against 0.1 s for the modules the class uses. A decode worker imports those packages without
running their ``__init__`` (`defer_package_inits`): a module inside one imports as usual, and the first
name asked of the package itself that is not yet on it runs its ``__init__`` then.

Only farm's decode workers do this: the worker forkserver (`farm.run.forkserver_imports`) and a
worker's warm-up (`farm.worker.warmup`). A user's own process (the pipeline hook, `farm ingest`) imports
diffusers as installed.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

MODEL_CODE = "diffusers.models.modeling_utils"  # the first of diffusers' modules that asks
UNUSED_PACKAGES = ("transformers", "peft", "scipy")  # what a decode worker's diffusers is told is absent
# diffusers' packages whose __init__ imports every model of its kind
EAGER_PACKAGES = ("diffusers.models.autoencoders", "diffusers.models.unets", "diffusers.models.transformers")


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


class _InitOnFirstName(importlib.abc.Loader):
    """Loads a package as `loader` would, but runs its ``__init__`` only when a name not yet on the package
    is first asked for (its submodules set themselves on it as they import)."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader
        self._lock = threading.Lock()  # a warm-up and a task may ask at once: the __init__ runs once

    def __getattr__(self, name: str) -> Any:  # the real loader's other answers (is_package, get_data, …)
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        def __getattr__(name: str) -> Any:
            if name.startswith("__") and name != "__all__":  # the import system's and inspect's own
                raise AttributeError(name)  # questions leave the __init__ unrun; a star import runs it
            with self._lock:
                if module.__dict__.get("__getattr__") is __getattr__:
                    del module.__dict__["__getattr__"]
                    self._loader.exec_module(module)
            return getattr(module, name)

        module.__dict__["__getattr__"] = __getattr__


class _DeferredPackages(importlib.abc.MetaPathFinder):
    """An import finder that gives `EAGER_PACKAGES` the loader `_InitOnFirstName`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> Any:
        if fullname not in EAGER_PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return spec
        spec.loader = _InitOnFirstName(spec.loader)
        return spec


def defer_package_inits() -> bool:
    """From now on in this process, `EAGER_PACKAGES` not yet imported import without running their
    ``__init__`` until a name on them is asked for; True when none was imported yet (all deferred)."""
    if not any(isinstance(f, _DeferredPackages) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredPackages())
    return not any(name in sys.modules for name in EAGER_PACKAGES)
