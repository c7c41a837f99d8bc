"""LTX-2.3 picture and sound against Lightricks' own decoder (`ltx-core`, tests/references.txt).

The test writes an LTX-2.3 single file in Lightricks' layout at tiny widths, seeded weights: the video
VAE's decoder under ``vae.``, the audio VAE's under ``audio_vae.``, the vocoder with bandwidth extension
under ``vocoder.`` (``vocoder.vocoder.*``, ``vocoder.bwe_generator.*``, ``vocoder.mel_stft.*``), and the
``config`` JSON in the safetensors metadata, in the form ltx-core's configurators read (``vae``,
``audio_vae``, ``vocoder`` → ``vocoder`` + ``bwe``). The reference is ltx-core's decoder, vocoder and audio
decoder built from that metadata and loaded from that file (strict: every name must be theirs); farm
reads the same file with its named configs ``ltx2.3-tiny`` and ``ltx2.3-audio-tiny`` through
``farm ingest`` and ``farm render`` (a real job store, a real local cluster, float32 on the CPU).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from farm.cli import main as farm_main
from farm.decoders.ltx2.audio import (
    LTX2_3_AUDIO_TINY,
    check_audio_weights,
    parse_audio_spec,
    samples_for_frames,
)
from farm.decoders.sound import load_sound_decoder
from farm.errors import FarmError
from farm.media.audio import fit_length, read_audio, to_levels
from farm.store.frames import read_frames
from farm.store.output import Output

pytest.importorskip("einops", reason="ltx-core's VAE modules import einops (tests/references.txt)")
pytest.importorskip("ltx_core", reason="the reference decoder: pip install --no-deps -r tests/references.txt")


def _import_ltx_core_audio() -> types.ModuleType:
    """ltx-core's audio package. It imports torchaudio at the top for its encoder's mel transform, which a
    decode never calls; the index's torchaudio wheels need CUDA libraries, so where it does not import,
    the package gets a stand-in whose every attribute is missing for that one import: an encoder use
    would fail, the decode path does not touch it."""
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        absent = types.ModuleType("torchaudio")

        def missing(name: str) -> None:
            raise AttributeError(f"torchaudio.{name}: torchaudio does not import here")

        absent.__getattr__ = missing  # type: ignore[method-assign]
        sys.modules["torchaudio"] = absent
        try:
            import ltx_core.model.audio_vae
        finally:
            del sys.modules["torchaudio"]  # others (diffusers) must see torchaudio as not installed
    import ltx_core.model.audio_vae

    return ltx_core.model.audio_vae


# LTX-2.3's `config` metadata at tiny widths, in ltx-core's form; the structure is LTX-2.3's (diffusers'
# conversion script's config for 2.3 read back into Lightricks' decoder_blocks, vocoder and bwe keys).
_RES = [["res_x", {"num_layers": 1}]]
TINY_LTX23_CONFIG = {
    "vae": {
        "dims": 3, "latent_channels": 8, "out_channels": 3, "patch_size": 4, "norm_layer": "pixel_norm",
        "causal_decoder": False, "timestep_conditioning": False, "decoder_base_channels": 4,
        "spatial_padding_mode": "zeros",
        "decoder_blocks": [*_RES, ["compress_space", {"multiplier": 2}], *_RES,
                           ["compress_time", {"multiplier": 2}], *_RES, ["compress_all", {"multiplier": 1}],
                           *_RES, ["compress_all", {"multiplier": 2}], *_RES],
    },
    "audio_vae": {
        "model": {"params": {"sampling_rate": 16000, "ddconfig": {
            "ch": 32, "out_ch": 2, "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [],
            "resolution": 256, "z_channels": 2, "norm_type": "pixel", "causality_axis": "height",
            "dropout": 0.0, "mid_block_add_attention": False, "mel_bins": 64}}},
        "preprocessing": {"stft": {"hop_length": 160, "causal": True}, "mel": {"n_mel_channels": 64}},
    },
    "vocoder": {
        "vocoder": {"upsample_initial_channel": 32, "resblock": "AMP1", "upsample_rates": [8, 5, 4],
                    "upsample_kernel_sizes": [16, 11, 8], "resblock_kernel_sizes": [3],
                    "resblock_dilation_sizes": [[1, 3, 5]], "stereo": True, "use_tanh_at_final": False,
                    "activation": "snakebeta", "use_bias_at_final": False},
        "bwe": {"upsample_initial_channel": 32, "resblock": "AMP1", "upsample_rates": [6, 5, 8],
                "upsample_kernel_sizes": [12, 11, 16], "resblock_kernel_sizes": [3],
                "resblock_dilation_sizes": [[1, 3, 5]], "stereo": True, "use_tanh_at_final": False,
                "activation": "snakebeta", "use_bias_at_final": False, "apply_final_activation": False,
                "input_sampling_rate": 16000, "output_sampling_rate": 48000, "hop_length": 80,
                "n_fft": 512, "win_size": 512, "num_mels": 64},
    },
}  # fmt: skip
# The released LTX-2.3 in the same form: what the tiny one shrinks (widths, layers per stage).
_AMP = {"resblock": "AMP1", "stereo": True, "activation": "snakebeta", "use_tanh_at_final": False,
        "use_bias_at_final": False, "resblock_kernel_sizes": [3, 7, 11],
        "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]]}  # fmt: skip
LTX23_CONFIG = {
    "vae": {**TINY_LTX23_CONFIG["vae"], "latent_channels": 128, "decoder_base_channels": 128,
            "decoder_blocks": [["res_x", {"num_layers": 4}], ["compress_space", {"multiplier": 2}],
                               ["res_x", {"num_layers": 6}], ["compress_time", {"multiplier": 2}],
                               ["res_x", {"num_layers": 4}], ["compress_all", {"multiplier": 1}],
                               ["res_x", {"num_layers": 2}], ["compress_all", {"multiplier": 2}],
                               ["res_x", {"num_layers": 2}]]},
    "audio_vae": {**TINY_LTX23_CONFIG["audio_vae"], "model": {"params": {"sampling_rate": 16000, "ddconfig": {
        **TINY_LTX23_CONFIG["audio_vae"]["model"]["params"]["ddconfig"], "ch": 128, "ch_mult": [1, 2, 4],
        "num_res_blocks": 2, "z_channels": 8}}}},
    "vocoder": {
        "vocoder": {**_AMP, "upsample_initial_channel": 1536, "upsample_rates": [5, 2, 2, 2, 2, 2],
                    "upsample_kernel_sizes": [11, 4, 4, 4, 4, 4]},
        "bwe": {**TINY_LTX23_CONFIG["vocoder"]["bwe"], **_AMP, "upsample_initial_channel": 512,
                "upsample_rates": [6, 5, 2, 2, 2], "upsample_kernel_sizes": [12, 11, 4, 4, 4]},
    },
}  # fmt: skip
FPS = 24.0
VIDEO_LATENT = (8, 3, 2, 3)  # 17 frames of 64 x 96
AUDIO_LATENT_FRAMES = 19  # 0.73 s of sound at 25 latent frames per second: more than the 17 frames last
RATE = 48000
LOUDNESS = 5.0  # the first stage's output weights, scaled: part of its waveform then lies beyond [-1, 1]


def ltx_core_models(config: dict) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """ltx-core's video decoder, audio decoder and vocoder for an LTX single file's `config` metadata."""
    from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator

    audio = _import_ltx_core_audio()
    return (VideoDecoderConfigurator.from_config(config).eval(),
            audio.AudioDecoderConfigurator.from_config(config).eval(),
            audio.VocoderConfigurator.from_config(config).eval())  # fmt: skip


def seeded_weights(video: torch.nn.Module, audio: torch.nn.Module, vocoder: torch.nn.Module) -> None:
    """Weights no decoder would get right by accident: the latent statistics, the snake activations and the
    bandwidth extension's STFT and mel bases (where the models have them) all random, and the first stage
    loud enough that part of its waveform lies beyond [-1, 1] (where ltx-core clamps it, or LTX-2's tanh
    bends it)."""
    with torch.no_grad():
        for model in (video, audio):
            for name, buffer in model.named_buffers():
                if name.endswith("std-of-means"):
                    buffer.copy_(torch.rand_like(buffer) + 0.5)
                elif name.endswith("mean-of-means"):
                    buffer.copy_(torch.randn_like(buffer) * 0.1)
        for name, buffer in vocoder.named_buffers():
            if name.startswith("mel_stft."):
                buffer.copy_(torch.rand_like(buffer) * 0.05)
        for name, param in vocoder.named_parameters():
            if name.endswith((".alpha", ".beta")):
                param.copy_(torch.randn_like(param) * 0.3)
        # the first stage: LTX-2.3's `vocoder.vocoder`, LTX-2's vocoder itself
        getattr(vocoder, "vocoder", vocoder).conv_post.weight.mul_(LOUDNESS)


def original_layout(video: torch.nn.Module, audio: torch.nn.Module, vocoder: torch.nn.Module) -> dict:
    """The three models' tensors under the names of an LTX single file (the inverse of ltx-core's key
    filters: ``vae.decoder.`` / ``vae.per_channel_statistics.``, the same under ``audio_vae.``, and
    ``vocoder.``)."""
    out = {}
    for prefix, model in (("vae.", video), ("audio_vae.", audio)):
        for name, value in model.state_dict().items():
            part = "" if name.startswith("per_channel_statistics.") else "decoder."
            out[prefix + part + name] = value.contiguous()
    out.update({"vocoder." + name: value.contiguous() for name, value in vocoder.state_dict().items()})
    return out


def load_reference(path: Path) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """ltx-core's models built from the file's `config` metadata, loaded strictly from its tensors."""
    with safe_open(str(path), framework="pt") as fh:
        config = json.loads(fh.metadata()["config"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    video, audio, vocoder = ltx_core_models(config)
    for prefix, model in (("vae.", video), ("audio_vae.", audio), ("vocoder.", vocoder)):
        mine = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        mine = {k.removeprefix("decoder."): v for k, v in mine.items()}
        model.load_state_dict(mine, strict=True)
    return video, audio, vocoder


@pytest.fixture(scope="module")
def ltx23_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ltx23") / "ltx-2.3-tiny.safetensors"
    torch.manual_seed(23)  # the modules' own initialisation, then seeded_weights'
    models = ltx_core_models(TINY_LTX23_CONFIG)
    seeded_weights(*models)
    save_file(original_layout(*models), str(path), metadata={"config": json.dumps(TINY_LTX23_CONFIG)})
    return path


def reference_pixels(video: torch.nn.Module, z: torch.Tensor) -> np.ndarray:
    """ltx-core's untiled decode of normalized latents ``[C, F, H, W]`` → uint8 ``[F, H, W, 3]``, converted
    as farm converts ([-1, 1] → [0, 1], clamped, rounded to 8 bits)."""
    with torch.inference_mode():
        x = video(z[None])[0].float()
    unit = ((x + 1.0) / 2.0).clamp(0.0, 1.0)
    return torch.round(unit * 255.0).to(torch.uint8).permute(1, 2, 3, 0).numpy()


def reference_sound(audio: torch.nn.Module, vocoder: torch.nn.Module, z: torch.Tensor) -> tuple:
    """ltx-core's decode of normalized audio latents ``[C, T, M]`` (`decode_audio`: audio decoder, then the
    vocoder with bandwidth extension) and the denormalized latents an LTX-2 pipeline hands on (ltx-core's
    own denormalisation: its patchifier and per-channel statistics)."""
    from ltx_core.model.audio_vae.audio_vae import decode_audio
    from ltx_core.types import AudioLatentShape

    shape = AudioLatentShape(batch=1, channels=z.shape[0], frames=z.shape[1], mel_bins=z.shape[2])
    with torch.inference_mode():
        wave = decode_audio(z[None], audio, vocoder)
        patched = audio.per_channel_statistics.un_normalize(audio.patchifier.patchify(z[None]))
        denormalized = audio.patchifier.unpatchify(patched, shape)[0]
    return wave.waveform.numpy(), int(wave.sampling_rate), denormalized.contiguous()


def test_ltx23_picture_and_sound_equal_ltx_core(tmp_path, ltx23_file, scheduler3):
    """`farm ingest` + `farm render` of an original-layout LTX-2.3 file: the picture equals ltx-core's
    untiled decode to the last 8-bit level, the 48 kHz sound its waveform (as int16, within a level);
    the video carries the sound; a lost sound file is decoded again on the next render."""
    video, audio, vocoder = load_reference(ltx23_file)
    z = torch.randn(VIDEO_LATENT, generator=torch.Generator().manual_seed(5))
    z_audio = torch.randn(2, AUDIO_LATENT_FRAMES, 16, generator=torch.Generator().manual_seed(6))
    want_pixels = reference_pixels(video, z)
    wave, rate, denormalized = reference_sound(audio, vocoder, z_audio)
    assert rate == RATE and wave.shape == (2, (4 * AUDIO_LATENT_FRAMES - 3) * 480)
    assert 0.0 < np.mean(np.abs(wave) >= 1.0) < 0.5  # the clamps act, yet most of the sound is not at them
    assert len({int(v) for v in want_pixels.reshape(-1)}) > 200  # a picture, not a flat or saturated one

    # farm's float waveform, in this process, against the reference's
    spec = {"config": "ltx2.3-audio-tiny", "weights": {"path": str(ltx23_file)}}
    got_wave = load_sound_decoder(spec).decode(denormalized.numpy())
    np.testing.assert_allclose(got_wave, wave, rtol=0, atol=1e-5)
    # diffusers' conversion script leaves the first stage unbounded: here that is audibly another sound
    script = {"audio_vae": LTX2_3_AUDIO_TINY["audio_vae"],
              "vocoder": {**LTX2_3_AUDIO_TINY["vocoder"], "final_act_fn": None}}  # fmt: skip
    unbounded = load_sound_decoder({"config": script, "weights": spec["weights"]})
    assert np.abs(unbounded.decode(denormalized.numpy()) - wave).max() > 0.05

    latents = tmp_path / "sh010.safetensors"
    save_file({"video": z.contiguous(), "audio": denormalized}, str(latents))
    job, out = tmp_path / "job.zarr", tmp_path / "out"
    assert farm_main(["ingest", str(job), str(latents), "--tensor", "video", "--decoder", "ltx2.3-tiny",
                      "--weights", str(ltx23_file), "--latents", "normalized", "--fps", "24",
                      "--audio-tensor", "audio", "--audio-decoder", "ltx2.3-audio-tiny",
                      "--audio-weights", str(ltx23_file)]) == 0  # fmt: skip
    render = ["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1"]
    assert farm_main(render) == 0

    o = Output(out)
    got = read_frames(o, "sh010")
    assert got.shape == want_pixels.shape and np.array_equal(got, want_pixels)
    frames = VIDEO_LATENT[1] * 8 - 7
    samples = samples_for_frames(frames, FPS, RATE)
    assert samples < wave.shape[1]  # the sound is cut to the picture, not padded
    sound = read_audio(o.audio_file("sh010"))
    want_levels = to_levels(fit_length(wave, samples))
    assert sound.sample_rate == RATE and sound.levels.shape == want_levels.shape
    assert np.abs(sound.levels.astype(np.int32) - want_levels).max() <= 1
    with av.open(str(o.video("sh010"))) as c:
        assert [s.rate for s in c.streams.audio] == [RATE]

    # resumed: a lost sound file is decoded again, the same
    o.audio_file("sh010").unlink()
    assert farm_main(render) == 0
    assert np.array_equal(read_audio(o.audio_file("sh010")).levels, sound.levels)


def test_ltx23_sound_specs_time_48khz_and_refuse_the_other_vocoder(tmp_path, ltx23_file):
    """LTX-2.3's sound is timed at 48 kHz (16 kHz from the vocoder, tripled by the extension); a file's
    vocoder with bandwidth extension is refused for LTX-2's audio config and LTX-2's for LTX-2.3's."""
    spec = parse_audio_spec({"config": "ltx2.3-audio", "weights": {"random_seed": 0}})
    assert spec.bandwidth_extension and spec.sample_rate == 48000 and spec.latents_per_second == 25.0
    assert spec.latent_channels == 8 and spec.latent_mel_bins == 16
    assert spec.decoded_samples(126) == (4 * 126 - 3) * 480
    assert not parse_audio_spec({"config": "ltx2-audio", "weights": {"random_seed": 0}}).bandwidth_extension

    def check(config: str, path: Path) -> None:
        check_audio_weights(parse_audio_spec({"config": config, "weights": {"path": str(path)}}))

    check("ltx2.3-audio-tiny", ltx23_file)
    with pytest.raises(FarmError, match=r"holds LTX-2\.3.s vocoder .*config.*\(ltx2\.3-audio\)"):
        check("ltx2-audio-tiny", ltx23_file)
    ltx2 = tmp_path / "ltx-2.safetensors"
    save_file({"audio_vae.decoder.conv_in.conv.weight": torch.zeros(1),
               "vocoder.conv_pre.weight": torch.zeros(1)}, str(ltx2))  # fmt: skip
    with pytest.raises(FarmError, match=r"holds LTX-2's vocoder .*\(ltx2-audio\)"):
        check("ltx2.3-audio-tiny", ltx2)

    # the file's config metadata says how its vocoder ends: not unbounded, as diffusers' script has it
    script = {"audio_vae": LTX2_3_AUDIO_TINY["audio_vae"],
              "vocoder": {**LTX2_3_AUDIO_TINY["vocoder"], "final_act_fn": None}}  # fmt: skip
    with pytest.raises(FarmError, match=r"config\.vocoder\.vocoder\.use_tanh_at_final in the file means "
                                        r"final_act_fn='clamp', the audio config has None"):  # fmt: skip
        check_audio_weights(parse_audio_spec({"config": script, "weights": {"path": str(ltx23_file)}}))


def test_recorded_vocoder_defaults_are_the_installed_classes():
    """The vocoder metadata check completes a spec with diffusers' defaults recorded in farm: they must be
    the installed classes' own."""
    import inspect

    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    from farm.decoders.ltx2.vocoder_config import LTX2_VOCODER_DEFAULTS, LTX2_VOCODER_WITH_BWE_DEFAULTS

    for cls, recorded in ((LTX2Vocoder, LTX2_VOCODER_DEFAULTS),
                          (LTX2VocoderWithBWE, LTX2_VOCODER_WITH_BWE_DEFAULTS)):  # fmt: skip
        live = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}  # fmt: skip
        assert live == recorded, cls.__name__


def test_an_ltx2_pipeline_with_the_extended_vocoder_gives_its_sound_spec(tmp_path):
    """`add_pipeline_shot`'s audio spec from an LTX-2 pipeline holding LTX-2.3's vocoder (saved and loaded
    as a pipeline folder): the vocoder with bandwidth extension, decoding as the pipeline's own parts."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    from farm.inputs.pipelines import audio_spec_from_pipeline

    sys.path.insert(0, str(Path(__file__).parent))
    from test_ingest import tiny_pipeline

    pipe, _ = tiny_pipeline("ltx2", tmp_path / "pipe" / "vae")
    torch.manual_seed(8)
    AutoencoderKLLTX2Audio(**LTX2_3_AUDIO_TINY["audio_vae"]).save_pretrained(tmp_path / "pipe" / "audio_vae")
    LTX2VocoderWithBWE(**LTX2_3_AUDIO_TINY["vocoder"]).save_pretrained(tmp_path / "pipe" / "vocoder")
    vae = AutoencoderKLLTX2Audio.from_pretrained(tmp_path / "pipe" / "audio_vae").eval()
    vocoder = LTX2VocoderWithBWE.from_pretrained(tmp_path / "pipe" / "vocoder").eval()
    pipe.register_modules(audio_vae=vae, vocoder=vocoder)

    spec = parse_audio_spec(audio_spec_from_pipeline(pipe))
    assert spec.bandwidth_extension and spec.sample_rate == RATE
    assert spec.weights == {"path": str(tmp_path / "pipe")}
    latent = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        own = vocoder(vae.decode(latent[None], return_dict=False)[0])[0].numpy()
    assert own.shape == (2, spec.decoded_samples(7))
    assert np.array_equal(load_sound_decoder(spec).decode(latent.numpy()), own)


def test_the_released_configs_name_and_shape_every_tensor_of_ltx_core_s_released_structure():
    """`ltx2.3` and `ltx2.3-audio` against ltx-core's models of the released structure (built on the meta
    device from LTX-2.3's config in its own form: no weights): the file names those models' tensors have
    map onto the diffusers models of farm's configs one to one, with the same shapes (the video decoder's
    through farm's weight check, as a file's would be)."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    from farm.decoders import checkpoints as C
    from farm.decoders import weights as W
    from farm.decoders.ltx2 import LTX2_3, LTX2Decoder
    from farm.decoders.ltx2.audio import LTX2_3_AUDIO, bwe_vocoder_name
    from farm.decoders.recording import recorded_decoder_tensors

    with torch.device("meta"):
        models = ltx_core_models(LTX23_CONFIG)
        vae = AutoencoderKLLTX2Audio(**LTX2_3_AUDIO["audio_vae"])
        vocoder = LTX2VocoderWithBWE(**LTX2_3_AUDIO["vocoder"])
    shapes = {name: tuple(t.shape) for name, t in original_layout(*models).items()}
    infos = {name: C.TensorInfo(shape, "BF16", Path("ltx-2.3.safetensors")) for name, shape in shapes.items()}

    layout = C.detect_layout(infos, LTX2Decoder, "x")
    assert layout == C.Layout("ltx-original", "vae.")
    expected = recorded_decoder_tensors(LTX2Decoder, "ltx2.3")
    found = W.converted_names(layout, LTX2Decoder, infos)
    full = LTX2Decoder._full_config(LTX2_3)
    names = {
        k: found.get(k) or layout.prefix + LTX2Decoder.original_name(k, layout.name, full) for k in expected
    }
    assert W.weight_mismatches(expected, infos, names, layout.prefix) == []
    assert len(expected) == sum(n.startswith("vae.") for n in shapes) == 86  # decoder and statistics

    audio = {k.removeprefix("audio_vae.").replace("per_channel_statistics.mean-of-means", "latents_mean")
             .replace("per_channel_statistics.std-of-means", "latents_std"): s
             for k, s in shapes.items() if k.startswith("audio_vae.")}  # fmt: skip
    assert audio == {k: tuple(t.shape) for k, t in vae.state_dict().items() if not k.startswith("encoder.")}
    sound = {
        bwe_vocoder_name(k.removeprefix("vocoder.")): s for k, s in shapes.items() if k.startswith("vocoder.")
    }
    assert sound == {k: tuple(t.shape) for k, t in vocoder.state_dict().items()}
    assert len(sound) == 1227
