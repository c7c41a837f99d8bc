"""The decoder spec and the interface every decoder adapter implements."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from farm.decoders.geometry import Geometry
from farm.errors import FarmError

if TYPE_CHECKING:
    import numpy as np
    import torch

DTYPES = ("float32", "bfloat16", "float16")
# Spatial seams: the seam-band PSNR (uint8 frames of two tiles against the untiled decode, RANDOM weights)
# a config's default spatial overlap must reach: what LTX-2's own tiling (overlap 4) gives the real
# LTX-2 decoder (27.3 dB, docs/fidelity.md "Seams"). Configs not measured use that overlap.
SEAM_TARGET_DB = 27.0
DEFAULT_SPATIAL_OVERLAP = 4
LATENT_CONVENTIONS = ("denormalized", "normalized")
# HDR decodes: what the decoded values are (farm.media.hdr.TRANSFERS has their curves, under these names):
# ACEScct codes (LTX-2's native --hdr) or LogC3 codes (LTX-2's HDR IC-LoRA, diffusers' LTX2HDRPipeline).
HDR_TRANSFERS = ("acescct", "logc3")


# How much temporal context a tile decodes (the spec's "context"): the least measured to reach the dtype's
# noise floor where the family measured one, or the decoder's whole receptive field.
MEASURED_CONTEXT = "measured"
RECEPTIVE_FIELD_CONTEXT = "receptive-field"


@dataclass(frozen=True)
class DecoderSpec:
    family: str
    config_name: str | None  # a named config ("ltx2-tiny"), or None when `config` was given in full
    config: dict[str, Any]  # the model's constructor arguments (resolved from the name when named)
    weights: dict[str, Any]  # {"path": ..., "files"?, "layout"?, "identity"?} or {"random_seed": N}
    dtype: str = "float32"
    latents: str = "denormalized"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hdr(self) -> str | None:
        """The HDR transfer of the decoded values (HDR_TRANSFERS), or None for an SDR decode."""
        return self.extra.get("hdr")

    @property
    def random_weights(self) -> bool:
        return "random_seed" in self.weights

    def to_json(self) -> dict[str, Any]:
        out = {
            "family": self.family,
            "config": self.config_name if self.config_name else self.config,
            "weights": self.weights,
            "dtype": self.dtype,
            "latents": self.latents,
        }
        out.update(self.extra)
        return out

    def describe(self) -> str:
        weights = (
            f"RANDOM weights (seed {self.weights['random_seed']})"
            if self.random_weights
            else f"weights from {self.weights['path']}"
        )
        return f"{self.family} [{self.config_name or 'custom config'}], {self.dtype}, {weights}"


class VideoDecoder(Protocol):
    """What farm needs of a video VAE decoder: every hook farm reads, each with its default on
    `farm.decoders.diffusers_vae.DiffusersVideoDecoder` (an adapter overrides only what differs)."""

    family: ClassVar[str]
    named_configs: ClassVar[dict[str, dict[str, Any]]]
    model_class_name: ClassVar[str]  # the diffusers class the adapter builds
    # named config → its current revision, and what changed in it (only configs ever revised)
    config_revisions: ClassVar[dict[str, int]]
    config_revision_notes: ClassVar[dict[str, str]]
    # extra spec fields the adapter reads: name → (accepted types, what to write in an error message)
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]]
    # named config → (machine kind, pixel frames/height/width, seconds of one decode call)
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]]
    # how the family's latents reach farm: diffusers pipelines → (latent convention, packed as tokens),
    # what ComfyUI's .latent files hold (None: none farm reads), words of a ComfyUI workflow naming it
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]]
    pipeline_layout: ClassVar[str]  # those latents' axes, in words ("[B, C, F, H, W]" unless said)
    # pipelines (of `pipeline_conventions`) whose latents are not [B, C, F, H, W] → their axes' order
    pipeline_latent_axes: ClassVar[dict[str, str]]
    comfyui_latents: ClassVar[str | None]
    comfyui_words: ClassVar[tuple[str, ...]]
    sound_configs: ClassVar[dict[str, str]]  # named video config → the sound config that goes with it
    spec: DecoderSpec
    geometry: Geometry
    latent_channels: int

    @classmethod
    def for_spec(cls, spec: DecoderSpec) -> type[VideoDecoder]:
        """The adapter class that decodes `spec` (the family's, or one per diffusers class it names)."""
        ...

    @classmethod
    def unnamed_config(cls, raw: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The config of a raw spec that gives none (None: the family's name is a named config)."""
        ...

    @classmethod
    def plan_note(cls, spec: DecoderSpec) -> str | None:
        """A line `farm plan` shows under the decoder, or None."""
        ...

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry: ...

    @classmethod
    def latent_channels_for(cls, config: dict[str, Any]) -> int: ...

    @classmethod
    def spatial_overlap_for(cls, config: dict[str, Any]) -> int:
        """Latent units of overlap where a plan splits height or width and no overlap was given (0 where
        the halo alone makes tiles equal the untiled decode)."""
        ...

    @classmethod
    def geometry_for_spec(cls, spec: DecoderSpec) -> Geometry:
        """The geometry tiles are planned and decoded with: `geometry_for` the spec's config, with the
        spatial halo and temporal context measured for its dtype."""
        ...

    @classmethod
    def halo_is_exact(cls, config: dict[str, Any]) -> bool:
        """Whether the config's halo alone brings its tiles to the untiled decode (no blend needed)."""
        ...

    @classmethod
    def load(cls, spec: DecoderSpec, device: str) -> VideoDecoder: ...

    @classmethod
    def from_pipeline_output(cls, pipeline: Any, data: np.ndarray, num_frames: int | None) -> np.ndarray:
        """A pipeline's unpacked ``output_type="latent"`` latents → ``[B, C, F, H, W]`` as its decode hands
        them to ``vae.decode`` (axes reordered, padding frames dropped; default: as they are)."""
        ...

    @classmethod
    def spec_fields_from_pipeline(cls, pipeline: Any) -> dict[str, Any]:
        """Extra spec fields a pipeline instance says for itself (its un-normalisation's settings)."""
        ...

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        """The family's original checkpoint layout that a checkpoint's VAE names are in (None: diffusers')."""
        ...

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        """The name diffusers' tensor `name` has in a checkpoint `layout` (without a file's prefix)."""
        ...

    @classmethod
    def check_weights(cls, spec: DecoderSpec) -> DecoderSpec:
        """Raise FarmError if the spec's weights cannot load into its config, or changed since the spec
        recorded their identity (cheap: headers and a few sampled blocks, no torch); returns the spec
        with the weights' layout and content identity recorded."""
        ...

    def enable_compile(self, mode: str | None = None) -> None:
        """Compile the decoder's forward pass (torch.compile, `mode` as torch names it) for faster
        repeated decodes."""
        ...

    def decode(self, latent: torch.Tensor, origin: tuple[int, int, int] | None = None) -> torch.Tensor:
        """Latent tile ``[C, f, h, w]`` (torch, on its device) → pixels ``[3, F, H, W]`` in [0, 1].

        `origin` is the tile's first latent frame, row and column in its shot. Decoders that draw noise
        per latent position (LTX-Video's timestep-conditioned configs) need it and raise FarmError without
        it; the others ignore it.
        """
        ...

    @classmethod
    def carried_state_bytes(cls, spec: DecoderSpec, latent_hw: tuple[int, int]) -> int:
        """Bytes of the state a carried temporal chunk of `latent_hw` latent rows x columns hands on to
        the next (0 for decoders that do not carry)."""
        ...

    def decode_carried(
        self, latent: torch.Tensor, state: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[torch.Tensor, Any]:
        """`decode` of a temporal chunk that follows the chunk `state` came from (None: the tile's first),
        and the decoder's causal state after it. Only decoders whose geometry `carries` implement it."""
        ...

    @classmethod
    def shares_whole_frame(cls, config: dict[str, Any]) -> bool:
        """Whether spatial tiles of this config decode from one whole-frame pass per shot's frames
        (`whole_frame`, then `decode_shared`): the decoder has a part that sees the whole frame. Default:
        no such part."""
        ...

    @classmethod
    def whole_frame_in_one_call(cls, config: dict[str, Any]) -> bool:
        """Whether a tile decodes from the whole-frame pass only in one call (no chunks of it): plans that
        chunk tiles then decode them from their latent, without the pass. Default: no."""
        ...

    @classmethod
    def shares_statistics(cls, config: dict[str, Any]) -> bool:
        """Whether tiles sharing the whole-frame pass also take the whole shot's GroupNorm statistics, one
        round across the tiles per GroupNorm (`statistics_start`, `statistics_round`). Default: no."""
        ...

    @classmethod
    def statistics_exact(cls, config: dict[str, Any]) -> bool:
        """Whether the config's tiles, with its halo and the shot's statistics shared in rounds, are
        measured to equal the untiled decode to the dtype's noise (no blend needed where the rounds run)."""
        ...

    @classmethod
    def statistics_round_count(cls, config: dict[str, Any]) -> int:
        """The rounds a shot's tiles take when they share its statistics: one per GroupNorm."""
        ...

    @classmethod
    def statistics_carried_bytes(cls, spec: DecoderSpec, pixel_frames: int) -> int:
        """Device memory a tile of `pixel_frames` decoded pixel-frames holds between rounds (its worker
        holds every one of its tiles' at once); 0 for a decoder without rounds."""
        ...

    def statistics_start(
        self, shared: torch.Tensor, own: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[Any, torch.Tensor]:
        """A tile's block of `whole_frame`'s output, its own latent block and the block's first latent
        frame, row and column in the shot → its carried state and its sums for the first round."""
        ...

    def statistics_round(self, carried: Any, stats: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """One round with the shot's `stats` → the carried state and sums of the next, or, after the last,
        the tile's pixels ``[3, F, H, W]`` and None."""
        ...

    def whole_frame(self, latent: torch.Tensor) -> torch.Tensor:
        """A shot's latent ``[C, f, h, w]`` over the whole frame → the output of the decoder's part that
        sees the whole frame, ``[C', f, h, w]`` (indexed like the latent), on the CPU."""
        ...

    def decode_shared(self, shared: torch.Tensor, origin: tuple[int, int, int] | None = None) -> torch.Tensor:
        """A tile's block (context and halo included) of `whole_frame`'s output → its pixels, as `decode`
        gives them for the same block of latent."""
        ...

    @classmethod
    def peak_bytes(cls, spec: DecoderSpec, pixels: Sequence[int] | int) -> int:
        """Estimated peak device memory of one decode call of ``(frames, height, width)`` output pixels
        (a pixel volume will do for decoders whose memory depends on the volume only)."""
        ...

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        """`peak_bytes` as `farm.decoders.memory.MemoryModel`'s terms (weights, bytes per pixel-frame, …)."""
        ...


def parse_spec(
    raw: Any, *, families: Mapping[str, type[VideoDecoder]], where: str = "decoder spec"
) -> DecoderSpec:
    """Validate a decoder spec from a job store or the command line; errors name the field and the fix."""
    if not isinstance(raw, dict):
        raise FarmError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    family = raw.get("family")
    if not isinstance(family, str) or family not in families:
        raise FarmError(f"{where}: unknown decoder family {family!r}; known families: {sorted(families)}")
    cls = families[family]
    config = raw["config"] if "config" in raw else cls.unnamed_config(raw, where) or family
    revision: dict[str, int] = {}
    if isinstance(config, str):
        if config not in cls.named_configs:
            raise FarmError(
                f"{where}: unknown {family} config {config!r}; named configs: {sorted(cls.named_configs)} "
                "(or give the model's constructor arguments as a JSON object)"
            )
        config_name, resolved = config, dict(cls.named_configs[config])
        revision = named_config_revision(cls, config, raw.get(CONFIG_REVISION), where)
    elif isinstance(config, dict):
        config_name, resolved = None, dict(config)
    else:
        raise FarmError(f"{where}: 'config' must be a config name or a JSON object, got {config!r}")
    weights = raw.get("weights")
    if not isinstance(weights, dict) or not (
        ("path" in weights and isinstance(weights["path"], str))
        or ("random_seed" in weights and isinstance(weights["random_seed"], int))
    ):
        raise FarmError(
            f'{where}: \'weights\' must be {{"path": "/local/folder/or/file.safetensors"}} or, for '
            f'tests and benchmarks only, {{"random_seed": N}}; got {weights!r}. farm never initialises '
            "a decoder with random weights unless the spec asks for it"
        )
    if "path" in weights:
        path = Path(weights["path"])
        if not path.exists():
            raise FarmError(
                f"{where}: weights path {str(path)!r} does not exist; give a local diffusers folder "
                "(config.json + *.safetensors), one .safetensors file, or a .pt/.pth checkpoint (farm runs "
                "offline: no hub downloads)"
            )
    dtype = raw.get("dtype", "float32")
    if dtype not in DTYPES:
        raise FarmError(f"{where}: dtype {dtype!r} is not supported; use one of {list(DTYPES)}")
    latents = raw.get("latents", "denormalized")
    if latents not in LATENT_CONVENTIONS:
        raise FarmError(f"{where}: 'latents' {latents!r} is invalid; use one of {list(LATENT_CONVENTIONS)}")
    hdr = raw.get("hdr")
    if hdr is not None and hdr not in HDR_TRANSFERS:
        raise FarmError(f"{where}: 'hdr' {hdr!r} is invalid; use one of {list(HDR_TRANSFERS)} (or leave it "
                        "out for an SDR decode)")  # fmt: skip
    if hdr is not None and dtype != "float32":
        raise FarmError(f"{where}: an HDR decode ('hdr': {hdr!r}) runs in float32, as the HDR pipelines "
                        f"decode; dtype {dtype!r} is invalid with it: set dtype to 'float32'")  # fmt: skip
    context = raw.get("context", MEASURED_CONTEXT)
    if context not in (MEASURED_CONTEXT, RECEPTIVE_FIELD_CONTEXT):
        raise FarmError(
            f"{where}: 'context' {context!r} is invalid; use {MEASURED_CONTEXT!r} (the least temporal "
            f"context measured to reach the dtype's noise floor, the default) or {RECEPTIVE_FIELD_CONTEXT!r} "
            "(the decoder's whole receptive field: exact, more decode work)"
        )
    known = {"family", "config", "weights", "dtype", "latents", "hdr", "context", CONFIG_REVISION}
    extra = {k: v for k, v in raw.items() if k not in known} | revision | ({"hdr": hdr} if hdr else {})
    if context == RECEPTIVE_FIELD_CONTEXT:  # recorded only when asked: specs without it stay as they were
        extra["context"] = context
    return DecoderSpec(family, config_name, resolved, dict(weights), dtype, latents, extra)


# A named config that farm once resolved to other constructor arguments carries its revision in every spec
# (and so in every render's identity): an output decoded with an earlier revision is then never resumed
# or called finished silently. Specs written before a config had revisions have none: revision 1.
CONFIG_REVISION = "config_revision"


class RevisedConfigs(Protocol):
    """What the revision helpers read of a family (a video adapter, or the sound's configs)."""

    family: ClassVar[str]
    config_revisions: ClassVar[dict[str, int]]
    config_revision_notes: ClassVar[dict[str, str]]


def named_config_revision(cls: type[RevisedConfigs], name: str, given: Any, where: str) -> dict[str, int]:
    """``{"config_revision": N}`` for a named config `cls` revises (empty for one never revised), refusing
    a spec that asks for a revision other than the current one."""
    current = cls.config_revisions.get(name)
    if current is None:
        if given is not None:
            raise FarmError(
                f"{where}: {cls.family} config {name!r} has no revisions; remove 'config_revision'"
            )
        return {}
    if given is not None and given != current:
        raise FarmError(
            f"{where}: {cls.family} config {name!r} revision {given!r} is superseded: "
            f"{superseded_why(cls, name)}; farm decodes revision {current} only (remove 'config_revision')"
        )
    return {CONFIG_REVISION: current}


def superseded_why(cls: type[RevisedConfigs], name: str) -> str:
    """What changed in a named config's current revision, from the adapter's notes."""
    return cls.config_revision_notes.get(name, "its constructor arguments changed")


def superseded_config(raw: Any, families: Mapping[str, type[RevisedConfigs]]) -> str | None:
    """Why a recorded decoder spec (a render identity's ``decoder``) names an earlier revision of a named
    config than farm decodes now, or None when it is current (or not a named config farm knows)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("config"), str):
        return None
    if raw.get("family") not in families:
        return None
    cls, name = families[raw["family"]], raw["config"]
    current = cls.config_revisions.get(name)
    recorded = raw.get(CONFIG_REVISION, 1)
    if current is None or recorded == current:
        return None
    return (f"{raw['family']} config {name!r} revision {recorded}, superseded by revision {current} "
            f"({superseded_why(cls, name)})")


def dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def human_bytes(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    k = 0 if n <= 0 else min(int(math.log(n, 1024)), len(units) - 1)
    return f"{n / 1024**k:.1f} {units[k]}"
