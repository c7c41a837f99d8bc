"""HunyuanVideo VAE decoder (diffusers `AutoencoderKLHunyuanVideo`): 8x spatial, 4x temporal.

Causal 3-D convolutions (padding with the first frame, in the past only) and upsamplers that upsample the
first frame in space only: ``F`` latent frames → ``1 + 4 (F - 1)`` pixel frames, and a tile's first
latent frame decodes to one pixel frame, as the tiling's causal shift expects. The decoder is not causal
as a whole, though: its GroupNorms take statistics over the whole tile (all its frames and pixels), so
every output frame depends a little on every latent frame of the tile, later ones included.

farm decodes each tile in one pass. diffusers' ``vae.decode`` instead splits more than 4 latent frames
into its own overlapping temporal tiles (``use_framewise_decoding`` is on by default) and blends them;
farm turns that off (its own temporal tiles and chunks replace it), so a single-tile farm decode equals
``vae.decode`` with ``use_framewise_decoding = False`` (to float rounding: it runs in the arithmetic of
the statistics rounds below, `run_decoder`), and the default for up to 4 latent frames.

Those GroupNorm statistics, and the middle block's attention over every position of a tile (causally
masked in time), make a tile's pixels differ slightly from a whole-shot decode everywhere, not only near
its edges. Where a plan splits height or width only (`farm.planning.tiling.takes_statistics_rounds`),
the tiles decode from the middle block run once over the whole shot (`whole_frame`) and take the whole
shot's statistics at every later GroupNorm, reduced across them round by round (`statistics_start`,
`statistics_round`; `groupnorm_rounds`): each tile then equals the untiled decode as far as its halo
reaches, without a blend. Elsewhere (temporal tiles, chunks) tiles decode whole, with the halo and the
overlap blend (the pass alone, with the up blocks' statistics per tile, loses to the blend).

``"latents": "normalized"``: ``HunyuanVideoPipeline`` divides by ``scaling_factor`` (no mean/std).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.decoders.hunyuanvideo import chunked_attention, chunked_upsample, groupnorm_rounds, whole_frame
from farm.decoders.hunyuanvideo.configs import HUNYUANVIDEO_TINY
from farm.decoders.lattice_conv import install as install_lattice

if TYPE_CHECKING:
    import torch

class HunyuanVideoDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = "hunyuanvideo"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {
        "hunyuanvideo": {},
        "hunyuanvideo-tiny": HUNYUANVIDEO_TINY,
    }
    model_class_name: ClassVar[str] = "AutoencoderKLHunyuanVideo"
    pipeline_conventions: ClassVar[dict[str, tuple[str, bool]]] = {
        name: ("normalized", False)
        for name in ("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline",
                     "HunyuanSkyreelsImageToVideoPipeline", "Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline")
    }  # fmt: skip
    # Kandinsky 5 keeps its latents channels last, and moves the channels first before vae.decode
    pipeline_latent_axes: ClassVar[dict[str, str]] = {
        "Kandinsky5T2VPipeline": "BFHWC", "Kandinsky5I2VPipeline": "BFHWC",
    }  # fmt: skip
    comfyui_latents: ClassVar[str | None] = "denormalized"
    comfyui_words: ClassVar[tuple[str, ...]] = ("hunyuan",)
    # No exact split exists: the GroupNorms' statistics span the whole tile, so every frame of a tile
    # depends on all of its frames. Context frames bring a later tile's statistics (and its causally
    # masked attention) closer to the whole shot's: measured at the tiny config, 8 frames of context make
    # a 2-tile temporal split of a 25-frame latent as close to untiled (23.8 dB, worst frame 18.9 dB) as a
    # 2x2 spatial split at overlap 2 (21.1 / 18.6 dB); lookahead frames barely help.
    temporal_context: ClassVar[dict[str, tuple[int, int]]] = {"hunyuanvideo-tiny": (8, 0)}
    required_weights: ClassVar[tuple[str, ...]] = ("decoder.", "post_quant_conv.")
    unused_modules: ClassVar[tuple[str, ...]] = ("encoder", "quant_conv")
    # bf16 on a GPU: full-resolution 128-channel blocks in float GroupNorm make it ~30 times LTX-Video's
    # figure (a 129x720x1280 shot decoded whole would need ~400 GB: tile it).
    bytes_per_pixel_frame: ClassVar[float] = 3420.0
    # Fitted to measured CPU decodes (`tools/measure_families.py --fit`; the fit and its range:
    # docs/performance.md#memory): a fixed part and bytes per pixel-frame (the convolutions run in blocks
    # on the shot's lattice, each call's input small).
    memory_measured: ClassVar[dict[str, dict[str, Any]]] = {
        "hunyuanvideo-tiny": {"const_bytes": 72932185.1, "bytes_per_pixel": 318.5},
    }  # fmt: skip
    # Seam-band PSNR on the worse axis (`measure_seams.py spatial`, RANDOM weights): hunyuanvideo-tiny 23.4 dB
    # at overlap 4, 23.7 at 5, 24.6 at 6; hunyuanvideo (the real architecture, float32 CPU) 21.8 at 4 and 5,
    # 22.3 at 6. No overlap reaches the target: the GroupNorms' statistics differ over the whole tile
    # (sharing them across tiles would: docs/fidelity.md); each is the least within 1 dB of the best.
    spatial_overlap: ClassVar[dict[str, int]] = {"hunyuanvideo": 4, "hunyuanvideo-tiny": 5}
    # Halo: the top-left quarter of a 61x480x832 shot (bfloat16, RANDOM weights, an H200) decoded with 8
    # latent rows and columns beyond it reaches 40.4 dB, 16 only 41.1; hunyuanvideo-tiny (float32, a CPU,
    # `benchmarks/measure_halo.py`) stops at 32-33 dB from 6: the GroupNorms see the whole shot. With the
    # mid block shared and the shot's statistics reduced in rounds (`benchmarks/measure_groupnorm_rounds.py`,
    # 2x2 of a 3x24x24 latent) hunyuanvideo-tiny reaches 44.9 / 63.1 / 88.5 dB over the band at 4 / 6 / 8
    # (worst 18 / 2 / 1 levels): the float32 floor at 8 (docs/fidelity.md). The released config in float32
    # (TF32 off, 2x2 of a 5x60x104 latent, an H100) with the rounds: 68.3 dB over the seam band at 8, 81.7 at
    # 12, the floor. In bf16, against the untiled decode in the same arithmetic (the rounds over one block,
    # convolutions on the shot's lattice; the same H100): 49.6 dB at 8 (worst 8 levels), 68.6 at 12 (worst
    # 1), the same bits at 16.
    spatial_halo: ClassVar[dict[str, dict[str, int]]] = {
        "hunyuanvideo": {"bfloat16": 12, "float32": 12}, "hunyuanvideo-tiny": {"float32": 8},
    }  # fmt: skip
    # configs whose rounds are measured to reach the floor: no blend where their rounds run (the released
    # config in bf16 at halo 12: 68.6 dB over the seam band, above)
    exact_with_statistics: ClassVar[frozenset[str]] = frozenset({"hunyuanvideo-tiny", "hunyuanvideo"})
    # one decode's seconds per config, what `cost_model` scales by (docs/performance.md#memory)
    decode_seconds_measured: ClassVar[dict[str, tuple[str, tuple[int, int, int], float]]] = {
        "hunyuanvideo-tiny": ("cpu", (17, 128, 192), 2.76),
        "hunyuanvideo": ("h200", (33, 512, 768), 1.3),
    }

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n = len(full["block_out_channels"])
        s = int(math.log2(full["spatial_compression_ratio"]))
        t = int(math.log2(full["temporal_compression_ratio"]))
        # as HunyuanVideoDecoder3D builds its up blocks (it accepts only temporal_compression_ratio 4)
        spatial_up = sum(i < s for i in range(n))
        temporal_up = sum(n - 1 - t <= i < n - 1 for i in range(n))
        geometry = Geometry(spatial_scale=2**spatial_up, temporal_scale=2**temporal_up, causal=True)
        return cls._with_context(geometry, config)

    @classmethod
    def _width_ratio(cls, config: dict[str, Any]) -> float:
        return cls._full_config(config)["block_out_channels"][0] / 128

    @classmethod
    def memory_terms(cls, spec: DecoderSpec) -> dict[str, Any]:
        """Linear activations, or the middle block's attention mask where that is larger.

        diffusers builds a dense causal mask ``[n, n]`` over the tile's ``n`` latent positions (a bool
        comparison, a float32 ``where`` and the cast: about 7 bytes per entry at once), before the
        full-resolution blocks run. It outgrows the activations above ~32 M pixel-frames per call
        (bf16): 33 latent frames of 90x160 (a 129x720x1280 shot, n = 475 200) would need 1.6 TB for it.
        """
        terms = super().memory_terms(spec)
        if cls._full_config(spec.config)["mid_block_add_attention"]:
            g = cls.geometry_for(spec.config)
            terms.update(pair_bytes=7.0, pixels_per_position=float(g.spatial_scale**2 * g.temporal_scale))
        return terms

    @classmethod
    def from_model(cls, spec: DecoderSpec, model: Any, device: str) -> HunyuanVideoDecoder:
        decoder = super().from_model(spec, model, device)
        decoder.model.use_framewise_decoding = False  # farm tiles and chunks in time itself
        decoder.model.use_tiling = False
        chunked_attention.install(decoder.model)  # torch's masked SDPA is wrong past 2^32 scores
        chunked_upsample.install(decoder.model)  # one interpolation past 2^32 elements gave NaN
        install_lattice(decoder.model)  # the rounds' convolutions on the shot's lattice: a tile's bits
        assert isinstance(decoder, HunyuanVideoDecoder)
        return decoder

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """``HunyuanVideoPipeline``: ``z / scaling_factor``."""
        return z / self.model.config.scaling_factor

    @classmethod
    def shares_whole_frame(cls, config: dict[str, Any]) -> bool:
        return True

    @classmethod
    def shares_statistics(cls, config: dict[str, Any]) -> bool:
        return True

    @classmethod
    def statistics_exact(cls, config: dict[str, Any]) -> bool:
        return cls._named(config) in cls.exact_with_statistics

    @classmethod
    def statistics_round_count(cls, config: dict[str, Any]) -> int:
        """``norm1`` and ``norm2`` of every up-block resnet and the output norm (`groupnorm_rounds.sites`)."""
        full = cls._full_config(config)
        return len(full["block_out_channels"]) * (full["layers_per_block"] + 1) * 2 + 1

    def run_decoder(self, z: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        """``vae.decode`` (framewise decoding off) in the arithmetic of tiles that share the shot's
        statistics: the middle block as `whole_frame` runs it, then the rounds over this one block, each
        GroupNorm over all of it (`groupnorm_rounds.decode_alone`), its convolutions on the shot's
        lattice. Equal to ``vae.decode`` to float rounding; the same bits as a tile's, where the tile's
        halo covers the up blocks' reach."""
        rows_cols = _rows_cols(origin)
        shared = whole_frame.whole_frame_part(self.model, z)
        return groupnorm_rounds.decode_alone(self.model, shared, rows_cols)

    @classmethod
    def statistics_carried_bytes(cls, spec: DecoderSpec, pixel_frames: int) -> int:
        """At most the last up block's input (its first resnet's residual) beside that resnet's output, at
        full resolution: 256 + 128 channels in the released config (measured on an H100 in bf16: 1.77 GiB
        carried by a tile of 2.48 M decoded pixel-frames, 767 bytes each)."""
        channels = cls._full_config(spec.config)["block_out_channels"]
        width = channels[1] if len(channels) > 1 else channels[0]
        return (width + channels[0]) * dtype_bytes(spec.dtype) * pixel_frames

    def statistics_start(
        self, shared: torch.Tensor, own: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[Any, torch.Tensor]:
        import torch

        rows_cols = _rows_cols(origin)
        with self._lock, torch.inference_mode():
            z = shared.to(device=self.device, dtype=self.torch_dtype)[None]
            carried = groupnorm_rounds.start(z, own, rows_cols)
            return carried, groupnorm_rounds.partial_sums(self.model, carried)

    def statistics_round(self, carried: Any, stats: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        import torch

        with self._lock, torch.inference_mode():
            moved = groupnorm_rounds.advance(self.model, carried, stats)
            if isinstance(moved, groupnorm_rounds.Carried):
                return moved, groupnorm_rounds.partial_sums(self.model, moved)
            return self.unit_pixels(moved[0]), None

    def whole_frame_part(self, z: torch.Tensor) -> torch.Tensor:
        return whole_frame.whole_frame_part(self.model, z)

    def rest_of_decoder(self, shared: torch.Tensor, origin: tuple[int, int, int] | None) -> torch.Tensor:
        return whole_frame.rest_of_decoder(self.model, shared)


def _rows_cols(origin: tuple[int, int, int] | None) -> tuple[int, int]:
    """A decode's first latent row and column in its shot (None: the shot's start)."""
    return (0, 0) if origin is None else (origin[1], origin[2])
