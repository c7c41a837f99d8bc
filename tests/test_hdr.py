"""HDR decodes and colour by OpenColorIO: the transfers against the pipelines' own post-processing, the
conversions against OpenColorIO itself, EXR attributes read back with OpenEXR, the HLG master read back
with PyAV, and an LTX-2 HDR latent made by diffusers' LTX2HDRPipeline taken through ingest and the decoder.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import av
import numpy as np
import OpenEXR
import pytest
import torch

PyOpenColorIO = pytest.importorskip("PyOpenColorIO")

from farm.decoders import load_decoder  # noqa: E402
from farm.decoders.base import HDR_TRANSFERS, parse_spec  # noqa: E402
from farm.errors import FarmError  # noqa: E402
from farm.media import colour, hdr  # noqa: E402
from farm.media.hlg import encode_hlg_segment, hlg_planes  # noqa: E402
from farm.media.sequences import read_image, write_frames  # noqa: E402
from farm.media.video import join_segments, probe  # noqa: E402

H, W = 16, 24


def codes_grid(shape: tuple[int, ...] = (2, H, W, 3), seed: int = 0) -> np.ndarray:
    """Decoded codes across and beyond [0, 1] (a decoder overshoots; the transfers clamp)."""
    return np.random.default_rng(seed).uniform(-0.1, 1.1, shape).astype(np.float32)


def ocio(source: str, target: str, values: np.ndarray) -> np.ndarray:
    """OpenColorIO's own conversion between the pinned config's colour spaces, by their OCIO names,
    unoptimised (the config's ops as written, no fast approximations)."""
    config = PyOpenColorIO.Config.CreateFromFile(f"ocio://{colour.OCIO_CONFIG}")
    processor = config.getProcessor(source, target).getOptimizedCPUProcessor(
        PyOpenColorIO.BIT_DEPTH_F32, PyOpenColorIO.BIT_DEPTH_F32, PyOpenColorIO.OPTIMIZATION_NONE
    )
    out = np.array(values, dtype=np.float32, copy=True, order="C")  # reshape(-1) below must be a view
    processor.applyRGB(out.reshape(-1))
    return out


# ---- transfers -----------------------------------------------------------------------------------


def test_the_transfers_are_the_ones_the_decoder_spec_accepts():
    assert tuple(hdr.TRANSFERS) == HDR_TRANSFERS
    assert {t.linear_space for t in hdr.TRANSFERS.values()} <= set(colour.SPACES)


def test_logc3_equals_diffusers_ltx2_hdr_post_processing():
    from diffusers.pipelines.ltx2.image_processor import LTX2VideoHDRProcessor

    decoded = torch.from_numpy(codes_grid((1, 3, 2, H, W))) * 2.0 - 1.0  # the VAE's [-1, 1] output, B C F H W
    own = LTX2VideoHDRProcessor().postprocess_hdr_video(decoded, output_type="np")[0]  # [F, H, W, 3]
    codes = ((decoded + 1.0) / 2.0)[0].permute(1, 2, 3, 0)  # what farm's decoders hand the blend
    np.testing.assert_allclose(hdr.codes_to_linear(codes.numpy(), "logc3"), own, rtol=2e-6, atol=1e-7)
    on_torch = hdr.codes_to_linear(codes, "logc3")
    assert isinstance(on_torch, torch.Tensor) and on_torch.dtype == torch.float32
    np.testing.assert_allclose(on_torch.numpy(), own, rtol=2e-6, atol=1e-7)
    assert own.min() < 0 and own.max() > 50  # the whole curve: its linear toe and its top
    half = hdr.scene_linear_half(codes, "logc3")
    assert half.dtype == torch.float16
    np.testing.assert_array_equal(half.numpy(), own.astype(np.float16))


def test_acescct_equals_opencolorio_acescct_to_acescg():
    """The ACEScct curve agrees with OpenColorIO's ACEScct → ACEScg (tests/test_hdr_reference.py checks it
    against ltx-core's own HDRTransfer.ACESCCT)."""
    codes = codes_grid()
    clamped = np.clip(codes, 0.0, 1.0)  # the pipelines clamp codes to [0, 1], and linear values at 0
    reference = np.maximum(ocio("ACEScct", "ACEScg", clamped), 0.0)
    got = hdr.codes_to_linear(codes, "acescct")
    # OpenColorIO goes ACEScct → ACES2065-1 → ACEScg: its two float32 matrices leave ≈ 1e-5 behind
    np.testing.assert_allclose(got, reference, rtol=5e-5, atol=1.5e-5)
    assert got.max() > 200 and got.min() == 0.0
    assert hdr.TRANSFERS["acescct"].linear_space == "acescg"
    assert hdr.TRANSFERS["logc3"].linear_space == "lin_rec709"


def test_unknown_transfer_is_one_line_listing_the_valid_ones():
    with pytest.raises(FarmError, match=r"unknown HDR transfer 'pq'; choose one of \['acescct', 'logc3'\]"):
        hdr.codes_to_linear(codes_grid(), "pq")


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"hdr": "pq"}, r"'hdr' 'pq' is invalid; use one of \['acescct', 'logc3'\]"),
        ({"hdr": "logc3", "dtype": "bfloat16"}, "runs in float32.*dtype 'bfloat16' is invalid"),
    ],
)
def test_decoder_spec_refuses_bad_hdr(raw, words):
    from farm.decoders import FAMILIES

    base = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}}
    with pytest.raises(FarmError, match=words) as e:
        parse_spec(base | raw, families=FAMILIES)
    assert "\n" not in str(e.value)


def test_decoder_spec_carries_hdr_and_sdr_specs_are_unchanged():
    from farm.decoders import FAMILIES

    base = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}}
    sdr = parse_spec(base, families=FAMILIES)
    assert sdr.hdr is None and "hdr" not in sdr.to_json()
    assert parse_spec(base | {"hdr": None}, families=FAMILIES).to_json() == sdr.to_json()
    spec = parse_spec(base | {"hdr": "acescct"}, families=FAMILIES)
    assert spec.hdr == "acescct" and spec.to_json()["hdr"] == "acescct"
    assert parse_spec(spec.to_json(), families=FAMILIES) == spec


# ---- OpenColorIO ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["lin_rec709", "acescg", "acescct"])
def test_sdr_decode_converts_as_opencolorio_does_and_back(target):
    sdr = np.random.default_rng(1).random((2, H, W, 3), dtype=np.float32)
    got = colour.convert(sdr, "g24_rec709", target)
    want = ocio("Gamma 2.4 Rec.709 - Texture", colour.SPACES[target].ocio, sdr)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # and back, within an eighth of an 8-bit level: near black (linear 1e-6) the matrices' float32 error,
    # ≈ 1e-7 of the other channels, is magnified by the 1/2.4 power
    np.testing.assert_allclose(colour.convert(got, target, "g24_rec709"), sdr, atol=5e-4)


def test_known_values_and_sdr_white():
    white = colour.convert(np.ones((1, 3), np.float32), "g24_rec709", "acescg")
    np.testing.assert_allclose(white, 1.0, atol=1e-6)  # D65 white → the ACES white, by the CAT
    grey = colour.convert(np.full((1, 3), 0.18, np.float32), "acescg", "acescct")
    np.testing.assert_allclose(grey, (np.log2(0.18) + 9.72) / 17.52, atol=1e-6)  # ACEScct's log segment


def test_space_names_and_interop_ids_are_opencolorios():
    config = PyOpenColorIO.Config.CreateFromFile(f"ocio://{colour.OCIO_CONFIG}")
    for space in colour.SPACES.values():
        assert config.getColorSpace(space.ocio) is not None, space.ocio
    newest = [n for n in PyOpenColorIO.BuiltinConfigRegistry() if n.startswith("studio-config")][-1]
    latest = PyOpenColorIO.Config.CreateFromFile(f"ocio://{newest}")
    if not hasattr(PyOpenColorIO.ColorSpace, "getInteropID"):
        pytest.skip("OpenColorIO < 2.5 has no interop IDs to compare with")
    for space in colour.SPACES.values():
        if space.name == "g24_rec709":  # farm keeps its display-referred tag (BT.1886 display)
            continue
        assert latest.getColorSpace(space.ocio).getInteropID() == space.interop_id


def test_conversions_do_not_depend_on_how_frames_are_split():
    """Per-pixel, bit for bit: batches and tiles of any size convert alike (renders byte-identical)."""
    frames = np.random.default_rng(5).random((3, 17, 23, 3), dtype=np.float32) * 3
    for source, target in [("g24_rec709", "acescg"), ("acescg", "acescct"), ("lin_rec709", "lin_rec2020")]:
        whole = colour.convert(frames, source, target)
        per_frame = np.concatenate([colour.convert(f[None], source, target) for f in frames])
        flat = frames.reshape(-1, 3)
        odd = np.concatenate([colour.convert(part, source, target) for part in (flat[:5], flat[5:])])
        np.testing.assert_array_equal(whole, per_frame)
        np.testing.assert_array_equal(whole, odd.reshape(frames.shape))
        np.testing.assert_array_equal(whole, colour.convert(np.asfortranarray(frames), source, target))


def test_output_spaces_and_what_a_render_decodes_to():
    assert hdr.decoded_space(None) == "g24_rec709"
    assert hdr.decoded_space("acescct") == "acescg" and hdr.decoded_space("logc3") == "lin_rec709"
    assert colour.output_space("acescg", hdr=False).ocio == "ACEScg"
    with pytest.raises(FarmError, match=r"--colorspace: 'g24_rec709' is not a colour space an HDR render "
                                        r"writes; choose one of \['lin_rec709', 'acescg', 'acescct'\]"):
        colour.output_space("g24_rec709", hdr=True)
    attrs = colour.space_attributes("acescct")
    assert attrs["ocio_colorspace"] == "ACEScct" and attrs["ocio_config"] == f"ocio://{colour.OCIO_CONFIG}"


def test_unknown_space_is_one_line_listing_the_valid_ones():
    with pytest.raises(FarmError, match=r"unknown colour space 'rec2100'; choose one of \['g24_rec709'"):
        colour.convert(np.zeros((1, 3), np.float32), "g24_rec709", "rec2100")


# ---- EXR -----------------------------------------------------------------------------------------


def exr_header(path: Path) -> dict:
    with OpenEXR.File(str(path)) as f:
        return dict(f.header())


@pytest.mark.parametrize("space", ["lin_rec709", "acescg", "acescct"])
def test_exr_in_a_chosen_space_is_half_float_with_its_chromaticities_and_names(tmp_path, space):
    sdr = np.random.default_rng(2).integers(0, 256, (2, H, W, 3), dtype=np.uint8)
    paths = write_frames(sdr, tmp_path, "sh", format="exr", exr_space=space, fps=24)
    image = read_image(paths[1])
    assert image.dtype == np.float16
    want = ocio("Gamma 2.4 Rec.709 - Texture", colour.SPACES[space].ocio, sdr[1].astype(np.float32) / 255.0)
    # OpenColorIO's values, to half-float rounding (2**-10 relative), and 2e-7 absolute: the unoptimised
    # reference goes through ACES2065-1 and back, its float32 matrices leaving ≈ 1e-7 in dark channels
    np.testing.assert_allclose(image.astype(np.float32), want, rtol=2**-10, atol=2e-7)
    header = exr_header(paths[1])
    np.testing.assert_allclose(header["chromaticities"], colour.SPACES[space].chromaticities, atol=1e-6)
    assert header["colorInteropID"] == colour.SPACES[space].interop_id
    assert header["colorSpace"] == colour.SPACES[space].ocio
    with OpenEXR.File(str(paths[1])) as f:
        assert f.channels()["RGB"].pixels.dtype == np.float16


def test_exr_without_a_space_is_unchanged(tmp_path):
    sdr = np.random.default_rng(3).integers(0, 256, (1, H, W, 3), dtype=np.uint8)
    (path,) = write_frames(sdr, tmp_path, "sh", format="exr")
    header = exr_header(path)
    assert header["colorInteropID"] == "g24_rec709_display" and "colorSpace" not in header
    np.testing.assert_array_equal(read_image(path), (sdr[0] / 255.0).astype(np.float32).astype(np.float16))


def test_exr_bad_space_fails_before_writing(tmp_path):
    with pytest.raises(FarmError, match="EXR colour space: unknown colour space 'aces'"):
        write_frames(np.zeros((1, 4, 4, 3), np.uint8), tmp_path / "seq", "sh", format="exr", exr_space="aces")
    assert not (tmp_path / "seq").exists()


# ---- the HLG master ------------------------------------------------------------------------------


def test_hlg_signal_white_and_curve():
    signal = hdr.hlg_signal(np.array([0.0, 1.0, 1e4, -1.0, np.nan], np.float32))
    np.testing.assert_allclose(signal[[0, 3, 4]], 0.0)
    assert abs(signal[1] - hdr.HLG_WHITE_SIGNAL) < 1e-6 and 0.999 < signal[2] <= 1.0
    ramp = hdr.hlg_signal(np.linspace(0, 20, 200, dtype=np.float32))
    assert np.all(np.diff(ramp) >= 0)


def test_hlg_master_segments_join_and_read_back_bt2020_hlg_10_bit(tmp_path):
    linear = hdr.codes_to_linear(codes_grid((5, H, W, 3), seed=4), "acescct").astype(np.float16)
    a, b = tmp_path / "a.mp4", tmp_path / "b.mp4"
    encode_hlg_segment(linear[:3], a, 24, space="acescg", threads=1)
    encode_hlg_segment(linear[3:], b, 24, space="acescg", threads=1)
    join_segments([a, b], tmp_path / "sh.mp4")
    encode_hlg_segment(linear[:3], tmp_path / "again.mp4", 24, space="acescg", threads=1)
    assert (tmp_path / "again.mp4").read_bytes() == a.read_bytes()  # the same frames, the same bytes
    info = probe(tmp_path / "sh.mp4")
    assert (info.frames, info.width, info.height, info.pix_fmt) == (5, W, H, "yuv420p10le")
    with av.open(str(tmp_path / "sh.mp4")) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        assert ctx.name == "hevc" and ctx.profile == "Main 10"
        assert (ctx.color_primaries, ctx.color_trc, ctx.colorspace, ctx.color_range) == (9, 18, 9, 1)
        decoded = [f for f in container.decode(stream)]
    frame = decoded[4]
    assert frame.format.name == "yuv420p10le"
    assert (frame.color_primaries, frame.color_trc, frame.colorspace) == (9, 18, 9)
    # the decoded luma is the 10-bit Y' we computed, within the encoder's loss
    y = np.frombuffer(frame.planes[0], np.uint16).reshape(H, -1)[:, :W]
    want, _, _ = hlg_planes(linear[4:5], "acescg")
    assert np.abs(y.astype(int) - want[0].astype(int)).mean() < 12
    assert y.max() > 255  # ten bits in use


def test_hlg_master_refuses_non_linear_frames(tmp_path):
    with pytest.raises(FarmError, match=r"give scene-linear frames in one of \['lin_rec709', 'acescg'\]"):
        encode_hlg_segment(np.zeros((1, 4, 4, 3), np.float16), tmp_path / "a.mp4", 24, space="acescct")


# ---- an LTX-2 HDR latent, made by diffusers' LTX2HDRPipeline --------------------------------------


def tiny_hdr_pipeline(vae_dir: Path):
    """diffusers' LTX2HDRPipeline at farm's tiny LTX-2 config, random weights (test_ingest's parts)."""
    import diffusers

    from tests.test_ingest import tiny_pipeline

    pipe, call = tiny_pipeline("ltx2", vae_dir)
    takes = set(inspect.signature(diffusers.LTX2HDRPipeline.__init__).parameters)
    hdr_pipe = diffusers.LTX2HDRPipeline(**{k: v for k, v in pipe.components.items() if k in takes})
    hdr_pipe.set_progress_bar_config(disable=True)
    return hdr_pipe, {k: v for k, v in call.items() if not k.startswith("audio_")}


@pytest.mark.model  # builds and runs a diffusers pipeline in the test's process
def test_ltx2_hdr_pipeline_latent_decodes_to_its_own_linear_hdr(tmp_path):
    from farm.inputs.ingest import add_pipeline_shot
    from farm.inputs.pipelines import pipeline_hdr
    from farm.store.job import open_job, read_latent

    pipe, call = tiny_hdr_pipeline(tmp_path / "vae")
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
    own = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(1)).frames[0]  # lin Rec.709
    assert pipeline_hdr(pipe) == "logc3" and pipeline_hdr("LTX2Pipeline") is None
    size = {k: call[k] for k in ("num_frames", "height", "width")}
    job = tmp_path / "job.zarr"
    add_pipeline_shot(job, latents, pipeline=pipe, name="sh010", fps=24, **size)
    spec = open_job(job).spec
    assert spec.hdr == "logc3" and spec.dtype == "float32"

    shot = open_job(job).shots["sh010"]
    latent = torch.from_numpy(read_latent(job, "sh010", [slice(None)] * (len(shot.latent_shape) - 1)))
    codes = load_decoder(spec).decode(latent, origin=(0, 0, 0)).permute(1, 2, 3, 0)  # [F, H, W, 3]
    frames = hdr.scene_linear_half(codes, spec.hdr).numpy()  # what an HDR blend keeps in Zarr
    assert frames.dtype == np.float16 and frames.shape == own.shape
    np.testing.assert_allclose(frames.astype(np.float32), own, rtol=2e-3, atol=2e-4)

    linear_space = hdr.TRANSFERS[spec.hdr].linear_space
    paths = write_frames(frames, tmp_path / "exr", "sh010", format="exr", exr_space="acescg",
                         frames_space=linear_space)  # fmt: skip
    got = np.stack([read_image(p) for p in paths]).astype(np.float32)
    want = ocio("Linear Rec.709 (sRGB)", "ACEScg", own)  # OpenColorIO's ACEScg of the pipeline's own output
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-4)
    assert exr_header(paths[0])["colorInteropID"] == "lin_ap1_scene"

    even = frames[:, : frames.shape[1] // 2 * 2, : frames.shape[2] // 2 * 2]
    encode_hlg_segment(even, tmp_path / "sh010.mp4", 24, space=linear_space, threads=1)
    info = probe(tmp_path / "sh010.mp4")
    assert info.pix_fmt == "yuv420p10le" and info.frames == own.shape[0]


@pytest.mark.model
def test_ingest_refuses_hdr_latents_into_an_sdr_job(tmp_path):
    from farm.inputs.ingest import add_pipeline_shot

    pipe, call = tiny_hdr_pipeline(tmp_path / "vae")
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
    size = {k: call[k] for k in ("num_frames", "height", "width")}
    sdr_spec = {"family": "ltx2", "config": dict(pipe.vae.config), "weights": {"path": str(tmp_path / "vae")},
                "dtype": "float32"}  # fmt: skip
    sdr_spec["config"] = {k: v for k, v in sdr_spec["config"].items() if not k.startswith("_")}
    with pytest.raises(FarmError, match="latents decode to logc3 values but the job's decoder spec says SDR"):
        add_pipeline_shot(tmp_path / "job.zarr", latents, pipeline=pipe, name="sh", fps=24, decoder=sdr_spec,
                          **size)  # fmt: skip


@pytest.mark.model
def test_ltx2_acescct_latent_decodes_to_ltx2s_native_hdr_acescg(tmp_path):
    """LTX-2's native --hdr decode (ltx-core: VAE output → (x + 1) / 2 clamped → ACEScct decompressed onto
    AP1, clamped at 0; not installable here) against the same decode through OpenColorIO's ACEScct →
    ACEScg; the latent made by diffusers' LTX-2 code at the tiny config."""
    from farm.decoders import FAMILIES
    from farm.inputs.pipelines import spec_from_pipeline

    pipe, call = tiny_hdr_pipeline(tmp_path / "vae")
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(2)).frames
    with torch.no_grad():
        decoded = pipe.vae.decode(latents, None, return_dict=False)[0][0].permute(1, 2, 3, 0).numpy()
    reference = np.maximum(ocio("ACEScct", "ACEScg", np.clip((decoded + 1.0) / 2.0, 0.0, 1.0)), 0.0)
    spec = parse_spec(spec_from_pipeline(pipe) | {"hdr": "acescct"}, families=FAMILIES)
    codes = load_decoder(spec).decode(latents[0], origin=(0, 0, 0)).permute(1, 2, 3, 0)
    frames = hdr.scene_linear_half(codes, spec.hdr).numpy()
    np.testing.assert_allclose(frames.astype(np.float32), reference, rtol=2e-3, atol=2e-4)

    paths = write_frames(frames, tmp_path / "exr", "sh", format="exr", exr_space="acescg",
                         frames_space=hdr.decoded_space(spec.hdr))  # fmt: skip
    np.testing.assert_array_equal(np.stack([read_image(p) for p in paths]), frames)  # ACEScg kept as is
    header = exr_header(paths[0])
    assert header["colorInteropID"] == "lin_ap1_scene" and header["colorSpace"] == "ACEScg"
