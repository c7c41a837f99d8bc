"""Per-thread CUDA side streams and the event that marks a decoded piece complete (GPU workers only).

Kept free of a module-level torch import: the driver imports the task functions (to submit them) and
must not pay for torch; the functions here run only on workers that hold CUDA tensors.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# A decoded piece on a GPU carries, under this attribute, the CUDA event recorded right after the
# kernels that made it were queued (`farm.worker.tasks`): whoever reads it from another stream waits on that
# event only, not on the decodes queued after it.
READY_EVENT = "_farm_ready"

# Side streams run at the device's highest priority (torch maps a number below the range to it): their
# work is short (a blend, a copy) while the decode stream always has a chunk's kernels queued, and at
# equal priority a blend's kernels wait behind that chunk (docs/performance.md).
SIDE_STREAM_PRIORITY = -64

_side_streams = threading.local()  # per thread: {(role, device index): a stream of this thread's own}


def side_stream(device: torch.device, role: str) -> torch.cuda.Stream:
    """This thread's own CUDA stream on `device` for `role` (made once): work on it waits for nothing
    queued on the device's other streams unless told to, and goes before the decodes' kernels. One per
    role ("blend", "share", "transfer"), so that what one role waits for never holds up another's work
    on the same thread."""
    import torch  # a CUDA worker's: torch is loaded there long before its first side stream

    index = device.index if device.index is not None else torch.cuda.current_device()
    streams = _side_streams.__dict__.setdefault("by_role", {})
    if (role, index) not in streams:
        streams[(role, index)] = torch.cuda.Stream(device=index, priority=SIDE_STREAM_PRIORITY)
    return streams[(role, index)]
