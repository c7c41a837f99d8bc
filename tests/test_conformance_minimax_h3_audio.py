"""MiniMax-H3's sound against its reference: diffusers 0.42.1's `AutoencoderKLMiniMaxH3Audio`, decoded by
the MiniMax-H3 pipeline's own audio decode step (``MiniMaxH3AudioDecodeStep``, run in a
`MiniMaxH3ModularPipeline`), in float32 on a CPU.

The step un-normalises the audio latents ``[2, C, T]`` (the two stereo channels as a batch) with the VAE
config's ``latents_mean`` / ``latents_std``, calls ``audio_vae.decode`` and makes the batch the channels.
The weights are ``minimax-h3-audio-tiny``'s, seeded (every parameter moved off diffusers' initialisation),
saved as the pipeline's ``audio_vae/`` folder and loaded by farm as a user's would be: `farm ingest` +
`farm render` on a local cluster write the step's waveform (to the last 16-bit level) into OUT/audio.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from farm.cli import main as farm_main
from farm.decoders.minimax_h3.audio import DEFAULTS, MINIMAX_H3_AUDIO_TINY
from farm.decoders.sound import load_sound_decoder, parse_sound_spec, sound_spec_from_pipeline
from farm.decoders.sound_base import samples_for_frames
from farm.errors import FarmError
from farm.inputs.ingest import add_pipeline_shot
from farm.inputs.synthetic import smooth_latent, synth
from farm.media.audio import fit_length, read_audio, to_levels
from farm.store.job import open_job, read_audio_latent
from farm.store.output import Output

pytestmark = pytest.mark.model

NAME = "minimax-h3-audio-tiny"
RATE = 32000
FRAMES, FPS = 9, 24.0  # 3 latent frames of minimax-h3-tiny: 0.375 s
VIDEO_LATENT = (4, 3, 2, 2)
VIDEO_DECODER = {"family": "minimax-h3", "config": "minimax-h3-tiny", "weights": {"random_seed": 0}}


def seeded(seed: int = 7) -> torch.nn.Module:
    """The tiny audio VAE with diffusers' initialisation from `seed`, then every parameter moved off it."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    torch.manual_seed(seed)
    model = AutoencoderKLMiniMaxH3Audio(**MINIMAX_H3_AUDIO_TINY)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator))
        model.dec_in_proj.weight.mul_(10.0)  # else the decoder's biases drown what the latent says
    return model.eval()


def reference_pipeline(folder):
    """The pipeline's audio decode step in a `MiniMaxH3ModularPipeline`, its audio VAE read from `folder` as
    from_pretrained reads it (itself needs `accelerate` for this class, not installed)."""
    from diffusers import AutoencoderKLMiniMaxH3Audio
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3AudioDecodeStep

    vae = AutoencoderKLMiniMaxH3Audio.from_config(AutoencoderKLMiniMaxH3Audio.load_config(folder))
    vae.load_state_dict(load_file(folder / "diffusion_pytorch_model.safetensors"))
    pipe = MiniMaxH3AudioDecodeStep().init_pipeline()
    pipe.update_components(audio_vae=vae.eval())
    return pipe


def pipeline_sound(pipe, latents: torch.Tensor) -> np.ndarray:
    """The step's soundtrack ``[1, 2, samples]`` → ``[2, samples]``."""
    with torch.inference_mode():
        return pipe(audio_latents=latents, output="audio")[0].float().numpy()


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minimax-h3") / "pipe"
    seeded().save_pretrained(folder / "audio_vae")
    return folder


def audio_latent(seed: int = 6) -> torch.Tensor:
    """Normalized audio latents ``[2, C, T]`` as long as the video, as the pipeline sizes them."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import audio_latent_num_frames

    t = audio_latent_num_frames(FRAMES, FPS)
    channels = MINIMAX_H3_AUDIO_TINY["latent_channels"]
    return torch.randn(2, channels, t, generator=torch.Generator().manual_seed(seed))


def test_render_sound_equals_the_pipeline_audio_decode(tmp_path, pipeline_folder, scheduler3):
    pipe = reference_pipeline(pipeline_folder / "audio_vae")
    assert pipe.audio_sampling_rate == RATE
    z = audio_latent()
    want = pipeline_sound(pipe, z)
    assert want.shape == (2, z.shape[2] * 800) and np.abs(want).mean() > 0.02 and np.abs(want).max() < 0.99
    assert np.abs(want[0] - want[1]).max() > 0.1  # each stereo channel its own latent
    # the test can tell: the latents decoded without the pipeline's un-normalisation are another sound
    with torch.inference_mode():
        raw = pipe.audio_vae.decode(z, return_dict=False)[0].permute(1, 0, 2)[0].numpy()
    assert np.abs(raw - want).max() > 0.1

    latents = tmp_path / "sh010.safetensors"
    video = torch.from_numpy(smooth_latent(np.random.default_rng(3), VIDEO_LATENT))
    save_file({"video": video, "audio": z.contiguous()}, str(latents))
    job, out = tmp_path / "job.zarr", tmp_path / "out"
    assert farm_main(["ingest", str(job), str(latents), "--tensor", "video",
                      "--decoder", json.dumps(VIDEO_DECODER), "--latents", "normalized", "--fps", "24",
                      "--audio-tensor", "audio",
                      "--audio-decoder", NAME, "--audio-weights", str(pipeline_folder)]) == 0  # fmt: skip
    info = open_job(job)
    assert info.audio is not None and info.audio.family == "minimax-h3-audio"
    assert info.shots["sh010"].audio_shape == tuple(z.shape)
    render = ["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1"]
    assert farm_main(render) == 0

    samples = samples_for_frames(FRAMES, FPS, RATE)
    assert samples == want.shape[1]  # the pipeline's sound lasts as long as its video
    sound = read_audio(Output(out).audio_file("sh010"))
    want_levels = to_levels(fit_length(want, samples))
    assert sound.sample_rate == RATE and sound.levels.shape == want_levels.shape
    diff = np.abs(sound.levels.astype(np.int32) - want_levels)
    assert diff.max() <= 1, diff.max()  # float32 rounding at the truncation to 16-bit levels


def test_the_pipeline_s_output_ingests_with_its_own_sound_decoder(tmp_path, pipeline_folder):
    """`add_pipeline_shot` with the pipeline's ``audio_latents``: the job records the pipeline's audio VAE
    (its config, statistics included, and folder) and holds the latents as given; that spec decodes them as
    the step does."""
    pipe = reference_pipeline(pipeline_folder / "audio_vae")
    z = audio_latent(8)
    video = smooth_latent(np.random.default_rng(4), VIDEO_LATENT)[None]
    weights = str(pipeline_folder)
    size = {"num_frames": FRAMES, "height": 32, "width": 32}
    add_pipeline_shot(tmp_path / "job.zarr", video, pipeline=pipe, name="sh020", fps=FPS, **size,
                      decoder=VIDEO_DECODER, audio_latents=z, audio_weights=weights)  # fmt: skip
    job = open_job(tmp_path / "job.zarr")
    assert job.audio is not None
    assert job.audio.to_json()["config"]["latents_std"] == MINIMAX_H3_AUDIO_TINY["latents_std"]
    assert np.array_equal(read_audio_latent(job.path, "sh020"), z.numpy())
    got = load_sound_decoder(job.audio).decode(z.numpy())
    np.testing.assert_allclose(got, pipeline_sound(pipe, z), rtol=0, atol=1e-5)
    spec = sound_spec_from_pipeline(pipe, weights)
    assert spec["family"] == "minimax-h3-audio" and spec["weights"] == {"path": weights}
    with pytest.raises(FarmError, match=r"expected \[B, 2, C, T\]"):
        add_pipeline_shot(tmp_path / "job.zarr", video, pipeline=pipe, name="sh030", fps=FPS, **size,
                          audio_latents=z[None, None])  # fmt: skip


def test_timing_configs_and_checks(tmp_path, pipeline_folder):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    # the released config is the class's defaults (diffusers ships no conversion script for it)
    signature = inspect.signature(AutoencoderKLMiniMaxH3Audio.__init__).parameters
    assert {k: json.loads(json.dumps(p.default)) for k, p in signature.items() if k != "self"} == DEFAULTS
    released = parse_sound_spec({"config": "minimax-h3-audio", "weights": {"random_seed": 0}})
    assert released.family == "minimax-h3-audio" and released.sample_rate == RATE
    assert released.latents_per_second == 40.0 and released.decoded_samples(15) == 12000
    assert released.latent_shape(15) == (2, 32, 15)
    tiny = parse_sound_spec({"config": NAME, "weights": {"path": str(pipeline_folder)}})
    assert tiny.sample_rate == RATE and tiny.latents_per_second == 40.0
    tiny.check_weights()  # the folder's config.json is the named config's
    with pytest.raises(FarmError, match=r"takes \[2, C, T\] with C = 4"):
        tiny.check_latent((4, 15, 2), "shot 'a'")
    with pytest.raises(FarmError, match="its config.json contradicts"):
        released_folder = {"config": "minimax-h3-audio", "weights": {"path": str(pipeline_folder)}}
        parse_sound_spec(released_folder).check_weights()
    with pytest.raises(FarmError, match="decodes in float32"):
        parse_sound_spec({"config": NAME, "weights": {"random_seed": 0}, "dtype": "bfloat16"})
    # one file of the tensors: the statistics must come from the config
    file = tmp_path / "audio_vae.safetensors"
    save_file(load_file(pipeline_folder / "audio_vae" / "diffusion_pytorch_model.safetensors"), str(file))
    with pytest.raises(FarmError, match="carries no latent statistics"):
        parse_sound_spec({"config": "minimax-h3-audio", "weights": {"path": str(file)}}).check_weights()
    from_file = parse_sound_spec({"config": NAME, "weights": {"path": str(file)}})
    from_file.check_weights()
    z = audio_latent(9).numpy()
    assert np.array_equal(load_sound_decoder(from_file).decode(z), load_sound_decoder(tiny).decode(z))


def test_synth_makes_a_job_with_minimax_h3_sound(tmp_path):
    job = synth(tmp_path / "job.zarr", decoder="minimax-h3-tiny", frames=FRAMES, height=32, width=32,
                audio=True)
    assert job.audio is not None and job.audio.config_name == NAME
    assert job.shots["shot000"].audio_shape == (2, 4, 15)
    assert farm_main(["synth", str(tmp_path / "cli.zarr"), "--decoder", "minimax-h3-tiny", "--frames", "9",
                      "--height", "32", "--width", "32",
                      "--audio-decoder", "minimax-h3-audio"]) == 0  # fmt: skip
    assert open_job(tmp_path / "cli.zarr").shots["shot000"].audio_shape == (2, 32, 15)
