"""A farm shared by many people: hostile or careless inputs (OUT trees, job stores, weights, rates, the
farm page) are refused by what they claim, in one line, before any cluster starts, and farm writes only
inside OUT. No cluster here: every refusal tested is one that must come before a cluster (a render
that got past them would fail on the unreachable scheduler `NOWHERE` instead, and the test with it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import farm.run.render as fr
from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.media.settings import VideoSettings
from farm.store.lock import output_lock
from farm.store.output import Output

QUIET = {"log": lambda _: None}
TILES = fr.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever gets as far as a cluster fails to connect


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("adversarial") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, seed=3)
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- OUT is farm's, and only what farm wrote in it -------------------------------------------------


@pytest.mark.parametrize("link", [".farm/lock", ".farm", "videos", "frames.zarr", ".farm/write-test"])
def test_a_link_where_farm_keeps_its_files_is_refused(job, tmp_path, link):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "shot000.mp4"
    victim.write_bytes(b"someone else's file")
    out = tmp_path / "out"
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim if link.endswith(("lock", "test")) else elsewhere, out / link)
    with pytest.raises(FarmError, match="symbolic link") as refused:
        fr.render(job, out, scheduler=NOWHERE, options=TILES, **QUIET)
    assert str(out / link) in str(refused.value) and "\n" not in str(refused.value)
    assert tree(elsewhere) == {"shot000.mp4": b"someone else's file"}


def test_a_link_inside_a_shots_zarr_group_is_refused(job, tmp_path):
    out = tmp_path / "out"
    (out / "frames.zarr" / "shot000").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "frames.zarr" / "shot000" / "frames")
    with pytest.raises(FarmError, match="symbolic link"):
        fr.render(job, out, scheduler=NOWHERE, options=TILES, **QUIET)


def test_the_lock_is_never_taken_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / ".farm").mkdir(parents=True)
    os.symlink(victim, Output(out).lock_file)
    with pytest.raises(FarmError, match="symbolic link"), output_lock(out):
        pass
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize(
    ("path", "video"),
    [("videos/shot000.mp4", VideoSettings()), ("sequences/shot000/shot000.0001.png", VideoSettings(sequence="png8"))],
)
def test_files_farm_did_not_write_are_not_overwritten(job, tmp_path, path, video):
    out = tmp_path / "out"
    (out / path).parent.mkdir(parents=True)
    (out / path).write_bytes(b"the user's own")
    before = tree(out)
    with pytest.raises(FarmError, match="did not write") as refused:
        fr.render(job, out, scheduler=NOWHERE, options=TILES, video=video, **QUIET)
    assert str(out / path) in str(refused.value) and "--restart" in str(refused.value)
    assert tree(out) == before
    # --restart is the user's consent: the render gets past the check (and on to the cluster)
    with pytest.raises(FarmError, match="scheduler|connect|127.0.0.1:9"):
        fr.render(job, out, scheduler=NOWHERE, options=TILES, video=video, restart=True, **QUIET)
