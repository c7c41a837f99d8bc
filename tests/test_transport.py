"""farm.worker.transport on a real local Dask cluster (two worker processes, loopback TCP).

CUDA tensors cannot be made on this machine; the pieces the CUDA path is built from (byte views,
dtype restoration, the choice of receiving device, family fall-through) are tested on CPU here.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import dask.sizeof
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster
from distributed.protocol import deserialize, serialize

from farm.run.cluster import workers_info
from farm.worker import transport, transport_plugin

# --- tensors built the same way on any process, so a worker can check what it received -----------

CASES = [
    "float32",
    "bfloat16",
    "float16",
    "uint8",
    "int64",
    "bool",
    "noncontiguous-transpose",
    "noncontiguous-strided-slice",
    "offset-view",
    "zero-dim",
    "zero-dim-bfloat16",
    "empty",
    "empty-bfloat16",
    "requires-grad",
]


def make_tensor(case: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(map(ord, case)))
    base = torch.randn(6, 10, 7, generator=g)
    if case == "float32":
        return base
    if case == "bfloat16":
        return base.to(torch.bfloat16)
    if case == "float16":
        return base.to(torch.float16)
    if case == "uint8":
        return (base * 40).clamp(-128, 127).to(torch.int16).add(128).to(torch.uint8)
    if case == "int64":
        return (base * 1e6).to(torch.int64)
    if case == "bool":
        return base > 0
    if case == "noncontiguous-transpose":
        return base.to(torch.bfloat16).transpose(0, 2)
    if case == "noncontiguous-strided-slice":
        return base[:, ::3, 1::2]
    if case == "offset-view":
        return base.reshape(-1)[17:60]
    if case == "zero-dim":
        return torch.tensor(3.25)
    if case == "zero-dim-bfloat16":
        return torch.tensor(-1.5, dtype=torch.bfloat16)
    if case == "empty":
        return torch.empty(0, 3, 5)
    if case == "empty-bfloat16":
        return torch.empty(4, 0, dtype=torch.bfloat16)
    if case == "requires-grad":
        return base[:2].clone().requires_grad_(True)
    raise ValueError(case)


def checksum(t: torch.Tensor) -> str:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def receive_and_check(t: torch.Tensor, case: str) -> dict:
    """Runs on the receiving worker."""
    expected = make_tensor(case)
    return {
        "type": type(t).__name__,
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "device": t.device.type,
        "equal": bool(torch.equal(t.detach(), expected.detach())),
        "contiguous": t.is_contiguous(),
        "requires_grad": t.requires_grad,
        "checksum": checksum(t),
    }


def make_parameter() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.arange(6.0).reshape(2, 3).to(torch.bfloat16))


# --- the cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as c,
    ):
        transport_plugin.install(c)
        yield c


@pytest.fixture(scope="module")
def workers(client):
    a, b = sorted(workers_info(client))
    return a, b


def test_workers_dispatch_to_farm(client):
    assert transport.is_registered()
    assert set(client.run(transport.is_registered).values()) == {True}


def test_install_is_idempotent(client):
    transport_plugin.install(client)
    transport_plugin.install(client)
    assert set(client.run(transport.is_registered).values()) == {True}


def test_round_trip_between_workers(client, workers):
    a, b = workers
    before = client.run(transport.transport_stats)
    made = [client.submit(make_tensor, case, key=f"make-{case}", workers=[a]) for case in CASES]
    checked = [
        client.submit(receive_and_check, t, case, key=f"check-{case}", workers=[b])
        for t, case in zip(made, CASES, strict=True)
    ]
    results = client.gather(checked)
    after = client.run(transport.transport_stats)

    for case, got in zip(CASES, results, strict=True):
        expected = make_tensor(case)
        assert got["type"] == "Tensor", case
        assert got["dtype"] == str(expected.dtype), case
        assert got["shape"] == list(expected.shape), case
        assert got["device"] == "cpu", case
        assert got["equal"], case
        assert got["contiguous"], case  # strides are not kept: a contiguous copy arrives
        assert got["requires_grad"] == expected.requires_grad, case
        assert got["checksum"] == checksum(expected), case

    # Every tensor left a and arrived at b through farm's host-family serializer.
    sent = after[a]["dask_serialized"] - before[a]["dask_serialized"]
    received = after[b]["dask_deserialized"] - before[b]["dask_deserialized"]
    assert sent >= len(CASES)
    assert received >= len(CASES)
    expected_bytes = sum(transport.tensor_nbytes(make_tensor(c)) for c in CASES)
    assert after[a]["host_copy_bytes"] - before[a]["host_copy_bytes"] >= expected_bytes
    # CPU tensors never touch a device path.
    for addr in (a, b):
        assert after[addr]["device_to_host"] == 0
        assert after[addr]["cuda_serialized"] == 0


def test_bfloat16_result_reaches_the_client(client, workers):
    # distributed's own torch serializer calls .numpy(), which bfloat16 does not support.
    t = client.submit(make_tensor, "bfloat16", workers=[workers[0]]).result()
    assert t.dtype == torch.bfloat16
    assert torch.equal(t, make_tensor("bfloat16"))


def test_parameter_between_workers(client, workers):
    a, b = workers
    p = client.submit(make_parameter, workers=[a])
    got = client.submit(lambda x: (type(x).__name__, x.requires_grad, x.dtype, x.tolist()), p, workers=[b])
    name, requires_grad, dtype, values = got.result()
    assert name == "Parameter"
    assert requires_grad is True
    assert dtype == torch.bfloat16
    assert values == make_parameter().tolist()


def test_scatter_and_gather_through_scheduler(client, workers):
    t = make_tensor("noncontiguous-transpose")
    [fut] = client.scatter([t], workers=[workers[1]], direct=False)
    back = client.gather(fut, direct=False)
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)


def test_workers_report_tensor_sizes(client, workers):
    fut = client.submit(torch.zeros, 1000, 1000, workers=[workers[0]], key="zeros-1000x1000")
    fut.result()
    nbytes = client.nbytes(summary=False)
    assert nbytes["zeros-1000x1000"] >= 4_000_000
    del fut


def test_stats_are_per_process_and_resettable(client):
    client.run(transport.reset_transport_stats)
    stats = client.run(transport.transport_stats)
    assert all(set(s.values()) == {0} for s in stats.values())
    keys = {"host_copies", "host_copy_bytes", "device_frames", "device_bytes"}
    assert set(next(iter(stats.values()))) >= keys


# --- sizeof ----------------------------------------------------------------------------------------


def test_sizeof_counts_the_elements():
    transport.register()
    assert dask.sizeof.sizeof(torch.zeros(1000, 1000)) >= 4_000_000
    assert dask.sizeof.sizeof(torch.zeros(1000, 1000, dtype=torch.bfloat16)) >= 2_000_000
    # A view is the bytes it covers, not its whole storage.
    big = torch.zeros(1000, 1000)
    assert 40_000 <= dask.sizeof.sizeof(big[:10]) < 100_000
    assert dask.sizeof.sizeof(torch.nn.Parameter(torch.zeros(250, 1000))) >= 1_000_000
    assert dask.sizeof.sizeof(torch.tensor(1.0)) >= 4


# --- the serializers directly ----------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_dask_family_round_trip(case):
    transport.register()
    t = make_tensor(case)
    header, frames = serialize(t, serializers=["dask"], on_error="raise")
    assert header["serializer"] == "dask"
    u = deserialize(header, frames, deserializers=["dask"])
    assert u.dtype == t.dtype and u.shape == t.shape and u.device.type == "cpu"
    assert torch.equal(u.detach(), t.detach())
    assert u.requires_grad == t.requires_grad


def test_round_trip_through_read_only_and_misaligned_frames():
    transport.register()
    t = make_tensor("float32")
    header, frames = serialize(t, serializers=["dask"], on_error="raise")
    raw = bytes(frames[0])
    assert torch.equal(deserialize(header, [raw]), t)  # read-only bytes
    shifted = bytearray(len(raw) + 1)
    shifted[1:] = raw
    assert torch.equal(deserialize(header, [memoryview(shifted)[1:]]), t)  # odd address


def test_cpu_tensors_fall_through_the_cuda_family():
    transport.register()
    t = make_tensor("bfloat16")
    with pytest.raises(NotImplementedError):
        transport.cuda_dumps_tensor(t)
    # The UCX comm's serializer list: the CPU tensor goes to the host family.
    header, frames = serialize(t, serializers=["cuda", "dask", "pickle"], on_error="raise")
    assert header["serializer"] == "dask"
    assert torch.equal(deserialize(header, frames), t)


def test_unusual_tensors_fall_back_to_pickle():
    transport.register()
    s = torch.randn(4, 4).to_sparse()
    header, frames = serialize(s, serializers=["dask", "pickle"], on_error="raise")
    assert header["serializer"] == "pickle"
    assert torch.equal(deserialize(header, frames).to_dense(), s.to_dense())


def test_tensor_from_a_gpu_lands_on_this_gpu_or_on_cpu_without_cuda():
    # A header as a GPU worker writes it: a receiver without CUDA keeps the tensor on the CPU, one with
    # a GPU puts it there (copied on a side stream, complete when it is handed over).
    transport.register()
    t = make_tensor("bfloat16")
    header, frames = serialize(t, serializers=["dask"], on_error="raise")
    header["sub-header"]["device"] = "cuda"
    u = deserialize(header, frames)
    assert u.device.type == ("cuda" if torch.cuda.is_available() else "cpu") and torch.equal(u.cpu(), t)


# --- the pieces of the CUDA path, on CPU -----------------------------------------------------------


@pytest.mark.parametrize(
    ("sent_from", "cuda_available", "current", "expected"),
    [
        ("cuda", True, 0, torch.device("cuda", 0)),
        ("cuda", True, 3, torch.device("cuda", 3)),
        ("cuda", True, None, torch.device("cuda", 0)),
        ("cuda", False, None, torch.device("cpu")),
        ("cpu", True, 0, torch.device("cpu")),
        ("cpu", False, None, torch.device("cpu")),
        ("mps", True, 0, torch.device("cpu")),
    ],
)
def test_receiving_device(sent_from, cuda_available, current, expected):
    assert transport.receiving_device(sent_from, cuda_available, current) == expected


@pytest.mark.parametrize("case", CASES)
def test_byte_view_round_trip(case):
    t = make_tensor(case)
    flat = transport.as_byte_view(t)
    assert flat.dtype == torch.uint8 and flat.dim() == 1 and flat.is_contiguous()
    assert flat.numel() == transport.tensor_nbytes(t)
    header = transport.tensor_header(t)
    u = transport.from_byte_view(flat.clone(), header)
    assert u.dtype == t.dtype and u.shape == t.shape
    assert torch.equal(u.detach(), t.detach())


def test_device_frame_to_bytes_accepts_arrays_of_bytes():
    # What a UCX receiver hands over is a flat uint8 device array; numpy stands in for it here.
    t = make_tensor("bfloat16")
    header = transport.tensor_header(t)
    frame = transport.as_byte_view(t).numpy().copy()
    flat = transport.device_frame_to_bytes(frame, torch.device("cpu"))
    assert flat.dtype == torch.uint8 and flat.numel() == frame.size
    assert torch.equal(transport.from_byte_view(flat, header), t)
    # A frame with a wider dtype is reinterpreted as its bytes.
    wide = transport.device_frame_to_bytes(np.arange(4, dtype=np.int32), torch.device("cpu"))
    assert wide.dtype == torch.uint8 and wide.numel() == 16


def test_from_byte_view_refuses_a_frame_of_the_wrong_size():
    header = transport.tensor_header(torch.zeros(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="holds 23 bytes.*needs 24"):
        transport.from_byte_view(torch.zeros(23, dtype=torch.uint8), header)


def test_dtype_from_name():
    assert transport.dtype_from_name("bfloat16") is torch.bfloat16
    assert transport.dtype_from_name("float8_e4m3fn") is torch.float8_e4m3fn
    for bad in ("Tensor", "float99", "nn"):
        with pytest.raises(TypeError, match="no such dtype"):
            transport.dtype_from_name(bad)


def test_header_is_msgpack_friendly():
    import msgpack

    header = transport.tensor_header(torch.nn.Parameter(torch.zeros(2, 3)))
    assert msgpack.loads(msgpack.dumps(header)) == header
    assert header["parameter"] is True and header["requires_grad"] is True


# --- registration order ----------------------------------------------------------------------------


@pytest.mark.slow
def test_registration_wins_whatever_ran_first():
    # Fresh interpreters: distributed registers its torch serializer lazily on first dispatch of a
    # torch class. Ours must win if that happened before register(), and must not be overwritten
    # when it happens after (a Parameter's MRO walk is what triggers it).
    script = textwrap.dedent(
        """
        import sys, torch
        from distributed.protocol import serialize, deserialize
        from distributed.protocol.serialize import dask_serialize
        from farm.worker import transport, transport_plugin
        if sys.argv[1] == "before":
            serialize(torch.zeros(2), serializers=["dask"])  # triggers distributed's registration
            transport.register()
        else:
            transport.register()
        p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
        h, f = serialize(p, serializers=["dask"], on_error="raise")
        q = deserialize(h, f)
        t = torch.ones(2, 2, dtype=torch.bfloat16)
        h2, f2 = serialize(t, serializers=["dask"], on_error="raise")
        assert type(q) is torch.nn.Parameter and q.dtype == torch.bfloat16, q
        assert torch.equal(deserialize(h2, f2), t)
        assert transport.is_registered()
        assert dask_serialize.dispatch(type(p)) is transport.dask_dumps_tensor
        print("ok")
        """
    )
    for order in ("before", "after"):
        out = subprocess.run(
            [sys.executable, "-c", script, order],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env_with_farm(),
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"


def _env_with_farm() -> dict[str, str]:
    import os
    from pathlib import Path

    import farm

    env = dict(os.environ)
    root = str(Path(farm.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs on the device machine)")
def test_a_gpu_piece_sent_by_value_after_its_ready_event_arrives_whole():
    """A decoded piece carries the event recorded after its kernels: the host copy waits on that event
    on a side stream, the receiving copy lands on the GPU complete (both off the default stream)."""
    piece = torch.arange(3 * 5 * 7, dtype=torch.float32, device="cuda").reshape(3, 5, 7) * 0.5
    ready = torch.cuda.Event()
    ready.record()
    setattr(piece, transport.READY_EVENT, ready)
    header, frames = transport.dask_dumps_tensor(piece)
    back = transport.dask_loads_tensor(header, frames)
    assert back.is_cuda and torch.equal(back, piece)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (runs on the device machine)")
def test_side_streams_go_before_the_decode_stream():
    """Blends and copies run on side streams of the device's highest priority: above the default
    stream the decodes queue on, and as high as any stream torch can make."""
    device = torch.device("cuda", torch.cuda.current_device())
    highest = torch.cuda.Stream(priority=-(2**20)).priority
    for role in ("blend", "share", "transfer"):
        stream = transport.side_stream(device, role)
        assert stream.priority == highest < torch.cuda.default_stream().priority
    assert transport.side_stream(device, "blend") is transport.side_stream(device, "blend")
