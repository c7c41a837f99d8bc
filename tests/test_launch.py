"""The `farm` command's entry point (`farm.launch`): a command that will start a local cluster starts its
worker forkserver before it imports `farm.cli` and what that imports; which one will is told from its words
alone, and a command that joins a running scheduler, or starts no cluster, starts no server."""

from __future__ import annotations

import json
import subprocess
import sys

import dask.config
import pytest

from farm.launch import starts_local_cluster


@pytest.mark.parametrize(
    ("argv", "starts"),
    [
        (["render", "job.zarr", "--out", "out"], True),
        (["-v", "render", "job.zarr", "--out", "out", "--workers", "2"], True),
        (["render", "job.zarr", "--out", "out", "--scheduler", "tcp://10.0.0.1:8786"], False),
        (["render", "job.zarr", "--out", "out", "--scheduler=tcp://10.0.0.1:8786"], False),
        (["render", "job.zarr", "--out", "out", "--scheduler-file", "s.json"], False),
        (["render", "job.zarr", "--out", "out", "--sched", "tcp://10.0.0.1:8786"], False),  # a prefix
        (["cluster", "--gpus", "0"], True),
        (["demo", "--out", "demo"], True),
        (["cluster", "--backend", "slurm", "--slurm-jobs", "2"], False),  # its workers start elsewhere
        (["cluster", "--backend=local-cuda"], False),  # the command decides, as without the launcher
        (["render", "--help"], False),
        (["plan", "job.zarr"], False),
        (["status", "out"], False),
        (["submit", "flow.py"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_which_commands_start_a_local_cluster(argv, starts):
    assert starts_local_cluster(argv) is starts


def test_a_scheduler_address_setting_is_joined_unless_workers_are_given():
    with dask.config.set({"scheduler-address": "tcp://10.0.0.1:8786"}):
        assert starts_local_cluster(["render", "job.zarr", "--out", "out"]) is False
        assert starts_local_cluster(["render", "job.zarr", "--out", "out", "--workers", "1"]) is True


# A command run through the entry point, noting what was imported when the forkserver was asked to start.
PROBE = """
import json, sys
from farm.run import worker_forkserver
asked = []
real = worker_forkserver.start_worker_imports
def noted():
    asked.append(sorted(m for m in ("farm.cli", "farm.run.render", "zarr", "numpy") if m in sys.modules))
    return real()
worker_forkserver.start_worker_imports = noted
from farm.launch import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "asked": asked}))
"""


def test_a_render_starts_its_server_before_the_commands_imports(tmp_path):
    argv = ["render", str(tmp_path / "no-such-job"), "--out", str(tmp_path / "out")]
    run = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["code"] != 0 and "farm: error:" in run.stderr  # no such job, in words
    assert result["asked"][0] == []  # first asked before farm.cli and its imports
    assert not (tmp_path / "out").exists()

    probe = [sys.executable, "-c", PROBE, "status", str(tmp_path / "out")]
    status = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert json.loads(status.stdout.strip().splitlines()[-1])["asked"] == []  # no cluster, no server


def test_python_dash_m_farm_is_the_command():
    command = [sys.executable, "-m", "farm", "--version"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("farm "), (run.stdout, run.stderr)


def test_the_command_ends_with_its_code_and_all_it_printed(tmp_path):
    """`farm.launch.run` ends the process without the interpreter's teardown: its code and its output,
    written to pipes, arrive whole."""
    job = tmp_path / "job.zarr"
    made = subprocess.run([sys.executable, "-m", "farm", "synth", str(job), "--decoder", "ltx2-tiny",
                           "--shots", "3", "--frames", "9", "--height", "64", "--width", "64"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"{job}\n"
    listed = subprocess.run([sys.executable, "-m", "farm", "plan", str(job)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert all(f"shot00{i}" in listed.stdout for i in range(3)), listed.stdout
    missing = subprocess.run([sys.executable, "-m", "farm", "status", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "farm: error:" in missing.stderr, (missing.returncode, missing.stderr)


@pytest.mark.cluster
def test_a_verbose_render_says_when_its_server_started_and_its_cluster_closed(tmp_path):
    import re

    job = tmp_path / "job.zarr"
    synth = [sys.executable, "-m", "farm", "synth", str(job), "--decoder", "ltx2-tiny", "--shots", "1",
             "--frames", "9", "--height", "64", "--width", "64"]  # fmt: skip
    made = subprocess.run(synth, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    command = [sys.executable, "-m", "farm", "-v", "render", str(job), "--out", str(tmp_path / "out"),
               "--workers", "1"]  # fmt: skip
    rendered = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    start = re.search(r"the command's start \(Python, farm's imports\) ([\d.]+) s before the render's; "
                      r"the worker forkserver started at ([\d.]+) s", rendered.stderr)  # fmt: skip
    assert start is not None, rendered.stderr[-3000:]
    assert float(start[2]) <= float(start[1])  # the server first, before farm.cli's imports
    assert re.search(r"closed the local cluster in [\d.]+ s", rendered.stderr)
