"""The tasks of a shot's GroupNorm rounds (HunyuanVideo: `DiffusersVideoDecoder.shares_statistics`).

Every tile of the shot starts from its block of the whole-frame pass (`first_round`), and each round
normalises with the whole shot's statistics and runs to the next GroupNorm (`next_round`). A round's
result stays on the worker that made it (the tile's activation, carried to its next round, which runs
there too); only its sums travel (`round_sums`, run there), to the one task that adds the tiles' sums up
(`shot_statistics`). The last round's result is the tile's pixels, which `decode_tile` takes as
``decoded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from farm.decoders import load_decoder
from farm.decoders.hunyuanvideo.groupnorm_rounds import combine
from farm.worker.device import worker_device
from farm.worker.gpu_budget import load_within_budget
from farm.worker.tasks import on_decode_thread, shared_block

if TYPE_CHECKING:
    import torch

    from farm.planning.tiling import Tile

SUMS = "sums"  # a round's result: the tile's sums for the next round's statistics (None after the last)
CARRIED = "carried"  # … and what the tile carries to it (its pixels after the last)


def first_round(
    spec_json: dict, shared: torch.Tensor, tile: Tile, own: Any, compile: bool | str = False
) -> dict[str, Any]:
    """The tile's block of the whole-frame pass `shared`, ready for the first GroupNorm."""
    decoder = load_within_budget(spec_json, compile=compile)
    carried, sums = on_decode_thread(
        decoder.statistics_start, shared_block(shared, tile), own, tile.decode_origin()
    )
    return {CARRIED: carried, SUMS: sums}


def next_round(
    spec_json: dict, previous: dict[str, Any], stats: torch.Tensor, compile: bool | str = False
) -> dict[str, Any]:
    """The tile's previous round's state normalised with the shot's `stats`, run to the next GroupNorm."""
    decoder = load_decoder(spec_json, worker_device(), compile=compile)
    carried, sums = on_decode_thread(decoder.statistics_round, previous[CARRIED], stats)
    return {CARRIED: carried, SUMS: sums}


def round_sums(result: dict[str, Any]) -> torch.Tensor:
    """A round's sums alone (float64, a few numbers per group): what crosses to the reduction."""
    return result[SUMS]


def tile_pixels(result: dict[str, Any]) -> torch.Tensor:
    """The last round's result: the tile's decoded block of pixels ``[3, F, H, W]``."""
    return result[CARRIED]


def shot_statistics(*sums: torch.Tensor) -> torch.Tensor:
    """The tiles' sums → the whole shot's mean and variance per group."""
    return combine(list(sums))
