"""A rerun of the plain `farm render` command into an OUT rendered with other options resumes it with
OUT's recorded settings; only options the user sets that differ are refused, by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from farm.run.resume import recorded_identity
from farm.store.frames import read_frames
from farm.store.markers import read_marker
from farm.store.output import Output
from tests.helpers import farm


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rerun") / "job.zarr"
    result = farm("synth", str(path), "--shots", "2", "--frames", "33", "--height", "64", "--width", "96")
    assert result.returncode == 0, result.stderr
    return path


@pytest.mark.slow
def test_plain_rerun_resumes_the_recorded_settings(job, tmp_path, scheduler3):
    out = tmp_path / "out"
    first = farm("render", str(job), "--out", str(out), "--scheduler", scheduler3, "--batch-frames", "16",
                 "--crf", "20", "--sequence", "png8", "-q")  # fmt: skip
    assert first.returncode == 0, first.stderr
    before = tree_bytes(out)
    frames = read_frames(Output(out), "shot000")
    # the README's plain command: resumes, renders nothing again, changes no byte
    plain = farm("render", str(job), "--out", str(out), "--scheduler", scheduler3)
    assert plain.returncode == 0, plain.stderr
    assert "already holds every shot" in plain.stderr
    assert tree_bytes(out) == before
    assert read_frames(Output(out), "shot000").tobytes() == frames.tobytes()
    # an option the user sets that differs from OUT's: refused in one line, naming it, nothing changed
    changed = farm("render", str(job), "--out", str(out), "--scheduler", scheduler3, "--batch-frames", "8",
                   "--sequence", "png16")  # fmt: skip
    assert changed.returncode == 2, changed.stderr
    errors = [line for line in changed.stderr.splitlines() if line.startswith("farm: error:")]
    assert len(errors) == 1 and "Traceback" not in changed.stderr
    assert "--batch-frames: OUT has 16, this render 8" in errors[0]
    assert "--sequence: OUT has png8, this render png16" in errors[0]
    assert "Leave those options out to resume" in errors[0] and "--restart" in errors[0]
    assert tree_bytes(out) == before


@pytest.mark.slow
def test_interrupted_render_resumes_with_its_batch_frames(job, tmp_path, scheduler3):
    """Half of OUT rendered with --batch-frames 8 (one shot); the plain command renders the rest with
    8: the frames are byte-identical to one uninterrupted render's."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = ["--scheduler", scheduler3, "--batch-frames", "8", "-q"]
    assert farm("render", str(job), "--out", str(whole), *common).returncode == 0
    assert farm("render", str(job), "--out", str(part), *common, "--shots", "shot000").returncode == 0
    rest = farm("render", str(job), "--out", str(part), "--scheduler", scheduler3, "--shots", "shot001")
    assert rest.returncode == 0, rest.stderr
    assert recorded_identity(Output(part), "shot001")["plan"]["batch_frames"] == 8
    for shot in ("shot000", "shot001"):
        assert read_frames(Output(part), shot).tobytes() == read_frames(Output(whole), shot).tobytes()


@pytest.mark.slow
def test_rerender_keeps_the_batch_frames_out_recorded(job, tmp_path, scheduler3):
    out = tmp_path / "out"
    assert farm("render", str(job), "--out", str(out), "--scheduler", scheduler3, "--batch-frames", "8",
                "-q").returncode == 0  # fmt: skip
    frames = read_frames(Output(out), "shot000")
    script = Path(__file__).parents[1] / "workflows" / "rerender.py"
    run = subprocess.run([sys.executable, str(script), str(job), "--out", str(out), "--shots", "shot000",
                          "--scheduler", scheduler3],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "shot000: 5/5 batches" in run.stdout + run.stderr  # 33 frames in batches of 8, not one of 33
    assert recorded_identity(Output(out), "shot000")["plan"]["batch_frames"] == 8
    assert read_frames(Output(out), "shot000").tobytes() == frames.tobytes()


@pytest.mark.slow
def test_verify_names_the_damaged_chunk_and_video(job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    assert farm("render", str(job), "--out", str(out.root), "--scheduler", scheduler3, "--batch-frames", "16",
                "-q").returncode == 0  # fmt: skip
    record = read_marker(out.done_marker("shot000", 1)) or {}
    chunk = out.frames_array("shot000") / sorted(record["chunks"])[0]
    data = chunk.read_bytes()
    chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    video = out.video("shot001")
    video.write_bytes(video.read_bytes()[:-10])
    status = farm("status", str(out.root), "--verify")
    assert status.returncode == 1
    lines = status.stderr.splitlines()
    assert f"farm: error: shot 'shot000' batch 1: {chunk.relative_to(out.root)} altered or missing" in lines
    damaged_video = f"shot 'shot001' video: {video.relative_to(out.root)} differs from its recorded checksum"
    assert f"farm: error: {damaged_video}" in lines
    assert sum("altered or missing" in line or "recorded checksum" in line for line in lines) == 2


def test_recorded_settings_are_those_the_shots_agree_on():
    from farm.run.recorded import recorded_settings

    outputs = {"video": None, "sequence": "exr", "frames_dtype": "uint8"}
    silent = {"plan": {"batch_frames": 16}, "outputs": outputs}
    sound = {"plan": {"batch_frames": 8}, "outputs": {**outputs, "audio": {"format": "flac"}}}
    settings = recorded_settings([silent, sound])
    assert "--batch-frames" not in settings  # the shots differ: the option is not taken
    assert settings == {"--codec": None, "--sequence": "exr", "--exr-values": "display",
                        "--frames-dtype": "uint8", "--audio-format": "flac"}  # fmt: skip
    assert recorded_settings([]) == {}


@pytest.mark.slow
def test_an_interrupted_render_resumes_with_its_crf_and_preset(job, tmp_path, scheduler3):
    """--crf and --preset are recorded per shot like --codec: the plain command encodes the remaining
    segments with them, so the video is one uninterrupted render's, byte for byte."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    quality = ["--crf", "30", "--preset", "ultrafast", "--batch-frames", "16", "--shots", "shot000", "-q"]
    assert farm("render", str(job), "--out", str(whole), "--scheduler", scheduler3, *quality).returncode == 0
    first = farm("render", str(job), "--out", str(part), "--scheduler", scheduler3, *quality,
                 "--frames", "1-16")  # fmt: skip
    assert first.returncode == 0, first.stderr
    outputs = recorded_identity(Output(part), "shot000")["outputs"]
    assert (outputs["crf"], outputs["preset"]) == (30, "ultrafast")
    rest = farm("render", str(job), "--out", str(part), "--scheduler", scheduler3, "--shots", "shot000", "-q")
    assert rest.returncode == 0, rest.stderr
    assert Output(part).video("shot000").read_bytes() == Output(whole).video("shot000").read_bytes()
    changed = farm("render", str(job), "--out", str(part), "--scheduler", scheduler3, "--crf", "20")
    assert changed.returncode == 2 and "--crf: OUT has 30, this render 20" in changed.stderr


def test_crf_and_preset_left_unrecorded_are_farms_defaults():
    """An H.264 shot recorded without crf and preset (farm's defaults, or an output from before they were
    recorded) resumes with 18 and veryfast; a ProRes shot records neither."""
    from farm.media.settings import VideoSettings
    from farm.run.recorded import recorded_settings

    plain = {"plan": {"batch_frames": 8}, "outputs": {"video": "h264", "sequence": None}}
    settings = recorded_settings([plain])
    assert (settings["--crf"], settings["--preset"]) == (18, "veryfast")
    prores = {"plan": {"batch_frames": 8}, "outputs": {"video": "prores_hq", "sequence": None}}
    assert "--crf" not in recorded_settings([prores]) and "--preset" not in recorded_settings([prores])
    assert "crf" not in VideoSettings(codec="h264", crf=18, preset="veryfast").identity()
    assert VideoSettings(codec="h265", crf=24, preset="fast").identity()["crf"] == 24
    assert "crf" not in VideoSettings(codec="prores_hq", crf=24).identity()
