"""LTX-2's sound: the audio decoder against diffusers' own decode, sound files and tracks read back with
PyAV, and a tiny LTX-2 pipeline's latent output (video + audio) through `farm ingest` and `farm render`
into videos with both streams, matching the pipeline's own decode."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from farm.cli import main as farm_main
from farm.decoders.ltx2.audio import (
    LTX2_AUDIO_TINY,
    parse_audio_spec,
    samples_for_frames,
)
from farm.decoders.sound import load_sound_decoder
from farm.errors import FarmError
from farm.inputs.pipelines import spec_from_pipeline
from farm.media.audio import fit_length, read_audio, to_levels
from farm.media.video import encode_segment, join_segments, probe
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output
from farm.store.progress import output_progress

sys.path.insert(0, str(Path(__file__).parent))
from test_ingest import tiny_pipeline  # noqa: E402  (the tiny LTX-2 pipeline the ingest tests build)

RATE = LTX2_AUDIO_TINY["vocoder"]["output_sampling_rate"]


def audio_models(folder: Path, seed: int = 11):
    """A tiny audio VAE and vocoder with seeded weights, saved as a diffusers pipeline saves them, and
    loaded back from there (so they know their folder)."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    torch.manual_seed(seed)
    vae = AutoencoderKLLTX2Audio(**LTX2_AUDIO_TINY["audio_vae"])
    with torch.no_grad():  # non-trivial statistics: a loader that dropped them would decode the same
        vae.latents_mean.copy_(torch.randn_like(vae.latents_mean) * 0.1)
        vae.latents_std.copy_(torch.rand_like(vae.latents_std) + 0.5)
    LTX2Vocoder(**LTX2_AUDIO_TINY["vocoder"]).save_pretrained(folder / "vocoder")
    vae.save_pretrained(folder / "audio_vae")
    return (AutoencoderKLLTX2Audio.from_pretrained(folder / "audio_vae").eval(),
            LTX2Vocoder.from_pretrained(folder / "vocoder").eval())  # fmt: skip


def diffusers_waveform(vae, vocoder, latent: torch.Tensor) -> np.ndarray:
    """What LTX2Pipeline does with its audio latents: ``audio_vae.decode``, then the vocoder."""
    with torch.inference_mode():
        return vocoder(vae.decode(latent[None], return_dict=False)[0])[0].numpy()


def checkpoint_names(state: dict, prefix: str, renames: dict[str, str]) -> dict:
    """Diffusers' names back to LTX-2's single-file ones (the inverse of diffusers' LTX-2 conversion)."""
    out = {}
    for key, value in state.items():
        for new, old in renames.items():
            if key == new or key.startswith(new + "."):
                key = old + key[len(new) :]
        out[prefix + key] = value.contiguous()
    return out


def test_audio_decode_equals_diffusers_from_a_folder_and_a_single_file(tmp_path):
    vae, vocoder = audio_models(tmp_path / "pipe")
    latent = torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(2))
    want = diffusers_waveform(vae, vocoder, latent)
    assert want.shape == (2, (4 * 13 - 3) * 240)

    spec = {"config": "ltx2-audio-tiny", "weights": {"path": str(tmp_path / "pipe")}}
    got = load_sound_decoder(spec).decode(latent.numpy())
    assert np.array_equal(got, want)

    # LTX-2's one-file checkpoint: the audio VAE and vocoder in its own names, beside other tensors
    file = tmp_path / "ltx-2.safetensors"
    statistics = {"latents_mean": "per_channel_statistics.mean-of-means",
                  "latents_std": "per_channel_statistics.std-of-means"}  # fmt: skip
    hifigan = {"upsamplers": "ups", "resnets": "resblocks", "conv_in": "conv_pre", "conv_out": "conv_post"}
    tensors = {
        **checkpoint_names(vae.state_dict(), "audio_vae.", statistics),
        **checkpoint_names(vocoder.state_dict(), "vocoder.", hifigan),
        "vae.decoder.conv_in.conv.weight": torch.zeros(2, 2),
    }
    save_file(tensors, file)
    one_file = {"config": "ltx2-audio-tiny", "weights": {"path": str(file)}}
    assert np.array_equal(load_sound_decoder(one_file).decode(latent.numpy()), want)

    # a checkpoint without sound is refused by name
    save_file({"vae.x": torch.zeros(1)}, tmp_path / "video-only.safetensors")
    with pytest.raises(FarmError, match="holds no 'audio_vae.' tensors"):
        load_sound_decoder({**one_file, "weights": {"path": str(tmp_path / "video-only.safetensors")}})


def test_audio_specs_say_what_is_wrong(tmp_path):
    spec = parse_audio_spec({"config": "ltx2-audio", "weights": {"random_seed": 0}})
    assert spec.sample_rate == 24000 and spec.latents_per_second == 25.0
    assert spec.latent_channels == 8 and spec.latent_mel_bins == 16
    assert spec.decoded_samples(126) == (4 * 126 - 3) * 240  # 5 s of LTX-2 sound: 5.01 s
    assert samples_for_frames(121, 24.0, 24000) == 121000
    with pytest.raises(FarmError, match="unknown audio config 'ltx3'"):
        parse_audio_spec({"config": "ltx3", "weights": {"random_seed": 0}})
    with pytest.raises(FarmError, match="'weights' must be"):
        parse_audio_spec({"config": "ltx2-audio"})
    with pytest.raises(FarmError, match="does not exist"):
        parse_audio_spec({"config": "ltx2-audio", "weights": {"path": str(tmp_path / "nothing")}})


@pytest.mark.parametrize("codec", ["h264", "prores_hq"])
def test_joined_video_carries_the_sound_cut_to_its_duration(tmp_path, codec):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (7, 32, 48, 3), dtype=np.uint8)
    suffix = ".mp4" if codec == "h264" else ".mov"
    segments = [tmp_path / f"s{k}{suffix}" for k in range(2)]
    encode_segment(frames[:4], segments[0], 24, codec=codec)
    encode_segment(frames[4:], segments[1], 24, codec=codec)
    t = np.arange(RATE) / RATE
    levels = to_levels(np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)]) * 0.5)
    from farm.media.audio import write_audio

    write_audio(tmp_path / "sound.wav", levels, RATE)  # 1 s of sound for 7 frames (0.29 s)
    write_audio(tmp_path / "sound.flac", levels, RATE, "flac")
    assert np.array_equal(read_audio(tmp_path / "sound.flac").levels, levels)  # lossless, as the WAV
    video = tmp_path / f"v{suffix}"
    join_segments(segments, video, sound=tmp_path / "sound.wav")
    assert probe(video).frames == 7
    with av.open(str(video)) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
        assert c.streams.audio[0].codec_context.name == ("aac" if codec == "h264" else "pcm_s16le")
    sound = read_audio(video)
    want = samples_for_frames(7, 24, RATE)
    if codec == "prores_hq":  # PCM: exactly the first 7/24 s of the file
        assert np.array_equal(sound.levels, levels[:, :want])
    else:  # AAC: the same tones, as long as the picture up to the encoder's last frame of 1024 samples
        assert want <= sound.levels.shape[1] <= want + 2048
        assert np.corrcoef(sound.levels[0, 1024:want], levels[0, 1024:want])[0, 1] > 0.9


def stream_seconds(path: Path) -> dict[str, float]:
    """Each stream's duration from its packets' timestamps."""
    spans: dict[str, list[int]] = {}
    with av.open(str(path)) as c:
        bases = {s.type: s.time_base for s in c.streams}
        for p in c.demux():
            if p.pts is not None:
                lo, hi = spans.get(p.stream.type, [p.pts, p.pts])
                spans[p.stream.type] = [min(lo, p.pts), max(hi, p.pts + (p.duration or 0))]
    return {kind: float((hi - lo) * bases[kind]) for kind, (lo, hi) in spans.items()}


def test_pipeline_video_and_sound_through_ingest_and_render_match_its_own_decode(tmp_path, scheduler3):
    """The done-criterion: a tiny LTX-2 pipeline's latent output (video + audio) through `farm ingest` and
    `farm render` into an mp4 with both streams, each matching the pipeline's own decode."""
    pipe, call = tiny_pipeline("ltx2", tmp_path / "pipe" / "vae")
    vae, vocoder = audio_models(tmp_path / "pipe")
    pipe.register_modules(audio_vae=vae, vocoder=vocoder)
    latent = pipe(**call, output_type="latent", generator=torch.Generator().manual_seed(1))
    own = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(1))
    frames, fps = call["num_frames"], 24.0  # the pipeline's frame_rate
    samples = samples_for_frames(frames, fps, RATE)
    sound = to_levels(fit_length(own.audio[0].float().numpy(), samples))  # the pipeline's own, as exported

    # the latents as a file, video and sound side by side
    save_file({"video": latent.frames[0].contiguous(), "audio": latent.audio[0].contiguous()},
              tmp_path / "sh010.safetensors")  # fmt: skip
    job, out = tmp_path / "job.zarr", tmp_path / "out"
    decoder = json.dumps(spec_from_pipeline(pipe))  # the pipeline's VAE config (its compression ratios)
    assert farm_main(["ingest", str(job), str(tmp_path / "sh010.safetensors"), "--tensor", "video",
                      "--audio-tensor", "audio", "--decoder", decoder, "--latents", "denormalized",
                      "--fps", "24", "--audio-decoder", "ltx2-audio-tiny",
                      "--audio-weights", str(tmp_path / "pipe")]) == 0  # fmt: skip
    info = open_job(job)
    assert info.audio is not None and info.shots["sh010"].audio_shape == tuple(latent.audio.shape[1:])
    assert farm_main(["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1",
                      "--batch-frames", "4"]) == 0  # fmt: skip

    o = Output(out)
    got = read_frames(o, "sh010").astype(np.float64)
    assert np.abs(got - own.frames[0].astype(np.float64) * 255).max() <= 1.0
    wav = read_audio(o.audio_file("sh010"))
    diff = np.abs(wav.levels.astype(np.int32) - sound)
    assert wav.sample_rate == RATE and diff.max() <= 1, diff.max()  # the pipeline's sound (float rounding)
    first = wav.levels
    assert wav.levels.shape[1] == round(frames / fps * RATE)  # as long as the video
    video = o.video("sh010")
    seconds = stream_seconds(video)
    assert seconds["video"] == pytest.approx(frames / fps)
    assert abs(seconds["audio"] - frames / fps) <= 2048 / RATE  # AAC ends on a frame of 1024 samples
    track = read_audio(video)
    assert track.sample_rate == RATE
    n = min(track.levels.shape[1], samples)
    assert np.corrcoef(track.levels[0, :n], sound[0, :n])[0, 1] > 0.9

    # the pipeline's helper: the job records the pipeline's own audio VAE and vocoder
    from farm.inputs.ingest import add_pipeline_shot

    size = {k: call[k] for k in ("num_frames", "height", "width")}
    job2 = tmp_path / "job2.zarr"
    add_pipeline_shot(job2, latent.frames, audio_latents=latent.audio, pipeline=pipe, name="sh020", fps=fps,
                      **size)  # fmt: skip
    info2 = open_job(job2)
    assert info2.audio is not None and info2.audio.weights == {"path": str(tmp_path / "pipe")}
    assert info2.shots["sh020"].audio_shape == info.shots["sh010"].audio_shape
    with pytest.raises(FarmError, match="expected \\[B, C, T, M\\] with B = 1"):
        add_pipeline_shot(job2, latent.frames, audio_latents=torch.cat([latent.audio] * 2), pipeline=pipe,
                          name="sh030", fps=fps, **size)  # fmt: skip

    # a rerun has nothing to do; a lost sound file is decoded again, alone (the video stays as it is)
    before = video.stat().st_mtime_ns
    o.audio_file("sh010").unlink()
    assert farm_main(["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1",
                      "--batch-frames", "4"]) == 0  # fmt: skip
    assert np.array_equal(read_audio(o.audio_file("sh010")).levels, first)
    assert video.stat().st_mtime_ns == before
    # so is an altered one, which `farm status --verify` counts as damaged
    wav_file = o.audio_file("sh010")
    data = bytearray(wav_file.read_bytes())
    data[-1] ^= 0xFF
    wav_file.write_bytes(bytes(data))
    assert [row.damaged for row in output_progress(out, verify=True)] == [1]
    assert farm_main(["render", str(job), "--out", str(out), "--scheduler", scheduler3, "--tiles", "1,1,1",
                      "--batch-frames", "4"]) == 0  # fmt: skip
    assert np.array_equal(read_audio(wav_file).levels, first)
    assert video.stat().st_mtime_ns == before
    assert [row.damaged for row in output_progress(out, verify=True)] == [0]

    # --no-audio: silent video, no sound file
    silent = tmp_path / "silent"
    assert farm_main(["render", str(job), "--out", str(silent), "--scheduler", scheduler3, "--tiles", "1,1,1",
                      "--no-audio"]) == 0  # fmt: skip
    with av.open(str(Output(silent).video("sh010"))) as c:
        assert len(c.streams.audio) == 0 and len(c.streams.video) == 1
    assert not Output(silent).audio_dir.exists()


def test_sound_needs_an_audio_decoder_and_fitting_latents(tmp_path):
    from farm.inputs.ingest import ingest

    latent = np.zeros((8, 2, 3, 4), np.float32)
    save_file({"video": torch.from_numpy(latent), "audio": torch.zeros(2, 9, 16)}, tmp_path / "a.safetensors")
    save_file({"video": torch.from_numpy(latent), "audio": torch.zeros(2, 9, 17)}, tmp_path / "b.safetensors")
    common = {"decoder": {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}},
              "latents": "denormalized", "tensor": "video", "audio_tensor": "audio"}  # fmt: skip
    with pytest.raises(FarmError, match="need an audio decoder"):
        ingest(tmp_path / "j.zarr", [tmp_path / "a.safetensors"], **common)
    spec = {"config": "ltx2-audio-tiny", "weights": {"random_seed": 0}}
    with pytest.raises(FarmError, match=r"audio latent has shape \[2, 9, 17\].*M = 16"):
        ingest(tmp_path / "j.zarr", [tmp_path / "b.safetensors"], audio_decoder=spec, **common)
    assert not (tmp_path / "j.zarr").exists()  # nothing written
    ingest(tmp_path / "j.zarr", [tmp_path / "a.safetensors"], audio_decoder=spec, **common)
    assert open_job(tmp_path / "j.zarr").shots["a"].audio_shape == (2, 9, 16)
    # a silent job cannot take sound
    silent = dict(common, audio_tensor=None)
    ingest(tmp_path / "s.zarr", [tmp_path / "a.safetensors"], **silent)
    with pytest.raises(FarmError, match="created without an audio decoder"):
        ingest(tmp_path / "s.zarr", [tmp_path / "a.safetensors"], tensor="video", audio_tensor="audio",
               name="b")
