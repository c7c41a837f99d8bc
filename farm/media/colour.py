"""Colour spaces of decoded frames and of output files, converted by OpenColorIO's built-in ACES config.

Every conversion goes through one pinned built-in config, :data:`OCIO_CONFIG` (``ocio://`` +
the name; in OpenColorIO from 2.3 on), so a render converts the same way on every machine with that
config. farm's space names (:data:`SPACES`) map to that config's colour spaces:

=================  ===============================  ==========================  ===========================
farm name          OpenColorIO colour space         EXR ``colorInteropID``      what it is
=================  ===============================  ==========================  ===========================
``g24_rec709``     ``Gamma 2.4 Rec.709 - Texture``  ``g24_rec709_display``      an SDR decode, as decoded
``lin_rec709``     ``Linear Rec.709 (sRGB)``        ``lin_rec709_scene``        scene-linear Rec.709
``acescg``         ``ACEScg``                       ``lin_ap1_scene``           scene-linear AP1 (ACEScg)
``acescct``        ``ACEScct``                      ``ocio:acescct_ap1_scene``  ACEScct log codes, AP1
=================  ===============================  ==========================  ===========================

An SDR decode is display-referred Rec.709 (BT.1886, gamma 2.4), what farm's EXR frames have always said
(``g24_rec709_display``); ``--colorspace acescg`` on it is OpenColorIO's conversion from
``Gamma 2.4 Rec.709 - Texture`` (the inverse 2.4 power, then the Rec.709 → AP1 matrix with its
Bradford D65 → D60 adaptation). HDR decodes are scene-linear already (`farm.media.hdr`).

Frames are numpy ``[..., 3]`` RGB; float32 comes back. Needs the ``opencolorio`` package
(``pip install 'farm-decode[colour]'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from farm.errors import FarmError

__all__ = [
    "OCIO_CONFIG",
    "SPACES",
    "ColourSpace",
    "colour_available",
    "colour_space",
    "convert",
    "frames_colour_attributes",
    "ocio_processor",
    "output_space",
    "space_attributes",
    "unit_float32",
]

# Pinned, so that conversions do not change when OpenColorIO ships a newer default config.
OCIO_CONFIG = "studio-config-v2.1.0_aces-v1.3_ocio-v2.3"

# Rec.709 / sRGB primaries and D65; AP1 primaries and the ACES white (EXR chromaticities: R, G, B, W xy).
REC709_CHROMATICITIES = (0.64, 0.33, 0.30, 0.60, 0.15, 0.06, 0.3127, 0.3290)
AP1_CHROMATICITIES = (0.713, 0.293, 0.165, 0.830, 0.128, 0.044, 0.32168, 0.33767)
# Rec.2020 primaries and D65 (the HLG master's)
REC2020_CHROMATICITIES = (0.708, 0.292, 0.170, 0.797, 0.131, 0.046, 0.3127, 0.3290)


@dataclass(frozen=True)
class ColourSpace:
    """One colour space farm decodes to or writes: its OpenColorIO name and how files label it."""

    name: str  # farm's name (--colorspace, frames.zarr's attributes)
    ocio: str  # the colour space in OCIO_CONFIG
    interop_id: str  # the Color Interop Forum ID (OpenEXR's colorInteropID)
    chromaticities: tuple[float, ...]  # EXR chromaticities: red, green, blue, white xy
    linear: bool  # scene-linear values (False: encoded by a transfer function)
    description: str  # the EXR colorEncoding text
    primaries: str  # frames.zarr's colour_primaries: bt709, bt2020 (FFmpeg's names) or aces_ap1
    transfer: str  # frames.zarr's transfer_characteristics: bt709 (FFmpeg's name), linear or acescct


SPACES: dict[str, ColourSpace] = {
    s.name: s
    for s in (
        ColourSpace("g24_rec709", "Gamma 2.4 Rec.709 - Texture", "g24_rec709_display", REC709_CHROMATICITIES,
                    False, "display-referred: BT.709 primaries, BT.1886 (gamma 2.4) encoded, as decoded",
                    "bt709", "bt709"),
        ColourSpace("lin_rec709", "Linear Rec.709 (sRGB)", "lin_rec709_scene", REC709_CHROMATICITIES,
                    True, "scene-linear: BT.709 primaries, D65", "bt709", "linear"),
        ColourSpace("acescg", "ACEScg", "lin_ap1_scene", AP1_CHROMATICITIES,
                    True, "scene-linear: ACES AP1 primaries, ACES white (ACEScg)", "aces_ap1", "linear"),
        ColourSpace("acescct", "ACEScct", "ocio:acescct_ap1_scene", AP1_CHROMATICITIES,
                    False, "ACEScct log codes: ACES AP1 primaries (ACES S-2016-001)", "aces_ap1", "acescct"),
        ColourSpace("lin_rec2020", "Linear Rec.2020", "lin_rec2020_scene", REC2020_CHROMATICITIES,
                    True, "scene-linear: BT.2020 primaries, D65", "bt2020", "linear"),
    )
}  # fmt: skip
# What EXR outputs and ProRes video may be written in: an SDR decode's own space too; an HDR decode's only
# scene-referred ones (an HDR render's video is its HLG master).
OUTPUT_SPACES = ("g24_rec709", "lin_rec709", "acescg", "acescct")
HDR_OUTPUT_SPACES = ("lin_rec709", "acescg", "acescct")


def colour_available() -> bool:
    """Whether the ``opencolorio`` package is installed (colour conversions need it)."""
    try:
        import PyOpenColorIO  # noqa: F401
    except ImportError:
        return False
    return True


def colour_space(name: str, where: str = "colour space") -> ColourSpace:
    """The space called `name`; FarmError naming the valid ones otherwise."""
    if name not in SPACES:
        raise FarmError(f"{where}: unknown colour space {name!r}; choose one of {list(SPACES)}")
    return SPACES[name]


def output_space(name: str, hdr: bool, where: str = "--colorspace") -> ColourSpace:
    """The space an output asks for (`--colorspace`), checked against what a decode can be written in:
    an SDR decode (`hdr` False) any of OUTPUT_SPACES, an HDR decode HDR_OUTPUT_SPACES."""
    valid = HDR_OUTPUT_SPACES if hdr else OUTPUT_SPACES
    if name not in valid:
        kind = "an HDR render" if hdr else "an SDR render"
        raise FarmError(f"{where}: {name!r} is not a colour space {kind} writes; choose one of {list(valid)}")
    return SPACES[name]


def space_attributes(name: str) -> dict[str, str]:
    """What frames.zarr's attributes say of frames in space `name` (JSON)."""
    space = colour_space(name)
    return {"colour_space": space.name, "ocio_colorspace": space.ocio, "ocio_config": f"ocio://{OCIO_CONFIG}",
            "color_interop_id": space.interop_id}  # fmt: skip


def frames_colour_attributes(name: str) -> dict[str, Any]:
    """What frames.zarr's frames array says of frames in space `name`: `space_attributes`, the primaries
    and the transfer, and for scene-linear values ``valid_range`` None (no such attribute: they are not
    bounded by [0, 1], nor is 1.0 white; `farm.store.frames` removes it)."""
    space = colour_space(name)
    return {**space_attributes(name), "colour_primaries": space.primaries,
            "transfer_characteristics": space.transfer,
            **({"valid_range": None, "colour_range": None} if space.linear else {})}  # fmt: skip


def _ocio() -> Any:
    try:
        import PyOpenColorIO as ocio
    except ImportError as e:
        raise FarmError(
            "colour conversions need the 'opencolorio' package; install it with "
            "pip install 'farm-decode[colour]'"
        ) from e
    return ocio


@lru_cache(maxsize=32)
def ocio_processor(source: str, target: str) -> Any:
    """OpenColorIO's CPU processor from farm space `source` to `target` (cached per process)."""
    ocio = _ocio()
    config = ocio.Config.CreateFromFile(f"ocio://{OCIO_CONFIG}")
    src, dst = colour_space(source).ocio, colour_space(target).ocio
    # LOSSLESS: OCIO's default optimisation swaps pow/log/exp for fast approximations (gamma 2.4 of 1.0
    # gives 1.000024); lossless keeps the config's exact curves.
    return config.getProcessor(src, dst).getOptimizedCPUProcessor(
        ocio.BIT_DEPTH_F32, ocio.BIT_DEPTH_F32, ocio.OPTIMIZATION_LOSSLESS
    )


def unit_float32(frames: np.ndarray) -> np.ndarray:
    """Frames as float32 code values in [0, 1]: uint8 levels / 255, uint16 / 65535, floats as they are."""
    if frames.dtype in (np.uint8, np.uint16):
        return frames.astype(np.float32) / (255.0 if frames.dtype == np.uint8 else 65535.0)
    return frames.astype(np.float32)


def convert(frames: Any, source: str, target: str) -> np.ndarray:
    """RGB values ``[..., 3]`` in space `source` → float32 in space `target` (OpenColorIO's conversion).

    The same space on both sides returns the values as float32, unconverted."""
    colour_space(source, "convert: source")
    colour_space(target, "convert: target")
    pixels = np.array(frames, dtype=np.float32, copy=True, order="C")
    if pixels.ndim < 1 or pixels.shape[-1] != 3:
        raise FarmError(f"convert: frames must be RGB [..., 3], got shape {tuple(pixels.shape)}")
    if source == target or pixels.size == 0:
        return pixels
    ocio_processor(source, target).applyRGB(pixels.reshape(-1))  # in place, on the flat buffer
    return pixels
