"""Names farm gives things on the Dask scheduler: task-key prefixes and scheduler-metadata paths.

Task keys are tuples whose first element names the kind of task, so the dashboard groups them by it:
``(DECODE_TILE, render, shot, tile)``, ``(BLEND_BATCH, render, shot, batch)``, … Scheduler metadata
(``client.set_metadata``) lives under ``("farm", …)``: renders publish progress under
``RENDERS + (render_id,)``, submitted workflows under ``SUBMISSIONS + (id,)``, and `farm cancel`
records ``CANCELLED + (id,)``.
"""

from __future__ import annotations

PREPARE_OUTPUT = "prepare-output"  # the render's output arrays and identity records, made once
PREPARE_DECODER = "prepare-decoder"  # a decode worker's decoder, loaded while the render still sets up
READ_LATENT = "read-latent"  # a decode worker's first latent, read while the render still sets up
WHOLE_FRAME = "whole-frame"  # the decoder's part that sees the whole frame, once per shot's frames
STATISTICS_ROUND = "statistics-round"  # a tile run to its next GroupNorm with the shot's statistics
ROUND_SUMS = "round-sums"  # a tile's sums at that GroupNorm, all that leaves its worker
SHOT_STATISTICS = "shot-statistics"  # the tiles' sums added into the shot's statistics, once per round
DECODE_TILE = "decode-tile"
TILE_PIECE = "tile-piece"
BLEND_BATCH = "blend-batch"
WRITE_BATCH = "write-batch"
ENCODE_SEGMENT = "encode-segment"
WRITE_SEQUENCE = "write-sequence"
MARK_BATCH = "mark-batch"
FINISH_SHOT = "finish-shot"
DECODE_AUDIO = "decode-audio"  # a shot's sound: audio latents to OUT/audio/<shot>.wav

#: every prefix of a render's task keys, in pipeline order (the farm page's task table)
TASK_PREFIXES = (
    PREPARE_OUTPUT,
    PREPARE_DECODER,
    READ_LATENT,
    WHOLE_FRAME,
    STATISTICS_ROUND,
    ROUND_SUMS,
    SHOT_STATISTICS,
    DECODE_TILE,
    TILE_PIECE,
    BLEND_BATCH,
    WRITE_BATCH,
    ENCODE_SEGMENT,
    WRITE_SEQUENCE,
    MARK_BATCH,
    FINISH_SHOT,
    DECODE_AUDIO,
)

ROOT = ("farm",)
RENDERS = (*ROOT, "renders")
SUBMISSIONS = (*ROOT, "submissions")
CANCELLED = (*ROOT, "cancelled")
THUMBNAILS = (*ROOT, "thumbnails")  # + (render_id, shot): a shot's picture (farm.dashboard.thumbnails)


def metadata_path(*parts: str) -> list[str]:
    """A scheduler-metadata path as `Client.set_metadata` takes it, e.g. ``metadata_path(*RENDERS, id)``."""
    return [str(p) for p in parts]
