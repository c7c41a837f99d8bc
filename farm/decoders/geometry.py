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

    `clip`: (latent frames, pixel frames) of the clips a decoder cuts time into itself (MiniMax-H3: 5
    and 17), for a decoder whose frame count is no multiple of a scale: each clip adds its pixel frames,
    and the last, partial clip of ``m`` latent frames gives ``1 + temporal_scale (m - 1)``. None: time
    maps by `temporal_scale` alone. Such a decoder decodes a shot whole in time (`whole_time`: the decoder
    blends its own clips).

    `whole_time` / `whole_space`: a plan never splits the shot along time / rows and columns (no tiles,
    no chunks there): the decoder blends its own pieces there, or nothing was measured of its seams.
    """

    spatial_scale: int
    temporal_scale: int
    causal: bool = True
    context: int = 0
    lookahead: int = 0
    halo: int = 0
    carries: bool = False
    min_block: tuple[int, int, int] = (1, 1, 1)
    clip: tuple[int, int] | None = None
    whole_time: bool = False
    whole_space: bool = False

    def pixel_frames(self, latent_frames: int) -> int:
        if self.clip is not None:
            clips, rest = divmod(latent_frames - 1, self.clip[0])
            return clips * self.clip[1] + 1 + rest * self.temporal_scale
        if self.causal:
            return 1 + (latent_frames - 1) * self.temporal_scale
        return latent_frames * self.temporal_scale

    def latent_frames(self, pixel_frames: int) -> int | None:
        """The latent frames that decode to `pixel_frames`, or None where no latent count does."""
        if self.clip is not None:
            clips, rest = divmod(pixel_frames - 1, self.clip[1])
            steps, off = divmod(rest, self.temporal_scale)
            return None if off or steps >= self.clip[0] else clips * self.clip[0] + 1 + steps
        if self.causal:
            steps, off = divmod(pixel_frames - 1, self.temporal_scale)
        else:
            steps, off = divmod(pixel_frames, self.temporal_scale)
            steps -= 1
        return None if off or pixel_frames < 1 else steps + 1

    def splits(self, axis: int) -> bool:
        """Whether a plan may cut tiles or chunks along `axis` (0 frames, 1 rows, 2 columns)."""
        return not (self.whole_time if axis == 0 else self.whole_space)

    def pixel_shape(self, latent_fhw: Sequence[int]) -> tuple[int, int, int]:
        f, h, w = latent_fhw
        return (self.pixel_frames(f), h * self.spatial_scale, w * self.spatial_scale)

    def without_context(self) -> Geometry:
        return replace(self, context=0, lookahead=0, halo=0)
