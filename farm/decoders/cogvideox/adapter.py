"""CogVideoX VAE decoder (diffusers `AutoencoderKLCogVideoX`): 8x spatial, 4x temporal.

diffusers decodes a clip in batches of latent frames, carrying each causal convolution's last input
frames from one batch to the next (``_decode``, ``num_latent_frames_batch_size = 2``): frames 0-2 first
(an odd batch: its first frame decodes to one pixel frame, as an image), then pairs (each frame to four
pixel frames). ``F`` latent frames (odd, as every pipeline call makes them) give ``1 + 4 (F - 1)`` pixel
frames. The GroupNorms of the spatial norms take their statistics over one batch, so a frame depends on
the other frame of its pair (one frame ahead, at most two in the first batch) and, through the carried
convolution inputs, on a bounded number of frames before it.

farm decodes a tile in the same batches as a whole-shot decode, placed by the tile's first latent frame
in the shot (``origin``): pairs start at odd frames from 3 on. A tile starting inside a pair decodes that
frame alone (as an image, one pixel frame; it is context); one starting on a pair decodes the pair and
keeps the last of its first frame's pixel frames; a pair cut by the tile's end decodes its first frame
twice and keeps that frame's four (lookahead, discarded). Context before a tile covers the carried
convolutions' reach and two frames of lookahead complete the pair or first batch of its last frame, so
a temporal split equals the whole decode. Spatially the batch statistics span the whole frame: a halo
brings a tile close to the whole decode, never to it, and the blend stays.

``"latents": "normalized"``: the pipelines' ``decode_latents`` divide by ``scaling_factor`` (0.7 for
CogVideoX-5b and 1.5, 1.15258426 for 2b). Their ``output_type="latent"`` latents are ``[B, F, C, H, W]``,
frames before channels; CogVideoX1.5's pipelines pad the latent frames to a multiple of the transformer's
``patch_size_t`` at the start and drop that padding only on the way to ``vae.decode``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.decoders.cogvideox.configs import COGVIDEOX_5B, COGVIDEOX_15, COGVIDEOX_TINY
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.errors import FarmError

if TYPE_CHECKING:
    import torch

PAIR = 2  # diffusers' num_latent_frames_batch_size
FIRST_BATCH = 3  # frames 0-2 of an odd clip: the first frame and a pair


def frame_batches(start: int, frames: int) -> list[tuple[int, int]]:
    """The batches (local ``[a, b)``) of a block of `frames` latent frames starting at shot frame `start`,
    cut where a whole-shot decode cuts: after frame 2, then every two frames."""
    edges = [e - start for e in range(FIRST_BATCH, start + frames, PAIR) if e > start]
    bounds = [0, *edges, frames]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class CogVideoXDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "cogvideox"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "cogvideox": {},
        "cogvideox-5b": COGVIDEOX_5B,
        "cogvideox1.5": COGVIDEOX_15,
        "cogvideox-tiny": COGVIDEOX_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLCogVideoX"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False)
        for name in ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "CogVideoXVideoToVideoPipeline",
                     "CogVideoXFunControlPipeline")
    }  # fmt: skip
    pipeline_layout: ClassVar[str] = "[B, F, C, H, W]"
    comfyui_words: ClassVar[tuple[str, ...]] = ("cogvideo",)
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")
    # Context: the carried convolution inputs reach back a bounded number of frames. cogvideox-tiny's
    # 2-tile split of 64 latent frames equals the whole decode bit for bit from 20 frames of context and
    # reaches the float32 floor from 14 (`benchmarks/measure_halo.py context`, RANDOM weights, a CPU;
    # 12: 65.6 dB over the seam band). The released decoder's convolutions, counted at their temporal
    # resolutions, reach 42.5 latent frames back (the same count gives 26.5 for the tiny one), which float32
    # keeps; in bf16 8 frames reach the floor (53.7 dB over the seam band, worst 7 levels; 2 tiles of a 96x4x4
    # latent, RANDOM weights, an H100). Two frames of lookahead complete the batch of a tile's last frame
    # (exact by construction).
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {
        "cogvideox": (43, 2),
        "cogvideox-5b": (43, 2),
        "cogvideox1.5": (43, 2),
        "cogvideox-tiny": (20, 2),
    }
    measured_context: ClassVar[dict[str, dict[str, tuple[int, int]]]] = {
        "cogvideox": {"bfloat16": (8, 2)}, "cogvideox-tiny": {"float32": (14, 2)},
    }  # fmt: skip

    # Halo (`benchmarks/measure_halo.py halo`, RANDOM weights): cogvideox-tiny float32 on a CPU, a 2x2 split
    # of 3x24x24 latents, 36.6 dB over the seam band at 2, 38.8 at 4, 40.1 at 6, 41.6 at 8, 45.4 at 10 (no
    # plateau: each tile's GroupNorm statistics approach the frame's only as it approaches the frame).
    # cogvideox bfloat16 on an H200 (2x2 of 13x60x90): 51.4 / 52.0 / 52.4 / 53.1 dB at 4 / 8 / 12 / 16, worst
    # 26 / 17 / 21 / 22 levels, so no halo reaches bf16's floor; 8 has the least worst pixel (-5b and 1.5,
    # not measured, take it too). The statistics see the whole frame, so CogVideoX keeps blending beside it.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "cogvideox": {"bfloat16": 8}, "cogvideox-5b": {"bfloat16": 8}, "cogvideox1.5": {"bfloat16": 8},
        "cogvideox-tiny": {"float32": 8},
    }  # fmt: skip

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n_up = len(full["block_out_channels"]) - 1  # every up block but the last upsamples 2x in space
        time_up = min(int(np.log2(full["temporal_compression_ratio"])), n_up)  # the first ones in time too
        geometry = Geometry(spatial_scale=2**n_up, temporal_scale=2**time_up, causal=True)
        return cls._with_context(geometry, config)

    # Peak memory: one batch's activations at a time (at most 9 pixel frames, the first batch's), plus the
    # output it concatenates. Per pixel-frame of a batch, bf16 on a GPU: HunyuanVideo's measured figure,
    # whose full-resolution blocks are as wide (128 channels); not measured for CogVideoX itself.
    bytes_per_pixel_frame: ClassVar[float] = 3420.0
    memory_fit_terms: ClassVar[tuple[str, ...]] = ("const_bytes", "bytes_per_pixel", "bytes_per_frame_pixel")

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        """A batch's activations per pixel of a frame (whatever the clip's length), and the decoded
        pieces and their concatenation per output pixel-frame (3 channels, twice, then float32)."""
        batch = cls.bytes_per_pixel_frame * cls._width_ratio(spec.config) * dtype_bytes(spec.dtype) / 2
        batch_frames = 1 + PAIR * cls.geometry_for(spec.config).temporal_scale
        output = 6.0 * dtype_bytes(spec.dtype) + 12
        terms = {"weight_bytes": cls.weight_bytes(spec), "bytes_per_pixel": output,
                 "bytes_per_frame_pixel": batch_frames * batch}  # fmt: skip
        return cls._measured_terms(spec, terms)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["block_out_channels"][0] / 128

    @classmethod
    def _fix_compression_ratios(cls, model: Any, spec: DecoderSpec) -> None:
        """Nothing to fix: diffusers' class keeps no ratios of its own (its config's are right)."""

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> CogVideoXDecoder:
        decoder = super().from_model(spec, model, device)
        decoder.model.use_tiling = False  # farm tiles itself
        if decoder.model.num_latent_frames_batch_size != PAIR:
            raise FarmError(f"the cogvideox decoder decodes pairs of latent frames as diffusers does; this "
                            f"model batches {decoder.model.num_latent_frames_batch_size}")  # fmt: skip
        assert isinstance(decoder, CogVideoXDecoder)
        return decoder

    @classmethod
    def from_pipeline_output(cls, pipeline: Any, data: np.ndarray, num_frames: int | None) -> np.ndarray:
        """``[B, F, C, H, W]`` → ``[B, C, F, H, W]``, without the frames CogVideoX1.5's pipelines pad the
        start with (``additional_frames``: they pad to a multiple of the transformer's ``patch_size_t``
        and drop the padding before ``vae.decode``)."""
        data = np.ascontiguousarray(data.transpose(0, 2, 1, 3, 4))
        transformer = getattr(pipeline, "transformer", None)
        patch_t = getattr(getattr(transformer, "config", None), "patch_size_t", None)
        if not patch_t or patch_t == 1:
            return data
        frames = data.shape[2]
        if num_frames is None:
            if frames % patch_t == 0:
                raise FarmError(
                    f"{type(pipeline).__name__} pads its latent frames to a multiple of {patch_t} at the "
                    "start and drops the padding before decoding: pass num_frames as given to the pipeline, "
                    "so farm drops it too"
                )
            return data
        wanted = (num_frames - 1) // int(getattr(pipeline, "vae_scale_factor_temporal", 4)) + 1
        padding = frames - wanted
        if not 0 <= padding < patch_t:
            raise FarmError(
                f"{type(pipeline).__name__} latents hold {frames} latent frames, not the {wanted} (plus "
                f"padding to a multiple of {patch_t}) of num_frames {num_frames}"
            )
        return data[:, :, padding:]

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """The CogVideoX pipelines' ``decode_latents``: ``z / scaling_factor``."""
        return z / self.model.config.scaling_factor

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """diffusers' frame-batched ``_decode`` with the batches a whole-shot decode cuts (see above)."""
        import torch

        t = self.geometry.temporal_scale
        start = origin[0] if origin else 0
        batches = frame_batches(start, z.shape[2])
        model, cache, pieces = self.model, None, []
        for i, (a, b) in enumerate(batches):
            part = z[:, :, a:b]
            lone_tail = i > 0 and b - a == 1  # a pair cut by the block's end
            if lone_tail:
                part = torch.cat([part, part], dim=2)
            if model.post_quant_conv is not None:
                part = model.post_quant_conv(part)
            pixels, cache = model.decoder(part, conv_cache=cache)
            if lone_tail:
                pixels = pixels[:, :, :t]
            elif i == 0 and (b - a) % 2 == 0:  # a pair first: its first frame keeps its last pixel frame
                pixels = pixels[:, :, t - 1 :]
            pieces.append(pixels)
        return torch.cat(pieces, dim=2)
