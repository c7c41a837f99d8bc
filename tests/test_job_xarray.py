"""Job stores with sound open with xarray by name: the audio latent's dimensions are its own, so they
never clash with the video latent's; stores written before keep being read by farm."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from farm.inputs.synthetic import synth
from farm.store.job import open_job, read_audio_latent

xr = pytest.importorskip("xarray")


def test_a_job_store_with_sound_opens_with_xarray(tmp_path):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=96, fps=24.0, audio=True)
    ds = xr.open_zarr(job, group="shot000", consolidated=False)
    assert ds["latent"].dims == ("channel", "frame", "y", "x")
    assert ds["audio"].dims == ("audio_channel", "audio_frame", "mel")
    info = open_job(job).shots["shot000"]
    assert ds["latent"].shape == info.latent_shape and ds["audio"].shape == info.audio_shape
    assert ds.sizes["audio_channel"] == 2 and ds.sizes["mel"] == 16
    np.testing.assert_array_equal(ds["audio"].values, read_audio_latent(job, "shot000"))
    tree = xr.open_datatree(job, engine="zarr", consolidated=False)
    assert sorted(tree.children) == ["shot000", "shot001"]
    assert tree["shot001"]["audio"].shape == open_job(job).shots["shot001"].audio_shape


def test_a_store_written_with_the_former_audio_dimension_names_is_still_read(tmp_path):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=96, audio=True)
    group = zarr.open_group(str(job / "shot000"), mode="r+")
    sound = group["audio"][...]
    old = group.create_array("audio", shape=sound.shape, dtype=sound.dtype, chunks=sound.shape,
                             overwrite=True, dimension_names=("channel", "audio_frame", "mel"))  # fmt: skip
    old[...] = sound
    assert open_job(job).shots["shot000"].audio_shape == sound.shape
    np.testing.assert_array_equal(read_audio_latent(job, "shot000"), sound)
    # docs/outputs.md: xarray opens such a shot without its sound
    ds = xr.open_zarr(job, group="shot000", consolidated=False, drop_variables=["audio"])
    assert ds["latent"].shape == open_job(job).shots["shot000"].latent_shape
