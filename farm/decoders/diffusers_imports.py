"""Import one diffusers model class without importing every model diffusers has.

``from diffusers import AutoencoderKLLTX2Video`` imports ``diffusers.models.autoencoders``, whose package
``__init__`` imports every autoencoder; one of them imports ``diffusers.models.unets``, whose ``__init__``
imports every UNet, and a UNet block imports ``diffusers.models.transformers``, every transformer of
every pipeline. A fresh decode worker paid that for one VAE: the class import took 10.8 s after torch on
a 2-core machine, and 0.9 s with those three package ``__init__`` files deferred (docs/benchmarks.md).

`model_class` defers them: each package is registered as a module whose ``__init__`` has not run yet,
so ``import diffusers.models.autoencoders.autoencoder_kl_ltx2`` loads only the files that module imports.
The first time anything asks such a package for a name it does not hold yet (``from
diffusers.models.autoencoders import AutoencoderKLWan``, ``hasattr``), its ``__init__`` runs then, in
place, and the package is whole from there on: code that expects the usual package still finds it.
A package some import already ran is left as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

# Packages of diffusers.models whose __init__ imports every model of a kind.
DEFERRED_PACKAGES = (
    "diffusers.models.autoencoders",
    "diffusers.models.unets",
    "diffusers.models.transformers",
)

_lock = threading.RLock()  # installation and completion: a worker's warm-up and task threads import at once


def model_class(name: str) -> type:
    """diffusers' class `name` (``AutoencoderKLLTX2Video``), imported with `defer_package_inits`."""
    defer_package_inits()
    return getattr(importlib.import_module("diffusers"), name)


def defer_package_inits() -> None:
    """Register each of `DEFERRED_PACKAGES` not imported yet as a package whose ``__init__`` runs on
    first need (see the module doc)."""
    with _lock:
        for name in DEFERRED_PACKAGES:
            if name in sys.modules:
                continue
            parent, _, child = name.rpartition(".")
            importlib.import_module(parent)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                continue  # another diffusers layout: its own import path holds
            package = importlib.util.module_from_spec(spec)
            package.__getattr__ = _completer(package)  # type: ignore[method-assign]
            sys.modules[name] = package
            setattr(sys.modules[parent], child, package)


def _completer(package: ModuleType) -> Any:
    """A module ``__getattr__`` that runs the package's own ``__init__`` once, then answers from it."""
    running = threading.local()

    def complete_then_get(attr: str) -> Any:
        if attr.startswith("__") or getattr(running, "active", False):
            raise AttributeError(f"module {package.__name__!r} has no attribute {attr!r}")
        with _lock:
            if package.__dict__.get("__getattr__") is complete_then_get:
                running.active = True
                try:
                    del package.__getattr__  # the package's own names from here on
                    package.__spec__.loader.exec_module(package)  # type: ignore[union-attr]
                finally:
                    running.active = False
        return getattr(package, attr)

    return complete_then_get


def is_deferred(name: str) -> bool:
    """Whether package `name` is registered and its ``__init__`` has not run yet."""
    module = sys.modules.get(name)
    return module is not None and "__getattr__" in module.__dict__ and name in DEFERRED_PACKAGES
