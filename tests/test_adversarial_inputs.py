"""Inputs are verified where they are read: weights and latents changed after a render checked them,
a latent chunk missing from the store, latent files that expand beyond what they store or claim.

A change "during a render" is made deterministically by a Dask scheduler preload (`swap_in_render`),
after the render checked and hashed its inputs and before any worker read them: weights as the render's
scheduler starts (a worker of the render's own cluster builds its decoder as it starts, before any task),
latents when the render's first task reaches the scheduler.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.planning.options import PlanOptions
from farm.run.render import render
from tests.helpers import farm

QUIET = {"log": lambda _: None}
TILES = PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever gets as far as a cluster fails to connect


def swap_in_render(tmp_path: Path, replacement: Path, target: Path, at_start: bool = False) -> dict[str, str]:
    """The environment for a `farm` command whose (local) scheduler replaces `target` by a copy of
    `replacement` when the render's first task reaches it, or `at_start`, as the scheduler starts (after
    the render checked its inputs: its cluster starts after that): a scheduler preload, Dask's own hook."""
    script = tmp_path / "swap_preload.py"
    script.write_text(f'''
import os, shutil
from distributed.diagnostics.plugin import SchedulerPlugin


def swap():
    shutil.copyfile({str(replacement)!r}, {str(target)!r} + ".new")
    os.replace({str(target)!r} + ".new", {str(target)!r})


class Swap(SchedulerPlugin):
    name = "farm-test-swap"
    swapped = False

    def transition(self, key, start, finish, *args, **kwargs):
        if not self.swapped:
            self.swapped = True
            swap()


def dask_setup(scheduler):
    if {at_start!r}:
        swap()
    else:
        scheduler.add_plugin(Swap())
''')
    return {"DASK_DISTRIBUTED__SCHEDULER__PRELOAD": json.dumps([str(script)])}


def done_markers(out: Path, shot: str) -> list[Path]:
    return sorted((out / ".farm" / "done" / shot).glob("*"))


@pytest.mark.slow
def test_weights_replaced_after_the_render_checked_them_are_not_loaded(tmp_path):
    from farm.decoders.ltx2 import LTX2Decoder
    from farm.inputs.synthetic import synth_spec
    from tests.helpers import save_weights

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    weights = save_weights(LTX2Decoder.build(synth_spec("ltx2-tiny", seed=1)), tmp_path / "a", "file")
    other = save_weights(LTX2Decoder.build(synth_spec("ltx2-tiny", seed=2)), tmp_path / "b", "file")
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64, weights=str(weights))
    out = tmp_path / "out"
    env = swap_in_render(tmp_path, other, weights, at_start=True)
    result = farm("render", str(job), "--out", str(out), "--workers", "1", "--no-video", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    named = [line for line in result.stderr.splitlines() if str(weights) in line]
    assert len(named) == 1 and "changed since this render checked it" in named[0], result.stderr
    assert not done_markers(out, "shot000")


def test_pinned_weights_pass_a_touch_or_a_copy_and_refuse_other_content(tmp_path):
    from safetensors.numpy import save_file

    from farm.decoders import spec_from_json
    from farm.decoders.weights import check_pinned, pinned_weights

    path = tmp_path / "vae.safetensors"
    save_file({"decoder.conv_in.weight": np.ones((64, 64, 3), np.float32)}, str(path))
    pinned = pinned_weights(spec_from_json({"family": "ltx2", "config": "ltx2-tiny",
                                            "weights": {"path": str(path)}}))  # fmt: skip
    check_pinned(pinned)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a touch: same bytes
    shutil.copyfile(path, tmp_path / "copy")
    os.replace(tmp_path / "copy", path)  # a copy of the same bytes: another inode
    check_pinned(pinned)
    save_file({"decoder.conv_in.weight": np.full((64, 64, 3), 2, np.float32)}, str(path))  # same size
    with pytest.raises(FarmError, match=f"weights file '{path}' changed since this render checked it"):
        check_pinned(pinned)


@pytest.mark.slow
def test_latents_rewritten_after_the_render_hashed_them_fail_their_shot(tmp_path):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=64)
    chunk = job / "shot000" / "latent" / "c" / "0" / "0" / "0" / "0"
    original = tmp_path / "shot000-chunk"
    shutil.copyfile(chunk, original)
    out = tmp_path / "out"
    env = swap_in_render(tmp_path, job / "shot001" / "latent" / "c" / "0" / "0" / "0" / "0", chunk)
    result = farm("render", str(job), "--out", str(out), "--workers", "1", "--no-video", env=env)
    os.replace(original, chunk)  # put back: OUT must not hold shot001's frames as shot000's
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    named = [line for line in result.stderr.splitlines() if "changed since this render hashed" in line]
    assert len(named) == 1 and "shot000" in named[0] and "c/0/0/0/0" in named[0], result.stderr
    assert not done_markers(out, "shot000")
    assert done_markers(out, "shot001")  # the other shot renders
    verified = farm("status", str(out), "--verify")
    assert "shot000" in verified.stdout and "shot001" in verified.stdout


def test_a_missing_latent_chunk_is_an_error_wherever_latents_are_read(tmp_path):
    from farm.store.job import read_latent

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64)
    region = (slice(0, 3), slice(0, 8), slice(0, 8))
    assert read_latent(job, "shot000", region).any()
    (job / "shot000" / "latent" / "c" / "0" / "0" / "0" / "0").unlink()
    with pytest.raises(FarmError, match="latent chunk 'c/0/0/0/0' is missing"):  # a worker's read
        read_latent(job, "shot000", region)
    result = farm("render", str(job), "--out", str(tmp_path / "out"), "--workers", "1", "--no-video")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "shot 'shot000'" in lines[0] and "'c/0/0/0/0' is missing" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_stride_0_latent_pt_is_refused_before_it_expands(tmp_path):
    import torch

    from farm.inputs.ingest import ingest

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    torch.save(torch.zeros(1).expand(8, 64, 64, 64), tmp_path / "expanded.pt")  # 8 MiB from 4 bytes
    with pytest.raises(FarmError, match="holds 4 bytes but a tensor of it expands to 8388608 bytes"):
        ingest(job, [str(tmp_path / "expanded.pt")])
    overlapping = torch.zeros(2**16).as_strided((8, 64, 64, 64), (1, 1, 1, 1))
    torch.save(overlapping, tmp_path / "overlapping.pt")
    with pytest.raises(FarmError, match="a stride-0 or overlapping view"):
        ingest(job, [str(tmp_path / "overlapping.pt")])
    torch.save(torch.zeros(8, 64, 64, 64), tmp_path / "whole.pt")
    ingest(job, [str(tmp_path / "whole.pt")])


def sparse_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """A float32 .npy of `shape` whose data is a hole: it claims its size on no disk."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
        fh.truncate(fh.tell() + int(np.prod(shape)) * 4)
    return path


def test_a_latent_file_claiming_more_than_4_gib_is_refused_though_each_shot_fits(tmp_path):
    import resource

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    # two shots of 2.25 GiB each (within every per-shot maximum), 4.5 GiB in one file
    big = sparse_npy(tmp_path / "two.npy", (2, 8, 1152, 256, 256))

    def bounded() -> None:  # a reader that would load the file fails here, not on the machine
        resource.setrlimit(resource.RLIMIT_DATA, (3 * 2**30, 3 * 2**30))

    import subprocess

    result = subprocess.run([sys.executable, "-m", "farm", "ingest", str(job), str(big)],
                            capture_output=True, text=True, preexec_fn=bounded, timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "claims 4.5 GiB" in lines[0], lines
    assert "4.0 GiB of latent per file" in lines[0], lines


def test_a_shot_within_the_frame_and_side_limits_but_over_4_gib_is_refused(tmp_path):
    from farm.planning.jobplan import plan_job
    from farm.store.job import open_job

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64)
    meta_path = job / "shot000" / "latent" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["shape"] = [8, 2048, 512, 256]  # 8 GiB: frames and sides within their maxima
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(FarmError, match="latent claims 8.0 GiB; farm renders at most 4.0 GiB"):
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, **QUIET)
    with pytest.raises(FarmError, match="latent claims 8.0 GiB; farm renders at most 4.0 GiB"):
        plan_job(open_job(job), TILES, 1)


def test_a_job_store_holds_every_chunk_even_with_the_zarrs_pipeline_in_force(tmp_path):
    """`zarrs` ignores write_empty_chunks: a process that set it (`use_fast_codecs`, as workers do) and
    then writes a job would leave all-zero chunks out, which farm then refuses as missing."""
    import zarr

    from farm.inputs.synthetic import synth_spec
    from farm.store.frames import ZARRS_PIPELINE
    from farm.store.job import create_job, read_latent, write_shot

    pytest.importorskip("zarrs")
    job = tmp_path / "zeros.zarr"
    create_job(job, synth_spec("ltx2-tiny", seed=0))
    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):
        write_shot(job, "s", np.zeros((8, 3, 2, 3), dtype=np.float32), fps=24)
    assert (job / "s" / "latent" / "c" / "0" / "0" / "0" / "0").is_file()
    assert not read_latent(str(job), "s", (slice(0, 3), slice(0, 2), slice(0, 3))).any()
