"""A decoder spec as a user gives it, for video and sound decoders alike: a named config (``ltx2``,
``ltx2-audio``), a JSON object as text, a JSON file, a mapping, or a spec already parsed; with the weights
given beside it (``--weights``, ``--audio-weights``), else the spec's own, else a default. One reader for
both kinds; each kind's validator (`farm.decoders.base.parse_spec`,
`farm.decoders.sound.parse_sound_spec`) then checks the fields."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError
from farm.safe_read import parse_json, read_json

if TYPE_CHECKING:
    from farm.decoders.base import DecoderSpec
    from farm.decoders.sound_base import SoundSpec


@dataclass(frozen=True)
class SpecKind:
    """What differs between reading a video and a sound decoder spec."""

    option: str  # the option that names it ("--decoder")
    weights_option: str  # the option that gives its weights ("--weights")
    weights_hint: str  # what those weights may be
    family_of: Callable[[str], str]  # a named config → its family (FarmError for an unknown name)
    random_weights_hint: bool  # whether to show how to ask for random weights


def video_family_of(name: str) -> str:
    """The video decoder family of a named config ('ltx2-tiny' → 'ltx2')."""
    from farm.decoders import FAMILIES

    for family, cls in FAMILIES.items():
        if name in cls.named_configs:
            return family
    known = sorted(n for cls in FAMILIES.values() for n in cls.named_configs)
    raise FarmError(f"unknown decoder {name!r}; choose one of {known}")


def sound_family_of(name: str) -> str:
    """The sound decoder family of a named config ('minimax-h3-audio-tiny' → 'minimax-h3-audio')."""
    from farm.decoders.sound import sound_family_of as family_of

    return family_of(name)


VIDEO = SpecKind("--decoder", "--weights", "a diffusers VAE folder or one .safetensors file", video_family_of,
                 random_weights_hint=True)  # fmt: skip
SOUND = SpecKind("--audio-decoder", "--audio-weights", "the diffusers pipeline folder holding the sound "
                 "decoder's audio_vae/ (and vocoder/), or the model's .safetensors checkpoint",
                 sound_family_of,
                 random_weights_hint=False)  # fmt: skip


def given_by_name(given: Any) -> bool:
    """Whether a user gave a spec by its named config (not as JSON text or a JSON file)."""
    if not isinstance(given, str):
        return False
    text = given.strip()
    return not (text.startswith("{") or text.endswith(".json") or Path(text).is_file())


def read_spec(
    given: Any, kind: SpecKind, *, weights: str | os.PathLike[str] | None = None,
    default_weights: Mapping[str, Any] | None = None, where: str | None = None,
) -> dict[str, Any]:
    """The JSON object of the spec a user gave (`given`: a named config, JSON text, a JSON file, a mapping
    or a parsed spec), with its weights: `weights` when given, else the spec's, else `default_weights`;
    FarmError naming `where` (default: the kind's option) when there are none."""
    where = where or kind.option
    if hasattr(given, "to_json"):  # a parsed spec
        raw = given.to_json()
    elif isinstance(given, Mapping):
        raw = dict(given)
    elif isinstance(given, str) and given_by_name(given):
        raw = {"family": kind.family_of(given.strip()), "config": given.strip()}
    elif isinstance(given, str):
        text = given.strip()
        if text.startswith("{"):
            raw = parse_json(text, where)
        else:
            try:
                raw = read_json(text, f"{where} {text}")
            except FileNotFoundError:
                raise FarmError(f"{where} {text}: no such file; give a JSON decoder spec file or a "
                                "named config") from None  # fmt: skip
    else:
        raise FarmError(f"{where}: expected a config name or a JSON object, got {type(given).__name__}")
    if not isinstance(raw, dict):
        raise FarmError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if weights is not None:
        raw["weights"] = {"path": str(weights)}
    elif "weights" not in raw and default_weights is not None:
        raw["weights"] = dict(default_weights)
    elif "weights" not in raw:
        random = (f", or, for tests and demos only, random weights: "
                  f"{where} '{json.dumps({**raw, 'weights': {'random_seed': 0}})}'"
                  if kind.random_weights_hint else "")  # fmt: skip
        raise FarmError(
            f"{where} {raw.get('config')!r} needs weights: {kind.weights_option} PATH ({kind.weights_hint}), "
            f'or a JSON spec with "weights": {{"path": PATH}}{random}'
        )
    return raw


def resolve_spec(
    given: Any, *, weights: str | os.PathLike[str] | None = None,
    default_weights: Mapping[str, Any] | None = None, latents: str | None = None, dtype: str | None = None,
    object_dtype: str = "bfloat16", where: str = "--decoder",
) -> DecoderSpec:
    """A video decoder spec from what a user gave (:func:`read_spec`), with `latents` and `dtype` set where
    given. Without a dtype, a ``-tiny`` named config decodes in float32, another spec given as a JSON
    object in `object_dtype`, a released config named in bfloat16."""
    from farm.decoders import spec_from_json

    raw = read_spec(given, VIDEO, weights=weights, default_weights=default_weights, where=where)
    if latents is not None:
        raw["latents"] = latents
    if dtype is not None:
        raw["dtype"] = dtype
    elif "dtype" not in raw:
        tiny = str(raw.get("config", "")).endswith("-tiny")
        raw["dtype"] = "float32" if tiny else "bfloat16" if given_by_name(given) else object_dtype
    return spec_from_json(raw, where=where)


def resolve_sound_spec(
    given: Any, *, weights: str | os.PathLike[str] | None = None,
    default_weights: Mapping[str, Any] | None = None, where: str = "--audio-decoder",
) -> SoundSpec:
    """A sound decoder spec from what a user gave (:func:`read_spec`)."""
    from farm.decoders.sound import parse_sound_spec

    raw = read_spec(given, SOUND, weights=weights, default_weights=default_weights, where=where)
    return parse_sound_spec(raw, where=where)
