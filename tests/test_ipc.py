"""Pieces that cross between GPU workers of one host go by CUDA IPC handle (`farm.worker.ipc`).

On the CPU: when the driver shares (one host, the setting on), what a shared piece carries when pickled
and where it refuses to open (which pieces cross and are shared: test_schedule.py). The device memory
path itself needs a GPU: `test_a_shared_cuda_piece_opens_in_another_process` runs where one is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import pytest
import torch
from dask.sizeof import sizeof

from farm.errors import FarmError
from farm.planning.tiling import Batch
from farm.worker.ipc import (
    SHARED_PIECE_SIZEOF,
    Piece,
    SharedPiece,
    can_open,
    gpus_seen,
    open_piece,
    share,
    visible_gpus,
)
from farm.worker.tasks import Placement, blend_batch, ready_marked, share_piece, take_piece


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a worker without CUDA")
def test_a_worker_without_cuda_sees_no_gpu() -> None:
    assert visible_gpus() == ("", ())


def test_a_piece_opens_where_its_gpu_is_visible_on_its_host() -> None:
    a, b = "ucx://10.0.0.1:1", "ucx://10.0.0.1:2"
    assert can_open(a, b, None) and not can_open(a, "ucx://10.0.0.2:1", None)
    assert can_open(a, b, {a: ("GPU-a", ("GPU-a", "GPU-b")), b: ("GPU-b", ("GPU-b", "GPU-a"))})
    assert not can_open(a, b, {a: ("GPU-a", ("GPU-a",)), b: ("GPU-b", ("GPU-b",))})
    assert not can_open(a, b, {a: ("", ()), b: ("", ())})  # CPU workers: nothing to share
    assert not can_open(a, b, {})  # a worker that did not answer


def test_a_cpu_piece_is_passed_by_value_wrapped() -> None:
    """A CPU piece travels as itself inside a `Piece` (a farm type, so the driver that holds its future
    never unpickles a torch class)."""
    piece = torch.arange(24, dtype=torch.float32).reshape(3, 2, 2, 2)
    assert isinstance(share(piece), Piece) and share(piece).tensor is piece
    assert share_piece({0: piece, 1: piece * 2}, 0).tensor is piece
    assert take_piece({0: piece, 1: piece * 2}, 1).tensor.equal(piece * 2)
    assert open_piece(Piece(piece)) is piece
    assert open_piece(piece) is piece


def test_a_shared_piece_pickles_its_handle_only_and_refuses_another_host() -> None:
    tensor = torch.ones(3, 2, 2, 2)
    piece = SharedPiece(("args",), "this-host", os.getpid(), tuple(tensor.shape), tensor=tensor)
    assert piece.open() is tensor  # where it was made: the tensor itself
    assert sizeof(piece) == SHARED_PIECE_SIZEOF  # its bytes are counted once, in the decode result
    travelled = pickle.loads(pickle.dumps(piece))
    assert travelled.tensor is None and travelled.rebuild == ("args",) and travelled.shape == (3, 2, 2, 2)
    assert len(pickle.dumps(piece)) < 1024
    travelled.host = "another-host"
    with pytest.raises(FarmError, match="CUDA IPC works between processes of one host only"):
        travelled.open()


def _open_and_sum(shared_bytes: bytes, results) -> None:
    piece = pickle.loads(shared_bytes)
    with torch.cuda.stream(torch.cuda.Stream()):
        tensor = piece.open()
        results.put((float(tensor.sum()), tuple(tensor.shape), piece.tensor is None))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU (runs on the device machine)")
def test_a_shared_cuda_piece_opens_in_another_process() -> None:
    pieces = {3: torch.arange(3 * 4 * 8 * 8, dtype=torch.float32, device="cuda").reshape(3, 4, 8, 8) / 7}
    ready = torch.cuda.Event()
    ready.record()
    pieces[3]._farm_ready = ready  # as farm.worker.tasks marks a decode's pieces
    shared = share_piece(pieces, 3)
    assert isinstance(shared, SharedPiece) and shared.open() is pieces[3]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    reader = ctx.Process(target=_open_and_sum, args=(pickle.dumps(shared), results))
    reader.start()
    total, shape, dropped = results.get(timeout=120)
    reader.join(timeout=60)
    assert dropped and shape == (3, 4, 8, 8)
    assert total == pytest.approx(float(pieces[3].sum()), rel=1e-6)


def _pieces(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand((3, 4, 6, 8), generator=g).to(device) for _ in range(2)]


def _blended(pieces: list) -> bytes:
    batch = Batch(shot="a", index=0, start=0, stop=4, tiles=(0, 1))
    placements = [Placement(0, (0, 6), (0, 8)), Placement(0, (0, 6), (4, 12))]
    return blend_batch(batch, (6, 12), placements, pieces).rgb.tobytes()


def test_a_blend_takes_a_piece_shared_from_its_own_process_as_the_tensor() -> None:
    first, second = _pieces("cpu")
    here = SharedPiece(("args",), "this-host", os.getpid(), tuple(second.shape), tensor=second)
    assert _blended([first, here]) == _blended(_pieces("cpu"))


def _share_from_child(results, done, budget: int | None = None) -> None:
    if budget:  # a worker held to --gpu-memory: its allocator's segments grow in place (expandable segments)
        from farm.worker.gpu_budget import hold_gpu_memory

        hold_gpu_memory(budget)
    pieces = ready_marked(lambda: dict(enumerate(_pieces("cuda"))))
    results.put(pickle.dumps(share_piece(pieces, 1)))
    done.get(timeout=120)  # the piece stays alive in this process until the parent has blended it


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU (runs on the device machine)")
@pytest.mark.parametrize("budget", [None, 8 * 2**30])
def test_a_blend_of_a_piece_shared_by_another_process_gives_the_same_bytes(budget) -> None:
    ctx = mp.get_context("spawn")
    results, done = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_share_from_child, args=(results, done, budget))
    child.start()
    try:
        shared = pickle.loads(results.get(timeout=120))
        assert isinstance(shared, SharedPiece) and shared.tensor is None and shared.pid == child.pid
        first = ready_marked(lambda: {0: _pieces("cuda")[0]})[0]
        assert _blended([first, shared]) == _blended(_pieces("cuda"))
    finally:
        done.put(True)
        child.join(timeout=60)


def _share_and_exit(results) -> None:
    pieces = ready_marked(lambda: dict(enumerate(_pieces("cuda"))))
    results.put(pickle.dumps(share_piece(pieces, 1)))
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU (runs on the device machine)")
def test_a_piece_whose_process_has_gone_fails_its_blend_with_a_message() -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_share_and_exit, args=(results,))
    child.start()
    shared = pickle.loads(results.get(timeout=120))
    child.join(timeout=60)
    assert child.exitcode == 0
    with pytest.raises(FarmError, match="has gone, and its GPU memory with it"):
        _blended([_pieces("cuda")[0], shared])


def test_a_worker_that_cannot_say_which_gpus_it_sees_gets_pieces_by_value() -> None:
    class Client:  # stands in for distributed.Client.run(..., on_error="return")
        def run(self, fn, workers, on_error):
            assert fn is visible_gpus and on_error == "return"
            return {workers[0]: ("GPU-a", ("GPU-a", "GPU-b")), workers[1]: OSError("worker gone")}

    seen = gpus_seen(Client(), ["ucx://10.0.0.1:1", "ucx://10.0.0.1:2"])
    assert seen == {"ucx://10.0.0.1:1": ("GPU-a", ("GPU-a", "GPU-b")), "ucx://10.0.0.1:2": ("", ())}
    assert not can_open("ucx://10.0.0.1:2", "ucx://10.0.0.1:1", seen)
