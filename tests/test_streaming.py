"""One shot streamed through its decode: a tile split into temporal chunks decodes one chunk per task,
and its batches are written while later chunks decode. The frames are byte-identical to the same plan
decoded whole, and across worker counts."""

from __future__ import annotations

import numpy as np

import farm.render as fr
from farm.output import Output, read_frames
from farm.store import open_job
from farm.synthetic import synth
from farm.tasks import VideoSettings
from farm.tiling import ChunkSize

# 33 frames (5 latent frames of ltx2-tiny), 8-frame batches: 3 temporal chunks of 2 latent frames,
# overlap 1, so the first batches are complete after the first chunk
STREAMED = fr.PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=ChunkSize(frames=2))
ZARR_ONLY = VideoSettings(enabled=False)


def test_streamed_equals_whole_and_any_worker_count(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=33, height=64, width=128, seed=3)
    quiet = {"log": lambda _: None, "options": STREAMED, "video": ZARR_ONLY}
    streamed = fr.render(job, tmp_path / "s3", scheduler=scheduler3, **quiet)
    whole = fr.render(job, tmp_path / "w3", scheduler=scheduler3, stream=False, **quiet)
    single = fr.render(job, tmp_path / "s1", workers=1, **quiet)
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
CARRIED = fr.PlanOptions(
    tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8, chunk=ChunkSize(frames=2, carry=True)
)


def test_carried_chunks_streamed_equal_unstreamed_any_worker_count_and_resume(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=33, height=64, width=128, seed=5)
    quiet = {"log": lambda _: None, "video": ZARR_ONLY}
    streamed = fr.render(job, tmp_path / "s3", scheduler=scheduler3, options=CARRIED, **quiet)
    whole = fr.render(job, tmp_path / "w3", scheduler=scheduler3, options=CARRIED, stream=False, **quiet)
    single = fr.render(job, tmp_path / "s1", workers=1, options=CARRIED, **quiet)
    unchunked = fr.render(job, tmp_path / "u3", scheduler=scheduler3, options=fr.PlanOptions(
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
    again = fr.render(job, tmp_path / "s3", scheduler=scheduler3, options=CARRIED, **quiet)
    assert not again.failed and again.batches_total == 1 and again.tiles_total == 6
    assert read_frames(out, shot).tobytes() == a.tobytes()
