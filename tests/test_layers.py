"""The package's layering, checked in a fresh interpreter, where nothing is imported yet: the pure
packages (planning, the job and output stores, decoders, media, inputs) import neither Dask distributed
nor torch, so the fast tier and `farm plan` do not pay for them; no module outside `farm.worker`
imports torch or diffusers at module level; `import farm` loads none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURE_PACKAGES = ["planning", "store", "decoders", "media", "inputs"]
HEAVY = ["distributed", "torch", "diffusers"]

# Imports the modules one after another, listing the heavy modules loaded so far after each: the first
# module after which one appears is the one that pulls it in.
PROBE = """
import importlib, json, sys
print(json.dumps({m: sorted(set(HEAVY) & set(sys.modules)) for m in MODULES
                  if importlib.import_module(m)}))
"""


def modules_of(*packages: str) -> list[str]:
    """The modules of farm's `packages` (``""``: the modules directly under farm/), by their files."""
    names = []
    for package in packages:
        folder = ROOT / "farm" / package
        for path in sorted(folder.glob("*.py")):
            parts = ["farm", *([package] if package else []), path.stem]
            names.append(".".join(parts[:-1] if path.stem == "__init__" else parts))
    return names


def heavy_after_each(modules: list[str]) -> dict[str, list[str]]:
    code = f"HEAVY = {HEAVY!r}; MODULES = {modules!r}" + PROBE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_pure_packages_import_neither_distributed_nor_torch():
    pure = ["farm", *modules_of(*PURE_PACKAGES)]
    assert len(pure) > 30
    assert heavy_after_each(pure) == {m: [] for m in pure}


def test_the_driver_imports_neither_torch_nor_diffusers():
    """Every module but the worker's tensor serializers (`farm.worker.transport`, loaded only on
    workers): the driver also imports the task functions it submits, and the transport's installer."""
    everything = modules_of("", *PURE_PACKAGES, "dashboard", "run", "worker")
    driver = [m for m in everything if m != "farm.worker.transport"]
    assert {"farm.cli", "farm.run.render", "farm.worker.tasks"} <= set(driver)
    loaded = heavy_after_each(driver)
    torch_or_diffusers = {m: [h for h in heavy if h != "distributed"] for m, heavy in loaded.items()}
    assert torch_or_diffusers == {m: [] for m in driver}


def test_the_check_can_fail():
    monitor, transport = "farm.dashboard.monitor", "farm.worker.transport"
    assert "distributed" in heavy_after_each(["farm.planning.tiling", monitor])[monitor]  # a scheduler plugin
    assert "torch" in heavy_after_each([transport])[transport]


def test_checking_and_planning_a_random_weight_job_never_imports_diffusers(tmp_path):
    """A synthetic job's render set-up (weights check, plans) pays no diffusers import (seconds)."""
    code = f"""
import sys
from farm.decoders import decoder_class
from farm.planning.jobplan import plan_shots
from farm.planning.options import PlanOptions
from farm.store.job import open_job
from farm.inputs.synthetic import synth
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


def test_the_public_api_comes_from_farm_itself():
    """`farm.render`, `farm.plan`, … are the functions and types of the packages that define them,
    loaded on first use; a name farm does not have fails as any missing attribute does."""
    code = """
import sys, json
import farm
light = sorted({"distributed", "torch", "diffusers"} & set(sys.modules))
from farm import render
from farm.planning.jobplan import plan_job
from farm.run.render import render as run_render
api = {name: getattr(farm, name).__module__ for name in farm.__all__ if name != "__version__"}
try:
    farm.no_such_name
    missing = None
except AttributeError as exc:
    missing = str(exc)
print(json.dumps([light, render is run_render, farm.plan is plan_job, api, missing]))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    light, same_render, same_plan, api, missing = json.loads(run.stdout)
    assert light == [] and same_render and same_plan
    assert api["FarmError"] == "farm.errors" and api["Output"] == "farm.store.output"
    assert {"render", "plan", "synth", "ingest", "Job", "open_job", "Output", "VideoSettings"} <= set(api)
    assert missing == "module 'farm' has no attribute 'no_such_name'"
