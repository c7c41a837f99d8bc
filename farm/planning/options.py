"""The user's planning options and the parsers of their command-line forms (pure: no cluster, no torch).

`PlanOptions` is what `farm.run.render.render` and `farm.planning.jobplan.plan_job` take; `parse_tiles`,
`parse_triple` and `parse_frame_numbers` turn ``--tiles``, ``--overlap``/``--chunk`` and ``--frames``
text into values, raising `FarmError` with the valid forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from farm import config
from farm.decoders.base import DEFAULT_SPATIAL_OVERLAP
from farm.errors import FarmError
from farm.planning.tiling import ChunkSize

AUTO = "auto"
# latent units, used where an axis is split and no overlap was given: 1 frame, and height and width the
# decoder's measured spatial overlap (`spatial_overlap_for`; these values for configs not measured)
DEFAULT_OVERLAP = (1, DEFAULT_SPATIAL_OVERLAP, DEFAULT_SPATIAL_OVERLAP)
DEFAULT_BATCH_FRAMES = 32


@dataclass(frozen=True)
class PlanOptions:
    """How shots are tiled.

    ``tiles="auto"`` (the default) lets `farm.planning.planner` choose per shot, for the job's shots and the
    worker count, between whole shots and tile grids, by predicted makespan; with auto, ``overlap``
    (if given) is the overlap it uses where it splits an axis, ``cost_model`` names the stored cost
    model (default: the decoder's, `farm.planning.costmodel.default_name`) and ``worker_memory`` bounds one
    decode call in bytes (default: farm.gpu-memory, else the cost model's worker memory). A render also
    checks every plan against it and holds each GPU worker's allocator to it (``--gpu-memory``).
    Explicit ``tiles`` always win.
    The defaults of ``tiles`` and ``batch_frames`` are dask.config's ``farm.tiles`` and
    ``farm.batch-frames`` (`farm.config`).
    """

    tiles: tuple[int, int, int] | str = field(default_factory=lambda: configured_tiles())
    overlap: tuple[int, int, int] | None = None
    batch_frames: int = field(default_factory=lambda: config.whole_number("batch-frames", 1))
    chunk: ChunkSize = ChunkSize()
    cost_model: str | None = None
    # the GPU memory each decode worker is planned for and held to (``--gpu-memory``, farm.gpu-memory)
    worker_memory: int | None = field(default_factory=lambda: config.byte_size("gpu-memory"))
    # bits per pixel the render's videos are written at (what a render reports, `farm -v render`), for
    # predicted encodes; None: those the cost model was measured on (farm.encoded-bits-per-pixel)
    encoded_bits_per_pixel: float | None = field(default_factory=lambda: configured_bits_per_pixel())


def configured_bits_per_pixel() -> float | None:
    """``farm.encoded-bits-per-pixel``: a positive number, or unset."""
    raw = config.get("encoded-bits-per-pixel")
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise FarmError(
            f"farm.encoded-bits-per-pixel {raw!r} is invalid; give a positive number (what `farm -v render` "
            "reports of a render's videos), or leave it unset"
        )
    return value


def configured_tiles() -> tuple[int, int, int] | str:
    """``farm.tiles`` from dask.config: ``auto``, ``"1,2,2"`` (YAML) or ``(1, 2, 2)`` (a variable)."""
    return parse_tiles(str(config.option("tiles")))


def parse_tiles(text: str) -> tuple[int, int, int] | str:
    """``--tiles``: ``auto`` or three tile counts F,H,W."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return parse_triple(text, "--tiles", minimum=1)
    except FarmError:
        raise FarmError(
            f"--tiles {text!r} is invalid; give auto or three whole numbers ≥ 1 as F,H,W (e.g. 1,2,2)"
        ) from None


def parse_triple(text: str, option: str, *, minimum: int) -> tuple[int, int, int]:
    """Three whole numbers ≥ `minimum` written F,H,W (the value of `option`)."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < minimum:
        raise FarmError(
            f"{option} {text!r} is invalid; give three whole numbers ≥ {minimum} as F,H,W (e.g. 1,2,2)"
        )
    return (values[0], values[1], values[2])


def parse_frame_numbers(text: str) -> list[int]:
    """Render-farm frame lists, as the ``fileseq`` library reads them: ``1-48``, ``1-100x2`` (every 2nd),
    ``1-100:2`` (all of 1-100, staggered: every 2nd first), descending ``10-1``, ``7``, and commas
    between them. Returns the sorted frame numbers (the order a list gives does not matter here)."""
    import fileseq

    hint = (
        "use whole frame numbers and ranges like 1-48, 1-100x2 (every 2nd frame), 1-100:2, 10-1 or 1,5,10-20"
    )
    try:
        numbers = list(fileseq.FrameSet(text.replace(" ", "")))
    except (fileseq.ParseException, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        reason = reason.split(": ", 1)[-1].strip(' "')  # fileseq's "Could not parse "…": why"
        raise FarmError(f"--frames {text!r} is invalid ({reason}); {hint}") from None
    if not numbers:
        raise FarmError(f"--frames {text!r} names no frame; {hint}")
    if any(n != int(n) for n in numbers):
        raise FarmError(f"--frames {text!r} names sub-frames; {hint}")
    return sorted({int(n) for n in numbers})
