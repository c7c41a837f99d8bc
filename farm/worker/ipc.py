"""Decoded pieces handed to another GPU worker of the same host by CUDA IPC handle, not by value.

A batch fed by tiles decoded on two GPU workers is blended on one of them, so the other's pieces must
cross. Sent by value, over UCX, each crossing costs a full device synchronisation on both ends, inside
their event loops: distributed-ucxx calls ``cuda.core.Device.sync()`` before it sends or receives a CUDA
frame. On a GPU worker whose decode thread has already queued the next temporal chunk, that blocks the
worker's event loop (task starts, results, every other transfer) until the chunk is decoded, so one
shot split over two GPUs gained nothing from the second (docs/performance.md).

Instead, the decoding worker wraps such a piece in a :class:`SharedPiece`: the tensor itself while it
stays in that process, and what CUDA IPC needs to map the same device memory into another process of
the host (``torch.multiprocessing``'s own reduction: a memory handle, offsets, a reference counter and
an interprocess event recorded after the piece's kernels). What crosses is a few hundred bytes of
pickle; the blend opens it on its own CUDA stream and its kernels read the peer GPU's memory directly
(NVLink or PCIe peer access). No copy, no host memory, no device synchronisation on either side.

Lifetime: the piece stays in the decoding worker's memory until its batch is written (the driver holds
its future until then), and every blend finishes reading before its batch is written. CPU pieces (a CPU
cluster) are passed as they are. The cost: a GPU worker lost after a blending worker fetched the handle
of one of its pieces, and before that blend ran, takes the piece's memory with it, so that batch fails
(its shot is resumed by a rerun) where a piece sent by value would have survived.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dask.sizeof import sizeof

from farm.errors import FarmError
from farm.worker.cuda_streams import side_stream

if TYPE_CHECKING:
    import torch

# The size Dask's memory accounting sees for a shared piece: its pickle, not the device bytes (those are
# counted once, in the decode result it was cut from).
SHARED_PIECE_SIZEOF = 1024


def host_id() -> str:
    """This machine, as CUDA IPC needs it: processes of one host (one kernel) can share device memory."""
    return socket.gethostname()


@dataclass
class SharedPiece:
    """A decoded CUDA piece another process of this host can map. ``tensor`` is set only in the process
    that made it (it is dropped from the pickle); ``rebuild`` is ``torch.multiprocessing``'s
    ``rebuild_cuda_tensor`` arguments."""

    rebuild: tuple[Any, ...]
    host: str
    pid: int
    shape: tuple[int, ...]
    tensor: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["tensor"] = None  # only the handle travels
        return state

    def open(self) -> torch.Tensor:
        """The piece as a tensor in this process: the tensor itself where it was made, else the peer
        memory mapped through CUDA IPC. Kernels queued on the current stream after this call see the
        piece complete (the producer's event is waited on there)."""
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        if self.tensor is not None:
            return self.tensor
        if self.host != host_id():
            raise FarmError(
                f"a decoded piece shared over CUDA IPC on host {self.host!r} reached {host_id()!r}: CUDA IPC "
                "works between processes of one host only (a blend moved to another host when its own "
                "worker was lost); rerun the render to resume the batch, or set farm.cuda-ipc to false"
            )
        device = int(self.rebuild[6])
        try:
            tensor = rebuild_cuda_tensor(*self.rebuild)  # waits for the producer's event on device's stream
        except RuntimeError as exc:  # the peer GPU not visible here, or its process gone
            if not os.path.exists(f"/proc/{self.pid}") and os.path.isdir("/proc/self"):
                raise FarmError(
                    f"the worker process {self.pid} that decoded a piece of this batch and shared it by CUDA "
                    "IPC has gone, and its GPU memory with it; the batch was not written: rerun the render "
                    "to resume it (farm.cuda-ipc false sends pieces by value, which survives that)"
                ) from None
            raise FarmError(
                f"cannot open a decoded piece shared by CUDA IPC from process {self.pid} on {self.host} "
                f"({exc}); rerun the render to resume the batch, or set farm.cuda-ipc to false to send "
                "pieces by value"
            ) from None
        if device != torch.cuda.current_device():
            torch.cuda.current_stream().wait_stream(torch.cuda.current_stream(device))
        return tensor


@sizeof.register(SharedPiece)
def _sizeof_shared(piece: SharedPiece) -> int:
    return SHARED_PIECE_SIZEOF


@dataclass
class Piece:
    """A decoded piece passed by value: its tensor, wrapped. The scheduler tells the client the type of
    every result the client holds a future of, and the client unpickles that type: a bare tensor would
    make the driver import torch. farm's tensor serializers carry the wrapped tensor
    (`farm.worker.transport`), CUDA buffers included."""

    tensor: Any


@sizeof.register(Piece)
def _sizeof_piece(piece: Piece) -> int:
    return int(sizeof(piece.tensor))


def share(piece: torch.Tensor, ready: Any = None) -> SharedPiece | Piece:
    """`piece` as a :class:`SharedPiece` when it lives on a GPU (a CPU tensor as a :class:`Piece`).

    `ready`: the CUDA event recorded after the kernels that made the piece (`farm.worker.tasks`); the IPC
    event is recorded on a side stream that waits for it only, so a blend elsewhere does not also wait for the
    next decode that the decoding worker has already queued on its stream."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    if not piece.is_cuda:
        return Piece(piece)
    stream = side_stream(piece.device, "share")
    with torch.cuda.stream(stream):
        if ready is not None:
            stream.wait_event(ready)
        else:
            stream.wait_stream(torch.cuda.default_stream(piece.device))
        _, rebuild = reduce_tensor(piece)  # records the IPC event on the current (side) stream
    return SharedPiece(tuple(rebuild), host_id(), os.getpid(), tuple(piece.shape), tensor=piece)


def open_piece(piece: Any) -> Any:
    """A blend's piece as a tensor: a :class:`SharedPiece` opened, a :class:`Piece` unwrapped, anything
    else as it is."""
    if isinstance(piece, Piece):
        return piece.tensor
    return piece.open() if isinstance(piece, SharedPiece) else piece


def visible_gpus() -> tuple[str, tuple[str, ...]]:
    """Run on a worker: the UUID of its own GPU and of every GPU it can see (``("", ())`` without CUDA).
    A piece can be opened where its GPU is visible: dask-cuda's workers see every GPU of the node, a
    worker started with ``CUDA_VISIBLE_DEVICES`` of one GPU sees only its own."""
    import torch

    if not torch.cuda.is_available():
        return "", ()
    try:
        seen = tuple(str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count()))
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid), seen
    except (AttributeError, RuntimeError):  # no UUIDs to compare: share nothing, send pieces by value
        return "", ()


def gpus_seen(client: Any, workers: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """`visible_gpus` of each of `workers` (a worker that cannot answer sees none: its pieces go by
    value)."""
    answers = client.run(visible_gpus, workers=workers, on_error="return")
    return {w: a if isinstance(a, tuple) else ("", ()) for w, a in answers.items()}


def can_open(decoded_on: str, blended_on: str, gpus: dict[str, tuple[str, tuple[str, ...]]] | None) -> bool:
    """Whether a piece decoded on worker `decoded_on` can be opened by CUDA IPC on worker `blended_on`:
    both on one host and, with `gpus` (per worker, what `visible_gpus` says), the blending worker sees
    the decoding worker's GPU."""
    if not one_host([decoded_on, blended_on]):
        return False
    if gpus is None:
        return True
    own = gpus.get(decoded_on, ("", ()))[0]
    return bool(own) and own in gpus.get(blended_on, ("", ()))[1]


def one_host(addresses: list[str]) -> bool:
    """Whether every worker address is on one host (the IP or name part), so CUDA IPC reaches them all."""
    return len({_address_host(a) for a in addresses}) <= 1


def _address_host(address: str) -> str:
    """``"ucx://10.0.0.1:4001"`` → ``"10.0.0.1"`` (without importing the comm backend)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    _, location = parse_address(address)
    try:
        return parse_host_port(location)[0]
    except ValueError:  # not host:port (inproc://host/pid/n)
        return location.split("/")[0]
