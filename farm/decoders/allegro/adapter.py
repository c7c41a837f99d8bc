"""Allegro VAE decoder (diffusers `AutoencoderKLAllegro`): 8x spatial, 4x temporal, not causal.

2-D resnets and convolutions per frame, each followed by a temporal convolution layer (kernel 3, the
first and last frames repeated as padding) whose GroupNorms take their statistics over the whole clip
(channels, frames, rows and columns at once); two of them double the frames. ``F`` latent frames give
``4 F`` pixel frames, and every pixel depends on every latent position of the block it is decoded with:
no split is exact. Temporal tiles decode context frames on both sides, spatial tiles a halo, and seams
keep blending beside them.

diffusers decodes Allegro only in tiles (``vae.decode`` raises without ``enable_tiling()``, which
``AllegroPipeline``'s users call): ``tiled_decode`` applies ``post_quant_conv`` to each frame, decodes
blocks of ``sample_frames / 4`` x ``sample_size / 8`` x ``sample_size / 8`` latents (6 x 40 x 40 in the
release) one by one with the decoder, and blends them with linear ramps over 2 latent frames, 15 rows and
10 columns. farm's decode of a tile is one such block's decode: ``post_quant_conv``, then the decoder
over the whole tile, untiled. A tile of diffusers' block size equals the pipeline's decode of it;
farm's own tiles (their sizes and blends) are farm's, so a shot larger than one block decodes close to the
pipeline's tiled decode, not to it. (diffusers' tiles must also fit the latent exactly: latents of
other sizes leave pixels the pipeline never decodes; farm decodes every latent size.)

``"latents": "normalized"``: ``AllegroPipeline.decode_latents`` divides by ``scaling_factor`` (0.13 in
the release). Its ``output_type="latent"`` latents are ``[B, C, F, H, W]``; for an odd ``num_frames`` it
keeps the first ``num_frames`` of the ``4 F`` decoded frames, farm all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.allegro.configs import ALLEGRO_TINY
from farm.decoders.base import DecoderSpec
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry

if TYPE_CHECKING:
    import torch

SAMPLE_FRAMES = 24  # pixel frames of a block of diffusers' Allegro tiling (fixed in its class)


class AllegroDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "allegro"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {"allegro": {}, "allegro-tiny": ALLEGRO_TINY}
    model_class_name: ClassVar[str] = "AutoencoderKLAllegro"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {"AllegroPipeline": ("normalized", False)}
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.", "post_quant_conv.")
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")
    # Context: every pixel depends on every latent frame it is decoded with (the temporal layers'
    # GroupNorms). With RANDOM weights (`benchmarks/measure_halo.py context`, float32 on a CPU, two tiles of a
    # 24-frame 4x4 latent) 2 to 10 frames of context each side leave the seam band at 18.0 to 31.4 dB. 22
    # frames each way reach across a shot of the release's 22 latent frames (88 pixel frames): its temporal
    # tiles decode it whole, and equal its untiled decode.
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"allegro": (22, 22), "allegro-tiny": (22, 22)}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, float32 on a CPU, 2x2 tiles of a 3x32x32
    # latent): seam band 30.2 dB at 8, 32.2 at 10, 34.1 at 12, still rising: the GroupNorms' statistics and
    # the mid block's attention span the whole frame, which no halo reaches, so Allegro keeps blending
    # beside it. The released config is not measured (it takes the largest known).
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {"allegro-tiny": {"float32": 12}}
    # bf16 on a GPU, per output pixel-frame: HunyuanVideo's measured figure, whose full-resolution blocks
    # are as wide (128 channels); not measured for Allegro itself.
    bytes_per_pixel_frame: ClassVar[float] = 3420.0

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        temporal = 2 ** sum(bool(t) for t in full["temporal_upsample_blocks"])
        spatial = 2 ** (len(full["block_out_channels"]) - 1)  # every up block but the last doubles space
        geometry = Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=False)
        return cls._with_context(geometry, config)

    @classmethod
    def plan_note(cls, spec: DecoderSpec) -> str | None:
        """diffusers' tiling, which AllegroPipeline's decode runs: farm's tiles equal one of its blocks."""
        full = cls._full_config(spec.config)
        g = cls.geometry_for(spec.config)
        frames, side = SAMPLE_FRAMES // g.temporal_scale, full["sample_size"] // g.spatial_scale
        return (f"AllegroPipeline decodes in blocks of {frames}x{side}x{side} latents blended by diffusers' "
                "tiling; farm decodes each tile whole: a shot of one such block equals the pipeline's "
                "decode, a larger one is close to it")  # fmt: skip

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["block_out_channels"][0] / 128

    @classmethod
    def _fix_compression_ratios(cls, model: Any, spec: DecoderSpec) -> None:
        """Nothing to fix: farm never runs diffusers' Allegro tiling, the one reader of its ratios (read
        as attributes, they warn of deprecation)."""

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``AllegroPipeline.decode_latents``: ``z / scaling_factor``."""
        return z / self.model.config.scaling_factor

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """One block of diffusers' ``tiled_decode``: ``post_quant_conv`` on each frame, then the decoder."""
        model, batch = self.model, z.shape[0]
        frames = model.post_quant_conv(z.permute(0, 2, 1, 3, 4).flatten(0, 1))
        return model.decoder(frames.unflatten(0, (batch, -1)).permute(0, 2, 1, 3, 4))
