"""What a decoder does to shapes: latent units to pixels per axis, causal time, temporal context.

Pure (no torch): the planner (`farm.planning.tiling`) and every decoder adapter share it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Geometry:
    """What a decoder does to shapes: latent units → pixels per axis, and whether time is causal.

    `context` / `lookahead`: latent frames a temporal tile (or chunk) decodes before / after its own
    frames and then discards, so the frames it keeps see the same past and future as in a whole-shot
    decode (the decoder's temporal receptive field; tiles at the shot's start / end need none). The
    adapter records them per config (``temporal_context_for``); 0 decodes each tile on its own.

    `halo`: latent rows and columns a spatial tile (or chunk) decodes beyond each side that has a
    neighbour and then discards, so its own pixels equal a whole-frame decode to the dtype's noise (the
    least measured to do so, per config: ``spatial_halo_for``); tiles at the shot's edges need none there.

    `carries`: the decoder can decode a tile's temporal chunks one after another with its causal state
    carried from each to the next (`ChunkSize.carry`), instead of re-decoding context for each.

    `min_block`: the fewest latent frames, rows and columns one decode call takes (a neighbourhood
    attention's window must fit inside what it decodes); a plan never cuts smaller tiles or chunks.
    """

    spatial_scale: int
    temporal_scale: int
    causal: bool = True
    context: int = 0
    lookahead: int = 0
    halo: int = 0
    carries: bool = False
    min_block: tuple[int, int, int] = (1, 1, 1)

    def pixel_frames(self, latent_frames: int) -> int:
        if self.causal:
            return 1 + (latent_frames - 1) * self.temporal_scale
        return latent_frames * self.temporal_scale

    def pixel_shape(self, latent_fhw: Sequence[int]) -> tuple[int, int, int]:
        f, h, w = latent_fhw
        return (self.pixel_frames(f), h * self.spatial_scale, w * self.spatial_scale)

    def without_context(self) -> Geometry:
        return replace(self, context=0, lookahead=0, halo=0)
