"""The sound decoder families and what the rest of farm asks of a sound spec, whatever its family.

Adding a sound model: a `farm.decoders.sound_base.SoundSpec` subclass in the model's folder
(``farm/decoders/<model>/audio.py``), plus one entry in `SOUND_FAMILIES` (docs/decoders.md "Sound").
"""

from __future__ import annotations

import json
import threading
from typing import Any

from farm.decoders.base import superseded_config
from farm.decoders.ltx2.audio import AudioSpec as LTX2AudioSpec
from farm.decoders.minimax_h3.audio import MiniMaxH3AudioSpec
from farm.decoders.sound_base import SoundDecoder, SoundSpec, samples_for_frames
from farm.errors import FarmError

SOUND_FAMILIES: dict[str, type[SoundSpec]] = {
    "ltx2-audio": LTX2AudioSpec,
    "minimax-h3-audio": MiniMaxH3AudioSpec,
}
# The family of a spec that names none (farm's first sound family; job stores wrote it always)
DEFAULT_SOUND_FAMILY = "ltx2-audio"


def named_sound_configs() -> list[str]:
    return sorted(name for cls in SOUND_FAMILIES.values() for name in cls.named_configs)


def sound_family_of(name: str) -> str:
    """The sound decoder family of a named config ('ltx2-audio-tiny' → 'ltx2-audio')."""
    for family, cls in SOUND_FAMILIES.items():
        if name in cls.named_configs:
            return family
    raise FarmError(f"unknown audio config {name!r}; named configs: {named_sound_configs()} (or a JSON audio "
                    "decoder spec)")  # fmt: skip


def parse_sound_spec(raw: Any, where: str = "audio decoder spec") -> SoundSpec:
    """Validate an audio decoder spec of any family; errors name the field and what would be valid."""
    if isinstance(raw, SoundSpec):
        return raw
    if not isinstance(raw, dict):
        raise FarmError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    family = raw.get("family")
    if family is None:
        config = raw.get("config")
        named = isinstance(config, str) and config in named_sound_configs()
        family = sound_family_of(config) if named else DEFAULT_SOUND_FAMILY  # type: ignore[arg-type]
    if family not in SOUND_FAMILIES:
        raise FarmError(f"{where}: unknown audio decoder family {family!r}; known: {sorted(SOUND_FAMILIES)}")
    return SOUND_FAMILIES[family].parse(raw, where)


_cache: dict[tuple[str, str], SoundDecoder] = {}
_cache_lock = threading.Lock()


def load_sound_decoder(spec: SoundSpec | dict[str, Any], device: str = "cpu") -> SoundDecoder:
    """The sound decoder of `spec` on `device`, built once per process."""
    spec = parse_sound_spec(spec)
    key = (json.dumps(spec.to_json(), sort_keys=True), device)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = spec.build_decoder(device)
    return _cache[key]


def superseded_sound(identity: Any) -> str | None:
    """Why a render identity's sound (``outputs`` → ``audio`` → ``decoder``) was decoded with an earlier
    revision of a named audio config than farm decodes now, or None."""
    outputs = identity.get("outputs") if isinstance(identity, dict) else None
    audio = outputs.get("audio") if isinstance(outputs, dict) else None
    if not isinstance(audio, dict):
        return None
    return superseded_config(audio.get("decoder"), SOUND_FAMILIES)


def sound_spec_from_pipeline(pipeline: Any, weights: str | None = None) -> dict[str, Any]:
    """The audio decoder spec (JSON) of a diffusers pipeline's own sound decoder, by its ``audio_vae``'s
    class: its config and the folder it was loaded from, or `weights`."""
    vae = getattr(pipeline, "audio_vae", None)
    if vae is None:
        raise FarmError("give audio_decoder= (the pipeline has no audio_vae to take it from)")
    for cls in SOUND_FAMILIES.values():
        if type(vae).__name__ == cls.audio_vae_class:
            return cls.spec_from_pipeline(pipeline, weights)
    known = sorted(cls.audio_vae_class for cls in SOUND_FAMILIES.values())
    raise FarmError(f"farm has no sound decoder for the pipeline's {type(vae).__name__}; it decodes {known}")


__all__ = ["SOUND_FAMILIES", "SoundDecoder", "SoundSpec", "load_sound_decoder", "parse_sound_spec",
           "samples_for_frames", "sound_family_of", "sound_spec_from_pipeline",
           "superseded_sound"]  # fmt: skip
