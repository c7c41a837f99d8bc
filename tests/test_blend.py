"""Blends read decoded pieces on a stream of their own once their decode's event has fired (GPU), and
as they are on a CPU; either way the blended bytes are the same."""

from __future__ import annotations

import pytest
import torch

from farm.planning.tiling import Batch
from farm.worker.tasks import Placement, blend_batch, blend_stream, ready_marked


def pieces_of(device: str) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.rand((3, 4, 6, 8), generator=g).to(device) for k in (0, 1)}


def blended(pieces: dict[int, torch.Tensor]) -> bytes:
    batch = Batch(shot="a", index=0, start=0, stop=4, tiles=(0, 1))
    placements = [Placement(0, (0, 6), (0, 8)), Placement(0, (0, 6), (4, 12))]
    return blend_batch(batch, (6, 12), placements, [pieces[0], pieces[1]]).rgb.tobytes()


def test_cpu_pieces_are_blended_as_they_are() -> None:
    pieces = ready_marked(lambda: pieces_of("cpu"))
    assert not any(hasattr(p, "_farm_ready") for p in pieces.values())
    with blend_stream(torch.device("cpu"), list(pieces.values())):
        assert torch.zeros(1).device.type == "cpu"
    assert blended(pieces) == blended(pieces_of("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_blends_on_their_own_stream_give_the_cpus_bytes() -> None:
    pieces = ready_marked(lambda: pieces_of("cuda"))
    assert all(isinstance(p._farm_ready, torch.cuda.Event) for p in pieces.values())
    with blend_stream(pieces[0].device, list(pieces.values())):
        assert torch.cuda.current_stream() != torch.cuda.default_stream()
    unmarked = pieces_of("cuda")  # e.g. received from another worker: waits for the default stream
    assert blended(pieces) == blended(unmarked)
