"""Values and files farm is handed that are out of bounds or in its way: every bounded value is bounded
(frame numbers, timecode fields, name widths, what OUT records, frame rates in files), every JSON file
farm reads is read defensively (never a FIFO, a device or beyond a size or nesting depth), OUT holds one
job's render, and a shot's error stays that shot's. Each refusal is one line, without a traceback,
before any cluster starts where it can be known then.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.planning.options import PlanOptions
from farm.run.render import render
from farm.safe_read import MAX_JSON_DEPTH, read_json
from farm.store.job import open_job
from farm.store.markers import mark_done
from farm.store.output import Output
from farm.store.output_kinds import BATCH_OUTPUTS, SEQUENCE, VIDEO, batch_checks, verified_batches

QUIET = {"log": lambda _: None}
TILES = PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever gets as far as a cluster fails to connect
DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's recursion limit


def farm_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`farm ARGS` in a child process; a command that hangs fails the test (TimeoutExpired)."""
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)  # fmt: skip


def one_line_refusal(result: subprocess.CompletedProcess, *needles: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bounds") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, seed=3)
    return path


@pytest.fixture(scope="module")
def rendered(job, tmp_path_factory, scheduler3) -> Path:
    """An OUT holding a finished render of `job` (2 batches of shot000, its video and timeline)."""
    out = tmp_path_factory.mktemp("bounds-out") / "out"
    render(job, out, scheduler=scheduler3, options=TILES, **QUIET)
    return out


@pytest.fixture
def out(rendered, tmp_path) -> Path:
    """A copy of `rendered` this test may damage."""
    copy = tmp_path / "out"
    shutil.copytree(rendered, copy, symlinks=True)
    return copy


# ---- every bounded value bounded -------------------------------------------------------------------


@pytest.mark.parametrize("first", ["9223372036854775800", "3000000000", str(10**29), "2147483647"])
def test_a_first_frame_beyond_32_bit_frame_numbers_is_refused_before_anything(job, tmp_path, first):
    result = farm_cli("render", str(job), "--out", str(tmp_path / "out"), "--first-frame", first,
                      "--scheduler", NOWHERE)  # fmt: skip
    line = one_line_refusal(result, f"--first-frame {first}", "2147483647")
    assert "could not connect" not in line
    assert not (tmp_path / "out").exists()


def test_the_largest_first_frame_that_fits_the_shot_is_named(job, tmp_path):
    result = farm_cli("render", str(job), "--out", str(tmp_path / "out"), "--first-frame", "2147483640",
                      "--scheduler", NOWHERE)  # fmt: skip
    one_line_refusal(result, "shot 'shot000' has 9 frames", "at most 2147483639")


@pytest.mark.parametrize("timecode", ["25:00:00:00", "24:00:00:00", "99:59:59:23"])
def test_a_timecode_past_23_hours_is_refused(job, tmp_path, timecode):
    result = farm_cli("render", str(job), "--out", str(tmp_path / "out"), "--timecode", timecode,
                      "--sequence", "png8", "--scheduler", NOWHERE)  # fmt: skip
    one_line_refusal(result, timecode, "hours 0-23")
    assert not (tmp_path / "out").exists()


def test_an_absurd_name_width_is_refused_in_a_short_line(tmp_path):
    np.save(tmp_path / "clip.npy", np.zeros((1, 8, 2, 2, 2), np.float32))
    spec = json.dumps({"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}})
    result = farm_cli("ingest", str(tmp_path / "job.zarr"), str(tmp_path / "clip.npy"), "--decoder", spec,
                      "--latents", "denormalized", "--name", "{n:050000000}")  # fmt: skip
    line = one_line_refusal(result, "--name", "200 characters")
    assert len(result.stderr) < 1000, len(result.stderr)
    assert "{n}" in line


def test_a_recorded_frame_count_does_not_bound_what_a_restart_loops_over(tmp_path):
    out = Output(tmp_path / "out")
    folder = out.sequence_dir("shot000")
    folder.mkdir(parents=True)
    for number in (1, 2, 3):
        (folder / f"shot000.{number:04d}.png").write_bytes(b"png")
    (folder / "notes.txt").write_bytes(b"the user's")
    recorded = {"outputs": {"sequence": "png8", "first_frame": 1}, "plan": {"pixel_shape": [10**10, 64, 64]}}
    removal = threading.Thread(target=SEQUENCE.remove, args=(out, "shot000", recorded), daemon=True)
    removal.start()
    removal.join(timeout=20)
    assert not removal.is_alive(), "removing an old sequence loops over the recorded frame count"
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("fps", ["nan", "inf", "0", "-24"])
def test_a_frame_rate_in_a_files_metadata_that_is_not_one_is_refused_by_name(tmp_path, fps):
    from safetensors.numpy import save_file

    save_file({"latents": np.zeros((1, 8, 2, 2, 2), np.float32)}, str(tmp_path / "clip.safetensors"),
              metadata={"fps": fps})  # fmt: skip
    spec = json.dumps({"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}})
    result = farm_cli("ingest", str(tmp_path / "job.zarr"), str(tmp_path / "clip.safetensors"), "--decoder",
                      spec, "--latents", "denormalized")  # fmt: skip
    one_line_refusal(result, "'fps' in its metadata", repr(fps))
    assert not (tmp_path / "job.zarr").exists()


def test_an_invalid_fps_beside_a_valid_rate_is_named_as_the_fps(tmp_path):
    path = tmp_path / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    group = zarr.open_group(str(path / "shot000"), mode="a")
    group.attrs.update({"fps": float("nan"), "rate": "24"})
    with pytest.raises(FarmError, match=r"shot 'shot000': fps nan is invalid") as refused:
        render(path, tmp_path / "out", scheduler=NOWHERE, options=TILES, **QUIET)
    assert "'24'" not in str(refused.value)


# ---- every file farm reads, read defensively -------------------------------------------------------


def test_the_reader_refuses_a_fifo_a_device_a_deep_and_a_huge_file_in_one_line(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    os.symlink("/dev/zero", tmp_path / "zero.json")
    (tmp_path / "deep.json").write_text("[" * 1000 + "]" * 1000)
    (tmp_path / "big.json").write_bytes(b" " * 3000)
    cases = {"fifo.json": "not a regular file", "zero.json": "symbolic link",
             "deep.json": f"more than {MAX_JSON_DEPTH} levels", "big.json": "more than farm reads"}
    for name, words in cases.items():
        with pytest.raises(FarmError, match=words) as refused:
            read_json(tmp_path / name, f"file {name}", limit=2500)
        assert name in str(refused.value) and "\n" not in str(refused.value)
    (tmp_path / "fine.json").write_text('{"a": ["[[[", "\\"[", "\\n"]}')  # brackets in strings do not nest
    assert read_json(tmp_path / "fine.json", "fine.json") == {"a": ["[[[", '"[', "\n"]}


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_a_scheduler_file_that_is_a_fifo_or_too_deep_is_refused_by_every_command(job, tmp_path, kind):
    scheduler_file = tmp_path / "scheduler.json"
    if kind == "fifo":
        os.mkfifo(scheduler_file)
    else:
        scheduler_file.write_text(DEEP)
    workflow = tmp_path / "wf.py"
    workflow.write_text("def main(args):\n    pass\n")
    commands = [
        ["render", str(job), "--out", str(tmp_path / "out"), "--scheduler-file", str(scheduler_file)],
        ["cancel", "abc12345", "--scheduler-file", str(scheduler_file)],
        ["submit", str(workflow), "--scheduler-file", str(scheduler_file)],
    ]
    for command in commands:
        one_line_refusal(farm_cli(*command, timeout=60), str(scheduler_file))
    assert not (tmp_path / "out").exists()


def test_a_cost_model_or_decoder_spec_nested_too_deep_is_refused_in_one_line(job, tmp_path):
    (tmp_path / "deep.json").write_text(DEEP)
    one_line_refusal(farm_cli("plan", str(job), "--cost-model", str(tmp_path / "deep.json")), "deep.json",
                     "levels deep")  # fmt: skip
    np.save(tmp_path / "clip.npy", np.zeros((1, 8, 2, 2, 2), np.float32))
    result = farm_cli("ingest", str(tmp_path / "job.zarr"), str(tmp_path / "clip.npy"), "--decoder",
                      str(tmp_path / "deep.json"), "--latents", "denormalized")  # fmt: skip
    one_line_refusal(result, "deep.json", "levels deep")


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
def test_status_verify_names_a_timeline_that_is_not_a_file_farm_reads(out, kind):
    timeline = out / "timeline.otio"
    timeline.unlink()
    if kind == "fifo":
        os.mkfifo(timeline)
    elif kind == "zero":
        os.symlink("/dev/zero", timeline)
    else:
        timeline.write_text(DEEP)
    result = farm_cli("status", str(out), "--verify", timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "timeline.otio" in result.stderr and "is not a timeline farm wrote" in result.stderr


def test_a_damaged_done_marker_is_a_batch_to_redo_not_a_crash(out):
    output = Output(out)
    marker = output.done_marker("shot000", 0)
    marker.write_text(DEEP)
    intact, damaged = verified_batches(output, "shot000", batch_checks(["video"]), total=2)
    assert intact == {1} and damaged == {0}
    result = farm_cli("status", str(out), "--verify", timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "batch 0: its done marker is unreadable" in result.stderr


# ---- one job per OUT ------------------------------------------------------------------------------


def test_a_render_of_another_job_into_an_out_is_refused_naming_both(job, rendered, tmp_path):
    other = tmp_path / "other.zarr"
    synth(other, decoder="ltx2-tiny", shots=3, frames=9, height=64, width=64, seed=4)
    before = (rendered / "frames.zarr" / "zarr.json").read_bytes()
    with pytest.raises(FarmError) as refused:
        render(other, rendered, scheduler=NOWHERE, options=TILES, shots=["shot002"], **QUIET)
    message = str(refused.value)
    assert "\n" not in message and "--restart" in message
    assert str(other) in message and str(job) in message
    assert (rendered / "frames.zarr" / "zarr.json").read_bytes() == before


# ---- a shot's error stays that shot's ---------------------------------------------------------------


@pytest.mark.parametrize("bad", ["shöt", "-rf", "a.tmp"])
def test_a_badly_named_shot_group_fails_alone(job, tmp_path, bad):
    path = tmp_path / "job.zarr"
    shutil.copytree(job, path)
    shutil.copytree(path / "shot000", path / bad)
    plan = farm_cli("plan", str(path), "--tiles", "1,1,1")
    assert plan.returncode == 0, plan.stderr
    assert "shot000" in plan.stdout and repr(bad) in plan.stderr
    assert open_job(path).shots[bad].problem is not None
    result = farm_cli("render", str(path), "--out", str(tmp_path / "out"), "--shots", "shot000",
                      "--scheduler", NOWHERE)  # fmt: skip
    one_line_refusal(result, "could not connect")  # past the job and its shots, to the (absent) cluster


def test_a_stray_done_marker_marks_nothing_and_verify_names_it(out):
    mark_done(Output(out).done_dir("shot000") / "00099")
    status = farm_cli("status", str(out))
    assert status.returncode == 0, status.stderr
    assert "2/2" in status.stdout and "99" not in status.stdout
    verify = farm_cli("status", str(out), "--verify")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert ".farm/done/shot000/00099 marks a batch the shot does not have" in verify.stderr


def test_a_marker_without_checksums_accepts_no_empty_output(out):
    output = Output(out)
    video = VIDEO.files(output, "shot000")[0]
    mark_done(VIDEO.marker(output, "shot000"))  # a marker without a record: no checksum
    assert VIDEO.intact(output, "shot000")
    video.write_bytes(b"")
    assert not VIDEO.intact(output, "shot000") and VIDEO.damaged(output, "shot000")
    segment_kind = next(kind for kind in BATCH_OUTPUTS if kind.name == "segment")
    segment = output.segment("shot000", 0)
    segment.parent.mkdir(parents=True, exist_ok=True)
    segment.write_bytes(b"")
    assert not segment_kind.intact(output, "shot000", 0, {})
    segment.write_bytes(b"not empty")
    assert segment_kind.intact(output, "shot000", 0, {})
