"""Synthetic jobs for demos, tests and benchmarks: smooth random latents sized for a named decoder config."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from farm.decoders import FAMILIES, DecoderSpec, decoder_class
from farm.decoders.sound_base import SoundSpec
from farm.decoders.user_spec import resolve_sound_spec, resolve_spec, video_family_of
from farm.errors import FarmError
from farm.media.names import FARM_TEMP_TAG, TEMP_SUFFIX
from farm.media.rates import parse_rate
from farm.safe_read import read_json
from farm.store.job import Job, create_job, open_job, write_shot

MAX_SEED = 2**32 - 1  # numpy's and torch's seeds alike
# The sound that goes with each named video config that has one, as each adapter says (`sound_configs`).
SOUND_CONFIGS = {name: sound for cls in FAMILIES.values() for name, sound in cls.sound_configs.items()}


def resolve_decoder(name: str) -> tuple[str, str]:
    """A named config ('ltx2-tiny') → (family, config name)."""
    return video_family_of(name), name


def synth_spec(
    decoder: str | Mapping[str, Any], *, seed: int = 0, dtype: str | None = None, weights: str | None = None
) -> DecoderSpec:
    """The spec of a synthetic job: a named config, or a decoder spec (``{"family": ..., "config": {...}}``,
    e.g. a custom config; as JSON text on the command line) whose weights default to random ones of `seed`
    (float32 unless it names a released config by name)."""
    return resolve_spec(decoder, weights=weights, dtype=dtype, default_weights={"random_seed": seed},
                        object_dtype="float32")  # fmt: skip


def synth(
    job_path: str | Path,
    *,
    decoder: str | Mapping[str, Any] = "ltx2-tiny",
    shots: int = 1,
    frames: int = 17,
    height: int = 128,
    width: int = 192,
    seed: int = 0,
    fps: float | str = 24.0,
    dtype: str | None = None,
    weights: str | None = None,
    overwrite: bool = False,
    audio: bool | str | Mapping[str, Any] | SoundSpec = False,
    audio_weights: str | None = None,
) -> Job:
    """Write a job of `shots` random (smooth) latents sized to decode to frames x height x width pixels,
    for `decoder`: a named config, or a decoder spec (its weights default to random ones of `seed`).
    `audio`: each shot also gets a sound latent as long as its frames, for `SOUND_CONFIGS`' audio config
    of the named decoder (True), or for the audio config or spec given (its weights default to random
    ones of `seed`, or `audio_weights`)."""
    spec = synth_spec(decoder, seed=seed, dtype=dtype, weights=weights)
    sound = synth_audio_spec(audio, decoder, seed=seed, weights=audio_weights) if audio else None
    decoder = decoder if isinstance(decoder, str) else spec.describe()
    cls = decoder_class(spec)
    spec = cls.check_weights(spec)  # refused now, not at render; records the weights' layout and identity
    g = cls.geometry_for(spec.config)
    channels = cls.latent_channels_for(spec.config)
    if shots < 1:
        raise FarmError(f"--shots {shots} is invalid; use 1 or more")
    if frames < 1 or g.latent_frames(frames) is None:
        valid = [n for n in range(1, frames + 2 * g.temporal_scale + 1) if g.latent_frames(n) is not None]
        nearby = [n for n in (max([n for n in valid if n < frames], default=None),
                              min(n for n in valid if n > frames)) if n is not None]  # fmt: skip
        form = (f"{g.clip[1]}k + 1 + {g.temporal_scale}m (m below {g.clip[0]})" if g.clip
                else f"1 + {g.temporal_scale}k" if g.causal else f"{g.temporal_scale}k")  # fmt: skip
        raise FarmError(
            f"--frames {frames} cannot be produced by {decoder}: use {form} frames "
            f"(e.g. {' or '.join(map(str, nearby))})"
        )
    for name, value in (("--height", height), ("--width", width)):
        if value < g.spatial_scale or value % g.spatial_scale:
            raise FarmError(
                f"{name} {value} cannot be produced by {decoder}: use a multiple of {g.spatial_scale} "
                f"(e.g. {max(1, value // g.spatial_scale) * g.spatial_scale})"
            )
    least = g.pixel_shape(g.min_block)  # the smallest shot: one decode call of it
    for name, value, low in (("--frames", frames, least[0]), ("--height", height, least[1]),
                             ("--width", width, least[2])):  # fmt: skip
        if value < low:
            raise FarmError(
                f"{name} {value} is smaller than {decoder} decodes at once (its attention window): use at "
                f"least {low} (the smallest shot is {least[0]} frames of {least[2]}x{least[1]})"
            )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise FarmError(f"--seed {seed!r} is invalid; use a whole number from 0 to {MAX_SEED}")
    rate = parse_rate(fps)  # a number or a ratio ("24000/1001"), refused here before anything is written
    target = Path(job_path)
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise FarmError(f"job store {str(target)!r} already exists; choose a new path, or overwrite=True "
                            "to replace it")  # fmt: skip
        check_replaceable_job(target)
    f = g.latent_frames(frames)
    assert f is not None
    h, w = height // g.spatial_scale, width // g.spatial_scale
    rng = np.random.default_rng(seed)
    with staged_job(target) as stage:
        create_job(stage, spec, overwrite=True, audio=sound)  # the empty folder staged_job made
        sound_rng = np.random.default_rng([seed, 1])  # its own stream: the video latents stay as without
        for k in range(shots):
            audio_latent = None
            if sound is not None:
                a, b, c = audio_latent_shape(sound, frames, float(rate))
                audio_latent = smooth_latent(sound_rng, (a, b, c, 1))[..., 0]
            write_shot(stage, f"shot{k:03d}", smooth_latent(rng, (channels, f, h, w)), fps=fps,
                       attrs={"synthetic": True, "seed": seed}, audio=audio_latent)  # fmt: skip
    return open_job(job_path)


def synth_audio_spec(
    audio: bool | str | Mapping[str, Any] | SoundSpec, decoder: str | Mapping[str, Any], *, seed: int,
    weights: str | None,
) -> SoundSpec:
    """The audio spec of a synthetic job with sound: `audio` True takes the named video config's own sound
    (`SOUND_CONFIGS`); a name, JSON text or spec is taken as given. Weights: `weights`, else the spec's,
    else random ones of `seed`."""
    if audio is True:
        if not isinstance(decoder, str) or decoder not in SOUND_CONFIGS:
            raise FarmError(
                f"--audio: {decoder if isinstance(decoder, str) else 'a custom decoder spec'} has no sound "
                f"config of its own (those with one: {sorted(SOUND_CONFIGS)}); name one with --audio-decoder "
                f"({', '.join(sorted(set(SOUND_CONFIGS.values())))})"
            )
        audio = SOUND_CONFIGS[decoder]
    given = audio if isinstance(audio, str | SoundSpec) else dict(audio)  # type: ignore[arg-type]
    spec = resolve_sound_spec(given, weights=weights, default_weights={"random_seed": seed})
    spec.check_weights()
    return spec


def audio_latent_shape(spec: SoundSpec, frames: int, fps: float) -> tuple[int, int, int]:
    """The audio latent (in the sound family's layout) that lasts as long as `frames` video frames at
    `fps`, rounded to whole latent frames as LTX-2's and MiniMax-H3's pipelines round them (at least one)."""
    latent_frames = max(1, round(frames / fps * spec.latents_per_second))
    a, b, c = spec.latent_shape(latent_frames)
    return a, b, c


def is_job_store(path: Path) -> bool:
    """Whether `path` is a folder holding a farm job store's root metadata (``zarr.json`` of a Zarr v3
    group whose attribute 'farm' names a decoder), read without zarr (a damaged one counts as not)."""
    try:
        meta = read_json(path / "zarr.json", f"{str(path / 'zarr.json')!r}")
    except (OSError, FarmError):
        return False
    farm_attr = meta.get("attributes", {}).get("farm") if isinstance(meta, dict) else None
    return (
        not path.is_symlink() and meta.get("node_type") == "group"
        and isinstance(farm_attr, dict) and "decoder" in farm_attr
    )  # fmt: skip


def check_replaceable_job(path: Path) -> None:
    """`--overwrite` replaces a farm job store and nothing else: any other file or folder is refused."""
    if not is_job_store(path):
        raise FarmError(
            f"{str(path)!r} exists and is not a farm job store; --overwrite replaces only a job store, "
            "so nothing was changed: choose another path or remove it yourself"
        )


@contextlib.contextmanager
def staged_job(target: Path):
    """Yield a new folder beside `target` to write a job into; on success it replaces `target` (a job
    store, checked by the caller) in one rename, on failure it is removed and `target` is untouched."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{target.name}{FARM_TEMP_TAG}", suffix=TEMP_SUFFIX,
                                      dir=target.parent))  # fmt: skip
    except OSError as exc:
        raise FarmError(f"cannot write the job store {str(target)!r}: {exc.strerror or exc}") from None
    try:
        yield stage
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}{FARM_TEMP_TAG}", suffix=TEMP_SUFFIX,
                                        dir=target.parent))  # fmt: skip
            os.replace(target, old)  # onto the empty folder mkdtemp made
            os.replace(stage, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def smooth_latent(rng: np.random.Generator, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Random latents that vary slowly in space and time (a coarse grid, linearly interpolated)."""
    c, f, h, w = shape
    coarse = rng.standard_normal((c, max(2, math.ceil(f / 2) + 1), max(2, h // 2 + 1), max(2, w // 2 + 1)))
    out = coarse
    for axis, n in ((1, f), (2, h), (3, w)):
        src = np.linspace(0, out.shape[axis] - 1, n)
        lo = np.floor(src).astype(int)
        hi = np.minimum(lo + 1, out.shape[axis] - 1)
        t = (src - lo).reshape([-1 if a == axis else 1 for a in range(4)])
        out = np.take(out, lo, axis=axis) * (1 - t) + np.take(out, hi, axis=axis) * t
    return out.astype(np.float32)
