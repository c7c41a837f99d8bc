"""The render request (`farm.run.request.RenderRequest`) and the plan report (`farm.plan_report`): what
`farm.render`, `farm render` and `farm plan` build, checked with no cluster."""

from __future__ import annotations

import dataclasses

import pytest

import farm
from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.planning.jobplan import plan_job
from farm.run.request import RenderRequest
from tests.helpers import farm as farm_command


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = tmp_path_factory.mktemp("request") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=96, seed=3)
    return path


def test_a_request_is_frozen_with_absolute_paths_a_tuple_of_shots_and_a_render_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    request = RenderRequest("job.zarr", "out", shots=["b", "a"], video=farm.VideoSettings(codec="prores_hq"))
    assert request.job_path == str(tmp_path / "job.zarr") and request.out_path == str(tmp_path / "out")
    assert request.out.root == tmp_path / "out" and request.out.video_suffix == ".mov"
    assert request.shots == ("b", "a")
    assert len(request.render_id) == 8 and RenderRequest("j", "o").render_id != request.render_id
    assert RenderRequest("j", "o", render_id="named").render_id == "named"
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.restart = True  # type: ignore[misc]


def test_check_refuses_what_cannot_render_and_reads_the_frames_asked_for(job, tmp_path):
    assert RenderRequest(job, tmp_path / "out", frames="1-4x2").frame_numbers == [1, 3]
    assert RenderRequest(job, tmp_path / "out").frame_numbers is None
    RenderRequest(job, tmp_path / "out").check()
    refusals = {
        "is inside the job store": RenderRequest(job, job / "out"),
        "--window 0 is invalid": RenderRequest(job, tmp_path / "out", window=0),
        "--priority": RenderRequest(job, tmp_path / "out", priority=10**9),
        "--frames": RenderRequest(job, tmp_path / "out", frames="1-x"),
    }
    for message, request in refusals.items():
        with pytest.raises(FarmError, match=message):
            request.check()
    assert not (tmp_path / "out").exists() and not (job / "out").exists()


def test_the_plan_report_is_what_farm_plan_prints_and_plans_as_farm_plan_does(job):
    options = farm.PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1))
    report = farm.plan_report(job, options, n_workers=3)
    assert report.refusal is None and report.n_workers == 3
    expected = plan_job(farm.open_job(job), options, 3, n_io=report.n_io)
    assert [(p.shot, p.grid, len(p.tiles)) for p in report.plans] == [(p.shot, p.grid, len(p.tiles))
                                                                      for p in expected]  # fmt: skip
    printed = farm_command("plan", str(job), "--workers", "3", "--tiles", "1,1,2", "--overlap", "0,0,1")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == report.table() + "\n" + report.summary() + "\n"
    assert "makespan" in report.summary()
    with pytest.raises(FarmError, match="--workers 0 is invalid"):
        farm.plan_report(job, options, n_workers=0)


def test_a_plan_too_large_for_this_machine_is_reported_not_predicted(tmp_path):
    """~46 GiB for its one tile: more than this machine's memory, where a CPU cost model decodes."""
    large = tmp_path / "large.zarr"
    synth(large, decoder="ltx2", shots=1, frames=121, height=1408, width=2432, seed=1)
    on_cpu = farm.PlanOptions(tiles=(1, 1, 1), cost_model="ltx2-tiny-cpu")
    report = farm.plan_report(large, on_cpu, n_workers=1)
    assert isinstance(report.refusal, FarmError) and "estimated to need" in str(report.refusal)
    assert report.prediction is None and report.summary() == "" and "shot000" in report.table()
