"""LTX-2.5's diffusion video decoder (diffusers `LTX2VideoDiffusionDecoderModel`) for LTX-2's latents.

A small diffusion model: four deterministic stages of neighbourhood attention upsample the latent into a
context volume; stage 5 denoises patchified pixels from noise, conditioned on that context, in
``decode_steps`` steps (the config's ``decoder_num_inference_steps``, 1 as LTX-2.5 ships, unless the spec
says otherwise). Its neighbourhood attention is local, so a tile needs a halo and no blend; but its windows
reach 31 latent units across a tile's cut, and in bf16 a last bit's difference there does not fade. So
the stages that see the latent's frames (1 and 2) run once over the shot's whole frame (`whole_frame`),
and each spatial tile decodes the rest (10 units of reach) from its block of their output with its halo,
which it discards, told its place in the shot for its noise, rotary positions and attention lattice.

Noise: diffusers draws the stage-5 noise from a generator, per tile in its own tiling. Here every pixel's
noise is a hash of ``decode_noise_seed`` (spec field, default 0) and its position in the shot (colour
channel, pixel frame, row, column; `farm.decoders.noise`), so tiles decoded on different workers see the
same noise where they overlap, and a render gives the same bytes whatever the grid's assignment and the
worker count. A tile starting at latent frame ``a`` (row ``r``, column ``c``) decodes to pixel frames
``8a + j``, rows ``32r + y`` and columns ``32c + x`` of the shot (the causal mapping: its first latent
frame gives one frame).

Attention: diffusers' FlexAttention path without ``torch.compile`` materialises every score (it runs out
of memory on an H200 at 704x1216), and a compiled block mask over a shot's millions of stage-5 tokens
takes longer to build than the decode. farm runs the same neighbourhood attention (the window shifted
inward at the borders, as NATTEN and the flex mask define it) as one fused Triton kernel on CUDA devices
(`device.na_triton` in this folder), elsewhere as blocks of queries against their keys' halo through
fused SDPA kernels (`neighborhood_attention`), and decodes each stage in runs of frames
(`device.ltx2_diffusion_chunked`), so a decode holds a stage's residual stream and context and one run's
temporaries. The model's own processors are the SDPA blocks too, for callers of its forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.checkpoints import Derived, Layout, TensorInfo
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.ltx2.layout import LTX_ORIGINAL
from farm.decoders.ltx2_diffusion.configs import LTX2_DIFFUSION_TINY
from farm.decoders.ltx2_diffusion.layout import (
    is_lightricks_diffusion,
    ltx_diffusion_metadata_mismatches,
    ltx_diffusion_original_name,
    ltx_diffusion_tensors,
)
from farm.decoders.ltx2_diffusion.neighborhood_attention import use_blocked_attention
from farm.decoders.noise import hash_seed, position_noise
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

_NEEDS_ORIGIN = "the ltx2-diffusion decoder draws its noise per pixel position: decode needs the tile origin"
# Noise values drawn at once (float64, with int64 hash temporaries of the same count).
NOISE_ELEMENTS = 1 << 25


class LTX2DiffusionDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "ltx2-diffusion"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "ltx2-diffusion": {},
        "ltx2-diffusion-tiny": LTX2_DIFFUSION_TINY,
    }
    model_class_name: ClassVar[str] = "LTX2VideoDiffusionDecoderModel"
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.",)
    unused_modules: ClassVar[tuple[str, ...]] = ()
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {
        "decode_steps": ((int,), "a whole number of denoising steps, 1 or more"),
        "decode_noise_seed": ((int,), "a whole number"),
    }
    # Neighbourhood attention looks both ways in time: latent frames before and after a temporal tile that
    # it decodes and discards (`benchmarks/measure_seams.py`-style measurement on the tiny config, random
    # weights, float32 CPU: every kept frame within half a level of the whole decode; see docs).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "ltx2-diffusion": (2, 2),
        "ltx2-diffusion-tiny": (2, 2),
    }
    spatial_overlap: ClassVar[dict[str, int]] = {"ltx2-diffusion": 2, "ltx2-diffusion-tiny": 2}
    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights, noise drawn per latent position so every
    # tile sees the same): ltx2-diffusion bfloat16 at 704x1216 on an H200, 2 / 4 / 6 / 8 / 10 give 30.2 /
    # 39.5 / 46.4 / 48.4 / 48.5 dB over the band (worst 58 / 24 / 8 / 6 / 6 levels): from 8 it stays where
    # bfloat16's own noise keeps LTX-Video (48.4 dB from float32); ltx2-diffusion-tiny float32 on a CPU is
    # exact from 2 (72.8 dB). Its neighbourhood attention is local.
    # In float32 (TF32 off, 33x704x1216, 1x2x2, an H100) the released config's tiles are 57.5 dB from the
    # whole decode over the seam band at 8 and 77.0 at 12, the float32 floor. Alone, no bf16 halo short of
    # the windows' reach (31) passes 49.4 dB at 1080p; decoding from the first two stages run over the whole
    # frame, halos 8 and 10 reach 53.8 dB over the band (worst 3 levels; 33x1088x1920, an H100), and bf16
    # records 10, the rest's counted reach: through `farm render --gpu-memory 24GiB` 59.5 dB over the band
    # on the float16 frames (docs/fidelity.md).
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "ltx2-diffusion": {"bfloat16": 10, "float32": 12}, "ltx2-diffusion-tiny": {"float32": 2},
    }  # fmt: skip
    halo_exact: ClassVar[frozenset[str]] = frozenset({"ltx2-diffusion", "ltx2-diffusion-tiny"})
    # Peak above the weights per output pixel-frame at 2-byte dtypes (the tiny config's estimate), and one
    # whole-shot decode, measured on an H200 (docs/performance.md).
    bytes_per_pixel_frame: ClassVar[float] = 360.0
    # The real config's peak, decoding in runs of frames (`ltx2_diffusion_chunked`): a fixed part (a run's
    # temporaries), bytes per output pixel-frame (the residual stream and the context, whole) and per pixel
    # of one frame (a run's key frames reach a window beyond it), fitted to bf16 decodes on an H200
    # (`benchmarks/bench_ltx2_diffusion_reference.py --steps sizes`; 57-121 frames, 352x608 to 2176x1920:
    # within 13 %) and recorded as float32 terms, as every adapter's are.
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {
        "ltx2-diffusion": {"const_bytes": 8742847584.0, "bytes_per_pixel": 144.28,
                           "bytes_per_frame_pixel": 7459.8},  # fmt: skip
    }
    # the fit's worst error above (13 %), and what torch's caching allocator holds reserved but unallocated
    # beside it under a budget's cap (12 %): with the 13 % alone, a 1x1x4 plan of a 121x1088x1920 shot under
    # `--gpu-memory 24GiB` (tiles of 121x1088x992 with their halo, allocated peak 19.3 GiB, as fitted) ran
    # out on an H100 with 21.0 GiB allocated and 2.4 GiB reserved unallocated; uncapped, the reserved peak
    # of these decodes is 1.42-1.59x the allocated one
    memory_fit_error: ClassVar[dict[str, float]] = {"ltx2-diffusion": 0.27}
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]] = {
        "ltx2-diffusion": ("h200", (121, 704, 1216), 3.77),
    }

    # ---- shapes --------------------------------------------------------------------------------

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        strides = full["decoder_upsample_strides"]
        spatial = full["patch_size"] * math.prod(s[1] for s in strides)
        temporal = math.prod(s[0] for s in strides)
        geometry = Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=True, carries=False,
                            min_block=min_latent_block(full))  # fmt: skip
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["decoder_stage_channels"][-1] / 256

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None:
        return LTX_ORIGINAL if is_lightricks_diffusion(names) else None  # Lightricks' names (ltx-core)

    @classmethod
    def original_name(cls, name: str, layout: str, full_config: dict[str, Any]) -> str:
        if layout == LTX_ORIGINAL:
            return ltx_diffusion_original_name(name)
        return super().original_name(name, layout, full_config)

    @classmethod
    def file_tensors(
        cls, infos: dict[str, TensorInfo], layout: Layout, files: list[Path], full_config: dict[str, Any],
        where: str,
    ) -> tuple[dict[str, TensorInfo], dict[str, Derived]]:
        """Lightricks' layout: fused projections split, gates folded, the timestep MLP renamed
        (`ltx_diffusion_tensors`), once the files' own config metadata agrees with the spec's."""
        if layout.name != LTX_ORIGINAL:
            return infos, {}
        mismatches = ltx_diffusion_metadata_mismatches(files, full_config)
        if mismatches:
            raise FarmError(
                f"weights at {where} were saved for another diffusion decoder config: "
                f"{'; '.join(mismatches)}. "
                "Use the config the checkpoint names (its safetensors metadata 'config' → 'vae' → 'decoder')"
            )
        return ltx_diffusion_tensors(infos, layout.prefix)

    def decode_steps(self) -> int:
        steps = self.spec.extra.get("decode_steps") or self.model.config.decoder_num_inference_steps
        return int(steps)

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        super().check_spec(spec)
        steps = spec.extra.get("decode_steps")
        if steps is not None and steps < 1:
            raise FarmError(f"decoder spec: 'decode_steps' must be 1 or more, got {steps!r}")

    # ---- decoding ------------------------------------------------------------------------------

    @classmethod
    def load(cls, spec: DecoderSpec, device: str) -> DiffusersVideoDecoder:
        decoder = super().load(spec, device)
        use_blocked_attention(decoder.model)
        return decoder

    def enable_compile(self, mode: str | None = None) -> None:
        """Left uncompiled: its attention already runs fused SDPA kernels, and compiling the whole decoder
        takes minutes (docs/performance.md)."""

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        return self.denormalize_with_buffers(z)

    def noise(
        self, pixel_shape: tuple[int, int, int, int, int], origin: tuple[int, int, int]
    ) -> torch.Tensor:
        """Stage 5's starting noise for a tile at latent `origin`: a function of each pixel's place."""
        import torch

        _, channels, frames, height, width = pixel_shape
        g = self.geometry
        f0, y0, x0 = origin[0] * g.temporal_scale, origin[1] * g.spatial_scale, origin[2] * g.spatial_scale
        seed = hash_seed(int(self.spec.extra.get("decode_noise_seed", 0)), 0x7D1FF)
        out = torch.empty((1, channels, frames, height, width), dtype=self.torch_dtype, device=self.device)
        # a few frames at a time: the hash's int64 and float64 temporaries of a 4K shot's every pixel would
        # take several times its decode's memory
        step = max(1, NOISE_ELEMENTS // (channels * height * width))
        rows, columns = torch.arange(y0, y0 + height), torch.arange(x0, x0 + width)
        for a in range(0, frames, step):
            b = min(frames, a + step)
            coords = [torch.arange(channels), torch.arange(f0 + a, f0 + b), rows, columns]
            out[0, :, a:b] = position_noise(seed, coords, self.device)
        return out

    # ---- the stages that see the whole frame ---------------------------------------------------------
    # Every stage's windows reach across a tile's cut, 31 latent units in all for the released config
    # (`spatial_reach`); a bf16 tile keeps the untiled decode's bits only where no difference from its cut
    # reaches it, and a last bit's difference does not fade in bf16 as it does in float32. The stages before
    # the first temporal upsampler (`whole_frame_stages`: 1 and 2 as released, 21 of the 31 units) run at the
    # latent's frames and at most twice its rows and columns, so they run once over the whole frame; each
    # tile decodes the rest (10 units) from its block of their output.

    @classmethod
    def shares_whole_frame(cls, config: dict[str, Any]) -> bool:
        return True

    @classmethod
    def whole_frame_in_one_call(cls, config: dict[str, Any]) -> bool:
        """The pass's output holds the frames diffusers pads a clip's end with, which a temporal chunk of a
        tile would not take: a tile decodes from it in one call."""
        return True

    def whole_frame_part(self, z: torch.Tensor) -> torch.Tensor:
        from farm.decoders.ltx2_diffusion.device import ltx2_diffusion_chunked as chunked

        stages, sh, sw = whole_frame_split(self._full_config(self.spec.config))
        return chunked.to_latent_grid(chunked.early_stages(self.model.decoder, z, stages), sh, sw)

    def rest_of_decoder(self, shared: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        from farm.decoders.ltx2_diffusion.device import ltx2_diffusion_chunked as chunked

        if origin is None:
            raise FarmError(_NEEDS_ORIGIN)
        stages, sh, sw = whole_frame_split(self._full_config(self.spec.config))
        decoder = self.model.decoder
        x = chunked.from_latent_grid(shared, sh, sw)
        context = chunked.late_stages(decoder, x, stages, shared.shape[3:], chunked.CHUNK_TOKENS, origin[1:])
        return denoise_context(decoder, context, self.noise, origin, self.decode_steps(), shared.shape[3:])

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        if origin is None:
            raise FarmError(_NEEDS_ORIGIN)
        try:
            return decode_with_noise(self.model, z, self.noise, origin, self.decode_steps())
        except ValueError as exc:  # diffusers refuses grids smaller than a neighbourhood window
            if "at least its kernel size" not in str(exc):
                raise
            raise FarmError(
                f"a tile of {list(z.shape[2:])} latent frames, rows and columns is too small for the "
                f"{self.spec.config_name or 'custom'} diffusion decoder's neighbourhood attention ({exc}); "
                "use fewer tiles or more overlap (the real config needs 7 latent rows and columns a tile)"
            ) from None


def min_latent_block(full: dict[str, Any]) -> tuple[int, int, int]:
    """The fewest latent frames, rows and columns the decoder takes: every stage's grid must hold its
    neighbourhood window (diffusers refuses a smaller one). Stages 1-4 see the latent, trailing frames
    padded, upsampled by the strides before them; stage 5 sees patchified pixels."""
    kernels = [*full["decoder_stage_kernels"], full["decoder_stage5_kernel"]]
    strides = full["decoder_upsample_strides"]
    pad = (kernels[0][0] // 2) * 2
    patch = full["patch_size"]
    temporal = math.prod(s[0] for s in strides)
    spatial = patch * math.prod(s[1] for s in strides)

    def fits(axis: int, n: int) -> bool:
        size = n + pad if axis == 0 else n
        for stage in range(len(strides)):
            if size < kernels[stage][axis]:
                return False
            size *= strides[stage][axis]
        last = 1 + (n - 1) * temporal if axis == 0 else n * spatial // patch
        return last >= kernels[-1][axis]

    return tuple(next(n for n in range(1, 1024) if fits(axis, n)) for axis in range(3))  # type: ignore[return-value]


def whole_frame_stages(full: dict[str, Any]) -> int:
    """The stages whose blocks see the latent's frames (those before the first upsampler that doubles the
    frames): the part a shot's spatial tiles share, run once over the whole frame."""
    strides = full["decoder_upsample_strides"]
    return next((i + 1 for i, s in enumerate(strides) if s[0] > 1), len(strides))


def whole_frame_split(full: dict[str, Any]) -> tuple[int, int, int]:
    """`whole_frame_stages`, and how many times finer than the latent's their output's rows and columns
    are (the strides of the upsamplers between them)."""
    stages = whole_frame_stages(full)
    between = full["decoder_upsample_strides"][: stages - 1]
    return stages, math.prod(s[1] for s in between), math.prod(s[2] for s in between)


def spatial_reach(full: dict[str, Any], first_stage: int = 0) -> int:
    """Latent rows (or columns) across which a difference at a tile's cut reaches its pixels, counted from
    the layers of stage `first_stage` on: every block's window reaches half its width at its stage's grid,
    which is finer than the latent's by the strides before it (stage 5 by the decoder's pixels per patch)."""
    strides = full["decoder_upsample_strides"]
    depths = full["decoder_stage_depths"]
    kernels = [*full["decoder_stage_kernels"], full["decoder_stage5_kernel"]]
    reach = 0.0
    for stage in range(first_stage, len(kernels)):
        scale = math.prod(s[1] for s in strides[: min(stage, len(strides))])  # stage 5: the context's grid
        reach += depths[stage] * (kernels[stage][1] // 2) / scale
    return math.ceil(reach)


def decode_with_noise(
    model: Any, z: torch.Tensor, noise: Any, origin: tuple[int, int, int], steps: int,
    tokens: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """`LTX2VideoDiffusionDecoder3d.forward`, with `noise(pixel_shape, origin)` for its generator's, run
    in runs of frames of about `tokens` tokens (`device.ltx2_diffusion_chunked`)."""
    from farm.decoders.ltx2_diffusion.device import (
        ltx2_diffusion_chunked as chunked,  # torch and Triton: a decode's alone
    )

    tokens = tokens or chunked.CHUNK_TOKENS
    context = chunked.context(model.decoder, z, tokens, origin[1:])
    return denoise_context(model.decoder, context, noise, origin, steps, z.shape[3:], tokens)


def denoise_context(
    decoder: Any, context: torch.Tensor, noise: Any, origin: tuple[int, int, int], steps: int,
    latent_hw: Sequence[int], tokens: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Stage 5 from its `context` (of a latent block of `latent_hw` rows and columns at `origin`)."""
    from farm.decoders.ltx2_diffusion.device import ltx2_diffusion_chunked as chunked

    tokens = tokens or chunked.CHUNK_TOKENS
    shape = (context.shape[0], decoder.out_channels, context.shape[1], context.shape[2] * decoder.patch_size,
             context.shape[3] * decoder.patch_size)  # fmt: skip
    at = chunked.scaled(origin[1:], context.shape[2] // latent_hw[0], context.shape[3] // latent_hw[1])
    return chunked.denoise(decoder, context, noise(shape, origin), steps, tokens, at)
