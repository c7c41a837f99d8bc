"""MiniMax-H3 video VAE decoder (diffusers `AutoencoderKLMiniMaxH3`): 16x spatial, 4x temporal, a ViT.

The decoder is a non-causal ViT: every latent voxel is a token, attended over with full self-attention
(plus learned register tokens), and rotary positions normalised to [-1, 1) over the block it decodes, so
a token's position depends on the block's size. The model was trained and released decoding blocks of
its own: ``vae.decode`` cuts the frame into 256-px tiles (16 latent units) overlapping by at least 64 px
(4 units), decodes each and blends them linearly (`use_tiling`, on by default: "the released frames are
the blended-tile ones"), and cuts time into clips of 7 latent frames every 5 (17 pixel frames each; a
clip's last 5 frames cross-fade into the next clip's first). So ``5n + 2`` latent frames give ``17n + 5``
pixel frames (``Geometry.clip``), which no temporal scale expresses: farm decodes a shot whole in time
(the decoder blends its own clips) and splits it only spatially.

farm's decode of a tile is ``vae.decode`` as the pipeline calls it, its 256-px tiles and clips included
(``MiniMaxH3VideoDecodeStep``): a single-tile render is the pipeline's decode. A farm spatial tile lays
the decoder's 256-px tiles out from its own corner, not the frame's, so tiled renders are not exact;
the halo and overlap measured on the tiny config are below.

``"latents": "normalized"``: the pipeline un-normalises with the config's ``latents_mean`` and
``latents_std`` (``z * std + mean``; no scaling factor). The decoder's output is ImageNet-normalised RGB
over [0, 1] (``sample * pixel_std + pixel_mean``, then clamped), not [-1, 1].

dtype: diffusers keeps the norms and the blocks' residual gains (``_keep_in_fp32_modules``) in float32
whatever the load dtype, and the decoder casts around them; farm does the same.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.minimax_h3.configs import MINIMAX_H3, MINIMAX_H3_TINY
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

# MiniMaxH3ModularPipeline.pixel_mean / pixel_std: the VAE decodes to (rgb - mean) / std
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
# The clip geometry farm maps frames by: clip_length 17, token_drop 3, 4x temporal (the released values;
# diffusers derives its clip blending from them, and other values give other frame counts).
RELEASED_CLIPS = {"clip_length": 17, "token_drop": 3}


class MiniMaxH3Decoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "minimax-h3"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "minimax-h3": MINIMAX_H3,
        "minimax-h3-tiny": MINIMAX_H3_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLMiniMaxH3"
    # The modular pipeline run without its decode blocks leaves its after-denoise step's latents
    # [1, C, F, H, W], which its video decode step un-normalises (`decoders.py`).
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        "MiniMaxH3ModularPipeline": ("normalized", False),
    }
    # the sound of MiniMax-H3 (`farm.decoders.minimax_h3.audio`), tiny with tiny
    sound_configs: ClassVar[dict[str, str]] = {"minimax-h3": "minimax-h3-audio",
                                               "minimax-h3-tiny": "minimax-h3-audio-tiny"}
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.", "post_quant_conv.")
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, float32 on a CPU, 2x2 tiles, no overlap):
    # minimax-h3-tiny over the seam band at 7x40x44 latent units, 47.1 dB at 0, 51.4 at 4, 56.4 at 8, 54.8
    # at 12; at 7x32x32, 48.0 at 0, 51.9 at 4, 54.8 at 6, exact at 8 and 16 (the blocks then fall on the
    # decoder's own 256-px grid), 51.9 at 12. No halo reaches the float32 floor: a block's own 256-px
    # tiles start at its corner, not the frame's, so MiniMax-H3 keeps blending beside the halo. minimax-h3
    # bfloat16 on an H200 (2x2 of 7x45x80): 40.0 / 43.5 / 45.2 / 44.9 dB at 0 / 4 / 8 / 12, worst 19 / 14 /
    # 11 / 15 levels, short of bf16's floor; 8 is the best measured.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "minimax-h3": {"bfloat16": 8}, "minimax-h3-tiny": {"float32": 8},
    }  # fmt: skip

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        for key, value in RELEASED_CLIPS.items():
            if full[key] != value:
                released = ", ".join(f"{k} {v}" for k, v in RELEASED_CLIPS.items())
                raise FarmError(f"decoder config for {cls.family}: {key} {full[key]!r} is not supported; "
                                f"farm maps frames by the released clips ({released})")  # fmt: skip
        t = math.prod(full["temporal_downsample_factors"])
        if t != 4:
            raise FarmError(f"decoder config for {cls.family}: a temporal compression of {t} is not "
                            "supported; farm maps frames by the released 4x")  # fmt: skip
        clip_length = int(full["clip_length"])
        geometry = Geometry(
            spatial_scale=math.prod(full["spatial_downsample_factors"]),
            temporal_scale=t,
            causal=False,
            min_block=(3, 1, 1),  # diffusers' clip loop decodes nothing from fewer latent frames
            clip=(math.ceil(clip_length / t), clip_length),
            whole_time=True,
        )
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        full = cls._full_config(config)
        return full["decoder_num_attention_heads"] * full["decoder_attention_head_dim"] / 2048

    @classmethod
    def build(cls, spec: DecoderSpec) -> Any:
        """As the base builds it; RANDOM weights then draw the transformer blocks' residual gains
        (``scale1``, ``scale2``) from the seed too. diffusers initialises them to zero, which leaves every
        token to itself (attention and feed-forward add nothing), so a tiling would look exact."""
        import torch

        model = super().build(spec)
        if spec.random_weights:
            generator = torch.Generator().manual_seed(int(spec.weights["random_seed"]))
            with torch.no_grad():
                for name, tensor in model.decoder.named_parameters():
                    if name.rsplit(".", 1)[-1] in ("scale1", "scale2"):
                        tensor.copy_(0.5 * torch.randn(tensor.shape, generator=generator))
        return model

    @classmethod
    def meta_model(cls, config: dict[str, Any]) -> Any:
        """As the base builds it, with the rotary embedding's frequencies (a buffer the weights do not hold:
        diffusers computes it at construction) computed for real."""
        model = super().meta_model(config)
        full = cls._full_config(config)
        rope = model.decoder.rope
        dim = int(full["decoder_attention_head_dim"] * full["decoder_rope_dim_ratio"])
        model.decoder.rope = type(rope)(dim, theta=full["decoder_rope_theta"])
        return model

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> MiniMaxH3Decoder:
        decoder = super().from_model(spec, model, device)
        assert isinstance(decoder, MiniMaxH3Decoder)
        keep = set(getattr(decoder.model, "_keep_in_fp32_modules", None) or ())
        for name, tensor in decoder.model.named_parameters():  # as diffusers' from_pretrained keeps them
            if keep.intersection(name.split(".")):
                tensor.data = tensor.data.float()
        decoder.model.use_tiling = True  # the released decode: 256-px tiles, blended
        return decoder

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``MiniMaxH3VideoDecodeStep``: ``z * latents_std + latents_mean``."""
        import torch

        mean = torch.tensor(self.model.config.latents_mean, device=z.device, dtype=z.dtype)
        std = torch.tensor(self.model.config.latents_std, device=z.device, dtype=z.dtype)
        return z * std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)

    @staticmethod
    def unit_pixels(pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet-normalised RGB → [0, 1] (``sample * pixel_std + pixel_mean``, clamped at uint8 time)."""
        import torch

        pixels = pixels.float()
        mean = torch.tensor(PIXEL_MEAN, device=pixels.device).view(-1, 1, 1, 1)
        std = torch.tensor(PIXEL_STD, device=pixels.device).view(-1, 1, 1, 1)
        return pixels * std + mean
