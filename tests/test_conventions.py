"""farm as the Python and Dask ecosystems expect it: version, logging streams, help and documented defaults,
dask.config settings (YAML, DASK_FARM__ variables, DASK_SCHEDULER_ADDRESS), the dashboard."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import zarr

from farm import cli, config
from farm.inputs.synthetic import synth
from farm.planning.options import PlanOptions
from farm.run.recorded import RECORDED_OPTIONS
from farm.run.render import render
from farm.store.output import Output
from tests.helpers import farm

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"  # every command and option
CONFIG_DOC = ROOT / "docs" / "configuration.md"  # the farm.* settings table
WHOLE = PlanOptions(tiles=(1, 1, 1), batch_frames=8)


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o.startswith("--")}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conv") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64)
    return path


def test_version_comes_from_the_package_metadata():
    result = farm("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"farm {importlib.metadata.version('farm-decode')}"


@pytest.mark.slow
def test_help_shows_defaults_and_every_decoder_family():
    text = farm("render", "--help").stdout
    for option, default in [("--batch-frames", "32"), ("--crf", "18"), ("--preset", "veryfast"),
                            ("--tiles", "auto"), ("--codec", "h264"), ("--first-frame", "1")]:  # fmt: skip
        help_of = text[text.index("\n  " + option) :]  # its entry under options:
        assert f"(default: {default})" in " ".join(help_of.split())[:400], option
    # argparse wraps long lines at hyphens too ("ltxv-" / "tiny"): join such breaks back
    synth = re.sub(r"-\s+", "-", " ".join(farm("synth", "--help").stdout.split()))
    for config_name in ("ltx2-tiny", "ltxv-tiny", "wan-tiny", "hunyuanvideo-tiny"):
        assert config_name in synth


def documented_config_table() -> dict[str, tuple[str, str]]:
    """docs/configuration.md's settings table: key → (option, default)."""
    row = r"^\| `farm\.([a-z-]+)` \| (`--[a-z-]+`|–) \| `?([^`|]+?)`? \|"
    rows = re.findall(row, CONFIG_DOC.read_text(), re.M)
    return {key: (option.strip("`"), default) for key, option, default in rows}


def test_documented_configuration_table_matches_the_defaults_and_the_parser():
    documented = documented_config_table()
    packaged = config.defaults()
    assert set(documented) == set(packaged)  # every key documented, no stale ones
    render = options_of(subcommand("render"))
    for key, (option, default) in documented.items():
        value = packaged[key]
        assert default == ("unset" if value is None else str(value)), key
        if option in RECORDED_OPTIONS:  # unset: OUT's on a rerun, else the setting (shown in the help)
            assert render[option].default is None, option
        elif option != "–":
            assert render[option].default == value, option  # the parser's default is the setting


def test_documented_command_rows_name_the_parser_options():
    text = CLI_DOC.read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `farm (\w+) .*$", text, re.M)}  # whole rows
    outputs = re.search(r"^\| render outputs \|.*$", text, re.M).group(0)
    for name in ("synth", "ingest", "render", "plan", "status", "demo", "cluster", "submit", "cancel"):
        documented = set(re.findall(r"--[a-z][a-z-]*", rows[name] + (outputs if name == "render" else "")))
        parsed = set(options_of(subcommand(name))) - {"--help", "--verbose", "--quiet"}
        assert parsed <= documented, f"farm {name}: docs/cli.md lacks {sorted(parsed - documented)}"
        assert documented <= parsed, f"farm {name}: docs/cli.md names {sorted(documented - parsed)}"
    assert "default `auto`" in text[text.index("- `--tiles F,H,W`") :][:200]
    readme = README.read_text()  # the README's command list names every command and links the page
    for name in rows:
        assert re.search(rf"^\| `farm {name}` \| .+ \|$", readme, re.M), f"README's commands lack farm {name}"
    assert "(docs/cli.md)" in readme


def test_readme_two_commands_are_the_demo_and_what_ci_runs():
    blocks = re.findall(r"^```bash\n(.*?)\n```", README.read_text(), re.M | re.S)
    demo, tests = blocks[0], blocks[1]
    assert demo.startswith("python3 -m venv .venv && ") and demo.endswith("farm demo --out demo-out"), demo
    assert tests == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[test]' "
        "&& pip install --no-deps -r tests/references.txt && ruff check . && mypy && python -m pytest"
    )
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.replace("pip install -q ", "pip install ") == tests  # CI runs the README's command verbatim


@pytest.mark.slow
def test_plan_names_the_cost_models_device(job):
    result = farm("plan", str(job))
    assert result.returncode == 0, result.stderr
    assert "CPU decode utilisation" in result.stdout and "GPU decode" not in result.stdout


@pytest.mark.slow
def test_yaml_and_environment_set_farms_defaults(tmp_path):
    (tmp_path / "farm.yaml").write_text("farm:\n  crf: 23\n  preset: medium\n")
    env = {"DASK_CONFIG": str(tmp_path), "DASK_FARM__BATCH_FRAMES": "16"}
    text = " ".join(farm("render", "--help", env=env).stdout.split())
    assert "farm.crf (default: 23)" in text and "farm.preset (default: medium)" in text
    assert "farm.batch-frames (default: 16)" in text
    probe = "import farm.config as c; print(c.get('crf'), c.get('batch-frames'), c.get('codec'))"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, **env})  # fmt: skip
    assert run.stdout.split() == ["23", "16", "h264"]
    # the API's defaults too: PlanOptions and VideoSettings
    api = (
        "from farm.planning.options import PlanOptions; from farm.media.settings import VideoSettings; "
        "p, v = PlanOptions(), VideoSettings(); print(p.batch_frames, p.tiles, v.crf, v.preset, v.codec)"
    )
    env = {**os.environ, **env, "DASK_FARM__TILES": "1,1,2"}
    run = subprocess.run([sys.executable, "-c", api], capture_output=True, text=True, env=env)
    assert run.stdout.strip() == "16 (1, 1, 2) 23 medium h264", run.stderr


def test_scheduler_address_and_farm_settings_reach_a_real_render(job, tmp_path, cluster3):
    """DASK_SCHEDULER_ADDRESS joins the running cluster (no local one); DASK_FARM__ sets the plan."""
    out = Output(tmp_path / "out")
    env = {"DASK_SCHEDULER_ADDRESS": cluster3.scheduler.address, "DASK_FARM__BATCH_FRAMES": "8",
           "DASK_FARM__FIRST_FRAME": "101", "DASK_FARM__TILES": "1,1,1"}  # fmt: skip
    result = farm("render", str(job), "--out", str(out.root), "--no-video", env=env)
    assert result.returncode == 0, result.stderr
    renders = cluster3.get_metadata(["farm", "renders"])
    assert any(r.get("out") == str(out.root) for r in renders.values())  # it ran on cluster3
    group = zarr.open_group(str(out.frames_zarr / "shot000"), mode="r")
    assert group.attrs["batches"] == 3 and group["frames"].chunks[0] == 8  # 17 frames in batches of 8
    assert group["frame"][0] == 101
    # stdout: what a script reads; stderr: the messages (dashboard, render id)
    # (stdout: the outputs' paths alone; the summary of what was written is a message)
    assert result.stdout.splitlines()[0].strip() == f"frames: {out.frames_zarr}"
    assert "render id" in result.stderr and "render id" not in result.stdout
    assert "farm: wrote " in result.stderr and "wrote" not in result.stdout


def test_quiet_keeps_warnings_on_stderr_and_the_outputs_on_stdout(job, tmp_path, scheduler3):
    out = tmp_path / "q"
    result = farm("render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1", "-q")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("farm: warning: ") for line in lines), lines  # no info lines
    assert any("RANDOM weights" in line for line in lines)
    assert f"video:  {out / 'videos' / 'shot000.mp4'}" in result.stdout


def test_progress_starts_with_the_totals(job, tmp_path, scheduler3):
    calls = []

    def record(stats) -> None:
        calls.append((stats.batches_written, stats.batches_total, stats.tiles_decoded))

    render(job, tmp_path / "p", scheduler=scheduler3, options=WHOLE, log=print, on_progress=record)
    assert calls[0] == (0, 3, 0) and calls[-1][0] == 3


def test_dashboard_serves_status_during_a_render(job, tmp_path, scheduler3):
    """bokeh is installed with farm: the dashboard link a render prints answers while it runs."""
    messages, pages = [], []

    def fetch_status(stats) -> None:
        if pages:
            return
        link = next(m for m in messages if "dashboard http" in m).split("dashboard ")[1].split(",")[0]
        with urllib.request.urlopen(link, timeout=30) as response:
            pages.append((response.status, response.read().decode()))

    render(job, tmp_path / "d", scheduler=scheduler3, options=WHOLE, log=messages.append,
              on_progress=fetch_status)  # fmt: skip
    status, body = pages[0]
    assert status == 200 and "Dask needs bokeh" not in body and "bokeh" in body.lower()


@pytest.mark.model  # imports diffusers' LTX-Video module (5 s): outside the fast tier
def test_packaging_pins_what_farm_relies_on():
    """The installed distribution's metadata: diffusers capped (farm hooks a private class of it), bokeh
    within dask-cuda's range, ruff pinned for CI; and what is installed satisfies them."""
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in importlib.metadata.requires("farm-decode")]
    runtime = {r.name: r for r in requires if r.marker is None}
    diffusers = runtime["diffusers"]
    assert any(spec.operator == "<" for spec in diffusers.specifier)
    assert diffusers.specifier.contains(importlib.metadata.version("diffusers"))
    from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoResnetBlock3d  # hooked by ltxv

    assert LTXVideoResnetBlock3d.forward
    assert runtime["bokeh"].specifier.contains("3.9.2") and not runtime["bokeh"].specifier.contains("3.10.0")
    (ruff,) = [r for r in requires if r.name == "ruff"]
    assert [s.operator for s in ruff.specifier] == ["=="] and ruff.marker.evaluate({"extra": "test"})
    assert ruff.specifier.contains(importlib.metadata.version("ruff"))


def test_progress_bar_shows_totals_and_time_since_the_command_started(monkeypatch):
    """On a terminal (stderr a TTY) the bar shows the render's totals from its first update, and its
    clock counts from the command's start (cluster start-up and set-up included)."""
    import io
    import time
    import warnings

    from farm import logs
    from farm.run.graph import RenderStats

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    for name in ("handlers", "level", "propagate"):  # logs.setup changes them: restored after the test
        monkeypatch.setattr(logs.LOGGER, name, getattr(logs.LOGGER, name))
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    logs.setup(0, stream=terminal)
    update = cli.progress_bar(time.time() - 16)
    stats = RenderStats(tiles_total=4, batches_total=8)
    update(stats)  # what the render's driver sends before any task has run
    first = terminal.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "0/8" in first and "[00:16<" in first and "tiles 0/4" in first
    stats.batches_written, stats.tiles_decoded, stats.seconds = 8, 4, 20.0
    update(stats)
    assert "8/8" in terminal.getvalue().replace("\r", "\n").strip().splitlines()[-1]


def test_distributeds_shutdown_noise_is_hidden_unless_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nanny's slow-exit warning and the NameError of distributed's sync race on Ctrl-C are not
    shown to a user (the render stopped as asked); other errors still are, and -v shows everything."""
    import io
    import logging
    import warnings

    from farm import logs

    for name in ("handlers", "level", "propagate"):  # logs.setup changes them: restored after the test
        monkeypatch.setattr(logs.LOGGER, name, getattr(logs.LOGGER, name))
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    tornado = logging.getLogger("tornado.application")
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    tornado.addHandler(handler)
    race = "Exception in callback functools.partial(<function sync.<locals>.cancel at 0x7f00>)"
    try:
        logs.setup(0, stream=io.StringIO())
        tornado.error(race)
        tornado.error("Exception in callback something else")
        assert seen.getvalue().splitlines() == ["Exception in callback something else"]
        logs.setup(1, stream=io.StringIO())
        tornado.error(race)
        assert seen.getvalue().splitlines()[-1] == race
    finally:
        tornado.removeHandler(handler)
        logs.setup(0, stream=io.StringIO())
