"""`farm.compile-cache`: a compiled graph is found again by a fresh process, per input shape.

Each compile runs in a new Python process (as a new Dask worker would), on this CPU with torch
inductor's C++ backend, after `farm.decoders.use_compile_cache` points inductor at the folder the farm
setting names. The cache's key includes the input shape: the same shape is a hit in the next process,
a new shape compiles (a miss). On the H200 the same mechanism takes a compiled
LTX-2 decode from 20-24 s to 3.9-5.0 s in a fresh cluster (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys
import torch
from torch._dynamo.utils import counters  # sets TORCHINDUCTOR_CACHE_DIR to inductor's default
from farm.decoders import use_compile_cache

folder = use_compile_cache()
model = torch.nn.Sequential(torch.nn.Conv3d(4, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv3d(8, 3, 1))
compiled = torch.compile(model)
with torch.no_grad():
    compiled(torch.randn(1, 4, int(sys.argv[1]), 8, 8))
inductor = counters["inductor"]
hits, misses = inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]
print(json.dumps({"folder": folder, "hits": hits, "misses": misses}))
"""


def compile_in_a_fresh_process(frames: int, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(frames)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_fresh_process_reuses_the_farm_compile_cache_per_shape(tmp_path):
    folder = tmp_path / "compile-cache"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update({"DASK_FARM__COMPILE_CACHE": str(folder), "PYTHONPATH": str(ROOT)})
    first = compile_in_a_fresh_process(4, env)
    assert first == {"folder": str(folder), "hits": 0, "misses": 1}
    assert any(folder.iterdir())  # inductor wrote there, not to its default folder
    assert compile_in_a_fresh_process(4, env) == {"folder": str(folder), "hits": 1, "misses": 0}
    assert compile_in_a_fresh_process(5, env)["misses"] == 1  # a new shape is a new key: compiled


@pytest.mark.slow  # imports torch._dynamo (3 s)
def test_the_farm_setting_overrides_inductors_variable(monkeypatch, tmp_path):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR to inductor's default: the farm setting must
    still win, or it would never take effect in a worker that imported diffusers first."""
    import dask.config
    from torch._dynamo.utils import counters  # noqa: F401  (the import that sets the variable)

    from farm.decoders import use_compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-default"))
    with dask.config.set({"farm.compile-cache": str(tmp_path / "farm")}):
        assert use_compile_cache() == str(tmp_path / "farm")
    with dask.config.set({"farm.compile-cache": None}):  # unset: inductor's own choice stays
        assert use_compile_cache() == str(tmp_path / "farm")
