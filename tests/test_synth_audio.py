"""`farm synth --audio`: synthetic jobs with sound that fits the decoder's own audio config, rendered
into a sound file and a video with a sound track (read back with PyAV)."""

from __future__ import annotations

import av
import pytest

from farm.cli import main as farm_main
from farm.decoders.ltx2.audio import NAMED_CONFIGS
from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.media.audio import read_audio
from farm.store.job import open_job


@pytest.mark.parametrize(
    "decoder, sound, channels, mel, rate",
    [("ltx2-tiny", "ltx2-audio-tiny", 2, 16, 24000), ("ltx2", "ltx2-audio", 8, 16, 24000),
     ("ltx2.3-tiny", "ltx2.3-audio-tiny", 2, 16, 48000), ("ltx2.3", "ltx2.3-audio", 8, 16, 48000)],
)  # fmt: skip
def test_synth_audio_fits_the_decoders_own_sound(tmp_path, decoder, sound, channels, mel, rate):
    job = synth(tmp_path / "job.zarr", decoder=decoder, shots=2, frames=49, height=64 * 4, width=64 * 4,
                fps="24000/1001", audio=True)  # fmt: skip
    assert job.audio is not None and job.audio.config_name == sound
    assert job.audio.config == NAMED_CONFIGS[sound] and job.audio.weights == {"random_seed": 0}
    got = (job.audio.latent_channels, job.audio.latent_mel_bins, job.audio.sample_rate)
    assert got == (channels, mel, rate)
    for shot in job.shots.values():
        # 49 frames at 23.976 fps last 2.044 s: 51 latent frames at LTX-2's 25 per second
        assert shot.audio_shape == (channels, 51, mel)


def test_synth_without_audio_is_silent_and_its_video_latents_are_unchanged_by_audio(tmp_path):
    import zarr

    silent = synth(tmp_path / "silent.zarr", shots=2, seed=3)
    loud = synth(tmp_path / "loud.zarr", shots=2, seed=3, audio=True)
    assert loud.audio is not None and all(s.audio_shape is not None for s in loud.shots.values())
    assert silent.audio is None and all(s.audio_shape is None for s in silent.shots.values())
    for name in silent.shots:
        a = zarr.open_array(str(tmp_path / "silent.zarr" / name / "latent"))[...]
        b = zarr.open_array(str(tmp_path / "loud.zarr" / name / "latent"))[...]
        assert (a == b).all()


def test_synth_audio_is_refused_for_a_decoder_without_sound(tmp_path):
    with pytest.raises(FarmError, match=r"--audio: wan-tiny has no sound config of its own.*--audio-decoder"):
        synth(tmp_path / "job.zarr", decoder="wan-tiny", frames=17, audio=True)
    assert not (tmp_path / "job.zarr").exists()
    job = synth(tmp_path / "job.zarr", decoder="wan-tiny", frames=17, audio="ltx2-audio-tiny")
    assert job.audio is not None and job.audio.config_name == "ltx2-audio-tiny"


def test_farm_synth_audio_then_render_writes_the_sound(tmp_path, scheduler3):
    job, out = tmp_path / "job.zarr", tmp_path / "out"
    assert farm_main(["synth", str(job), "--audio", "--frames", "17", "--fps", "24"]) == 0
    assert open_job(job).audio is not None
    assert farm_main(["render", str(job), "--out", str(out), "--scheduler", scheduler3]) == 0
    wav = read_audio(out / "audio" / "shot000.wav")
    assert wav.sample_rate == 24000 and wav.levels.shape == (2, round(17 / 24 * 24000))
    assert wav.levels.std() > 0  # decoded sound, not silence
    with av.open(str(out / "videos" / "shot000.mp4")) as video:
        assert len(video.streams.audio) == 1 and video.streams.audio[0].sample_rate == 24000
