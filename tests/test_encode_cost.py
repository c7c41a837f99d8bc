"""Encode cost that follows what is encoded: codec, preset and the frames' bits per pixel
(`farm.planning.encode_cost`), in the cost model and in the planner's simulator."""

from __future__ import annotations

import pytest

from farm.errors import FarmError
from farm.media.settings import VideoSettings
from farm.planning import costmodel, encode_cost
from farm.planning.encode_cost import EncodeRate, EncodeReference, encode_factor, fit_rate
from farm.planning.jobplan import render_cost_model
from farm.planning.options import PlanOptions
from farm.planning.tiling import TileGrid
from tests.test_planner import H200, SHOT_720, predicted

NOISE = EncodeReference("h264", "veryfast", 3.77)


def test_the_stored_rates_cover_every_codec_and_the_x264_presets_farm_offers():
    rates = encode_cost.stored_rates()
    for key in (
        "h264/ultrafast",
        "h264/veryfast",
        "h264/medium",
        "h265/veryfast",
        "prores_hq",
        "prores_4444",
    ):
        assert key in rates and rates[key].fixed >= 0 and rates[key].per_bit >= 0
    # slower presets cost more per pixel at the same bits, and more bits cost more (or as much)
    at = 1.0
    assert (rates["h264/ultrafast"].seconds_per_pixel(at) < rates["h264/veryfast"].seconds_per_pixel(at)
            < rates["h264/medium"].seconds_per_pixel(at))  # fmt: skip
    assert rates["h265/veryfast"].seconds_per_pixel(at) > rates["h264/veryfast"].seconds_per_pixel(at)


def test_the_factor_is_one_for_the_reference_and_follows_preset_and_bits():
    assert encode_factor(NOISE, "h264", "veryfast") == pytest.approx(1.0)
    assert encode_factor(NOISE, "h264", "ultrafast") < 1.0 < encode_factor(NOISE, "h264", "medium")
    rates = {"h264/veryfast": EncodeRate(1e-8, 2e-9)}
    smooth = encode_factor(NOISE, "h264", "veryfast", 0.05, rates)
    assert smooth == pytest.approx((1e-8 + 2e-9 * 0.05) / (1e-8 + 2e-9 * 3.77))
    # a codec without a measured rate costs as the reference does
    assert encode_factor(NOISE, "h264", "placebo", None, rates) == 1.0
    with pytest.raises(FarmError, match="no measured encode cost for 'h264/placebo'.*h264/veryfast"):
        encode_cost.rate_for("h264", "placebo", rates)


def test_a_rate_is_fitted_from_encodes_of_different_frames():
    truth = EncodeRate(7e-9, 2e-9)
    samples = [(bits, truth.seconds_per_pixel(bits)) for bits in (0.05, 1.0, 3.8)]
    fitted = fit_rate(samples)
    assert fitted.fixed == pytest.approx(truth.fixed, rel=1e-6)
    assert fitted.per_bit == pytest.approx(truth.per_bit, rel=1e-6)
    with pytest.raises(FarmError, match="at least 2"):
        fit_rate(samples[:1])


def test_a_render_is_predicted_with_its_own_codec_preset_and_frames(tiny_job):
    from farm.store.job import open_job

    spec = open_job(tiny_job).spec
    options = PlanOptions(cost_model="ltx2-h200")
    veryfast = render_cost_model(spec, options, VideoSettings(codec="h264", preset="veryfast"))
    ultrafast = render_cost_model(spec, options, VideoSettings(codec="h264", preset="ultrafast"))
    smooth = render_cost_model(spec, PlanOptions(cost_model="ltx2-h200", encoded_bits_per_pixel=0.05),
                               VideoSettings(codec="h264", preset="veryfast"))  # fmt: skip
    none = render_cost_model(spec, options, False)
    stored = costmodel.load("ltx2-h200")
    assert veryfast.encode_s_per_pixel == stored.encode_s_per_pixel  # the model's own reference
    assert ultrafast.encode_s_per_pixel < veryfast.encode_s_per_pixel
    assert smooth.cores_encode_s_per_pixel < veryfast.cores_encode_s_per_pixel
    assert none.encode_s_per_pixel == none.cores_encode_s_per_pixel == 0.0


def test_invalid_encoded_bits_per_pixel_setting_is_refused():
    import dask

    with (
        dask.config.set({"farm.encoded-bits-per-pixel": "lots"}),
        pytest.raises(FarmError, match=r"farm.encoded-bits-per-pixel 'lots' is invalid; give a positive"),
    ):
        PlanOptions()
    with dask.config.set({"farm.encoded-bits-per-pixel": 0.4}):
        assert PlanOptions().encoded_bits_per_pixel == 0.4


@pytest.mark.parametrize("n_workers", [1, 8])
def test_a_nodes_cores_take_its_encodes_together(n_workers):
    """With an encode ceiling, 8 shots' encodes cannot end before the node's cores (its decode workers'
    shares) have encoded every frame, however many streams encode at once; without it they overlap on the
    streams."""
    shots = {f"s{k}": SHOT_720 for k in range(8)}
    grids = {n: TileGrid() for n in shots}
    free = H200.with_(cores_encode_s_per_pixel=0.0, cores_write_s_per_pixel=0.0, disk_s_per_pixel=0.0)
    pixels = 8 * 121 * 704 * 1216
    slow = free.with_(cores_encode_s_per_pixel=4e-8)  # 29 frames/s of 704x1216 per decode worker's cores
    unlimited, limited = predicted(grids, shots, n_workers, free), predicted(grids, shots, n_workers, slow)
    assert limited.makespan_s >= slow.cores_encode_s_per_pixel * pixels / n_workers > unlimited.makespan_s
    assert limited.decode_makespan_s == pytest.approx(unlimited.decode_makespan_s)
    assert costmodel.CostModel.from_json(slow.to_json()).cores_encode_s_per_pixel == 4e-8
    assert costmodel.CostModel.from_json(slow.to_json()).encode_reference == slow.encode_reference
