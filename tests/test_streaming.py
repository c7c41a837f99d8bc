"""One shot streamed through its decode: a tile split into temporal chunks decodes one chunk per task,
and its batches are written while later chunks decode. The frames are byte-identical to the same plan
decoded whole, and across worker counts."""

from __future__ import annotations

import numpy as np

import farm
from farm.inputs.synthetic import synth
from farm.media.settings import VideoSettings
from farm.planning.jobplan import plan_shots
from farm.planning.tiling import ChunkSize
from farm.store.frames import read_frames
from farm.store.job import open_job
from farm.store.output import Output
from tests.helpers import CAUSAL_LTX2_TINY

# 33 frames (5 latent frames of ltx2-tiny), 8-frame batches: 3 temporal chunks of 2 latent frames,
# overlap 1, so the first batches are complete after the first chunk
STREAMED = farm.PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=ChunkSize(frames=2))
ZARR_ONLY = VideoSettings(enabled=False)


def test_streamed_equals_whole_and_any_worker_count(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=33, height=64, width=128, seed=3)
    quiet = {"log": lambda _: None, "options": STREAMED, "video": ZARR_ONLY}
    streamed = farm.render(job, tmp_path / "s3", scheduler=scheduler3, **quiet)
    whole = farm.render(job, tmp_path / "w3", scheduler=scheduler3, stream=False, **quiet)
    single = farm.render(job, tmp_path / "s1", workers=1, **quiet)
    assert not streamed.failed and not whole.failed and not single.failed
    # streaming really split the tiles: more decode tasks than tiles
    assert streamed.tiles_total > whole.tiles_total == 2
    for shot in open_job(job).shots:
        a = read_frames(Output(tmp_path / "s3"), shot)
        assert a.shape == (33, 64, 128, 3) and np.ptp(a) > 0
        assert a.tobytes() == read_frames(Output(tmp_path / "w3"), shot).tobytes()
        assert a.tobytes() == read_frames(Output(tmp_path / "s1"), shot).tobytes()


# Carried chunks: 5 latent frames in chunks of 2 (pixel frames 0-8, 9-24 and 25-32), no overlap, each
# chunk starting from the decoder state the previous one left
CARRIED = farm.PlanOptions(
    tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=ChunkSize(frames=2, carry=True)
)


def test_carried_chunks_streamed_equal_unstreamed_any_worker_count_and_resume(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder=CAUSAL_LTX2_TINY, shots=1, frames=33, height=64, width=128, seed=5)
    quiet = {"log": lambda _: None, "video": ZARR_ONLY}
    streamed = farm.render(job, tmp_path / "s3", scheduler=scheduler3, options=CARRIED, **quiet)
    whole = farm.render(job, tmp_path / "w3", scheduler=scheduler3, options=CARRIED, stream=False, **quiet)
    single = farm.render(job, tmp_path / "s1", workers=1, options=CARRIED, **quiet)
    unchunked = farm.render(job, tmp_path / "u3", scheduler=scheduler3, options=farm.PlanOptions(
        tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8), **quiet)  # fmt: skip
    assert not any(r.failed for r in (streamed, whole, single, unchunked))
    # 3 chunks per tile, each its own task, and nothing decoded twice: 3 + 3 decodes
    assert streamed.tiles_total == 6 and whole.tiles_total == 2
    (shot,) = open_job(job).shots
    a = read_frames(Output(tmp_path / "s3"), shot)
    assert a.shape == (33, 64, 128, 3) and np.ptp(a) > 0
    assert a.tobytes() == read_frames(Output(tmp_path / "w3"), shot).tobytes()
    assert a.tobytes() == read_frames(Output(tmp_path / "s1"), shot).tobytes()
    # equal to decoding each tile whole, up to float rounding (8-bit levels may round the other way)
    diff = np.abs(a.astype(np.int16) - read_frames(Output(tmp_path / "u3"), shot).astype(np.int16))
    assert diff.max() <= 1 and diff.mean() < 0.01

    # resume: the last batch's marker removed, the render decodes the earlier chunks again for their
    # state (nothing of theirs is written) and writes the same bytes
    out = Output(tmp_path / "s3")
    last = max(out.batches_done(shot))
    out.done_marker(shot, last).unlink()
    again = farm.render(job, tmp_path / "s3", scheduler=scheduler3, options=CARRIED, **quiet)
    assert not again.failed and again.batches_total == 1 and again.tiles_total == 6
    assert read_frames(out, shot).tobytes() == a.tobytes()


def test_carried_segments_read_the_next_latent_ahead_else_their_own(tmp_path):
    """Each carried segment's task reads the next segment's latent ahead (NEXT_LATENT in its result);
    the next decodes the same pieces from it as from its own read, and a latent that cannot be read
    ahead fails the segment that needs it, with its own error, not the one reading ahead."""
    import pytest
    import torch
    import zarr

    from farm.errors import FarmError
    from farm.planning.schedule import make_schedule
    from farm.planning.tiling import assign_round_robin, plan_geometry, tile_segments
    from farm.run.graph import batch_cuts
    from farm.worker.tasks import CARRIED as CARRIED_KEY
    from farm.worker.tasks import NEXT_LATENT, decode_tile, segment_latent_frames

    job_path = tmp_path / "job.zarr"
    synth(job_path, decoder=CAUSAL_LTX2_TINY, shots=1, frames=33, height=64, width=64, seed=7)
    job = open_job(job_path)
    options = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8, chunk=ChunkSize(frames=2, carry=True))
    plans = assign_round_robin(plan_shots(job, options, list(job.shots))[0], 1)
    plan, steps = plans[0], make_schedule(plans, n_decode=1, n_io=0).decodes
    tile = plan.tiles[0]
    frames = [segment_latent_frames(s) for s in tile_segments(tile, plan_geometry(plan), plan.chunk)]
    assert len(steps) == len(frames) == 3 and [s.segment for s in steps] == [0, 1, 2]

    def chain(read_ahead: bool) -> list[dict]:
        results, previous = [], None
        for step in steps:
            out = decode_tile(str(job_path), job.spec.to_json(), tile, plan.chunk, batch_cuts(plan, step),
                              False, step.segment, previous)  # fmt: skip
            results.append(out)
            previous = out if read_ahead else {k: v for k, v in out.items() if k != NEXT_LATENT}
        return results

    ahead, own = chain(True), chain(False)
    for k, out in enumerate(ahead):
        if k + 1 < len(frames):
            assert out[NEXT_LATENT][0] == frames[k + 1] and out[NEXT_LATENT][1].shape[1] == np.subtract(
                *frames[k + 1][::-1])
        else:
            assert NEXT_LATENT not in out
        batches = [b for b in out if isinstance(b, int)]
        assert batches and all(torch.equal(out[b], own[k][b]) for b in batches)

    # the last segment's latent frames hold a NaN (no earlier segment reads them)
    assert frames[1][1] <= frames[2][0]
    latent = zarr.open_array(store=str(job_path / plan.shot / "latent"), mode="r+")
    latent[:, tile.decode_slices()[0].start + frames[2][0]] = np.nan
    with pytest.raises(FarmError, match="NaN or Inf"):
        chain(True)
    second = decode_tile(str(job_path), job.spec.to_json(), tile, plan.chunk, batch_cuts(plan, steps[1]),
                         False, 1, ahead[0])  # fmt: skip
    assert NEXT_LATENT not in second
    assert all(torch.equal(second[b], own[1][b]) for b in second if b != CARRIED_KEY)
    # the read-ahead latent is what the next segment decodes: zeros in its place change its pixels
    zeros = {**ahead[0], NEXT_LATENT: (frames[1], torch.zeros_like(ahead[0][NEXT_LATENT][1]))}
    changed = decode_tile(str(job_path), job.spec.to_json(), tile, plan.chunk, batch_cuts(plan, steps[1]),
                          False, 1, zeros)  # fmt: skip
    assert not torch.equal(changed[steps[1].feeds[0]], own[1][steps[1].feeds[0]])


def test_each_decode_workers_first_latent_is_read_before_the_graph_and_taken_by_its_decode(
    tmp_path, cluster3
):
    """`read_first_latents` reads, on each decode worker, the latent its first decode needs (a carried
    tile's first segment, or a whole tile); that decode takes it instead of reading its own, with the
    same pieces, and ignores a latent read for other frames. A latent that cannot be read ahead is
    left to the decode, which fails with its own error."""
    import pytest
    import torch
    import zarr

    from farm.errors import FarmError
    from farm.planning.schedule import make_schedule
    from farm.planning.tiling import assign_round_robin, plan_geometry, tile_segments
    from farm.run.graph import ahead_key, batch_cuts, read_first_latents, split_workers
    from farm.worker.tasks import decode_tile, read_latent_ahead, read_tile_latent, segment_latent_frames
    from farm.worker.transport import register

    register()  # this client receives the workers' tensors, as every process that does must

    job_path = tmp_path / "job.zarr"
    synth(job_path, decoder=CAUSAL_LTX2_TINY, shots=2, frames=33, height=64, width=128, seed=5)
    job = open_job(job_path)
    workers, _ = split_workers(cluster3)
    chunk = ChunkSize(2, carry=True)
    carried = farm.PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=chunk)
    cases = ((carried, True), (carried, False), (farm.PlanOptions(tiles=(1, 1, 1)), True))
    for case, (options, stream) in enumerate(cases):
        plans = assign_round_robin(plan_shots(job, options, list(job.shots))[0], len(workers))
        render_id = f"t{case}"  # keys are per render
        ahead = read_first_latents(cluster3, plans, workers, 0, job_path=str(job_path),
                                   spec_json=job.spec.to_json(), render_id=render_id,
                                   stream=stream)  # fmt: skip
        firsts: dict[int, object] = {}
        decodes = make_schedule(plans, n_decode=len(workers), n_io=0, stream=stream).decodes
        for step in decodes:
            firsts.setdefault(step.slot, step)
        # one read per decode worker, for its first decode, keyed by shot name, tile and segment
        assert set(ahead) == {ahead_key(plans[s.shot], s) for s in firsts.values()}
        assert len(ahead) == min(len(workers), len({(d.shot, d.tile) for d in decodes}))
        for slot, step in firsts.items():
            future, plan = ahead[ahead_key(plans[step.shot], step)], plans[step.shot]
            tile = plan.tiles[step.tile]
            assert future.key[:4] == ("read-latent", render_id, plan.shot, tile.index)
            frames, latent, _ = future.result()  # and the digests of the chunks read
            assert set(cluster3.who_has(future)[future.key]) == {workers[slot]}  # read on its decoder
            if step.segment >= 0:
                segments = tile_segments(tile, plan_geometry(plan), plan.chunk)
                assert frames == segment_latent_frames(segments[step.segment])
                assert torch.equal(latent, read_tile_latent(str(job_path), tile, slice(*frames)))
            else:
                assert frames is None and torch.equal(latent, read_tile_latent(str(job_path), tile))
            cuts = batch_cuts(plan, step)
            args = (str(job_path), job.spec.to_json(), tile, plan.chunk, cuts, False, step.segment)
            own = decode_tile(*args, None, None)
            taken = decode_tile(*args, None, (frames, torch.zeros_like(latent)))  # zeros: proves it was used
            ignored = decode_tile(*args, None, ((99, 100), torch.zeros_like(latent)))  # other frames
            batches = [b for b in own if isinstance(b, int)]
            assert all(torch.equal(own[b], ignored[b]) for b in batches)
            assert any(not torch.equal(own[b], taken[b]) for b in batches)
            assert all(torch.equal(own[b], decode_tile(*args, None, (frames, latent))[b]) for b in batches)
    # a latent that cannot be read: nothing read ahead, and the decode reports its own error
    bad_tile = assign_round_robin(plan_shots(job, carried, ["shot000"])[0], 1)[0].tiles[0]
    latents = zarr.open_array(store=str(job_path / "shot000" / "latent"), mode="r+")
    latents[:, 0] = np.nan
    assert read_latent_ahead(str(job_path), bad_tile, None) is None
    with pytest.raises(FarmError, match="NaN"):
        decode_tile(str(job_path), job.spec.to_json(), bad_tile, ChunkSize(), [], False, -1, None, None)


def test_a_shot_dropped_at_the_hash_keeps_its_latent_read_ahead_to_itself(tmp_path, scheduler3):
    """A fresh OUT on a running cluster reads each decode worker's first latent before the latents'
    hash is in. A shot whose later latent chunk is corrupt reads its first segment fine, then drops out
    at the hash: the shot after it, now first, must decode its own latent, not the one read for the
    dropped shot (reads are keyed by shot name, tile and segment, not by position)."""
    carried = farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8, chunk=ChunkSize(frames=2, carry=True))
    quiet = {"log": lambda _: None, "options": carried, "video": ZARR_ONLY}
    job = tmp_path / "job.zarr"
    synth(job, decoder=CAUSAL_LTX2_TINY, shots=2, frames=81, height=64, width=64, seed=4)  # 11 latent frames
    alone = farm.render(job, tmp_path / "alone", scheduler=scheduler3, shots=["shot001"], **quiet)
    assert not alone.failed
    (job / "shot000" / "latent" / "c" / "0" / "1" / "0" / "0").write_bytes(b"not a zstd chunk")  # frames 8-10
    stats = farm.render(job, tmp_path / "out", scheduler=scheduler3, **quiet)
    assert [s.shot for s in stats.failed] == ["shot000"]
    mine = read_frames(Output(tmp_path / "out"), "shot001")
    assert mine.tobytes() == read_frames(Output(tmp_path / "alone"), "shot001").tobytes()
