"""Synthetic jobs for demos, tests and benchmarks: smooth random latents sized for a named decoder config."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from farm.decoders import FAMILIES, DecoderSpec, decoder_class, spec_from_json
from farm.errors import FarmError
from farm.store import Job, create_job, open_job, write_shot


def resolve_decoder(name: str) -> tuple[str, str]:
    """A named config ('ltx2-tiny') → (family, config name)."""
    for family, cls in FAMILIES.items():
        if name in cls.named_configs:
            return family, name
    known = sorted(n for cls in FAMILIES.values() for n in cls.named_configs)
    raise FarmError(f"unknown decoder {name!r}; choose one of {known}")


def synth_spec(
    decoder: str, *, seed: int = 0, dtype: str | None = None, weights: str | None = None
) -> DecoderSpec:
    family, config = resolve_decoder(decoder)
    raw = {
        "family": family,
        "config": config,
        "weights": {"path": str(weights)} if weights else {"random_seed": seed},
        "dtype": dtype or ("float32" if config.endswith("-tiny") else "bfloat16"),
    }
    return spec_from_json(raw, where="--decoder")


def synth(
    job_path: str | Path,
    *,
    decoder: str = "ltx2-tiny",
    shots: int = 1,
    frames: int = 17,
    height: int = 128,
    width: int = 192,
    seed: int = 0,
    fps: float = 24.0,
    dtype: str | None = None,
    weights: str | None = None,
    overwrite: bool = False,
) -> Job:
    """Write a job of `shots` random (smooth) latents sized to decode to frames x height x width pixels."""
    spec = synth_spec(decoder, seed=seed, dtype=dtype, weights=weights)
    cls = decoder_class(spec)
    spec = cls.check_weights(spec)  # refused now, not at render; records the weights' layout and identity
    g = cls.geometry_for(spec.config)
    channels = cls.latent_channels_for(spec.config)
    if shots < 1:
        raise FarmError(f"--shots {shots} is invalid; use 1 or more")
    valid_f = (frames - 1) % g.temporal_scale == 0 if g.causal else frames % g.temporal_scale == 0
    if frames < 1 or not valid_f:
        lo = (max(frames - 1, 0) // g.temporal_scale) * g.temporal_scale + 1
        raise FarmError(
            f"--frames {frames} cannot be produced by {decoder}: use 1 + {g.temporal_scale}k frames "
            f"(e.g. {lo} or {lo + g.temporal_scale})"
        )
    for name, value in (("--height", height), ("--width", width)):
        if value < g.spatial_scale or value % g.spatial_scale:
            raise FarmError(
                f"{name} {value} cannot be produced by {decoder}: use a multiple of {g.spatial_scale} "
                f"(e.g. {max(1, value // g.spatial_scale) * g.spatial_scale})"
            )
    f = (frames - 1) // g.temporal_scale + 1 if g.causal else frames // g.temporal_scale
    h, w = height // g.spatial_scale, width // g.spatial_scale
    create_job(job_path, spec, overwrite=overwrite)
    rng = np.random.default_rng(seed)
    for k in range(shots):
        write_shot(job_path, f"shot{k:03d}", smooth_latent(rng, (channels, f, h, w)), fps=fps,
                   attrs={"synthetic": True, "seed": seed})  # fmt: skip
    return open_job(job_path)


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
