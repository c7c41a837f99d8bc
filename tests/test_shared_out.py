"""Renders of different shots into one OUT at once, as a render manager's tasks on many hosts run them:
both finish, OUT passes `farm status --verify` and equals one render of the whole job; a render of a shot
another render holds is refused by name; the timeline lists every shot."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import opentimelineio as otio
import pytest

import farm
from farm.errors import FarmError
from farm.media.names import is_farm_temporary
from farm.run.render import remove_stale_temporaries
from farm.store.lock import held_shots
from farm.store.output import Output
from tests.helpers import assert_same_video, chunk_files
from tests.helpers import farm as farm_command

SHOTS = ["shot000", "shot001", "shot002", "shot003"]
OPTIONS = ["--tiles", "1,1,1", "--batch-frames", "8"]


def render_process(job: Path, out: Path, shots: list[str]) -> subprocess.Popen:
    """`farm render --shots` on a local cluster of its own, in a process of its own."""
    command = [sys.executable, "-m", "farm", "render", str(job), "--out", str(out), "--workers", "1",
               "--shots", ",".join(shots), *OPTIONS]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())  # fmt: skip


@pytest.mark.slow
def test_renders_of_disjoint_shots_into_one_out_at_once_equal_one_render(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=4, frames=81, height=64, width=64, seed=3)
    out = tmp_path / "out"
    first, second = render_process(job, out, SHOTS[:2]), render_process(job, out, SHOTS[2:])  # together
    try:
        deadline = time.monotonic() + 240
        while set(held_shots(out)) != set(SHOTS):  # both hold their shots: both are rendering
            assert first.poll() is None and second.poll() is None, (first.stderr.read(), second.stderr.read())
            assert time.monotonic() < deadline
            time.sleep(0.05)
        holders = {shot: record["pid"] for shot, record in held_shots(out).items()}
        # a render of shots they hold is refused, naming each shot and its holder; nothing of it is written
        with pytest.raises(FarmError) as refused:
            farm.render(job, out, scheduler=scheduler3, shots=["shot001", "shot002"], log=lambda _: None,
                        options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8))  # fmt: skip
        message = str(refused.value)
        assert f"shot(s) 'shot001' by pid {holders['shot001']} on " in message, message
        assert f"shot(s) 'shot002' by pid {holders['shot002']} on " in message, message
        results = [p.communicate(timeout=400) for p in (first, second)]
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
    assert first.returncode == 0 and second.returncode == 0, results
    assert set(held_shots(out)) == set()

    status = farm_command("status", str(out), "--verify")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "4 of 4 shots finished" in status.stdout, status.stdout
    for shot in SHOTS:
        assert any(line.split()[:1] == [shot] for line in status.stdout.splitlines()), status.stdout
    clips = list(otio.adapters.read_from_file(str(out / "timeline.otio")).find_clips())
    assert [c.name for c in clips] == SHOTS
    assert all(c.metadata["farm"]["finished"] is True for c in clips)

    single = tmp_path / "single"
    command = ["render", str(job), "--out", str(single), "--workers", "1", *OPTIONS]
    alone = subprocess.run([sys.executable, "-m", "farm", *command], capture_output=True, text=True,
                           timeout=400)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    together, reference = chunk_files(out), chunk_files(single)
    assert sorted(together) == sorted(reference) and len(reference) > 4 * 10
    assert [name for name in reference if together[name] != reference[name]] == []  # byte for byte
    for shot in SHOTS:  # two encodes of the same frames: compared by their frames (tests.helpers)
        assert_same_video(Output(out).video(shot), Output(single).video(shot))
    assert not Output(out).stale_temporaries()


HOLDER = """
import sys, time
from pathlib import Path
from farm.store.lock import output_lock
with output_lock(Path(sys.argv[1]), ["shot003"], job=sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_killed_renders_temporaries_stay_while_another_render_writes_into_out(tmp_path):
    out = Output(tmp_path / "out")
    (out.videos_dir).mkdir(parents=True)
    temporary = out.videos_dir / ".shot001.mp4.farm-0a1b2c3d.tmp.mp4"  # a killed render's, or a live one's
    temporary.write_bytes(b"half a video")
    assert is_farm_temporary(temporary.name)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out.root), str(tmp_path / "job.zarr")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().startswith("held")
        remove_stale_temporaries(out)  # another render writes into OUT: it may be that render's
        assert temporary.exists()
    finally:
        holder.kill()
        holder.wait()
    remove_stale_temporaries(out)  # alone in OUT: stale
    assert not temporary.exists()
