"""Functions that run inside Dask workers: decode a tile, blend a batch, finish a shot.

Each reads and writes the disk itself (latents from the job store, frames and segments to the output),
so the client never holds pixels. Tensors stay on the worker's GPU where there is one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.sizeof import sizeof

from farm.decoders.sound import load_sound_decoder, samples_for_frames
from farm.errors import FarmError, FarmRuntimeError
from farm.media import beneath
from farm.media.hdr import scene_linear_half
from farm.media.sequences import write_frames as write_images
from farm.media.settings import VideoSettings
from farm.media.yuv import rgb_to_yuv420
from farm.planning.tiling import Batch, ChunkSize, Geometry, Segment, Tile, plan_chunks, tile_segments
from farm.store.frames import VALID, mark_valid, write_frames
from farm.store.job import read_audio_latent, read_latent
from farm.store.latent_chunks import LatentChunks, check_read
from farm.store.markers import file_record, mark_done
from farm.store.output import Output
from farm.store.output_kinds import batch_record
from farm.store.ownership import check_folders_not_links
from farm.worker.cuda_streams import READY_EVENT, side_stream
from farm.worker.device import worker_device
from farm.worker.gpu_budget import load_within_budget
from farm.worker.ipc import Piece, SharedPiece, open_piece, share

if TYPE_CHECKING:
    import torch

    from farm.decoders.base import VideoDecoder


def _weights(
    tile: Tile, device: torch.device | str, frames: slice = slice(None)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f, h, w = (_ramp(span.weights, str(device)) for span in tile.pixels)
    return f[frames].view(-1, 1, 1), h.view(1, -1, 1), w.view(1, 1, -1)


@functools.lru_cache(maxsize=512)  # shots of one shape share their tiles' ramps
def _ramp(weights: tuple[float, ...], device: str) -> torch.Tensor:
    """A blend ramp on `device`, made once: a tensor made from a list on a GPU is a copy from pageable
    memory, which waits for every kernel queued before it (a decode task would stall its GPU stream)."""
    import torch

    return torch.tensor(weights, dtype=torch.float32, device=device)


def _weigh_in_place(pixels: torch.Tensor, tile: Tile, frames: slice = slice(None)) -> torch.Tensor:
    """Multiply float32 pixels ``[3, F, H, W]`` (a tensor the caller owns) by the tile's blend ramps, in
    place: the same products as ``pixels * wf * wh * ww`` without two tile-sized temporaries. `frames`:
    the tile's frames these pixels are (a temporal segment of it)."""
    import torch

    wf, wh, ww = _weights(tile, pixels.device, frames)
    with torch.inference_mode():  # decoders return inference tensors, which only change in this mode
        pixels.mul_(wf).mul_(wh).mul_(ww)
    return pixels


class FromWholeFrame:
    """A tile's decoder where its shot shares a whole-frame pass (`DiffusersVideoDecoder.whole_frame`):
    `decode_block` and `decode_segment` hand it blocks of that pass's output where they would hand
    latent, and it decodes the rest of the decoder from them."""

    def __init__(self, decoder: VideoDecoder) -> None:
        self.decoder, self.geometry = decoder, decoder.geometry

    def decode(self, block: torch.Tensor, origin: tuple[int, int, int] | None = None) -> torch.Tensor:
        return self.decoder.decode_shared(block, origin)

    def decode_carried(
        self, latent: torch.Tensor, state: Any, origin: tuple[int, int, int] | None = None
    ) -> tuple[torch.Tensor, Any]:
        raise FarmError(f"the {self.decoder.family} decoder cannot carry its causal state between chunks")


def decode_block(
    decoder: VideoDecoder | FromWholeFrame, latent: torch.Tensor, chunk: ChunkSize,
    origin: tuple[int, int, int] = (0, 0, 0),
) -> torch.Tensor:  # fmt: skip
    """Decode a latent block ``[C, f, h, w]``, in chunks no larger than `chunk` when it is set.

    `origin` is the block's first latent frame, row and column in the shot: decoders whose output
    depends on position (position-seeded noise) need it so overlapping tiles agree.
    """
    import torch

    chunks = plan_chunks(latent.shape[1:], decoder.geometry, chunk)
    if len(chunks) == 1:
        return decoder.decode(latent, origin=origin)
    out = None
    for piece in chunks:
        at = tuple(o + s.start for o, s in zip(origin, piece.decode_slices(), strict=True))
        pixels = decoder.decode(latent[(slice(None), *piece.decode_slices())], origin=at)
        pixels = drop_context(pixels, piece, decoder.geometry)
        _weigh_in_place(pixels, piece)
        if out is None:
            shape = decoder.geometry.pixel_shape(latent.shape[1:])
            out = torch.zeros((pixels.shape[0], *shape), dtype=torch.float32, device=pixels.device)
        (f0, f1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in piece.pixels)
        out[:, f0:f1, h0:h1, w0:w1] += pixels
        del pixels
    assert out is not None  # plan_chunks gives at least one chunk
    return out


def drop_context(pixels: torch.Tensor, tile: Tile, geometry: Geometry) -> torch.Tensor:
    """The tile's own pixels of a decoded block ``[3, F, H, W]``: context and lookahead frames and the
    halo's rows and columns dropped.

    A view of `pixels` (callers weigh it in place: the dropped pixels are never read again).
    """
    cuts = tile.discarded_pixels(geometry)
    if not any(any(cut) for cut in cuts):
        return pixels
    (f0, f1), (h0, h1), (w0, w1) = ((a, n - b) for (a, b), n in zip(cuts, pixels.shape[1:], strict=True))
    return pixels[:, f0:f1, h0:h1, w0:w1]


def drop_halo(pixels: torch.Tensor, tile: Tile, geometry: Geometry) -> torch.Tensor:
    """The tile's own rows and columns of a decoded block ``[3, F, H, W]`` whose frames are already its
    own (a temporal segment's): the halo dropped, as a view."""
    _, (h0, h1), (w0, w1) = tile.discarded_pixels(geometry)
    if not (h0 or h1 or w0 or w1):
        return pixels
    return pixels[:, :, h0 : pixels.shape[2] - h1, w0 : pixels.shape[3] - w1]


# One decode at a time per worker process, always on the same thread: the GPU is the shared resource
# while the worker's other threads blend, write and encode earlier batches, and CUDA graphs recorded by
# torch.compile's "reduce-overhead" mode belong to the thread that recorded them.
_decode_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-decode")


def on_decode_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` on this process' decode thread and wait for it (exceptions propagate)."""
    if threading.current_thread().name.startswith("farm-decode"):
        return fn(*args)
    return _decode_thread.submit(fn, *args).result()


_visible: set[str] = set()  # paths this worker process has seen once


def where_am_i(worker: Any = None) -> str:
    """``worker NAME (ADDRESS) on HOST`` (this task's worker, or `worker`), else ``process PID on HOST``."""
    if worker is None:
        try:
            from distributed import get_worker

            worker = get_worker()
        except ValueError:  # not inside a task
            worker = None
    who = f"worker {worker.name} ({worker.address})" if worker is not None else f"process {os.getpid()}"
    return f"{who} on {socket.gethostname()}"


def path_problem(path: str, what: str) -> str | None:
    """Why this process cannot use the `what` at `path` (None when it can)."""
    if not os.path.isdir(path):
        return f"cannot see the {what} {path!r} (no such folder on that host)"
    if not os.access(path, os.R_OK | os.X_OK | (os.W_OK if what == "output folder" else 0)):
        return f"cannot {'write' if what == 'output folder' else 'read'} the {what} {path!r}"
    return None


def check_visible(path: str, what: str) -> None:
    """Once per worker process and path: a worker that cannot see the job store or OUT fails with a
    message naming it and its host (not a corrupt-data error from deep inside a read)."""
    if path in _visible:
        return
    problem = path_problem(path, what)
    if problem:
        raise FarmError(
            f"{where_am_i()} {problem}: every worker must see the job stores and outputs at the paths the "
            "render was given (a shared file system mounted at the same place)"
        )
    _visible.add(path)


def check_owner(out: Output, shot: str) -> None:
    """Write into OUT only for the render that owns the shot now: a task still running after its render
    was killed or cancelled (Dask cannot stop a running task) must not mark or overwrite the batches of
    the render that took the shot over since (`farm.run.resume.record_identity`)."""
    try:
        from distributed import get_worker

        key = get_worker().get_current_task()
    except ValueError:  # not in a task: nothing to compare
        return
    if not (isinstance(key, tuple) and len(key) > 1):
        return
    import zarr

    owner = zarr.open_group(store=str(out.shot_group(shot)), mode="r").attrs.get("owner")
    if owner is not None and owner != key[1]:
        raise FarmError(f"shot {shot!r}: render {key[1]} was superseded in this output by render {owner}; "
                        "nothing written")  # fmt: skip


def prepare_decoder(spec_json: dict, compile: bool | str = False) -> dict[str, float]:
    """Load this worker's decoder for `spec_json` (kept for every later decode of it in this process)
    while the render still sets up. Returns the seconds the worker spent getting there: its warm-up's
    imports, CUDA context and decoder preloaded from the render's hint (`farm.worker.warmup`, where it
    ran), the decoder's imports and build (its steps: the model, the weights read), and this task's own
    wait (a warm-up still at work, or a decoder already loaded: near zero)."""
    from farm.worker import warmup  # torch: the driver imports this module for its task functions

    started = time.perf_counter()
    from farm.decoders import decoder_timings, spec_from_json  # timed: the decoder's imports
    from farm.decoders.diffusers_vae import build_steps

    imported = time.perf_counter()
    warmup.wait_for_warm_up()  # the decoder it builds from the render's hint, if any, is this one
    device = worker_device()
    load_within_budget(spec_json, compile=compile)
    loaded = time.perf_counter()
    build = decoder_timings()["load_s"].get(f"{spec_from_json(spec_json).describe()} on {device}")
    return {
        **warmup.warmup_timings(),
        "import farm.decoders": imported - started,
        "decoder ready": loaded - started,
        **({"decoder build": build} if build is not None else {}),
        **build_steps(),
    }


def decode_tile(
    job_path: str,
    spec_json: dict,
    tile: Tile,
    chunk: ChunkSize,
    cuts: list[tuple[int, slice]],
    compile: bool | str = False,
    segment: int = -1,
    previous: dict | None = None,
    first_latent: tuple | None = None,
    chunks: LatentChunks | None = None,
    shared: torch.Tensor | None = None,
    decoded: torch.Tensor | None = None,
) -> dict[Any, Any]:
    """Decode one tile, weight it by its blend ramps, cut it into per-batch pieces ``{batch: [3,f,h,w]}``.

    A tile split into temporal chunks decodes segment by segment (`farm.planning.tiling.tile_segments`), each
    weighted by the tile's ramps, then summed in order; ``segment >= 0`` decodes only that one (a
    streamed tile: one task per segment), its `cuts` relative to the segment's first frame. Both give
    the same pieces for the same frames (`blend_batch` sums a tile's segments first).

    With carried chunks (`ChunkSize.carry`) a streamed segment starts from the decoder state in
    `previous`, the previous segment's result (its key ``CARRIED``; None for the first segment), and
    returns its own there unless it is the tile's last, with the next segment's latent read ahead
    (``NEXT_LATENT``), which the next segment then decodes instead of reading it itself.

    `first_latent`: `read_latent_ahead`'s result for this decode (a worker's first, read while the
    render set up), used when it holds the latent this decode reads.

    `chunks`: the digests the render recorded of the latent chunks this tile reads; every chunk read is
    checked against them (`farm.store.latent_chunks`), the one read ahead included.

    `shared`: the shot's whole-frame pass over the frames this tile decodes (`whole_frame_pass`), which
    the tile decodes from in place of its latent.

    `decoded`: the tile's block already decoded (pixels ``[3, F, H, W]``, context and halo included), by
    its shot's GroupNorm rounds (`farm.worker.statistics_rounds`); the tile only cuts it."""
    check_visible(job_path, "job store")
    loaded = load_within_budget(spec_json, compile=compile)  # a worker that joined late is held too
    decoder: VideoDecoder | FromWholeFrame = loaded
    if shared is not None:
        decoder = FromWholeFrame(loaded)
    expected = tuple(span.size for span in tile.pixels)
    origin = tile.decode_origin()
    # temporal chunks (segments) never meet temporal context: the chunking guard keeps a tile split
    # across workers along frames from also being chunked along frames inside one
    segments = tile_segments(tile, decoder.geometry, chunk) if chunk.frames else []
    if segment >= 0:  # read only the latent frames this segment decodes
        first, stop = segment_latent_frames(segments[segment])
        latent = read_ahead_latent(previous, (first, stop))
        if shared is not None:
            latent = shared_block(shared, tile, slice(first, stop))
        if latent is None:
            latent = _latent_from(first_latent, (first, stop), chunks, job_path)
        if latent is None:
            latent = read_tile_latent(job_path, tile, slice(first, stop), chunks)
        state, ahead = None, None
        if chunk.carry:
            assert (previous is None) == (segment == 0), (
                "a carried segment after the first needs the one before"
            )
            state = {} if previous is None else previous[CARRIED]
            if segment + 1 < len(segments) and shared is None:
                following = segment_latent_frames(segments[segment + 1])
                ahead = _start_read_ahead(job_path, tile, following, chunks)
        args = (decoder, latent, tile, segments, segment, origin, cuts, state, first)
        pieces = on_decode_thread(ready_marked, _decode_segments, *args)
        return _with_read_ahead(pieces, ahead)
    if decoded is not None:
        latent = None
    elif shared is not None:
        latent = shared_block(shared, tile)
    else:
        latent = _latent_from(first_latent, None, chunks, job_path)
    if latent is None and decoded is None:
        latent = read_tile_latent(job_path, tile, None, chunks)
    if len(segments) > 1:
        assert latent is not None
        state = {} if chunk.carry else None
        return on_decode_thread(ready_marked, _decode_segments, decoder, latent, tile, segments, -1, origin,
                                cuts, state)  # fmt: skip

    def decode() -> dict[int, Any]:
        if latent is None:
            assert decoded is not None
            pixels = decoded.clone()  # weighed in place below: the rounds' result stays as Dask holds it
        else:
            pixels = decode_block(decoder, latent, chunk, origin=origin)
        pixels = drop_context(pixels, tile, decoder.geometry)
        if tuple(pixels.shape[1:]) != expected:
            raise FarmError(
                f"shot {tile.shot!r}, tile {tile.index}: decoder produced {tuple(pixels.shape[1:])} pixels, "
                f"the plan expected {expected}; the decoder's scale factors do not match its geometry"
            )
        pixels = _weigh_in_place(pixels.float(), tile)
        return {batch: pixels[:, frames].contiguous() for batch, frames in cuts}

    return on_decode_thread(ready_marked, decode)


def segment_latent_frames(segment: Segment) -> tuple[int, int]:
    """The tile-local latent frames ``[first, stop)`` a temporal segment's decode reads."""
    frames = [p.decode_slices()[0] for p in segment.pieces]
    return min(f.start for f in frames), max(f.stop for f in frames)


def shared_block(shared: torch.Tensor, tile: Tile, frames: slice | None = None) -> torch.Tensor:
    """The tile's block (halo included) of its whole-frame pass's output, which covers the frames the tile
    decodes over the whole frame; only its tile-local latent `frames` where given."""
    _, rows, cols = tile.decode_slices()
    return shared[:, frames if frames is not None else slice(None), rows, cols]


def whole_frame_pass(
    job_path: str, spec_json: dict, shot: str, region: tuple[slice, slice, slice],
    chunks: LatentChunks | None = None, compile: bool | str = False,
) -> torch.Tensor:  # fmt: skip
    """The part of the decoder that sees the whole frame, run once over a shot's latent `region` (the
    frames its tiles decode, every row and column): what each tile of those frames decodes the rest of
    the decoder from (`decode_tile`'s ``shared``)."""
    check_visible(job_path, "job store")
    decoder = load_within_budget(spec_json, compile=compile)
    latent = read_region(job_path, shot, region, chunks)
    return on_decode_thread(decoder.whole_frame, latent)


# A carried segment's task reads the next segment's latent while its own kernels are queued, and hands
# it on in its result (`NEXT_LATENT`): read by the next task, it would sit between the two segments on
# the GPU's critical path (10-35 ms on an H200 worker, docs/performance.md).
NEXT_LATENT = "next-latent"
_read_ahead_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-read-ahead")


def _start_read_ahead(
    job_path: str, tile: Tile, frames: tuple[int, int], chunks: LatentChunks | None
) -> tuple[tuple[int, int], Future]:
    return frames, _read_ahead_thread.submit(_read_for_this_worker, job_path, tile, frames, chunks)


def _read_for_this_worker(
    job_path: str, tile: Tile, frames: tuple[int, int] | None, chunks: LatentChunks | None = None,
    seen: dict[str, str] | None = None,
) -> torch.Tensor:
    """The latent frames, in pinned memory on a GPU worker: the decoder's copy to the GPU then neither
    pins (a pinned allocation took up to 27 ms there) nor waits for queued kernels."""
    latent = read_tile_latent(job_path, tile, None if frames is None else slice(*frames), chunks, seen)
    return latent.pin_memory() if worker_device().startswith("cuda") else latent


def _with_read_ahead(pieces: dict[Any, Any], ahead: tuple[tuple[int, int], Future] | None) -> dict[Any, Any]:
    """`pieces` with the next segment's latent under `NEXT_LATENT`, once read. A latent that cannot be
    read (or is not finite) is left out: the next segment reads it again and fails with its own error."""
    if ahead is not None:
        frames, reading = ahead
        with contextlib.suppress(FarmError):
            pieces[NEXT_LATENT] = (frames, reading.result())
    return pieces


def read_latent_ahead(job_path: str, tile: Tile, frames: tuple[int, int] | None) -> tuple | None:
    """A decode worker's first latent, read while the render still sets up (`farm.run.graph`'s
    ``read_first_latents``): ``(frames, latent, digests)`` for the decode that takes it (`frames`: a
    streamed segment's tile-local latent frames, None for the whole tile; `digests`: each chunk's sha256
    as read, which that decode checks against the render's, not yet recorded when this may run). None
    when it cannot be read: that decode then reads it itself and reports the error as any decode does."""
    seen: dict[str, str] = {}
    try:
        return frames, _read_for_this_worker(job_path, tile, frames, None, seen), seen
    except FarmError:
        return None


def _latent_from(
    ahead: tuple | None, frames: tuple[int, int] | None, chunks: LatentChunks | None = None,
    job_path: str = "",
) -> torch.Tensor | None:
    """The latent `read_latent_ahead` read, if it is the one of `frames` (None: the whole tile), its
    chunks checked against the render's digests (`chunks`) where it carries what it read."""
    if ahead is None or (None if ahead[0] is None else tuple(ahead[0])) != frames:
        return None
    if chunks is not None and len(ahead) > 2:
        check_read(ahead[2], chunks, Path(job_path) / chunks.shot / "latent")
    return ahead[1]


def read_ahead_latent(previous: dict | None, frames: tuple[int, int]) -> torch.Tensor | None:
    """The latent of tile-local latent `frames` the previous segment's task read ahead, if it did."""
    return _latent_from((previous or {}).get(NEXT_LATENT), frames)


def read_tile_latent(
    job_path: str, tile: Tile, frames: slice | None = None, chunks: LatentChunks | None = None,
    seen: dict[str, str] | None = None,
) -> torch.Tensor:
    """The latent block `tile` decodes (context included), or only its tile-local latent `frames`,
    checked finite; every chunk read checked present and, with `chunks`, against the render's digests
    (`seen` receives each chunk's sha256 as read)."""
    region = tile.decode_slices()
    if frames is not None:
        start = region[0].start
        region = (slice(start + frames.start, start + frames.stop), *region[1:])
    return read_region(job_path, tile.shot, region, chunks, seen)


def read_region(
    job_path: str, shot: str, region: tuple[slice, slice, slice], chunks: LatentChunks | None = None,
    seen: dict[str, str] | None = None,
) -> torch.Tensor:  # fmt: skip
    """A shot's latent `region` (frames, rows, columns), checked as `read_tile_latent` says."""
    import torch

    try:
        block = read_latent(job_path, shot, region, chunks, seen)
    except FarmError:  # a missing or changed chunk: said in its own words
        raise
    except Exception as exc:  # zarr/codec errors of many types: a corrupt or missing chunk
        raise FarmError(
            f"shot {shot!r}: cannot read latent frames {region[0].start}-{region[0].stop - 1} from "
            f"{job_path!r} (corrupt or missing chunk? {type(exc).__name__}: {exc}); repair or re-export "
            "the latents"
        ) from None
    if not np.isfinite(block).all():
        bad = np.nonzero(~np.isfinite(block).all(axis=(0, 2, 3)))[0] + region[0].start
        raise FarmError(
            f"shot {shot!r}: latent holds NaN or Inf in latent frames {sorted(set(bad.tolist()))}; "
            "re-export the latents (nothing was decoded for this tile)"
        )
    return torch.from_numpy(block)


# A decoded piece on a GPU carries the CUDA event recorded right after the kernels that make it were
# queued. Blends read pieces on a stream of their own and wait on that event only: on the decode's
# stream they would also wait for the next decode, which the decode thread queues at once, and their
# device-to-host copies would hold up its kernels (blend tasks took 0.10 s there, 0.01 s on their own
# stream; docs/performance.md). The event sits under `farm.worker.cuda_streams.READY_EVENT`.


def ready_marked(fn: Callable[..., dict[Any, Any]], *args: Any) -> dict[Any, Any]:
    """``fn(*args)``'s pieces, each carrying the event that marks it complete on its device (GPU).
    (A carried state, under ``CARRIED``, is read by the next decode on the same stream: no event.)"""
    import torch

    pieces = fn(*args)
    tensors = [p for key, p in pieces.items() if key != CARRIED]
    if tensors and tensors[0].is_cuda:
        event = torch.cuda.Event()
        event.record()  # on the current (decode) stream, after every kernel that made the pieces
        for piece in tensors:
            setattr(piece, READY_EVENT, event)
    return pieces


@contextlib.contextmanager
def blend_stream(device: Any, pieces: list[Any]) -> Iterator[None]:
    """Run a blend's GPU work on this thread's side stream of `device`, once its pieces are complete:
    after their decode's event, or, for a piece without one (it came from another worker), after all
    work queued on the device's default stream. On a CPU, as it is."""
    import torch

    if device.type != "cuda":
        yield
        return
    stream = side_stream(device, "blend")
    for piece in pieces:
        if not piece.is_cuda:
            continue
        event = getattr(piece, READY_EVENT, None)
        if event is not None:
            stream.wait_event(event)
        else:
            stream.wait_stream(torch.cuda.default_stream(piece.device))
        piece.record_stream(stream)  # its memory is not reused before this stream is done with it
    with torch.cuda.stream(stream):
        yield


CARRIED = "carried"  # a streamed segment's result key for the decoder state its next segment starts from


def take_piece(decoded: dict[Any, Any], batch: int) -> Piece:
    """Batch `batch`'s piece of a decode result, passed by value (`farm.worker.ipc.Piece`)."""
    return Piece(decoded[batch])


def share_piece(decoded: dict[Any, Any], batch: int) -> Any:
    """Batch `batch`'s piece of a decode result, for a blend on another GPU worker of this host: shared
    by CUDA IPC handle (`farm.worker.ipc`), so it crosses without a copy or a device synchronisation; a CPU
    piece as it is."""
    piece = decoded[batch]
    return share(piece, getattr(piece, READY_EVENT, None))


def _decode_segments(
    decoder: VideoDecoder | FromWholeFrame, latent: torch.Tensor, tile: Tile, segments: list[Segment],
    only: int, origin: tuple[int, ...], cuts: list[tuple[int, slice]], state: dict | None,
    first_frame: int = 0,
) -> dict[Any, Any]:  # fmt: skip
    """`state`: None unless the chunks carry the decoder's state; then the state the first segment
    decoded here starts from ({} at the tile's start). `first_frame`: the tile-local latent frame that
    `latent` starts at (a streamed segment reads only its own)."""
    import torch

    if only >= 0:
        pixels, after = decode_segment(decoder, latent, tile, segments[only], origin, state, first_frame)
        pieces: dict[Any, Any] = {batch: pixels[:, frames].contiguous() for batch, frames in cuts}
        if after is not None and only < len(segments) - 1:
            pieces[CARRIED] = after
        return pieces
    out = None
    for seg in segments:
        pixels, state = decode_segment(decoder, latent, tile, seg, origin, state)
        if out is None:
            out = torch.zeros((pixels.shape[0], tile.pixels[0].size, *pixels.shape[2:]),
                              dtype=torch.float32, device=pixels.device)  # fmt: skip
        out[:, seg.frames[0] : seg.frames[1]] += pixels
        del pixels
    assert out is not None, "a tile has at least one temporal segment"
    return {batch: out[:, frames].contiguous() for batch, frames in cuts}


def decode_segment(
    decoder: VideoDecoder | FromWholeFrame, latent: torch.Tensor, tile: Tile, segment: Segment,
    origin: tuple[int, ...], state: dict | None = None, first_frame: int = 0,
) -> tuple[torch.Tensor, dict | None]:  # fmt: skip
    """One temporal segment of a tile: its chunks decoded, weighted by their ramps and summed (as
    `decode_block` does), then weighted by the tile's own ramps over the segment's frames.

    `state`: None, or for carried chunks the decoder state per spatial chunk after the previous
    segment ({} before the first). Returns the pixels and the state after this segment (or None)."""
    import torch

    f0, f1 = segment.frames
    out = None
    after: dict | None = None if state is None else {}
    for piece in segment.pieces:  # as decode_block does each chunk: context decoded, then dropped
        frames, rows, cols = piece.decode_slices()
        at = tuple(o + sl.start for o, sl in zip(origin, (frames, rows, cols), strict=True))
        block = latent[:, frames.start - first_frame : frames.stop - first_frame, rows, cols]
        if after is None:
            pixels = decoder.decode(block, origin=at)
        else:
            place = piece.grid_pos[1:]  # the same spatial chunk in every segment
            pixels, after[place] = decoder.decode_carried(block, state.get(place), origin=at)  # type: ignore[union-attr]
        pixels = drop_context(pixels, piece, decoder.geometry)
        _weigh_in_place(pixels, piece)
        if out is None:  # the segment's frames over the tile's decoded rows and columns (halo included)
            _, rows_decoded, cols_decoded = decoder.geometry.pixel_shape(tile.block_fhw)
            shape = (pixels.shape[0], f1 - f0, rows_decoded, cols_decoded)
            out = torch.zeros(shape, dtype=torch.float32, device=pixels.device)
        (p0, p1), (h0, h1), (w0, w1) = ((s.start, s.stop) for s in piece.pixels)
        out[:, p0 - f0 : p1 - f0, h0:h1, w0:w1] += pixels
        del pixels
    assert out is not None  # a segment has at least one piece
    return _weigh_in_place(drop_halo(out, tile, decoder.geometry), tile, slice(f0, f1)), after


@dataclass(frozen=True)
class Placement:
    """Where a tile's piece goes inside a batch: frame offset in the batch, pixel rows and columns."""

    frame: int
    rows: tuple[int, int]
    cols: tuple[int, int]


@dataclass(frozen=True)
class BlendedFrames:
    """A blended batch on the host: RGB frames ``[F, H, W, 3]`` (uint8 or float16) for Zarr and images,
    and, when the video codec takes them, the same frames as yuv420p planes ``[F, H*3/2, W]``."""

    rgb: np.ndarray
    yuv420: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.rgb.nbytes + (0 if self.yuv420 is None else self.yuv420.nbytes)


@sizeof.register(BlendedFrames)
def _sizeof_blended(frames: BlendedFrames) -> int:
    return frames.nbytes + 64  # Dask's memory accounting and spilling see the pixels


def blend_batch(
    batch: Batch,
    frame_size: tuple[int, int],
    placements: list[Placement],
    pieces: list[Any],
    dtype: str = "uint8",
    yuv420: bool = False,
    groups: list[int] | None = None,
    hdr: str | None = None,
) -> BlendedFrames:
    """Sum the batch's pieces in tile order (on the device they arrived on) → frames on the host.

    `groups`: the tile of each piece; consecutive pieces of one tile (the segments of a streamed tile)
    are summed among themselves first, then added as one, exactly as the unstreamed tile's piece is.

    `dtype` "uint8" rounds to 8-bit levels; "float16" keeps the blend's precision, clamped to [0, 1].
    `yuv420`: also convert the blended pixels to yuv420p planes for the encoder (`farm.media.yuv`), on the
    same device, so the I/O worker that encodes skips the colour conversion.
    `hdr`: the sum is the HDR transfer's codes; kept as float16 scene-linear values
    (`farm.media.hdr.scene_linear_half`) whatever `dtype` says, with no planes.
    """
    import torch

    # a piece shared by another worker is opened on the blend stream (its producer's event waited on
    # there); one shared from this process is its own tensor, waited on as every local piece is
    pieces = [p.tensor if isinstance(p, Piece | SharedPiece) and p.tensor is not None else p for p in pieces]
    local = [p for p in pieces if not isinstance(p, SharedPiece)]
    device = local[0].device if local else torch.device(worker_device())
    with blend_stream(device, local):
        pieces = [open_piece(p) for p in pieces]
        acc = torch.zeros((3, batch.frames, *frame_size), dtype=torch.float32, device=device)
        for place, piece in _tile_sums(placements, pieces, groups or list(range(len(pieces))), device):
            f = place.frame
            region = (slice(None), slice(f, f + piece.shape[1]), slice(*place.rows), slice(*place.cols))
            acc[region] += piece.to(device)
        planes = rgb_to_yuv420(acc) if yuv420 else None  # before the conversion below overwrites acc
        # acc is this task's own buffer: convert it in place rather than through batch-sized temporaries
        if hdr is not None:
            converted = scene_linear_half(acc, hdr)
        elif dtype == "uint8":
            converted = to_uint8_(acc)
        else:
            converted = acc.clamp_(0.0, 1.0).to(torch.float16)
        del acc
        frames = converted.permute(1, 2, 3, 0).contiguous()  # [F, H, W, 3]
        del converted
        return BlendedFrames(_to_host(frames), None if planes is None else _to_host(planes))


def _tile_sums(
    placements: list[Placement], pieces: list[Any], groups: list[int], device: Any
) -> list[tuple[Placement, Any]]:
    """One (placement, pixels) per run of pieces of one tile: a lone piece as it is, several (a streamed
    tile's segments) summed in order into a buffer spanning their frames, as the tile's decode would."""
    import torch

    out, i = [], 0
    while i < len(pieces):
        j = i
        while j < len(pieces) and groups[j] == groups[i]:
            j += 1
        if j - i == 1:
            out.append((placements[i], pieces[i]))
        else:
            lo = min(p.frame for p in placements[i:j])
            hi = max(p.frame + x.shape[1] for p, x in zip(placements[i:j], pieces[i:j], strict=True))
            first = pieces[i]
            buf = torch.zeros((first.shape[0], hi - lo, *first.shape[2:]), dtype=torch.float32, device=device)
            for place, piece in zip(placements[i:j], pieces[i:j], strict=True):
                buf[:, place.frame - lo : place.frame - lo + piece.shape[1]] += piece.to(device)
            out.append((Placement(lo, placements[i].rows, placements[i].cols), buf))
        i = j
    return out


def _to_host(tensor: torch.Tensor) -> np.ndarray:
    """One device→host copy, through pinned memory, for a GPU tensor; CPU tensors as they are."""
    import torch

    if tensor.is_cuda:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)
        return host.numpy()
    return tensor.numpy()


def disk_full_in_one_line(task: Callable[..., Any]) -> Callable[..., Any]:
    """`task(out, ...)` with a full disk (ENOSPC, EDQUOT) as one line naming the disk, the host and what
    is safe, instead of a traceback through Zarr or the encoder: finished batches are kept, a rerun with
    space renders only what is missing."""
    import errno

    @functools.wraps(task)
    def run(out: Output, *args: Any, **kwargs: Any) -> Any:
        try:
            return task(out, *args, **kwargs)
        except (OSError, RuntimeError) as exc:  # RuntimeError: the zarrs writer's "(os error 28)"
            full = (errno.ENOSPC, errno.EDQUOT)
            if isinstance(exc, OSError) and exc.errno not in full:
                raise
            if not isinstance(exc, OSError) and not any(f"(os error {n})" in str(exc) for n in full):
                raise
        # raised outside the handler, so it carries no context: an encoder's own error type (PyAV's)
        # need not travel to the client, which then gets this one whole
        raise FarmRuntimeError(
            f"the disk holding {str(out.root)!r} is full on {socket.gethostname()}; finished batches are "
            "kept: free space there and run the render again (it renders only what is missing)"
        )

    return run


@disk_full_in_one_line
def write_batch(out: Output, batch: Batch, frames: BlendedFrames, durable: bool = True) -> float:
    """Write a blended batch into the shot's Zarr frames (fsync'd when `durable`); returns seconds spent."""
    t0 = time.perf_counter()
    check_visible(str(out.root), "output folder")
    check_owner(out, batch.shot)
    check_folders_not_links(out, out.frames_array(batch.shot))
    write_frames(out, batch.shot, batch.start, frames.rgb, durable=durable)
    return time.perf_counter() - t0


@disk_full_in_one_line
def encode_batch(
    out: Output,
    batch: Batch,
    frames: BlendedFrames,
    fps: float,
    video: VideoSettings,
    metadata: dict[str, str],
) -> float:
    """Encode a blended batch as its own video segment (an HDR render's: of its HLG master); returns
    seconds spent."""
    from farm.media.hlg import encode_hlg_segment  # PyAV, on the I/O workers only
    from farm.media.video import encode_segment

    check_visible(str(out.root), "output folder")
    t0 = time.perf_counter()
    rgb = frames.rgb
    if frames.yuv420 is None and rgb.dtype != np.uint8 and video.codec in ("h264", "h265") and not video.hdr:
        rgb = levels_uint8(rgb)
    segment = out.segment(batch.shot, batch.index)
    check_folders_not_links(out, segment.parent)
    if video.hdr is not None:  # the HLG master's segment, from the scene-linear frames
        encode_hlg_segment(rgb, segment, fps, space=video.frames_space, metadata=metadata,
                           threads=video.encoder_threads, root=out.root)  # fmt: skip
    else:
        encode_segment(rgb, segment, fps, codec=video.codec, crf=video.crf, preset=video.preset,
                       metadata=metadata, yuv420=frames.yuv420, threads=video.encoder_threads,
                       space=video.video_space, frames_space=video.frames_space, root=out.root)  # fmt: skip
    if video.durable:
        beneath.fsync_all(out.root, [segment], [segment.parent])
    return time.perf_counter() - t0


@disk_full_in_one_line
def write_sequence(
    out: Output, batch: Batch, frames: BlendedFrames, video: VideoSettings, fps: Any = None,
    timecode: str | None = None,
) -> float:
    """Write a blended batch as numbered image files (PNG or EXR); returns seconds spent."""
    check_visible(str(out.root), "output folder")
    t0 = time.perf_counter()
    folder = out.sequence_dir(batch.shot)
    check_folders_not_links(out, folder)
    written = write_images(frames.rgb, folder, batch.shot, start=batch.start,
                           first_frame=video.first_frame, format=video.sequence or "png8", fps=fps,
                           exr_values=video.exr_values, timecode=timecode,
                           exr_space=video.exr_space if video.sequence == "exr" else None,
                           frames_space=video.frames_space, root=out.root)  # fmt: skip
    if video.durable:
        beneath.fsync_all(out.root, [Path(path) for path in written or []], [folder])
    return time.perf_counter() - t0


@disk_full_in_one_line
def mark_batch(out: Output, batch: Batch, write_s: float, encode_s: float, *outputs: Any) -> dict[str, Any]:
    """Record the batch as done: runs only after its frames, segment and images are all in place."""
    check_owner(out, batch.shot)
    check_folders_not_links(out, out.done_dir(batch.shot), out.shot_group(batch.shot) / VALID)
    mark_valid(out, batch.shot, batch.start, batch.stop)  # readers' mask; the marker below is what resumes
    record = batch_record(out, batch.shot, batch.index, batch.start, batch.stop)
    mark_done(out.done_marker(batch.shot, batch.index), record, root=out.root)
    # the segment this render encoded: its size tells how hard its frames are to encode (bits per pixel)
    encoded = os.stat(out.segment(batch.shot, batch.index)).st_size if encode_s > 0 else 0
    return {"shot": batch.shot, "batch": batch.index, "frames": batch.frames, "write_s": write_s,
            "encode_s": encode_s, "encoded_bytes": encoded}  # fmt: skip


def write_and_mark_batch(
    out: Output, batch: Batch, frames: BlendedFrames, durable: bool = True
) -> dict[str, Any]:
    """`write_batch` then `mark_batch`, for a batch whose only output is its Zarr frames: one task, so
    the mark does not wait a scheduler round trip after the write (≈ 10 ms, on a render's tail)."""
    return mark_batch(out, batch, write_batch(out, batch, frames, durable), 0.0)


def levels_uint8(frames: np.ndarray) -> np.ndarray:
    """float frames in [0, 1] → uint8 levels, rounding like `to_uint8_` (for 8-bit codecs)."""
    return np.round(np.clip(frames.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)


def to_uint8_(pixels: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats → uint8 levels, rounding to nearest (values outside [0, 1] clip), overwriting the
    float `pixels` on the way (no batch-sized temporaries)."""
    import torch

    return pixels.clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


@disk_full_in_one_line
def finish_shot(
    out: Output,
    shot: str,
    n_batches: int,
    metadata: dict[str, str],
    *_done: Any,
    durable: bool = True,
    sound: str | None = None,
) -> dict:
    """Join the shot's segments, in batch order and without re-encoding, into ``videos/<shot>.mp4``.

    `sound`: the shot's sound file (OUT/audio), muxed in as the video's audio track, as long as the video.

    `durable`: the video and its name reach the disk (fsync) before its done marker, and only then are
    the segments (each fsync'd when written) removed, so a power cut leaves either the segments or the
    whole video."""
    from farm.media.video import join_segments  # PyAV, on the I/O workers only

    check_owner(out, shot)
    segments = [out.segment(shot, k) for k in range(n_batches)]
    missing = [str(s) for s in segments if not s.exists()]
    if missing:
        raise FarmError(f"shot {shot!r}: cannot join the video, segments missing: {missing[:3]}")
    check_folders_not_links(out, out.videos_dir, out.done_dir(shot))
    join_segments(segments, out.video(shot), metadata=metadata, sound=sound, root=out.root)
    if durable:
        beneath.fsync_all(out.root, [out.video(shot)], [out.video(shot).parent])
    mark_done(out.video_done_marker(shot), file_record(out.video(shot)), root=out.root)
    for s in segments:
        beneath.unlink(out.root, s)
    return {"shot": shot, "video": str(out.video(shot)), "batches": n_batches}


def decode_audio(
    job_path: str,
    audio_spec_json: dict,
    out: Output,
    shot: str,
    frames: int,
    fps: float,
    fmt: str = "wav",
    durable: bool = True,
) -> dict:
    """Decode a shot's sound whole (its sound family's decoder: LTX-2's audio VAE, then vocoder) and write
    ``OUT/audio/<shot>.<fmt>``: as long as its `frames` video frames at `fps` (cut, or padded with
    silence), then its done marker."""
    from farm.media.audio import audio_suffix, fit_length, to_levels, write_audio  # PyAV, on workers only

    check_visible(job_path, "job store")
    check_owner(out, shot)
    started = time.perf_counter()
    decoder = load_sound_decoder(audio_spec_json, worker_device())
    waveform = decoder.decode(read_audio_latent(job_path, shot))
    samples = samples_for_frames(frames, fps, decoder.sample_rate)
    levels = to_levels(fit_length(waveform, samples))
    path = out.audio_file(shot, audio_suffix(fmt))
    check_folders_not_links(out, path.parent, out.done_dir(shot))
    write_audio(path, levels, decoder.sample_rate, fmt, root=out.root)
    if durable:
        beneath.fsync_all(out.root, [path], [path.parent])
    mark_done(out.audio_done_marker(shot), file_record(path), root=out.root)
    return {
        "shot": shot,
        "audio": str(path),
        "samples": samples,
        "decoded_samples": int(waveform.shape[1]),
        "seconds": time.perf_counter() - started,
    }
