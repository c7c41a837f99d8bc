"""The job store: a render's input, one Zarr v3 group of latents and the decoder spec that decodes them.

    JOB/                              attrs: {"farm": {"format": 1, "decoder": {...decoder spec...},
                                                       "audio_decoder": {...}}}  (audio: optional)
      <shot>/                         attrs: {"fps": 23.976…, "rate": "24000/1001", "timecode": "01:00:00:00"
                                      (optional), ...}: "rate" is exact, "fps" the same as a number
        latent                        float array [C, F, H, W], the decoder's latent space
                                      (dimensions channel, frame, y, x)
        audio                         optional float array: the shot's sound, audio latents of the
                                      job's audio decoder (`farm.decoders.sound`), in its family's
                                      layout: LTX-2 [C, T, M] (dimensions audio_channel, audio_frame,
                                      mel), MiniMax-H3 [2, C, T] (stereo_channel, audio_channel,
                                      audio_frame)

The render's output folder is `farm.store.output`'s; what an output is a render of is `farm.run.resume`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import DecoderSpec, spec_from_json
from farm.decoders.sound import parse_sound_spec
from farm.decoders.sound_base import SoundSpec
from farm.errors import FarmError
from farm.media.names import check_name
from farm.media.rates import parse_rate, parse_timecode, rate_text, read_rate
from farm.safe_read import read_json
from farm.store.claims import codec_names, shape_problem
from farm.store.latent_chunks import LatentChunks, checked_store

FORMAT = 1
LATENT_DIMS = ("channel", "frame", "y", "x")  # Zarr v3 dimension_names: xarray opens latents by name
# The sound's own names: xarray opens a shot as one dataset, where a dimension has one size. Stores written
# with "channel" here still read (farm reads arrays by path, never by dimension name).
# the axes of a [C, T, M] audio latent (LTX-2's); each sound family names its own (`latent_dims`)
AUDIO_DIMS = ("audio_channel", "audio_frame", "mel")


def check_shot_name(name: str) -> str:
    """A shot name follows `farm.media.names`' rule (it becomes folder and file names under OUT)."""
    return check_name(name, "shot name")


@dataclass(frozen=True)
class ShotInfo:
    name: str
    latent_shape: tuple[int, int, int, int]
    latent_dtype: str
    fps: float
    attrs: dict[str, Any]
    audio_shape: tuple[int, int, int] | None = None  # the shot's audio latent (its family's layout), if any
    rate: Fraction | None = None  # the exact frame rate (farm.media.rates); None when the fps is not valid
    timecode: str | None = None  # the start timecode of the shot's first frame, as stored
    problem: str | None = None  # why the shot's metadata cannot be read (that shot fails, by name)
    latent_chunks: tuple[int, ...] | None = None  # the latent's declared chunk shape
    latent_codecs: tuple[str, ...] = ()  # the latent's codecs by name (farm.store.claims.codec_names)


@dataclass(frozen=True)
class Job:
    path: Path
    spec: DecoderSpec
    shots: dict[str, ShotInfo]
    audio: SoundSpec | None = None  # the audio decoder of the shots' sound (None: the job is silent)


def create_job(
    path: str | os.PathLike, spec: DecoderSpec, *, overwrite: bool = False, audio: SoundSpec | None = None
) -> None:
    import zarr

    path = Path(path)
    if path.exists() and not overwrite:
        raise FarmError(f"job store {str(path)!r} already exists; choose a new path or remove it first")
    root = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    meta: dict[str, Any] = {"format": FORMAT, "decoder": spec.to_json()}
    if audio is not None:
        meta["audio_decoder"] = audio.to_json()
    root.attrs["farm"] = meta


def write_shot(
    path: str | os.PathLike,
    name: str,
    latent: np.ndarray,
    *,
    fps: Any,
    attrs: dict | None = None,
    timecode: str | None = None,
    audio: np.ndarray | None = None,
) -> None:
    """Add one shot's latent ``[C, F, H, W]`` (and its audio latent ``[C, T, M]``) to a job store; `fps`
    a number or a ratio ("24000/1001", `farm.media.rates.parse_rate`), stored exactly; `timecode` the start
    timecode of its first frame."""
    import zarr

    check_shot_name(name)
    if latent.ndim != 4:
        raise FarmError(f"shot {name!r}: latent has {latent.ndim} dimensions; expected 4 [C, F, H, W]")
    claim = shape_problem(latent.shape, None, latent.dtype.itemsize)
    if claim:
        raise FarmError(f"shot {name!r}: {claim}")
    rate = parse_rate(fps, where=f"shot {name!r}: fps")
    clock: dict[str, Any] = {"fps": float(rate), "rate": rate_text(rate)}
    if timecode is not None:
        clock["timecode"] = parse_timecode(timecode, rate, where=f"shot {name!r}: timecode")
    root = zarr.open_group(store=str(path), mode="r+", zarr_format=3)
    group = root.require_group(name)
    group.attrs.update({**clock, **(attrs or {})})
    with zarr.config.set({"codec_pipeline.path": WRITES_EVERY_CHUNK}):
        _write_latents(group, name, latent, audio, root)


# zarr-python's own pipeline: it honours write_empty_chunks, which the `zarrs` pipeline (set process-wide
# by `farm.store.frames.use_fast_codecs`) ignores, leaving an all-zero chunk unwritten (then refused as
# missing when the latents are read)
WRITES_EVERY_CHUNK = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def _write_latents(group: Any, name: str, latent: np.ndarray, audio: np.ndarray | None, root: Any) -> None:
    """The shot's latent (and audio latent) arrays in its `group` of the job store `root`, every chunk
    written."""
    c, f, h, w = latent.shape
    arr = group.create_array(
        "latent", shape=latent.shape, dtype=latent.dtype, chunks=(c, min(f, 8), h, w), overwrite=True,
        dimension_names=LATENT_DIMS, config={"write_empty_chunks": True},  # a missing chunk is an error
    )  # fmt: skip
    arr[...] = latent
    if audio is not None:
        meta = root.attrs.get("farm")
        if not isinstance(meta, dict) or "audio_decoder" not in meta:
            raise FarmError(f"shot {name!r}: the job store has no audio decoder, so it cannot hold sound; "
                            "create the job with one (--audio-decoder)")  # fmt: skip
        audio_spec = parse_sound_spec(meta["audio_decoder"])
        audio_spec.check_latent(tuple(audio.shape), f"shot {name!r}")
        sound = group.create_array("audio", shape=audio.shape, dtype=audio.dtype, chunks=audio.shape,
                                   overwrite=True, dimension_names=audio_spec.latent_dims,
                                   config={"write_empty_chunks": True})  # fmt: skip
        sound[...] = audio


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
            "create one with `farm synth` or farm.store.job.create_job"
        ) from None
    meta = root.attrs.get("farm")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "decoder" not in meta:
        raise FarmError(
            f"{str(path)!r} is a Zarr group but not a farm job store: its attribute 'farm' must be "
            f'{{"format": {FORMAT}, "decoder": {{...}}}}, found {meta!r}'
        )
    spec = spec_from_json(meta["decoder"], where=f"{path}: decoder spec")
    audio_spec = None
    if meta.get("audio_decoder") is not None:
        audio_spec = parse_sound_spec(meta["audio_decoder"], where=f"{path}: audio decoder spec")
    shots = {}
    roots = shot_roots(path, meta.get("view_of"))
    for name in shot_folders(path):
        try:  # a shot that cannot be read fails by name; the others render (docs/guarantees.md)
            check_shot_name(name)
            group = open_shot_group(path, name, roots)
        except FarmError as exc:
            shots[name] = unreadable_shot(name, str(exc))
            continue
        if group is None:
            continue  # an array beside the shots, not a shot
        latent = group.get("latent")
        if not isinstance(latent, zarr.Array):
            shots[name] = unreadable_shot(name, f"{path}: shot {name!r} has no 'latent' array")
            continue
        sound = group.get("audio")
        shots[name] = ShotInfo(
            name=name,
            latent_shape=tuple(int(x) for x in latent.shape),  # type: ignore[arg-type]
            latent_dtype=str(latent.dtype),
            fps=read_fps(group.attrs.get("fps", 24.0)),
            attrs=dict(group.attrs),
            audio_shape=tuple(int(x) for x in sound.shape)  # type: ignore[arg-type]
            if isinstance(sound, zarr.Array) and audio_spec is not None
            else None,
            rate=read_rate({"fps": 24, **group.attrs}),
            timecode=str(group.attrs["timecode"]) if "timecode" in group.attrs else None,
            latent_chunks=declared_chunks(latent),
            latent_codecs=tuple(codec_names(latent)),
        )
    if not shots:
        raise FarmError(f"job store {str(path)!r} holds no shots")
    return Job(path=path, spec=spec, shots=shots, audio=audio_spec)


def shot_folders(path: Path) -> list[str]:
    """The names of the job store's entries that hold Zarr metadata (its shots), sorted; read from the
    folder, so one shot's unreadable metadata fails that shot only (`open_shot_group`)."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        raise FarmError(f"cannot read the job store {str(path)!r}: {exc.strerror or exc}") from None
    return [e.name for e in entries if os.path.lexists(os.path.join(e.path, "zarr.json"))]


def shot_roots(path: Path, view_of: Any) -> tuple[Path, ...]:
    """Where a job store's shot folders may lead: the store itself and, for a view (a store whose shots
    link to another's, ``"view_of"`` in its farm attributes: ``workflows/render_folder.py`` makes them),
    the farm job store it names."""
    roots = [path.resolve()]
    if isinstance(view_of, str) and (Path(view_of) / "zarr.json").is_file():
        roots.append(Path(view_of).resolve())
    return tuple(roots)


def open_shot_group(path: Path, name: str, roots: tuple[Path, ...] | None = None) -> Any:
    """A shot's Zarr group (None when the entry is an array, not a group), or a FarmError saying why the
    shot cannot be read: a folder that leaves the job store (a link to elsewhere; `roots`: where shots
    may lead, `shot_roots`), metadata that is not JSON or nests beyond reason."""

    import zarr

    folder = path / name
    for inside in (folder, folder / "latent", folder / "audio"):
        if not any(inside.resolve().is_relative_to(root) for root in roots or (path.resolve(),)):
            raise FarmError(
                f"shot {name!r}: {str(inside)!r} leads outside the job store (to {str(inside.resolve())!r}); "
                "a job store's shots are its own folders"
            )
    try:
        meta = read_json(folder / "zarr.json", f"shot {name!r}: {str(folder / 'zarr.json')!r}")
        if not isinstance(meta, dict) or meta.get("node_type") != "group":
            return None
        return zarr.open_group(store=str(folder), mode="r")
    except FarmError:
        raise
    except RecursionError:
        raise FarmError(f"shot {name!r}: {str(folder / 'zarr.json')!r} nests too deep to read; rewrite its "
                        "attributes") from None  # fmt: skip
    except Exception as exc:  # unreadable or damaged metadata: zarr and json raise many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise FarmError(f"shot {name!r}: {str(folder / 'zarr.json')!r} cannot be read "
                        f"({type(exc).__name__}: {first[:200]})") from None  # fmt: skip


def declared_chunks(arr: Any) -> tuple[int, ...] | None:
    """An array's declared chunk shape (None where its grid has none: farm's claims check then refuses
    its codecs instead, `farm.store.claims`)."""
    try:
        return tuple(int(c) for c in arr.chunks)
    except Exception:  # irregular grids and others: zarr raises several types
        return None


def unreadable_shot(name: str, problem: str) -> ShotInfo:
    """A shot whose metadata cannot be read: it fails by name (`farm.planning.jobplan.check_shots`)."""
    return ShotInfo(name=name, latent_shape=(0, 0, 0, 0), latent_dtype="", fps=math.nan, attrs={},
                    problem=problem)  # fmt: skip


def read_fps(value: Any) -> float:
    """A shot's fps attribute as a number; NaN when it is not one (that shot then fails by name,
    `farm.planning.jobplan.check_shots`, instead of the whole job)."""
    if isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


# zarr-python's own codec pipeline. A worker that has written frames runs the `zarrs` pipeline for its
# Zarr I/O (`farm.store.frames.use_fast_codecs`), which is faster for whole chunks but slower for the part of
# a chunk a carried segment reads: 13-15 ms against 6-10 ms for 4-5 latent frames of a 704x1216 shot on
# this project's 2-core CPU machine (docs/performance.md). A shot's first read is on
# its GPU's critical path.
ZARR_PYTHON_PIPELINE = "zarr.core.codec_pipeline.BatchedCodecPipeline"


def read_latent(
    path: str | os.PathLike, shot: str, region: Iterable[slice], expected: LatentChunks | None = None,
    seen: dict[str, str] | None = None,
) -> np.ndarray:
    """One tile's latent block ``[C, f, h, w]``: read on the worker that decodes it, through zarr-python's
    own codec pipeline whatever this process writes with (the pipeline is chosen when an array opens).
    A missing chunk is a FarmError, never its fill value; with `expected` (the chunks' digests the render
    recorded) so is a chunk whose bytes differ; `seen` receives each chunk's sha256 as read
    (`farm.store.latent_chunks`)."""
    import zarr

    store = checked_store(Path(path) / shot / "latent", shot, expected, seen)
    with zarr.config.set({"codec_pipeline.path": ZARR_PYTHON_PIPELINE}):
        arr = zarr.open_array(store=store, mode="r")
    return np.asarray(arr[(slice(None), *region)])


def read_audio_latent(path: str | os.PathLike, shot: str) -> np.ndarray:
    """A shot's whole audio latent, in its sound family's layout (read on the worker that decodes the
    sound); a missing chunk is a FarmError, never its fill value."""
    import zarr

    store = checked_store(Path(path) / shot / "audio", shot)
    with zarr.config.set({"codec_pipeline.path": ZARR_PYTHON_PIPELINE}):
        arr = zarr.open_array(store=store, mode="r")
    return np.asarray(arr[...])
