"""LTX-Video 0.9.x VAE decoder (diffusers `AutoencoderKLLTXVideo`): 32x spatial, 8x temporal.

The decoder convolutions are not causal in time (``decoder_causal=False``), but the first latent frame
still decodes to one pixel frame (the upsamplers drop the first ``stride - 1`` frames), so the tiling's
causal frame mapping and shift apply: ``F`` latent frames → ``1 + 8 (F - 1)`` pixel frames.

Timestep-conditioned decoders (0.9.1 and later) decode as ``LTXPipeline`` does: the spec's
``decode_timestep`` (default 0.0) conditions the decoder, and ``decode_noise_scale`` (default: the
timestep, as in the pipeline) mixes noise into the latents first, ``(1 - s) z + s noise``. The
pipeline draws that noise from its generator; farm draws it per latent position from
``decode_noise_seed`` (default 0, :mod:`farm.decoders.noise`), so overlapping tiles see the same noise.
The 0.9.1 decoder also injects noise after some convolutions (``decoder_inject_noise``); farm makes that
noise a function of position too. Both need the tile's ``origin`` in :meth:`decode`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.checkpoints import Layout
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.ltx2.layout import LTX_ORIGINAL, is_ltx_original, ltx_original_name
from farm.decoders.ltxv import metadata as ltxv_metadata
from farm.decoders.ltxv.configs import LTXV_091, LTXV_091_TINY, LTXV_095, LTXV_095_TINY, LTXV_TINY
from farm.decoders.ltxv.layout import convert_ltxv_names, ltxv_variant
from farm.decoders.noise import hash_seed, position_noise
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

# hash_seed salts: the noise mixed into the latent (timestep-conditioned decode), the noise each layer injects
NOISE_SALT_LATENT = 1
_NOISE_SALT_INJECT = 2


def _keep_in_state_dict(name: str, value: Any) -> Any:
    """A state-dict hook that lists a parameter the module no longer holds, under its old name."""

    def hook(_module: Any, state: dict[str, Any], prefix: str, _meta: Any) -> None:
        state[prefix + name] = value.detach()

    return hook


class LTXVideoDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "ltxv"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "ltxv": {},
        "ltxv-0.9.1": LTXV_091,
        "ltxv-0.9.5": LTXV_095,
        "ltxv-tiny": LTXV_TINY,
        "ltxv-0.9.1-tiny": LTXV_091_TINY,
        "ltxv-0.9.5-tiny": LTXV_095_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLLTXVideo"
    # LTXPipeline and its image-to-video sibling return latents packed as tokens [B, S, D]
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        "LTXPipeline": ("normalized", True),
        "LTXImageToVideoPipeline": ("normalized", True),
        "LTXConditionPipeline": ("normalized", False),
    }
    comfyui_latents: ClassVar[str | None] = "normalized"
    comfyui_words: ClassVar[tuple[str, ...]] = ("ltxv",)
    injects_noise = False  # whether a decoder block adds noise (set by `_install_noise_hooks`)
    statistics_tensors: ClassVar[tuple[str, ...]] = ("latents_mean", "latents_std")
    # Non-causal convolutions: a frame depends on latent frames both ways. Measured receptive fields: tiny
    # configs to errors below 0.01 levels (float32, CPU); real ones to the float32 noise floor of an H200
    # (0.2-0.3 levels, reached at 10-11 frames each way), plus one frame.
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "ltxv": (12, 12),
        "ltxv-0.9.1": (12, 12),
        "ltxv-0.9.5": (11, 11),
        "ltxv-tiny": (10, 10),
        "ltxv-0.9.1-tiny": (6, 7),
        "ltxv-0.9.5-tiny": (6, 7),
    }
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {
        "decode_timestep": ((int, float), "a number"),
        "decode_noise_scale": ((int, float), "a number in [0, 1]"),
        "decode_noise_seed": ((int,), "a whole number"),
    }
    # bf16 on a GPU, the same for ltxv, ltxv-0.9.1 and ltxv-0.9.5 (all end in a 128-channel block)
    bytes_per_pixel_frame: ClassVar[float] = 104.0
    # float32 on a CPU, measured per tiny config (docs/performance.md#memory)
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {
        "ltxv-tiny": {"bytes_per_pixel": 76.0},
        "ltxv-0.9.1-tiny": {"bytes_per_pixel": 75.0},
    }
    # Seam-band PSNR on the worse axis (`measure_seams.py spatial`, RANDOM weights): ltxv-tiny 26.1 dB at
    # overlap 4, 28.5 at 5; ltxv (the 0.9.0 architecture, float32 CPU) 25.0 at 4, 27.1 at 5.
    spatial_overlap: ClassVar[dict[str, int]] = {"ltxv": 5, "ltxv-tiny": 5}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights): ltxv bfloat16 at 704x1216 on an H200, 8
    # gives 47.9 dB over the band (worst 6 levels), 10 48.5, 12 and 14 48.4: bfloat16's own noise for this
    # decoder (its whole decode is 48.4 dB from float32's), so 10; ltxv-tiny float32 on a CPU reaches
    # 96.0 dB at 10 (8 gives 64.6). No part of it sees the whole frame: the halo alone is exact.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "ltxv": {"bfloat16": 10}, "ltxv-tiny": {"float32": 10},
    }  # fmt: skip
    halo_exact: ClassVar[frozenset[str]] = frozenset({"ltxv", "ltxv-tiny"})
    # one decode's seconds per config, what `cost_model` scales by (docs/performance.md#memory)
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]] = {
        "ltxv-tiny": ("cpu", (33, 256, 384), 0.49),
        "ltxv-0.9.1-tiny": ("cpu", (33, 256, 384), 0.905),
        "ltxv": ("h200", (33, 512, 768), 0.05),
        "ltxv-0.9.1": ("h200", (33, 512, 768), 0.12),
        "ltxv-0.9.5": ("h200", (33, 512, 768), 0.07),
    }

    # ---- shapes --------------------------------------------------------------------------------

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n_up = sum(bool(s) for s in full["decoder_spatio_temporal_scaling"])  # each upsampler is 2x2x2
        spatial, temporal = full["patch_size"] * 2**n_up, full["patch_size_t"] * 2**n_up
        geometry = Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=True)
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        full = cls._full_config(config)
        last = full["decoder_block_out_channels"][0] // full["upsample_factor"][0]
        return last / 128

    # ---- spec ----------------------------------------------------------------------------------

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        super().check_spec(spec)
        set_fields = [k for k in ("decode_timestep", "decode_noise_scale") if spec.extra.get(k)]
        if set_fields and not cls._full_config(spec.config).get("timestep_conditioning"):
            raise FarmError(
                f"decoder spec: {', '.join(set_fields)} set, but this {spec.family} config has no timestep "
                "conditioning (timestep_conditioning is false), so the pipeline would ignore it; remove it "
                "or use a timestep-conditioned config (ltxv-0.9.1, ltxv-0.9.5)"
            )
        scale = spec.extra.get("decode_noise_scale")
        if scale is not None and not 0.0 <= float(scale) <= 1.0:
            raise FarmError(f"decoder spec: 'decode_noise_scale' must be in [0, 1], got {scale!r}")

    @staticmethod
    def decode_settings(spec: DecoderSpec, timestep_conditioning: bool) -> tuple[float | None, float, int]:
        """(timestep or None, latent noise scale, noise seed), as ``LTXPipeline`` derives them."""
        if not timestep_conditioning:
            return None, 0.0, 0
        t = float(spec.extra.get("decode_timestep", 0.0))
        scale = spec.extra.get("decode_noise_scale")
        return t, t if scale is None else float(scale), int(spec.extra.get("decode_noise_seed", 0))

    # ---- loading -------------------------------------------------------------------------------

    @classmethod
    def file_decoder_config(cls, vae: dict[str, Any], where: str) -> dict[str, Any] | None:
        """An LTX-Video file's own decoder settings, as ltx-video reads its ``config`` metadata."""
        return ltxv_metadata.ltxv_decoder_config(vae, where)

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return LTX_ORIGINAL if is_ltx_original(names) else None

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout == LTX_ORIGINAL:
            return ltx_original_name(name, ltxv_variant(full_config), full_config)
        return super().original_name(name, layout, full_config)

    @classmethod
    def convert_names(cls, layout: Layout, tensors: dict[str, Any], missing: Any) -> dict[str, Any]:
        return convert_ltxv_names(tensors, layout.prefix, missing) if layout.name == LTX_ORIGINAL else {}

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> LTXVideoDecoder:
        decoder = super().from_model(spec, model, device)
        assert isinstance(decoder, LTXVideoDecoder)
        decoder._install_noise_hooks()
        return decoder

    def _install_noise_hooks(self) -> None:
        """Replace the decoder's injected noise (a fresh ``torch.randn`` per call) with position noise."""
        from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoResnetBlock3d

        self._origin: tuple[int, int, int] | None = None
        self._latent_hw = (1, 1)
        seed = int(self.spec.extra.get("decode_noise_seed", 0))
        self.injects_noise = False
        blocks = [m for m in self.model.decoder.modules() if isinstance(m, LTXVideoResnetBlock3d)]
        for k, block in enumerate(blocks):
            for j, (conv, name) in enumerate(((block.conv1, "per_channel_scale1"),
                                              (block.conv2, "per_channel_scale2"))):  # fmt: skip
                scale = getattr(block, name)
                if scale is None:
                    continue
                setattr(block, name, None)  # diffusers skips its own noise; the hook adds farm's
                block._register_state_dict_hook(_keep_in_state_dict(name, scale))
                layer_seed = hash_seed(seed, _NOISE_SALT_INJECT, k, j)
                conv.register_forward_hook(self._noise_hook(scale.detach(), layer_seed))
                self.injects_noise = True

    def _noise_hook(self, scale: Any, seed: int) -> Any:
        def hook(_module: Any, _inputs: Any, out: Any) -> Any:
            import torch

            h, w = out.shape[-2:]
            lh, lw = self._latent_hw
            if h % lh or w % lw:
                raise AssertionError(f"layer size {h}x{w} is not a multiple of the latent {lh}x{lw}")
            _, oh, ow = self._origin or (0, 0, 0)
            rows = oh * (h // lh) + torch.arange(h, device=out.device)
            cols = ow * (w // lw) + torch.arange(w, device=out.device)
            noise = position_noise(seed, [rows, cols], out.device).to(out.dtype)  # [H, W], as diffusers'
            return out + (noise[None] * scale)[None, :, None, ...]

        return hook

    # ---- decoding ------------------------------------------------------------------------------

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return self.denormalize_with_buffers(z)  # as LTXPipeline._denormalize_latents

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        import torch

        t, scale, seed = self.decode_settings(self.spec, bool(self.model.config.timestep_conditioning))
        if origin is None and (scale > 0 or self.injects_noise):
            raise FarmError(
                f"{self.spec.family} decoder [{self.spec.config_name or 'custom config'}] draws noise per "
                "latent position (decode_noise_scale > 0 or injected decoder noise): decode() needs the "
                "tile's origin (first latent frame, row, column) to draw the same noise as its neighbours"
            )
        origin = origin or (0, 0, 0)
        if scale > 0:
            _, c, f, h, w = z.shape
            coords = [torch.arange(c)] + [o + torch.arange(n) for o, n in zip(origin, (f, h, w), strict=True)]
            noise = position_noise(hash_seed(seed, NOISE_SALT_LATENT), coords, z.device).to(z.dtype)
            z = (1.0 - scale) * z + scale * noise[None]
        temb = None if t is None else torch.tensor([t], device=z.device, dtype=z.dtype)
        self._origin, self._latent_hw = origin, (int(z.shape[-2]), int(z.shape[-1]))
        return self.model.decode(z, temb=temb, return_dict=False)[0]
