"""The job store (latents in) and the render output (frames, segments, videos out), both on disk.

Job store: a Zarr v3 group.

    JOB/                              attrs: {"farm": {"format": 1, "decoder": {...decoder spec...}}}
      <shot>/                         attrs: {"fps": 24.0, ...}
        latent                        float array [C, F, H, W], the decoder's latent space

Render output:

    OUT/frames.zarr/                  attrs: {"farm": {"format": 1, "decoder": {...}, "random_weights": bool}}
      <shot>/frames                   uint8 [F, H, W, 3], one chunk per temporal batch
    OUT/videos/<shot>.mp4             H.264, yuv420p, the shot's fps
    OUT/.farm/segments/<shot>/NNNNN.mp4   per-batch segments, joined into the video (then removed)
    OUT/.farm/done/<shot>/NNNNN       marker written after batch NNNNN's frames and segment are in place
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import DecoderSpec, spec_from_json
from farm.errors import FarmError

FORMAT = 1
SHOT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_shot_name(name: str) -> str:
    if not isinstance(name, str) or not SHOT_NAME.match(name) or set(name) == {"."}:
        raise FarmError(
            f"shot name {name!r} is not allowed: use letters, digits, '-', '_' and '.' only "
            "(and not '.' or '..')"
        )
    return name


@dataclass(frozen=True)
class ShotInfo:
    name: str
    latent_shape: tuple[int, int, int, int]
    latent_dtype: str
    fps: float
    attrs: dict[str, Any]


@dataclass(frozen=True)
class Job:
    path: Path
    spec: DecoderSpec
    shots: dict[str, ShotInfo]


# --------------------------------------------------------------------------------------------------
# Job store
# --------------------------------------------------------------------------------------------------


def create_job(path: str | os.PathLike, spec: DecoderSpec, *, overwrite: bool = False) -> None:
    import zarr

    path = Path(path)
    if path.exists() and not overwrite:
        raise FarmError(f"job store {str(path)!r} already exists; choose a new path or remove it first")
    root = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    root.attrs["farm"] = {"format": FORMAT, "decoder": spec.to_json()}


def write_shot(
    path: str | os.PathLike, name: str, latent: np.ndarray, *, fps: float, attrs: dict | None = None
) -> None:
    """Add one shot's latent ``[C, F, H, W]`` to a job store."""
    import zarr

    check_shot_name(name)
    if latent.ndim != 4:
        raise FarmError(f"shot {name!r}: latent has {latent.ndim} dimensions; expected 4 [C, F, H, W]")
    if not fps > 0:
        raise FarmError(f"shot {name!r}: fps {fps} is invalid; use a positive number")
    root = zarr.open_group(store=str(path), mode="r+", zarr_format=3)
    group = root.require_group(name)
    group.attrs.update({"fps": float(fps), **(attrs or {})})
    c, f, h, w = latent.shape
    arr = group.create_array(
        "latent", shape=latent.shape, dtype=latent.dtype, chunks=(c, min(f, 8), h, w), overwrite=True
    )
    arr[...] = latent


def open_job(path: str | os.PathLike) -> Job:
    """Read and validate a job store's metadata (no latent data is read)."""
    import zarr

    path = Path(path)
    if not path.exists():
        raise FarmError(f"job store {str(path)!r} does not exist")
    try:
        root = zarr.open_group(store=str(path), mode="r")
    except Exception as exc:  # zarr raises several types for "not a group"
        raise FarmError(
            f"{str(path)!r} is not a Zarr job store ({type(exc).__name__}: {exc}); "
            "create one with `farm synth` or farm.store.create_job"
        ) from None
    meta = root.attrs.get("farm")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "decoder" not in meta:
        raise FarmError(
            f"{str(path)!r} is a Zarr group but not a farm job store: its attribute 'farm' must be "
            f'{{"format": {FORMAT}, "decoder": {{...}}}}, found {meta!r}'
        )
    spec = spec_from_json(meta["decoder"], where=f"{path}: decoder spec")
    shots = {}
    for name, group in sorted(root.groups()):
        check_shot_name(name)
        if "latent" not in group:
            raise FarmError(f"{path}: shot {name!r} has no 'latent' array")
        latent = group["latent"]
        fps = group.attrs.get("fps", 24.0)
        shots[name] = ShotInfo(
            name=name,
            latent_shape=tuple(int(x) for x in latent.shape),  # type: ignore[arg-type]
            latent_dtype=str(latent.dtype),
            fps=float(fps),
            attrs=dict(group.attrs),
        )
    if not shots:
        raise FarmError(f"job store {str(path)!r} holds no shots")
    return Job(path=path, spec=spec, shots=shots)


def read_latent(path: str | os.PathLike, shot: str, region: Iterable[slice]) -> np.ndarray:
    """One tile's latent block ``[C, f, h, w]``: read on the worker that decodes it."""
    import zarr

    arr = zarr.open_array(store=str(Path(path) / shot / "latent"), mode="r")
    return np.asarray(arr[(slice(None), *region)])


# --------------------------------------------------------------------------------------------------
# Render output
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    root: Path
    video_suffix: str = ".mp4"  # ".mov" for ProRes

    @property
    def frames_zarr(self) -> Path:
        return self.root / "frames.zarr"

    def video(self, shot: str) -> Path:
        return self.root / "videos" / f"{shot}{self.video_suffix}"

    def segment(self, shot: str, batch: int) -> Path:
        return self.root / ".farm" / "segments" / shot / f"{batch:05d}{self.video_suffix}"

    def sequence_dir(self, shot: str) -> Path:
        return self.root / "sequences" / shot

    def done_marker(self, shot: str, batch: int) -> Path:
        return self.root / ".farm" / "done" / shot / f"{batch:05d}"

    def batches_done(self, shot: str) -> set[int]:
        folder = self.root / ".farm" / "done" / shot
        return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


def prepare_output(
    out: Output, job: Job, shots: Iterable[tuple[str, tuple[int, int, int], int]], dtype: str = "uint8"
) -> None:
    """Create the output folders and one frames array per shot: (name, (F, H, W), batch frames).

    `dtype` is the Zarr master copy's: uint8 levels, or float16 in [0, 1]."""
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
        group.attrs.update({"fps": job.shots[name].fps, "random_weights": job.spec.random_weights})
        create_frames_array(out.frames_zarr, name, shape, batch_frames, dtype)
        (out.root / ".farm" / "segments" / name).mkdir(parents=True, exist_ok=True)
        (out.root / ".farm" / "done" / name).mkdir(parents=True, exist_ok=True)

    shots = list(shots)
    with ThreadPoolExecutor(max_workers=min(8, max(len(shots), 1)), thread_name_prefix="farm-out") as pool:
        list(pool.map(lambda s: prepare_shot(*s), shots))  # metadata files: a few ms each, on threads


def create_frames_array(
    frames_zarr: Path, shot: str, shape: tuple[int, int, int], batch_frames: int, dtype: str = "uint8"
) -> None:
    """The shot's ``frames`` array ``[F, H, W, 3]`` in the output's Zarr group, unless it exists."""
    import zarr
    from zarr.codecs import ZstdCodec

    group = zarr.open_group(store=str(frames_zarr), mode="a", zarr_format=3).require_group(shot)
    if "frames" not in group:
        f, h, w = shape
        # zstd level 1: measured 2.3x faster than zarr's default zstd level on decoded frames, same size.
        group.create_array(
            "frames", shape=(f, h, w, 3), dtype=dtype, chunks=(chunk_frames(batch_frames), h, w, 3),
            fill_value=0, compressors=[ZstdCodec(level=1)],
        )  # fmt: skip



def chunk_frames(batch_frames: int) -> int:
    """Frames per Zarr chunk: the largest divisor of the batch up to 8, so a batch is written as several
    chunks compressed in parallel, and no chunk is shared by two batches (no write races)."""
    return max(d for d in range(1, min(batch_frames, 8) + 1) if batch_frames % d == 0)


def check_writable(out: Output) -> None:
    try:
        out.root.mkdir(parents=True, exist_ok=True)
        (out.root / "videos").mkdir(exist_ok=True)
        probe = out.root / ".farm" / "write-test"
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise FarmError(f"output path {str(out.root)!r} is not writable: {exc.strerror or exc}") from None


def write_frames(out: Output, shot: str, start: int, frames: np.ndarray, *, durable: bool = True) -> None:
    """Write frames ``[start, start + len(frames))`` of a shot; `durable`: fsync the chunk files they
    landed in (and their folders) before returning, so a batch marked done afterwards survives a power
    loss. Batches cover whole chunks (`chunk_frames`), so no other writer touches these files."""
    import zarr

    path = out.frames_zarr / shot / "frames"
    arr = zarr.open_array(store=str(path), mode="r+")
    arr[start : start + frames.shape[0]] = frames
    if durable:
        sync_chunks(path, arr, start, start + frames.shape[0])


def chunk_files(array_dir: Path, arr: Any, start: int, stop: int) -> list[Path]:
    """The files of the chunks holding frames ``[start, stop)`` of a ``[F, H, W, 3]`` array (every
    spatial chunk), as its chunk-key encoding names them."""
    import itertools
    import math

    per_axis = [math.ceil(n / c) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    frames = range(start // arr.chunks[0], math.ceil(stop / arr.chunks[0]))
    coords = itertools.product(frames, *(range(n) for n in per_axis[1:]))
    return [array_dir / arr.metadata.encode_chunk_key(tuple(c)) for c in coords]


def sync_chunks(array_dir: Path, arr: Any, start: int, stop: int) -> None:
    """fsync the chunk files of frames ``[start, stop)`` and every folder from them up to the array."""
    folders: set[Path] = set()
    for path in chunk_files(array_dir, arr, start, stop):
        if not path.exists():  # a chunk equal to the fill value is not stored
            continue
        fsync_path(path)
        parent = path.parent
        while parent != array_dir.parent and parent not in folders:
            folders.add(parent)
            parent = parent.parent
    for folder in sorted(folders, key=lambda p: -len(p.parts)):  # deepest first: entries before parents
        fsync_path(folder)


def fsync_path(path: Path) -> None:
    """fsync one file or folder (a folder's fsync makes the names created in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_frames(out: Output, shot: str) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_array(store=str(out.frames_zarr / shot / "frames"), mode="r")[...])


def mark_done(path: Path) -> None:
    """Create a marker file durably (fsync'd) so it only exists once what it marks is in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)  # the rename itself


# --------------------------------------------------------------------------------------------------
# Resume: what a render output is a render of, and which of its batches are finished
# --------------------------------------------------------------------------------------------------


def latent_identity(job: Job, shot: str) -> dict[str, Any]:
    """Content hash of a shot's latent (reads it once on the client: ~7 MB for a 121x704x1216 shot)."""
    import hashlib

    import zarr

    arr = zarr.open_array(store=str(job.path / shot / "latent"), mode="r")
    digest = hashlib.sha256()
    for start in range(0, arr.shape[1], 8):
        try:
            block = np.ascontiguousarray(arr[:, start : start + 8])
        except Exception as exc:  # codec and store errors of many types
            raise FarmError(
                f"shot {shot!r}: cannot read latent frames {start}-{min(start + 8, arr.shape[1]) - 1} from "
                f"{str(job.path)!r} (corrupt or missing chunk? {type(exc).__name__}: {exc}); repair or "
                "re-export the latents"
            ) from None
        if not np.isfinite(block).all():
            bad = np.nonzero(~np.isfinite(block).all(axis=(0, 2, 3)))[0] + start
            raise FarmError(
                f"shot {shot!r}: latent holds NaN or Inf in latent frames {bad.tolist()}; "
                "re-export the latents"
            )
        digest.update(block.tobytes())
    return {"sha256": digest.hexdigest(), "shape": list(arr.shape), "dtype": str(arr.dtype)}


def recorded_identity(out: Output, shot: str) -> dict[str, Any] | None:
    import zarr

    try:
        group = zarr.open_group(store=str(out.frames_zarr / shot), mode="r")
    except Exception:  # no such group yet: nothing recorded
        return None
    return group.attrs.get("render")


def identity_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between two render identities (empty when they are the same)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        if recorded.get(key) != current.get(key):
            if key == "latents":
                out.append("the latents changed (content hash differs)")
            else:
                out.append(f"{key}: output has {recorded.get(key)!r}, this render has {current.get(key)!r}")
    return out


def record_identity(out: Output, shot: str, identity: dict[str, Any], total_batches: int) -> None:
    import zarr

    group = zarr.open_group(store=str(out.frames_zarr / shot), mode="r+")
    group.attrs.update({"render": identity, "batches": total_batches})


def restart_shot(out: Output, shot: str) -> None:
    """Forget a shot's finished work (markers, segments, video) so it renders from scratch."""
    import shutil

    for folder in (out.root / ".farm" / "done" / shot, out.root / ".farm" / "segments" / shot):
        shutil.rmtree(folder, ignore_errors=True)
    out.video(shot).unlink(missing_ok=True)


def video_done(out: Output, shot: str) -> bool:
    return (out.root / ".farm" / "done" / shot / "video").exists() and out.video(shot).exists()


def remove_stale_temporaries(out: Output) -> None:
    """Temp files a killed render left behind (never final outputs: they are renamed only when complete)."""
    for folder in (out.root / "videos", out.root / ".farm" / "segments", out.root / ".farm" / "done",
                   out.root / "sequences"):  # fmt: skip
        if folder.exists():
            for tmp in [*folder.rglob(".*.tmp.*"), *folder.rglob("*.tmp")]:
                tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class ShotProgress:
    shot: str
    batches_done: int
    batches_total: int | None
    frames: int
    video: bool


def output_progress(out_root: str | os.PathLike) -> list[ShotProgress]:
    """Per-shot progress read from a render output alone (no job store, no cluster)."""
    import zarr

    out = Output(Path(out_root))
    if not out.frames_zarr.exists():
        raise FarmError(f"{str(out.root)!r} is not a farm render output (no frames.zarr inside)")
    root = zarr.open_group(store=str(out.frames_zarr), mode="r")
    progress = []
    for name, group in sorted(root.groups()):
        total = group.attrs.get("batches")
        frames = int(group["frames"].shape[0]) if "frames" in group else 0
        video = (out.root / ".farm" / "done" / name / "video").exists() and any(
            p.suffix in (".mp4", ".mov") for p in (out.root / "videos").glob(f"{name}.*")
        )
        progress.append(ShotProgress(name, len(out.batches_done(name)), total, frames, video))
    return progress


def drop_frames(out: Output, shot: str) -> None:
    """Remove a shot's frames array (its shape may change when the shot starts over)."""
    import shutil

    shutil.rmtree(out.frames_zarr / shot, ignore_errors=True)
