"""LTX-2 video VAE decoder (diffusers `AutoencoderKLLTX2Video`): 32x spatial, 8x temporal; the released
decoder looks ahead in time (not causal), diffusers' constructor default does not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.decoders.checkpoints import Layout
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.ltx2 import metadata as ltx_metadata
from farm.decoders.ltx2.carry import decode_with_state
from farm.decoders.ltx2.configs import LTX2_3, LTX2_3_TINY, LTX2_RELEASED, LTX2_TINY
from farm.decoders.ltx2.layout import LTX_ORIGINAL, convert_ltx2_names, is_ltx_original, ltx_original_name
from farm.decoders.recording import recorded_decoder_parameters

if TYPE_CHECKING:
    import torch

# Peak device memory of an untiled bf16 decode above the weights, per output pixel-frame: linear in the
# shot's pixels on a GPU (docs/performance.md#memory); other configs scale with the width of the last
# decoder block.
_BYTES_PER_PIXEL_FRAME_LTX2_BF16 = 118
_LTX2_LAST_BLOCK_CHANNELS = 256


class LTX2Decoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "ltx2"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "ltx2": LTX2_RELEASED, "ltx2-tiny": LTX2_TINY,
        "ltx2.3": LTX2_3, "ltx2.3-tiny": LTX2_3_TINY,
    }  # fmt: skip
    model_class_name: ClassVar[str] = "AutoencoderKLLTX2Video"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("denormalized", False)
        for name in ("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline", "LTX2HDRPipeline")
    }
    comfyui_latents: ClassVar[str | None] = "normalized"
    comfyui_words: ClassVar[tuple[str, ...]] = ("ltxv", "ltx-2", "ltx2")  # ComfyUI's LTX-2 nodes are LTXV…
    # the sound of LTX-2 and LTX-2.3 (`farm.decoders.ltx2.audio`), tiny with tiny
    sound_configs: ClassVar[dict[str, str]] = {"ltx2": "ltx2-audio", "ltx2-tiny": "ltx2-audio-tiny",
                                               "ltx2.3": "ltx2.3-audio", "ltx2.3-tiny": "ltx2.3-audio-tiny"}
    # Revision 1 of both names was diffusers' constructor defaults: a decoder causal in time, which decodes
    # the released weights to other frames (13 dB from ltx-core's decode of the same latent).
    config_revisions: ClassVar[dict[str, int]] = {"ltx2": 2, "ltx2-tiny": 2}
    config_revision_notes: ClassVar[dict[str, str]] = {
        name: "now the released LTX-2 decoder, not causal in time; revision 1 was diffusers' constructor "
        "defaults, causal, which decode LTX-2's weights to other frames"
        for name in ("ltx2", "ltx2-tiny")
    }
    statistics_tensors: ClassVar[tuple[str, ...]] = ("latents_mean", "latents_std")
    # The released decoders are not causal: each output frame sees latent frames on both sides of it. A
    # temporal tile decodes this many latent frames before and after its own so that the frames it keeps
    # equal the whole-shot decode, whatever the weights: the temporal receptive field counted from the
    # convolutions (kernel 3 in time: conv_in, 2 per resnet and one per upsampler, each at its stage's
    # frame rate) is 21.6 latent frames a side for LTX-2, 6.6 for its tiny config, 13.5 for LTX-2.3 and 7
    # for its tiny one. Measured with random weights (docs/fidelity.md), the error falls below 0.2 levels
    # from 9 / 10 frames (LTX-2, float32 on an H200), to float32's noise floor (5e-4 levels) from 11
    # (LTX-2.3, CPU) and from 6 / 7 and 7 (the tiny configs, CPU).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "ltx2": (22, 22), "ltx2-tiny": (7, 7),
        "ltx2.3": (14, 14), "ltx2.3-tiny": (7, 7),
    }  # fmt: skip
    # A float32 decode on a CPU needs several times the width-scaled GPU figure per pixel-frame (the
    # output and its conversion do not shrink with the width; docs/performance.md#memory).
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {"ltx2-tiny": {"bytes_per_pixel": 45.0}}
    # The least context reaching the dtype's floor (`benchmarks/measure_halo.py context`, RANDOM weights,
    # an H200, 241 frames at 704p split in two): bfloat16 8 frames a side for LTX-2 (51.0 dB over the band,
    # worst pixel 4 levels; 6 gives 48.3 dB), 10 for LTX-2.3 (51.4 dB; 8 gives 49.6 dB).
    measured_context: ClassVar[dict[str, dict[str, tuple[int, int]]]] = {
        "ltx2": {"bfloat16": (8, 8)}, "ltx2.3": {"bfloat16": (10, 10)},
    }  # fmt: skip
    # The least halo reaching the dtype's floor (`benchmarks/measure_halo.py halo`, RANDOM weights, a 2x2
    # grid without overlap against the untiled decode; docs/fidelity.md "Halo"): LTX-2 bfloat16 8 at
    # 1088x1920 (50.7 dB over the band, worst 4 levels), float32 12 at 704x1216 (84.6 dB); LTX-2.3
    # bfloat16 12 at 1088x1920 (52.0 dB; 8 and 10 give 49.1 and 49.4); the tiny configs float32 on a CPU.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "ltx2": {"bfloat16": 8, "float32": 12}, "ltx2.3": {"bfloat16": 12},
        "ltx2-tiny": {"float32": 7}, "ltx2.3-tiny": {"float32": 7},
    }  # fmt: skip
    halo_exact: ClassVar[frozenset[str]] = frozenset({"ltx2", "ltx2.3", "ltx2-tiny", "ltx2.3-tiny"})
    # Seam-band PSNR at spatial overlap 4 (`measure_seams.py`, RANDOM weights, float32 CPU): ltx2 27.3 dB
    # (its shipped overlap: the target's reference), ltx2-tiny 27.6-28.1 dB. Used only with a halo that is
    # not exact (a custom config's): the named configs' halos make blending unnecessary.
    spatial_overlap: ClassVar[dict[str, int]] = {"ltx2": 4, "ltx2-tiny": 4}

    # Numbers the carried state (`ltx2_carry`) holds per latent row x column of a chunk, for a CAUSAL
    # config (`decoder_causal: true`, diffusers' constructor default; no released LTX-2 is): 2 input frames
    # of every causal convolution, at its resolution (counted from the state itself) — at the real widths
    # 0.53 GiB for a 704x1216 tile in bf16, 1.28 GiB at 1088x1920.
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
        # counted for the causal variant of each named config's structure
        name = spec.config_name or next(
            (n for n, c in cls.named_configs.items() if c == {**spec.config, "decoder_causal": False}), ""
        )
        values = cls.carried_state_values.get(name)
        if values is None:
            width = cls._full_config(spec.config)["decoder_block_out_channels"][0] / _LTX2_LAST_BLOCK_CHANNELS
            values = round(cls.carried_state_values["ltx2"] * width)
        return int(values * latent_hw[0] * latent_hw[1] * dtype_bytes(spec.dtype))

    @classmethod
    def weight_bytes(cls, spec: DecoderSpec) -> int:
        name = next((n for n, c in cls.named_configs.items() if c == spec.config), None)
        recorded = recorded_decoder_parameters(cls, name) if name else None
        if recorded is not None:  # counted for each named config (tools/record_decoder_defaults.py)
            return recorded * dtype_bytes(spec.dtype)
        full = cls._full_config(spec.config)
        # decoder parameters scale with the square of the block widths; 528 M for the real config
        widths = full["decoder_block_out_channels"]
        rel = sum(w * w for w in widths) / sum(w * w for w in (256, 512, 1024))
        return int(528e6 * rel * dtype_bytes(spec.dtype))

    # ---- weights ------------------------------------------------------------------------------

    @classmethod
    def file_decoder_config(cls, vae: dict[str, Any], where: str) -> dict[str, Any] | None:
        """An LTX-2 file's own decoder settings, as ltx-core reads its ``config`` metadata."""
        return ltx_metadata.ltx2_decoder_config(vae, where)

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return LTX_ORIGINAL if is_ltx_original(names) else None

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout == LTX_ORIGINAL:
            return ltx_original_name(name, "ltx2", full_config)
        return super().original_name(name, layout, full_config)

    @classmethod
    def convert_names(cls, layout: Layout, tensors: dict[str, Any], missing: Any) -> dict[str, Any]:
        return convert_ltx2_names(tensors) if layout.name == LTX_ORIGINAL else {}

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
        with the state after it (`farm.decoders.ltx2.carry`). Runs eager even with --compile: the
        carried forwards are swapped in per call, which a compiled graph would not see."""
        import torch

        decoder = getattr(self.model.decoder, "_orig_mod", self.model.decoder)  # torch.compile's wrapper
        with self._lock, torch.inference_mode():
            pixels, after = decode_with_state(decoder, self.decoder_input(latent), self._temb(), state)
            return self.unit_pixels(pixels[0]), after
