"""The `farm` command as a user runs it: real processes, real files, exit codes and messages."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from farm.media import video
from farm.run.cluster import cpu_count, io_workers_beside_gpus
from farm.store.frames import read_frames
from farm.store.output import Output
from tests.helpers import CAUSAL_LTX2_TINY, farm


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("farm: error:")]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "job.zarr"
    result = farm("synth", str(path), "--shots", "2", "--frames", "17", "--height", "64", "--width", "96")
    assert result.returncode == 0, result.stderr
    assert "RANDOM weights" in result.stderr and result.stdout.strip() == str(path)
    return path


@pytest.mark.slow
def test_synth_refuses_sizes_the_decoder_cannot_make(tmp_path):
    assert_user_error(
        farm("synth", str(tmp_path / "j"), "--frames", "20"), "--frames 20", "1 + 8k", "17 or 25"
    )
    assert_user_error(farm("synth", str(tmp_path / "j"), "--height", "100"), "--height 100", "multiple of 32")
    assert_user_error(farm("synth", str(tmp_path / "j"), "--decoder", "sora"), "unknown decoder 'sora'")
    assert not (tmp_path / "j").exists()


@pytest.mark.slow
def test_synth_refuses_to_overwrite(job):
    assert_user_error(farm("synth", str(job)), "already exists")


@pytest.mark.slow
def test_plan_prints_tiles_workers_and_redundancy(job):
    result = farm("plan", str(job), "--workers", "3", "--tiles", "1,1,2", "--overlap", "0,0,1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "shot shot000: latent 8x3x2x3 -> 17 frames 96x64" in out
    # width: 2 tiles of 2 columns for 3, each decoding the other's last column as its halo: 6/3
    assert "redundant work 2.00x" in out and "spatial seams: halo 1 and a blend over overlap 1" in out
    # worker slots cycle over the job's 4 tiles: 0, 1 (shot000), 2, 0 (shot001)
    assert "     1      1  0:3 0:2 1:3" in out and "     0      2  0:3 0:2 0:2" in out
    assert "makespan" in out  # the planner's prediction
    # the released LTX-2 decoder looks ahead: --carry is refused in one line; a causal config carries
    refused = farm("plan", str(job), "--workers", "1", "--chunk", "2,0,0", "--carry")
    assert_user_error(refused, "cannot carry its causal state")
    causal = job.parent / "causal.zarr"
    made = farm("synth", str(causal), "--decoder", json.dumps(CAUSAL_LTX2_TINY), "--shots", "2", "--frames",
                "17", "--height", "64", "--width", "96")  # fmt: skip
    assert made.returncode == 0, made.stderr
    carried = farm("plan", str(causal), "--workers", "1", "--chunk", "2,0,0", "--carry").stdout
    assert (
        "decode calls up to 2,-,- latent units; temporal chunks carried, in order, no overlap or "
        "context: 2, 1 latent frames" in carried
    )  # 3 latent frames, the last chunk halved
    # a GPU cost model predicts the render as it runs: with the I/O workers a local GPU cluster starts
    on_gpu = farm("plan", str(job), "--workers", "1", "--cost-model", "ltx2-h200").stdout
    assert f"with {io_workers_beside_gpus(1, cpu_count())} I/O worker(s)" in on_gpu
    # --no-video predicts the render farm render --no-video runs: no encodes, so it ends sooner
    real = job.parent / "ltx2.zarr"  # the LTX-2 architecture's latent (random weights: nothing loads)
    farm("synth", str(real), "--decoder", "ltx2", "--frames", "121", "--height", "704", "--width", "1216")

    def makespan(*extra: str) -> float:
        out = farm("plan", str(real), "--workers", "1", "--tiles", "1,1,1", *extra).stdout
        return float(re.search(r"makespan ([0-9.]+) s", out).group(1))  # type: ignore[union-attr]

    assert makespan("--no-video") < makespan()


@pytest.mark.slow
def test_render_rejects_bad_options_before_writing(job, tmp_path):
    out = tmp_path / "out"
    assert_user_error(farm("render", str(job), "--out", str(out), "--tiles", "1,5,1"), "5 tiles do not fit")
    assert_user_error(farm("render", str(job), "--out", str(out), "--tiles", "2,1"), "--tiles '2,1'")
    too_thin = farm("render", str(job), "--out", str(out), "--tiles", "1,1,3", "--overlap", "0,0,0")
    assert_user_error(too_thin, "leave a tile 1 unit wide", "use at most 1 tiles")
    assert_user_error(
        farm("render", str(job), "--out", str(out), "--tiles", "2,1,1", "--chunk", "1,0,0"),
        "conflicting temporal tilings",
    )
    assert_user_error(
        farm("render", str(job), "--out", str(out), "--carry"), "--carry needs a temporal chunk"
    )
    assert_user_error(farm("render", str(tmp_path / "nope.zarr"), "--out", str(out)), "does not exist")
    assert_user_error(
        farm("render", str(job), "--out", str(out), "--compile", "fastest"),
        "unknown torch.compile mode 'fastest'", "reduce-overhead",
    )  # fmt: skip
    assert not out.exists()


@pytest.mark.slow
def test_render_refuses_weights_for_another_model(job, tmp_path):
    import json

    import zarr

    bad = tmp_path / "weights.safetensors"
    import torch
    from safetensors.torch import save_file

    save_file({"decoder.conv_in.conv.weight": torch.zeros(1)}, str(bad))
    root = zarr.open_group(store=str(job), mode="r")
    spec = dict(root.attrs["farm"]["decoder"], weights={"path": str(bad)})
    copy = tmp_path / "job.zarr"
    zarr.open_group(store=str(copy), mode="w", zarr_format=3).attrs["farm"] = {"format": 1, "decoder": spec}
    json.dumps(spec)
    import numpy as np

    from farm.inputs.synthetic import smooth_latent
    from farm.store.job import write_shot

    write_shot(copy, "a", smooth_latent(np.random.default_rng(0), (8, 2, 2, 2)), fps=24)
    result = farm("render", str(copy), "--out", str(tmp_path / "out"))
    assert_user_error(result, "do not match the decoder config")
    assert not (tmp_path / "out").exists()


@pytest.mark.cluster
def test_demo_renders_videos(tmp_path):
    result = farm("demo", "--out", str(tmp_path / "demo"))
    assert result.returncode == 0, result.stderr
    assert "video:" in result.stdout and "RANDOM" in result.stderr  # outputs on stdout, warnings on stderr
    assert "still alive" not in result.stderr  # distributed's shutdown noise is not shown (without -v)
    out = Output(tmp_path / "demo" / "render")
    for shot in ("shot000", "shot001"):
        info = video.probe(out.video(shot))
        assert (info.frames, info.width, info.height) == (33, 192, 128)
        assert read_frames(out, shot).shape == (33, 128, 192, 3)
