"""Blended frames handed from a GPU worker to an I/O worker on the same host through shared memory.

A blended batch is 80-250 MB of pixels. Sent through Dask (UCX or TCP over host memory) it is copied
and framed on both sides, on the GPU worker's event loop; measured on one H200 host that took 0.18 s
per 32-frame batch and as much CPU. Instead, the blend copies the frames from the GPU straight into
files under ``/dev/shm`` (memory, not disk) and the task result that travels is a small descriptor;
the I/O worker maps the same pages. :class:`BlendedFrames` pickles to that descriptor, so Dask's
retries, spilling and task placement work unchanged. ``mark-batch`` deletes a batch's files once its
frames, video segment and images are written; the render removes its whole folder when it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from dask.sizeof import sizeof

SHARED_ROOT = Path("/dev/shm")


def shared_dir(render_id: str, root: Path = SHARED_ROOT) -> str | None:
    """The folder a render's handed-off batches live in, or None where this host has no /dev/shm."""
    return str(root / f"farm-{render_id}") if root.is_dir() else None


@dataclass(frozen=True)
class BlendedFrames:
    """A blended batch on the host: RGB frames ``[F, H, W, 3]`` (uint8 or float16) for Zarr and images,
    and, when the video codec takes them, the same frames as yuv420p planes ``[F, H*3/2, W]``.

    `shared`: the path prefix of the shared-memory files holding both arrays (then pickling sends only
    the descriptor); None when the arrays are ordinary process memory (pickled with their pixels).
    """

    rgb: np.ndarray
    yuv420: np.ndarray | None = None
    shared: str | None = None

    @property
    def nbytes(self) -> int:
        return self.rgb.nbytes + (0 if self.yuv420 is None else self.yuv420.nbytes)

    def __reduce__(self):  # noqa: ANN204
        if self.shared is None:
            return (BlendedFrames, (self.rgb, self.yuv420))
        yuv = None if self.yuv420 is None else self.yuv420.shape
        return (_open_shared, (self.shared, self.rgb.shape, self.rgb.dtype.str, yuv))

    def release(self) -> None:
        """Delete the shared-memory files (no-op for process memory); the arrays stay readable here."""
        if self.shared is not None:
            for suffix in (".rgb", ".yuv"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.shared + suffix)


@sizeof.register(BlendedFrames)
def _sizeof_blended(frames: BlendedFrames) -> int:
    return frames.nbytes + 64  # Dask's memory accounting and spilling see the pixels


def _open_shared(prefix: str, shape: tuple, dtype: str, yuv_shape: tuple | None) -> BlendedFrames:
    try:
        rgb = np.memmap(prefix + ".rgb", mode="r", dtype=np.dtype(dtype), shape=shape)
        yuv = (
            None
            if yuv_shape is None
            else np.memmap(prefix + ".yuv", mode="r", dtype=np.uint8, shape=yuv_shape)
        )
    except FileNotFoundError as exc:  # another host, or already released: Dask recomputes the blend
        raise RuntimeError(f"blended frames {prefix} are not in this host's shared memory ({exc})") from exc
    return BlendedFrames(rgb, yuv, prefix)


def allocate(prefix: str, shape: tuple, dtype: np.dtype, yuv_shape: tuple | None) -> BlendedFrames:
    """Writable shared-memory arrays for a batch (the blend copies its frames into them)."""
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    rgb = np.memmap(prefix + ".rgb", mode="w+", dtype=dtype, shape=shape)
    yuv = (
        None if yuv_shape is None else np.memmap(prefix + ".yuv", mode="w+", dtype=np.uint8, shape=yuv_shape)
    )
    return BlendedFrames(rgb, yuv, prefix)


def remove_shared_dir(path: str) -> None:
    """Remove a render's handoff folder (run on each host's workers when the render ends)."""
    shutil.rmtree(path, ignore_errors=True)
