"""The device a worker process decodes on."""

from __future__ import annotations


def worker_device() -> str:
    """This process' GPU (dask-cuda gives each worker one visible device), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
