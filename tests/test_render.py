"""End-to-end renders on a real local Dask cluster, checked against independent in-process decodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import zarr

import farm
from farm.decoders import spec_from_json
from farm.decoders.ltx2 import LTX2Decoder
from farm.inputs.synthetic import synth_spec
from farm.media import video
from farm.media.settings import VideoSettings
from farm.planning.budgets import (
    default_window,
    host_memory_warning,
    host_peak_bytes,
    memory_warning,
    tile_peak_bytes,
    window_peak_bytes,
)
from farm.planning.jobplan import plan_job
from farm.planning.options import AUTO
from farm.run.cluster import smallest_memory_limit
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output
from tests.helpers import assert_same_video, save_weights


def reference_frames(job_path, options: farm.PlanOptions) -> dict[str, np.ndarray]:
    """Decode every tile of every shot in this process, weight by its ramps, sum in tile order.

    With one torch thread, as the 3 workers on this 2-core machine decode: oneDNN's convolutions may
    round differently with another thread count (a level off in a few pixels on some CPUs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_frames(job_path, options)
    finally:
        torch.set_num_threads(threads)


def _reference_frames(job_path, options: farm.PlanOptions) -> dict[str, np.ndarray]:
    job = open_job(job_path)
    model = LTX2Decoder.build(job.spec)
    out = {}
    for plan in plan_job(job, options, 1):
        latent = np.asarray(zarr.open_array(store=str(job_path / plan.shot / "latent"), mode="r")[...])
        full = torch.zeros((3, *plan.pixel_shape), dtype=torch.float32)
        for tile in plan.tiles:
            block = torch.from_numpy(latent[(slice(None), *tile.decode_slices())])
            with torch.inference_mode():
                pixels = (model.decode(block[None], return_dict=False)[0][0].float() + 1.0) / 2.0
            head, tail = tile.context * 8, tile.lookahead * 8  # context frames decoded, then dropped
            top, bottom, left, right = (m * 32 for m in tile.halo)  # and the halo
            pixels = pixels[:, head : pixels.shape[1] - tail, top : pixels.shape[2] - bottom,
                            left : pixels.shape[3] - right]  # fmt: skip
            wf, wh, ww = (torch.tensor(s.weights, dtype=torch.float32) for s in tile.pixels)
            pixels = pixels * wf.view(-1, 1, 1) * wh.view(1, -1, 1) * ww.view(1, 1, -1)
            (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in tile.pixels)
            full[:, f0:f1, h0:h1, w0:w1] += pixels
        frames = torch.round(full.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 3, 0).numpy()
        out[plan.shot] = frames
    return out


TILED = farm.PlanOptions(tiles=(2, 2, 2), overlap=(1, 1, 2), batch_frames=8)


def test_tiled_render_equals_in_process_reference(tiny_job, tmp_path, scheduler3):
    stats = farm.render(tiny_job, tmp_path / "out", scheduler=scheduler3, options=TILED, log=lambda _: None)
    assert not stats.failed
    expected = reference_frames(tiny_job, TILED)
    out = Output(tmp_path / "out")
    for shot, frames in expected.items():
        got = read_frames(out, shot)
        assert got.shape == frames.shape
        np.testing.assert_array_equal(got, frames)
    assert stats.frames_written == sum(f.shape[0] for f in expected.values())
    # the window held fewer tiles than the job has: tiles were streamed, not gathered
    assert stats.max_tiles_held <= stats.window < stats.tiles_total
    # the set-up's steps, in order, account for all of it (a fresh OUT joining a running cluster: the
    # latents are hashed while the client connects, what is left of that is waited for after it)
    assert list(stats.setup_phases) == ["read and plan the job", "connect, check the workers",
                                        "hash the latents", "check what OUT holds",
                                        "size the window, start the outputs", "start the graph"]  # fmt: skip
    assert sum(stats.setup_phases.values()) == pytest.approx(stats.setup_s, abs=1e-6) and stats.setup_s > 0


def test_auto_tiles_joining_a_running_cluster_are_planned_once_for_its_workers(
    tiny_job, tmp_path, scheduler3, monkeypatch
):
    """A fresh OUT joining a running cluster has nothing to check before connecting: `--tiles auto`
    searches once, for the cluster's three workers, not once for one worker and again after connecting."""
    import farm.planning.jobplan

    searched: list[int] = []
    plan_job = farm.planning.jobplan.plan_job

    def counted(job, options, n_workers, *args, **kwargs):
        searched.append(n_workers)
        return plan_job(job, options, n_workers, *args, **kwargs)

    monkeypatch.setattr(farm.planning.jobplan, "plan_job", counted)
    auto = farm.PlanOptions(batch_frames=8)
    assert auto.tiles == AUTO
    stats = farm.render(tiny_job, tmp_path / "out", scheduler=scheduler3, options=auto, log=lambda _: None)
    assert not stats.failed and searched == [3]
    assert list(stats.setup_phases)[:3] == ["read the job", "connect, check the workers",
                                            "plan the job for the cluster"]  # fmt: skip
    expected = plan_job(open_job(tiny_job), auto, 3, video=True)
    assert stats.tiles_total == sum(len(p.tiles) for p in expected)
    assert stats.frames_written == sum(p.pixel_shape[0] for p in expected)
    # an OUT that exists is checked before connecting: planned first, then again for the cluster
    searched.clear()
    farm.render(tiny_job, tmp_path / "out", scheduler=scheduler3, options=auto, log=lambda _: None)
    assert searched[0] == 1


def test_auto_tiles_of_a_render_starting_its_own_cluster_are_planned_once(tiny_job, tmp_path, monkeypatch):
    """A render that starts its own cluster knows its size before it starts: `--tiles auto` searches once,
    for the two workers it starts (and the I/O workers beside them), not again once they are up."""
    import farm.planning.jobplan

    searched: list[tuple[int, int]] = []
    plan_job = farm.planning.jobplan.plan_job

    def counted(job, options, n_workers, *args, **kwargs):
        searched.append((n_workers, kwargs.get("n_io", 0)))
        return plan_job(job, options, n_workers, *args, **kwargs)

    monkeypatch.setattr(farm.planning.jobplan, "plan_job", counted)
    stats = farm.render(tiny_job, tmp_path / "out", workers=2, options=farm.PlanOptions(batch_frames=8),
                        log=lambda _: None)  # fmt: skip
    assert not stats.failed and [n for n, _ in searched] == [2]
    assert "plan the job for the cluster" not in stats.setup_phases


def test_one_and_three_workers_give_identical_bytes(tiny_job, tmp_path, scheduler3):
    one = farm.render(tiny_job, tmp_path / "w1", workers=1, options=TILED, log=lambda _: None)
    three = farm.render(tiny_job, tmp_path / "w3", scheduler=scheduler3, options=TILED, log=lambda _: None)
    assert not one.failed and not three.failed
    for shot in open_job(tiny_job).shots:
        a = read_frames(Output(tmp_path / "w1"), shot)
        b = read_frames(Output(tmp_path / "w3"), shot)
        assert a.tobytes() == b.tobytes()


def test_single_tile_matches_plain_vae_decode(tiny_job, tmp_path, scheduler3):
    one_tile = farm.PlanOptions(tiles=(1, 1, 1))
    farm.render(tiny_job, tmp_path / "out", scheduler=scheduler3, options=one_tile, log=lambda _: None)
    job = open_job(tiny_job)
    model = LTX2Decoder.build(job.spec)
    for shot in job.shots:
        latent = torch.from_numpy(np.asarray(zarr.open_array(store=str(tiny_job / shot / "latent"))[...]))
        with torch.inference_mode():
            decoded = model.decode(latent[None]).sample[0]  # [3, F, H, W] in [-1, 1]
        plain = ((decoded + 1) / 2).clamp(0, 1).mul(255).permute(1, 2, 3, 0).numpy()
        got = read_frames(Output(tmp_path / "out"), shot).astype(np.float64)
        assert got.shape == plain.shape
        assert np.abs(got - plain).max() <= 1.0


def test_videos_match_frames(tiny_job, tmp_path, scheduler3):
    out = Output(tmp_path / "out")
    stats = farm.render(
        tiny_job,
        out.root,
        scheduler=scheduler3,
        options=TILED,
        video=VideoSettings(crf=0),
        log=lambda _: None,
    )
    job = open_job(tiny_job)
    for shot, info in job.shots.items():
        assert stats.shots[shot].video == str(out.video(shot))
        meta = video.probe(out.video(shot))
        frames = read_frames(out, shot)
        assert meta.frames == frames.shape[0]
        assert (meta.height, meta.width) == frames.shape[1:3]
        assert float(meta.fps) == pytest.approx(info.fps)
        assert meta.codec == "h264" and meta.pix_fmt == "yuv420p"
        assert "RANDOM" in meta.metadata.get("comment", "")
        # Random-weight frames are colour noise, which yuv420p's half-resolution chroma cannot hold
        # (tests/test_video.py checks RGB on smooth patterns); luma must survive a crf-0 encode.
        decoded = video.read_frames(out.video(shot))
        assert decoded.shape == frames.shape
        assert np.abs(luma(decoded) - luma(frames)).mean() < 3.0
    # the render reports what its segments were written at, which the joined videos hold (the container
    # adds a few hundred bytes a shot)
    video_bits = sum(out.video(shot).stat().st_size for shot in job.shots) * 8
    pixels = sum(read_frames(out, shot)[..., 0].size for shot in job.shots)
    assert stats.encoded_bits_per_pixel == pytest.approx(video_bits / pixels, rel=0.05)
    # segments are joined and removed; every batch has its done marker
    assert not any((out.root / ".farm" / "segments").rglob("*.mp4"))
    for shot in job.shots:
        plan = plan_job(job, TILED, 1, [shot])[0]
        assert out.batches_done(shot) == set(range(len(plan.batches)))
    root = zarr.open_group(store=str(out.frames_zarr), mode="r")
    assert root.attrs["farm"]["random_weights"] is True


def luma(frames: np.ndarray) -> np.ndarray:
    rgb = frames.astype(np.float64)
    return 0.2126 * rgb[..., 0] + 0.7152 * rgb[..., 1] + 0.0722 * rgb[..., 2]


@pytest.mark.model
@pytest.mark.parametrize("form", ["folder", "file"])
def test_weights_load_from_folder_and_single_file(tmp_path, form):
    from farm.decoders import load_decoder

    source = LTX2Decoder.build(synth_spec("ltx2-tiny", seed=123))
    path = save_weights(source, tmp_path, form)
    spec = spec_from_json({"family": "ltx2", "config": "ltx2-tiny", "weights": {"path": str(path)}})
    assert not spec.random_weights
    decoder = load_decoder(spec)
    latent = torch.randn(8, 2, 3, 2, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = (source.decode(latent[None]).sample[0] + 1) / 2
    assert torch.equal(decoder.decode(latent), expected)


@pytest.mark.model  # builds or imports diffusers models
def test_weights_for_another_config_are_refused(tmp_path):
    from farm.decoders import load_decoder
    from farm.errors import FarmError

    other = LTX2Decoder.build(
        spec_from_json({"family": "ltx2", "config": {**synth_spec("ltx2-tiny").config,
                           "decoder_block_out_channels": [16, 32, 64]}, "weights": {"random_seed": 0}})
    )  # fmt: skip
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in other.state_dict().items()}, str(tmp_path / "w.safetensors"))
    spec = spec_from_json(
        {"family": "ltx2", "config": "ltx2-tiny", "weights": {"path": str(tmp_path / "w.safetensors")}}
    )
    with pytest.raises(FarmError, match="do not match the decoder config"):
        load_decoder(spec)


def test_spec_without_weights_is_an_error():
    from farm.errors import FarmError

    with pytest.raises(FarmError, match="never initialises a decoder with random weights"):
        spec_from_json({"family": "ltx2", "config": "ltx2-tiny"})
    with pytest.raises(FarmError, match="does not exist"):
        spec_from_json({"family": "ltx2", "config": "ltx2-tiny", "weights": {"path": "/nonexistent/vae"}})


def test_intra_worker_chunks_equal_the_same_split_across_workers(tiny_job, tmp_path, scheduler3):
    """Chunking a tile inside a worker blends exactly like tiling the shot the same way across workers."""
    from farm.planning.tiling import ChunkSize

    chunked = farm.PlanOptions(
        tiles=(1, 1, 1), chunk=ChunkSize(height=2, width=4, overlap=(0, 1, 1)), batch_frames=8
    )
    equivalent = {  # the size-based chunk split, written as count-based grids
        "shot000": farm.PlanOptions(tiles=(1, 3, 2), overlap=(0, 1, 1), batch_frames=8),  # latent 3x4x6
        "b-shot.2": farm.PlanOptions(tiles=(1, 2, 1), overlap=(0, 1, 0), batch_frames=8),  # latent 4x3x4
    }
    farm.render(tiny_job, tmp_path / "chunked", scheduler=scheduler3, options=chunked, log=lambda _: None)
    for shot, options in equivalent.items():
        farm.render(tiny_job, tmp_path / shot, scheduler=scheduler3, options=options, shots=[shot], log=print)
        a = read_frames(Output(tmp_path / "chunked"), shot)
        b = read_frames(Output(tmp_path / shot), shot)
        np.testing.assert_array_equal(a, b)


def _gpu_settings() -> tuple:
    import os

    import dask

    ucx_context = dask.config.get("distributed-ucxx.create-cuda-context", None)
    return os.environ.get("CUDA_VISIBLE_DEVICES"), ucx_context


def test_io_workers_write_and_encode_the_same_bytes(tiny_job, tmp_path, scheduler3):
    """Writing and encoding (and making the output arrays) on separate I/O worker processes changes
    where, not what, is written."""
    from distributed import get_task_stream
    from distributed.utils import key_split

    from farm.run.cluster import connect
    from farm.run.graph import split_workers

    with connect(workers=1, io_workers=2) as client:
        decode, io = split_workers(client)
        assert len(decode) == 1 and len(io) == 2
        # I/O workers see no GPU and never ask UCX for a CUDA context (beside a UCX cluster, inheriting
        # the parent's request made them fail to start)
        seen = client.run(_gpu_settings, workers=io)
        assert set(seen.values()) == {("", False)}
        address = client.scheduler.address
        with get_task_stream(client) as stream:
            farm.render(tiny_job, tmp_path / "io", scheduler=address, options=TILED, log=lambda _: None)
    placed: dict[str, dict] = {}  # task kind → key → worker
    for t in stream.data:
        placed.setdefault(key_split(t["key"]), {})[t["key"]] = t["worker"]
    for kind in ("write-batch", "encode-segment"):  # on I/O workers, but for the decode worker's last
        on_decode = [k for k, w in placed[kind].items() if w in decode]  # batch: the render's tail, with
        assert len(on_decode) <= 1 and len(placed[kind]) > 2  # nothing left to hide its transfer behind
        assert set(placed[kind].values()) - set(decode) <= set(io)
    where = {kind: set(keys.values()) for kind, keys in placed.items()}
    assert where["prepare-output"] <= set(io)  # the output arrays too: not on the render's process
    assert where["decode-tile"] <= set(decode)
    farm.render(tiny_job, tmp_path / "plain", scheduler=scheduler3, options=TILED, log=lambda _: None)
    for shot in open_job(tiny_job).shots:
        assert (
            read_frames(Output(tmp_path / "io"), shot).tobytes()
            == read_frames(Output(tmp_path / "plain"), shot).tobytes()
        )
        assert_same_video(Output(tmp_path / "io").video(shot), Output(tmp_path / "plain").video(shot))


def test_chunked_tile_peak_counts_the_blend_buffer():
    from farm.planning.tiling import ChunkSize, plan_chunks, plan_shot

    spec = synth_spec("ltx2")
    g = LTX2Decoder.geometry_for_spec(spec)
    whole = plan_shot("s", (128, 16, 22, 38), g).tiles[0]
    chunk = ChunkSize(height=11, width=19)
    # a chunk decodes its halo too
    largest = max(math.prod(g.pixel_shape(c.decoded_fhw)) for c in plan_chunks((16, 22, 38), g, chunk))
    assert tile_peak_bytes(LTX2Decoder, spec, whole, ChunkSize()) == LTX2Decoder.peak_bytes(
        spec, 121 * 704 * 1216
    )
    assert tile_peak_bytes(LTX2Decoder, spec, whole, chunk) == (
        LTX2Decoder.peak_bytes(spec, largest) + 12 * 121 * 704 * 1216
    )


def test_memory_warning_names_the_shot_and_the_fix():
    from farm.planning.tiling import ChunkSize, plan_shot

    spec = synth_spec("ltx2")
    g = LTX2Decoder.geometry_for(spec.config)
    plan = plan_shot("big", (128, 16, 34, 60), g)  # 121x1088x1920 untiled: ~20 GiB estimated
    warning = memory_warning([plan], spec, 16 * 2**30)
    assert warning and "shot 'big'" in warning and "--chunk" in warning and "--tiles" in warning
    assert memory_warning([plan], spec, 141 * 2**30) is None  # an H200 holds it
    # chunks bound it (each decodes its halo: the chunks are smaller than a halo-free bound would need)
    chunked = plan_shot("big", (128, 16, 34, 60), LTX2Decoder.geometry_for_spec(spec),
                        chunk=ChunkSize(height=6, width=10))  # fmt: skip
    assert memory_warning([chunked], spec, 16 * 2**30) is None
    assert memory_warning([plan], spec, None) is None  # CPU cluster: nothing to compare


def test_default_window_fills_the_gpu_between_two_and_eight_tiles_per_worker():
    from farm.planning.tiling import plan_shot

    spec = synth_spec("ltx2")
    g = LTX2Decoder.geometry_for(spec.config)
    plans = [plan_shot(f"s{k}", (128, 16, 22, 38), g) for k in range(3)]  # whole 121x704x1216 shots
    tile = plans[0].tiles[0]
    decode = tile_peak_bytes(LTX2Decoder, spec, tile, plans[0].chunk)
    held = 12 * tile.pixel_volume
    gib = 2**30
    assert default_window(plans, spec, 141 * gib, 1) == 8  # an H200: capped at 8
    assert default_window(plans, spec, 141 * gib, 4) == 32
    free = 0.9 * 24 * gib - decode  # a 24 GiB card: what fits beside the decode
    assert default_window(plans, spec, 24 * gib, 1) == int(free // held) < 8
    assert default_window(plans, spec, 14 * gib, 2) == 4  # nothing fits: still 2 per worker
    assert default_window(plans, spec, None, 3) is None  # CPU cluster: run_graph's default
    assert window_peak_bytes(plans, spec, 8) == decode + 7 * held
    assert window_peak_bytes(plans, spec, 1) == decode


def test_host_memory_bound_for_blended_batches(scheduler3):
    from distributed import Client

    from farm.planning.tiling import plan_shot
    from farm.run.graph import split_workers

    spec = synth_spec("ltx2")
    g = LTX2Decoder.geometry_for(spec.config)
    plans = [plan_shot("s", (128, 16, 22, 38), g)]  # one whole 121x704x1216 shot: 4 batches
    frame = 704 * 1216
    assert host_peak_bytes(plans, 1, VideoSettings()) == int(121 * frame * 4.5)  # uint8 + yuv420p
    assert host_peak_bytes(plans, 8, VideoSettings(enabled=False)) == 8 * 121 * frame * 3
    assert (
        host_peak_bytes(plans, 1, VideoSettings(frames_dtype="float16", codec="prores_hq")) == 121 * frame * 6
    )
    assert host_memory_warning(100, 1000) is None
    warning = host_memory_warning(700, 1000)
    assert warning and "--window or --batch-frames" in warning and "60%" in warning
    assert host_memory_warning(700, None) is None
    with Client(scheduler3) as client:
        limit = smallest_memory_limit(client, split_workers(client)[0])
    assert limit is not None and limit > 2**20  # the session cluster's workers have Dask's "auto" limit
