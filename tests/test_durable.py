"""Durable before done: a batch's chunk files, segment and images reach the disk (fsync) before its
done marker is created, so a power cut never leaves a batch marked done with frames missing."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from farm.media.names import is_farm_temporary
from farm.planning.tiling import Batch
from farm.store.frames import chunk_files, create_frames_array, write_frames
from farm.store.output import Output
from farm.worker.tasks import (
    BlendedFrames,
    VideoSettings,
    encode_batch,
    mark_batch,
    write_and_mark_batch,
    write_batch,
    write_sequence,
)


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the path of every fsync'd descriptor, in order (the real fsync still runs)."""
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def marker_temporary(marker: str, synced: list[str] | None = None) -> str:
    """The temporary a marker was written as (farm's form, `farm.media.names.FARM_TEMP`), among `synced`'s."""
    found = [p for p in synced or [] if Path(p).parent == Path(marker).parent
             and is_farm_temporary(Path(p).name) and Path(p).name.startswith(f".{Path(marker).name}.")]
    assert found, f"no temporary of {marker} was fsync'd"
    return found[0]


def out_with_shot(tmp_path: Path, frames: int = 16, batch: int = 8) -> Output:
    out = Output(tmp_path / "out")
    (out.root / ".farm" / "segments" / "a").mkdir(parents=True)
    create_frames_array(out.frames_zarr, "a", (frames, 16, 24), batch)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to name descriptors")
def test_chunks_segment_and_images_are_synced_before_the_marker(tmp_path: Path, synced: list[str]) -> None:
    out = out_with_shot(tmp_path)
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (8, 16, 24, 3), dtype=np.uint8)
    batch = Batch(shot="a", index=1, start=8, stop=16, tiles=(0,))
    video = VideoSettings(sequence="png8", preset="ultrafast")
    blended = BlendedFrames(rgb)
    write_batch(out, batch, blended)
    encode_batch(out, batch, blended, 24.0, video, {})
    write_sequence(out, batch, blended, video)
    marker_at = len(synced)
    mark_batch(out, batch, 0.0, 0.0)

    arr = zarr.open_array(store=str(out.frames_zarr / "a" / "frames"), mode="r")
    chunks = [str(p) for p in chunk_files(out.frames_zarr / "a" / "frames", arr, 8, 16)]
    assert chunks and all(Path(c).exists() for c in chunks)
    before = synced[:marker_at]
    assert set(chunks) <= set(before), "every chunk file of the batch is fsync'd before the marker"
    assert str(out.segment("a", 1)) in before
    images = sorted((out.sequence_dir("a")).glob("a.*.png"))
    assert len(images) == 8 and {str(p) for p in images} <= set(before)
    # the chunk folders too (new names are durable only once their folder is synced)
    assert str(Path(chunks[0]).parent) in before
    marker = str(out.done_marker("a", 1))
    assert marker_temporary(marker, synced[marker_at:]) and Path(marker).exists()
    assert json.loads(Path(marker).read_bytes())["segment"]["name"] == out.segment("a", 1).name  # checksums
    # the other batch's chunk was never written, so nothing of it was touched
    assert not any(c.endswith("/c/0/0/0/0") for c in before)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to name descriptors")
def test_a_zarr_only_batch_written_and_marked_in_one_task_syncs_its_chunks_first(
    tmp_path: Path, synced: list[str]
) -> None:
    out = out_with_shot(tmp_path)
    rgb = np.random.default_rng(1).integers(0, 256, (8, 16, 24, 3), dtype=np.uint8)
    batch = Batch(shot="a", index=1, start=8, stop=16, tiles=(0,))
    result = write_and_mark_batch(out, batch, BlendedFrames(rgb))
    assert (result["batch"], result["frames"], result["encode_s"]) == (1, 8, 0.0) and result["write_s"] > 0
    marker = str(out.done_marker("a", 1))
    arr = zarr.open_array(store=str(out.frames_zarr / "a" / "frames"), mode="r")
    chunks = [str(p) for p in chunk_files(out.frames_zarr / "a" / "frames", arr, 8, 16)]
    marker_at = synced.index(marker_temporary(marker, synced))
    assert chunks and set(chunks) | {str(Path(chunks[0]).parent)} <= set(synced[:marker_at])
    assert Path(marker).exists() and np.array_equal(arr[8:16], rgb)


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to name descriptors")
def test_a_batchs_chunks_are_flushed_side_by_side_then_their_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The four chunk files of a 32-frame batch are fsync'd at the same time (each waits at a barrier
    for the other three: one after another would time out), and their folders only after all four."""
    out = out_with_shot(tmp_path, frames=64, batch=32)
    rgb = np.random.default_rng(2).integers(0, 256, (32, 16, 24, 3), dtype=np.uint8)
    barrier = threading.Barrier(4, timeout=10)
    order: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isfile(name):
            barrier.wait()
        order.append(name)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_frames(out, "a", 32, rgb)
    array_dir = out.frames_array("a")
    arr = zarr.open_array(store=str(array_dir), mode="r")
    chunks = {str(p) for p in chunk_files(array_dir, arr, 32, 64)}
    assert len(chunks) == 4 and set(order[:4]) == chunks
    assert str(array_dir) in order[4:] and str(Path(next(iter(chunks))).parent) in order[4:]
    assert (np.asarray(arr[32:64]) == rgb).all()


def test_a_failed_flush_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An fsync error on any chunk reaches the writer (so its batch is never marked done)."""
    out = out_with_shot(tmp_path, frames=32, batch=32)
    real = os.fsync
    calls = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output"):
        write_frames(out, "a", 0, np.zeros((32, 16, 24, 3), dtype=np.uint8) + 9)


def test_chunk_files_cover_exactly_the_batch(tmp_path: Path) -> None:
    out = out_with_shot(tmp_path, frames=24, batch=8)
    arr = zarr.open_array(store=str(out.frames_zarr / "a" / "frames"), mode="r")
    names = [p.relative_to(out.frames_zarr / "a" / "frames").as_posix() for p in
             chunk_files(out.frames_zarr / "a" / "frames", arr, 8, 24)]  # fmt: skip
    assert names == ["c/1/0/0/0", "c/2/0/0/0"]


def test_not_durable_skips_the_fsyncs(tmp_path: Path, synced: list[str]) -> None:
    out = out_with_shot(tmp_path)
    rgb = np.full((8, 16, 24, 3), 7, dtype=np.uint8)
    batch = Batch(shot="a", index=0, start=0, stop=8, tiles=(0,))
    write_batch(out, batch, BlendedFrames(rgb), False)
    assert synced == []
    got = zarr.open_array(store=str(out.frames_zarr / "a" / "frames"), mode="r")[:8]
    assert (np.asarray(got) == 7).all()


@pytest.mark.parametrize("pipeline", ["default", "zarrs"])
def test_fast_codecs_write_what_zarr_python_reads(tmp_path: Path, pipeline: str) -> None:
    """Frames written through the zarrs pipeline (when installed) read back equal with zarr-python's."""
    import subprocess
    import sys
    import textwrap

    if pipeline == "zarrs":
        pytest.importorskip("zarrs")
    out = out_with_shot(tmp_path, frames=16, batch=8)
    # a fresh process, as a worker is: the pipeline is chosen there, at its first write
    script = textwrap.dedent(f"""
        import numpy as np, zarr
        from pathlib import Path
        from farm.store.frames import use_fast_codecs, write_frames
        from farm.store.output import Output
        rgb = np.random.default_rng(1).integers(0, 256, (16, 16, 24, 3), dtype=np.uint8)
        write_frames(Output(Path({str(out.root)!r})), "a", 0, rgb)
        print(zarr.config.get("codec_pipeline.path"))
    """)
    env = {**os.environ, "FARM_ZARRS": "1" if pipeline == "zarrs" else "0"}
    used = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert ("zarrs" in used.stdout) == (pipeline == "zarrs")
    rgb = np.random.default_rng(1).integers(0, 256, (16, 16, 24, 3), dtype=np.uint8)
    got = np.asarray(zarr.open_array(store=str(out.frames_array("a")), mode="r")[...])
    assert (got == rgb).all()


def test_latents_are_read_through_zarr_pythons_pipeline_on_a_worker_that_writes_with_zarrs(
    tmp_path: Path,
) -> None:
    """A worker that has written frames runs zarrs for its Zarr I/O, which is slower for the part of a
    chunk a carried segment reads; its latent reads still go through zarr-python's own pipeline, with
    the same values, and leave the process' choice as it was."""
    pytest.importorskip("zarrs")
    from farm.inputs.synthetic import synth
    from farm.store.frames import ZARRS_PIPELINE
    from farm.store.job import ZARR_PYTHON_PIPELINE, read_latent

    job = tmp_path / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=1, frames=33, height=64, width=96, seed=2)
    region = (slice(1, 4), slice(0, 2), slice(1, 3))
    whole = np.asarray(zarr.open_array(store=str(job / "shot000" / "latent"), mode="r")[...])
    opened_with = []
    real_open = zarr.open_array

    def recording_open(*args, **kwargs):
        opened_with.append(zarr.config.get("codec_pipeline.path"))
        return real_open(*args, **kwargs)

    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):  # as after `use_fast_codecs`
        zarr.open_array = recording_open
        try:
            block = read_latent(job, "shot000", region)
        finally:
            zarr.open_array = real_open
        assert zarr.config.get("codec_pipeline.path") == ZARRS_PIPELINE
    assert opened_with == [ZARR_PYTHON_PIPELINE]
    assert (block == whole[(slice(None), *region)]).all()


def test_frame_chunks_hold_at_most_frame_chunk_mib_and_whole_batches(tmp_path: Path) -> None:
    """`farm.frame-chunk-mib` bounds a chunk's bytes (never below one frame, never across batches), so
    one batch of large frames is several chunks written side by side; the frames read back the same."""
    from farm.errors import FarmError
    from farm.run.validate import check_video_settings
    from farm.store.frames import chunk_frames

    hd = 1088 * 1920 * 3
    assert [chunk_frames(8, hd, mib) for mib in (64, 16, 8, 4)] == [8, 2, 1, 1]
    assert chunk_frames(8, 704 * 1216 * 3, 8) == 2 and chunk_frames(12, 704 * 1216 * 3, 8) == 3
    assert chunk_frames(32, 64 * 96 * 3, 8) == 8 and chunk_frames(6, hd) == 6  # small frames: 8 at most
    out = Output(tmp_path / "out")
    create_frames_array(out.frames_zarr, "a", (16, 512, 512), 8, "float16", 24.0, chunk_mib=1)
    arr = zarr.open_array(str(out.frames_array("a")), mode="r")
    assert arr.chunks == (1, 512, 512, 3)  # 1.5 MiB a frame: one frame a chunk
    frames = np.random.default_rng(0).random((8, 512, 512, 3)).astype(np.float16)
    write_frames(out, "a", 8, frames)
    assert len(chunk_files(out.frames_array("a"), arr, 8, 16)) == 8
    np.testing.assert_array_equal(np.asarray(arr[8:16]), frames)
    with pytest.raises(FarmError, match="farm.frame-chunk-mib 0 is invalid"):
        check_video_settings(VideoSettings(enabled=False, frame_chunk_mib=0))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc to name descriptors")
@pytest.mark.parametrize("durable", [True, False])
def test_a_joined_video_is_synced_before_its_marker_and_the_segments_go(
    tmp_path: Path, synced: list[str], durable: bool
) -> None:
    """The shot's video replaces its segments (each fsync'd): it and its folder reach the disk before
    the video's done marker, and the segments are removed only after that marker."""
    from farm.worker.tasks import finish_shot

    out = out_with_shot(tmp_path)
    out.videos_dir.mkdir()  # prepare_output makes it
    rgb = np.random.default_rng(1).integers(0, 256, (16, 16, 24, 3), dtype=np.uint8)
    video = VideoSettings(preset="ultrafast")
    for k in range(2):
        frames = BlendedFrames(rgb[8 * k : 8 * k + 8])
        encode_batch(out, Batch("a", k, 8 * k, 8 * k + 8, (0,)), frames, 24.0, video, {})
    before = len(synced)
    finish_shot(out, "a", 2, {}, durable=durable)
    calls = synced[before:]
    marker = str(out.video_done_marker("a"))
    at = calls.index(marker_temporary(marker, calls))
    assert (str(out.video("a")) in calls[:at] and str(out.videos_dir) in calls[:at]) is durable
    assert out.video_done_marker("a").exists() and out.video("a").exists()
    assert not out.segment("a", 0).exists() and not out.segment("a", 1).exists()
