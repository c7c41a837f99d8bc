"""Pieces that cross between GPU workers of one host go by CUDA IPC handle (`farm.ipc`).

On the CPU: which pieces the schedule says cross, which of them the driver shares (one host, the
setting on), what a shared piece carries when pickled and where it refuses to open. The device memory
path itself needs a GPU: `test_a_shared_cuda_piece_opens_in_another_process` runs where one is.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import dask
import pytest
import torch
from dask.sizeof import sizeof

from farm import keys
from farm.errors import FarmError
from farm.graph import shares_over_ipc
from farm.ipc import SHARED_PIECE_SIZEOF, SharedPiece, open_piece, share
from farm.schedule import make_schedule
from farm.tasks import share_piece
from farm.tiling import TileGrid
from tests.test_schedule import JOBS, drive, job


def _piece_slots(schedule):
    """(*unit, batch) → (decode slot, blend slot), from the schedule's steps."""
    blended_on = {(b.shot, b.batch): b.slot for b in schedule.blends}
    return {(*d.unit, b): (d.slot, blended_on[(d.shot, b)]) for d in schedule.decodes for b in d.feeds}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_crossing_pieces_are_those_blended_on_another_slot(name: str) -> None:
    make, n_workers, n_io = JOBS[name]
    schedule = make_schedule(make(), n_decode=n_workers, n_io=n_io)
    slots = _piece_slots(schedule)
    crossing = schedule.crossing()
    assert crossing == {piece for piece, (decoded, blended) in slots.items() if decoded != blended}
    for b in schedule.blends:  # a batch of one tile never crosses; one of several tiles on 2+ slots does
        pieces = {p for p in slots if (p[0], p[3]) == (b.shot, b.batch)}
        assert bool(pieces & crossing) == (len({slots[p][0] for p in pieces} | {b.slot}) > 1)
    if name == "whole shots":
        assert not crossing


def test_a_two_tile_shot_on_two_slots_crosses_half_its_pieces() -> None:
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))], 2, frames=9, batch_frames=8)
    schedule = make_schedule(plans, n_decode=2, n_io=0)
    pieces = _piece_slots(schedule)
    assert len(schedule.crossing()) == len(pieces) // 2  # each batch: one piece local, one from the other


def _submitted_cuts(client) -> dict[tuple, object]:
    return {s["key"][2:]: s["future"].fn for s in client.submitted if s["kind"] == keys.TILE_PIECE}


def test_the_driver_shares_exactly_the_crossing_pieces_when_its_workers_share_a_host() -> None:
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))] * 2, 2, frames=9, batch_frames=8)
    schedule, client, stats, *_ = drive(plans, 2, 0, one_host=True)
    assert stats.batches_written == len(schedule.blends) and not stats.failed
    shared = {(plans[s].shot, plans[s].tiles[t].index, b) for s, t, _, b in schedule.crossing()}
    cuts = _submitted_cuts(client)
    piece_batch = {key: plans[0].batches[0] for key in cuts}  # keys: (shot, tile, batch index)
    assert piece_batch
    by_fn = {key for key, fn in cuts.items() if fn is share_piece}
    assert by_fn == {(shot, tile, plans[0].batches[b].index) for shot, tile, b in shared}
    assert by_fn and len(by_fn) < len(cuts)


def test_no_piece_is_shared_across_hosts_or_with_the_setting_off() -> None:
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))], 2, frames=9, batch_frames=8)
    _, client, *_ = drive(plans, 2, 0)  # workers on two hosts
    assert all(fn is not share_piece for fn in _submitted_cuts(client).values())
    with dask.config.set({"farm.cuda-ipc": False}):
        _, client, *_ = drive(plans, 2, 0, one_host=True)
    assert all(fn is not share_piece for fn in _submitted_cuts(client).values())


def test_shares_over_ipc_needs_the_setting_two_workers_and_one_host() -> None:
    assert shares_over_ipc(["ucx://127.0.0.1:4001", "ucx://127.0.0.1:4002"])
    assert not shares_over_ipc(["ucx://127.0.0.1:4001"])
    assert not shares_over_ipc(["tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001"])
    with dask.config.set({"farm.cuda-ipc": False}):
        assert not shares_over_ipc(["ucx://127.0.0.1:4001", "ucx://127.0.0.1:4002"])


def test_a_cpu_piece_is_passed_as_it_is() -> None:
    piece = torch.arange(24, dtype=torch.float32).reshape(3, 2, 2, 2)
    assert share(piece) is piece
    assert share_piece({0: piece, 1: piece * 2}, 0) is piece
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
    pieces[3]._farm_ready = ready  # as farm.tasks marks a decode's pieces
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
