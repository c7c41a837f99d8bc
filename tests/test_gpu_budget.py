"""`--gpu-memory` / farm.gpu-memory: the plan is made for the budget, and each GPU worker is held to it.

The allocator cap itself needs a GPU (`benchmarks/bench_seamless.py` measures a render's peak against
it); here the planning side, the parsing and the share of the device a budget asks for.
"""

from __future__ import annotations

import re

import dask.config
import pytest

from farm.config import parse_size
from farm.errors import FarmError
from farm.planning.options import PlanOptions
from farm.worker.gpu_budget import (
    FIRST_USE_ALLOWANCE,
    allocator_cap,
    hold_gpu_memory,
    load_within_budget,
    memory_fraction,
    outside_allocator_bytes,
)
from tests.helpers import farm

GIB = 2**30
TINY_SPEC = {"family": "ltx2", "config": "ltx2-tiny", "dtype": "float32", "weights": {"random_seed": 0}}


def test_sizes_parse_as_dask_writes_them_and_nonsense_is_refused_by_name():
    assert parse_size("24GiB", "--gpu-memory") == 24 * GIB
    assert parse_size("48 GB", "--gpu-memory") == 48 * 10**9
    for bad in ("lots", "-1GiB", "12", "2PiB"):
        with pytest.raises(FarmError, match="--gpu-memory") as refused:
            parse_size(bad, "--gpu-memory")
        assert "24GiB" in str(refused.value)


def test_the_budget_comes_from_farm_gpu_memory_when_not_given():
    assert PlanOptions().worker_memory is None
    with dask.config.set({"farm.gpu-memory": "24GiB"}):
        assert PlanOptions().worker_memory == 24 * GIB
    with dask.config.set({"farm.gpu-memory": "nonsense"}), pytest.raises(FarmError, match="farm.gpu-memory"):
        PlanOptions()


def test_a_budget_holds_a_share_of_the_device_and_nothing_without_a_gpu():
    assert memory_fraction(24 * GIB, 96 * GIB) == 0.25
    assert memory_fraction(200 * GIB, 96 * GIB) == 1.0
    # the budget is the GPU's memory as nvidia-smi counts it: what the process holds beside torch's
    # allocator (its CUDA context, loaded kernels) comes off the allocator's cap
    context = 600 * 2**20
    assert outside_allocator_bytes(used=context + 10 * GIB, reserved=10 * GIB) == context
    assert outside_allocator_bytes(used=5 * GIB, reserved=6 * GIB) == 0  # never below nothing
    assert allocator_cap(24 * GIB, context, 141 * GIB) == 24 * GIB - context
    assert allocator_cap(200 * GIB, context, 141 * GIB) == 141 * GIB  # at most the device
    with pytest.raises(FarmError, match="leaves nothing for decoding") as refused:
        allocator_cap(512 * 2**20, context, 141 * GIB)
    assert "512.0 MiB" in str(refused.value) and "600.0 MiB" in str(refused.value)
    import torch

    if not torch.cuda.is_available():
        assert hold_gpu_memory(24 * GIB) is None


@pytest.fixture(scope="module")
def job_1080p(tmp_path_factory):
    """A released-size LTX-2 shot (latents only: planning reads shapes, never decodes)."""
    path = tmp_path_factory.mktemp("budget") / "job.zarr"
    made = farm("synth", str(path), "--decoder", "ltx2", "--dtype", "bfloat16", "--frames", "121", "--height",
                "1088", "--width", "1920")  # fmt: skip
    assert made.returncode == 0, made.stderr
    return path


def plan(job, *options: str) -> str:
    done = farm("plan", str(job), "--workers", "1", "--cost-model", "ltx2-h200", "--no-video", *options)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_plan_splits_a_1080p_shot_to_fit_the_budget_with_halo_tiles(job_1080p):
    whole = plan(job_1080p)
    assert "tiles 1x1x1" in whole
    budgeted = plan(job_1080p, "--gpu-memory", "24GiB")
    assert "tiles 1x1x1" not in budgeted
    assert "spatial seams: halo 8, no blend" in budgeted
    assert "render's default window on a 24.0 GiB GPU" in budgeted
    peaks = [float(p) for p in re.findall(r"peak memory per worker ([0-9.]+) GiB", budgeted)]
    assert peaks and max(peaks) <= 24.0


@pytest.mark.slow
def test_a_budget_that_is_not_a_size_is_one_line(job_1080p):
    done = farm("plan", str(job_1080p), "--gpu-memory", "big")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--gpu-memory 'big' is not a memory size" in done.stderr


class FakeCuda:
    """torch.cuda's few calls `hold_gpu_memory` makes, for one device of `total` bytes whose memory in use
    and reserved by torch's allocator the test sets (the real cap needs a GPU: bench_seamless.py)."""

    def __init__(self, total: int) -> None:
        self.total, self.used, self.reserved, self.fractions, self.settings = total, 0, 0, [], []

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return self.total - self.used, self.total

    def memory_reserved(self, device: int) -> int:
        return self.reserved

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.fractions.append(fraction)

    def set_allocator_settings(self, settings: str) -> None:
        self.settings.append(settings)


def fake_cuda(monkeypatch, total: int) -> FakeCuda:
    import torch

    from farm.worker import gpu_budget

    fake = FakeCuda(total)
    for name in ("is_available", "current_device", "mem_get_info", "memory_reserved",
                 "set_per_process_memory_fraction"):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    settings = fake.set_allocator_settings
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", settings)
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", settings, raising=False)
    monkeypatch.setattr(gpu_budget, "_held", {})
    monkeypatch.setattr(gpu_budget, "_expanding", False)
    for name in gpu_budget.ALLOCATOR_SETTINGS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return fake


def test_under_a_budget_segments_grow_in_place_unless_the_worker_has_allocator_settings(monkeypatch):
    from farm.worker import gpu_budget

    fake = fake_cuda(monkeypatch, total=96 * GIB)
    assert hold_gpu_memory(24 * GIB) is not None
    assert fake.settings == ["expandable_segments:True"]  # before the weights or any decode allocate
    assert hold_gpu_memory(24 * GIB) is not None and fake.settings == ["expandable_segments:True"]  # once
    fake.settings.clear()
    monkeypatch.setattr(gpu_budget, "_expanding", False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")  # e.g. no pidfd_getfd here
    assert hold_gpu_memory(24 * GIB) is not None and fake.settings == []
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    with dask.config.set({"farm.gpu-memory": None}):
        assert hold_gpu_memory() is None and fake.settings == []  # no budget, no cap: as torch starts


def test_the_cap_leaves_out_what_the_process_holds_beside_the_allocator_and_only_comes_down(monkeypatch):
    fake = fake_cuda(monkeypatch, total=96 * GIB)
    context = GIB // 2
    kept = context + FIRST_USE_ALLOWANCE  # beside the cap: the context, and the first decode's kernels
    fake.used = context  # a fresh worker: its CUDA context only
    assert hold_gpu_memory(24 * GIB) == 24 * GIB - kept
    assert fake.fractions == [(24 * GIB - kept) / (96 * GIB)]
    fake.used, fake.reserved = context + 10 * GIB, 10 * GIB  # decoding: the allocator's memory is its own
    assert hold_gpu_memory(24 * GIB) == 24 * GIB - kept and len(fake.fractions) == 1  # nothing to change
    fake.used += GIB // 4  # kernels loaded on first use, beside the allocator: the cap comes down
    assert hold_gpu_memory(24 * GIB) == 24 * GIB - kept - GIB // 4
    assert fake.fractions[-1] == (24 * GIB - kept - GIB // 4) / (96 * GIB)
    fake.used -= GIB // 4  # and does not go back up
    assert hold_gpu_memory(24 * GIB) == 24 * GIB - kept - GIB // 4 and len(fake.fractions) == 2
    assert hold_gpu_memory(48 * GIB) == 48 * GIB - kept  # another budget is held afresh
    assert hold_gpu_memory(200 * GIB) is None and fake.fractions[-1] == 1.0  # over the device: all of it
    with pytest.raises(FarmError, match="leaves nothing for decoding"):
        hold_gpu_memory(GIB // 2)


def test_what_loading_the_weights_loads_beside_the_allocator_is_held_before_the_first_decode(monkeypatch):
    from farm.decoders import load_decoder
    from farm.worker import gpu_budget

    fake = fake_cuda(monkeypatch, total=96 * GIB)
    context, load_kernels = GIB // 2, 92 * 2**20
    fake.used = context

    def load_with_kernels(*args, **kwargs):  # the real tiny decoder, and the kernels its load would load
        decoder = load_decoder(*args, **kwargs)
        fake.used += load_kernels
        return decoder

    monkeypatch.setattr(gpu_budget, "load_decoder", load_with_kernels)
    monkeypatch.setattr(gpu_budget, "worker_device", lambda: "cpu")  # the decoder itself: this CPU's
    with dask.config.set({"farm.gpu-memory": "24GiB"}):
        decoder = load_within_budget(TINY_SPEC)
    assert decoder is load_decoder(TINY_SPEC)
    caps = [fraction * 96 * GIB for fraction in fake.fractions]
    kept = context + FIRST_USE_ALLOWANCE
    assert caps == [24 * GIB - kept, 24 * GIB - kept - load_kernels]
