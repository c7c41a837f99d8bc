"""`farm ingest` (farm.inputs.ingest): latent files written by the libraries that make them, ingested,
rendered on a real local cluster and compared with diffusers' own decode of the same tensors; refusals
that leave the job store as it was."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import farm
from farm.cli import main as farm_main
from farm.errors import FarmError
from farm.inputs.ingest import ingest
from farm.inputs.pipelines import PIPELINES
from farm.inputs.synthetic import smooth_latent
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output

C = 8  # ltx2-tiny latent channels
SHAPE = (C, 2, 3, 4)  # [C, F, H, W]: 9 frames of 96x128


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory) -> Path:
    """An ltx2-tiny VAE with seeded weights and non-trivial latent statistics, saved by diffusers."""
    from diffusers import AutoencoderKLLTX2Video

    from farm.decoders.ltx2 import LTX2_TINY

    torch.manual_seed(3)
    vae = AutoencoderKLLTX2Video(**LTX2_TINY)
    with torch.no_grad():
        vae.latents_mean.copy_(torch.randn(C) * 0.5)
        vae.latents_std.copy_(torch.rand(C) + 0.5)
    path = tmp_path_factory.mktemp("vae") / "ltx2-tiny-vae"
    vae.save_pretrained(path)
    return path


def diffusers_frames(vae_folder: Path, latent: torch.Tensor, normalized: bool) -> np.ndarray:
    """Frames [F, H, W, 3] in 0-255 (float) from diffusers alone: the pipeline's un-normalisation and
    ``vae.decode``."""
    from diffusers import AutoencoderKLLTX2Video, LTX2Pipeline

    vae = AutoencoderKLLTX2Video.from_pretrained(vae_folder).eval()
    z = latent.float()[None]
    if normalized:
        z = LTX2Pipeline._denormalize_latents(z, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    with torch.inference_mode():
        video = vae.decode(z, return_dict=False)[0][0]
    return ((video + 1) / 2).clamp(0, 1).mul(255).permute(1, 2, 3, 0).numpy()


def smooth(seed: int, shape=SHAPE, batch: int | None = None) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if batch is None:
        return torch.from_numpy(smooth_latent(rng, shape))
    return torch.stack([torch.from_numpy(smooth_latent(rng, shape)) for _ in range(batch)])


def comfyui_latent(path: Path, tensor: torch.Tensor, prompt: dict | None = None) -> None:
    """A .latent file as ComfyUI's Save Latent node writes it."""
    metadata = {"prompt": json.dumps(prompt)} if prompt is not None else None
    save_file({"latent_tensor": tensor.contiguous(), "latent_format_version_0": torch.tensor([])}, str(path),
              metadata=metadata)  # fmt: skip


def snapshot(folder: Path, siblings: bool = True) -> dict[str, str]:
    """Every file under `folder` with its content hash, and the names beside it (staging folders)."""
    out = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip
    if siblings:
        out["<siblings>"] = ",".join(sorted(p.name for p in folder.parent.iterdir()))
    return out


def spec_args(vae_folder: Path) -> list[str]:
    return ["--decoder", "ltx2-tiny", "--weights", str(vae_folder)]


def test_every_format_ingests_renders_and_matches_diffusers_decode(vae_folder, tmp_path, scheduler3, capsys):
    src = tmp_path / "src"
    src.mkdir()
    tensors = {"sh 010": smooth(1, batch=2), "sh020": smooth(2), "sh030": smooth(3), "sh040": smooth(4)}
    # ComfyUI's LTX latents are normalized (its VAE un-normalises inside decode): the job becomes so.
    comfyui_latent(src / "sh 010.latent", tensors["sh 010"],
                   {"3": {"class_type": "LTXVConditioning", "inputs": {"frame_rate": 25}}})  # fmt: skip
    save_file({"latents": tensors["sh020"], "noise": torch.zeros(3)}, str(src / "sh020.safetensors"))
    torch.save(tensors["sh030"].bfloat16(), src / "sh030.pt")
    np.save(src / "sh040.npy", tensors["sh040"].numpy())
    (src / "notes.txt").write_text("not a latent")
    job = tmp_path / "job.zarr"
    assert farm_main(["ingest", str(job), str(src), *spec_args(vae_folder)]) == 0
    assert "notes.txt: skipped (not a latent file)" in capsys.readouterr().err
    info = open_job(job)
    assert info.spec.latents == "normalized"
    assert sorted(info.shots) == ["sh020", "sh030", "sh040", "sh_010_0", "sh_010_1"]
    assert info.shots["sh_010_0"].fps == 25.0 and info.shots["sh020"].fps == 24.0  # from the workflow
    assert info.shots["sh_010_1"].attrs["source"]["comfyui_format_version"] == 0
    assert info.shots["sh030"].attrs["source"]["dtype"] == "bfloat16"

    stats = farm.render(job, tmp_path / "out", scheduler=scheduler3,
                        options=farm.PlanOptions(tiles=(1, 1, 1)), log=lambda _: None)  # fmt: skip
    assert not stats.failed
    expected = {"sh_010_0": tensors["sh 010"][0], "sh_010_1": tensors["sh 010"][1], "sh020": tensors["sh020"],
                "sh030": tensors["sh030"].bfloat16(), "sh040": tensors["sh040"]}  # fmt: skip
    for shot, latent in expected.items():
        got = read_frames(Output(tmp_path / "out"), shot).astype(np.float64)
        want = diffusers_frames(vae_folder, latent, normalized=True)
        assert got.shape == want.shape == (9, 96, 128, 3)
        assert np.abs(got - want).max() <= 1.0, shot


def test_adding_to_a_job_keeps_its_shots_and_replace_overwrites(vae_folder, tmp_path):
    job = tmp_path / "job.zarr"
    np.save(tmp_path / "a.npy", smooth(1).numpy())
    result = ingest(job, [tmp_path / "a.npy"], decoder="ltx2-tiny", weights=vae_folder,
                    latents="denormalized")  # fmt: skip
    assert result.created and result.shots == ["a"]
    before = snapshot(job / "a", siblings=False)
    import socket

    stale = tmp_path / f".job.zarr.ingest-{socket.gethostname()}-999999999-0"  # a killed ingest's
    (stale / "x").mkdir(parents=True)
    np.save(tmp_path / "b.npy", smooth(2).numpy())
    assert ingest(job, [tmp_path / "b.npy"], decoder="ltx2-tiny").shots == ["b"]  # the job's weights
    assert not stale.exists()
    assert snapshot(job / "a", siblings=False) == before
    np.save(tmp_path / "a.npy", smooth(3).numpy())
    result = ingest(job, [tmp_path / "a.npy"], replace=True)
    assert result.replaced == ["a"]
    import zarr

    got = np.asarray(zarr.open_array(store=str(job / "a" / "latent"), mode="r")[...])
    np.testing.assert_array_equal(got, smooth(3).numpy())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".job.zarr.ingest")]


def bad_sources(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Each refusal: (arguments after the job, words the error must hold)."""
    cases: dict[str, tuple[list[str], str]] = {}
    np.save(tmp / "channels.npy", smooth(1, (4, 2, 3, 4)).numpy())
    cases["wrong channel count"] = (["channels.npy"], "4 channels but the decoder ltx2 [ltx2-tiny] takes 8")
    np.save(tmp / "rank.npy", np.zeros((8, 3, 4), np.float32))
    cases["wrong rank"] = (["rank.npy"], "expected [C, F, H, W] or [B, C, F, H, W]")
    np.save(tmp / "thin.npy", smooth(1, (C, 2, 1, 4)).numpy())
    cases["too small"] = (["thin.npy"], "too small")
    np.save(tmp / "ints.npy", np.zeros(SHAPE, np.int32))
    cases["integer latent"] = (["ints.npy"], "not floating point")
    nan = smooth(1).numpy()
    nan[:, 1] = np.nan
    np.save(tmp / "good.npy", smooth(2).numpy())
    np.save(tmp / "zz_nan.npy", nan)  # read after good.npy was staged
    cases["NaN after a good file"] = (["good.npy", "zz_nan.npy"], "NaN or Inf in latent frames [1]")
    np.save(tmp / "shot.npy", smooth(1).numpy())
    cases["collision with the job"] = (["shot.npy"], "already holds a shot 'shot'; pass --replace")
    (tmp / "d1").mkdir()
    (tmp / "d2").mkdir()
    np.save(tmp / "d1" / "x.npy", smooth(1).numpy())
    np.save(tmp / "d2" / "x.npy", smooth(2).numpy())
    cases["collision between sources"] = (["d1", "d2"], "would come from both")
    np.save(tmp / "a b.npy", smooth(1).numpy())
    np.save(tmp / "a_b.npy", smooth(2).numpy())
    cases["collision after sanitising"] = (["a b.npy", "a_b.npy"], "'a_b' would come from both")
    (tmp / "x.txt").write_text("hello")
    cases["unknown format"] = (["x.txt"], "unknown latent file format '.txt'")
    np.save(tmp / "fake.npy", smooth(1).numpy())
    os.rename(tmp / "fake.npy", tmp / "fake.pt")
    cases["mislabelled file"] = (["fake.pt"], "does not start like one")
    comfyui_latent(tmp / "norm.latent", smooth(1, batch=1))
    cases["other convention"] = (["norm.latent"], "holds normalized latents but the job holds denormalized")
    comfyui_latent(tmp / "image.latent", torch.zeros(1, C, 4, 4))
    cases["image latent"] = (["image.latent"], "an image latent")
    save_file({"p": torch.zeros(SHAPE), "q": torch.zeros(SHAPE)}, str(tmp / "two.safetensors"))
    cases["ambiguous tensor"] = (["two.safetensors"], "choose one with --tensor NAME")
    other = ["--decoder", "ltxv-tiny", "--weights", str(tmp)]
    cases["other decoder"] = (["good.npy", *other], "another decoder")
    cases["bad pattern"] = (["good.npy", "--name", "{file}"], "may use {stem}, {index}, {n}, {key}")
    cases["missing source"] = (["nowhere.npy"], "no such file or folder")
    return cases


@pytest.mark.parametrize("case", [
    "wrong channel count", "wrong rank", "too small", "integer latent", "NaN after a good file",
    "collision with the job", "collision between sources", "collision after sanitising", "unknown format",
    "mislabelled file", "other convention", "image latent", "ambiguous tensor", "other decoder",
    "bad pattern", "missing source",
])  # fmt: skip
def test_refusals_are_clear_and_leave_the_job_as_it_was(vae_folder, tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job" / "job.zarr"
    np.save(tmp_path / "shot.npy", smooth(0).numpy())
    ingest(job, [tmp_path / "shot.npy"], decoder="ltx2-tiny", weights=vae_folder, latents="denormalized")
    args, words = bad_sources(tmp_path)[case]
    before = snapshot(job)
    capsys.readouterr()
    assert farm_main(["ingest", str(job), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("farm: error: ") and "Traceback" not in err
    assert words in err, err
    assert snapshot(job) == before


def test_refusal_before_a_new_job_leaves_nothing(vae_folder, tmp_path, capsys):
    np.save(tmp_path / "ok.npy", smooth(1).numpy())
    np.save(tmp_path / "raw.npy", smooth(2).numpy())
    job = tmp_path / "new.zarr"
    # raw tensors do not say their convention: a new job needs --latents
    assert farm_main(["ingest", str(job), str(tmp_path / "raw.npy"), *spec_args(vae_folder)]) == 2
    assert "--latents denormalized" in capsys.readouterr().err
    nan = smooth(3).numpy()
    nan[0, 0, 0, 0] = np.inf
    np.save(tmp_path / "z.npy", nan)
    args = ["ingest", str(job), str(tmp_path / "ok.npy"), str(tmp_path / "z.npy"), "--latents", "normalized"]
    assert farm_main([*args, *spec_args(vae_folder)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.npy", "raw.npy", "z.npy"]


class CreatesAFolder:
    """A pickled object whose unpickling calls os.mkdir(path): code run by merely loading the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_pt_file_with_a_pickled_object_is_refused_without_running_it(vae_folder, tmp_path, capsys):
    armed = tmp_path / "ran-when-unpickled"
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(CreatesAFolder(str(proof))))
    assert proof.is_dir()  # the payload does run when unpickled unrestricted
    torch.save({"latents": smooth(1), "extra": CreatesAFolder(str(armed))}, tmp_path / "evil.pt")
    job = tmp_path / "job.zarr"
    args = ["ingest", str(job), str(tmp_path / "evil.pt"), "--latents", "denormalized"]
    assert farm_main([*args, *spec_args(vae_folder)]) == 2
    err = capsys.readouterr().err
    assert "refused: it holds pickled objects other than tensors" in err and "weights_only=True" in err
    assert not armed.exists() and not job.exists()


# ---- pure parts ----------------------------------------------------------------------------------


def test_format_detection_by_extension_and_first_bytes(tmp_path):
    from farm.inputs.latent_files import detect_format, read_head

    np.save(tmp_path / "a.npy", np.zeros(3, np.float32))
    torch.save(torch.zeros(3), tmp_path / "a.pt")
    save_file({"x": torch.zeros(3)}, str(tmp_path / "a.safetensors"))
    assert detect_format("a.npy", read_head(tmp_path / "a.npy")) == "numpy"
    assert detect_format("A.PT", read_head(tmp_path / "a.pt")) == "torch"
    assert detect_format("a.latent", read_head(tmp_path / "a.safetensors")) == "comfyui"
    with pytest.raises(FarmError, match="does not start like one"):
        detect_format("a.safetensors", read_head(tmp_path / "a.npy"))
    with pytest.raises(FarmError, match="unknown latent file format '.h5'"):
        detect_format("a.h5", b"\x89HDF\r\n\x1a\n")


def test_comfyui_metadata_gives_version_family_hint_and_frame_rate():
    from farm.inputs.latent_files import comfyui_info

    prompt = {"1": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"length": 33}},  # Wan uses it too
              "2": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
              "3": {"class_type": "CreateVideo", "inputs": {"fps": 16}},
              "4": {"class_type": "KSampler", "inputs": {"seed": 3}}}  # fmt: skip
    info = comfyui_info({"latent_tensor", "latent_format_version_0"}, {"prompt": json.dumps(prompt)})
    assert (info.format_version, info.families, info.fps) == (0, ("wan",), 16.0)
    ltx = {"1": {"class_type": "LTXVConditioning", "inputs": {"frame_rate": 25}}}
    assert comfyui_info(set(), {"prompt": json.dumps(ltx)}).families == ("ltx2", "ltxv")
    legacy = comfyui_info({"latent_tensor"}, {})
    assert (legacy.format_version, legacy.families, legacy.fps) == (None, (), None)


def test_legacy_comfyui_files_are_scaled_as_comfyui_loads_them(tmp_path):
    from farm.inputs.latent_files import load, scan

    t = smooth(1, batch=1)
    save_file({"latent_tensor": t}, str(tmp_path / "old.latent"))
    np.testing.assert_allclose(load(scan(tmp_path / "old.latent")), t.numpy() / 0.18215, rtol=1e-6)


def test_names_are_sanitised_to_the_store_rules():
    from farm.inputs.ingest import sanitize_name
    from farm.store.job import check_shot_name

    for raw, want in [("sh 010", "sh_010"), ("../up", "up"), ("ComfyUI_00001_", "ComfyUI_00001"),
                      ("..", "shot"), ("é/ü", "shot"), ("a.b-c", "a.b-c")]:  # fmt: skip
        assert sanitize_name(raw) == want
        check_shot_name(want)


# ---- diffusers pipelines with output_type="latent" -----------------------------------------------


def tiny_pipeline(family: str, vae_dir: Path):
    """A diffusers video pipeline at a tiny config with random weights, built here (no hub, no text
    encoder: it is given prompt embeddings; LTX-2's audio parts tiny too), its VAE loaded from `vae_dir`;
    and its call arguments."""
    import diffusers as d

    from farm.decoders.hunyuanvideo import HUNYUANVIDEO_TINY
    from farm.decoders.ltxv import LTXV_TINY
    from farm.decoders.wan import WAN_TINY

    torch.manual_seed(5)
    size = {"num_frames": 9, "height": 64, "width": 64} if family.startswith("ltx") else {
        "num_frames": 9, "height": 32, "width": 32}  # fmt: skip
    if family == "ltx2":
        from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
        from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

        from farm.decoders.ltx2 import LTX2_TINY

        # the pipeline sizes latents by the VAE's compression ratios: say the decoder's (32, 8)
        ratios = {"spatial_compression_ratio": 32, "temporal_compression_ratio": 8}
        vae = d.AutoencoderKLLTX2Video(**LTX2_TINY, **ratios)
        with torch.no_grad():
            vae.latents_mean.copy_(torch.randn(8) * 0.5)
            vae.latents_std.copy_(torch.rand(8) + 0.5)
        heads = {"num_attention_heads": 2, "attention_head_dim": 8}
        transformer = d.LTX2VideoTransformer3DModel(
            in_channels=8, out_channels=8, **heads, cross_attention_dim=16, audio_in_channels=32,
            audio_out_channels=32, audio_num_attention_heads=2, audio_attention_head_dim=8,
            audio_cross_attention_dim=16, num_layers=1, caption_channels=16)  # fmt: skip
        connectors = LTX2TextConnectors(
            caption_channels=16, text_proj_in_factor=2, video_connector_num_attention_heads=2,
            video_connector_attention_head_dim=8, video_connector_num_layers=1,
            video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=2,
            audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32)  # fmt: skip
        from farm.decoders.ltx2.audio import LTX2_AUDIO_TINY

        # LTX-2's sound at farm's tiny widths: 2 latent channels x 16 latent mel bins = 32 audio channels
        audio_vae = d.AutoencoderKLLTX2Audio(**LTX2_AUDIO_TINY["audio_vae"])
        vocoder = LTX2Vocoder(**LTX2_AUDIO_TINY["vocoder"])
        cls, parts = d.LTX2Pipeline, {"text_encoder": None, "tokenizer": None, "connectors": connectors,
                                      "audio_vae": audio_vae, "vocoder": vocoder}  # fmt: skip
        prompt = {"prompt_embeds": torch.randn(1, 4, 32), "prompt_attention_mask": torch.ones(1, 4),
                  "guidance_scale": 1.0, "stg_scale": 0.0, "modality_scale": 1.0, "audio_guidance_scale": 1.0,
                  "audio_stg_scale": 0.0, "audio_modality_scale": 1.0}  # fmt: skip
    elif family == "ltxv":
        vae = d.AutoencoderKLLTXVideo(**LTXV_TINY)
        with torch.no_grad():
            vae.latents_mean.copy_(torch.randn(8) * 0.5)
            vae.latents_std.copy_(torch.rand(8) + 0.5)
        transformer = d.LTXVideoTransformer3DModel(
            in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
            attention_head_dim=8, cross_attention_dim=16, num_layers=1, caption_channels=16)  # fmt: skip
        cls, parts = d.LTXPipeline, {"text_encoder": None, "tokenizer": None}
        prompt = {"prompt_embeds": torch.randn(1, 4, 16), "prompt_attention_mask": torch.ones(1, 4),
                  "guidance_scale": 1.0, "frame_rate": 25}  # fmt: skip
    elif family == "wan":
        vae = d.AutoencoderKLWan(**WAN_TINY)
        transformer = d.WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=32, ffn_dim=32, num_layers=1, rope_max_seq_len=32)  # fmt: skip
        cls, parts = d.WanPipeline, {"text_encoder": None, "tokenizer": None}
        prompt = {"prompt_embeds": torch.randn(1, 4, 16), "guidance_scale": 1.0}
    elif family == "cogvideox":  # CogVideoX1.5's form: latent frames padded to a multiple of patch_size_t
        from farm.decoders.cogvideox import COGVIDEOX_TINY

        vae = d.AutoencoderKLCogVideoX(**COGVIDEOX_TINY)
        transformer = d.CogVideoXTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
            text_embed_dim=16, num_layers=1, sample_width=4, sample_height=4, sample_frames=9, patch_size=2,
            patch_size_t=2, max_text_seq_length=4, use_rotary_positional_embeddings=True)  # fmt: skip
        cls, parts = d.CogVideoXPipeline, {"text_encoder": None, "tokenizer": None}
        prompt = {"prompt_embeds": torch.randn(1, 4, 16), "guidance_scale": 1.0}
    elif family == "mochi":
        from farm.decoders.mochi import MOCHI_TINY

        vae = d.AutoencoderKLMochi(**MOCHI_TINY)
        transformer = d.MochiTransformer3DModel(
            patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1, pooled_projection_dim=16,
            in_channels=12, text_embed_dim=16, time_embed_dim=4)  # fmt: skip
        cls, parts = d.MochiPipeline, {"text_encoder": None, "tokenizer": None}
        prompt = {"prompt_embeds": torch.randn(1, 4, 16), "prompt_attention_mask": torch.ones(1, 4),
                  "guidance_scale": 1.0}  # fmt: skip
        size = {**size, "num_frames": 13}
    else:
        vae = d.AutoencoderKLHunyuanVideo(**HUNYUANVIDEO_TINY)
        transformer = d.HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
            num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
            text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4))  # fmt: skip
        cls, parts = d.HunyuanVideoPipeline, {"text_encoder": None, "tokenizer": None, "text_encoder_2": None,
                                              "tokenizer_2": None}  # fmt: skip
        prompt = {"prompt_embeds": torch.randn(1, 4, 16), "pooled_prompt_embeds": torch.randn(1, 8),
                  "prompt_attention_mask": torch.ones(1, 4)}  # fmt: skip
    vae.save_pretrained(vae_dir)
    scheduler = (d.CogVideoXDDIMScheduler() if family == "cogvideox"
                 else d.FlowMatchEulerDiscreteScheduler(shift=3.0 if family == "wan" else 1.0))  # fmt: skip
    loaded = type(vae).from_pretrained(vae_dir).eval()  # the VAE knows the folder it came from
    pipe = cls(vae=loaded, transformer=transformer, scheduler=scheduler, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe, {**prompt, **size, "num_inference_steps": 2}


@pytest.mark.parametrize("family", ["ltx2", "ltxv", "wan", "hunyuanvideo", "cogvideox", "mochi"])
def test_pipeline_latents_through_the_helper_render_as_the_pipeline_decodes(family, tmp_path, scheduler3):
    from farm.inputs.ingest import add_pipeline_shot

    pipe, call = tiny_pipeline(family, tmp_path / "vae")
    latents = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(1)).frames
    own = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(1)).frames[0]  # [F, H, W, 3]
    size = {k: call[k] for k in ("num_frames", "height", "width")}
    job = tmp_path / "job.zarr"
    result = add_pipeline_shot(job, latents, pipeline=pipe, name="sh010", fps=25, **size)
    assert result.created and result.shots == ["sh010"]
    info = open_job(job)
    assert info.spec.family == family and info.spec.weights["path"] == str(tmp_path / "vae")
    assert info.spec.weights["layout"] == "diffusers" and len(info.spec.weights["identity"]) == 32
    assert info.spec.latents == PIPELINES[type(pipe).__name__].latents == result.latents
    source = info.shots["sh010"].attrs["source"]
    assert source["pipeline"] == type(pipe).__name__ and source["latents"] == info.spec.latents
    with pytest.raises(FarmError, match="already holds a shot 'sh010'"):
        add_pipeline_shot(job, latents, pipeline=pipe, name="sh010", fps=25, **size)
    packed = latents.ndim == 3  # LTX-Video's tokens [B, S, D]
    frames_first = family == "cogvideox"  # [B, F, C, H, W]
    twice = torch.cat([latents, latents], dim=1 if packed or frames_first else 2)
    words = ("do not hold 2x2x2 latent positions" if packed
             else "hold 8 latent frames, not the 3" if frames_first
             else r"to num_frames (21|25|31) .* num_frames (9|13)")  # fmt: skip
    with pytest.raises(FarmError, match=words):
        add_pipeline_shot(job, twice, pipeline=pipe, name="long", fps=25, **size)
    assert sorted(open_job(job).shots) == ["sh010"]

    stats = farm.render(job, tmp_path / "out", scheduler=scheduler3,
                        options=farm.PlanOptions(tiles=(1, 1, 1)), log=lambda _: None)  # fmt: skip
    assert not stats.failed
    got = read_frames(Output(tmp_path / "out"), "sh010").astype(np.float64)
    assert got.shape == own.shape
    assert np.abs(got - own.astype(np.float64) * 255).max() <= 1.0


def branches(source: str, condition: str) -> tuple[str, str]:
    """The bodies of ``if <condition>:`` and its ``else:`` in a function's source."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"if {condition}:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    bodies: list[list[str]] = [[], []]
    part = 0
    for line in lines[start + 1 :]:
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth <= indent:
            if line.strip() == "else:" and part == 0:
                part = 1
                continue
            break
        bodies[part].append(line)
    return "\n".join(bodies[0]), "\n".join(bodies[1])


@pytest.mark.model  # imports diffusers' pipelines
@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_pipeline_convention_is_what_its_source_does(name):
    """farm.inputs.pipelines' table against diffusers' code: the branch taken with output_type="latent"."""
    import importlib
    import inspect

    import diffusers

    conv = PIPELINES[name]
    pipeline = getattr(diffusers, name)
    undo = ("_denormalize_latents", "latents_std", "latents_inv_std", "scaling_factor")
    if issubclass(getattr(diffusers, name), diffusers.ModularPipeline):
        # no output_type="latent": the latents are what the decode blocks take (the package's `decoders`),
        # un-normalised there before vae.decode when normalized
        blocks = importlib.import_module(getattr(diffusers, name).__module__.rsplit(".", 1)[0] + ".decoders")
        steps = [inspect.getsource(c.__call__) for c in vars(blocks).values()
                 if isinstance(c, type) and "components.vae.decode(" in inspect.getsource(c)]  # fmt: skip
        assert steps and not conv.packed
        for step in steps:
            before = step.split("components.vae.decode(")[0]
            assert any(word in before for word in undo) == (conv.latents == "normalized"), step
        return
    source = inspect.getsource(pipeline.__call__)
    if 'if output_type == "latent":' in source:
        latent_branch, decode_branch = branches(source, 'output_type == "latent"')
    elif 'if output_type != "latent":' in source:
        decode_branch, latent_branch = branches(source, 'output_type != "latent"')
    else:
        decode_branch, latent_branch = branches(source, 'not output_type == "latent"')
    if "self.decode_latents(" in decode_branch:  # CogVideoX's: the undoing is in decode_latents
        decode_branch += inspect.getsource(pipeline.decode_latents)
    if conv.latents == "denormalized":
        assert "_denormalize_latents" in latent_branch
    else:
        assert not any(word in latent_branch for word in undo), latent_branch
        assert any(word in decode_branch for word in undo), decode_branch
    # packed: the tokens are unpacked only on the way to vae.decode; else before the branch, or never
    assert ("latents = self._unpack_latents(" in decode_branch) == conv.packed
    assert "_unpack_latents(" not in latent_branch


@pytest.mark.model  # imports diffusers' LTX pipeline
def test_unpacking_inverts_ltx_packing():
    from diffusers import LTXPipeline

    from farm.inputs.pipelines import unpack_tokens

    video = torch.randn(2, 8, 3, 4, 6)
    for p, pt in ((1, 1), (2, 1)):
        tokens = LTXPipeline._pack_latents(video, p, pt)
        np.testing.assert_array_equal(unpack_tokens(tokens.numpy(), (3, 4, 6), p, pt), video.numpy())
    tokens = LTXPipeline._pack_latents(video, 1, 1)
    theirs = LTXPipeline._unpack_latents(tokens, 3, 4, 6, 1, 1)
    np.testing.assert_array_equal(unpack_tokens(tokens.numpy(), (3, 4, 6)), theirs.numpy())


# ---- workflows/watch_latents.py ------------------------------------------------------------------


def test_watch_latents_ingests_and_renders_files_as_they_arrive(vae_folder, tmp_path, scheduler3):
    import subprocess
    import sys
    import threading
    import time

    root = Path(__file__).resolve().parents[1]
    folder, job, out = tmp_path / "comfy", tmp_path / "job.zarr", tmp_path / "out"
    folder.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(root / "workflows" / "watch_latents.py"), str(folder), "--job", str(job),
         "--out", str(out), "--decoder", "ltx2-tiny", "--weights", str(vae_folder), "--scheduler", scheduler3,
         "--interval", "0.2", "--settle", "0.5", "--stop-after", "2", "--tiles", "1,1,1", "--no-video"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()

    def wait_for(text: str, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in lines):
            assert proc.poll() is None and time.time() < deadline, f"no {text!r} in:\n{''.join(lines)}"
            time.sleep(0.1)

    try:
        latents = {"first": smooth(1, batch=1), "second": smooth(2, batch=1)}
        comfyui_latent(folder / "first.latent", latents["first"])
        wait_for("rendered first: 1/1 batches")
        comfyui_latent(tmp_path / "second.latent", latents["second"])
        data = (tmp_path / "second.latent").read_bytes()
        (folder / "second.latent").write_bytes(data[: len(data) // 2])  # written slowly, as ComfyUI does
        wait_for("second.latent: not ingested (tried again when it changes)")
        (folder / "second.latent").write_bytes(data)
        assert proc.wait(timeout=180) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "watch_latents: 2 file(s) ingested and rendered, 1 refusal(s)" in "".join(lines)
    assert sorted(open_job(job).shots) == ["first", "second"]
    for shot, latent in latents.items():
        got = read_frames(Output(out), shot).astype(np.float64)
        want = diffusers_frames(vae_folder, latent[0], normalized=True)
        assert np.abs(got - want).max() <= 1.0, shot


def test_watch_settles_files_before_taking_them():
    from workflows.watch_latents import settled

    a, b = Path("a.latent"), Path("b.latent")
    first_seen = {a: ((10, 1), 0.0), b: ((10, 1), 0.0)}
    assert settled({a: (10, 1), b: (20, 2)}, first_seen, now=3.0, settle=2.0) == [a]  # b changed
    assert settled({a: (10, 1)}, first_seen, now=1.0, settle=2.0) == []  # not long enough


def test_shots_appear_whole_to_a_reader_while_the_helper_appends(vae_folder, tmp_path):
    import threading

    import zarr

    from farm.inputs.ingest import add_pipeline_shot

    job = tmp_path / "job.zarr"
    expected = {f"s{k:03d}": smooth(k).numpy() for k in range(12)}
    np.save(tmp_path / "s000.npy", expected["s000"])
    ingest(job, [tmp_path / "s000.npy"], decoder="ltx2-tiny", weights=vae_folder, latents="denormalized")
    stop = threading.Event()
    reads: list[int] = []
    errors: list[str] = []

    def reader() -> None:  # what a render's workers do: list the shots, read each latent
        while not stop.is_set():
            try:
                for name in open_job(job).shots:
                    got = np.asarray(zarr.open_array(store=str(job / name / "latent"), mode="r")[...])
                    np.testing.assert_array_equal(got, expected[name])
                    reads.append(1)
            except Exception as exc:  # any partial shot seen
                errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for name, latent in list(expected.items())[1:]:  # LTX-2 pipelines hand back [B, C, F, H, W]
            add_pipeline_shot(job, latent[None], pipeline="LTX2Pipeline", name=name, fps=24, num_frames=9)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:3]
    assert len(reads) > len(expected) and sorted(open_job(job).shots) == sorted(expected)
    assert not [p for p in tmp_path.iterdir() if ".ingest-" in p.name]


class _HandedToDecode(Exception):
    """Raised by the stand-in VAE's decode with what the pipeline handed it."""

    def __init__(self, z: torch.Tensor) -> None:
        self.z = z


# Pipelines that reuse a VAE farm has, with the attributes their __init__ sets from the VAE (and the
# line of __init__ that does, checked), for running their decode branch on a stand-in.
REUSED_VAE = {
    "Cosmos2VideoToWorldPipeline": ("wan", "self.sigma_data = 1.0"),
    "Cosmos2_5_PredictBasePipeline": ("wan", "self.latents_std = 1.0 / latents_std"),
    "Cosmos3OmniPipeline": ("wan2.2", "self._vae_latents_inv_std = 1.0 / torch.tensor(vae.config"),
    "SkyReelsV2Pipeline": ("wan", None),
    "SkyReelsV2ImageToVideoPipeline": ("wan", None),
    "SkyReelsV2DiffusionForcingPipeline": ("wan", None),
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": ("wan", None),
    "Kandinsky5T2VPipeline": ("hunyuanvideo", None),
    "Kandinsky5I2VPipeline": ("hunyuanvideo", None),
    "HunyuanVideo15Pipeline": ("hunyuanvideo15", None),
    "HunyuanVideo15ImageToVideoPipeline": ("hunyuanvideo15", None),
    "CosmosTextToWorldPipeline": ("cosmos", None),
    "CosmosVideoToWorldPipeline": ("cosmos", None),
}
SIGMA_DATA = 0.7  # a scheduler's sigma_data (not the release's 0.5): Cosmos 1.0 divides by it


@pytest.mark.model  # imports diffusers' pipelines
@pytest.mark.parametrize("name", sorted(REUSED_VAE))
def test_a_pipelines_latents_become_what_it_hands_vae_decode(name):
    """Each pipeline's own decode branch (its source, run on a stand-in VAE that records its input)
    against farm's: `pipeline_latents` (axes moved), then the family's ``denormalize`` (with the spec
    fields the pipeline says for itself)."""
    import inspect
    import textwrap
    from types import SimpleNamespace

    import diffusers

    from farm.decoders import FAMILIES as FAMS
    from farm.inputs.pipelines import pipeline_latents

    config_name, init_line = REUSED_VAE[name]
    family = PIPELINES[name].family
    cls = FAMS[family]
    pipe_cls = getattr(diffusers, name)
    if init_line is not None:
        assert init_line in inspect.getsource(pipe_cls.__init__)
    source = inspect.getsource(pipe_cls.__call__)
    for head in ('if output_type != "latent":', 'if not output_type == "latent":'):
        if head in source:
            decode_branch = branches(source, head.removeprefix("if ").removesuffix(":"))[0]
            break
    else:
        decode_branch = branches(source, 'output_type == "latent"')[1]

    full = cls._full_config(cls.named_configs[config_name])
    rng = np.random.default_rng(7)
    channels = cls.latent_channels_for(cls.named_configs[config_name])
    vae_config = SimpleNamespace(**full)
    if full.get("latents_mean") is not None:  # non-trivial statistics, so a wrong un-normalisation shows
        per_channel = len(full["latents_mean"]) // channels  # Cosmos 1.0: per channel and latent frame
        vae_config.latents_mean = list(rng.normal(0, 0.3, channels * per_channel))
        vae_config.latents_std = list(rng.uniform(0.5, 2.0, channels * per_channel))

    def decode(z, return_dict=True):
        raise _HandedToDecode(z)

    vae = SimpleNamespace(config=vae_config, dtype=torch.float32, decode=decode)
    geometry = cls.geometry_for(cls.named_configs[config_name])
    f, h, w = 3, 2, 4
    frames, height, width = geometry.pixel_frames(f), h * geometry.spatial_scale, w * geometry.spatial_scale
    axes = PIPELINES[name].axes
    sizes = dict(zip("BCFHW", (1, channels, f, h, w), strict=True))
    output = torch.from_numpy(rng.standard_normal([sizes[a] for a in axes]).astype(np.float32))
    mean = torch.tensor(getattr(vae_config, "latents_mean", None) or [0.0] * channels).view(1, -1, 1, 1, 1)
    std = torch.tensor(getattr(vae_config, "latents_std", None) or [1.0] * channels).view(1, -1, 1, 1, 1)
    sigma_data = 1.0 if name.startswith("Cosmos2") else SIGMA_DATA  # Cosmos2's __init__ registers 1
    scheduler = SimpleNamespace(config=SimpleNamespace(sigma_data=sigma_data))
    this = SimpleNamespace(
        vae=vae, scheduler=scheduler, latents_mean=mean,
        latents_std=1.0 / std, _vae_latents_mean=mean.flatten(), _vae_latents_inv_std=1.0 / std.flatten(),
        vae_scale_factor_temporal=geometry.temporal_scale, vae_scale_factor_spatial=geometry.spatial_scale,
    )  # fmt: skip
    scope = {"self": this, "torch": torch, "latents": output.clone(), "output_type": "np", "batch_size": 1,
             "num_videos_per_prompt": 1, "num_frames": frames, "height": height, "width": width,
             "num_channels_latents": channels, "device": "cpu", "last_image": None,
             "video_original": None, "vae_dtype": torch.float32}  # fmt: skip
    with pytest.raises(_HandedToDecode) as handed:
        exec(textwrap.dedent(decode_branch), scope)  # diffusers' own lines, up to vae.decode

    data, conv = pipeline_latents(name, output, geometry, num_frames=frames, height=height, width=width)
    assert conv.latents == "normalized" and data.shape == (1, channels, f, h, w)
    decoder = object.__new__(cls)
    decoder.model = SimpleNamespace(config=vae_config)
    decoder.spec = SimpleNamespace(extra=cls.spec_fields_from_pipeline(SimpleNamespace(scheduler=scheduler)))
    ours = decoder.denormalize(torch.from_numpy(data))
    torch.testing.assert_close(ours, handed.value.z, rtol=1e-6, atol=1e-6)
