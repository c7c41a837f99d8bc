"""Operating farm as a studio would: `farm render` into a plain `dask scheduler` with `dask worker`s
started from other folders, `farm cancel` of such a render, and what OUT, `farm status`, the farm page
and the metrics then say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

import pytest
from distributed import Client

from farm.inputs.synthetic import synth
from farm.run.cluster import workers_info
from tests.helpers import farm, workers_paused

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
SCRIPTS = Path(sys.executable).parent


class PlainCluster:
    """A `dask scheduler` and `dask worker` processes on 127.0.0.1, each started in a folder of its own
    (as on a studio's nodes), nothing of farm's set up: farm joins it as any client would."""

    def __init__(self, tmp: Path, workers: int) -> None:
        self.tmp, self.procs = tmp, []
        self.scheduler_file = tmp / "scheduler.json"
        self.start("scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                   "--scheduler-file", str(self.scheduler_file))  # fmt: skip
        deadline = time.time() + 60
        while not self.scheduler_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        self.address = json.loads(self.scheduler_file.read_text())["address"]
        self.client = Client(self.address, set_as_default=False)
        for i in range(workers):
            self.add_worker(f"node{i}")
        self.client.wait_for_workers(workers, timeout=60)

    def start(self, what: str, *args: str, folder: Path | None = None) -> subprocess.Popen:
        cwd = folder or self.tmp
        cwd.mkdir(exist_ok=True)
        proc = subprocess.Popen([str(SCRIPTS / "dask"), what, *args], cwd=cwd, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        self.procs.append(proc)
        return proc

    def add_worker(self, name: str, *args: str) -> subprocess.Popen:
        return self.start("worker", self.address, "--name", name, "--nthreads", "1", "--nworkers", "1",
                          "--no-dashboard", *args, folder=self.tmp / name)  # fmt: skip

    def close(self) -> None:
        self.client.close()
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def plain_cluster(tmp_path_factory):
    cluster = PlainCluster(tmp_path_factory.mktemp("plain"), workers=2)
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def long_job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("jobs") / "long.zarr"
    synth(path, decoder="ltx2-tiny", shots=3, frames=129, height=64, width=64, seed=3)
    return path


class Render:
    """`farm render` in a child process, its stderr read as it comes (the render id, the farm page)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "farm", "render", *args], env=ENV, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def value_after(self, text: str, timeout: float = 60) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.lines:
                if text in line:
                    return line.split(text, 1)[1].split(",")[0].strip()
            assert self.proc.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"farm render did not print {text!r}: {self.lines}")

    def wait(self) -> tuple[int, str, str]:
        stdout, _ = self.proc.communicate(timeout=300)
        time.sleep(0.1)
        return self.proc.returncode, stdout, "\n".join(self.lines)


def done_markers(out: Path) -> int:
    return sum(1 for p in (out / ".farm" / "done").glob("*/*") if p.name.isdigit())


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_farm_cancel_leaves_shots_cancelled_not_failed_and_a_rerun_resumes(plain_cluster, long_job, tmp_path):
    out = tmp_path / "out"
    args = [str(long_job), "--out", str(out), "--scheduler", plain_cluster.address, "--tiles", "2,1,1",
            "--batch-frames", "8"]  # fmt: skip
    render = Render(*args)
    render_id = render.value_after("render id")
    page = render.value_after("farm page")
    wait_until(lambda: done_markers(out) >= 2, 120, "two finished batches")
    with workers_paused(plain_cluster.client):
        kept = done_markers(out)
        cancel = farm("cancel", render_id, "--scheduler", plain_cluster.address, env=ENV)
    assert cancel.returncode == 0, cancel.stderr
    code, stdout, stderr = render.wait()
    assert code == 130, stderr
    assert "Traceback" not in stderr and "RuntimeError" not in stderr and "ended as cancelled" not in stderr
    assert "cancelled before shots" in stderr and "rerun to resume" in stderr
    assert 2 <= kept <= done_markers(out) < 3 * 17, "the render ended before it was cancelled"

    status = farm("status", str(out))
    assert status.returncode == 0
    assert "cancelled" in status.stdout and "3 cancelled" in status.stdout, status.stdout
    with urllib.request.urlopen(page.replace("/farm", "/farm/api/renders.json"), timeout=10) as r:
        record = next(x for x in json.load(r)["renders"] if x["render"] == render_id)
    assert record["state"] == "cancelled"
    assert record["cancelled_shots"] == 3 and record["failed_shots"] == 0, record
    assert {s["state"] for s in record["shots"]} == {"cancelled"}
    with urllib.request.urlopen(page.replace("/farm", "/metrics"), timeout=10) as r:
        metrics = r.read().decode()

    def metric(name: str) -> str:
        lines = [line for line in metrics.splitlines()
                 if line.startswith(name + "{") and f'render="{render_id}"' in line]  # fmt: skip
        assert len(lines) == 1, (name, lines)
        return lines[0].rsplit(" ", 1)[1]

    assert metric("farm_render_cancelled_shots") == "3.0" and metric("farm_render_failed_shots") == "0.0"

    before = done_markers(out)
    rerun = farm("render", *args, "-v", env=ENV)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming" in rerun.stderr
    status = farm("status", str(out)).stdout
    assert "3 of 3 shots finished" in status and "cancelled" not in status, status
    assert done_markers(out) == 3 * 17 and before < 3 * 17


def python_block(page: str, after: str) -> str:
    """The first ```python block of `page` (README.md, docs/…) after the line `after`."""
    text = (ROOT / page).read_text()
    rest = text[text.index(after) :]
    return rest.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_python_api_example_runs_as_written(tmp_path):
    example = python_block("docs/workflows.md", "## Python API")
    assert python_block("README.md", "## Render a job") == example  # the README shows the same example
    (tmp_path / "example.py").write_text(example)
    run = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    frames, videos = run.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(frames) == 2 * 17 and videos.count(".mp4") == 2
    assert (tmp_path / "out" / "videos" / "shot000.mp4").stat().st_size > 0


def one_line_error(run: subprocess.CompletedProcess, code: int) -> str:
    """The one `farm: error:` line a failed command prints, with its exit code, and no traceback."""
    assert run.returncode == code, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("farm: error:")]
    assert len(errors) == 1, run.stderr
    return errors[0]


@pytest.mark.slow
def test_farm_cluster_on_a_taken_port_says_so_in_one_line():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        run = farm("cluster", "--gpus", "0", "--workers", "1", "--port", port, "--dashboard-port", "0")
    line = one_line_error(run, 1)
    assert f"--port {port}" in line and "taken" in line and "0 for any free" in line


@pytest.mark.slow
def test_tls_required_without_certificates_is_one_line_before_anything_starts(tmp_path):
    tls = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    line = one_line_error(farm("cluster", "--gpus", "0", "--port", "0", "--dashboard-port", "0", env=tls), 2)
    assert "distributed.comm.tls.ca-file is not set" in line and "scheduler.cert" in line
    (tmp_path / "ca.pem").write_text("")
    missing = {**tls, "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(tmp_path / "ca.pem"),
               "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(tmp_path / "client.pem")}  # fmt: skip
    for command in (["cancel", "r1", "--scheduler", "tls://127.0.0.1:9"],
                    ["render", "job.zarr", "--out", "out", "--scheduler", "tls://127.0.0.1:9"]):  # fmt: skip
        run = farm(*command, cwd=tmp_path, env=missing)
        if command[0] == "render":  # the job is checked first: give it one
            synth(tmp_path / "job.zarr", decoder="ltx2-tiny")
            run = farm(*command, cwd=tmp_path, env=missing)
        line = one_line_error(run, 2)
        assert f"client.cert names {tmp_path / 'client.pem'}, which is not a file" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_submit_keeps_the_workflows_arguments_after_double_dash(tmp_path, plain_cluster):
    script = tmp_path / "wf.py"
    script.write_text("import sys\nprint('ARGS', sys.argv[1:])\n")
    workflow_args = ["--", "--scheduler", "x", "--out", "o", "a"]
    line = one_line_error(farm("submit", str(script), *workflow_args, env={"DASK_SCHEDULER_ADDRESS": ""}), 2)
    assert "no cluster given" in line, line
    scheduler_file = str(plain_cluster.scheduler_file)
    for how in (["--scheduler", plain_cluster.address], ["--scheduler-file", scheduler_file]):
        run = farm("submit", str(script), *how, *workflow_args)
        assert run.returncode == 0, run.stderr
        assert "ARGS ['--scheduler', 'x', '--out', 'o', 'a']" in run.stdout, run.stdout
    run = farm("submit", str(script), *workflow_args, env={"DASK_SCHEDULER_ADDRESS": plain_cluster.address})
    assert run.returncode == 0, run.stderr
    assert "ARGS ['--scheduler', 'x', '--out', 'o', 'a']" in run.stdout, run.stdout


@pytest.mark.slow
def test_frames_beyond_a_shot_are_refused_with_its_range(tmp_path):
    synth(tmp_path / "job.zarr", decoder="ltx2-tiny", frames=17, height=64, width=64)
    run = farm("render", "job.zarr", "--out", "out", "--frames", "1-500", "--tiles", "1,1,1",
               "--workers", "1", cwd=tmp_path)  # fmt: skip
    line = one_line_error(run, 2)
    assert "frames 18..500 beyond shot 'shot000', whose frames are numbered 1-17" in line, line
    assert not (tmp_path / "out").exists()


def test_every_option_help_says_its_default():
    import argparse

    from farm.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    silent = []
    for name, command in [("farm", parser), *commands.items()]:
        formatter = command.formatter_class(name)  # farm's own, which adds the defaults
        for action in command._actions:
            flags = (argparse._HelpAction, argparse._VersionAction, argparse._CountAction,
                     argparse._StoreTrueAction)  # fmt: skip
            if not action.option_strings or action.required or isinstance(action, flags):
                continue
            text = formatter._get_help_string(action) % {"default": action.default}
            if "default" not in text:
                silent.append(f"farm {name} {action.option_strings[0]}: {text}")
    assert not silent, "\n".join(silent)
    priority = commands["render"].format_help().split("\n  --priority", 1)[1].split("\n  -", 1)[0]
    assert "(default: 0)" in priority, priority  # a default of 0 is shown too


@pytest.mark.slow
def test_plan_and_render_choose_the_same_workers_and_log_lines_have_one_prefix(tmp_path):
    import re

    synth(tmp_path / "job.zarr", decoder="ltx2-tiny", frames=9, height=64, width=64)
    plan = farm("plan", "job.zarr", "--tiles", "1,1,1", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    planned = int(re.search(r"^workers: (\d+)", plan.stdout, re.M).group(1))
    render = farm("-v", "render", "job.zarr", "--out", "out", "--tiles", "1,1,1", cwd=tmp_path)
    assert render.returncode == 0, render.stderr
    assert int(re.search(r"(\d+) worker\(s\)", render.stderr).group(1)) == planned
    lines = [line for line in render.stderr.splitlines() if line.startswith("farm")]
    assert any(line.startswith("farm: debug: set-up") for line in lines), render.stderr
    doubled = [line for line in lines if re.match(r"farm: (\w+: )?(debug: )?farm\b", line)]
    assert not doubled, doubled


# -- rates and timecode ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, exact",
    [("24000/1001", "24000/1001"), ("30000/1001", "30000/1001"), ("23.976", "24000/1001"),
     ("23.98", "24000/1001"), ("29.97", "30000/1001"), ("59.94", "60000/1001"), (23.976, "24000/1001"),
     ("24", "24"), ("25", "25"), ("12.5", "25/2"), (30.0, "30")],
)  # fmt: skip
def test_rates_are_exact_and_ntsc_decimals_mean_ntsc(given, exact):
    from farm.media.rates import parse_rate, rate_text

    assert rate_text(parse_rate(given)) == exact


@pytest.mark.parametrize("bad", ["0", "-24", "1/0", "abc", "24000/", "2000"])
def test_bad_rates_are_refused(bad):
    from farm.errors import FarmError
    from farm.media.rates import parse_rate

    with pytest.raises(FarmError, match="24000/1001"):
        parse_rate(bad)


def test_drop_frame_timecode_skips_labels_and_counts_back():
    from farm.errors import FarmError
    from farm.media.rates import (
        frames_to_timecode,
        parse_rate,
        parse_timecode,
        timecode_at,
        timecode_to_frames,
    )

    ntsc = parse_rate("29.97")
    assert timecode_at("00:00:59;29", ntsc, 1) == "00:01:00;02"  # ;00 and ;01 are skipped
    assert timecode_at("00:09:59;29", ntsc, 1) == "00:10:00;00"  # not at every tenth minute
    assert timecode_to_frames("01:00:00;00", ntsc) == 107892  # an hour of 29.97 holds 107892 frames
    assert all(timecode_to_frames(frames_to_timecode(n, ntsc, True), ntsc) == n for n in range(0, 40000, 13))
    assert timecode_at("00:00:59:23", parse_rate(24), 1) == "00:01:00:00"
    refused = [("01:00:00;00", "24", "drop-frame"), ("00:01:00;01", "29.97", "skips"),
               ("01:00:00:24", "24", "frames 0-23"), ("1h", "24", "HH:MM:SS:FF")]  # fmt: skip
    for text, rate, message in refused:
        with pytest.raises(FarmError, match=message):
            parse_timecode(text, parse_rate(rate))


@pytest.mark.slow
def test_ntsc_rate_and_drop_frame_timecode_reach_the_job_video_exr_and_zarr(plain_cluster, tmp_path):
    import av
    import numpy as np
    import OpenEXR
    import zarr

    made = farm("synth", "job.zarr", "--fps", "23.976", "--frames", "17", "--height", "64", "--width", "64",
                cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    synthetic = zarr.open_group(str(tmp_path / "job.zarr" / "shot000"), mode="r")
    assert synthetic.attrs["rate"] == "24000/1001"
    np.save(tmp_path / "sh010.npy", synthetic["latent"][...])
    ingest = farm("ingest", "job.zarr", "sh010.npy", "--fps", "29.97", "--timecode", "00:00:59;20",
                  cwd=tmp_path)  # fmt: skip
    assert ingest.returncode == 0, ingest.stderr
    shot = zarr.open_group(str(tmp_path / "job.zarr" / "sh010"), mode="r").attrs
    assert shot["rate"] == "30000/1001" and shot["timecode"] == "00:00:59;20"
    on_cluster = ["--scheduler", plain_cluster.address, "--shots", "sh010", "--tiles", "1,1,1"]
    render = farm("render", "job.zarr", "--out", "out", *on_cluster, "--batch-frames", "8",
                  "--sequence", "exr", cwd=tmp_path)  # fmt: skip
    assert render.returncode == 0, render.stderr
    with av.open(str(tmp_path / "out" / "videos" / "sh010.mp4")) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == Fraction(30000, 1001) and stream.frames == 17
        assert {s.metadata.get("timecode") for s in container.streams} == {"00:00:59;20"}
    with OpenEXR.File(str(tmp_path / "out" / "sequences" / "sh010" / "sh010.0001.exr")) as exr:
        header = exr.header()
        assert header["framesPerSecond"] == Fraction(30000, 1001)
        first = header["timeCode"]
    assert (first.minutes, first.seconds, first.frame, first.dropFrame) == (0, 59, 20, True)
    with OpenEXR.File(str(tmp_path / "out" / "sequences" / "sh010" / "sh010.0011.exr")) as exr:
        tenth = exr.header()["timeCode"]  # 00:00:59;20 + 10 frames: ;00 and ;01 of minute 1 skipped
    assert (tenth.minutes, tenth.seconds, tenth.frame) == (1, 0, 2)
    frames = zarr.open_group(str(tmp_path / "out" / "frames.zarr" / "sh010"), mode="r")
    for attrs in (frames.attrs, frames["frames"].attrs):
        assert attrs["rate"] == "30000/1001" and attrs["timecode"] == "00:00:59;20"
    again = farm("render", "job.zarr", "--out", "out2", *on_cluster, "--timecode", "01:00:00:00",
                 "--no-video", cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert zarr.open_group(str(tmp_path / "out2" / "frames.zarr" / "sh010"), mode="r").attrs["timecode"] == (
        "01:00:00:00")  # fmt: skip
    bad = farm("render", "job.zarr", "--out", "out3", "--workers", "1", "--timecode", "01:00:00;00",
               cwd=tmp_path)  # fmt: skip
    line = one_line_error(bad, 2)  # shot000 runs at 24000/1001: no drop-frame there
    assert "shot 'shot000'" in line and "drop-frame" in line, line
    assert not (tmp_path / "out3").exists()


# -- partial outputs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_partial_output_says_which_frames_are_valid_to_xarray_and_dask(plain_cluster, tmp_path):
    import shutil

    import dask.array as da
    import numpy as np
    import xarray as xr
    import zarr

    synth(tmp_path / "job.zarr", decoder="ltx2-tiny", frames=33, height=64, width=64)
    args = ["render", "job.zarr", "--out", "out", "--scheduler", plain_cluster.address, "--tiles", "1,1,1",
            "--batch-frames", "8", "--no-video"]  # fmt: skip
    first = farm(*args, "--frames", "9-16,25-30", cwd=tmp_path)  # batches 1 and 3 of 5
    assert first.returncode == 0, first.stderr
    expected = np.zeros(33, bool)
    expected[8:16] = expected[24:32] = True
    # as docs/outputs.md shows it
    shot = xr.open_zarr(tmp_path / "out" / "frames.zarr", group="shot000", consolidated=False)
    rendered = shot.frames.where(shot.valid)  # frames not rendered yet are NaN, not black
    assert np.array_equal(shot.valid.values, expected)
    assert np.isnan(rendered.sel(frame=1).values).all() and not np.isnan(rendered.sel(frame=9).values).any()
    valid = da.from_zarr(str(tmp_path / "out" / "frames.zarr"), component="shot000/valid")
    assert int(valid.sum().compute()) == 16

    # an output whose array is missing (written before it existed) gets it back from its done markers
    shutil.rmtree(tmp_path / "out" / "frames.zarr" / "shot000" / "valid")
    rest = farm(*args, cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    assert zarr.open_array(str(tmp_path / "out" / "frames.zarr" / "shot000" / "valid"), mode="r")[...].all()


# -- the farm page ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_farm_page_counts_match_the_disk_after_a_kill_and_show_rates_workers_and_workflows(
    plain_cluster, long_job, tmp_path
):
    import re
    import signal

    script = tmp_path / "wf.py"
    script.write_text("print('hello from a workflow')\n")
    assert farm("submit", str(script), "--scheduler", plain_cluster.address).returncode == 0
    out = tmp_path / "out"
    render = Render(str(long_job), "--out", str(out), "--scheduler", plain_cluster.address, "--tiles",
                    "2,1,1", "--batch-frames", "8", "--no-video")  # fmt: skip
    render_id, page = render.value_after("render id"), render.value_after("farm page")
    extra = plain_cluster.add_worker("late-node")
    plain_cluster.client.wait_for_workers(3, timeout=60)
    wait_until(lambda: done_markers(out) >= 3, 120, "three finished batches")
    render.proc.send_signal(signal.SIGKILL)
    render.proc.wait(timeout=30)
    extra.terminate()
    extra.wait(timeout=30)
    wait_until(lambda: len(workers_info(plain_cluster.client)) == 2, 60, "the late worker gone")
    time.sleep(2.0)  # tasks already running finish; the scheduler forgets the rest

    with urllib.request.urlopen(page.replace("/farm", "/farm/api/renders.json"), timeout=10) as r:
        snapshot = json.load(r)
    record = next(x for x in snapshot["renders"] if x["render"] == render_id)
    on_disk = {shot.name: sum(1 for p in shot.iterdir() if p.name.isdigit())
               for shot in (out / ".farm" / "done").iterdir()}  # fmt: skip
    assert {s["shot"]: s["batches_written"] for s in record["shots"]} == {
        name: on_disk.get(name, 0) for name in ("shot000", "shot001", "shot002")}  # fmt: skip
    assert sum(on_disk.values()) >= 3
    rates = [s["frames_per_second"] for s in record["shots"]]  # of the frames the render published
    assert any(r is not None and r > 0 for r in rates), record["shots"]
    events = [(e["event"], e["name"]) for e in snapshot["workers"]["events"]]
    assert ("joined", "late-node") in events and ("left", "late-node") in events, events

    with urllib.request.urlopen(page, timeout=10) as r:
        html = r.read().decode()
    workflows, first_render = html.index("submitted workflows"), html.index("<h2 id='render-")
    assert workflows < first_render, "the workflow table sits below the renders"
    started = re.search(r"data-name=\"started\" data-value=\"([\d.]+)\">(\d\d:\d\d:\d\d)<", html)
    ended = re.search(r"data-name=\"finished\" data-value=\"([\d.]+)\">(\d\d:\d\d:\d\d)<", html)
    assert started and ended and float(started.group(1)) <= float(ended.group(1))
    assert "late-node" in html


# -- a good citizen on a shared cluster ---------------------------------------------------------------


@pytest.mark.slow
def test_io_workers_by_resource_and_stealing_given_back_on_a_shared_scheduler(plain_cluster, tmp_path):
    from farm.run.graph import split_workers

    def _stealing_runs(dask_scheduler=None) -> bool:  # nested: pickled by value (workers lack this module)
        return "stealing" in dask_scheduler.periodic_callbacks

    def _marks_seen(dask_worker=None) -> int:
        keys = [entry[0] for entry in dask_worker.state.log]
        return len({k for k in keys if isinstance(k, tuple) and k[0] == "mark-batch"})

    client = plain_cluster.client
    assert client.run_on_scheduler(_stealing_runs), "a plain dask scheduler steals work by default"
    storage = plain_cluster.add_worker("storage-node", "--resources", "farm-io=1")
    try:
        client.wait_for_workers(3, timeout=60)
        decode, io = split_workers(client)
        info = workers_info(client)
        assert [info[a]["name"] for a in io] == ["storage-node"] and len(decode) == 2
        synth(tmp_path / "job.zarr", decoder="ltx2-tiny", frames=17, height=64, width=64)
        run = farm("render", "job.zarr", "--out", "out", "--scheduler", plain_cluster.address, "--tiles",
                   "1,1,1", "--batch-frames", "8", "--no-video", cwd=tmp_path)  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert "2 worker(s)" in run.stderr and "work stealing" in run.stderr
        marks = client.run(_marks_seen, workers=io)[io[0]]
        assert marks >= 1, "the I/O worker wrote none of the batches"
        assert client.run_on_scheduler(_stealing_runs), "farm left the shared scheduler without stealing"
    finally:
        storage.terminate()
        storage.wait(timeout=30)


@pytest.mark.slow
def test_worker_settings_set_by_the_render_reach_workers_started_elsewhere(plain_cluster):
    import functools

    import dask

    from farm import config

    def on_worker(key: str) -> object:  # nested: pickled by value
        from farm import config

        return config.get(key)

    client = plain_cluster.client
    assert config.worker_settings() == {}  # nothing set here: each worker's own settings hold
    assert client.submit(on_worker, "launch-lead", pure=False).result() == 0
    with dask.config.set({"farm.launch-lead": 6, "farm.zarrs": False, "farm.crf": 30}):
        settings = config.worker_settings()
        assert settings == {"farm.launch-lead": 6, "farm.zarrs": False}  # crf goes with VideoSettings
        task = functools.partial(config.run_with, settings, on_worker)
        seen = client.gather([client.submit(task, k, pure=False) for k in ("launch-lead", "zarrs")])
        assert seen == [6, False]
    assert client.submit(on_worker, "launch-lead", pure=False).result() == 0  # for that task only
    os.environ["FARM_ZARRS"] = "0"  # the older variable still turns zarrs off
    try:
        from farm.store.frames import zarrs_enabled

        assert zarrs_enabled() is False
    finally:
        del os.environ["FARM_ZARRS"]


@pytest.mark.slow
def test_a_worker_that_joins_mid_render_takes_decode_work(plain_cluster, tmp_path):
    def decodes_seen(dask_worker=None) -> int:  # nested: pickled by value
        keys = [entry[0] for entry in dask_worker.state.log]
        return len({k for k in keys if isinstance(k, tuple) and k[0] == "decode-tile"})

    synth(tmp_path / "job.zarr", decoder="ltx2-tiny", shots=6, frames=9, height=64, width=64, seed=5)
    out = tmp_path / "out"
    render = Render(str(tmp_path / "job.zarr"), "--out", str(out), "--scheduler", plain_cluster.address,
                    "--tiles", "1,1,1", "--no-video", "-v")  # fmt: skip
    render.value_after("render id")
    late = None
    try:
        with workers_paused(plain_cluster.client):  # the render's own workers: busy with something else
            late = plain_cluster.add_worker("joined-mid-render")
            plain_cluster.client.wait_for_workers(3, timeout=60)
            address = next(a for a, w in workers_info(plain_cluster.client).items()
                           if w["name"] == "joined-mid-render")  # fmt: skip
            wait_until(lambda: plain_cluster.client.run(decodes_seen, workers=[address])[address] >= 1, 120,
                       "the joined worker's first decode")  # fmt: skip
        code, _, stderr = render.wait()
        assert code == 0, stderr
        assert "joined" in stderr and "moved to them" in stderr
        assert farm("status", str(out)).stdout.count("0/1") == 0
    finally:
        if late is not None:
            late.terminate()
            late.wait(timeout=30)
