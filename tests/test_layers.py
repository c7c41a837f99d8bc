"""The package's layering, checked in a fresh interpreter, where nothing is imported yet: the pure
packages (planning, the job and output stores, decoders, media, inputs) import neither Dask distributed
nor torch, so the fast tier and `farm plan` do not pay for them; no module outside `farm.worker`
imports torch or diffusers at module level; `import farm` loads none of them."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# Sub-packages of code that runs on a device and imports torch when it is imported (only inside the
# functions that decode): `farm.decoders.<family>.device`.
DEVICE_CODE = "device"


def modules_of(*packages: str) -> list[str]:
    """The modules of farm's `packages` (``""``: the modules directly under farm/) and of their
    sub-packages (a decoder family's folder), by their files; device code left out."""
    names = []
    for package in packages:
        folder = ROOT / "farm" / package
        for path in sorted(folder.rglob("*.py") if package else folder.glob("*.py")):
            inner = path.relative_to(folder).parts
            if DEVICE_CODE in inner[:-1]:
                continue
            parts = ["farm", *([package] if package else []), *inner[:-1], path.stem]
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


def test_the_cli_and_planning_load_no_pyav():
    """PyAV (some 0.1 s) waits for the commands that encode: `farm plan`, `farm status` and the planning
    modules do not load it (`media/settings` and `run/validate` import `media/video` where they use it)."""
    code = """
import json, sys
import farm.cli, farm.planning.planner, farm.run.plan_report, farm.run.validate, farm.store.progress
print(json.dumps("av" in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) is False


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
from farm.run.render import render as defined_render
api = {name: getattr(farm, name).__module__ for name in farm.__all__ if name != "__version__"}
try:
    farm.no_such_name
    missing = None
except AttributeError as exc:
    missing = str(exc)
print(json.dumps([light, render is defined_render, farm.plan is plan_job, api, missing]))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    light, same_render, same_plan, api, missing = json.loads(run.stdout)
    assert light == [] and same_render and same_plan
    assert api["FarmError"] == "farm.errors" and api["Output"] == "farm.store.output"
    assert {"render", "plan", "plan_report", "synth", "ingest", "Job", "open_job", "Output",
            "VideoSettings"} <= set(api)  # fmt: skip
    assert api["plan_report"] == "farm.run.plan_report"
    assert missing == "module 'farm' has no attribute 'no_such_name'"


def test_the_render_module_exports_only_what_it_defines():
    """Tests, tools and workflows take a name from ``farm`` or from the module that defines it:
    `farm.run.render` hands on nothing of other modules'."""
    import farm.run.render

    assert "render" in farm.run.render.__all__
    assert {name: getattr(farm.run.render, name).__module__ for name in farm.run.render.__all__} == {
        name: "farm.run.render" for name in farm.run.render.__all__
    }


# The modules under farm/ that every package may import: the ground floor (docs/architecture.md).
GROUND = {"farm.errors", "farm.config", "farm.logs", "farm.keys", "farm.render_ids", "farm.owner",
          "farm.safe_read"}


def may_import(package: str) -> set[str]:
    """The farm packages and modules the "May import" paragraph of `package`'s ``__init__.py`` names."""
    doc = ast.get_docstring(ast.parse((ROOT / "farm" / package / "__init__.py").read_text())) or ""
    assert "May import" in doc, f"farm/{package}/__init__.py says nothing of what it may import"
    paragraph = doc[doc.index("May import") :].split("\n\n")[0]
    return {name.split("'")[0] for name in re.findall(r"`(farm\.[a-z_]+)", paragraph)}


def farm_imports(package: str) -> dict[str, set[str]]:
    """Each module of `package` (its sub-packages too) and the farm packages or top-level modules it
    imports anywhere: at module level, inside functions, for type checking alone."""
    found = {}
    for path in sorted((ROOT / "farm" / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                is_farm = node.module == "farm"  # from farm import config
                names.update([f"farm.{a.name}" for a in node.names] if is_farm else [node.module])
        top = {".".join(name.split(".")[:2]) for name in names if name.startswith("farm.")}
        found[str(path.relative_to(ROOT))] = top
    return found


def layer_breaches(package: str) -> dict[str, list[str]]:
    allowed = may_import(package) | GROUND | {f"farm.{package}"}
    return {path: sorted(names - allowed) for path, names in farm_imports(package).items() if names - allowed}


PACKAGES = ["dashboard", "decoders", "inputs", "media", "planning", "run", "store", "worker"]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_init_says_it_may(package):
    assert may_import(package), f"farm/{package}/__init__.py names no farm package it may import"
    assert layer_breaches(package) == {}


def test_the_layer_check_can_fail():
    """The media package may import no other farm package; run imports them all."""
    assert may_import("media") == {"farm.errors", "farm.config"}
    assert set(farm_imports("run")["farm/run/render.py"]) - may_import("media") - GROUND


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def farm_module(dotted: str) -> bool:
    path = ROOT / Path(*dotted.split("."))
    return dotted.split(".")[0] == "farm" and (path.with_suffix(".py").is_file() or path.is_dir())


def private_farm_names(source: str) -> list[str]:
    """The private names of farm modules a test's `source` takes: imported (``from farm.x import _y``)
    or read off a farm module (``x._y`` where ``x`` names one)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the farm module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if farm_module(alias.name) and alias.asname:  # import farm.x.y as m
                    modules[alias.asname] = alias.name
                elif farm_module(alias.name):  # import farm.x.y binds farm
                    modules[alias.name.split(".")[0]] = "farm"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and farm_module(node.module or ""):
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                elif farm_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                dotted = ".".join([modules[value.id], *chain])
                if farm_module(dotted):
                    found.append(f"{dotted}.{node.attr}")
    return found


def test_no_test_takes_a_private_farm_name():
    """Tests use what farm offers: the names of `farm` and the public names of the defining modules."""
    tests = sorted((ROOT / "tests").glob("*.py"))
    taken = {path.name: private_farm_names(path.read_text()) for path in tests}
    assert {name: found for name, found in taken.items() if found} == {}


def test_the_private_name_check_can_fail():
    source = """
import farm.run.graph
from farm.dashboard import monitor
from farm.planning.planner import _ShotTasks, predict
from farm.worker import tasks as t
monitor._TaskCounts(); farm.run.graph._cuts; t._ready_marked; monitor.__name__; predict._private
"""
    assert sorted(private_farm_names(source)) == [
        "farm.dashboard.monitor._TaskCounts",
        "farm.planning.planner._ShotTasks",
        "farm.run.graph._cuts",
        "farm.worker.tasks._ready_marked",
    ]
