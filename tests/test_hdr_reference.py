"""farm's HDR renders against LTX-2's own HDR code, same weights, same latent.

LTX-2's native ``--hdr`` mode lives in ltx-core and ltx-pipelines newer than their releases on the package
index, so Lightricks' files are copied into ``tests/reference_code/ltx2_hdr`` (its README names the commit).
With them the test makes an HDR latent as the pipelines make their conditioning latents: scene-linear
Rec.709 frames with highlights far above 1.0, compressed to ACEScct codes by ltx-core's ``HDRTransfer``,
mapped by ``to_vae_range`` and encoded by ltx-core's own encoder (tiny, seeded weights). `farm ingest` and
`farm render --hdr acescct --sequence exr` decode it on a local cluster; the reference decodes it with
ltx-core's decoder from the same file and post-processes it with the pipelines' ``decode_hdr_video`` (the
function their EXR and HLG sinks call). The HLG master's planes are checked against ltx-core's
``HlgGpuConverter`` too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

ltx_core = pytest.importorskip("ltx_core", reason="ltx-core (tests/references.txt) decodes the reference")
OpenEXR = pytest.importorskip("OpenEXR")
pytest.importorskip("PyOpenColorIO")

from farm.media import hdr  # noqa: E402
from farm.media.hlg import hlg_planes  # noqa: E402
from farm.store.output import Output  # noqa: E402
from tests.helpers import LTX2_TINY_FILE_CONFIG, farm  # noqa: E402
from tests.reference_code.ltx2_hdr.hdr import HDRTransfer  # noqa: E402
from tests.reference_code.ltx2_hdr.pipelines import (  # noqa: E402
    HlgGpuConverter,
    decode_hdr_video,
    from_vae_range,
    to_vae_range,
)
from tests.reference_code.ltx2_hdr.primaries import Primaries  # noqa: E402
from tests.test_conformance_ltx2 import ltx_core_decoder, write_original_checkpoint  # noqa: E402

FRAMES, HEIGHT, WIDTH = 17, 64, 96
# ltx-core's encoder for the tiny VAE: three 2x space-and-time compressions after the 4x4 patches
ENCODER_BLOCKS = [["res_x", {"num_layers": 1}], ["compress_all_res", {"multiplier": 2}],
                  ["res_x", {"num_layers": 1}], ["compress_all_res", {"multiplier": 2}],
                  ["res_x", {"num_layers": 1}], ["compress_all_res", {"multiplier": 2}],
                  ["res_x", {"num_layers": 1}]]  # fmt: skip


def scene_linear_clip() -> torch.Tensor:
    """Scene-linear Rec.709 frames [1, 3, F, H, W]: a moving gradient from deep shadow to 60x diffuse
    white, with saturated patches, as an HDR plate would hold."""
    f, y, x = torch.meshgrid(torch.arange(FRAMES), torch.arange(HEIGHT), torch.arange(WIDTH), indexing="ij")
    ramp = torch.exp2((x + 3 * f) / (WIDTH + 3 * FRAMES) * 14.0 - 8.0)  # 2^-8 .. 2^6
    rgb = torch.stack([ramp, ramp * (0.3 + 0.7 * y / HEIGHT), ramp * (1.0 - 0.8 * y / HEIGHT)])
    return rgb[None].float()


def ltx_core_latent(checkpoint: Path) -> np.ndarray:
    """The clip encoded as LTX-2's pipelines encode HDR conditioning: ``to_working_space`` (ACEScct codes
    from Rec.709 linear), ``to_vae_range``, then ltx-core's encoder with the file's latent statistics."""
    from ltx_core.model.video_vae.model_configurator import VideoEncoderConfigurator
    from safetensors import safe_open

    torch.manual_seed(7)
    config = {**LTX2_TINY_FILE_CONFIG, "encoder_blocks": ENCODER_BLOCKS, "latent_log_var": "uniform"}
    encoder = VideoEncoderConfigurator.from_config({"vae": config}).eval()
    with safe_open(str(checkpoint), framework="pt") as f:
        for name in ("mean-of-means", "std-of-means"):
            encoder.per_channel_statistics.get_buffer(name).copy_(f.get_tensor(f"vae.per_channel_statistics.{name}"))
    working = HDRTransfer.ACESCCT.to_working_space(scene_linear_clip(), source_primaries=Primaries.REC709)
    with torch.inference_mode():
        latent = encoder(to_vae_range(working))
    return latent.numpy()  # [1, C, F', H', W'], normalized


def ltx_pipelines_decode(checkpoint: Path, latent: np.ndarray) -> torch.Tensor:
    """ltx-core's decode as its ``decode_video`` yields it ([F, H, W, 3] in [0, 1]), then the pipelines'
    ``decode_hdr_video`` for an ACEScg EXR: scene-linear ACEScg, float32."""
    decoder = ltx_core_decoder(checkpoint)
    with torch.inference_mode():
        pixels = decoder(torch.from_numpy(latent))
    chunk = from_vae_range(pixels[0].permute(1, 2, 3, 0))
    return decode_hdr_video(chunk, HDRTransfer.ACESCCT, out_primaries=Primaries.ACESCG)


def read_exr(path: Path) -> np.ndarray:
    with OpenEXR.File(str(path)) as f:
        return np.asarray(f.channels()["RGB"].pixels)


@pytest.fixture(scope="module")
def native_hdr_render(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """(OUT of `farm render --hdr acescct --sequence exr`, the pipelines' own ACEScg frames)."""
    root = tmp_path_factory.mktemp("ltx2-hdr")
    checkpoint = root / "ltx-2-vae.safetensors"
    write_original_checkpoint(checkpoint, LTX2_TINY_FILE_CONFIG)
    latent = ltx_core_latent(checkpoint)
    np.save(root / "sh010.npy", latent)
    job, out = root / "job.zarr", root / "out"
    done = farm("ingest", str(job), str(root / "sh010.npy"), "--decoder", "ltx2-tiny", "--weights",
                str(checkpoint), "--latents", "normalized", "--fps", "24")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = farm("render", str(job), "--out", str(out), "--workers", "2", "--tiles", "1,1,1",
                "--hdr", "acescct", "--sequence", "exr")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out, ltx_pipelines_decode(checkpoint, latent)


@pytest.mark.slow  # farm ingest and render in child processes
def test_native_hdr_latent_renders_to_the_pipelines_own_acescg(native_hdr_render):
    out, reference = native_hdr_render
    paths = sorted(Output(out).sequence_dir("sh010").glob("*.exr"))
    assert len(paths) == FRAMES
    got = np.stack([read_exr(p) for p in paths])
    assert got.dtype == np.float16
    want = reference.numpy()
    assert want.max() > 4.0  # highlights far above diffuse white reach the EXR
    # half-float rounding of the same float32 values (a relative step of 2^-11), plus float noise between
    # farm's and ltx-core's decoders, which the log curve multiplies by about 12x the value
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=1e-5)
    with OpenEXR.File(str(paths[0]), header_only=True) as f:
        header = dict(f.header())
    assert header["colorInteropID"] == "lin_ap1_scene"
    np.testing.assert_allclose(np.asarray(header["chromaticities"], np.float32).ravel(),
                               Primaries.ACESCG.exr_chromaticities, atol=1e-3)  # fmt: skip


@pytest.mark.slow  # farm ingest and render in child processes
def test_the_hlg_master_is_ltx_cores_hlg_conversion_of_those_frames(native_hdr_render):
    """The master's planes are those ltx-core's ``HlgGpuConverter`` makes of the same ACEScg frames
    (ACEScg → BT.2020 by its matrix, diffuse white at HLG 0.75), to a 10-bit code; read back, the
    master carries them through libx265."""
    import av

    out, reference = native_hdr_render
    frames = np.stack([read_exr(p) for p in sorted(Output(out).sequence_dir("sh010").glob("*.exr"))])
    farm_planes = hlg_planes(frames, "acescg")  # what farm's master encodes
    ltx_planes = [p.numpy() for p in HlgGpuConverter.create(Primaries.ACESCG, device=torch.device("cpu"))(
        torch.from_numpy(frames.astype(np.float32)))]  # fmt: skip
    for ours, theirs in zip(farm_planes, ltx_planes, strict=True):
        assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1
    with av.open(str(Output(out).video("sh010"))) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.color_primaries, stream.codec_context.color_trc) == (9, 18)
        decoded = [f.to_ndarray(format="yuv420p10le") for f in container.decode(stream)]
    assert len(decoded) == FRAMES and decoded[0].dtype == np.uint16
    luma = np.stack([d[:HEIGHT] for d in decoded]).astype(float)
    # libx265 at crf 12, as ltx-core's own master encoder, on the noise of random weights: 41 dB measured
    psnr = 10 * np.log10(1023.0**2 / np.mean((luma - ltx_planes[0].astype(float)) ** 2))
    assert psnr > 35.0, f"the master's luma is {psnr:.1f} dB from ltx-core's planes"


def test_acescct_and_logc3_codes_decompress_as_ltx_cores_transfers():
    codes = np.linspace(0.0, 1.0, 4097, dtype=np.float32).reshape(1, -1, 1, 1).repeat(3, axis=0)
    for name, transfer, primaries in (("acescct", HDRTransfer.ACESCCT, Primaries.ACESCG),
                                      ("logc3", HDRTransfer.LOGC3, Primaries.REC709)):  # fmt: skip
        theirs = transfer.to_linear(torch.from_numpy(codes[None]), out_primaries=primaries)[0].numpy()
        ours = hdr.codes_to_linear(codes, name)
        # ltx-core clamps LogC3's toe (down to -0.017) at 0; diffusers' LTX2HDRPipeline, which farm
        # follows for LogC3, leaves it
        np.testing.assert_allclose(np.maximum(ours, 0.0), theirs, rtol=1e-6, atol=1e-7)


def test_hlg_signal_is_ltx_cores():
    linear = torch.from_numpy(np.geomspace(1e-5, 300.0, 3000, dtype=np.float32).reshape(1, 3, 1000, 1))
    converter = HlgGpuConverter.create(Primaries.REC709, device=torch.device("cpu"))
    converter.prim_mat = torch.eye(3)  # the signal alone: the values are BT.2020 already
    theirs = converter.to_hlg_signal_(linear).numpy()
    ours = hdr.hlg_signal(linear.movedim(1, -1).numpy()).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(ours, theirs, atol=2e-6)
