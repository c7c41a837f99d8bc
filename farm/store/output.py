"""The render output folder OUT: where every file of a render goes, and the few operations on them.

    OUT/frames.zarr/                  attrs: {"farm": {"format": 1, "decoder": {...}, "random_weights": bool}}
      <shot>/frames                   [F, H, W, 3] uint8 levels or float16 in [0, 1], one chunk per
                                      temporal batch; attrs "render" (its identity, farm.run.resume),
                                      "batches"; dimension_names (frame, y, x, channel), colour attributes
      <shot>/frame, <shot>/channel    coordinates: frame numbers (from --first-frame), "R", "G", "B"
      <shot>/valid                    bool [F]: True where the frame's batch is done (a reader's mask)
    OUT/videos/<shot>.mp4|.mov        the shot's video (farm.media.video.CODECS: H.264, H.265, ProRes), with
                                      the shot's sound muxed in when it has sound (AAC in mp4, PCM in mov)
    OUT/audio/<shot>.wav|.flac        the shot's sound (16-bit stereo), as long as its video (media.audio)
    OUT/sequences/<shot>/<shot>.NNNN.png|.exr   optional image sequence (farm.media.sequences)
    OUT/.farm/lock                    the running render's lock (farm.store.lock)
    OUT/.farm/segments/<shot>/NNNNN.mp4   per-batch segments, joined into the video (then removed)
    OUT/.farm/done/<shot>/NNNNN       marker written once batch NNNNN's frames, segment, images are in place:
                                      the sha256 of each of its chunk files and of its segment
    OUT/.farm/done/<shot>/video       marker written after the shot's video is joined: the video's sha256
    OUT/.farm/done/<shot>/audio       marker written after the shot's sound file is in place: its sha256
    OUT/.farm/done/<shot>/cancelled   a shot `farm cancel` stopped (removed when a render resumes it)

`Output` is the only place these paths are spelled; temporaries (``.<name>.farm-XXXXXXXX.tmp<suffix>``,
`farm.media.files.temp_file`) are found by `Output.stale_temporaries`. A marker is trusted only while what it
records is still on disk unchanged (`verified_batches`, `video_intact`): a missing, truncated or altered
chunk, segment or video is rendered again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.decoders import FAMILIES
from farm.decoders.base import superseded_config
from farm.decoders.ltx2_audio import superseded_sound
from farm.errors import FarmError
from farm.media.files import fsync_all, fsync_path, process_umask, run_side_by_side, temp_file
from farm.media.names import child_path, is_farm_temporary

if TYPE_CHECKING:
    from farm.store.job import Job

FORMAT = 1
# Named dimensions (Zarr v3 dimension_names) and coordinates, so xarray opens the frames without options.
FRAME_DIMS = ("frame", "y", "x", "channel")
CHANNELS = ("R", "G", "B")
STATE_DIR = ".farm"  # farm's own bookkeeping under OUT: lock, segments, done markers
SEGMENT_NAME = re.compile(r"\d{5}\.(mp4|mov)")
FRAME_ARRAYS = ("frames", "frame", "channel", "valid")  # the arrays farm writes in a shot's group


@dataclass(frozen=True)
class Output:
    """Every path under a render output folder; `video_suffix` is ".mp4", or ".mov" for ProRes."""

    root: Path
    video_suffix: str = ".mp4"

    @property
    def frames_zarr(self) -> Path:
        return self.root / "frames.zarr"

    def shot_group(self, shot: str) -> Path:
        """The shot's Zarr group in frames.zarr (its attrs hold the render identity)."""
        return child_path(self.frames_zarr, shot)

    def frames_array(self, shot: str) -> Path:
        return self.shot_group(shot) / "frames"

    @property
    def videos_dir(self) -> Path:
        return self.root / "videos"

    def video(self, shot: str, suffix: str | None = None) -> Path:
        """The shot's video; `suffix` another codec's (".mp4", ".mov") instead of this output's."""
        return child_path(self.videos_dir, shot, self.video_suffix if suffix is None else suffix)

    @property
    def sequences_dir(self) -> Path:
        return self.root / "sequences"

    def sequence_dir(self, shot: str) -> Path:
        return child_path(self.sequences_dir, shot)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def lock_file(self) -> Path:
        return self.state_dir / "lock"

    @property
    def write_probe(self) -> Path:
        """A file created and removed to check OUT is writable."""
        return self.state_dir / "write-test"

    def segments_dir(self, shot: str) -> Path:
        return child_path(self.state_dir / "segments", shot)

    def segment(self, shot: str, batch: int) -> Path:
        return self.segments_dir(shot) / f"{batch:05d}{self.video_suffix}"

    def done_dir(self, shot: str) -> Path:
        return child_path(self.state_dir / "done", shot)

    def done_marker(self, shot: str, batch: int) -> Path:
        return self.done_dir(shot) / f"{batch:05d}"

    def video_done_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / "video"

    @property
    def audio_dir(self) -> Path:
        return self.root / "audio"

    def audio_file(self, shot: str, suffix: str = ".wav") -> Path:
        """The shot's sound file (".wav" or ".flac")."""
        return child_path(self.audio_dir, shot, suffix)

    def audio_done_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / "audio"

    def cancelled_marker(self, shot: str) -> Path:
        return self.done_dir(shot) / "cancelled"

    def batches_done(self, shot: str) -> set[int]:
        folder = self.done_dir(shot)
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()

    def stale_temporaries(self) -> list[Path]:
        """Temp files a killed render left behind (never final outputs: those are renamed into place only
        when complete)."""
        folders = (self.videos_dir, self.state_dir / "segments", self.state_dir / "done", self.sequences_dir,
                   self.audio_dir)  # fmt: skip
        return [tmp for folder in folders if folder.exists() for tmp in folder.rglob(".*")
                if is_farm_temporary(tmp.name) and tmp.is_file() and not tmp.is_symlink()]  # fmt: skip


@contextlib.contextmanager
def os_errors_in_one_line(what: str) -> Iterator[None]:
    """An OSError inside the block (a full disk, a permission) as a one-line FarmError naming `what` and
    the file, instead of a traceback through Zarr."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise FarmError(f"{what}: {exc.strerror or exc}{where}") from None


def prepare_output(
    out: Output,
    job: Job,
    shots: Iterable[tuple[str, tuple[int, int, int], int]],
    dtype: str = "uint8",
    first_frame: int = 1,
    chunk_mib: int = 8,
    timecode: str | None = None,
) -> None:
    """Create the output folders and one frames array per shot: (name, (F, H, W), batch frames).

    Each shot's group and frames carry its exact rate (``rate``, "24000/1001"; ``fps`` as a number) and
    its start timecode (`timecode`, the render's ``--timecode``, else the job's; `farm.media.rates`).

    `dtype` is the Zarr master copy's: uint8 levels, or float16 in [0, 1]. `chunk_mib`: the most MiB in
    one chunk (`chunk_frames`). Beside each shot's frames go its coordinates (`write_coordinates`):
    frame numbers from `first_frame`, and channel names."""
    with os_errors_in_one_line(f"cannot prepare the outputs in {str(out.root)!r}"):
        _prepare_output(out, job, shots, dtype, first_frame, chunk_mib, timecode)


def _prepare_output(out: Output, job: Job, shots: Iterable[tuple[str, tuple[int, int, int], int]], dtype: str,
                    first_frame: int, chunk_mib: int, timecode: str | None) -> None:  # fmt: skip
    import zarr

    check_writable(out)
    root = zarr.open_group(store=str(out.frames_zarr), mode="a", zarr_format=3)
    root.attrs["farm"] = {
        "format": FORMAT,
        "job": str(job.path),
        "decoder": job.spec.to_json(),
        "random_weights": job.spec.random_weights,
        **({"warning": "decoded with RANDOM decoder weights"} if job.spec.random_weights else {}),
    }

    def prepare_shot(name: str, shape: tuple[int, int, int], batch_frames: int) -> None:
        group = root.require_group(name)
        clock = shot_clock(job.shots[name], timecode)
        group.attrs.update({**clock, "random_weights": job.spec.random_weights})
        create_frames_array(out.frames_zarr, name, shape, batch_frames, dtype, job.shots[name].fps, chunk_mib)
        frames = group["frames"]
        if any(frames.attrs.get(k) != v for k, v in clock.items()):
            frames.attrs.update(clock)
        write_coordinates(group, shape[0], first_frame)
        create_validity(out, name, shape[0], batch_frames)
        out.segments_dir(name).mkdir(parents=True, exist_ok=True)
        out.done_dir(name).mkdir(parents=True, exist_ok=True)

    shots = list(shots)
    with ThreadPoolExecutor(max_workers=min(8, max(len(shots), 1)), thread_name_prefix="farm-out") as pool:
        list(pool.map(lambda s: prepare_shot(*s), shots))  # metadata files: a few ms each, on threads


def shot_clock(info: Any, timecode: str | None) -> dict[str, Any]:
    """A shot's rate and start timecode as attributes: ``fps`` (a number), ``rate`` (exact, "30000/1001")
    and, when there is one, ``timecode`` (``HH:MM:SS:FF``; ``;`` before FF for drop-frame)."""
    from farm.media.rates import rate_text, start_timecode

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
    follow its chunks)."""
    import zarr
    from zarr.codecs import ZstdCodec

    group = zarr.open_group(store=str(frames_zarr), mode="a", zarr_format=3).require_group(shot)
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


VALID = "valid"  # a shot's per-frame validity array, beside its frames


def create_validity(out: Output, shot: str, frames: int, batch_frames: int) -> None:
    """The shot's ``valid`` array: bool [F] on the ``frame`` dimension, True where the frame's batch is
    done (its frames are in place). One chunk per batch, so each batch's mark writes only its own chunk.
    Made from the done markers where an output lacks it, or has it in other chunks."""
    import zarr

    group = zarr.open_group(store=str(out.frames_zarr), mode="a", zarr_format=3).require_group(shot)
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

    with contextlib.suppress(FileNotFoundError, KeyError):  # an output made before the array existed
        zarr.open_array(store=str(out.shot_group(shot) / VALID), mode="r+")[start:stop] = True


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


def check_writable(out: Output) -> None:
    try:
        out.root.mkdir(parents=True, exist_ok=True)
        out.videos_dir.mkdir(exist_ok=True)
        probe = out.write_probe
        probe.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        probe.unlink()
    except OSError as exc:
        raise FarmError(f"output path {str(out.root)!r} is not writable: {exc.strerror or exc}") from None


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


def _zarrs_setting() -> bool:
    """``farm.zarrs`` (dask.config), unless the older ``FARM_ZARRS`` variable says otherwise."""
    from farm import config

    alias = os.environ.get("FARM_ZARRS")
    if alias is not None:
        return alias != "0"
    return str(config.get("zarrs")).lower() not in ("false", "0", "no", "off")


def _zarrs_wanted() -> bool:
    import importlib.util

    import zarr

    return (
        zarr.config.get("codec_pipeline.path") in (_DEFAULT_PIPELINE, ZARRS_PIPELINE)
        and _zarrs_setting()
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

    use_fast_codecs()
    path = out.frames_array(shot)
    arr = zarr.open_array(store=str(path), mode="r+")
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
            fsync_path(chunk)
        return stored

    written = run_side_by_side(write_and_sync, range(start, stop, step))
    fsync_all([], chunk_folders(path, [chunk for chunks in written for chunk in chunks]))


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


def mark_done(path: Path, record: dict | None = None) -> None:
    """Create a marker file durably (fsync'd) so it only exists once what it marks is in place;
    `record` (what it marks: checksums) is its JSON content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_file(path)
    try:
        os.fchmod(fd, 0o666 & ~process_umask())  # mkstemp makes 0600: markers are read by colleagues too
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(record).encode() if record else b"")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)  # the rename itself


def file_digest(path: Path) -> str | None:
    """sha256 of a file's bytes; None when there is no such file."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def batch_record(out: Output, shot: str, index: int, start: int, stop: int) -> dict[str, Any]:
    """What a batch's done marker records: the sha256 of each chunk file holding frames [start, stop)
    (None: not stored, all fill value) and of its video segment, when there is one."""
    import zarr

    array_dir = out.frames_array(shot)
    arr = zarr.open_array(store=str(array_dir), mode="r")
    chunks = chunk_files(array_dir, arr, start, stop)
    digests = run_side_by_side(file_digest, chunks)
    record: dict[str, Any] = {
        "chunks": {str(c.relative_to(array_dir)): d for c, d in zip(chunks, digests, strict=True)}
    }
    for suffix in (".mp4", ".mov"):
        segment = Output(out.root, suffix).segment(shot, index)
        if segment.exists():
            record["segment"] = {"name": segment.name, "sha256": file_digest(segment)}
    return record


def read_marker(path: Path) -> dict[str, Any] | None:
    """A done marker's record: {} for a marker without one (written before markers held checksums), None
    for no marker or one that cannot be read."""
    try:
        text = path.read_bytes()
    except OSError:
        return None
    if not text:
        return {}
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def batch_intact(out: Output, shot: str, batch: int, need_segment: bool) -> bool:
    """Whether batch `batch` is marked done and everything its marker records is unchanged on disk: its
    chunk files (none missing, truncated or altered) and, when `need_segment`, its video segment."""
    record = read_marker(out.done_marker(shot, batch))
    if record is None:
        return False
    array_dir = out.frames_array(shot)
    if not record:  # a marker without checksums (an older render's): its segment at least is there
        suffixes = (".mp4", ".mov")
        return not need_segment or any(Output(out.root, s).segment(shot, batch).exists() for s in suffixes)
    for name, digest in (record.get("chunks") or {}).items():
        chunk = array_dir / name
        if digest is None:
            if chunk.exists() and chunk.stat().st_size == 0:
                return False
        elif file_digest(chunk) != digest:
            return False
    if need_segment:
        segment = record.get("segment")
        if not isinstance(segment, dict) or not SEGMENT_NAME.fullmatch(str(segment.get("name"))):
            return False
        if file_digest(out.segments_dir(shot) / segment["name"]) != segment.get("sha256"):
            return False
    return True


def verified_batches(out: Output, shot: str, need_segment: bool) -> tuple[set[int], set[int]]:
    """The shot's batches marked done: (intact, damaged), checked side by side (`batch_intact`)."""
    marked = sorted(out.batches_done(shot))
    intact = run_side_by_side(lambda k: batch_intact(out, shot, k, need_segment), marked)
    return ({k for k, ok in zip(marked, intact, strict=True) if ok},
            {k for k, ok in zip(marked, intact, strict=True) if not ok})  # fmt: skip


def file_record(path: Path) -> dict[str, Any]:
    """What a done marker of one whole file records: its name, sha256 and size."""
    return {"name": path.name, "sha256": file_digest(path), "size": path.stat().st_size}


def file_intact(marker: Path, path: Path) -> bool:
    """Whether `marker` exists and `path` is, byte for byte, the file it records."""
    record = read_marker(marker)
    if record is None:
        return False
    if not record:  # a marker without a checksum
        return path.exists() and path.stat().st_size > 0
    return record.get("name") == path.name and file_digest(path) == record.get("sha256")


def video_record(out: Output, shot: str) -> dict[str, Any]:
    return file_record(out.video(shot))


def video_intact(out: Output, shot: str) -> bool:
    """Whether the shot's video is marked done and is, byte for byte, the video the marker records."""
    return file_intact(out.video_done_marker(shot), out.video(shot))


def clear_unfinished(out: Output, shot: str, batches: Iterable[tuple[int, int]]) -> None:
    """Remove the chunk files of batches about to be rendered (frames [start, stop) each, not marked
    done): what a killed or failed write left there (a 0-byte chunk from a full disk) is never read back
    by the new write. Batches cover whole chunks, so no finished batch's chunk is touched. The same for
    the shot's ``valid`` array (one chunk per batch), which each batch's mark writes."""
    batches = list(batches)
    for array_dir in (out.frames_array(shot), out.shot_group(shot) / VALID):
        remove_chunks(array_dir, batches)


def remove_chunks(array_dir: Path, frame_ranges: Iterable[tuple[int, int]]) -> None:
    """Remove the chunk files of the array in `array_dir` that hold the given frame ranges (none when
    the array does not exist); chunks read back as the array's fill value."""
    import zarr

    if not (array_dir / "zarr.json").exists():
        return
    arr = zarr.open_array(store=str(array_dir), mode="r")
    for start, stop in frame_ranges:
        for chunk in chunk_files(array_dir, arr, start, stop):
            chunk.unlink(missing_ok=True)


def forget_damaged(out: Output, shot: str, batches: Iterable[int], video: bool) -> None:
    """Unmark damaged batches (and the video, when `video`) and remove the frames' chunk files their
    markers name, and their chunks of the ``valid`` array (one per batch: it reads False again), so they
    render again from nothing (a 0-byte chunk would fail a partial write)."""
    import zarr

    array_dir = out.frames_array(shot)
    batches = list(batches)
    for batch in batches:
        marker = out.done_marker(shot, batch)
        record = read_marker(marker) or {}
        marker.unlink(missing_ok=True)
        for name in record.get("chunks") or {}:
            chunk = array_dir / name
            if chunk.resolve().is_relative_to(array_dir.resolve()) and re.fullmatch(r"c(/\d+)+", name):
                chunk.unlink(missing_ok=True)
    if video:
        out.video_done_marker(shot).unlink(missing_ok=True)
    valid_dir = out.shot_group(shot) / VALID
    if (valid_dir / "zarr.json").exists():
        size = zarr.open_array(store=str(valid_dir), mode="r").chunks[0]
        remove_chunks(valid_dir, [(batch * size, batch * size + 1) for batch in batches])


def restart_shot(out: Output, shot: str, recorded: dict | None = None) -> None:
    """Start a shot over: remove every output the render it replaces made, and nothing else.

    That is its done markers, segments and Zarr frames, its video in this output's codec and in the
    `recorded` identity's, and the image files the recorded sequence settings named (format, first
    frame and frame count), so no file of the old settings is left beside the new ones.
    """
    from farm.media.sequences import FORMATS, frame_path

    markers = ("video", "audio", "cancelled")
    remove_own_files(out.done_dir(shot), lambda name: name.isdigit() or name in markers)
    remove_own_files(out.segments_dir(shot), lambda name: SEGMENT_NAME.fullmatch(name) is not None)
    drop_frames(out, shot)
    outputs = (recorded or {}).get("outputs") or {}
    suffixes = {out.video_suffix}
    if outputs.get("video"):
        from farm.media.video import CODECS

        if outputs["video"] in CODECS:
            suffixes.add(CODECS[outputs["video"]].suffix)
    for suffix in suffixes:
        out.video(shot, suffix).unlink(missing_ok=True)
    for suffix in (".wav", ".flac"):  # farm.media.audio.FORMATS
        out.audio_file(shot, suffix).unlink(missing_ok=True)
    sequence, first = outputs.get("sequence"), outputs.get("first_frame")
    frames = ((recorded or {}).get("plan") or {}).get("pixel_shape", [0])[0]
    if sequence in FORMATS and isinstance(first, int) and isinstance(frames, int):
        folder = out.sequence_dir(shot)
        for number in range(first, first + frames):
            frame_path(folder, shot, number, FORMATS[sequence].ext).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when nothing else is in it


def drop_frames(out: Output, shot: str) -> None:
    """Remove a shot's frames and coordinate arrays and its group's metadata (the shape may change when
    the shot starts over): only the files Zarr wrote for them, never another file in those folders."""
    group = out.shot_group(shot)
    for name in FRAME_ARRAYS:
        array = group / name
        remove_own_files(array / "c", lambda n: n.isdigit(), recursive=True)
        remove_own_files(array, lambda n: n == "zarr.json")
    remove_own_files(group, lambda n: n == "zarr.json")


def remove_own_files(folder: Path, own: Any, *, recursive: bool = False) -> None:
    """Remove the files in `folder` whose names `own(name)` accepts (and farm's temporaries), in its
    sub-folders too when `recursive` (only those whose names it accepts), then every folder so emptied:
    a file farm did not write stays, and so does the folder holding it."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.is_symlink() or not (own(entry.name) or is_farm_temporary(entry.name)):
            continue
        if entry.is_file():
            entry.unlink(missing_ok=True)
        elif recursive and entry.is_dir():
            remove_own_files(entry, own, recursive=True)
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when nothing else is in it


def video_done(out: Output, shot: str) -> bool:
    return video_intact(out, shot)


def audio_done(out: Output, shot: str, suffix: str = ".wav") -> bool:
    """Whether the shot's sound file is marked done and is, byte for byte, the file the marker records."""
    return file_intact(out.audio_done_marker(shot), out.audio_file(shot, suffix))


def remove_stale_temporaries(out: Output) -> None:
    """Temp files a killed render left behind (never final outputs: they are renamed only when complete)."""
    for tmp in out.stale_temporaries():
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class ShotProgress:
    shot: str
    batches_done: int
    batches_total: int | None
    frames: int
    video: bool
    finished: bool = False  # every output asked for is done (the video, or every batch without one)
    damaged: int | None = None  # with verify: finished batches (and video) found missing or altered
    cancelled: bool = False  # stopped by `farm cancel` before it finished (a rerun resumes it)
    superseded: str | None = None  # decoded with an earlier revision of its named decoder config: why


def rendered_frames(identity: dict, batches_done: Iterable[int]) -> int:
    """Frames in the finished batches of a shot whose recorded render `identity` gives its plan."""
    plan = identity.get("plan") or {}
    size, total = plan.get("batch_frames"), (plan.get("pixel_shape") or [0])[0]
    if not isinstance(size, int) or not isinstance(total, int) or size < 1:
        return 0
    return sum(max(0, min(size, total - k * size)) for k in batches_done)


@contextlib.contextmanager
def removed_if_left_empty(out: Output) -> Iterator[None]:
    """When OUT did not exist and the block fails, remove the empty folders it left (never a file), so a
    render that could not start leaves no empty OUT behind."""
    existed = out.root.exists()
    try:
        yield
    except BaseException:
        if not existed and out.root.is_dir():
            for folder, _, _ in sorted(os.walk(out.root), key=lambda w: -len(w[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)  # fails, harmlessly, on any folder that holds something
        raise


def output_progress(out_root: str | os.PathLike, *, verify: bool = False) -> list[ShotProgress]:
    """Per-shot progress read from a render output alone (no job store, no cluster); `verify`: check
    every finished batch and video against the checksums their markers record."""
    import zarr

    out = Output(Path(out_root))
    if not out.frames_zarr.exists():
        raise FarmError(f"{str(out.root)!r} is not a farm render output (no frames.zarr inside)")
    try:
        root = zarr.open_group(store=str(out.frames_zarr), mode="r")
        groups = sorted(root.groups())
    except Exception as exc:  # damaged metadata: zarr raises many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise FarmError(
            f"{str(out.frames_zarr)!r} cannot be read ({type(exc).__name__}: {first}): damaged metadata"
        ) from None
    progress = []
    for name, group in groups:
        total = group.attrs.get("batches")
        identity = group.attrs.get("render")
        identity = identity if isinstance(identity, dict) else {}
        wants_video = (identity.get("outputs") or {}).get("video") is not None
        marked = out.batches_done(name)
        frames = rendered_frames(identity, marked)
        video = out.video_done_marker(name).exists() and any(
            p.suffix in (".mp4", ".mov") for p in out.videos_dir.glob(f"{name}.*")
        )
        batches = total if isinstance(total, int) else None
        damaged = None
        if verify:
            suffix = next((s for s in (".mp4", ".mov") if Output(out.root, s).video(name).exists()), ".mp4")
            shot_out = Output(out.root, suffix)
            video_ok = video and video_intact(shot_out, name)
            _, bad = verified_batches(shot_out, name, need_segment=False)  # frames; the video on its own
            damaged = len(bad) + int(out.video_done_marker(name).exists() and not video_ok)
            sound_marker = out.audio_done_marker(name)
            sounds = [out.audio_file(name, suffix) for suffix in (".wav", ".flac")]
            damaged += int(sound_marker.exists() and not any(file_intact(sound_marker, p) for p in sounds))
            video = video_ok
        finished = (video if wants_video else batches is not None and len(marked) >= batches) and not damaged
        cancelled = not finished and out.cancelled_marker(name).exists()
        superseded = superseded_config(identity.get("decoder"), FAMILIES) or superseded_sound(identity)
        progress.append(ShotProgress(name, len(marked), batches, frames, video, bool(identity) and finished,
                                     damaged, cancelled, superseded))  # fmt: skip
    return progress
