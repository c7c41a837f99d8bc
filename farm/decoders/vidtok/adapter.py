"""VidTok decoder (diffusers `AutoencoderVidTok`): 8x spatial, 4x temporal, causal.

Causal 3-D convolutions (the first frame repeated as the past), per-position LayerNorms, 2-D resnets per
frame and 1-D temporal resnets per position, and a mid block whose self-attention spans each latent frame.
``vae.decode`` (tiling off, its default) runs the decoder over the whole latent in one pass and drops the
first 3 of its ``4 F`` frames: ``F`` latent frames give ``1 + 4 (F - 1)``, and a tile's first latent frame
decodes to one pixel frame, as the tiling's causal shift expects. farm decodes a tile with that same
call. The temporal upsamplers interpolate between neighbouring frames, so a frame also sees a little of
the next; the mid block's attention sees the whole frame, so spatial tiles keep blending beside their halo.

Only causal configs are decoded: a non-causal VidTok drops latent frames past a multiple of 4, which no
tile geometry maps. No diffusers pipeline hands VidTok latents over and VidTok has no latent statistics:
its latents are decoded as they are (``"latents": "denormalized"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.vidtok.configs import VIDTOK_TINY
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch


class VidTokDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "vidtok"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {"vidtok": {}, "vidtok-tiny": VIDTOK_TINY}
    model_class_name: ClassVar[str] = "AutoencoderVidTok"
    latent_channels_key: ClassVar[str] = "z_channels"
    # Context: the causal convolutions, counted at their temporal resolutions (each reaching 2 frames back),
    # reach 45 latent frames back in the released decoder and 34 in vidtok-tiny; the temporal upsamplers'
    # interpolation sees one frame ahead. vidtok-tiny's 2-tile split of 48 latent frames (RANDOM weights,
    # float32, a CPU, `benchmarks/measure_halo.py context`) reaches 39.9 / 53.1 / 63.2 dB over the seam band
    # from 12 / 16 / 20 frames of context: the floor only nearer the receptive field, which is recorded.
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"vidtok": (45, 1), "vidtok-tiny": (34, 1)}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, float32 on a CPU, 2x2 tiles of a 3x32x32
    # latent): seam band 29.4 dB at 2, 39.1 at 4, 44.9 at 6, 47.2 at 8, 50.2 at 10, 53.6 at 12, still rising:
    # the mid block's attention spans the whole frame, which no halo reaches, so VidTok keeps blending beside
    # it. The released config is not measured (it takes the largest known).
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {"vidtok-tiny": {"float32": 8}}
    # bf16 on a GPU, per output pixel-frame: HunyuanVideo's measured figure, whose full-resolution blocks
    # are as wide (128 channels); not measured for VidTok itself.
    bytes_per_pixel_frame: ClassVar[float] = 3420.0

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        levels = len(full["ch_mult"])
        spatial_us = full["spatial_us"] if full["spatial_us"] is not None else list(range(1, levels))
        tempo_us = full["tempo_us"] if full["tempo_us"] is not None else [1, 2]
        geometry = Geometry(spatial_scale=2 ** len(spatial_us), temporal_scale=2 ** len(tempo_us))  # causal
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["ch"] / 128

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        """VidTok's diffusers names claim diffusers' layout: its ``decoder.mid.attn_1`` and ``decoder.up.N``
        are also HunyuanVideo 1.5's original names, but only VidTok has ``decoder.up_temporal``."""
        return "diffusers" if any(n.startswith("decoder.up_temporal.") for n in names) else None

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        super().check_spec(spec)
        if not cls._full_config(spec.config)["is_causal"]:
            raise FarmError(f"{spec.describe()}: farm decodes causal VidTok configs only (a non-causal one "
                            "drops latent frames past a multiple of 4); give a config with "
                            "\"is_causal\": true")  # fmt: skip
        if spec.latents == "normalized":
            raise FarmError(f"{spec.describe()}: VidTok latents have no normalisation to undo; set "
                            "\"latents\": \"denormalized\"")  # fmt: skip

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        raise FarmError("VidTok latents have no normalisation to undo")

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """``vae.decode`` (which returns the frames themselves, not a tuple)."""
        return self.model.decode(z)
