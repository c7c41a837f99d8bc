"""A render's Zarr frames in OUT/frames.zarr: the frames arrays (created, written durably, read),
each shot's coordinates and ``valid`` mask, their chunk files, and the fast codec pipeline.

Paths come from `farm.store.output.Output`; the layout is described there and in docs/outputs.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from farm import config
from farm.media import beneath
from farm.media.files import run_side_by_side
from farm.media.rates import rate_text, start_timecode
from farm.store.lock import shared_lock
from farm.store.output import Output, ShotFolders, check_writable, os_errors_in_one_line, remove_own_files

if TYPE_CHECKING:
    from farm.store.job import Job

FORMAT = 1
# Named dimensions (Zarr v3 dimension_names) and coordinates, so xarray opens the frames without options.
FRAME_DIMS = ("frame", "y", "x", "channel")
CHANNELS = ("R", "G", "B")
FRAME_ARRAYS = ("frames", "frame", "channel", "valid")  # the arrays farm writes in a shot's group
VALID = "valid"  # a shot's per-frame validity array, beside its frames


def prepare_output(
    out: Output,
    job: Job,
    shots: Iterable[tuple[str, tuple[int, int, int], int]],
    dtype: str = "uint8",
    first_frame: int = 1,
    chunk_mib: int = 8,
    timecode: str | None = None,
    colour: dict[str, Any] | None = None,
) -> None:
    """Create the output folders and one frames array per shot: (name, (F, H, W), batch frames).

    Each shot's group and frames carry its exact rate (``rate``, "24000/1001"; ``fps`` as a number) and
    its start timecode (`timecode`, the render's ``--timecode``, else the job's; `farm.media.rates`).

    `dtype` is the Zarr master copy's: uint8 levels, or float16 in [0, 1]. `chunk_mib`: the most MiB in
    one chunk (`chunk_frames`). Beside each shot's frames go its coordinates (`write_coordinates`):
    frame numbers from `first_frame`, and channel names. `colour`: what each frames array says of its
    colour space (`farm.media.settings.VideoSettings.colour_attributes`; nothing for an SDR render; a key
    with the value None is removed)."""
    with os_errors_in_one_line(f"cannot prepare the outputs in {str(out.root)!r}"):
        _prepare_output(out, job, shots, dtype, first_frame, chunk_mib, timecode, colour or {})


def _prepare_output(out: Output, job: Job, shots: Iterable[tuple[str, tuple[int, int, int], int]], dtype: str,
                    first_frame: int, chunk_mib: int, timecode: str | None,
                    colour: dict[str, Any]) -> None:  # fmt: skip
    import zarr

    from farm.store.beneath_zarr import frames_store

    check_writable(out)
    farm_attrs: dict[str, Any] = {
        "format": FORMAT,
        "job": str(job.path),
        "decoder": job.spec.to_json(),
        "random_weights": job.spec.random_weights,
        **({"warning": "decoded with RANDOM decoder weights"} if job.spec.random_weights else {}),
    }
    with shared_lock(out.root):  # the root is every render's of OUT: renders of other shots prepare too
        root = zarr.open_group(store=frames_store(out), mode="a", zarr_format=3)
        if root.attrs.get("farm") != farm_attrs:
            root.attrs["farm"] = farm_attrs

    def prepare_shot(name: str, shape: tuple[int, int, int], batch_frames: int) -> None:
        group = root.require_group(name)
        clock = shot_clock(job.shots[name], timecode)
        group.attrs.update({**clock, "random_weights": job.spec.random_weights})
        create_frames_array(out.frames_zarr, name, shape, batch_frames, dtype, job.shots[name].fps, chunk_mib)
        frames = group["frames"]
        settled = {**clock, **{k: v for k, v in colour.items() if v is not None}}
        if any(frames.attrs.get(k) != v for k, v in settled.items()):
            frames.attrs.update(settled)
        for key in [k for k, v in colour.items() if v is None and k in frames.attrs]:
            del frames.attrs[key]  # e.g. scene-linear values have no valid range
        write_coordinates(group, shape[0], first_frame)
        create_validity(out, name, shape[0], batch_frames)
        beneath.make_folders(out.root, out.segments_dir(name))
        beneath.make_folders(out.root, out.done_dir(name))

    shots = list(shots)
    with ThreadPoolExecutor(max_workers=min(8, max(len(shots), 1)), thread_name_prefix="farm-out") as pool:
        list(pool.map(lambda s: prepare_shot(*s), shots))  # metadata files: a few ms each, on threads


def shot_clock(info: Any, timecode: str | None) -> dict[str, Any]:
    """A shot's rate and start timecode as attributes: ``fps`` (a number), ``rate`` (exact, "30000/1001")
    and, when there is one, ``timecode`` (``HH:MM:SS:FF``; ``;`` before FF for drop-frame)."""
    if info.rate is None:
        return {"fps": info.fps}
    start = start_timecode(info.rate, info.timecode, timecode)
    return {"fps": float(info.rate), "rate": rate_text(info.rate), **({"timecode": start} if start else {})}


def create_frames_array(
    frames_zarr: Path,
    shot: str,
    shape: tuple[int, int, int],
    batch_frames: int,
    dtype: str = "uint8",
    fps: float | None = None,
    chunk_mib: int = 8,
) -> None:
    """The shot's ``frames`` array ``[F, H, W, 3]`` in the output's Zarr group, unless it exists (an
    array from before dimension names were written, or with other chunks, is kept as it is: writes
    follow its chunks). Written beneath OUT, `frames_zarr`'s folder (`farm.store.beneath_zarr`)."""
    import zarr
    from zarr.codecs import ZstdCodec

    from farm.store.beneath_zarr import BeneathStore

    store = BeneathStore(frames_zarr, within=Path(frames_zarr).parent)
    group = zarr.open_group(store=store, mode="a", zarr_format=3).require_group(shot)
    if "frames" not in group:
        f, h, w = shape
        frame_bytes = h * w * 3 * np.dtype(dtype).itemsize
        chunk = chunk_frames(batch_frames, frame_bytes, chunk_mib)
        # zstd level 1: measured 2.3x faster than zarr's default zstd level on decoded frames, same size.
        group.create_array(
            "frames", shape=(f, h, w, 3), dtype=dtype, chunks=(chunk, h, w, 3),
            fill_value=0, compressors=[ZstdCodec(level=1)], dimension_names=FRAME_DIMS,
            attributes=frame_attributes(dtype, fps),
        )  # fmt: skip


def frame_attributes(dtype: str, fps: float | None) -> dict[str, Any]:
    """What the frames' values mean, for xarray users and other readers (CF-style names)."""
    return {
        "long_name": "decoded frames",
        "colour_space": "BT.709",  # primaries and transfer: display-referred, as the videos are tagged
        "colour_primaries": "bt709",
        "transfer_characteristics": "bt709",
        "colour_range": "full",  # RGB: 0 and 255 (or 0.0 and 1.0) are black and white
        "valid_range": [0, 255] if dtype == "uint8" else [0.0, 1.0],
        **({"fps": float(fps)} if fps else {}),
    }


def create_validity(out: Output, shot: str, frames: int, batch_frames: int) -> None:
    """The shot's ``valid`` array: bool [F] on the ``frame`` dimension, True where the frame's batch is
    done (its frames are in place). One chunk per batch, so each batch's mark writes only its own chunk.
    Made from the done markers where an output lacks it, or has it in other chunks."""
    import zarr

    from farm.store.beneath_zarr import frames_store

    group = zarr.open_group(store=frames_store(out), mode="a", zarr_format=3).require_group(shot)
    size = max(1, min(batch_frames, frames))
    found = group.get(VALID)
    if isinstance(found, zarr.Array) and found.shape == (frames,) and found.chunks == (size,):
        return
    arr = group.create_array(VALID, shape=(frames,), dtype=bool, chunks=(size,), fill_value=False,
                             dimension_names=("frame",), overwrite=True,
                             attributes={"long_name": "frame rendered (its batch is done)"})  # fmt: skip
    for index in sorted(out.batches_done(shot)):
        arr[index * batch_frames : (index + 1) * batch_frames] = True


def mark_valid(out: Output, shot: str, start: int, stop: int) -> None:
    """Frames [start, stop) of the shot are in place: set them in its ``valid`` array (a batch's chunk)."""
    import zarr

    from farm.store.beneath_zarr import BeneathStore

    with contextlib.suppress(FileNotFoundError, KeyError):  # an output made before the array existed
        store = BeneathStore(out.shot_group(shot) / VALID, within=out.root)
        zarr.open_array(store=store, mode="r+")[start:stop] = True


def write_coordinates(group: Any, frames: int, first_frame: int) -> None:
    """The shot's coordinate arrays: ``frame`` (its frame numbers, from `first_frame`) and ``channel``
    (R, G, B). Rewritten when the numbering changes; a few bytes each."""
    if "frame" not in group or group["frame"].shape != (frames,) or group["frame"][0] != first_frame:
        arr = group.create_array("frame", shape=(frames,), dtype=np.int64, chunks=(max(frames, 1),),
                                 dimension_names=("frame",), overwrite=True,
                                 attributes={"long_name": "frame number"})  # fmt: skip
        arr[...] = np.arange(first_frame, first_frame + frames, dtype=np.int64)
    if "channel" not in group:
        arr = group.create_array("channel", shape=(3,), dtype=str, chunks=(3,), dimension_names=("channel",))
        arr[...] = np.array(CHANNELS)


def chunk_frames(batch_frames: int, frame_bytes: int = 0, chunk_mib: int | None = None) -> int:
    """Frames per Zarr chunk: the largest divisor of the batch up to 8 frames and `chunk_mib` MiB (at
    least one frame), so no chunk is shared by two batches (no write races) and a batch is written as
    several chunks, compressed and fsync'd side by side: the smaller they are, the sooner one batch is
    on disk. One H200 host, 8 frames of 1088x1920 fsync'd: 0.127 s in one 8-frame chunk, 0.037 s in
    1-frame chunks; 704x1216: 0.057 s, 0.019 s in 2-frame chunks (docs/performance.md)."""
    fits = [d for d in range(1, min(batch_frames, 8) + 1) if batch_frames % d == 0]
    if chunk_mib is not None:
        fits = [d for d in fits if d == 1 or d * frame_bytes <= chunk_mib * 2**20]
    return max(fits)


ZARRS_PIPELINE = "zarrs.ZarrsCodecPipeline"
_DEFAULT_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def use_fast_codecs() -> str:
    """Encode and write chunks through the `zarrs` codec pipeline (Rust, chunks in parallel, no GIL)
    when it is installed (``pip install 'farm-decode[fast]'``), unless this process' zarr config names
    another pipeline or ``farm.zarrs`` is false (``DASK_FARM__ZARRS=false``; ``FARM_ZARRS=0`` too).
    Same array format and decoded values: readers need nothing.
    Returns the pipeline in use. It writes 1.4-1.7× zarr-python's rate (docs/performance.md).
    For worker processes; the render's own process (perhaps a user's notebook) uses `fast_codecs`."""
    import zarr

    if _zarrs_wanted():
        zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE})
        return ZARRS_PIPELINE
    return str(zarr.config.get("codec_pipeline.path"))


@contextlib.contextmanager
def fast_codecs() -> Iterator[None]:
    """`use_fast_codecs` for the arrays opened inside the block only (the pipeline is chosen when an
    array is opened), leaving the process' zarr config as it was."""
    import zarr

    if not _zarrs_wanted():
        yield
        return
    with zarr.config.set({"codec_pipeline.path": ZARRS_PIPELINE}):
        yield


def zarrs_enabled() -> bool:
    """``farm.zarrs`` (dask.config), unless the older ``FARM_ZARRS`` variable says otherwise."""
    alias = os.environ.get("FARM_ZARRS")
    if alias is not None:
        return alias != "0"
    return str(config.get("zarrs")).lower() not in ("false", "0", "no", "off")


def _zarrs_wanted() -> bool:
    import importlib.util

    import zarr

    return (
        zarr.config.get("codec_pipeline.path") in (_DEFAULT_PIPELINE, ZARRS_PIPELINE)
        and zarrs_enabled()
        and importlib.util.find_spec("zarrs") is not None
    )


def write_frames(out: Output, shot: str, start: int, frames: np.ndarray, *, durable: bool = True) -> None:
    """Write frames ``[start, start + len(frames))`` of a shot; `durable`: fsync the chunk files they
    landed in (and their folders) before returning, so a batch marked done afterwards survives a power
    loss. Batches cover whole chunks (`chunk_frames`), so no other writer touches these files.

    Durable writes go chunk by chunk on a thread pool, each chunk fsync'd as soon as it is written: one
    chunk's flush overlaps the next one's compression, and the disk takes the flushes side by side
    (one after another they cost 0.69 s a batch on an H200 host, docs/performance.md)."""
    import zarr

    from farm.store.beneath_zarr import BeneathStore

    use_fast_codecs()  # for the worker's other arrays: frames go through zarr's codecs (`BeneathStore`)
    path = out.frames_array(shot)
    arr = zarr.open_array(store=BeneathStore(path, within=out.root), mode="r+")
    stop = start + frames.shape[0]
    if not durable:
        arr[start:stop] = frames
        return
    step = arr.chunks[0]

    def write_and_sync(first: int) -> list[Path]:
        last = min(first + step, stop)
        arr[first:last] = frames[first - start : last - start]
        # a chunk equal to the fill value is not stored
        stored = [c for c in chunk_files(path, arr, first, last) if c.exists()]
        for chunk in stored:
            beneath.fsync(out.root, chunk)
        return stored

    written = run_side_by_side(write_and_sync, range(start, stop, step))
    beneath.fsync_all(out.root, [], chunk_folders(path, [chunk for chunks in written for chunk in chunks]))


def chunk_files(array_dir: Path, arr: Any, start: int, stop: int) -> list[Path]:
    """The files of the chunks holding frames ``[start, stop)`` of an array whose first axis is frames (every
    spatial chunk), as its chunk-key encoding names them."""
    import itertools
    import math

    per_axis = [math.ceil(n / c) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    frames = range(start // arr.chunks[0], math.ceil(stop / arr.chunks[0]))
    coords = itertools.product(frames, *(range(n) for n in per_axis[1:]))
    return [array_dir / arr.metadata.encode_chunk_key(tuple(c)) for c in coords]


def chunk_folders(array_dir: Path, chunks: Iterable[Path]) -> set[Path]:
    """Every folder from the given chunk files of the array in `array_dir` up to the array's own."""
    folders: set[Path] = set()
    for path in chunks:
        parent = path.parent
        while parent != array_dir.parent and parent not in folders:
            folders.add(parent)
            parent = parent.parent
    return folders


def read_frames(out: Output, shot: str) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(store=str(out.frames_array(shot)), mode="r")[...])


def unfinished_chunks(folders: ShotFolders, frame_ranges: Iterable[tuple[int, int]]) -> list[Path]:
    """The chunk files of batches about to be rendered (frames [start, stop) each, not marked done), to
    remove so that what a killed or failed write left there (a 0-byte chunk from a full disk) is never
    read back by the new write. Batches cover whole chunks, so no finished batch's chunk is among them.
    The same for the shot's ``valid`` array (one chunk per batch), which each batch's mark writes."""
    frame_ranges = list(frame_ranges)
    return [chunk for array_dir in (folders.frames, folders.group / VALID)
            for chunk in chunks_of(array_dir, frame_ranges)]  # fmt: skip


def chunks_of(array_dir: Path, frame_ranges: Iterable[tuple[int, int]]) -> list[Path]:
    """The chunk files of the array in `array_dir` that hold the given frame ranges (none when the
    array does not exist)."""
    import zarr

    if not (array_dir / "zarr.json").exists():
        return []
    arr = zarr.open_array(store=str(array_dir), mode="r")
    return [chunk for start, stop in frame_ranges for chunk in chunk_files(array_dir, arr, start, stop)]


def remove_chunks(array_dir: Path, frame_ranges: Iterable[tuple[int, int]], *, root: Path) -> None:
    """Remove the chunk files of the array in `array_dir` that hold the given frame ranges (`chunks_of`);
    those chunks read back as the array's fill value. `root`: OUT, from which no link is followed."""
    for chunk in chunks_of(array_dir, frame_ranges):
        beneath.unlink(root, chunk)


def drop_frames(out: Output, shot: str) -> None:
    """Remove a shot's frames and coordinate arrays and its group's metadata (the shape may change when
    the shot starts over): only the files Zarr wrote for them, never another file in those folders."""
    group = out.shot_group(shot)
    for name in FRAME_ARRAYS:
        array = group / name
        remove_own_files(array / "c", lambda n: n.isdigit(), recursive=True, root=out.root)
        remove_own_files(array, lambda n: n == "zarr.json", root=out.root)
    remove_own_files(group, lambda n: n == "zarr.json", root=out.root)
