"""Keep a decode's kernel launches a few convolutions ahead of the GPU, no further.

An eager video decoder queues thousands of small kernels per call, far faster than the GPU runs them, so
the decode thread soon fills the device's launch queue and every later launch blocks until the GPU
drains it. By all the signs, the worker's other threads that launch anything meanwhile (a blend of
earlier batches, its copy to the host) wait in that queue too: on an H200 split in two by MPS, blends
whose pieces were long complete finished only with the next chunk's decode, 0.6 s later, and the
shot's writes bunched at its end; with the decode paced, they finished 0.04-0.09 s after they started
(docs/performance.md).

:class:`LaunchPacer` records an event after each convolution of the decoder and, once more than `lead`
are outstanding, waits for the oldest; ``torch.cuda.Event.synchronize`` releases the GIL, so the wait
blocks nobody else. The GPU still has `lead` convolutions of work queued, milliseconds at these sizes,
which the decode thread refills in a fraction of that. The frames are the same: only when kernels are
queued changes, not what they compute or in which order.

Off unless ``farm.launch-lead`` is set: measured so far only on one GPU split in two by MPS, where a lead
of 6 helped a 1088×1920 shot on two workers and not a 704×1216 one (too short a lead for its smaller
convolutions, or the machines differing); one GPU and two real ones are still to measure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from farm import config
from farm.errors import FarmError

# convolutions a decode may be queued ahead of the GPU when paced; each brings ~10-30 kernels (padding,
# norm, activation, the convolution), so this stays well inside the launch queue (about a thousand)
LAUNCH_LEAD = 6


def launch_lead() -> int:
    """``farm.launch-lead``: convolutions an eager GPU decode may run ahead of the GPU (0: unpaced)."""
    value = config.get("launch-lead")
    if isinstance(value, str) and value.strip().isdigit():  # DASK_FARM__LAUNCH_LEAD=8 may read as text
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FarmError(
            f"farm.launch-lead {value!r} is invalid; use a whole number of convolutions ≥ 0 (0: decodes "
            f"queue their kernels unpaced; {LAUNCH_LEAD} or more: paced)"
        )
    return value


class LaunchPacer:
    """Counts steps of one thread's GPU work and holds it at most `lead` steps ahead of the device
    (``lead = 0``: steps pass unmarked, the thread queues as far ahead as the launch queue lets it).
    `lead` may change between decodes (a probe sweeping it on a running worker).

    `make_event`: a new event object with ``record()`` (on the current stream) and ``synchronize()``;
    ``torch.cuda.Event`` on a GPU."""

    def __init__(self, make_event: Callable[[], Any], lead: int = LAUNCH_LEAD) -> None:
        if lead < 0:
            raise ValueError(f"a launch lead is a number of steps ≥ 0, got {lead}")
        self.make_event = make_event
        self.lead = lead
        self.pending: deque[Any] = deque()
        self.waits = 0  # steps waited for, for tests and probes

    def step(self) -> None:
        """One step queued: mark it, and wait for the oldest marks until at most `lead` are pending."""
        if not self.lead:
            self.pending.clear()
            return
        event = self.make_event()
        event.record()
        self.pending.append(event)
        while len(self.pending) > self.lead:
            self.pending.popleft().synchronize()
            self.waits += 1


def pace_launches(
    module: Any, lead: int = LAUNCH_LEAD, make_event: Callable[[], Any] | None = None
) -> LaunchPacer | None:
    """Pace the GPU work of `module`'s eager forward passes by its 3-D and 2-D convolutions, `lead` of
    them ahead (0: hooked but unpaced until the pacer's lead is set); None (and nothing done) when it
    does not live on a GPU, unless `make_event` is given (then hooked wherever it lives; only outputs on
    a GPU count). Inside a ``torch.compile`` trace the hooks do nothing (a compiled graph launches its
    kernels in a few fused calls), and they add no graph break."""
    import torch

    if make_event is None:
        if not any(p.is_cuda for p in module.parameters()):
            return None
        make_event = torch.cuda.Event
    pacer = LaunchPacer(make_event, lead)

    def after_conv(_module: Any, _inputs: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if isinstance(output, torch.Tensor) and output.is_cuda:
            pacer.step()

    for sub in module.modules():
        if isinstance(sub, torch.nn.Conv3d | torch.nn.Conv2d):
            sub.register_forward_hook(after_conv)
    return pacer
