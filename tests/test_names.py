"""Names that become paths: hostile shot and job names are refused, paths stay inside their parent, and
no shot's files can be taken for farm's temporaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.media.names import check_name, child_path
from farm.store.markers import mark_done
from farm.store.output import Output
from farm.store.output_kinds import Opening, open_for_render

HOSTILE = [
    "",
    ".",
    "..",
    "../up",
    "a/b",
    "a\\b",
    "/abs",
    ".hidden",
    ".x.tmp.mp4",
    "x.tmp",
    "sh.tmp.1",
    "-rf",
    "--restart",
    "sh 010",
    "é",
    "sh\u200b",
    "a\nb",
    "sh010\n",
    "a\x00b",
    "x" * 201,
    "ｓｈ",
    "sh:1",
    "*",
]
FINE = ["shot000", "b-shot.2", "_x", "0", "A.B-c_d", "sh010.v2", "tmp", "x.tmpl", "x" * 200]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused(name):
    with pytest.raises(FarmError, match="is not allowed"):
        check_name(name)
    with pytest.raises(FarmError):
        child_path(Path("/out/videos"), name, ".mp4")


@pytest.mark.parametrize("name", FINE)
def test_names_stay_inside_their_parent(name, tmp_path):
    out = Output(tmp_path / "out")
    for path in (out.video(name), out.sequence_dir(name), out.done_dir(name), out.segments_dir(name),
                 out.shot_group(name)):  # fmt: skip
        assert path.resolve().parent == path.parent.resolve()
        assert path.name.startswith(name)


def test_no_shot_output_is_taken_for_a_temporary(tmp_path):
    out = Output(tmp_path / "out")
    kept = []
    for name in ("x.tmpl", "tmp", "a.mp4"):
        for path in (out.video(name), out.segment(name, 0), out.done_marker(name, 0)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"finished")
            kept.append(path)
    stale = out.videos_dir / ".x.tmpl.mp4.farm-abc1_3xy.tmp.mp4"
    stale.write_bytes(b"half")
    mark_done(out.done_marker("tmp", 1))
    stale_marker = out.done_marker("tmp", 2).with_name(".00002.farm-k2j4m9zz.tmp")
    stale_marker.write_bytes(b"")
    users = [out.videos_dir / ".x.tmp.mp4", out.videos_dir / "notes.tmp", out.done_dir("tmp") / "a.tmp"]
    for path in users:
        path.write_bytes(b"mine")
    open_for_render(out, Opening())  # every opening of OUT removes farm's stale temporaries
    assert all(p.read_bytes() == b"finished" for p in kept)
    assert all(p.read_bytes() == b"mine" for p in users)  # a user's *.tmp files are not farm's
    assert not stale.exists() and not stale_marker.exists()
    assert out.batches_done("tmp") == {0, 1}


def test_job_stores_refuse_hostile_shot_names(tmp_path):
    import zarr

    from farm.inputs.synthetic import synth
    from farm.store.job import open_job, write_shot

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    for name in ("x.tmp", "-x", ".x"):
        with pytest.raises(FarmError, match="is not allowed"):
            write_shot(job, name, np.zeros((8, 2, 2, 2), np.float32), fps=24.0)
    zarr.open_group(store=str(job), mode="r+").create_group("x.tmp")  # written by another tool
    refused = open_job(job).shots["x.tmp"].problem  # that shot fails by name, the others render
    assert refused is not None and "shot name 'x.tmp' is not allowed" in refused
