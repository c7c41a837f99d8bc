"""Latents in from where they are made: job stores built from latent files, or from a pipeline's output.

    farm ingest JOB SOURCES… --decoder SPEC_OR_NAME [--weights PATH] [--fps R] [--name PATTERN]
        [--latents normalized|denormalized] [--tensor KEY] [--replace]
        [--audio-tensor KEY --audio-decoder NAME_OR_SPEC [--audio-weights PATH]]

Three steps, so that nothing in the job store changes unless every source is good:

1. **Plan** (pure, :func:`plan_shots`): one shot per sample of every tensor found (a batch axis gives
   several), named from the file by a pattern and sanitised to the store's shot-name rules; names that
   collide with each other or with the job's shots (without ``replace``) are refused; every shape is
   checked against the decoder's geometry (rank, channels, at least 2 latent rows and columns).
2. **Stage**: the data is read, checked for NaN/Inf and written as complete shots into a hidden staging
   store beside the job (same file system).
3. **Commit**: each staged shot folder is renamed into the job (a new job: the staged store is renamed
   to the job's path). A rename is atomic, so a render reading other shots of the job never sees a
   half-written shot; ``replace`` swaps the new shot with the old one in one atomic exchange (where the
   file system has none: moves the old one aside, and a later ingest puts it back if this one died
   before the new one was in), and is refused while a render reads the job (`farm.store.lock`).

The job's decoder spec says which latent convention its shots hold (``latents``: ``denormalized``, as
handed to ``vae.decode``, or ``normalized``, before the pipeline's un-normalisation); every shot of a job
shares it, so a source with a known other convention is refused rather than decoded wrongly. ComfyUI's
LTX VAEs un-normalise inside their decode, so its LTX ``.latent`` files are ``normalized``; its Wan and
HunyuanVideo latents are the VAE's own (``denormalized``).

Sound: a shot's audio latents, in its sound family's layout (LTX-2: ``[C, T, M]``, a sample of the
pipeline's ``[B, C, T, M]``; MiniMax-H3: ``[2, C, T]``, the two stereo channels), are stored beside its
video latents, from the tensor ``--audio-tensor`` names in the same file, or from the pipeline's output
(`add_pipeline_shot`'s ``audio_latents``). The job then records the audio decoder (`farm.decoders.sound`)
that decodes them; every shot's sound shares it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import FAMILIES, DecoderSpec, decoder_class, spec_from_json
from farm.decoders.base import LATENT_CONVENTIONS
from farm.decoders.sound import named_sound_configs
from farm.decoders.sound_base import SoundSpec
from farm.decoders.user_spec import resolve_sound_spec, resolve_spec
from farm.errors import FarmError
from farm.inputs import latent_files
from farm.inputs.latent_files import CHANNEL_FAMILIES, FoundTensor, float_latent
from farm.inputs.pipelines import (
    audio_spec_from_pipeline,
    convention_of,
    pipeline_hdr,
    pipeline_latents,
    pipeline_name,
    spec_from_pipeline,
    to_numpy,
)
from farm.media.files import exchange
from farm.media.rates import parse_rate, parse_timecode
from farm.planning.tiling import MIN_SPATIAL_CHUNK, Geometry
from farm.store.claims import file_claim_problem, shape_problem
from farm.store.job import check_shot_name, create_job, open_job, write_shot
from farm.store.lock import job_replace_lock

DEFAULT_FPS = 24.0
# What ComfyUI's .latent files hold per decoder family (see the module docstring), as each adapter says.
COMFYUI_CONVENTION: dict[str, str] = {
    family: convention
    for family, cls in FAMILIES.items()
    if (convention := cls.comfyui_latents)
}
NAME_FIELDS = ("stem", "index", "n", "key")


# --------------------------------------------------------------------------------------------------
# Pure planning
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedShot:
    name: str
    source: FoundTensor
    sample: int | None  # index along the file's batch axis (None: the file holds one [C, F, H, W])
    latent_shape: tuple[int, int, int, int]
    fps: Fraction  # exact (farm.media.rates)
    attrs: dict[str, Any] = field(default_factory=dict)
    audio: FoundTensor | None = None  # the shot's audio latents (sample `sample` of them when batched)


@dataclass(frozen=True)
class Target:
    """What the job store decodes with, and what it already holds."""

    spec: DecoderSpec
    channels: int
    geometry: Geometry
    existing: frozenset[str] = frozenset()
    exists: bool = False


def target_for(spec: DecoderSpec, existing: Sequence[str] = (), exists: bool = False) -> Target:
    cls = decoder_class(spec)
    return Target(spec, cls.latent_channels_for(spec.config), cls.geometry_for(spec.config),
                  frozenset(existing), exists)  # fmt: skip


MAX_NAME = 200  # characters in a shot name (farm.media.names)


def sanitize_name(text: str) -> str:
    """`text` made a valid shot name: characters other than letters, digits, '-', '_', '.' become '_'."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._-")  # no hidden folders, nothing like an option
    return check_shot_name(name or "shot")


def check_name_pattern(pattern: str) -> None:
    shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
    if len(pattern) > MAX_NAME:
        raise FarmError(f"--name {shown!r} is longer than a shot name may be ({MAX_NAME} characters)")
    try:
        parsed = [(f, spec) for _, f, spec, _ in string.Formatter().parse(pattern) if f is not None]
    except ValueError as exc:
        raise FarmError(f"--name {shown!r} is not a valid pattern ({exc})") from None
    fields = [f for f, _ in parsed]
    for field_name, spec in parsed:
        widths = [int(digits) for digits in re.findall(r"\d+", spec or "")]
        if "{" in (spec or "") or any(width > MAX_NAME for width in widths):
            raise FarmError(f"--name {shown!r}: the format of {{{field_name}}} is wider than a shot name may "
                            f"be ({MAX_NAME} characters); use a width such as {{index:03d}}")  # fmt: skip
    unknown = [f for f in fields if f.split(".")[0].split("[")[0] not in NAME_FIELDS]
    if unknown:
        allowed = ", ".join("{" + f + "}" for f in NAME_FIELDS)
        raise FarmError(
            f"--name {pattern!r} uses {unknown}; a pattern may use {allowed} (e.g. '{{stem}}_{{index:02d}}')"
        )


def shot_name(pattern: str | None, found: FoundTensor, sample: int | None, n: int) -> str:
    """The shot name for sample `sample` of `found`, the `n`-th shot of this ingest (from 0)."""
    if pattern is None:
        batch = found.shape[0] if len(found.shape) == 5 else 1
        pattern = "{stem}" if batch == 1 else "{stem}_{index}"
    try:
        text = pattern.format(stem=found.stem, index=sample or 0, n=n, key=found.key or "")
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise FarmError(f"--name {pattern!r} cannot be filled in ({type(exc).__name__}: {exc})") from None
    if len(text) > MAX_NAME:
        raise FarmError(f"--name {pattern!r} makes a name of {len(text)} characters for {found.path} "
                        f"({text[:40]!r}...); a shot name has at most {MAX_NAME}")  # fmt: skip
    return sanitize_name(text)


def samples_of(found: FoundTensor, channels: int) -> tuple[list[int | None], tuple[int, int, int, int]]:
    """The batch samples of a tensor and each one's [C, F, H, W]; FarmError with what would be valid."""
    shape = found.shape
    where = f"{found.path}" + (f" [{found.key}]" if found.key else "")
    if found.format == "comfyui" and len(shape) == 4:
        raise FarmError(f"{where}: an image latent {list(shape)} [B, C, H, W]; farm decodes video latents "
                        "[B, C, F, H, W]")  # fmt: skip
    if len(shape) == 5:
        return list(range(shape[0])), shape[1:]
    if len(shape) == 4:
        return [None], shape
    hint = ""
    if len(shape) == 3:
        hint = (" (a packed [B, S, D] sequence, as LTXPipeline returns with output_type='latent'? "
                "farm.inputs.ingest.add_pipeline_shot unpacks it)")  # fmt: skip
    raise FarmError(f"{where}: latent has shape {list(shape)}; expected [C, F, H, W] or [B, C, F, H, W] with "
                    f"C = {channels}{hint}")  # fmt: skip


def check_latent_shape(shape: Sequence[int], target: Target, where: str) -> None:
    """Refuse a [C, F, H, W] the job's decoder cannot decode, saying what it takes."""
    c, f, h, w = shape
    spec = target.spec
    if c != target.channels:
        families = CHANNEL_FAMILIES.get(c)
        hint = f" ({c} channels: a {' or '.join(families)} latent?)" if families else ""
        raise FarmError(
            f"{where}: latent has {c} channels but the decoder {spec.family} "
            f"[{spec.config_name or 'custom config'}] takes {target.channels}{hint}; is the axis order "
            f"[B, C, F, H, W] and the decoder right?"
        )
    least_f, least_h, least_w = target.geometry.min_block  # one decode call of the whole shot
    least_h, least_w = max(least_h, MIN_SPATIAL_CHUNK), max(least_w, MIN_SPATIAL_CHUNK)
    if f < least_f or h < least_h or w < least_w:
        raise FarmError(
            f"{where}: latent [C, F, H, W] = {list(shape)} is too small: the decoder needs at least "
            f"{least_f} latent frame(s) and {least_h} latent rows and {least_w} columns"
        )
    claim = shape_problem(shape, None, 4)  # as float32, what ingest stores: before its data is read
    if claim:
        raise FarmError(f"{where}: {claim}")


def check_pixel_size(shape: Sequence[int], geometry: Geometry, *, frames: int | None, height: int | None,
                     width: int | None, where: str) -> None:  # fmt: skip
    """Refuse a latent that does not decode to the frame count and size its maker says it used."""
    got = geometry.pixel_shape(shape[1:])
    for label, want, have in (("num_frames", frames, got[0]), ("height", height, got[1]),
                              ("width", width, got[2])):  # fmt: skip
        if want is not None and want != have:
            raise FarmError(
                f"{where}: a latent {list(shape)} decodes to {label} {have} with this decoder "
                f"({geometry.temporal_scale}x in time, {geometry.spatial_scale}x in space), but {label} "
                f"{want} was given; pass what the pipeline was called with, and check the decoder"
            )


def choose_convention(explicit: str | None, target: Target, known: Mapping[str, str]) -> str:
    """The latent convention the shots hold: `explicit` (--latents), else what the sources say (`known`:
    source → convention), else the job's. Sources known to differ from the result are refused."""
    if explicit is not None and explicit not in LATENT_CONVENTIONS:
        raise FarmError(f"--latents {explicit!r} is invalid; use one of {list(LATENT_CONVENTIONS)}")
    job = target.spec.latents if target.exists else None
    if explicit is not None and job is not None and explicit != job:
        raise FarmError(
            f"the job holds {job} latents (its decoder spec says so) and --latents says {explicit}; a job's "
            "shots share one convention: ingest into another job store"
        )
    values = set(known.values())
    chosen = explicit or job or (values.pop() if len(values) == 1 else None)
    if chosen is None:
        if len(set(known.values())) > 1:
            raise FarmError(f"the sources hold latents of different conventions: {dict(known)}; ingest them "
                            "into separate job stores")  # fmt: skip
        raise FarmError(
            "say which latents these files hold: --latents denormalized (what the pipeline hands to "
            "vae.decode) or --latents normalized (before the pipeline un-normalises them; farm then applies "
            "the VAE's statistics as the pipeline does)"
        )
    if explicit is None:
        wrong = {source: value for source, value in known.items() if value != chosen}
        if wrong:
            source, value = next(iter(wrong.items()))
            raise FarmError(
                f"{source}: holds {value} latents but the job holds {chosen} ones; ingest it into another "
                "job store, or pass --latents if you know better"
            )
    return chosen


def plan_shots(
    found: Sequence[FoundTensor],
    target: Target,
    *,
    pattern: str | None = None,
    fps: Any = None,
    replace: bool = False,
    attrs: Mapping[str, Any] | None = None,
    timecode: str | None = None,
) -> list[PlannedShot]:
    """Every shot this ingest would write, validated; nothing is read or written. `fps` (a number or a
    ratio, `farm.media.rates`) and `timecode` (each shot's start) apply to every shot."""
    if pattern is not None:
        check_name_pattern(pattern)
    if fps is not None:
        fps = parse_rate(fps)
    planned: list[PlannedShot] = []
    origin: dict[str, str] = {}
    for item in found:
        samples, shape = samples_of(item, target.channels)
        for sample in samples:
            where = f"{item.path}" + ("" if sample is None else f" sample {sample}")
            check_latent_shape(shape, target, where)
            name = shot_name(pattern, item, sample, len(planned))
            if name in origin:
                raise FarmError(
                    f"shot name {name!r} would come from both {origin[name]} and {where}; give a --name "
                    "pattern that tells them apart (e.g. '{stem}_{n:03d}')"
                )
            if name in target.existing and not replace:
                raise FarmError(
                    f"{where}: the job already holds a shot {name!r}; pass --replace to overwrite it, or "
                    "choose other names with --name"
                )
            origin[name] = where
            comfy = item.comfyui
            named = comfy.fps if comfy and comfy.fps else None
            shot_fps = fps or named or _metadata_fps(item, where) or DEFAULT_FPS
            rate = parse_rate(shot_fps, where=f"{where}: fps")
            clock = {"timecode": parse_timecode(timecode, rate)} if timecode else {}
            planned.append(PlannedShot(name, item, sample, shape, rate,
                                       {**source_attrs(item, sample), **(attrs or {}), **clock}))  # fmt: skip
    if not planned:
        raise FarmError("no latents to ingest")
    return planned


def _metadata_fps(item: FoundTensor, where: str) -> Fraction | None:
    """The rate the file's metadata names ("24000/1001" or a number), None when it names none; one it
    names that is not a rate (nan, inf, 0, negative) is refused, not replaced by the default."""
    if "fps" not in item.metadata:
        return None
    return parse_rate(item.metadata["fps"], where=f"{where}: the 'fps' in its metadata")


def source_attrs(item: FoundTensor, sample: int | None) -> dict[str, Any]:
    """What the shot records about where it came from."""
    if item.format == "pipeline":
        return {
            "source": {**item.metadata, "dtype": item.dtype, **({} if sample is None else {"sample": sample})}
        }
    source: dict[str, Any] = {"file": str(item.path.resolve()), "format": item.format}
    if item.key is not None:
        source["tensor"] = item.key
    if sample is not None:
        source["sample"] = sample
    source["dtype"] = item.dtype
    if item.comfyui is not None:
        source["comfyui_format_version"] = item.comfyui.format_version
        if item.comfyui.format_version is None:
            source["comfyui_legacy_scale"] = "multiplied by 1/0.18215, as ComfyUI's Load Latent does"
        if item.comfyui.families:
            source["comfyui_families"] = list(item.comfyui.families)
    return {"source": source}


def family_warnings(found: Sequence[FoundTensor], spec: DecoderSpec) -> list[str]:
    """ComfyUI workflows whose nodes point to another model family than the job's decoder."""
    out = []
    for item in found:
        fams = item.comfyui.families if item.comfyui else ()
        if fams and spec.family not in fams:
            out.append(f"{item.path}: its ComfyUI workflow uses {' / '.join(fams)} nodes but the decoder is "
                       f"{spec.family}; check --decoder")  # fmt: skip
    return out


def known_conventions(found: Sequence[FoundTensor], family: str) -> dict[str, str]:
    return {str(f.path): COMFYUI_CONVENTION[family] for f in found if f.format == "comfyui"}


# --------------------------------------------------------------------------------------------------
# Staging and commit (I/O)
# --------------------------------------------------------------------------------------------------


@dataclass
class IngestResult:
    job: Path
    shots: list[str]
    created: bool
    replaced: list[str]
    latents: str
    warnings: list[str] = field(default_factory=list)


def existing_job(path: Path) -> tuple[DecoderSpec, list[str]] | None:
    """The spec and shot names of the job store at `path`, or None when there is none."""
    if not path.exists():
        return None

    job = open_job(path)
    return job.spec, list(job.shots)


def check_finite(latent: np.ndarray, where: str) -> None:
    if not np.isfinite(latent).all():
        axes = tuple(a for a in range(latent.ndim) if a != 1)
        bad = np.nonzero(~np.isfinite(latent).all(axis=axes))[0]
        raise FarmError(f"{where}: latent holds NaN or Inf in latent frames {bad.tolist()}; re-export it")


def write_staged(
    job: Path,
    spec: DecoderSpec,
    shots: Sequence[tuple[PlannedShot, Callable[[], np.ndarray]]],
    *,
    existing: bool,
    replace: bool,
    on_progress: Callable[[int, int], None] | None = None,
    audio_spec: SoundSpec | None = None,
    sounds: Mapping[str, Callable[[], np.ndarray]] | None = None,
) -> list[str]:
    """Write `shots` (plan, data loader) into a staging store beside `job`, then rename them in.

    `sounds`: per shot name, a loader of its audio latent ``[C, T, M]`` (decoded by `audio_spec`).
    Returns the shots that replaced existing ones. On any error before the commit, the staging store is
    removed and the job is as it was."""
    stage = _staging_dir(job)
    try:
        create_job(stage, spec, audio=audio_spec)
        for i, (plan, loader) in enumerate(shots):
            latent = loader()
            where = f"{plan.source.path}" + ("" if plan.sample is None else f" sample {plan.sample}")
            if tuple(latent.shape) != plan.latent_shape:  # the file changed since it was scanned
                raise FarmError(
                    f"{where}: its latent is now {list(latent.shape)}, was {list(plan.latent_shape)}"
                )
            check_finite(latent, where)
            sound = None
            if sounds and plan.name in sounds:
                sound = sounds[plan.name]()
                if audio_spec is not None:
                    audio_spec.check_latent(tuple(sound.shape), f"{where} audio")
                check_finite(sound, f"{where} audio")
            write_shot(stage, plan.name, latent, fps=plan.fps, attrs=plan.attrs, audio=sound)
            if on_progress:
                on_progress(i + 1, len(shots))
        return _commit(stage, job, [p.name for p, _ in shots], existing=existing, replace=replace)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _staging_dir(job: Path) -> Path:
    """A new hidden folder beside the job (same file system, so renames are atomic); mode from the umask.

    Staging folders that an ingest killed on this host left behind (its process is gone) are removed."""
    job.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for stale in job.parent.glob(f".{job.name}.ingest-{host}-*"):
        pid = stale.name.removeprefix(f".{job.name}.ingest-{host}-").split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            if stale.name.endswith(".replaced"):
                _restore_replaced(stale, job)
            shutil.rmtree(stale, ignore_errors=True)
    for k in range(1000):
        path = job.parent / f".{job.name}.ingest-{host}-{os.getpid()}-{k}"
        try:
            path.mkdir()
            path.rmdir()  # create_job makes it again, as a Zarr group
            return path
        except FileExistsError:
            continue
    raise FarmError(f"cannot create a staging folder beside {job}")


def _restore_replaced(trash: Path, job: Path) -> None:
    """Shots a killed replace had moved aside and not yet replaced go back into the job."""
    for old in trash.iterdir():
        if old.is_dir() and not (job / old.name).exists():
            with contextlib.suppress(OSError):
                os.rename(old, job / old.name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _commit(stage: Path, job: Path, names: list[str], *, existing: bool, replace: bool) -> list[str]:
    if not existing:
        try:
            os.rename(stage, job)  # the whole new job appears at once
        except OSError as exc:
            raise FarmError(f"cannot create the job store {job}: {exc.strerror or exc} (did another process "
                            "create it meanwhile? run again to add to it)") from None  # fmt: skip
        return []
    trash = stage.with_name(stage.name + ".replaced")
    replaced: list[str] = []
    done: list[str] = []
    swapped: set[str] = set()  # exchanged in one step: the staged folder now holds the old shot
    replacing = replace and any((job / name).exists() for name in names)
    with job_replace_lock(job) if replacing else contextlib.nullcontext():
        try:
            for name in names:
                if (job / name).exists():
                    if not replace:
                        raise FarmError(
                            f"shot {name!r} appeared in {job} while ingesting; pass --replace to overwrite it"
                        )
                    replaced.append(name)
                    if exchange(stage / name, job / name):  # the job holds the old shot or the new one
                        swapped.add(name)
                        done.append(name)
                        continue
                    # no atomic exchange here: the old shot waits in `trash`, restored by the next
                    # ingest if this one dies before the new one is in (`_staging_dir`)
                    trash.mkdir(exist_ok=True)
                    os.rename(job / name, trash / name)
                os.rename(stage / name, job / name)
                done.append(name)
        except BaseException:
            for name in reversed(done):  # put the job back as it was
                if name in swapped:
                    exchange(stage / name, job / name)
                else:
                    shutil.rmtree(job / name, ignore_errors=True)
            for name in replaced:
                if (trash / name).exists() and not (job / name).exists():
                    os.rename(trash / name, job / name)
            raise
    shutil.rmtree(trash, ignore_errors=True)  # the replaced shots, once their successors are in place
    return replaced


# --------------------------------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------------------------------


def ingest(
    job: str | os.PathLike,
    sources: Sequence[str | os.PathLike],
    *,
    decoder: str | Mapping[str, Any] | DecoderSpec | None = None,
    weights: str | os.PathLike | None = None,
    fps: Any = None,
    name: str | None = None,
    latents: str | None = None,
    tensor: str | None = None,
    replace: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    audio_tensor: str | None = None,
    audio_decoder: str | Mapping[str, Any] | SoundSpec | None = None,
    audio_weights: str | os.PathLike | None = None,
    decode_steps: int | None = None,
    timecode: str | None = None,
) -> IngestResult:
    """Create or extend the job store `job` from latent files (see the module docstring).

    `decode_steps`: the denoising steps of a diffusion decoder (``ltx2-diffusion``), recorded in a new
    job's decoder spec (default: the decoder config's).

    `audio_tensor`: the name of each file's audio latents (one shot's, e.g. LTX-2's ``[C, T, M]``, or
    with a batch axis first beside a batch of video latents), stored as the shots' sound; `audio_decoder`
    (a named config such as ``ltx2-audio`` or ``minimax-h3-audio`` with `audio_weights`, or a spec)
    decodes it, and is needed when the job is created.

    >>> ingest("job.zarr", ["renders/latents/"], decoder="ltx2", weights="/models/ltx2-vae")  # doctest: +SKIP
    """
    job = Path(job)
    current = existing_job(job)
    spec = _job_spec(current, decoder, weights, latents)
    skipped: list[Path] = []
    paths = latent_files.expand_sources(list(sources), on_skip=skipped.append)
    found = [latent_files.scan(p, tensor) for p in paths]
    for source in found:  # each file is read whole: its claim (as float32, what ingest stores) comes first
        claim = file_claim_problem(source.shape, 4)
        if claim:
            raise FarmError(f"{source.path}: {claim}")
    target = target_for(spec, current[1] if current else (), exists=current is not None)
    planned = plan_shots(found, target, pattern=name, fps=fps, replace=replace, timecode=timecode)
    audio_spec = _job_audio(job, current is not None, audio_decoder, audio_weights, audio_tensor is not None)
    if audio_tensor is not None and audio_spec is not None:
        planned = [with_audio(p, latent_files.scan(p.source.path, audio_tensor), audio_spec) for p in planned]
    convention = choose_convention(latents, target, known_conventions(found, spec.family))
    if current is None and convention != spec.latents:
        spec = spec_from_json({**spec.to_json(), "latents": convention}, where="--decoder")
    if decode_steps is not None:
        spec = _with_decode_steps(spec, decode_steps, exists=current is not None)
    if current is None:
        spec = decoder_class(spec).check_weights(spec)  # before anything is written; records layout, identity

    cache: dict[Path, np.ndarray] = {}

    def cached(plan: PlannedShot) -> Callable[[], np.ndarray]:
        def read() -> np.ndarray:
            if plan.source.path not in cache:
                cache.clear()  # one file's data at a time
                cache[plan.source.path] = latent_files.load(plan.source)
            return _sample(cache[plan.source.path], plan.sample)

        return read

    def sound(plan: PlannedShot) -> Callable[[], np.ndarray]:
        assert plan.audio is not None
        return lambda: _sample(latent_files.load(plan.audio), plan.sample)  # type: ignore[arg-type]

    sounds = {p.name: sound(p) for p in planned if p.audio is not None}
    replaced = write_staged(job, spec, [(p, cached(p)) for p in planned], existing=current is not None,
                            replace=replace, on_progress=on_progress, audio_spec=audio_spec,
                            sounds=sounds)  # fmt: skip
    warnings = family_warnings(found, spec) + [f"{p}: skipped (not a latent file)" for p in skipped]
    return IngestResult(job, [p.name for p in planned], current is None, replaced, convention, warnings)


def _with_decode_steps(spec: DecoderSpec, steps: int, *, exists: bool) -> DecoderSpec:
    """`spec` with a diffusion decoder's denoising steps (a new job only: its shots share one spec)."""
    if "decode_steps" not in decoder_class(spec).spec_fields:
        raise FarmError(
            f"--decode-steps: the {spec.family} decoder does not denoise; it applies to "
            + ", ".join(f for f, cls in FAMILIES.items() if "decode_steps" in cls.spec_fields)
        )
    if exists and spec.extra.get("decode_steps") != steps:
        raise FarmError(
            "--decode-steps: the job exists and its decoder spec fixes the steps; ingest into a new job"
        )
    if not isinstance(steps, int) or steps < 1:
        raise FarmError(f"--decode-steps {steps!r} is invalid; use 1 or more")
    return spec_from_json({**spec.to_json(), "decode_steps": steps}, where="--decode-steps")


def _audio_sample(sound: np.ndarray, sample: int, label: str) -> np.ndarray:
    return float_latent(np.ascontiguousarray(sound[sample]), label)


def _sample(data: np.ndarray, sample: int | None) -> np.ndarray:
    return data if sample is None else np.ascontiguousarray(data[sample])


def with_audio(plan: PlannedShot, audio: FoundTensor, spec: SoundSpec) -> PlannedShot:
    """`plan` with its sound: `audio` (one shot's, e.g. ``[C, T, M]``, or with the video's batch axis
    first), checked against the audio decoder."""
    import dataclasses

    where = f"{audio.path}" + (f" [{audio.key}]" if audio.key else "")
    shape = audio.shape
    batched = plan.sample is not None
    rank = len(spec.latent_dims) + 1  # with the batch axis
    if batched and (len(shape) != rank or shape[0] <= plan.sample):  # type: ignore[operator]
        raise FarmError(f"{where}: audio latents {list(shape)} do not hold sample {plan.sample} of the video "
                        f"batch; expected {spec.batched_layout} with the video's B")  # fmt: skip
    if not batched and len(shape) == rank and shape[0] == 1:
        raise FarmError(f"{where}: audio latents {list(shape)} are a batch of one beside an unbatched video "
                        "latent; save both with the batch axis or both without")  # fmt: skip
    spec.check_latent(tuple(shape[1:] if batched else shape), where)
    attrs = {**plan.attrs, "audio_source": {"file": str(audio.path.resolve()), "tensor": audio.key}}
    return dataclasses.replace(plan, audio=audio, attrs=attrs)


def _job_audio(
    job: Path, exists: bool, decoder: str | Mapping[str, Any] | SoundSpec | None,
    weights: str | os.PathLike | None, wanted: bool,
) -> SoundSpec | None:  # fmt: skip
    """The job's audio decoder: an existing job's (which `decoder`, when given, must name), or the one to
    create it with. Sound for a job without one is refused."""
    current = None
    if exists:
        current = open_job(job).audio
    given = None
    if decoder is not None:
        raw = decoder if isinstance(decoder, SoundSpec | str) else dict(decoder)
        given = resolve_sound_spec(raw, weights=weights, default_weights=current.weights if current else None)
    if exists:
        if wanted and current is None:
            raise FarmError(
                f"{job}: the job store was created without an audio decoder, so it cannot hold "
                "sound; ingest shots with sound into a new job store (with --audio-decoder)"
            )
        if given is not None and current is not None and given.to_json() != current.to_json():
            raise FarmError(
                f"{job}: the job decodes sound with {current.describe()}, but --audio-decoder "
                f"gives {given.describe()}; omit it to add to the job, or use a new job store"
            )
        return current
    if wanted and given is None:
        raise FarmError("audio latents need an audio decoder when the job is created: --audio-decoder "
                        f"NAME (one of {named_sound_configs()}) --audio-weights PATH (a diffusers "
                        "pipeline folder or the .safetensors checkpoint)")  # fmt: skip
    if given is not None:
        given.check_weights()
    return given


def _job_spec(
    current: tuple[DecoderSpec, list[str]] | None, decoder: Any, weights: Any, latents: str | None
) -> DecoderSpec:
    """The job's spec (an existing job's, whose model `decoder` must then name), or the one to create."""
    if current is None:
        if decoder is None:
            raise FarmError(
                "the job store does not exist yet: give --decoder (a named config with --weights, or a "
                "JSON spec) to create it"
            )
        return resolve_spec(decoder, weights=weights, latents=latents)
    spec = current[0]
    if decoder is not None:
        given = resolve_spec(decoder, weights=weights, latents=spec.latents, dtype=spec.dtype,
                             default_weights=spec.weights)  # fmt: skip
        mine, theirs = given.to_json(), spec.to_json()
        for raw in (mine, theirs):  # the weights given, not what the check recorded of them
            raw["weights"] = {k: v for k, v in raw["weights"].items() if k in ("path", "random_seed")}
        diff = [k for k in ("family", "config", "weights") if mine.get(k) != theirs.get(k)]
        if diff:
            raise FarmError(
                "the job store exists with another decoder: "
                + "; ".join(f"{k}: job has {theirs.get(k)!r}, --decoder gives {mine.get(k)!r}" for k in diff)
                + ". Omit --decoder to add to it, or ingest into a new job store"
            )
    return spec


def add_pipeline_shot(
    job: str | os.PathLike,
    latents: Any,
    *,
    pipeline: Any,
    name: str,
    fps: float,
    num_frames: int | None = None,
    height: int | None = None,
    width: int | None = None,
    decoder: str | Mapping[str, Any] | DecoderSpec | None = None,
    weights: str | os.PathLike | None = None,
    replace: bool = False,
    audio_latents: Any = None,
    audio_decoder: str | Mapping[str, Any] | SoundSpec | None = None,
    audio_weights: str | os.PathLike | None = None,
) -> IngestResult:
    """Write the latents a diffusers video pipeline returned with ``output_type="latent"`` as shots.

    `audio_latents`: the sound, stored beside each shot's video latents: LTX-2's pipeline output's
    ``audio`` (``[B, C, T, M]``, one sample per video), MiniMax-H3's ``audio_latents`` as its after-denoise
    step leaves them (``[2, C, T]``, one video). A new job then records the pipeline's own sound decoder
    (its audio VAE's class and config, and the folder it was loaded from, or `audio_weights`), or
    `audio_decoder`.

    `pipeline` is the pipeline (or its class name): it says the layout and convention of `latents` (see
    :mod:`farm.inputs.pipelines`). `num_frames`, `height` and `width` are what the pipeline was called with:
    they unpack LTX-Video's token sequences and are checked against the latents' decoded size. A batch of B
    videos gives B shots (`name` with ``_{index}`` appended, or a pattern using ``{index}``). The job is
    created when missing (with `decoder`, or the pipeline's own VAE: its config and the folder it was
    loaded from, or `weights`). Safe while a render reads the job's other shots: each shot appears whole,
    by a rename.

    >>> size = dict(num_frames=121, height=704, width=1216)
    >>> video = pipe(prompt, **size, output_type="latent").frames  # doctest: +SKIP
    >>> add_pipeline_shot("job.zarr", video, pipeline=pipe, name="sh010", fps=24, **size)  # doctest: +SKIP
    >>> out = pipe(prompt, **size, output_type="latent")  # LTX-2: sound too  # doctest: +SKIP
    >>> add_pipeline_shot("job.zarr", out.frames, audio_latents=out.audio, pipeline=pipe, name="sh020",
    ...                   fps=24, **size)  # doctest: +SKIP
    """
    job = Path(job)
    current = existing_job(job)
    conv = convention_of(pipeline)
    if current is None and decoder is None:
        decoder = spec_from_pipeline(pipeline, str(weights) if weights else None)
        weights = None
    spec = _job_spec(current, decoder, weights, None if current else conv.latents)
    if spec.family != conv.family:
        raise FarmError(f"{pipeline_name(pipeline)} makes {conv.family} latents but the job's decoder is "
                        f"{spec.family}; use a job store with a {conv.family} decoder")  # fmt: skip
    if spec.hdr != pipeline_hdr(pipeline):
        raise FarmError(f"{pipeline_name(pipeline)} latents decode to {pipeline_hdr(pipeline) or 'SDR'} "
                        f"values but the job's decoder spec says {spec.hdr or 'SDR'} ('hdr'); use a job "
                        "store whose decoder decodes them so")  # fmt: skip
    target = target_for(spec, current[1] if current else (), exists=current is not None)
    data, conv = pipeline_latents(pipeline, latents, target.geometry, num_frames=num_frames, height=height,
                                  width=width)  # fmt: skip
    label = pipeline_name(pipeline)
    convention = choose_convention(None, target, {label: conv.latents})
    layout = "[B, S, D] packed" if conv.packed else decoder_class(spec).pipeline_layout
    record = {"pipeline": label, "latents": conv.latents, "layout": layout, "num_frames": num_frames,
              "height": height, "width": width}  # fmt: skip
    found = FoundTensor(Path(name), "pipeline", None, tuple(data.shape), str(data.dtype),
                        metadata={k: v for k, v in record.items() if v is not None}, label=name)  # fmt: skip
    pattern = name.replace("{", "{{").replace("}", "}}") + ("_{index}" if data.shape[0] > 1 else "")
    if "{index" in name:
        pattern = name
    planned = plan_shots([found], target, pattern=pattern, fps=fps, replace=replace)
    for plan in planned:
        check_pixel_size(plan.latent_shape, target.geometry, frames=num_frames, height=height, width=width,
                         where=f"shot {plan.name!r}")  # fmt: skip
    if current is None:
        spec = decoder_class(spec).check_weights(spec)  # records the weights' layout and identity
    sounds: dict[str, Callable[[], np.ndarray]] = {}
    audio_spec = None
    if audio_latents is not None:
        if current is None and audio_decoder is None:
            audio_decoder = audio_spec_from_pipeline(pipeline, str(audio_weights) if audio_weights else None)
            audio_weights = None
        audio_spec = _job_audio(job, current is not None, audio_decoder, audio_weights, True)
        assert audio_spec is not None  # sound wanted: the job's, or refused
        rank = len(audio_spec.latent_dims)
        sound = to_numpy(audio_latents)
        sound = sound[None] if sound.ndim == rank else sound
        if sound.ndim != rank + 1 or sound.shape[0] != data.shape[0]:
            raise FarmError(
                f"{label} audio latents have shape {list(sound.shape)}; expected {audio_spec.batched_layout} "
                f"with B = {data.shape[0]}, as many as the video latents"
            )
        for p in planned:
            audio_spec.check_latent(tuple(sound.shape[1:]), f"shot {p.name!r} audio")
            sounds[p.name] = functools.partial(_audio_sample, sound, p.sample or 0, label)
    elif current is None and audio_decoder is not None:
        audio_spec = _job_audio(job, False, audio_decoder, audio_weights, False)
    shots = [(p, lambda p=p: np.ascontiguousarray(data[p.sample or 0])) for p in planned]
    floats = [(p, lambda load=load: float_latent(load(), label)) for p, load in shots]
    replaced = write_staged(job, spec, floats, existing=current is not None, replace=replace,
                            audio_spec=audio_spec, sounds=sounds)  # fmt: skip
    return IngestResult(job, [p.name for p in planned], current is None, replaced, convention)
