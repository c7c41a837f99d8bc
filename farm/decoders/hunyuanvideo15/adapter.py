"""HunyuanVideo 1.5 VAE decoder (diffusers `AutoencoderKLHunyuanVideo15`): 16x spatial, 4x temporal.

Causal 3-D convolutions (replicate padding, in the past only) and upsamplers that upsample the first
frame in space only: ``F`` latent frames → ``1 + 4 (F - 1)`` pixel frames, and a tile's first latent frame
decodes to one pixel frame, as the tiling's causal shift expects. Its norms are RMS norms over the
channels of each position (no statistics across positions), but the middle block's attention spans every
position of a tile, causally masked in time: a frame depends on every earlier frame of its tile, and a
position on the whole frame. So no split is exact: temporal tiles decode context frames before their
own, spatial tiles a halo, and spatial seams keep blending beside it.

``vae.decode`` decodes the whole latent in one pass (no framewise decoding; spatial tiling only when
``enable_tiling`` is called, which farm never does), so a single-tile farm decode equals ``vae.decode``.

Checkpoints: diffusers' folder (HunyuanVideo-1.5-Diffusers ``vae/``), or the release's own
``vae/diffusion_pytorch_model.safetensors`` in HunyuanVideo 1.5's naming (`layout`).

``"latents": "normalized"``: ``HunyuanVideo15Pipeline`` (and its image-to-video variant) divides by the
config's ``scaling_factor`` (no mean/std).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.hunyuanvideo15.configs import HUNYUANVIDEO15_TINY
from farm.decoders.hunyuanvideo15.layout import (
    HUNYUANVIDEO15_ORIGINAL,
    hunyuanvideo15_layout,
    hunyuanvideo15_original_name,
)

if TYPE_CHECKING:
    import torch


class HunyuanVideo15Decoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "hunyuanvideo15"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "hunyuanvideo15": {},
        "hunyuanvideo15-tiny": HUNYUANVIDEO15_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLHunyuanVideo15"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False)
        for name in ("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline")
    }
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.",)
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder",)
    # Context (`benchmarks/measure_halo.py context`, RANDOM weights, float32 on a CPU, two temporal tiles of a
    # 40-frame 4x4 latent): over 8 frames either side of the seam 39.8 dB at 8, 44.1 at 12, 50.3 at 14
    # (worst 10 levels), 51.2 at 16; only the whole prefix is exact (the mid block's causal attention
    # reaches every earlier frame). Causal: frames after a tile change nothing, so no lookahead.
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"hunyuanvideo15-tiny": (14, 0)}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, float32 on a CPU, 2x2 tiles of a 3x16x16
    # latent): seam band 17.5 dB without, 28.6 at 2, 40.0 at 4, 44.9 at 6 (8 covers the whole test frame).
    # hunyuanvideo15 bfloat16 on an H100 (2x2 of 8x30x52): 44.9 / 50.0 / 50.4 / 50.8 dB at 4 / 6 / 8 / 12,
    # worst 11 / 5 / 4 / 4 levels, its bf16 decode 51.6 dB from float32: 6 reaches bf16's floor.
    # The mid block's attention sees the whole frame, which no halo reaches: it keeps blending beside it.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "hunyuanvideo15": {"bfloat16": 6}, "hunyuanvideo15-tiny": {"float32": 6},
    }  # fmt: skip

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n = len(full["block_out_channels"])
        s = math.log2(full["spatial_compression_ratio"])
        t = math.log2(full["temporal_compression_ratio"])
        # as HunyuanVideo15Decoder3D builds its up blocks: block i upsamples (2x in space, and in time
        # where i < log2 t) when i < log2 s or i < log2 t
        spatial_up = sum(i < s or i < t for i in range(n))
        temporal_up = sum(i < t for i in range(n))
        geometry = Geometry(spatial_scale=2**spatial_up, temporal_scale=2**temporal_up, causal=True)
        return cls._with_context(geometry, config)

    # Not measured on a GPU: HunyuanVideo's measured figure (bf16), whose full-resolution blocks have the
    # same width (128) and also normalise in float32 (`tools/measure_families.py` measures it).
    bytes_per_pixel_frame: ClassVar[float] = 3420.0

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["block_out_channels"][0] / 128

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        """Linear activations, or the middle block's attention mask where that is larger: diffusers builds
        a dense ``[n, n]`` mask in the compute dtype over the call's ``n`` latent positions (33 latent
        frames of 30x52, a 129x480x832 shot, make 5.3 GB of it in bf16)."""
        terms = super().memory_terms(spec)
        g = cls.geometry_for(spec.config)
        terms.update(pair_bytes=float(dtype_bytes(spec.dtype)),
                     pixels_per_position=float(g.spatial_scale**2 * g.temporal_scale))  # fmt: skip
        return terms

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> HunyuanVideo15Decoder:
        decoder = super().from_model(spec, model, device)
        decoder.model.use_tiling = False  # farm tiles itself
        from farm.decoders.hunyuanvideo15.device import chunked_attention  # imports torch and diffusers

        chunked_attention.install(decoder.model)  # torch's masked SDPA is wrong past 2^32 scores
        assert isinstance(decoder, HunyuanVideo15Decoder)
        return decoder

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return hunyuanvideo15_layout(names)

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout == HUNYUANVIDEO15_ORIGINAL:
            return hunyuanvideo15_original_name(name)
        return super().original_name(name, layout, full_config)

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``HunyuanVideo15Pipeline``: ``z / scaling_factor``."""
        return z / self.model.config.scaling_factor
