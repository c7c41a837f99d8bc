"""What the `farm` command tells a user who got something wrong, or asked for quiet: real processes."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import farm


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_command_without_its_arguments_says_what_is_missing_in_two_lines():
    result = farm("render")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 2 and "usage:" not in result.stderr, result.stderr
    assert "required: job, --out" in lines[0] and "farm render --help" in lines[1]


@pytest.mark.parametrize(("variable", "command"), [
    ("DASK_FARM__BATCH_FRAMES", ["render", "job.zarr", "--out", "out"]),
    ("DASK_FARM__BATCH_FRAMES", ["plan", "job.zarr"]),
    ("DASK_FARM__CRF", ["render", "job.zarr", "--out", "out"]),
    ("DASK_FARM__WINDOW", ["render", "job.zarr", "--out", "out"]),
])  # fmt: skip
def test_a_bad_setting_in_the_environment_is_named(tmp_path, variable, command):
    result = farm(*command, cwd=tmp_path, env={variable: "abc"})
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"environment variable {variable} is 'abc', not a whole number" in lines[0]
    assert "--batch-frames" not in lines[0] and "--crf" not in lines[0]
    assert not (tmp_path / "out").exists()


def test_quiet_synth_and_ingest_print_only_what_scripts_read(tmp_path):
    job = tmp_path / "job.zarr"
    synth = farm("-q", "synth", str(job), "--frames", "9", "--height", "64", "--width", "64")
    assert synth.returncode == 0 and synth.stderr == "" and synth.stdout == f"{job}\n"
    loud = farm("synth", str(tmp_path / "loud.zarr"), "--frames", "9", "--height", "64", "--width", "64")
    assert "farm: wrote job" in loud.stderr and loud.stdout == f"{tmp_path / 'loud.zarr'}\n"
    np.save(tmp_path / "clip.npy", np.random.default_rng(0).standard_normal((1, 8, 2, 2, 2), np.float32))
    spec = json.dumps({"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}})
    ingest = farm("-q", "ingest", str(tmp_path / "in.zarr"), str(tmp_path / "clip.npy"), "--decoder", spec,
                  "--latents", "denormalized")  # fmt: skip
    assert ingest.returncode == 0, ingest.stderr
    assert ingest.stderr == "" and ingest.stdout == "clip\n"


def test_ingest_without_weights_names_the_random_seed_form(tmp_path):
    np.save(tmp_path / "clip.npy", np.zeros((1, 8, 2, 2, 2), np.float32))
    result = farm("ingest", str(tmp_path / "job.zarr"), str(tmp_path / "clip.npy"), "--decoder", "ltx2-tiny")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--weights PATH" in lines[0]
    # the form it offers is one ingest takes
    offered = lines[0].split("--decoder '")[-1].rstrip("'")
    assert json.loads(offered)["weights"] == {"random_seed": 0}
    again = farm("ingest", str(tmp_path / "job.zarr"), str(tmp_path / "clip.npy"), "--decoder", offered,
                 "--latents", "denormalized")  # fmt: skip
    assert again.returncode == 0, again.stderr


@pytest.mark.cluster
def test_detached_submit_warns_of_relative_paths(tmp_path, scheduler3, caplog, monkeypatch):
    from farm import submit

    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    (tmp_path / "ep01.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="farm"):
        submit.submit_detached(script, ["latents/ep01", "--out=renders/ep01", "ep01.toml", "--priority", "5",
                                        str(tmp_path)], scheduler3, log=lambda line: None)  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'latents/ep01', 'renders/ep01', 'ep01.toml'" in warnings[0]
    assert "worker's working directory" in warnings[0] and "give absolute paths" in warnings[0]
    assert str(tmp_path) + "'" not in warnings[0] and "'5'" not in warnings[0]


def test_relative_path_arguments_are_those_that_read_as_paths(tmp_path, monkeypatch):
    from farm.submit import relative_path_arguments

    monkeypatch.chdir(tmp_path)
    Path("here.toml").write_text("")
    args = ["a/b", "--out=c/d", "here.toml", "nothere", "--x", "-", str(tmp_path), "tcp://h:1/x", "5"]
    assert relative_path_arguments(args) == ["a/b", "c/d", "here.toml"]


@pytest.mark.cluster
def test_detached_submit_prints_only_its_id_and_cancel_takes_it(tmp_path, scheduler3):
    """SID=$(farm submit … --detach) captures the id alone, which `farm cancel $SID --scheduler-file F`
    takes; cancelling a submission that has already finished says so."""
    from distributed import Client

    scheduler_file = tmp_path / "scheduler.json"
    scheduler_file.write_text(json.dumps({"address": scheduler3}))
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    submitted = farm("submit", str(script), "--scheduler-file", str(scheduler_file), "--detach", "--", "x")
    assert submitted.returncode == 0, submitted.stderr
    sid = submitted.stdout.strip()
    assert submitted.stdout == f"{sid}\n" and " " not in sid, submitted.stdout
    assert f"farm: submission {sid}" in submitted.stderr and "farm cancel" in submitted.stderr
    with Client(scheduler3, set_as_default=False) as client:
        deadline = time.time() + 60
        while client.get_metadata(["farm", "submissions", sid, "state"], default=None) != "done":
            assert time.time() < deadline, "the detached no-op workflow did not finish"
            time.sleep(0.2)
    cancel = farm("cancel", *sid.split(), "--scheduler-file", str(scheduler_file))
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == "" and f"farm: {sid} had already finished" in cancel.stderr, cancel.stderr
    assert "released" not in cancel.stderr


@pytest.mark.slow
def test_a_frame_range_render_reports_what_it_wrote_on_stderr_as_status_counts_it(tmp_path, scheduler3):
    """--frames 1-16 with 32-frame batches writes one batch of each shot: the summary (stderr, as every
    `farm:` message) says so and how much of its shots OUT holds, as `farm status` does."""
    job = tmp_path / "job.zarr"
    made = farm("synth", str(job), "--shots", "2", "--frames", "33", "--height", "64", "--width", "64")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "out"
    render = farm("render", str(job), "--out", str(out), "--scheduler", scheduler3, "--frames", "1-16",
                  "--batch-frames", "32")  # fmt: skip
    assert render.returncode == 0, render.stderr
    assert all(line.startswith("  ") for line in render.stdout.splitlines()), render.stdout  # outputs only
    summary = [line for line in render.stderr.splitlines() if line.startswith("farm: wrote")]
    assert len(summary) == 1, render.stderr
    assert "wrote 64 frames in 2 batch(es) of the 2 this render was to write" in summary[0]
    assert summary[0].endswith("OUT holds 2 of 4 batches of its 2 shot(s), 0 finished"), summary[0]
    status = farm("status", str(out))
    assert [line.split()[1] for line in status.stdout.splitlines()[1:3]] == ["1/2", "1/2"], status.stdout
