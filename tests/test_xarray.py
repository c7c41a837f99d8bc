"""The outputs as xarray and dask.array users open them: named dimensions, coordinates, attributes."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
import zarr

import farm
from farm.media.settings import VideoSettings
from farm.store.frames import read_frames
from farm.store.output import Output

xr = pytest.importorskip("xarray")
QUIET = {"log": lambda _: None}
WHOLE = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory, scheduler3):
    root = tmp_path_factory.mktemp("xr")
    job = root / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=2, frames=17, height=64, width=96, fps=25.0)
    out = Output(root / "out")
    video = VideoSettings(enabled=False, first_frame=1001)
    assert not farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, video=video, **QUIET).failed
    return job, out


def test_frames_open_with_xarray_by_name(rendered):
    _, out = rendered
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "failed to open with consolidated metadata" fallback
        ds = xr.open_zarr(out.frames_zarr, group="shot000", consolidated=False)
    frames = ds["frames"]
    assert frames.dims == ("frame", "y", "x", "channel")
    assert dict(ds.sizes) == {"frame": 17, "y": 64, "x": 96, "channel": 3}
    assert ds["frame"].values.tolist() == list(range(1001, 1018))  # --first-frame numbering
    assert ds["channel"].values.tolist() == ["R", "G", "B"]
    assert frames.attrs["colour_space"] == "BT.709" and frames.attrs["colour_range"] == "full"
    assert frames.attrs["fps"] == 25.0 and ds.attrs["fps"] == 25.0
    assert frames.dtype == np.uint8  # fill value 0 is not a mask: no float conversion
    middle = frames.sel(frame=1009).values
    np.testing.assert_array_equal(middle, read_frames(out, "shot000")[8])
    # without options, as the reader tried it: works (xarray warns that nothing is consolidated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert xr.open_zarr(out.frames_zarr, group="shot001")["frames"].dims == frames.dims


def test_whole_output_opens_as_a_datatree_and_dask_array(rendered):
    _, out = rendered
    tree = xr.open_datatree(out.frames_zarr, engine="zarr", consolidated=False)
    assert sorted(tree.children) == ["shot000", "shot001"]
    for shot in ("shot000", "shot001"):
        node = tree[shot]
        assert node["frames"].dims == ("frame", "y", "x", "channel")
        assert int(node["frame"][0]) == 1001 and node["frames"].sizes["frame"] == 17
    arr = da.from_zarr(str(out.frames_zarr / "shot000" / "frames"))
    assert arr.shape == (17, 64, 96, 3) and arr.chunks[0] == (8, 8, 1)
    np.testing.assert_array_equal(arr[-1].compute(), read_frames(out, "shot000")[-1])


def test_latents_open_with_xarray(rendered):
    job, _ = rendered
    ds = xr.open_zarr(job, group="shot000", consolidated=False)
    assert ds["latent"].dims == ("channel", "frame", "y", "x")
    assert ds["latent"].shape == zarr.open_array(str(job / "shot000" / "latent"), mode="r").shape


def test_outputs_without_the_metadata_still_resume(tmp_path, scheduler3):
    """An output written before frames had dimension names or coordinates resumes and finishes."""
    job = tmp_path / "job.zarr"
    farm.synth(job, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64)
    out = Output(tmp_path / "out")
    farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, frames="1-8", **QUIET)
    group = zarr.open_group(str(out.frames_zarr / "shot000"), mode="r+")
    old = group["frames"][...]
    for name in ("frame", "channel"):
        del group[name]
    legacy = group.create_array("frames", shape=old.shape, dtype=old.dtype, chunks=group["frames"].chunks,
                                fill_value=0, overwrite=True)  # fmt: skip
    legacy[...] = old  # as before: no dimension_names, no attributes
    stats = farm.render(job, out.root, scheduler=scheduler3, options=WHOLE, **QUIET)
    assert not stats.failed and stats.frames_written == 9
    assert out.batches_done("shot000") == {0, 1, 2} and out.video("shot000").exists()
    whole = Output(tmp_path / "whole")
    no_video = VideoSettings(enabled=False)
    farm.render(job, whole.root, scheduler=scheduler3, options=WHOLE, video=no_video, **QUIET)
    assert read_frames(out, "shot000").tobytes() == read_frames(whole, "shot000").tobytes()
    kept = zarr.open_array(str(out.frames_zarr / "shot000" / "frames"), mode="r")
    assert kept.metadata.dimension_names is None  # the old array was kept, not replaced
