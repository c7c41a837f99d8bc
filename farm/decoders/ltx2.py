"""LTX-2 video VAE decoder (diffusers `AutoencoderKLLTX2Video`): 32x spatial, 8x temporal, causal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry

if TYPE_CHECKING:
    import torch

# Same class as the real model, a few channels: decodes 17x128x192 in ~0.1 s on one CPU core.
LTX2_TINY = {
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1],
}

# LTX-2.3's video VAE, as diffusers' conversion script writes it (`scripts/convert_ltx2_to_diffusers.py`,
# `get_ltx2_video_vae_config("2.3")`, with the script's default `timestep_conditioning=False`): four decoder
# stages, upsamplers spatiotemporal / spatiotemporal / temporal / spatial without residual (channel factors
# 2, 2, 1, 2), zero padding, not causal. Lightricks' own form (the file's `config` -> `vae`): decoder_blocks
# res_x 4, compress_space x2, res_x 6, compress_time x2, res_x 4, compress_all x1, res_x 2, compress_all x2,
# res_x 2, causal_decoder false, spatial_padding_mode zeros (ltx-core's VideoDecoder builds them reversed).
LTX2_3 = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 128,
    "block_out_channels": [256, 512, 1024, 1024],
    "down_block_types": ["LTX2VideoDownBlock3D"] * 4,
    "decoder_block_out_channels": [256, 512, 512, 1024],
    "layers_per_block": [4, 6, 4, 2, 2],
    "decoder_layers_per_block": [4, 6, 4, 2, 2],
    "spatio_temporal_scaling": [True, True, True, True],
    "decoder_spatio_temporal_scaling": [True, True, True, True],
    "decoder_inject_noise": [False, False, False, False, False],
    "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
    "upsample_type": ["spatiotemporal", "spatiotemporal", "temporal", "spatial"],
    "upsample_residual": [False, False, False, False],
    "upsample_factor": [2, 2, 1, 2],
    "timestep_conditioning": False,
    "patch_size": 4, "patch_size_t": 1, "resnet_norm_eps": 1e-6,
    "encoder_causal": True, "decoder_causal": False,
    "encoder_spatial_padding_mode": "zeros", "decoder_spatial_padding_mode": "zeros",
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}  # fmt: skip
# LTX-2.3's structure (stages, upsampler kinds and factors, padding, causality) at widths 1/32 of it.
LTX2_3_TINY = {
    **LTX2_3,
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 16, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1, 1],
}

# Peak device memory of an untiled bf16 decode above the weights, per output pixel-frame: linear in the
# shot's pixels on a GPU (docs/performance.md#memory); other configs scale with the width of the last
# decoder block.
_BYTES_PER_PIXEL_FRAME_LTX2_BF16 = 118
_LTX2_LAST_BLOCK_CHANNELS = 256


class LTX2Decoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "ltx2"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "ltx2": {}, "ltx2-tiny": LTX2_TINY,
        "ltx2.3": LTX2_3, "ltx2.3-tiny": LTX2_3_TINY,
    }  # fmt: skip
    model_class_name: ClassVar[str] = "AutoencoderKLLTX2Video"
    statistics_tensors: ClassVar[tuple[str, ...]] = ("latents_mean", "latents_std")
    # The decoder is causal in time (no lookahead). Its receptive field reaches 13 latent frames back at
    # the tiny config (errors after a seam below 0.01 levels, float32 on a CPU; 1 level at 10 frames) and
    # ~22 at the real one (the float32 noise floor of an H200, 0.1 levels, from 22 frames on).
    # LTX-2.3 is not causal: it sees as far ahead as back. Latent frames on each side of a seam until a
    # window's decode equals the whole one's at the float32 noise floor (0.0005 levels; RANDOM weights, CPU):
    # 11 at the real config (0.006-0.008 levels at 10), 7 at the tiny one (1.4-2.4 levels at 6).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "ltx2": (24, 0), "ltx2-tiny": (13, 0),
        "ltx2.3": (11, 11), "ltx2.3-tiny": (7, 7),
    }  # fmt: skip
    # A float32 decode on a CPU needs several times the width-scaled GPU figure per pixel-frame (the
    # output and its conversion do not shrink with the width; docs/performance.md#memory).
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {"ltx2-tiny": {"bytes_per_pixel": 45.0}}
    # Seam-band PSNR at spatial overlap 4 (`measure_seams.py`, RANDOM weights, float32 CPU): ltx2 27.3 dB
    # (its shipped overlap: the target's reference), ltx2-tiny 27.6-28.1 dB.
    spatial_overlap: ClassVar[dict[str, int]] = {"ltx2": 4, "ltx2-tiny": 4}

    # Numbers the carried state (`ltx2_carry`) holds per latent row x column of a chunk: 2 input frames
    # of every causal convolution, at its resolution (counted from the state itself): 0.53 GiB for a
    # 704x1216 tile in bf16, 1.28 GiB at 1088x1920.
    carried_state_values: ClassVar[dict[str, int]] = {"ltx2": 338176, "ltx2-tiny": 2896}

    # ---- shapes --------------------------------------------------------------------------------

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n_blocks = len(full["decoder_block_out_channels"])
        scaling = full["decoder_spatio_temporal_scaling"]
        if isinstance(scaling, bool):
            scaling = [scaling] * n_blocks
        kinds = [k for k, on in zip(full["upsample_type"], scaling, strict=False) if on]
        spatial = full["patch_size"] * 2 ** sum(k in ("spatial", "spatiotemporal") for k in kinds)
        temporal = full["patch_size_t"] * 2 ** sum(k in ("temporal", "spatiotemporal") for k in kinds)
        # The first latent frame decodes to one pixel frame whatever the padding mode: tiles need the shift.
        # A causal decoder without injected noise can decode temporal chunks with its state carried.
        noise = full["decoder_inject_noise"]
        noisy = any(noise) if isinstance(noise, list | tuple) else bool(noise)
        carries = bool(full["decoder_causal"]) and not noisy
        geometry = Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=True, carries=carries)
        return cls._with_context(geometry, config)

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        full = cls._full_config(spec.config)
        width = full["decoder_block_out_channels"][0] / _LTX2_LAST_BLOCK_CHANNELS
        per_pixel = _BYTES_PER_PIXEL_FRAME_LTX2_BF16 * width * dtype_bytes(spec.dtype) / 2
        terms = {"weight_bytes": cls.weight_bytes(spec), "bytes_per_pixel": per_pixel}
        return cls._measured_terms(spec, terms)

    @classmethod
    def carried_state_bytes(cls, spec: DecoderSpec, latent_hw: tuple[int, int]) -> int:
        """Bytes of the decoder state a carried chunk of `latent_hw` latent rows x columns hands on (a
        config not counted: the real one's, scaled by the width of the last decoder block)."""
        values = cls.carried_state_values.get(spec.config_name or "")
        if values is None:
            width = cls._full_config(spec.config)["decoder_block_out_channels"][0] / _LTX2_LAST_BLOCK_CHANNELS
            values = round(cls.carried_state_values["ltx2"] * width)
        return int(values * latent_hw[0] * latent_hw[1] * dtype_bytes(spec.dtype))

    @classmethod
    def weight_bytes(cls, spec: DecoderSpec) -> int:
        full = cls._full_config(spec.config)
        # decoder parameters scale with the square of the block widths; 528 M for the real config
        widths = full["decoder_block_out_channels"]
        rel = sum(w * w for w in widths) / sum(w * w for w in (256, 512, 1024))
        return int(528e6 * rel * dtype_bytes(spec.dtype))

    # ---- decoding (build, load, check_weights, enable_compile, decode: DiffusersVideoDecoder) ------

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return self.denormalize_with_buffers(z)

    def _temb(self) -> torch.Tensor | None:
        import torch

        if not self.model.config.timestep_conditioning:
            return None
        t = float(self.spec.extra.get("decode_timestep", 0.0))
        return torch.tensor([t], device=self.device, dtype=self.torch_dtype)

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        return self.model.decode(z, temb=self._temb(), return_dict=False)[0]

    def decode_carried(
        self, latent: torch.Tensor, state: list | None, origin: tuple[int, int, int] | None = None
    ) -> tuple[torch.Tensor, list]:
        """`decode` of a temporal chunk that follows the chunk `state` came from (None: the first),
        with the state after it (`farm.decoders.ltx2_carry`). Runs eager even with --compile: the
        carried forwards are swapped in per call, which a compiled graph would not see."""
        import torch

        from farm.decoders.ltx2_carry import decode_with_state

        decoder = getattr(self.model.decoder, "_orig_mod", self.model.decoder)  # torch.compile's wrapper
        with self._lock, torch.inference_mode():
            pixels, after = decode_with_state(decoder, self.decoder_input(latent), self._temb(), state)
            return self.unit_pixels(pixels[0]), after
