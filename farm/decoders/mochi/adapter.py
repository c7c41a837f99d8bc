"""Mochi VAE decoder (diffusers `AutoencoderKLMochi`): 8x spatial, 6x temporal.

Causal convolutions (the past padded by repeating the first frame), per-frame GroupNorms and linear
up-projections that turn each frame into 3, then 2, frames: ``F`` latent frames give ``6 F`` frames, of
which diffusers drops the first 5 (``drop_last_temporal_frames``), so ``1 + 6 (F - 1)``. A tile's first
latent frame keeps one pixel frame, the last of its six: what the tiling's causal shift expects. The
decoder is causal: a frame depends on a bounded number of frames before it and none after.

Spatially the GroupNorms take their statistics over whole frames: a halo brings a tile close to the
whole decode, never to it, and the blend stays. farm decodes each tile in one pass, as ``vae.decode``
does by default (``use_framewise_decoding`` and ``use_tiling`` off).

``"latents": "normalized"``: ``MochiPipeline`` un-normalises with the config's ``latents_mean`` and
``latents_std``, ``z · std / scaling_factor + mean`` (``z / scaling_factor`` for a config without them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.mochi.configs import MOCHI_TINY
from farm.decoders.mochi.layout import MOCHI_ORIGINAL, is_mochi_original, mochi_original_name

if TYPE_CHECKING:
    import torch


class MochiDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "mochi"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {"mochi": {}, "mochi-tiny": MOCHI_TINY}
    model_class_name: ClassVar[str] = "AutoencoderKLMochi"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {"MochiPipeline": ("normalized", False)}
    # ComfyUI's LATENT holds what its VAE decodes (its Mochi latent format un-normalises only for the model)
    comfyui_latents: ClassVar[str | None] = "denormalized"
    comfyui_words: ClassVar[tuple[str, ...]] = ("mochi",)
    # Causal: its convolutions, counted at their temporal resolutions (each reaches 2 frames back), reach
    # 45.3 latent frames back in the released decoder (not measured) and 10.7 in mochi-tiny, whose 2-tile
    # split of 40 latent frames reaches the float32 floor from 10 frames of context (89 dB over the seam
    # band, float rounding of single values beyond; `benchmarks/measure_halo.py context`, RANDOM weights,
    # a CPU; 8: 60.4 dB). The released decoder in bf16 (2 tiles of a 96x4x4 latent, RANDOM weights, an H100):
    # 32.7 / 43.2 / 50.8 dB over the seam band at 8 / 12 / 16 frames (worst 40 / 15 / 3 levels).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"mochi": (46, 0), "mochi-tiny": (11, 0)}
    measured_context: ClassVar[dict[str, dict[str, tuple[int, int]]]] = {
        "mochi": {"bfloat16": (16, 0)}, "mochi-tiny": {"float32": (10, 0)},
    }  # fmt: skip

    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights): mochi-tiny float32 on a CPU, a 2x2 split of
    # 3x24x24 latents, 38.3 dB over the seam band at 2, 45.0 at 4, 46.3 at 6, 48.9 at 8, 51.3 at 10. mochi
    # bfloat16 on an H200 (2x2 of 7x60x106): 39.1 / 48.7 / 49.1 / 49.3 dB at 4 / 8 / 12 / 16, worst 27 / 7 /
    # 6 / 6 levels: short of bf16's floor, and 8 is where it levels off. The per-frame GroupNorms see the
    # whole frame, so Mochi keeps blending beside the halo.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "mochi": {"bfloat16": 8}, "mochi-tiny": {"float32": 4},
    }  # fmt: skip

    # bf16 on a GPU, per output pixel-frame: HunyuanVideo's measured figure, whose full-resolution blocks
    # are as wide (128 channels); not measured for Mochi itself.
    bytes_per_pixel_frame: ClassVar[float] = 3420.0

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        spatial = temporal = 1
        for s in full["spatial_expansions"]:
            spatial *= s
        for t in full["temporal_expansions"]:
            temporal *= t
        geometry = Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=True)
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["decoder_block_out_channels"][0] / 128

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> MochiDecoder:
        decoder = super().from_model(spec, model, device)
        decoder.model.use_framewise_decoding = False  # farm tiles and chunks in time itself
        decoder.model.use_tiling = False
        decoder.model.drop_last_temporal_frames = True  # the pipeline's 1 + 6 (F - 1) frames
        assert isinstance(decoder, MochiDecoder)
        return decoder

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return MOCHI_ORIGINAL if is_mochi_original(names) else None

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout == MOCHI_ORIGINAL:
            return mochi_original_name(name, full_config)
        return super().original_name(name, layout, full_config)

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``MochiPipeline``: ``z · latents_std / scaling_factor + latents_mean`` from the config."""
        import torch

        config = self.model.config
        if config.latents_mean is None or config.latents_std is None:
            return z / config.scaling_factor
        mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1).to(z)
        std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1).to(z)
        return z * std / config.scaling_factor + mean
