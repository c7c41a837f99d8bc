"""farm.worker.warmup: a worker started with the preload imports what decoding needs on its own, before
any task asks for it, and says how long each step took."""

from __future__ import annotations

import sys
import time

import pytest
from distributed import Client, LocalCluster

from farm.run.backends.setup import WARMUP_PRELOAD
from farm.worker import warmup

pytestmark = pytest.mark.cluster


def heavy_modules_loaded() -> list[str]:
    return sorted(m for m in ("torch", "diffusers") if m in sys.modules)


def test_preloaded_worker_imports_torch_and_diffusers_before_any_task():
    options = {"host": "127.0.0.1", "dashboard_address": ":0", "preload": [WARMUP_PRELOAD]}
    with LocalCluster(n_workers=1, threads_per_worker=1, **options) as cluster, Client(cluster) as client:
        deadline = time.monotonic() + 120
        timings: dict[str, float] = {}
        while time.monotonic() < deadline:
            timings = next(iter(client.run(warmup.warmup_timings).values()))
            if f"import {warmup.MODULES[-1]}" in timings:
                break
            time.sleep(0.2)
        imports = [k for k in timings if k.startswith("import")]
        assert imports == [f"import {m}" for m in warmup.MODULES]
        assert all(seconds >= 0 for seconds in timings.values())
        assert next(iter(client.run(heavy_modules_loaded).values())) == ["diffusers", "torch"]
