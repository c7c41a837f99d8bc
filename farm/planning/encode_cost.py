"""What a video encode costs against what it encodes: codec, preset and the frames' complexity.

Pure: numbers in, numbers out. x264, x265 and ProRes spend time per pixel and per bit they write, so a
segment of noise-like frames (a decoder with random weights) costs several times one of a smooth clip at
the same settings, and a slow preset several times a fast one. A cost model's encode figures
(`CostModel.encode_s_per_pixel`, `cores_encode_s_per_pixel`) were measured for one codec, preset and kind of
frames (`CostModel.encode_reference`); :func:`for_encoding` scales them to another by the ratio of the
stored rates (``farm/planning/encode_rates.json``, measured by ``benchmarks/measure_encode_cost.py``): per
codec and preset, one core's seconds per pixel-frame as ``fixed + per_bit * bits_per_pixel``.

The bits per pixel of a render's frames are known once its first segments are written (a render reports
them, `farm -v render`); before that, a plan assumes the content the cost model was measured on unless told
(``farm.encoded-bits-per-pixel``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from farm.errors import FarmError

PRORES = ("prores_hq", "prores_4444")  # no preset: one rate each


@dataclass(frozen=True)
class EncodeRate:
    """One core's seconds per output pixel-frame of an encode: ``fixed + per_bit * bits_per_pixel``."""

    fixed: float
    per_bit: float

    def seconds_per_pixel(self, bits_per_pixel: float) -> float:
        return self.fixed + self.per_bit * max(0.0, bits_per_pixel)


@dataclass(frozen=True)
class EncodeReference:
    """What a cost model's encode figures were measured on: codec, preset, bits per pixel written."""

    codec: str = "h264"
    preset: str = "veryfast"
    bits_per_pixel: float = 3.77
    frames: str = "random-weight noise, the hardest to encode"  # what they were, in words

    def to_json(self) -> dict[str, Any]:
        return {"codec": self.codec, "preset": self.preset, "bits_per_pixel": self.bits_per_pixel,
                "frames": self.frames}  # fmt: skip

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> EncodeReference:
        frames = str(raw.get("frames", cls.frames))
        return cls(str(raw["codec"]), str(raw["preset"]), float(raw["bits_per_pixel"]), frames)


def rate_key(codec: str, preset: str | None) -> str:
    return codec if codec in PRORES else f"{codec}/{preset}"


@cache
def stored_rates() -> dict[str, EncodeRate]:
    """The measured rates per ``codec/preset`` (ProRes: per codec)."""
    raw = json.loads((resources.files("farm.planning") / "encode_rates.json").read_text())
    return {key: EncodeRate(float(v["fixed"]), float(v["per_bit"])) for key, v in raw["rates"].items()}


def rate_for(codec: str, preset: str | None, rates: Mapping[str, EncodeRate] | None = None) -> EncodeRate:
    """The stored rate of `codec` at `preset`; a FarmError naming the measured ones when there is none."""
    rates = stored_rates() if rates is None else rates
    key = rate_key(codec, preset)
    if key not in rates:
        raise FarmError(
            f"no measured encode cost for {key!r} (benchmarks/measure_encode_cost.py); measured: "
            f"{', '.join(sorted(rates))}"
        )
    return rates[key]


def encode_factor(
    reference: EncodeReference,
    codec: str,
    preset: str | None,
    bits_per_pixel: float | None = None,
    rates: Mapping[str, EncodeRate] | None = None,
) -> float:
    """How many times the `reference` encode an encode with `codec`/`preset` of frames written at
    `bits_per_pixel` costs (None: the reference's frames). A codec or preset without a measured rate
    costs as the reference does (the factor is 1)."""
    bits = reference.bits_per_pixel if bits_per_pixel is None else bits_per_pixel
    try:
        base = rate_for(reference.codec, reference.preset, rates)
        wanted = rate_for(codec, preset, rates)
    except FarmError:
        return 1.0
    return wanted.seconds_per_pixel(bits) / base.seconds_per_pixel(reference.bits_per_pixel)


def fit_rate(samples: list[tuple[float, float]]) -> EncodeRate:
    """``fixed`` and ``per_bit`` (both ≥ 0) by least squares on relative error from measured
    ``(bits_per_pixel, seconds_per_pixel)`` pairs of one codec and preset."""
    import numpy as np

    from farm.planning.nnls import nnls

    if len(samples) < 2:
        raise FarmError("fitting an encode rate needs at least 2 measured encodes")
    a = np.array([[1.0 / s, bits / s] for bits, s in samples])
    fixed, per_bit = nnls(a, np.ones(len(samples)))
    return EncodeRate(float(fixed), float(per_bit))


__all__ = ["EncodeRate", "EncodeReference", "encode_factor", "fit_rate", "rate_for", "stored_rates"]
