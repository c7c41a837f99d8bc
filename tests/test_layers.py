"""The package's layering: planning modules are pure (no Dask distributed, no torch), so the fast tier
and `farm plan` do not pay for them; checked in a fresh interpreter, where nothing is imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURE = ["errors", "options", "tiling", "costmodel", "planner", "schedule", "keys", "render_ids", "decoders",
        "store", "files", "output", "resume", "jobplan", "budgets", "plan_table", "synthetic"]  # fmt: skip
HEAVY = ["distributed", "torch", "diffusers"]

# Imports the modules one after another, listing the heavy modules loaded so far after each: the first
# module after which one appears is the one that pulls it in.
PROBE = """
import importlib, json, sys
print(json.dumps({m: sorted(set(HEAVY) & set(sys.modules)) for m in MODULES
                  if importlib.import_module("farm." + m)}))
"""


def heavy_after_each(modules: list[str]) -> dict[str, list[str]]:
    code = f"HEAVY = {HEAVY!r}; MODULES = {modules!r}" + PROBE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_pure_modules_import_neither_distributed_nor_torch():
    assert heavy_after_each(PURE) == {m: [] for m in PURE}


def test_the_check_can_fail():
    assert "distributed" in heavy_after_each(["tiling", "monitor"])["monitor"]  # a scheduler plugin


def test_checking_and_planning_a_random_weight_job_never_imports_diffusers(tmp_path):
    """A synthetic job's render set-up (weights check, plans) pays no diffusers import (seconds)."""
    code = f"""
import sys
from farm.decoders import decoder_class
from farm.jobplan import plan_shots
from farm.options import PlanOptions
from farm.store import open_job
from farm.synthetic import synth
synth({str(tmp_path / "job")!r}, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
job = open_job({str(tmp_path / "job")!r})
decoder_class(job.spec).check_weights(job.spec)
plans, errors = plan_shots(job, PlanOptions(), list(job.shots))
assert plans and not errors, errors
print("diffusers" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
