"""Moving torch tensors between Dask workers: serializers and ``sizeof`` for CPU and CUDA tensors.

distributed 2026.7.1 ships a torch serializer that calls ``.numpy()``: it fails on CUDA tensors and on
bfloat16 (dask/distributed#6111, #8001), nothing handles torch in the ``"cuda"`` family, and
``dask.sizeof`` sees a tensor as a few hundred bytes. This module replaces all three:

``"cuda"`` family (used by UCX comms)
    A CUDA tensor travels as one device frame: its bytes, viewed as a flat ``uint8`` CUDA array.
    UCX sends that frame GPU to GPU (CUDA IPC / NVLink / RDMA); the receiver wraps the frame it got
    in a tensor on its current CUDA device without touching host memory. CPU tensors decline
    (``NotImplementedError``), so they fall through to the ``"dask"`` family.
``"dask"`` family (TCP comms, and dask-cuda's device-to-host spilling)
    A host copy of the bytes (``uint8`` view, so bfloat16 works) plus dtype and shape. A tensor that
    left from a GPU goes back onto the receiver's current GPU when the receiver has one; otherwise it
    stays on the CPU.
``dask.sizeof``
    ``element_size() * nelement()`` plus a small constant, on any device.

Call :func:`register` in every process that sends or receives tensors; `farm.worker.transport_plugin.install`
does that on every current and future worker of a cluster (this module imports torch: a driver installs
the plugin without importing it). The scheduler needs nothing: it forwards task results without
deserializing them (its comms keep them as opaque ``Serialized`` frames) and never computes their
size. (A tensor written into a task graph as a literal is pickled with the graph, by torch's own
pickling, not by these serializers: pass tensors between tasks as results, never as literals.)

:func:`transport_stats` counts, per process, what went through each path: a benchmark can call
``client.run(farm.worker.transport.transport_stats)`` and check ``device_to_host == 0`` on a UCX cluster.

Only the logic of the CUDA path is exercised on a CPU-only machine; its device code runs on a GPU
worker. cupy is imported lazily, when a CUDA tensor is actually serialized, and is optional even then
(without it the frame is the flat uint8 CUDA tensor itself). Checked on one H200 with two worker
processes: over UCX a 1 GiB bfloat16 tensor moved in ≈ 17 ms with no host copy (with and without
cupy); over TCP in ≈ 1.8 s through host memory, arriving on the GPU either way.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from dask.sizeof import sizeof

from farm.worker.cuda_streams import READY_EVENT, side_stream
from farm.worker.ipc import Piece

# Per-object overhead added to a tensor's data bytes in ``sizeof``.
SIZEOF_OVERHEAD = 128

_STAT_KEYS = (
    "dask_serialized",  # tensors serialized by the "dask" (host) family
    "dask_deserialized",
    "cuda_serialized",  # tensors serialized by the "cuda" (device) family
    "cuda_deserialized",
    "host_copies",  # tensors whose bytes went through host memory (the "dask" family)
    "host_copy_bytes",
    "device_to_host",  # CUDA tensors copied to host to be sent (the slow path on a GPU farm)
    "device_to_host_bytes",
    "host_to_device",  # tensors that arrived through host memory and were moved onto a GPU
    "host_to_device_bytes",
    "device_frames",  # device buffers handed to the comm (the "cuda" family)
    "device_bytes",
)
_stats: dict[str, int] = dict.fromkeys(_STAT_KEYS, 0)
_stats_lock = threading.Lock()
_register_lock = threading.Lock()


def _count(**increments: int) -> None:
    with _stats_lock:
        for key, value in increments.items():
            _stats[key] += value


def transport_stats() -> dict[str, int]:
    """This process's transport counters since start (or :func:`reset_transport_stats`).

    Keys: ``dask_serialized``, ``dask_deserialized``, ``cuda_serialized``, ``cuda_deserialized``,
    ``host_copies`` / ``host_copy_bytes`` (tensors and bytes through the host family),
    ``device_to_host`` / ``device_to_host_bytes`` (CUDA tensors copied to host to be sent),
    ``host_to_device`` / ``host_to_device_bytes`` (received through host, moved onto a GPU),
    ``device_frames`` / ``device_bytes`` (device buffers sent by the CUDA family).

    >>> client.run(transport_stats)  # doctest: +SKIP
    {'tcp://127.0.0.1:40123': {'dask_serialized': 8, ...}, ...}
    """
    with _stats_lock:
        return dict(_stats)


def reset_transport_stats() -> None:
    """Set this process's transport counters back to zero."""
    with _stats_lock:
        for key in _STAT_KEYS:
            _stats[key] = 0


# ---------------------------------------------------------------------------------------------------
# Device-independent pieces (exercised on CPU by the tests; the CUDA path is built from them)
# ---------------------------------------------------------------------------------------------------


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes of data the tensor's elements occupy (not the whole storage a view may point into)."""
    return t.element_size() * t.nelement()


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` → ``torch.bfloat16``; refuses names that are not torch dtypes."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"cannot deserialize a tensor of dtype {name!r}: torch has no such dtype")
    return dtype


def tensor_header(t: torch.Tensor) -> dict[str, Any]:
    """What a receiver needs to rebuild ``t`` from its bytes (msgpack-friendly)."""
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "device": t.device.type,
        "requires_grad": bool(t.requires_grad),
        "parameter": isinstance(t, torch.nn.Parameter),
        "nbytes": tensor_nbytes(t),
    }


def as_byte_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as a flat, C-contiguous ``uint8`` tensor on the same device.

    No copy when ``t`` is already contiguous; works for every dtype (bfloat16 included), 0-d and
    empty tensors. Strides are not kept: the receiver gets a contiguous tensor of the same shape.
    """
    return t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def check_plain(t: torch.Tensor) -> None:
    """Refuse (``NotImplementedError``, so distributed falls back to pickle) tensors that are not a
    plain strided block of memory: sparse, quantized, nested or meta tensors."""
    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.device.type == "meta":
        raise NotImplementedError(f"farm's transport handles plain strided tensors, not {t.layout} {t.dtype}")


def from_byte_view(flat: torch.Tensor, header: dict[str, Any]) -> torch.Tensor:
    """Inverse of :func:`as_byte_view`: reinterpret a flat ``uint8`` tensor using ``header``."""
    dtype = dtype_from_name(header["dtype"])
    shape = tuple(header["shape"])
    expected = header.get("nbytes")
    if expected is not None and flat.numel() != expected:
        raise ValueError(
            f"tensor frame holds {flat.numel()} bytes, but its header ({header['dtype']}, shape "
            f"{list(shape)}) needs {expected}"
        )
    t = flat.reshape(-1).view(dtype).reshape(shape)
    return _finish(t, header)


def _finish(t: torch.Tensor, header: dict[str, Any]) -> torch.Tensor:
    if header.get("parameter"):
        return torch.nn.Parameter(t, requires_grad=bool(header.get("requires_grad")))
    if header.get("requires_grad"):
        t.requires_grad_(True)
    return t


def receiving_device(sent_from: str, cuda_available: bool, current_device: int | None) -> torch.device:
    """Where a tensor that came through host memory should land on this process.

    A tensor that left from a GPU goes onto this process's current GPU (one GPU per dask-cuda worker)
    when it has one; anything else stays on the CPU.
    """
    if sent_from == "cuda" and cuda_available:
        return torch.device("cuda", current_device if current_device is not None else 0)
    return torch.device("cpu")


def _current_cuda_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def host_frame_to_bytes(frame: Any) -> torch.Tensor:
    """A received host frame (bytes, bytearray, memoryview) as a flat ``uint8`` CPU tensor.

    Read-only frames and frames whose address is not aligned for any dtype are copied, so the
    result is writable and safe to view as a wider dtype.
    """
    mv = memoryview(frame).cast("B")
    arr = np.frombuffer(mv, dtype=np.uint8)
    if mv.readonly or (arr.size and arr.ctypes.data % 16):
        arr = arr.copy()
    return torch.from_numpy(arr)


def device_frame_to_bytes(frame: Any, device: torch.device) -> torch.Tensor:
    """A received frame (anything with ``__cuda_array_interface__`` or the buffer protocol) as a flat
    ``uint8`` tensor on ``device``, without a copy when the frame already lives there."""
    flat = torch.as_tensor(frame, device=device)
    if flat.dtype != torch.uint8:
        flat = flat.reshape(-1).view(torch.uint8)
    return flat.reshape(-1)


# ---------------------------------------------------------------------------------------------------
# "dask" family: through host memory
# ---------------------------------------------------------------------------------------------------


def dask_dumps_tensor(t: torch.Tensor) -> tuple[dict[str, Any], list[memoryview]]:
    check_plain(t)
    header = tensor_header(t)
    flat = as_byte_view(t)
    nbytes = flat.numel()
    if flat.device.type != "cpu":
        flat = _device_to_host(flat, getattr(t, READY_EVENT, None))
        _count(device_to_host=1, device_to_host_bytes=nbytes)
    _count(dask_serialized=1, host_copies=1, host_copy_bytes=nbytes)
    return header, [flat.numpy().data]


def _device_to_host(flat: torch.Tensor, ready: Any) -> torch.Tensor:
    """A CUDA tensor's bytes on the host. With its `ready` event, copied on a side stream that waits for
    that event only: on the device's default stream the copy would also wait for every decode queued
    after the piece (the next temporal chunk, on a carried tile)."""
    if ready is None:
        return flat.cpu()
    stream = side_stream(flat.device, "transfer")
    with torch.cuda.stream(stream):
        stream.wait_event(ready)
        return flat.cpu()  # synchronous: waits for this stream alone


def _host_to_device(flat: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Received host bytes onto `device`, on a side stream (a copy from pageable memory on the default
    stream waits for every kernel queued there), complete before it is returned: its readers wait on
    nothing but the default stream."""
    stream = side_stream(device, "transfer")
    with torch.cuda.stream(stream):
        out = flat.to(device)
    stream.synchronize()
    # allocated on the side stream, read on others: its memory must not be reused by a later copy on
    # the side stream while work the default stream queued on it is pending (blends record their own)
    out.record_stream(torch.cuda.default_stream(out.device))
    return out


def dask_loads_tensor(header: dict[str, Any], frames: list[Any]) -> torch.Tensor:
    flat = host_frame_to_bytes(frames[0]) if frames else torch.empty(0, dtype=torch.uint8)
    cuda = header.get("device") == "cuda" and torch.cuda.is_available()
    device = receiving_device(
        header.get("device", "cpu"), cuda, torch.cuda.current_device() if cuda else None
    )
    if device.type != "cpu":
        flat = _host_to_device(flat, device)
        _count(host_to_device=1, host_to_device_bytes=flat.numel())
    _count(dask_deserialized=1)
    return from_byte_view(flat, header)


# ---------------------------------------------------------------------------------------------------
# "cuda" family: device buffers, no host copy
# ---------------------------------------------------------------------------------------------------


def _device_frame(flat: torch.Tensor) -> Any:
    """Wrap a flat uint8 CUDA tensor as the frame the comm sends: a cupy array when cupy is installed
    (the path measured with UCX), else the tensor itself (it exposes ``__cuda_array_interface__``)."""
    try:
        import cupy
    except ImportError:
        return flat
    return cupy.asarray(flat)


def cuda_dumps_tensor(t: torch.Tensor) -> tuple[dict[str, Any], list[Any]]:
    if t.device.type != "cuda":
        # Not ours to send as a device buffer: the "dask" family takes CPU tensors.
        raise NotImplementedError(f"{t.device.type} tensor is not a CUDA tensor")
    check_plain(t)
    header = tensor_header(t)
    flat = as_byte_view(t)
    # The comm reads the buffer on its own CUDA streams: finish the work that produced it first.
    torch.cuda.current_stream(flat.device).synchronize()
    _count(cuda_serialized=1, device_frames=1, device_bytes=flat.numel())
    return header, [_device_frame(flat)]


def cuda_loads_tensor(header: dict[str, Any], frames: list[Any]) -> torch.Tensor:
    device = _current_cuda_device()
    if frames:
        flat = device_frame_to_bytes(frames[0], device)
    else:
        flat = torch.empty(0, dtype=torch.uint8, device=device)
    _count(cuda_deserialized=1)
    return from_byte_view(flat, header)


# ---------------------------------------------------------------------------------------------------
# sizeof and registration
# ---------------------------------------------------------------------------------------------------


def dask_dumps_piece(piece: Piece) -> tuple[dict[str, Any], list[memoryview]]:
    return dask_dumps_tensor(piece.tensor)


def dask_loads_piece(header: dict[str, Any], frames: list[Any]) -> Piece:
    return Piece(dask_loads_tensor(header, frames))


def cuda_dumps_piece(piece: Piece) -> tuple[dict[str, Any], list[Any]]:
    return cuda_dumps_tensor(piece.tensor)


def cuda_loads_piece(header: dict[str, Any], frames: list[Any]) -> Piece:
    return Piece(cuda_loads_tensor(header, frames))


def sizeof_tensor(t: torch.Tensor) -> int:
    return tensor_nbytes(t) + SIZEOF_OVERHEAD


_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def register() -> None:
    """Register farm's tensor serializers and ``sizeof`` in this process (idempotent, thread-safe).

    distributed registers its own torch serializer lazily, the first time it dispatches on a class
    from the ``torch`` package, and that registration assigns ``dask_serialize[torch.Tensor]``. To win
    for good, import distributed's torch module first (so its registrations have run and can never run
    again), then assign ours for ``torch.Tensor`` and ``torch.nn.Parameter``; other subclasses reach
    ``torch.Tensor`` through their MRO.
    """
    import distributed.protocol.torch  # noqa: F401  (run distributed's registrations before ours)
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    with _register_lock:
        for typ in _TENSOR_TYPES:
            dask_serialize.register(typ, dask_dumps_tensor)
            dask_deserialize.register(typ, dask_loads_tensor)
            cuda_serialize.register(typ, cuda_dumps_tensor)
            cuda_deserialize.register(typ, cuda_loads_tensor)
        dask_serialize.register(Piece, dask_dumps_piece)  # a decoded piece, wrapped (`farm.worker.ipc.Piece`)
        dask_deserialize.register(Piece, dask_loads_piece)
        cuda_serialize.register(Piece, cuda_dumps_piece)
        cuda_deserialize.register(Piece, cuda_loads_piece)
        sizeof.register(torch.Tensor, sizeof_tensor)


def is_registered() -> bool:
    """Whether this process dispatches torch tensors to farm's serializers."""
    from distributed.protocol.cuda import cuda_serialize
    from distributed.protocol.serialize import dask_serialize

    return (
        dask_serialize.dispatch(torch.Tensor) is dask_dumps_tensor
        and dask_serialize.dispatch(torch.nn.Parameter) is dask_dumps_tensor
        and cuda_serialize.dispatch(torch.Tensor) is cuda_dumps_tensor
        and sizeof.dispatch(torch.Tensor) is sizeof_tensor
    )
