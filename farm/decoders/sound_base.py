"""What every sound decoder family provides: the spec a job records, its timing, its latent checks, and a
decoder that turns one shot's audio latent into a waveform.

An audio decoder spec (JSON, kept in the job store beside the video decoder's):

    {"family": "ltx2-audio" | "minimax-h3-audio" | ...,
     "config": a named config | the model's constructor arguments,
     "weights": {"path": "/models/..."} | {"random_seed": 0},
     "dtype": "float32"}

A family is a `SoundSpec` subclass in its model's folder (``farm/decoders/<model>/audio.py``), listed in
`farm.decoders.sound.SOUND_FAMILIES`; nothing outside the family's folder asks which family a spec is.
Everything here is pure (no torch): the driver plans and checks with it, and only `build_decoder` (on a
worker) imports torch and diffusers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from farm.decoders.base import CONFIG_REVISION
from farm.errors import FarmError


class SoundDecoder(Protocol):
    """A sound decoder on one device, weights loaded."""

    @property
    def sample_rate(self) -> int: ...

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """One shot's audio latent → waveform ``[channels, samples]`` float32 (about -1…1)."""
        ...


@dataclass(frozen=True)
class SoundSpec(ABC):
    """A parsed audio decoder spec of one family (a subclass per family)."""

    family: ClassVar[str]
    named_configs: ClassVar[dict[str, Any]]
    # the named configs farm has revised (`farm.decoders.base.named_config_revision`), and why
    config_revisions: ClassVar[dict[str, int]] = {}
    config_revision_notes: ClassVar[dict[str, str]] = {}
    latent_dims: ClassVar[tuple[str, ...]]  # the job store's names of the audio latent's axes
    latent_layout: ClassVar[str]  # the audio latent's axes, in words: "[C, T, M]"
    audio_vae_class: ClassVar[str]  # the diffusers class of a pipeline's ``audio_vae`` this family decodes

    config_name: str | None  # a named config, or None when given in full
    config: dict[str, Any]  # the models' constructor arguments
    weights: dict[str, Any]
    dtype: str = "float32"
    revision: int | None = None  # the named config's revision, for those farm has revised

    # ---- the spec ----------------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def parse(cls, raw: dict[str, Any], where: str) -> SoundSpec:
        """Validate a spec of this family; errors name the field and what would be valid."""

    @property
    def random_weights(self) -> bool:
        return "random_seed" in self.weights

    def to_json(self) -> dict[str, Any]:
        revision = {} if self.revision is None else {CONFIG_REVISION: self.revision}
        return {"family": self.family, "config": self.config_name or self.config, "weights": self.weights,
                "dtype": self.dtype, **revision}  # fmt: skip

    def describe(self) -> str:
        weights = (f"RANDOM weights (seed {self.weights['random_seed']})" if self.random_weights
                   else f"weights from {self.weights['path']}")  # fmt: skip
        return f"{self.family} [{self.config_name or 'custom config'}], {self.dtype}, {weights}"

    # ---- timing and latents (pure) -----------------------------------------------------------------

    @property
    @abstractmethod
    def sample_rate(self) -> int:
        """Samples per second of the decoded waveform."""

    @property
    @abstractmethod
    def latents_per_second(self) -> float:
        """Audio latent frames per second of sound."""

    @property
    @abstractmethod
    def channels(self) -> int:
        """Channels of the decoded waveform."""

    @abstractmethod
    def decoded_samples(self, latent_frames: int) -> int:
        """Samples the decoder makes from `latent_frames` audio latent frames."""

    @abstractmethod
    def latent_shape(self, latent_frames: int) -> tuple[int, ...]:
        """The audio latent of `latent_frames` frames this spec decodes."""

    @abstractmethod
    def check_latent(self, shape: tuple[int, ...], where: str) -> None:
        """Refuse an audio latent (one shot's, no batch axis) the spec cannot decode, saying what it takes."""

    @property
    def batched_layout(self) -> str:
        """The audio latent's axes with a batch axis first: "[B, C, T, M]"."""
        return "[B, " + self.latent_layout.removeprefix("[")

    # ---- weights and decoding ----------------------------------------------------------------------

    @abstractmethod
    def check_weights(self) -> None:
        """Refuse weights that cannot load (cheap: files, configs and tensor names only)."""

    @abstractmethod
    def build_decoder(self, device: str) -> SoundDecoder:
        """The decoder of this spec on `device`, weights loaded (worker side: imports torch)."""

    @classmethod
    @abstractmethod
    def spec_from_pipeline(cls, pipeline: Any, weights: str | None) -> dict[str, Any]:
        """The spec (JSON) of a diffusers pipeline's own sound decoder (its ``audio_vae`` is
        `audio_vae_class`): its config, and its weights' folder or `weights`."""


def samples_for_frames(frames: int, fps: float, sample_rate: int) -> int:
    """Samples of sound that last as long as `frames` video frames at `fps`."""
    return int(round(frames * sample_rate / fps))


def parse_weights(raw: dict[str, Any], where: str, example: str, what_exists: str) -> dict[str, Any]:
    """A spec's ``weights`` field checked: ``{"path": ...}`` of something that exists (`example`: a path
    to show; `what_exists`: what the path should be), or ``{"random_seed": N}``."""
    weights = raw.get("weights")
    if not isinstance(weights, dict) or not (
        isinstance(weights.get("path"), str) or isinstance(weights.get("random_seed"), int)
    ):
        raise FarmError(
            f'{where}: \'weights\' must be {{"path": "{example}"}} '
            f'or, for tests and benchmarks only, {{"random_seed": N}}; got {weights!r}'
        )
    if "path" in weights and not Path(weights["path"]).exists():
        raise FarmError(f"{where}: weights path {weights['path']!r} does not exist; give {what_exists}")
    return dict(weights)
