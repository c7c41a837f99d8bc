"""The Python API as a user calls it: its errors name its own keywords, and its functions take what
their neighbours take. Real job stores."""

from __future__ import annotations

import pytest

import farm
from tests.helpers import farm as farm_command

SMALL = {"decoder": "ltx2-tiny", "shots": 2, "frames": 9, "height": 64, "width": 64}


def test_synth_into_an_existing_job_names_the_keyword_of_the_api_used(tmp_path):
    job = tmp_path / "job.zarr"
    farm.synth(job, **SMALL)
    with pytest.raises(farm.FarmError) as error:
        farm.synth(job, **SMALL)
    assert "overwrite=True" in str(error.value) and "--overwrite" not in str(error.value)
    farm.synth(job, **SMALL, overwrite=True)  # what it says works
    command = farm_command("synth", str(job), "--frames", "9", "--height", "64", "--width", "64")
    assert command.returncode == 2
    assert "choose a new path, or --overwrite" in command.stderr and "overwrite=True" not in command.stderr


def test_plan_and_plan_report_take_a_path_or_a_job_alike(tmp_path):
    path = tmp_path / "job.zarr"
    farm.synth(path, **SMALL)
    job = farm.open_job(path)
    options = farm.PlanOptions(tiles=(1, 1, 1))
    assert farm.plan(str(path), options, 2) == farm.plan(job, options, 2)
    assert farm.plan(path, options, 2) == farm.plan(job, options, 2)
    assert farm.plan_report(job, options, 2).table() == farm.plan_report(path, options, 2).table()
