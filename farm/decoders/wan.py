"""Wan 2.1 / 2.2 VAE decoder (diffusers `AutoencoderKLWan`): 8x spatial (16x: Wan 2.2 TI2V-5B), 4x temporal.

The decoder is causal in time: diffusers decodes one latent frame at a time, carrying a cache of the
previous frames' features; the first latent frame of a call decodes to one pixel frame, each later one to
four, so ``F`` latent frames give ``1 + 4 (F - 1)`` pixel frames. A tile whose temporal range starts at
latent frame ``s`` starts its own cache there and decodes frame ``s`` as a first frame: exactly what the
tiling's causal shift expects (that frame gets blend weight 0 next to the previous tile). Frames a tile
decodes after its first one depend only on the latent frames it holds.

Spatially, the middle block's self-attention spans the whole tile (per frame), so a spatial tile's pixels
differ slightly from a whole-frame decode everywhere, not only near its edges; the overlap blend hides
the seams (diffusers' own ``tiled_decode`` relies on the same).

``"latents": "normalized"``: ``WanPipeline`` un-normalises with the config's ``latents_mean`` and
``latents_std`` (``z / (1 / std) + mean``); no scaling factor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry

if TYPE_CHECKING:
    import torch

# The Wan 2.2 TI2V-5B VAE (Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json). Wan 2.1 and Wan 2.2 A14B use
# the 16-channel VAE that is diffusers' default constructor ("wan").
WAN22_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]  # fmt: skip
WAN22_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]  # fmt: skip
WAN22 = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "latents_mean": WAN22_MEAN,
    "latents_std": WAN22_STD,
}
# Same classes, a few channels (non-trivial latent statistics so "normalized" is exercised).
WAN_TINY = {
    "base_dim": 8,
    "z_dim": 4,
    "num_res_blocks": 2,
    "latents_mean": [0.1, -0.2, 0.3, 0.0],
    "latents_std": [1.5, 0.5, 2.0, 1.0],
}
WAN22_TINY = {
    **WAN22,
    "base_dim": 8,
    "decoder_base_dim": 16,
    "z_dim": 8,
    "num_res_blocks": 1,
    "latents_mean": WAN22_MEAN[:8],
    "latents_std": WAN22_STD[:8],
}


class WanDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "wan"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "wan": {},
        "wan2.2": WAN22,
        "wan-tiny": WAN_TINY,
        "wan2.2-tiny": WAN22_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLWan"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False)
        for name in ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline")
    }
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
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights): wan bfloat16 at 480x832 on an H200, 8 gives
    # 45.6 dB over the band (worst 8 levels), 12 and 16 no more (46.0, 46.2), where bfloat16's own noise
    # would allow 47.6; wan-tiny float32 on a CPU stops at 43.7 dB (8) and 44.6 (10). The mid block's
    # attention sees the whole frame, which no halo reaches, so Wan keeps blending beside the halo.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "wan": {"bfloat16": 8}, "wan2.2": {"bfloat16": 8}, "wan-tiny": {"float32": 8},
    }  # fmt: skip
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

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``WanPipeline``: ``z / (1 / latents_std) + latents_mean`` with the config's lists."""
        import torch

        cfg = self.model.config
        mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1).to(z)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1).to(z)
        return z / inv_std + mean
