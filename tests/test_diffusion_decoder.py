"""The LTX-2.5 diffusion decoder (`ltx2-diffusion`): its windowed neighbourhood attention against diffusers'
FlexAttention, noise that is a function of each pixel's place, and renders that give the same bytes on 1
and 3 workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import farm.render as fr
from farm.decoders import load_decoder
from farm.decoders.ltx2_diffusion import LTX2DiffusionDecoder, decode_with_noise, window_index
from farm.errors import FarmError
from farm.output import Output, read_frames
from farm.synthetic import synth

pytestmark = pytest.mark.model
SPEC = {"family": "ltx2-diffusion", "config": "ltx2-diffusion-tiny", "weights": {"random_seed": 0}}


def test_windows_shift_inward_at_the_borders():
    index = window_index((1, 1, 5), (1, 1, 3), "cpu")
    assert index.tolist() == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [2, 3, 4]]
    assert window_index((4, 3, 5), (3, 3, 3), "cpu").shape == (60, 27)


def test_decode_equals_diffusers_flex_attention_with_the_same_noise():
    decoder = load_decoder(SPEC)
    z = torch.randn(8, 3, 3, 4, generator=torch.Generator().manual_seed(1))
    got = decoder.decode(z, (0, 0, 0))
    assert got.shape == (3, 17, 96, 128)
    model = LTX2DiffusionDecoder.build(decoder.spec)  # diffusers' own FlexAttention processors
    with torch.inference_mode():
        want = (decode_with_noise(model, z[None], decoder.noise, (0, 0, 0), 1)[0] + 1) / 2
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(FarmError, match="needs the tile origin"):
        decoder.decode(z)


def test_noise_is_a_function_of_the_pixel_position():
    decoder = load_decoder(SPEC)
    whole = decoder.noise((1, 3, 17, 96, 128), (0, 0, 0))
    part = decoder.noise((1, 3, 9, 64, 64), (1, 1, 2))  # latent frame 1, row 1, column 2
    assert torch.equal(part, whole[:, :, 8:17, 32:96, 64:128])
    other = load_decoder({**SPEC, "decode_noise_seed": 5}).noise((1, 3, 9, 64, 64), (1, 1, 2))
    assert not torch.equal(part, other)


def test_steps_come_from_the_spec_or_the_config():
    assert load_decoder(SPEC).decode_steps() == 1
    two = load_decoder({**SPEC, "decode_steps": 2})
    assert two.decode_steps() == 2
    z = torch.randn(8, 2, 3, 3, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(two.decode(z, (0, 0, 0)), load_decoder(SPEC).decode(z, (0, 0, 0)))
    with pytest.raises(FarmError, match="'decode_steps' must be 1 or more"):
        load_decoder({**SPEC, "decode_steps": 0})


@pytest.mark.slow
def test_a_tiled_render_gives_the_same_bytes_on_1_and_3_workers(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-diffusion-tiny", shots=1, frames=9, height=128, width=160, seed=3)
    options = fr.PlanOptions(tiles=(1, 2, 2), overlap=(0, 2, 2), batch_frames=8)
    one = fr.render(job, tmp_path / "one", workers=1, options=options, log=lambda _: None)
    three = fr.render(job, tmp_path / "three", scheduler=scheduler3, options=options, log=lambda _: None)
    assert not one.failed and not three.failed and three.tiles_decoded == 4
    a, b = (read_frames(Output(tmp_path / out), "shot000") for out in ("one", "three"))
    assert a.shape == (9, 128, 160, 3) and np.array_equal(a, b)
    videos = [(tmp_path / out / "videos/shot000.mp4").read_bytes() for out in ("one", "three")]
    assert videos[0] == videos[1]


def test_decode_steps_go_into_a_new_jobs_spec(tmp_path):
    from farm.ingest import ingest
    from farm.store import open_job

    np.save(tmp_path / "sh010.npy", np.zeros((8, 2, 3, 3), np.float32))
    ingest(tmp_path / "job.zarr", [tmp_path / "sh010.npy"], decoder=SPEC, latents="denormalized",
           decode_steps=2)
    assert open_job(tmp_path / "job.zarr").spec.extra == {"decode_steps": 2}
    with pytest.raises(FarmError, match="fixes the steps"):
        ingest(tmp_path / "job.zarr", [tmp_path / "sh010.npy"], name="b", decode_steps=3)
    ltx2 = {"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 0}, "latents": "denormalized"}
    with pytest.raises(FarmError, match="does not denoise"):
        ingest(tmp_path / "other.zarr", [tmp_path / "sh010.npy"], decoder=ltx2, latents="denormalized",
               decode_steps=2)
