"""The auto planner and the cost model: invariants, fits, and the comparison with LTX-2's shipped grids."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import farm
from farm.decoders.memory import MemoryModel
from farm.errors import FarmError
from farm.inputs.synthetic import synth_spec
from farm.planning import costmodel, planner
from farm.planning.costmodel import CostModel, DecodeCost, Link, Sample
from farm.planning.jobplan import plan_job, plan_shots
from farm.planning.options import parse_tiles
from farm.planning.tiling import ChunkSize, Geometry, TileGrid, assign_round_robin, plan_shot

G = Geometry(spatial_scale=32, temporal_scale=8, causal=True)
H200 = costmodel.load("ltx2-h200")
MEM = MemoryModel(weight_bytes=1_056_000_000, bytes_per_pixel=118.0)  # LTX2Decoder.peak_bytes, ltx2 bf16
SHOT_720 = (128, 16, 22, 38)  # 121 x 704 x 1216
SHOT_1080 = (128, 16, 34, 60)  # 121 x 1088 x 1920


def plans_for(grids: dict[str, TileGrid], shapes: dict[str, tuple], n_workers: int):
    return assign_round_robin([plan_shot(n, shapes[n], G, grids[n]) for n in shapes], n_workers)


def predicted(grids, shapes, n_workers, model=H200):
    return planner.predict(plans_for(grids, shapes, n_workers), n_workers, model, memory=MEM, geometry=G)


# --------------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------------


def test_fit_recovers_known_coefficients():
    truth = {"const": 0.012, "pixel_volume": 4.5e-9, "halo": 6e-9}
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(12):
        f, h, w = (
            int(rng.integers(1, 20)) * 8 + 1,
            int(rng.integers(2, 40)) * 32,
            int(rng.integers(2, 60)) * 32,
        )
        seconds = sum(c * costmodel.features((f, h, w))[k] for k, c in truth.items())
        samples.append(Sample((f, h, w), seconds))
    fitted = costmodel.fit_decode_cost(samples)
    for name, value in truth.items():
        assert fitted.coefficients[name] == pytest.approx(value, rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    # times that grow with volume only, plus noise: no negative intercept or halo term comes out
    rng = np.random.default_rng(1)
    shapes = [(9 + 8 * k, 32 * (2 + k), 64 * (1 + k)) for k in range(8)]
    samples = [Sample(s, 3e-9 * math.prod(s) * (1 + 0.02 * rng.standard_normal())) for s in shapes]
    fitted = costmodel.fit_decode_cost(samples)
    assert all(v >= 0 for v in fitted.coefficients.values())
    assert fitted.coefficients["pixel_volume"] == pytest.approx(3e-9, rel=0.05)


def test_fit_needs_enough_samples():
    with pytest.raises(FarmError, match="at least 3 measured decodes"):
        costmodel.fit_decode_cost([Sample((9, 64, 64), 0.1)])


@pytest.mark.parametrize("name", costmodel.available())
def test_stored_models_record_their_machine_and_refit_to_their_coefficients(name):
    model = costmodel.load(name)
    assert model.machine and re.fullmatch(r"2026-\d\d-\d\d", model.date)
    assert len(model.samples) >= 3
    refit = costmodel.fit_decode_cost(model.samples, tuple(model.decode.coefficients))
    for key, value in model.decode.coefficients.items():
        assert refit.coefficients[key] == pytest.approx(value, rel=1e-6, abs=1e-15)
    # the fit is close to what was measured
    assert costmodel.relative_rms(model.decode, model.samples) < 0.2  # CPU timings are noisy (~15 %)
    assert CostModel.from_json(model.to_json()) == model


def test_h200_model_predicts_the_measured_decodes():
    assert set(costmodel.available()) >= {"ltx2-h200", "ltx2-tiny-cpu"}
    # farm's decoder (reflect padding by slices) on one H200, eager bf16: docs/performance.md
    assert H200.decode_seconds((121, 704, 1216)) == pytest.approx(0.4155, rel=0.02)
    assert H200.decode_seconds((121, 416, 416)) == pytest.approx(0.0901, rel=0.02)
    assert H200.decode_seconds((121, 1088, 1920)) == pytest.approx(0.9951, rel=0.02)
    for sample in H200.samples:
        assert H200.decode_seconds(sample.pixels) == pytest.approx(sample.seconds, rel=0.03), sample.what
    # UCX moves a GiB in ~10 ms, TCP in ~2 s (FINDINGS)
    assert H200.transfer_seconds(2**30, same_node=True, protocol="ucx") == pytest.approx(0.0107, rel=0.01)
    assert H200.transfer_seconds(2**30, same_node=True, protocol="tcp") == pytest.approx(1.95, rel=0.01)


def test_memory_model_is_the_decoder_adapters_peak_bytes():
    from farm.decoders import memory_model
    from farm.decoders.ltx2 import LTX2Decoder

    spec = synth_spec("ltx2", dtype="bfloat16")
    mem = memory_model(spec)
    for volume in (0, 10**6, 121 * 704 * 1216):
        assert abs(mem.peak_bytes(volume) - LTX2Decoder.peak_bytes(spec, volume)) <= 1


@pytest.mark.parametrize("name", ["ltxv-0.9.1", "wan", "hunyuanvideo", "hunyuanvideo-tiny", "wan-tiny"])
def test_every_familys_memory_model_is_its_adapters_peak_bytes(name):
    """Including HunyuanVideo's attention mask, which grows with the square of a call's latent positions:
    a linear fit of it once planned 100+ GiB per worker for a tiny shot whose tiles need 0.4 GiB."""
    from farm.decoders import decoder_class, memory_model

    spec = synth_spec(name)
    mem, cls = memory_model(spec), decoder_class(spec)
    for pixels in ((1, 1, 1), (25, 160, 250), (33, 256, 384), (129, 720, 1280)):
        assert abs(mem.peak_bytes(pixels) - cls.peak_bytes(spec, pixels)) <= 1


def test_memory_model_terms_that_need_the_shape():
    """Frame-by-frame decoders hold a frame's activations whatever the length; torch's native CPU 3-D
    convolution unfolds small inputs (channels x padded frames x rows up to 20480)."""
    mem = MemoryModel(weight_bytes=100, bytes_per_pixel=10.0, const_bytes=1000.0, bytes_per_frame_pixel=50.0,
                      native_conv=((16, 1700.0), (8, 800.0)))  # fmt: skip
    assert mem.peak_bytes((10, 20, 30)) == 100 + 1000 + (10 + 1700) * 6000 + 50 * 600  # 16 x 12 x 22 <= 20480
    assert mem.peak_bytes((30, 50, 30)) == 100 + 1000 + (10 + 800) * 45000 + 50 * 1500  # 8 x 32 x 52
    assert mem.peak_bytes((30, 100, 30)) == 100 + 1000 + 10 * 90000 + 50 * 3000  # neither: oneDNN
    with pytest.raises(ValueError, match="shape"):
        mem.peak_bytes(6000)
    assert MEM.peak_bytes(6000) == MEM.peak_bytes((10, 20, 30))


def test_cost_model_per_family():
    """A family's decode seconds come from its own measured decodes, scaled onto the stored machine model."""
    from farm.planning.costmodel import cost_model

    ltx2, hunyuan = synth_spec("ltx2"), synth_spec("hunyuanvideo")
    assert cost_model(ltx2) == H200  # the model was fitted for LTX-2
    scaled = cost_model(hunyuan)
    assert scaled.decoder == "hunyuanvideo" and scaled.links == H200.links
    assert scaled.decode_seconds((33, 512, 768)) == pytest.approx(1.3, rel=1e-6)  # measured on the H200
    assert scaled.decode_seconds((121, 704, 1216)) > 10 * H200.decode_seconds((121, 704, 1216))
    tiny = cost_model(synth_spec("ltx2-tiny"))
    assert tiny.name == "ltx2-tiny-cpu" and cost_model(synth_spec("wan-tiny")).decode_on_host


def test_unknown_cost_model_is_a_clear_error():
    with pytest.raises(FarmError, match="unknown cost model 'nope'"):
        costmodel.load("nope")


# --------------------------------------------------------------------------------------------------
# Planner invariants
# --------------------------------------------------------------------------------------------------

CASES = [
    ({"a": SHOT_720}, 1),
    ({"a": SHOT_720}, 2),
    ({"a": SHOT_720}, 8),
    ({"a": SHOT_1080}, 4),
    ({"a": (128, 5, 6, 9), "b": SHOT_720, "c": (128, 3, 4, 4)}, 3),
    ({f"s{k}": SHOT_720 for k in range(9)}, 8),
]


@pytest.mark.parametrize(("shots", "n_workers"), CASES)
def test_auto_grids_cover_every_pixel_once(shots, n_workers):
    grids = planner.choose_plans(shots, G, n_workers, H200, H200.worker_memory_bytes, memory=MEM)
    assert list(grids) == list(shots)  # job order kept
    for name, grid in grids.items():
        plan = plan_shot(name, shots[name], G, grid)
        for axis in range(3):
            total = np.zeros(plan.pixel_shape[axis])
            seen = set()
            for tile in plan.tiles:
                span = tile.pixels[axis]
                if (span.start, span.stop) in seen:
                    continue
                seen.add((span.start, span.stop))
                total[span.start : span.stop] += span.weights
            np.testing.assert_allclose(total, 1.0, atol=1e-9)
        # auto never thins a seam below the decoder's minimum overlap
        minimum = planner.min_overlap_for(None)
        for axis, (count, overlap) in enumerate(zip(grid.tiles, grid.overlap, strict=True)):
            assert overlap == (minimum[axis] if count > 1 else 0)


def test_choice_is_deterministic():
    shots = {"a": SHOT_720, "b": SHOT_1080, "c": SHOT_720}
    first = planner.choose_plans(shots, G, 8, H200, H200.worker_memory_bytes, memory=MEM)
    for _ in range(3):
        assert planner.choose_plans(shots, G, 8, H200, H200.worker_memory_bytes, memory=MEM) == first


# Two or more shots per worker (one per worker and the H200 model prefers halves: each worker's first
# half-tile finishes sooner, so its writes and encodes, which share the node's cores, start sooner).
@pytest.mark.parametrize(("n_shots", "n_workers"), [(16, 8), (64, 8), (16, 4)])
def test_whole_shots_when_there_are_enough_shots(n_shots, n_workers):
    shots = {f"s{k:03d}": SHOT_720 for k in range(n_shots)}
    grids = planner.choose_plans(shots, G, n_workers, H200, H200.worker_memory_bytes, memory=MEM)
    assert all(g.tiles == (1, 1, 1) for g in grids.values())
    assert predicted(grids, shots, n_workers).redundancy == 1.0


def test_a_single_large_shot_on_many_workers_is_split():
    shots = {"a": SHOT_1080}
    grids = planner.choose_plans(shots, G, 8, H200, H200.worker_memory_bytes, memory=MEM)
    assert math.prod(grids["a"].tiles) > 1
    auto = predicted(grids, shots, 8)
    whole = predicted({"a": TileGrid()}, shots, 8)
    assert auto.makespan_s < whole.makespan_s
    assert auto.decode_makespan_s < whole.decode_makespan_s


def test_a_partial_last_round_is_split_to_fill_the_workers():
    # 9 whole shots on 8 workers take two rounds; splitting beats that by far more than MIN_GAIN
    shots = {f"s{k}": SHOT_720 for k in range(9)}
    grids = planner.choose_plans(shots, G, 8, H200, H200.worker_memory_bytes, memory=MEM)
    assert any(g.tiles != (1, 1, 1) for g in grids.values())
    auto = predicted(grids, shots, 8)
    whole = predicted({n: TileGrid() for n in shots}, shots, 8)
    assert auto.makespan_s < whole.makespan_s * (1 - planner.MIN_GAIN)
    assert auto.redundancy < 1.2


def test_one_worker_decodes_whole_shots():
    shots = {"a": SHOT_1080, "b": SHOT_720}
    grids = planner.choose_plans(shots, G, 1, H200, H200.worker_memory_bytes, memory=MEM)
    assert grids == {"a": TileGrid(), "b": TileGrid()}


def test_memory_bound_is_respected():
    shots = {"a": SHOT_1080}
    budget = 8 * 2**30  # the whole 1080p shot needs ~29 GiB
    for n_workers in (1, 4):
        grids = planner.choose_plans(shots, G, n_workers, H200, budget, memory=MEM)
        plan = plan_shot("a", SHOT_1080, G, grids["a"])
        assert len(plan.tiles) > 1
        pred = planner.predict(assign_round_robin([plan], n_workers), n_workers, H200, memory=MEM, geometry=G)
        assert pred.peak_bytes <= budget * planner.MEMORY_HEADROOM
        assert all(MEM.peak_bytes(t.pixel_volume) <= budget * planner.MEMORY_HEADROOM for t in plan.tiles)


def test_memory_bound_counts_chunks():
    shots = {"a": SHOT_1080}
    chunk = ChunkSize(height=9, width=15)
    budget = 8 * 2**30
    grids = planner.choose_plans(shots, G, 1, H200, budget, memory=MEM, chunk=chunk)
    assert grids["a"] == TileGrid()  # chunked calls fit, so one worker keeps the shot whole


def test_impossible_memory_is_a_clear_error():
    with pytest.raises(FarmError, match="fits a worker's memory.*--chunk"):
        planner.choose_plans({"a": SHOT_1080}, G, 4, H200, 2**30, memory=MEM)


def test_fixed_grids_are_kept():
    shots = {"a": SHOT_720, "b": SHOT_720}
    fixed = {"a": TileGrid((1, 1, 2), (0, 0, 3))}
    grids = planner.choose_plans(shots, G, 4, H200, None, memory=MEM, fixed=fixed)
    assert grids["a"] == fixed["a"]


# --------------------------------------------------------------------------------------------------
# Predictions
# --------------------------------------------------------------------------------------------------


def test_prediction_of_whole_shots():
    shots = {f"s{k}": SHOT_720 for k in range(4)}
    pred = predicted({n: TileGrid() for n in shots}, shots, 4)
    assert pred.redundancy == 1.0 and pred.tiles == 4 and pred.transfer_bytes == 0
    one = H200.task_overhead_s + H200.decode_seconds((121, 704, 1216))
    assert pred.decode_makespan_s == pytest.approx(one, rel=1e-9)  # one shot per worker, side by side
    assert pred.makespan_s > pred.decode_makespan_s
    assert 0 < pred.utilisation <= 1.0 + 1e-9 and 0 < pred.thread_utilisation <= 1.0 + 1e-9
    assert pred.peak_bytes == MEM.peak_bytes(121 * 704 * 1216)


def test_tcp_transfers_cost_more_than_ucx():
    shots = {"a": SHOT_720}
    grid = {"a": TileGrid((1, 2, 2), (0, 4, 4))}
    ucx = predicted(grid, shots, 4)
    tcp = predicted(grid, shots, 4, H200.with_(protocol="tcp"))
    assert ucx.transfer_bytes == tcp.transfer_bytes > 0
    assert tcp.decode_makespan_s > ucx.decode_makespan_s + 0.1


def test_a_nodes_disk_takes_durable_writes_one_batch_at_a_time():
    """With a disk term, 8 workers' writes cannot finish before the disk has taken every frame; without
    it they overlap on the streams; a disk faster than the streams changes nothing."""
    shots = {f"s{k}": SHOT_720 for k in range(8)}
    grids = {n: TileGrid() for n in shots}
    free = H200.with_(disk_s_per_pixel=0.0, cores_encode_s_per_pixel=0.0, cores_write_s_per_pixel=0.0)
    pixels = 8 * 121 * 704 * 1216
    slow = free.with_(disk_s_per_pixel=4e-9)  # 8 shots: ≥ 3.3 s of disk, more than their decode
    unlimited, limited = predicted(grids, shots, 8, free), predicted(grids, shots, 8, slow)
    assert limited.makespan_s >= slow.disk_s_per_pixel * pixels > unlimited.makespan_s
    assert limited.decode_makespan_s == pytest.approx(unlimited.decode_makespan_s)  # decodes are not held up
    fast = predicted(grids, shots, 8, free.with_(disk_s_per_pixel=1e-15))
    assert fast.makespan_s == pytest.approx(unlimited.makespan_s, rel=1e-6)
    assert costmodel.CostModel.from_json(slow.to_json()).disk_s_per_pixel == 4e-9


def test_blended_batches_cross_to_their_io_workers_one_at_a_time_from_each_sender():
    """With a send term, a whole tile's batches (all blended when its one decode ends) reach their I/O
    workers one after another, so the render ends no sooner than the decode plus every send but the
    last (the last batch is written where it was blended); with no I/O workers nothing is sent."""
    shot = {"s": SHOT_1080}
    plans = plans_for({"s": TileGrid()}, shot, 1)
    free = H200.with_(send_s_per_pixel=0.0, cores_encode_s_per_pixel=0.0, cores_write_s_per_pixel=0.0)
    sending = free.with_(send_s_per_pixel=1e-8)  # 0.17 s per 32-frame batch of 1088x1920
    batch = 32 * 1088 * 1920
    base, sent = (planner.predict(plans, 1, m, memory=MEM, geometry=G, n_io=4) for m in (free, sending))
    sends = (len(plans[0].batches) - 1) * sending.send_s_per_pixel * batch
    assert sent.makespan_s >= base.decode_makespan_s + sends > base.makespan_s
    assert sent.decode_makespan_s == pytest.approx(base.decode_makespan_s)
    local = [planner.predict(plans, 1, m, memory=MEM, geometry=G, n_io=0).makespan_s for m in (free, sending)]
    assert local[0] == pytest.approx(local[1])
    assert costmodel.CostModel.from_json(sending.to_json()).send_s_per_pixel == 1e-8


def test_minimal_cost_model_without_links():
    model = CostModel("m", "ltx2-tiny", "float32", "test", "2026-11-29", DecodeCost({"pixel_volume": 1e-8}))
    shots = {"a": (8, 3, 4, 6)}
    grids = planner.choose_plans(shots, G, 2, model, None, memory=MEM)
    pred = predicted(grids, shots, 2, model)
    assert pred.makespan_s > 0


# --------------------------------------------------------------------------------------------------
# Against LTX-2's shipped grids (the issue's target rows)
# --------------------------------------------------------------------------------------------------

SHIPPED = {
    2: TileGrid((1, 2, 2), (0, 4, 4)),
    4: TileGrid((1, 2, 2), (0, 4, 4)),
    8: TileGrid((1, 2, 4), (0, 4, 4)),
}
STRIPS = TileGrid((1, 8, 1), (0, 4, 0))


@pytest.mark.parametrize("shape", [SHOT_720, SHOT_1080])
@pytest.mark.parametrize("n_workers", [2, 4, 8])
def test_auto_is_no_worse_than_the_shipped_grids(shape, n_workers):
    shots = {"a": shape}
    grids = planner.choose_plans(shots, G, n_workers, H200, H200.worker_memory_bytes, memory=MEM)
    auto = predicted(grids, shots, n_workers)
    for shipped in (SHIPPED[n_workers], STRIPS):
        other = predicted({"a": shipped}, shots, n_workers)
        assert auto.redundancy <= other.redundancy + 1e-9
        assert auto.makespan_s <= other.makespan_s + 1e-9


@pytest.mark.parametrize("n_shots", [16, 64])
def test_batches_decode_whole_shots_and_beat_the_shipped_grids(n_shots):
    shots = {f"s{k:02d}": SHOT_720 for k in range(n_shots)}
    grids = planner.choose_plans(shots, G, 8, H200, H200.worker_memory_bytes, memory=MEM)
    assert all(g.tiles == (1, 1, 1) for g in grids.values())
    auto = predicted(grids, shots, 8)
    shipped = predicted({n: SHIPPED[8] for n in shots}, shots, 8)
    assert auto.redundancy == 1.0 < shipped.redundancy
    assert auto.makespan_s < shipped.makespan_s


# --------------------------------------------------------------------------------------------------
# plan_job hooks
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    path = tmp_path_factory.mktemp("planner") / "job.zarr"
    return farm.synth(path, decoder="ltx2-tiny", shots=3, frames=121, height=704, width=1216)


def test_auto_is_the_default_and_plans_whole_shots_on_one_worker(job):
    assert farm.PlanOptions().tiles == "auto"
    auto = plan_job(job, farm.PlanOptions(), 1)
    explicit = plan_job(job, farm.PlanOptions(tiles=(1, 1, 1)), 1)
    assert [p.grid for p in auto] == [p.grid for p in explicit] == [TileGrid()] * 3
    assert auto == explicit


def test_explicit_tiles_win(job):
    options = farm.PlanOptions(tiles=(1, 2, 3), overlap=(0, 1, 1))
    for n_workers in (1, 2, 8):
        plans = plan_job(job, options, n_workers)
        assert all(p.grid == TileGrid((1, 2, 3), (0, 1, 1)) for p in plans)


def test_plan_job_auto_uses_the_worker_count_and_fixed_grids(job):
    # under the H200 model one shot on eight workers is split (the CPU model keeps it whole: its
    # workers share two cores)
    options = farm.PlanOptions(cost_model="ltx2-h200")
    one_shot = plan_job(job, options, 8, ["shot000"])
    assert len(one_shot[0].tiles) > 1
    assert [t.worker for t in one_shot[0].tiles] == list(range(len(one_shot[0].tiles)))
    fixed = {"shot000": TileGrid((1, 1, 2), (0, 0, 4))}
    kept = plan_job(job, options, 8, ["shot000"], fixed=fixed)
    assert kept[0].grid == fixed["shot000"]


def test_parse_tiles():
    assert parse_tiles("auto") == "auto" and parse_tiles(" AUTO ") == "auto"
    assert parse_tiles("1,2,2") == (1, 2, 2)
    with pytest.raises(FarmError, match="--tiles '2,1' is invalid; give auto or three"):
        parse_tiles("2,1")


def test_describe_reports_the_prediction():
    shots = {"a": SHOT_720}
    pred = predicted({"a": TileGrid((1, 2, 2), (0, 4, 4))}, shots, 4)
    text = planner.describe(pred, H200)
    assert "makespan" in text and "redundant work 1.31x" in text and "peak memory per worker" in text


def test_link_seconds():
    link = Link(intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e8, latency_s=0.001)
    assert link.seconds(0, same_node=True) == 0.0
    assert link.seconds(1e9, same_node=True) == pytest.approx(1.001)
    assert link.seconds(1e9, same_node=False) == pytest.approx(10.001)


def test_plan_shots_reports_the_shot_that_cannot_be_planned(tmp_path):
    """A shot too narrow for the grid is reported on its own; the others get the plans they get alone."""
    import numpy as np

    from farm.store.job import create_job, open_job, write_shot

    path = tmp_path / "job.zarr"
    spec = synth_spec("ltx2-tiny")
    create_job(path, spec)
    rng = np.random.default_rng(0)
    for name, width in (("wide", 6), ("narrow", 3), ("wide2", 6)):
        write_shot(path, name, rng.standard_normal((8, 3, 4, width)).astype(np.float32), fps=24)
    job = open_job(path)
    options = farm.PlanOptions(tiles=(1, 1, 3), overlap=(0, 0, 0))
    plans, errors = plan_shots(job, options)
    assert [p.shot for p in plans] == ["wide", "wide2"]
    assert list(errors) == ["narrow"] and "leave a tile 1 unit wide" in str(errors["narrow"])
    assert plans == [*plan_job(job, options, 1, ["wide"]), *plan_job(job, options, 1, ["wide2"])]
    # For a cluster of two workers (a render's plan once connected): the same shot fails alone, and the
    # others' tiles go round-robin over both workers across shots, as one plan of them would place them.
    on_two, errors_two = plan_shots(job, options, n_workers=2)
    assert list(errors_two) == ["narrow"] and on_two == plan_job(job, options, 2, ["wide", "wide2"])
    assert [t.worker for p in on_two for t in p.tiles] == [0, 1, 0, 1, 0, 1]
    # Every shot plannable: one call for all of them, the same plans as one by one.
    auto = farm.PlanOptions()
    together, none = plan_shots(job, auto, ["wide", "wide2"])
    alone = [*plan_job(job, auto, 1, ["wide"]), *plan_job(job, auto, 1, ["wide2"])]
    assert none == {} and together == alone


def test_auto_tiles_carry_a_lone_ltx2_shot_where_the_gpu_cost_model_says_it_pays(tmp_path):
    """Auto tiles without --chunk stream a lone shot of a causal LTX-2 decoder through its decode in
    carried chunks (its writes have nothing else to hide behind), not a job of many shots on one GPU (the
    next shot's decode hides them); never against an explicit chunk, a CPU cost model, a decoder that
    cannot carry (the released LTX-2 looks ahead) or the chunking a resumed shot's output was started with."""
    from dataclasses import replace

    from farm.decoders.ltx2 import LTX2_RELEASED
    from farm.planning.jobplan import AUTO_CARRY, plan_job
    from farm.planning.options import AUTO
    from farm.planning.tiling import plan_identity

    causal = {"family": "ltx2", "config": {**LTX2_RELEASED, "decoder_causal": True}, "dtype": "bfloat16"}
    shot = {"frames": 121, "height": 704, "width": 1216}
    one = farm.synth(tmp_path / "one.zarr", decoder=causal, shots=1, **shot)
    many = farm.synth(tmp_path / "many.zarr", decoder=causal, shots=8, **shot)
    released = farm.synth(tmp_path / "released.zarr", decoder="ltx2", shots=1, **shot)
    assert plan_job(released, farm.PlanOptions(tiles=AUTO, batch_frames=8), 1, n_io=5)[0].chunk == ChunkSize()
    auto = farm.PlanOptions(tiles=AUTO, batch_frames=8)
    (plan,) = plan_job(one, auto, 1, n_io=5)
    assert plan.chunk == AUTO_CARRY and plan_identity(plan)["carry"] == "tapered"
    assert all(p.chunk == ChunkSize() for p in plan_job(many, auto, 1, n_io=5))
    assert plan_job(one, replace(auto, chunk=ChunkSize(frames=4)), 1)[0].chunk == ChunkSize(frames=4)
    assert plan_job(one, replace(auto, cost_model="ltx2-tiny-cpu"), 1)[0].chunk == ChunkSize()
    assert plan_job(one, auto, 1, fixed_chunks={"shot000": ChunkSize()})[0].chunk == ChunkSize()
    ltxv = farm.synth(tmp_path / "ltxv.zarr", decoder="ltxv", shots=1, frames=121, height=704, width=1216)
    assert plan_job(ltxv, auto, 1, n_io=5)[0].chunk == ChunkSize()
