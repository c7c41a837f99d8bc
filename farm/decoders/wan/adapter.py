"""Wan 2.1 / 2.2 VAE decoder (diffusers `AutoencoderKLWan`): 8x spatial (16x: Wan 2.2 TI2V-5B), 4x temporal.

The decoder is causal in time: diffusers decodes one latent frame at a time, carrying a cache of the
previous frames' features; the first latent frame of a call decodes to one pixel frame, each later one to
four, so ``F`` latent frames give ``1 + 4 (F - 1)`` pixel frames. A tile whose temporal range starts at
latent frame ``s`` starts its own cache there and decodes frame ``s`` as a first frame: exactly what the
tiling's causal shift expects (that frame gets blend weight 0 next to the previous tile). Frames a tile
decodes after its first one depend only on the latent frames it holds.

Spatially, the middle block's self-attention spans the whole frame (per frame), which no halo reaches:
farm runs ``conv_in`` and the middle block once over the whole frame (`whole_frame`) and each spatial
tile decodes the up blocks and the head from its block (plus halo) of that output, so a tile's pixels
equal a whole-frame decode's where its halo reaches as far as the up blocks see.

``"latents": "normalized"``: ``WanPipeline`` un-normalises with the config's ``latents_mean`` and
``latents_std`` (``z / (1 / std) + mean``); no scaling factor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.checkpoints import Layout
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.wan import whole_frame
from farm.decoders.wan.configs import WAN22, WAN22_TINY, WAN_TINY
from farm.decoders.wan.layout import (
    WAN22_ORIGINAL,
    WAN_ORIGINAL,
    check_layout_fits,
    wan_layout,
    wan_original_name,
)

if TYPE_CHECKING:
    import torch

class WanDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "wan"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "wan": {},
        "wan2.2": WAN22,
        "wan-tiny": WAN_TINY,
        "wan2.2-tiny": WAN22_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLWan"
    # Cosmos-Predict2 (sigma_data 1: z·std + mean), Cosmos-Predict2.5 and Cosmos 3 (z / (1/std) + mean) and
    # SkyReels-V2 un-normalise as WanPipeline does, with the VAE's own lists (wan, or wan2.2 for Cosmos 3)
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False)
        for name in ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline",
                     "Cosmos2VideoToWorldPipeline", "Cosmos2_5_PredictBasePipeline", "Cosmos3OmniPipeline",
                     "SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline",
                     "SkyReelsV2DiffusionForcingPipeline", "SkyReelsV2DiffusionForcingVideoToVideoPipeline")
    }  # fmt: skip
    comfyui_latents: ClassVar[str | None] = "denormalized"
    comfyui_words: ClassVar[tuple[str, ...]] = ("wan",)
    # Causal: each causal convolution caches two frames, and their chain reaches 37 latent frames back at
    # the real configs (an H200 decodes frame by frame bit-identically beyond it), 24 (wan-tiny) and 22
    # (wan2.2-tiny) at the tiny ones (errors after a seam below 0.01 levels, float32 on a CPU).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "wan": (37, 0),
        "wan2.2": (37, 0),
        "wan-tiny": (24, 0),
        "wan2.2-tiny": (22, 0),
    }
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.", "post_quant_conv.")
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")
    # bf16 on a GPU: linear in the frame count despite the frame-by-frame loop (wan2.2's, the larger)
    bytes_per_pixel_frame: ClassVar[float] = 366.0
    # Fitted to measured CPU decodes (`tools/measure_families.py --fit`; docs/performance.md#memory): a
    # fixed part, bytes per pixel of one frame (the frame-by-frame decode holds one latent frame's
    # activations whatever the clip's length) and per output pixel-frame (the clip it concatenates).
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {
        "wan-tiny": {"const_bytes": 6934970.3, "bytes_per_pixel": 11.8, "bytes_per_frame_pixel": 4812.3},
    }
    # Seam-band PSNR on the worse axis (`measure_seams.py spatial`, RANDOM weights): wan-tiny 23.8 dB at
    # overlap 4, 25.5 at 5, 27.0 at 6, 27.7 at 7; wan (the real architecture, float32 CPU) 25.2 at 3, 27.1
    # at 4, 28.7 at 5.
    spatial_overlap: ClassVar[dict[str, int]] = {"wan": 4, "wan-tiny": 6}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights). The mid block's attention sees the whole
    # frame, which no halo reaches: alone, wan bfloat16 at 480x832 on an H200 stops at 45.6 dB over the band
    # at 8 (46.2 at 16), wan-tiny float32 on a CPU at 43.7 (8) and 44.6 (10). Tiles decode from the mid
    # block run once over the whole frame (`shares_whole_frame`; `--whole-frame`): wan-tiny float32 then
    # reaches 41.0 / 56.0 / 68.5 / 86.6 dB at 4 / 6 / 8 / 10 (worst 1 level from 8), the floor at 10; wan
    # bfloat16 at 720x1280 on an H200 42.3 / 50.3 / 57.5 dB at 4 / 8 / 12 (worst 22 / 4 / 4 levels), the
    # floor at 8. wan2.2 (another width and patch size) is not measured with the pass and keeps blending.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "wan": {"bfloat16": 8}, "wan2.2": {"bfloat16": 8}, "wan-tiny": {"float32": 10},
    }  # fmt: skip
    halo_exact: ClassVar[frozenset[str]] = frozenset({"wan", "wan-tiny"})
    # one decode's seconds per config, what `cost_model` scales by (docs/performance.md#memory); the
    # frame-by-frame loop makes wan-tiny ~80 times slower than ltx2-tiny per pixel on a CPU
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]] = {
        "wan-tiny": ("cpu", (17, 128, 192), 4.64),
        "wan": ("h200", (33, 512, 768), 0.74),
        "wan2.2": ("h200", (33, 512, 768), 0.73),
    }

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n_up = len(full["dim_mult"]) - 1  # every block but the last upsamples 2x in space
        temporal_up = list(full["temperal_downsample"])[::-1][:n_up]
        geometry = Geometry(
            spatial_scale=2**n_up * (full["patch_size"] or 1),
            temporal_scale=2 ** sum(bool(t) for t in temporal_up),
            causal=True,
        )
        return cls._with_context(geometry, config)

    latent_channels_key = "z_dim"
    # decoding frame by frame, it holds one latent frame's activations whatever the clip's length
    memory_fit_terms: ClassVar[tuple[str, ...]] = ("const_bytes", "bytes_per_pixel", "bytes_per_frame_pixel")

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        full = cls._full_config(config)
        width = (full["decoder_base_dim"] or full["base_dim"]) / (full["patch_size"] or 1)
        return min(1.0, width / 96)  # the real configs measure alike; tiny ones scale down

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return wan_layout(names)

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout in (WAN_ORIGINAL, WAN22_ORIGINAL):
            return wan_original_name(name, layout, full_config)
        return super().original_name(name, layout, full_config)

    @classmethod
    def check_layout_fits(cls, layout: str, full_config: dict[str, Any], where: str) -> None:
        check_layout_fits(layout, full_config, where)

    @classmethod
    def convert_names(cls, layout: Layout, tensors: dict[str, Any], missing: Any) -> dict[str, Any]:
        """diffusers' Wan 2.1 converter (none in its library for Wan 2.2's: `original_name` names it)."""
        if layout.name != WAN_ORIGINAL:
            return {}
        from diffusers.loaders import single_file_utils as su

        return dict(su.convert_wan_vae_to_diffusers(tensors))

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``WanPipeline``: ``z / (1 / latents_std) + latents_mean`` with the config's lists."""
        import torch

        cfg = self.model.config
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1).to(z)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1).to(z)
        return z / inv_std + mean

    @classmethod
    def shares_whole_frame(cls, config: dict[str, Any]) -> bool:
        return True

    def whole_frame_part(self, z: torch.Tensor) -> torch.Tensor:
        return whole_frame.whole_frame_part(self.model, z)

    def rest_of_decoder(self, shared: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        return whole_frame.rest_of_decoder(self.model, shared)
