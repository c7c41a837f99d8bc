"""HDR renders and --colorspace on a real local cluster: frames.zarr's float16 scene-linear values and
colour attributes, half-float EXR in the chosen space, byte identity across worker counts, resume, and
the refusals made before any cluster."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
import torch

PyOpenColorIO = pytest.importorskip("PyOpenColorIO")
OpenEXR = pytest.importorskip("OpenEXR")
otio = pytest.importorskip("opentimelineio")

import farm  # noqa: E402
from farm.decoders import load_decoder  # noqa: E402
from farm.errors import FarmError  # noqa: E402
from farm.media import colour, hdr  # noqa: E402
from farm.media.sequences import read_image  # noqa: E402
from farm.media.settings import VideoSettings  # noqa: E402
from farm.media.video import probe  # noqa: E402
from farm.store.frames import read_frames  # noqa: E402
from farm.store.job import open_job, read_latent  # noqa: E402
from farm.store.output import Output  # noqa: E402
from farm.store.progress import output_progress  # noqa: E402

QUIET = {"log": lambda _: None}
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)
SHOT = "shot000"
UNREACHABLE = "tcp://127.0.0.1:9"  # a refusal made before any cluster never connects to it


def make_job(path: Path, spec_hdr: str | None = None) -> Path:
    decoder = {"family": "ltx2", "config": "ltx2-tiny", **({"hdr": spec_hdr} if spec_hdr else {})}
    farm.synth(path, decoder=decoder, shots=1, frames=17, height=64, width=64, fps=24.0)
    return path


@pytest.fixture
def sdr_job(tmp_path):
    return make_job(tmp_path / "sdr.zarr")


def in_process_decode(job: Path) -> np.ndarray:
    """The shot decoded whole in this process: [F, H, W, 3] codes in [0, 1] (float32)."""
    spec = open_job(job).spec
    shot = open_job(job).shots[SHOT]
    latent = torch.from_numpy(read_latent(job, SHOT, [slice(None)] * (len(shot.latent_shape) - 1)))
    with torch.no_grad():
        return load_decoder(spec).decode(latent, origin=(0, 0, 0)).permute(1, 2, 3, 0).float().numpy()


def render(job: Path, out: Output, settings: VideoSettings, **where) -> farm.RenderStats:
    return farm.render(job, out.root, options=WHOLE, video=settings, **where, **QUIET)


def exrs(out: Output) -> list[Path]:
    return sorted(out.sequence_dir(SHOT).glob("*.exr"))


def exr_header(path: Path) -> dict:
    with OpenEXR.File(str(path), header_only=True) as f:
        return dict(f.header())


def tree_bytes(out: Output) -> dict[str, bytes]:
    """Every frames chunk and EXR file of the shot, by path under OUT."""
    files = [*out.frames_array(SHOT).rglob("c/**/*"), *exrs(out), out.video(SHOT)]
    return {str(p.relative_to(out.root)): p.read_bytes() for p in files if p.is_file()}


def test_hdr_flag_renders_half_float_scene_linear_acescg(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    settings = VideoSettings(hdr="acescct", sequence="exr")
    assert not render(sdr_job, out, settings, scheduler=scheduler3).failed

    frames = read_frames(out, SHOT)
    want = hdr.scene_linear_half(in_process_decode(sdr_job), "acescct")  # LTX-2's ACEScct → ACEScg
    assert frames.dtype == np.float16
    np.testing.assert_allclose(frames.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-4)
    # the default EXR space of an ACEScct render is its own ACEScg: the Zarr values, bit for bit
    np.testing.assert_array_equal(np.stack([read_image(p) for p in exrs(out)]), frames)
    header = exr_header(exrs(out)[0])
    assert header["colorInteropID"] == "lin_ap1_scene" and header["colorSpace"] == "ACEScg"
    attrs = json.loads((out.frames_array(SHOT) / "zarr.json").read_text())["attributes"]
    assert attrs["colour_space"] == "acescg" and attrs["hdr"] == "acescct"
    assert attrs["ocio_colorspace"] == "ACEScg"
    # the attributes say what the values are: AP1 primaries, linear, no [0, 1] bound or black/white levels
    assert (attrs["colour_primaries"], attrs["transfer_characteristics"]) == ("aces_ap1", "linear")
    assert "valid_range" not in attrs and "colour_range" not in attrs
    # the timeline's active media is the HLG master, the EXR sequence its other reference
    clip = next(iter(otio.adapters.read_from_file(str(out.root / "timeline.otio")).find_clips()))
    assert clip.active_media_reference_key == "video"
    assert clip.media_reference.target_url == f"videos/{SHOT}.mp4"
    assert clip.media_references()["image_sequence"].name_suffix == ".exr"
    # the shot's video is its HLG master: 10-bit HEVC tagged BT.2020 primaries, HLG, BT.2020 NCL, limited
    master = out.video(SHOT)
    assert master.suffix == ".mp4" and probe(master).pix_fmt == "yuv420p10le" and probe(master).frames == 17
    with av.open(str(master)) as container:
        ctx = container.streams.video[0].codec_context
        assert ctx.name == "hevc" and ctx.profile == "Main 10"
        assert (ctx.color_primaries, ctx.color_trc, ctx.colorspace, ctx.color_range) == (9, 18, 9, 1)

    assert all(row.finished for row in output_progress(out.root, verify=True))
    master.write_bytes(master.read_bytes()[:-100])  # truncated
    row = next(r for r in output_progress(out.root, verify=True) if r.shot == SHOT)
    assert row.damaged == 1 and not row.finished


def test_hdr_recorded_in_the_spec_renders_without_the_flag_alike_on_1_and_3_workers(tmp_path, scheduler3):
    job = make_job(tmp_path / "hdr.zarr", spec_hdr="logc3")
    three, one = Output(tmp_path / "three"), Output(tmp_path / "one")
    settings = VideoSettings(sequence="exr", colorspace="acescg")
    assert not render(job, three, settings, scheduler=scheduler3).failed
    assert not render(job, one, settings, workers=1).failed
    assert tree_bytes(three) == tree_bytes(one) and len(exrs(one)) == 17 and one.video(SHOT).exists()

    linear = hdr.scene_linear_half(in_process_decode(job), "logc3")  # LogC3 → linear Rec.709
    np.testing.assert_allclose(read_frames(three, SHOT).astype(np.float32), linear.astype(np.float32),
                               rtol=2e-3, atol=2e-4)  # fmt: skip
    # EXR in ACEScg: OpenColorIO's conversion of the linear Rec.709 frames Zarr keeps
    want = colour.convert(read_frames(three, SHOT), "lin_rec709", "acescg").astype(np.float16)
    np.testing.assert_array_equal(np.stack([read_image(p) for p in exrs(three)]), want)
    assert exr_header(exrs(three)[0])["colorInteropID"] == "lin_ap1_scene"
    attrs = json.loads((three.frames_array(SHOT) / "zarr.json").read_text())["attributes"]
    assert attrs["colour_space"] == "lin_rec709" and attrs["hdr"] == "logc3"
    assert (attrs["colour_primaries"], attrs["transfer_characteristics"]) == ("bt709", "linear")
    assert "valid_range" not in attrs


def test_hdr_render_of_a_bfloat16_job_decodes_in_float32(tmp_path, scheduler3):
    """As LTX-2's pipelines (``vae_dtype_for_hdr``): --hdr decodes in float32 whatever the spec's dtype."""
    import dataclasses

    job = tmp_path / "bf16.zarr"
    decoder = {"family": "ltx2", "config": "ltx2-tiny", "dtype": "bfloat16"}
    farm.synth(job, decoder=decoder, shots=1, frames=17, height=64, width=64, fps=24.0)
    out, said = Output(tmp_path / "out"), []
    stats = farm.render(job, out.root, options=WHOLE, video=VideoSettings(hdr="acescct", enabled=False),
                        scheduler=scheduler3, log=said.append)  # fmt: skip
    assert not stats.failed
    assert "farm: an HDR render decodes in float32 (the job's decoder spec says bfloat16)" in said
    spec = dataclasses.replace(open_job(job).spec, dtype="float32")
    shot = open_job(job).shots[SHOT]
    latent = torch.from_numpy(read_latent(job, SHOT, [slice(None)] * (len(shot.latent_shape) - 1)))
    with torch.no_grad():
        codes = load_decoder(spec).decode(latent, origin=(0, 0, 0)).permute(1, 2, 3, 0).float().numpy()
    want = hdr.scene_linear_half(codes, "acescct").astype(np.float32)
    np.testing.assert_allclose(read_frames(out, SHOT).astype(np.float32), want, rtol=2e-3, atol=2e-4)


def test_an_interrupted_hdr_render_resumes_to_the_same_bytes(sdr_job, tmp_path, scheduler3):
    whole, out = Output(tmp_path / "whole"), Output(tmp_path / "out")
    settings = VideoSettings(hdr="acescct", sequence="exr")
    render(sdr_job, whole, settings, scheduler=scheduler3)
    render(sdr_job, out, settings, scheduler=scheduler3, frames="1-8")  # stopped after its first batch
    assert not out.video(SHOT).exists() and len(exrs(out)) == 8
    stats = render(sdr_job, out, settings, scheduler=scheduler3)
    assert not stats.failed and stats.batches_written == 2  # the two left; the master joined of all three
    assert tree_bytes(out) == tree_bytes(whole)


def test_colorspace_acescg_of_an_sdr_render_is_opencolorios_conversion(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    settings = VideoSettings(sequence="exr", colorspace="acescg")
    assert not render(sdr_job, out, settings, scheduler=scheduler3).failed
    levels = read_frames(out, SHOT)
    assert levels.dtype == np.uint8  # the SDR decode is kept as it always was
    config = PyOpenColorIO.Config.CreateFromFile(f"ocio://{colour.OCIO_CONFIG}")
    processor = config.getProcessor("Gamma 2.4 Rec.709 - Texture", "ACEScg").getDefaultCPUProcessor()
    want = np.ascontiguousarray(levels.astype(np.float32) / 255.0)
    processor.applyRGB(want.reshape(-1))
    got = np.stack([read_image(p) for p in exrs(out)]).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4)
    assert exr_header(exrs(out)[0])["colorInteropID"] == "lin_ap1_scene"
    attrs = json.loads((out.frames_array(SHOT) / "zarr.json").read_text())["attributes"]
    assert attrs["colour_space"] == "g24_rec709" and "hdr" not in attrs
    assert (attrs["colour_primaries"], attrs["transfer_characteristics"], attrs["valid_range"]) == (
        "bt709", "bt709", [0, 255])  # fmt: skip
    assert out.video(SHOT).exists()  # an SDR render's video is made as before


@pytest.mark.parametrize(
    "spec_hdr, settings, words",
    [
        ("acescct", VideoSettings(hdr="logc3"),
         "--hdr logc3: the job's decoder spec records 'hdr': 'acescct'"),
        (None, VideoSettings(hdr="acescct", colorspace="g24_rec709", sequence="exr"),
         "--colorspace: 'g24_rec709' is not a colour space an HDR render writes"),
        (None, VideoSettings(codec="h264", colorspace="acescg"),
         "--colorspace acescg: h264 video is 8-bit display video"),
        (None, VideoSettings(colorspace="rec2100"), "'rec2100' is not a colour space an SDR render writes"),
        (None, VideoSettings(hdr="acescct", sequence="png16"), "an HDR render's frames are scene-linear"),
    ],
)  # fmt: skip
def test_hdr_and_colour_refusals_come_before_any_cluster(tmp_path, spec_hdr, settings, words):
    job = make_job(tmp_path / "job.zarr", spec_hdr=spec_hdr)
    with pytest.raises(FarmError, match=words) as err:
        farm.render(job, tmp_path / "out", scheduler=UNREACHABLE, video=settings, **QUIET)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_resuming_an_sdr_output_with_hdr_is_refused_naming_the_option(sdr_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    farm.render(sdr_job, out.root, scheduler=scheduler3, options=WHOLE, video=VideoSettings(enabled=False),
                **QUIET)  # fmt: skip
    with pytest.raises(FarmError, match=r"--hdr"):
        farm.render(sdr_job, out.root, scheduler=scheduler3, options=WHOLE,
                    video=VideoSettings(enabled=False, hdr="acescct"), **QUIET)  # fmt: skip


@pytest.mark.model  # builds and runs a diffusers pipeline in the test's process
def test_ltx2_hdr_pipeline_latent_renders_to_acescg_exr_of_the_pipelines_own_output(tmp_path, scheduler3):
    """LTX2HDRPipeline (LogC3) latents, ingested with the pipeline: the render's ACEScg EXR equals
    OpenColorIO's ACEScg of the pipeline's own linear Rec.709 post-processing of the same latents."""
    from farm.inputs.ingest import add_pipeline_shot
    from tests.test_hdr import ocio, tiny_hdr_pipeline

    pipe, call = tiny_hdr_pipeline(tmp_path / "vae")
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
    own = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(1)).frames[0]  # lin Rec.709
    job = tmp_path / "job.zarr"
    size = {k: call[k] for k in ("num_frames", "height", "width")}
    add_pipeline_shot(job, latents, pipeline=pipe, name="sh010", fps=24, **size)
    out = Output(tmp_path / "out")
    settings = VideoSettings(sequence="exr", colorspace="acescg")  # HDR from the spec ingest recorded
    assert not render(job, out, settings, scheduler=scheduler3).failed
    paths = sorted(out.sequence_dir("sh010").glob("*.exr"))
    got = np.stack([read_image(p) for p in paths]).astype(np.float32)
    np.testing.assert_allclose(got, ocio("Linear Rec.709 (sRGB)", "ACEScg", own), rtol=3e-3, atol=3e-4)
    assert exr_header(paths[0])["colorInteropID"] == "lin_ap1_scene"
    assert probe(out.video("sh010")).pix_fmt == "yuv420p10le"


def test_farm_render_hdr_and_colorspace_options_are_checked_before_any_cluster(tmp_path, capsys):
    from farm import cli

    job = make_job(tmp_path / "job.zarr", spec_hdr="acescct")
    base = ["render", str(job), "--out", str(tmp_path / "out"), "--scheduler", UNREACHABLE]
    assert cli.main([*base, "--hdr", "logc3"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--hdr logc3: the job's decoder spec records 'hdr': 'acescct'" in err
    assert cli.main([*base, "--sequence", "exr", "--colorspace", "g24_rec709"]) != 0
    assert "'g24_rec709' is not a colour space an HDR render writes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
