"""Cosmos 1.0 VAE decoder (diffusers `AutoencoderKLCosmos`, the CV8x8x8 tokenizer): 8x spatial, 8x temporal.

Causal 3-D convolutions (padding with the first frame, in the past only), a temporal upsampler that
repeats every frame but the first, and an inverse Haar transform that drops its first frames: ``F`` latent
frames → ``1 + 8 (F - 1)`` pixel frames, and a tile's first latent frame decodes to one pixel frame, as the
tiling's causal shift expects. Its GroupNorms (one group) take statistics over each frame, the middle
block's spatial attention spans each frame and its temporal attention every earlier frame: a position
depends on its whole frame and on all earlier frames of its tile. No split is exact: temporal tiles decode
context frames before their own, spatial tiles a halo, and spatial seams keep blending beside it.

``vae.decode`` decodes the whole latent in one pass (framewise decoding and tiling are off unless asked
for, and farm never asks), so a single-tile farm decode equals ``vae.decode``.

``"latents": "normalized"``: ``CosmosTextToWorldPipeline`` and ``CosmosVideoToWorldPipeline`` un-normalise
with statistics per channel and latent frame, ``z · std[c, t] / sigma_data + mean[c, t]`` (the config's
lists viewed as ``[C, T]``, their first ``F`` frames), where ``sigma_data`` is the pipeline scheduler's
(0.5 in the release's ``EDMEulerScheduler``; the spec's ``"sigma_data"``); a config without statistics
divides by ``sigma_data`` alone. A tile starting at latent frame ``s`` takes frames ``s`` onwards, so its
pixels are the whole shot's; latents past the statistics' frames cannot be un-normalised (the pipeline
cannot either).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.cosmos.configs import COSMOS_TINY
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

# the released pipelines' EDMEulerScheduler (diffusers' scripts/convert_cosmos_to_diffusers.py)
RELEASED_SIGMA_DATA = 0.5
# diffusers' patching filters (`autoencoder_kl_cosmos._WAVELETS`), with the values it defines them with
FILTERS = {"haar": [0.7071067811865476, 0.7071067811865476], "rearrange": [1.0, 1.0]}


def repair_filter_constants() -> None:
    """Make diffusers' Cosmos patching filters again on the CPU where they were made on the meta device.

    diffusers makes them when its module is imported, and it imports every autoencoder module at once:
    imported inside any family's meta-device build, they are meta tensors, and every Cosmos model built
    in that process after would copy them (its filters a meta tensor, its decode failing)."""
    import torch
    from diffusers.models.autoencoders import autoencoder_kl_cosmos as module

    for name, values in FILTERS.items():
        if module._WAVELETS[name].is_meta:
            module._WAVELETS[name] = torch.tensor(values)


class CosmosDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "cosmos"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "cosmos": {},
        "cosmos-tiny": COSMOS_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLCosmos"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False) for name in ("CosmosTextToWorldPipeline", "CosmosVideoToWorldPipeline")
    }
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {
        "sigma_data": ((int, float), "a positive number (the pipeline scheduler's sigma_data)"),
    }
    # Temporal context: the middle block's temporal attention reaches every earlier frame of a tile, and
    # with RANDOM weights (`benchmarks/measure_halo.py context`, float32 on a CPU, two tiles of a 24-frame
    # 4x4 latent) 2 to 10 frames of context leave the seam band at 12-20 dB: only the whole prefix is exact.
    # 15 frames reach back to the start of any tile of a shot of 16 latent frames, as long as the
    # release's statistics go (121 pixel frames): such shots split exactly in time. The released decoder in
    # bf16 (2 tiles of a 16x60x104 latent, an H100): 12.1 dB over the seam band at 4 frames, identical from 8
    # (the whole prefix there).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"cosmos": (15, 0), "cosmos-tiny": (15, 0)}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, float32 on a CPU, 2x2 tiles of a 3x32x32
    # latent): seam band 32.5 dB at 8, 37.0 at 10, 42.8 at 12 (worst 16 levels), still rising: each
    # frame's GroupNorm statistics and spatial attention span the whole frame, which no halo reaches, so
    # Cosmos keeps blending beside it. cosmos bfloat16 on an H200 (2x2 of 8x60x104; its bf16 decode is 40.2
    # dB from float32's): 17.3 / 26.5 / 33.4 / 34.6 / 35.7 dB at 2 / 4 / 6 / 8 / 12, worst 255 / 143 / 49 /
    # 48 / 42 levels, short of that noise; 12 is the best measured.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "cosmos": {"bfloat16": 12}, "cosmos-tiny": {"float32": 12},
    }  # fmt: skip
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.", "post_quant_conv.")
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n = len(full["decode_block_out_channels"])
        patch = int(math.log2(full["patch_size"]))
        spatial_layers = int(math.log2(full["spatial_compression_ratio"])) - patch
        temporal_layers = int(math.log2(full["temporal_compression_ratio"])) - patch
        # as CosmosDecoder3d builds its up blocks (all but the last upsample), then the Haar unpatching
        temporal = [0 < i < temporal_layers + 1 for i in range(n - 2)]
        spatial = [t or (i < spatial_layers and spatial_layers > temporal_layers)
                   for i, t in enumerate(temporal)]  # fmt: skip
        geometry = Geometry(spatial_scale=2 ** (sum(spatial) + patch),
                            temporal_scale=2 ** (sum(temporal) + patch), causal=True)  # fmt: skip
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["decode_block_out_channels"][0] / 256

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        super().check_spec(spec)
        sigma = spec.extra.get("sigma_data")
        if sigma is not None and not sigma > 0:
            raise FarmError(f"decoder spec: 'sigma_data' must be a positive number, got {sigma!r}")

    @classmethod
    def spec_fields_from_pipeline(cls, pipeline: Any) -> dict[str, Any]:
        """The pipeline's scheduler's ``sigma_data``, which its un-normalisation divides by."""
        sigma = getattr(getattr(getattr(pipeline, "scheduler", None), "config", None), "sigma_data", None)
        return {} if sigma is None else {"sigma_data": float(sigma)}

    @classmethod
    def build(cls, spec: DecoderSpec) -> Any:
        repair_filter_constants()
        return super().build(spec)

    @classmethod
    def meta_model(cls, config: dict[str, Any]) -> Any:
        repair_filter_constants()  # (imports diffusers' module outside the meta-device context)
        return super().meta_model(config)

    @classmethod
    def materialise_derived_buffers(cls, model: Any, device: str) -> None:
        """The Haar unpatcher's buffers (``wavelets``, ``_arange``), which its constructor computes."""
        import torch
        from diffusers.models.autoencoders.autoencoder_kl_cosmos import _WAVELETS

        repair_filter_constants()
        for module in model.modules():
            if type(module).__name__ == "CosmosUnpatcher3d":
                if module.wavelets.is_meta:
                    module.wavelets = _WAVELETS[module.patch_method].clone().to(device)
                if module._arange.is_meta:
                    module._arange = torch.arange(module.wavelets.shape[0], device=device)

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> CosmosDecoder:
        decoder = super().from_model(spec, model, device)
        decoder.model.use_tiling = decoder.model.use_framewise_decoding = False  # farm tiles itself
        assert isinstance(decoder, CosmosDecoder)
        return decoder

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return self.denormalize_at(z, None)

    def denormalize_at(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """``CosmosTextToWorldPipeline``: ``z · std / sigma_data + mean``, per channel and latent frame
        from the tile's first frame in the shot."""
        import torch

        cfg = self.model.config
        sigma = float(self.spec.extra.get("sigma_data", RELEASED_SIGMA_DATA))
        if cfg.latents_mean is None:
            return z / sigma
        first, frames = (origin[0] if origin else 0), z.shape[2]
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.latent_channels, -1, 1, 1)
        std = torch.tensor(cfg.latents_std).view(1, cfg.latent_channels, -1, 1, 1)
        if first + frames > mean.shape[2]:
            raise FarmError(
                f"{self.spec.describe()}: normalized latent frames {first}-{first + frames - 1} reach past "
                f"the VAE's statistics, which cover {mean.shape[2]} latent frames (the pipeline "
                "un-normalises no more); give shots of at most that many latent frames, or denormalized "
                "latents"
            )
        span = slice(first, first + frames)
        return z * std[:, :, span].to(z) / sigma + mean[:, :, span].to(z)
