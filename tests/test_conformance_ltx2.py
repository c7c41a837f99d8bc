"""farm's LTX-2 decode against Lightricks' own decoder (ltx-core), same weights, same latent.

The test writes an LTX-2 checkpoint as Lightricks ship it (original tensor names under ``vae.``, the model
config as JSON in the safetensors metadata) at the released structure with a few channels (farm's
``ltx2-tiny``), builds ltx-core's decoder from that file as ltx-core does (its configurator reads the
metadata), and has `farm ingest` + `farm render` decode the same latent: float32 on a CPU, the frames must
be ltx-core's to the last 8-bit level. ltx-core 1.0.0 is installed without its dependencies
(tests/references.txt: it pins an older torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from tests.helpers import LTX2_TINY_FILE_CONFIG, farm

ltx_core = pytest.importorskip("ltx_core", reason="ltx-core (tests/references.txt) is the LTX-2 reference")

TINY_VAE = LTX2_TINY_FILE_CONFIG
LATENT = (8, 5, 4, 6)  # channels, latent frames, rows, columns: 33 frames of 128x192


def write_original_checkpoint(path: Path, vae_config: dict, seed: int = 0) -> None:
    """An LTX-2 single file as released: ltx-core's decoder with seeded weights under ``vae.decoder.``,
    its latent statistics under ``vae.per_channel_statistics.``, the config in the metadata."""
    import torch
    from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    decoder = VideoDecoderConfigurator.from_config({"vae": vae_config})
    stats = decoder.per_channel_statistics
    channels = vae_config["latent_channels"]
    with torch.no_grad():
        stats.get_buffer("mean-of-means").copy_(torch.randn(channels) * 0.5)
        stats.get_buffer("std-of-means").copy_(torch.rand(channels) + 0.5)
    tensors = {}
    for name, tensor in decoder.state_dict().items():
        key = "vae." + name if name.startswith("per_channel_statistics.") else "vae.decoder." + name
        tensors[key] = tensor.contiguous()
    metadata = {"config": json.dumps({"vae": vae_config})}
    save_file(tensors, str(path), metadata=metadata)


def ltx_core_decoder(path: Path):
    """ltx-core's decoder built from the file the way ltx-core builds it: its configurator reads the file's
    config metadata, its key filter takes ``vae.decoder.*`` and ``vae.per_channel_statistics.*``."""
    from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["config"])
        state = {}
        for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            if key.startswith("vae.decoder."):
                state[key[len("vae.decoder.") :]] = f.get_tensor(key)
            elif key.startswith("vae.per_channel_statistics."):
                state[key[len("vae.") :]] = f.get_tensor(key)
    decoder = VideoDecoderConfigurator.from_config(config)
    decoder.load_state_dict(state, strict=True)
    return decoder.eval()


def reference_frames(path: Path, latent: np.ndarray, tiling=None) -> np.ndarray:
    """ltx-core's decode of a normalized `latent` [C, F, H, W] → float frames [F, H, W, 3] in [0, 1]
    (untiled, or its own tiled decode with `tiling`)."""
    import torch

    decoder = ltx_core_decoder(path)
    z = torch.from_numpy(latent)[None]
    with torch.inference_mode():
        if tiling is None:
            pixels = decoder(z)
        else:
            pixels = torch.cat(list(decoder.tiled_decode(z, tiling)), dim=2)
    return ((pixels[0].float() + 1) / 2).clamp(0, 1).permute(1, 2, 3, 0).numpy()


def levels(frames: np.ndarray) -> np.ndarray:
    """Float frames in [0, 1] → uint8 levels as farm rounds them."""
    return np.round(np.clip(frames, 0, 1) * 255).astype(np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> tuple[Path, Path, np.ndarray]:
    """(checkpoint, job made by `farm ingest` from a normalized latent file, that latent)."""
    root = tmp_path_factory.mktemp("ltx2-conformance")
    checkpoint = root / "ltx-2-vae.safetensors"
    write_original_checkpoint(checkpoint, TINY_VAE)
    latent = np.random.default_rng(3).standard_normal(LATENT).astype(np.float32)
    np.save(root / "shot.npy", latent[None])
    job = root / "job.zarr"
    done = farm("ingest", str(job), str(root / "shot.npy"), "--decoder", "ltx2-tiny", "--weights",
                str(checkpoint), "--latents", "normalized")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return checkpoint, job, latent


def rendered(job: Path, out: Path, *options: str) -> np.ndarray:
    import zarr

    done = farm("render", str(job), "--out", str(out), "--workers", "2", "--no-video", *options)
    assert done.returncode == 0, done.stderr
    return np.asarray(zarr.open_group(str(out / "frames.zarr"), mode="r")["shot/frames"][:])


def test_farm_decodes_an_ltx2_file_as_ltx_core_does(released, tmp_path):
    checkpoint, job, latent = released
    reference = levels(reference_frames(checkpoint, latent))
    frames = rendered(job, tmp_path / "out", "--tiles", "1,1,1")
    assert frames.shape == reference.shape == (33, 128, 192, 3)
    assert np.array_equal(frames, reference), f"max {np.abs(frames.astype(int) - reference).max()} levels"


def test_a_temporal_split_with_context_over_the_receptive_field_is_exact(released, tmp_path):
    checkpoint, job, latent = released
    reference = reference_frames(checkpoint, latent)
    frames = rendered(job, tmp_path / "out", "--tiles", "2,1,1", "--overlap", "0,0,0")
    diff = np.abs(frames.astype(np.float64) / 255 - reference) * 255
    assert diff.max() <= 0.5 + 1e-3  # float rounding only: within the half level rounding adds


def test_spatial_tiles_are_at_least_as_close_as_ltx_core_own_tiling(released, tmp_path):
    from ltx_core.model.video_vae.tiling import SpatialTilingConfig, TemporalTilingConfig, TilingConfig

    checkpoint, job, latent = released
    untiled = levels(reference_frames(checkpoint, latent))
    # ltx-core's 2x2 grid of this latent (4x6), tiles overlapping by 2 latent units; one temporal tile over
    # the whole clip (its tiled decode needs a temporal config)
    spatial = SpatialTilingConfig(tile_size_in_pixels=128, tile_overlap_in_pixels=64)
    whole_clip = TemporalTilingConfig(tile_size_in_frames=64)
    tiling = TilingConfig(spatial_config=spatial, temporal_config=whole_clip)
    theirs = levels(reference_frames(checkpoint, latent, tiling))
    ours = rendered(job, tmp_path / "out", "--tiles", "1,2,2", "--overlap", "0,2,2")
    # the same grid and blend, but farm's tiles decode their halo: they equal ltx-core's untiled decode
    # (within a level of rounding), where ltx-core's own tiles are seams away from it
    assert np.abs(ours.astype(int) - untiled).max() <= 1
    assert psnr(ours, untiled) > psnr(theirs, untiled) + 10, (psnr(ours, untiled), psnr(theirs, untiled))


def test_carry_is_refused_for_a_decoder_that_looks_ahead(released, tmp_path):
    _, job, _ = released
    done = farm("render", str(job), "--out", str(tmp_path / "out"), "--workers", "1", "--chunk", "2,0,0",
                "--carry")  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "carr" in done.stderr and "causal" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_named_config_that_contradicts_the_file_is_refused_naming_the_field(tmp_path):
    checkpoint = tmp_path / "causal.safetensors"
    write_original_checkpoint(checkpoint, {**TINY_VAE, "causal_decoder": True})
    done = farm("synth", str(tmp_path / "job.zarr"), "--decoder", "ltx2-tiny", "--weights", str(checkpoint),
                "--frames", "9", "--height", "64", "--width", "64")  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "decoder_causal" in done.stderr and str(checkpoint) in done.stderr
    assert not (tmp_path / "job.zarr").exists()


def test_the_file_config_maps_to_the_named_config():
    from farm.decoders.ltx2 import LTX2Decoder
    from farm.decoders.ltx2.metadata import ltx2_decoder_config

    config_contradictions = LTX2Decoder.config_contradictions

    mapped = ltx2_decoder_config(TINY_VAE, "test")
    tiny = LTX2Decoder._full_config(LTX2Decoder.named_configs["ltx2-tiny"])
    assert config_contradictions(mapped, tiny) == []
    # the released LTX-2 file's blocks (5 layers a stage, 128 base channels) are the ltx2 config
    real = {**TINY_VAE, "latent_channels": 128, "decoder_base_channels": 128,
            "decoder_blocks": [[n, {**c, "num_layers": 5} if n == "res_x" else c]
                               for n, c in TINY_VAE["decoder_blocks"]]}  # fmt: skip
    full = LTX2Decoder._full_config(LTX2Decoder.named_configs["ltx2"])
    assert config_contradictions(ltx2_decoder_config(real, "test"), full) == []
    with pytest.raises(FarmError, match="decoder_blocks"):
        ltx2_decoder_config({"decoder_blocks": [["compress_all", {"multiplier": 2}]]}, "test")
    # a file that leaves the blocks out is compared on what it says, with ltx-core's defaults
    assert ltx2_decoder_config({"latent_channels": 8}, "test")["timestep_conditioning"] is True
