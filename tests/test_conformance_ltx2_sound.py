"""LTX-2 (2.0) sound against Lightricks' own decoder (`ltx-core`, tests/references.txt).

The harness is LTX-2.3's (tests/test_conformance_ltx23.py): an LTX single file in Lightricks' layout with
seeded weights of ltx-core's own models and the ``config`` JSON in its metadata, read back by ltx-core's
configurators (strict loads) and by `farm ingest` + `farm render`. Here the file is LTX-2's: the video decoder
of ``ltx2-tiny`` under ``vae.``, the audio VAE under ``audio_vae.`` and LTX-2's flat HiFi-GAN vocoder under
``vocoder.`` (no bandwidth extension, 24 kHz, tanh at the end), at the widths of ``ltx2-audio-tiny``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from test_conformance_ltx23 import (  # noqa: E402
    _import_ltx_core_audio,
    load_reference,
    ltx_core_models,
    original_layout,
    reference_pixels,
    reference_sound,
    seeded_weights,
)

from farm.cli import main as farm_main  # noqa: E402
from farm.decoders.ltx2.audio import (  # noqa: E402
    LTX2_AUDIO,
    LTX2_AUDIO_TINY,
    check_audio_weights,
    parse_audio_spec,
    samples_for_frames,
)
from farm.decoders.sound import load_sound_decoder, superseded_sound  # noqa: E402
from farm.errors import FarmError  # noqa: E402
from farm.media.audio import fit_length, read_audio, to_levels  # noqa: E402
from farm.store.frames import read_frames  # noqa: E402
from farm.store.output import Output  # noqa: E402
from tests.helpers import LTX2_TINY_FILE_CONFIG  # noqa: E402

# LTX-2's audio VAE and vocoder in the form of the released file's `config` metadata (the audio VAE's keys
# as LTX-2's single files carry them, the HiFi-GAN vocoder's flat keys); diffusers' conversion script reads
# the same model ("2.0": the audio VAE of 2.3, "Same config as LTX-2.0").
LTX2_SOUND_CONFIG = {
    "audio_vae": {
        "model": {"params": {"sampling_rate": 16000, "ddconfig": {
            "double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256, "downsample_time": False,
            "in_channels": 2, "out_ch": 2, "ch": 128, "ch_mult": [1, 2, 4], "num_res_blocks": 2,
            "attn_resolutions": [], "dropout": 0.0, "mid_block_add_attention": False, "norm_type": "pixel",
            "causality_axis": "height"}}},
        "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160, "win_length": 1024,
                                   "causal": True},
                          "mel": {"n_mel_channels": 64, "mel_fmin": 0, "mel_fmax": 8000}},
    },
    "vocoder": {"resblock_kernel_sizes": [3, 7, 11], "upsample_rates": [6, 5, 2, 2, 2],
                "upsample_kernel_sizes": [16, 15, 8, 4, 4],
                "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                "upsample_initial_channel": 1024, "stereo": True, "resblock": "1",
                "output_sampling_rate": 24000},
}  # fmt: skip
# The same structure at the widths of `ltx2-audio-tiny`, and `ltx2-tiny`'s video decoder beside it.
_DDCONFIG = LTX2_SOUND_CONFIG["audio_vae"]["model"]["params"]["ddconfig"]
TINY_LTX2_CONFIG = {
    "vae": LTX2_TINY_FILE_CONFIG,
    "audio_vae": {**LTX2_SOUND_CONFIG["audio_vae"], "model": {"params": {"sampling_rate": 16000, "ddconfig": {
        **_DDCONFIG, "ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "z_channels": 2}}}},
    "vocoder": {**LTX2_SOUND_CONFIG["vocoder"], "upsample_initial_channel": 32, "upsample_rates": [6, 5, 8],
                "upsample_kernel_sizes": [16, 15, 16], "resblock_kernel_sizes": [3],
                "resblock_dilation_sizes": [[1, 3, 5]]},
}  # fmt: skip
VIDEO_LATENT = (8, 3, 2, 3)  # 17 frames of 64 x 96
AUDIO_LATENT_FRAMES = 19  # 0.73 s of sound: more than the 17 frames last at 24 fps
RATE = 24000


@pytest.fixture(scope="module")
def ltx2_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ltx2") / "ltx-2-tiny.safetensors"
    torch.manual_seed(20)
    models = ltx_core_models(TINY_LTX2_CONFIG)
    seeded_weights(*models)
    with torch.no_grad():  # louder still: the tanh at the end must bend a good part of the waveform
        models[2].conv_post.weight.mul_(4.0)
    save_file(original_layout(*models), str(path), metadata={"config": json.dumps(TINY_LTX2_CONFIG)})
    return path


def test_ltx2_sound_equals_ltx_core(tmp_path, ltx2_file, scheduler3):
    """`farm ingest` + `farm render` of an original-layout LTX-2 file with `ltx2-tiny` and `ltx2-audio-tiny`:
    the 24 kHz sound is ltx-core's waveform (as int16, within a level), the picture its frames."""
    video, audio, vocoder = load_reference(ltx2_file)
    assert not hasattr(vocoder, "bwe_generator")  # LTX-2's flat vocoder, as ltx-core reads the metadata
    z = torch.randn(VIDEO_LATENT, generator=torch.Generator().manual_seed(5))
    z_audio = torch.randn(2, AUDIO_LATENT_FRAMES, 16, generator=torch.Generator().manual_seed(6))
    wave, rate, denormalized = reference_sound(audio, vocoder, z_audio)
    assert rate == RATE and wave.shape == (2, (4 * AUDIO_LATENT_FRAMES - 3) * 240)
    assert 0.05 < np.mean(np.abs(wave) > 0.9) < 0.8, np.abs(wave).max()  # the tanh bends part of it

    spec = {"config": "ltx2-audio-tiny", "weights": {"path": str(ltx2_file)}}
    got_wave = load_sound_decoder(spec).decode(denormalized.numpy())
    np.testing.assert_allclose(got_wave, wave, rtol=0, atol=1e-5)
    # the test can tell: a clamp instead of LTX-2's tanh is another sound
    clamped = {"audio_vae": LTX2_AUDIO_TINY["audio_vae"],
               "vocoder": {**LTX2_AUDIO_TINY["vocoder"], "final_act_fn": "clamp"}}  # fmt: skip
    assert np.abs(load_sound_decoder({"config": clamped, "weights": spec["weights"]})
                  .decode(denormalized.numpy()) - wave).max() > 0.05  # fmt: skip

    latents = tmp_path / "sh010.safetensors"
    save_file({"video": z.contiguous(), "audio": denormalized}, str(latents))
    job, out = tmp_path / "job.zarr", tmp_path / "out"
    assert farm_main(["ingest", str(job), str(latents), "--tensor", "video", "--decoder", "ltx2-tiny",
                      "--weights", str(ltx2_file), "--latents", "normalized", "--fps", "24",
                      "--audio-tensor", "audio", "--audio-decoder", "ltx2-audio-tiny",
                      "--audio-weights", str(ltx2_file)]) == 0  # fmt: skip
    render = ["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1"]
    assert farm_main(render) == 0

    o = Output(out)
    assert np.array_equal(read_frames(o, "sh010"), reference_pixels(video, z))
    samples = samples_for_frames(VIDEO_LATENT[1] * 8 - 7, 24.0, RATE)
    sound = read_audio(o.audio_file("sh010"))
    want_levels = to_levels(fit_length(wave, samples))
    assert sound.sample_rate == RATE and sound.levels.shape == want_levels.shape
    assert np.abs(sound.levels.astype(np.int32) - want_levels).max() <= 1


def test_a_file_s_audio_vae_metadata_is_checked_against_the_audio_config(tmp_path, ltx2_file):
    """The file's `audio_vae` metadata, as ltx-core reads it, against the job's audio VAE config: a spec
    that builds another audio VAE is refused before any cluster starts, naming the field."""

    def check(config, path: Path = ltx2_file) -> None:
        check_audio_weights(parse_audio_spec({"config": config, "weights": {"path": str(path)}}))

    check("ltx2-audio-tiny")
    with pytest.raises(FarmError, match=r"config\.audio_vae\.model\.params\.ddconfig\.ch in the file means "
                                        r"base_channels=32, the audio config has 128"):  # fmt: skip
        check("ltx2-audio")
    attention = {"audio_vae": {**LTX2_AUDIO_TINY["audio_vae"], "mid_block_add_attention": True},
                 "vocoder": LTX2_AUDIO_TINY["vocoder"]}  # fmt: skip
    with pytest.raises(FarmError, match=r"ddconfig\.mid_block_add_attention in the file means "
                                        r"mid_block_add_attention=False"):  # fmt: skip
        check(attention)
    # a file that leaves the key out gets ltx-core's default: a mid-block attention
    bare = tmp_path / "bare.safetensors"
    config = json.loads(json.dumps(TINY_LTX2_CONFIG))
    del config["audio_vae"]["model"]["params"]["ddconfig"]["mid_block_add_attention"]
    tensors = {"audio_vae.decoder.conv_in.conv.weight": torch.zeros(1),
               "vocoder.conv_pre.weight": torch.zeros(1)}  # fmt: skip
    save_file(tensors, str(bare), metadata={"config": json.dumps(config)})
    with pytest.raises(FarmError, match=r"mid_block_add_attention=True, the audio config has False"):
        check("ltx2-audio-tiny", bare)
    check(attention, bare)


def test_ltx2_audio_is_the_released_sound():
    """`ltx2-audio` against the released LTX-2 sound: its metadata (as ltx-core reads it) contradicts none of
    its arguments, diffusers' conversion script's 2.0 configs are it, and ltx-core's models of that structure
    (meta device) name and shape every tensor as diffusers' models of farm's config do. It is diffusers'
    constructor defaults, which this name resolved to before: the same sound."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from farm.decoders.ltx2.audio_vae_config import LTX2_AUDIO_VAE_DEFAULTS, audio_vae_contradictions
    from farm.decoders.ltx2.vocoder_config import LTX2_VOCODER_DEFAULTS, vocoder_contradictions

    assert audio_vae_contradictions(LTX2_SOUND_CONFIG, LTX2_AUDIO["audio_vae"]) == []
    assert vocoder_contradictions(LTX2_SOUND_CONFIG, LTX2_AUDIO["vocoder"], bwe=False) == []
    assert audio_vae_contradictions(TINY_LTX2_CONFIG, LTX2_AUDIO_TINY["audio_vae"]) == []
    assert vocoder_contradictions(TINY_LTX2_CONFIG, LTX2_AUDIO_TINY["vocoder"], bwe=False) == []

    def same(a, b):
        return json.loads(json.dumps(a)) == json.loads(json.dumps(b))

    assert same(LTX2_AUDIO["audio_vae"], LTX2_AUDIO_VAE_DEFAULTS)
    assert same({**LTX2_VOCODER_DEFAULTS, **LTX2_AUDIO["vocoder"]}, LTX2_VOCODER_DEFAULTS)
    # diffusers' `get_ltx2_audio_vae_config("2.0")` / `get_ltx2_vocoder_config("2.0")` (0.42.1's script)
    script_vocoder = {"in_channels": 128, "hidden_channels": 1024, "out_channels": 2,
                      "upsample_kernel_sizes": [16, 15, 8, 4, 4], "upsample_factors": [6, 5, 2, 2, 2],
                      "resnet_kernel_sizes": [3, 7, 11], "resnet_dilations": [[1, 3, 5]] * 3,
                      "act_fn": "leaky_relu", "leaky_relu_negative_slope": 0.1, "antialias": False,
                      "final_act_fn": "tanh", "final_bias": True, "output_sampling_rate": 24000}  # fmt: skip
    assert same(LTX2_AUDIO["vocoder"], script_vocoder)

    audio_module = _import_ltx_core_audio()
    with torch.device("meta"):
        decoder = audio_module.AudioDecoderConfigurator.from_config(LTX2_SOUND_CONFIG)
        vocoder = audio_module.VocoderConfigurator.from_config(LTX2_SOUND_CONFIG)
        vae = AutoencoderKLLTX2Audio(**LTX2_AUDIO["audio_vae"])
        ours = LTX2Vocoder(**LTX2_AUDIO["vocoder"])
    renames = {"per_channel_statistics.mean-of-means": "latents_mean",
               "per_channel_statistics.std-of-means": "latents_std"}  # fmt: skip
    got = {("decoder." + k if not k.startswith("per_channel") else renames[k]): tuple(t.shape)
           for k, t in decoder.state_dict().items()}  # fmt: skip
    assert got == {k: tuple(t.shape) for k, t in vae.state_dict().items() if not k.startswith("encoder.")}
    names = {"ups": "upsamplers", "resblocks": "resnets", "conv_pre": "conv_in", "conv_post": "conv_out"}
    got = {names.get(k.split(".")[0], k.split(".")[0]) + k[len(k.split(".")[0]):]: tuple(t.shape)
           for k, t in vocoder.state_dict().items()}  # fmt: skip
    assert got == {k: tuple(t.shape) for k, t in ours.state_dict().items()}
    assert vocoder.output_sampling_rate == 24000 and not vocoder.is_amp


def test_recorded_audio_vae_defaults_are_the_installed_class():
    import inspect

    from diffusers import AutoencoderKLLTX2Audio

    from farm.decoders.ltx2.audio_vae_config import LTX2_AUDIO_VAE_DEFAULTS

    live = {k: p.default for k, p in inspect.signature(AutoencoderKLLTX2Audio.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}  # fmt: skip
    assert live == LTX2_AUDIO_VAE_DEFAULTS


def test_sound_decoded_with_the_old_tiny_config_is_superseded():
    """`ltx2-audio-tiny` changed (16 mel bins at 8 kHz before): its specs carry revision 2, a spec asking
    for revision 1 is refused, and a render identity without a revision names the superseded sound."""
    from farm.run.resume import identity_differences

    spec = parse_audio_spec({"config": "ltx2-audio-tiny", "weights": {"random_seed": 0}})
    assert spec.to_json()["config_revision"] == 2 and spec.sample_rate == RATE
    assert (spec.latent_channels, spec.latent_mel_bins) == (2, 16)
    assert parse_audio_spec(spec.to_json()) == spec
    assert "config_revision" not in parse_audio_spec({"config": "ltx2-audio", "weights": {"random_seed": 0}}
                                                     ).to_json()  # fmt: skip
    with pytest.raises(FarmError, match=r"revision 1 is superseded: now LTX-2's sound structure"):
        parse_audio_spec({**spec.to_json(), "config_revision": 1})

    old = {k: v for k, v in spec.to_json().items() if k != "config_revision"}
    video = {"family": "ltx2"}
    current = {"decoder": video, "outputs": {"video": "h264", "audio": {"decoder": spec.to_json()}}}
    recorded = {"decoder": video, "outputs": {"video": "h264", "audio": {"decoder": old}}}
    assert superseded_sound(current) is None
    why = superseded_sound(recorded)
    assert why is not None and "'ltx2-audio-tiny' revision 1, superseded by revision 2" in why
    assert identity_differences(recorded, current) == [f"OUT was decoded with {why}"]


def test_a_job_holding_latents_of_the_old_tiny_config_is_refused_before_rendering(tmp_path):
    """Audio latents shaped for revision 1 of `ltx2-audio-tiny` ([4, T, 4]) in a job: the render refuses
    the shot before any cluster starts, saying what the audio config takes."""
    import zarr

    from farm.inputs.ingest import ingest
    from farm.media.settings import VideoSettings
    from farm.run.resume import audio_identity
    from farm.store.job import AUDIO_DIMS, open_job

    shot = tmp_path / "a.safetensors"
    save_file({"video": torch.zeros(8, 2, 3, 4), "audio": torch.zeros(2, 9, 16)}, str(shot))
    job = tmp_path / "j.zarr"
    ingest(job, [shot], tensor="video", audio_tensor="audio", latents="denormalized",
           decoder={"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}},
           audio_decoder={"config": "ltx2-audio-tiny", "weights": {"random_seed": 0}})  # fmt: skip
    audio_identity(open_job(job), "a", VideoSettings())  # the current shape: accepted
    root = zarr.open_group(store=str(job), mode="r+", zarr_format=3)
    old = root["a"].create_array("audio", shape=(4, 9, 4), dtype="float32", overwrite=True,
                                 dimension_names=AUDIO_DIMS)  # fmt: skip
    old[:] = 1.0  # every chunk written: a missing one is refused first
    with pytest.raises(FarmError, match=r"shot 'a': audio latent has shape \[4, 9, 4\].*C = 2 and M = 16"):
        audio_identity(open_job(job), "a", VideoSettings())
