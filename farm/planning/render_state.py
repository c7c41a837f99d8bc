"""The run policy of a render as a state machine: events in, instructions out.

A :class:`RenderState` runs one :class:`~farm.planning.schedule.Schedule`: which decodes go out as the
window allows, when each batch's blend goes with them (or waits for the outputs to exist), which decoded
tiles (or segments) are released once every batch they feed is written, when a shot finishes, what a
decode worker joining or leaving mid-render changes, and what a cancel stops. Its state changes only in
:meth:`RenderState.handle`, which takes one event and returns the instructions it leads to, in order.

Two shells carry the instructions out: `farm.run.graph.Driver` on a Dask cluster (events from finished
futures, instructions as `Client.submit` calls and dropped futures) and the planner's simulator on a
simulated clock (`farm.planning.planner.predict`), so `farm plan`'s predictions and the render share
one policy, worker joins included. Nothing here imports Dask, reads a clock or touches the disk.

>>> from farm.planning.schedule import make_schedule
>>> from farm.planning.tiling import Geometry, TileGrid, plan_shot, assign_round_robin
>>> shot = plan_shot("a", (8, 3, 4, 4), Geometry(8, 4), TileGrid((1, 1, 2), (0, 0, 1)))
>>> state = RenderState(make_schedule(assign_round_robin([shot], 2), n_decode=2, n_io=0), batches=[1])
>>> state.handle(Started())
[SubmitDecode(step=0, slot=0), SubmitDecode(step=1, slot=1), SubmitBlend(blend=0, slot=0)]
>>> state.handle(BatchWritten(0))
[Release(unit=(0, 0, -1)), Release(unit=(0, 1, -1)), SubmitEndOutputs(shot=0)]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farm.planning.schedule import Schedule

Unit = tuple[int, int, int]  # (shot, tile, segment): one decode step's result, `DecodeStep.unit`

# -- events ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The render begins: shots with nothing left to write finish, the first window of decodes goes."""


@dataclass(frozen=True)
class OutputsOpened:
    """The output arrays exist: blends held back until now go, and the shots' sound is decoded."""


@dataclass(frozen=True)
class BatchWritten:
    """Every output of blend ``blend`` (its position in ``schedule.blends``) is written."""

    blend: int


@dataclass(frozen=True)
class ShotFailed:
    """A task of shot ``shot`` failed: nothing more of it is submitted, its decoded tiles go."""

    shot: int


@dataclass(frozen=True)
class OutputWritten:
    """A task writing shot ``shot``'s output ``kind`` (its sound, its video's join, …) is done."""

    shot: int
    kind: str


@dataclass(frozen=True)
class WorkersJoined:
    """``count`` decode workers joined; they take the next slots (``n_workers``, ``n_workers + 1``, …)."""

    count: int


@dataclass(frozen=True)
class WorkerLeft:
    """The decode worker on slot ``slot`` left the cluster."""

    slot: int


@dataclass(frozen=True)
class RenderCancelled:
    """`farm cancel` named the render: every shot not finished stops."""


Event = (
    Started | OutputsOpened | BatchWritten | ShotFailed | OutputWritten | WorkersJoined | WorkerLeft
    | RenderCancelled
)

# -- instructions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitDecode:
    """Submit ``schedule.decodes[step]`` on decode slot ``slot`` (its own, or the slot its shot moved to)."""

    step: int
    slot: int


@dataclass(frozen=True)
class SubmitBlend:
    """Submit ``schedule.blends[blend]`` (its blend, writes and encodes), blended on decode slot ``slot``."""

    blend: int
    slot: int


@dataclass(frozen=True)
class SubmitStartOutputs:
    """Submit the tasks writing shot ``shot``'s outputs written at its start, once the output arrays
    exist (`farm.worker.writers.shot_writers("start")`: its sound)."""

    shot: int


@dataclass(frozen=True)
class Release:
    """Let go of decode step ``unit``'s result: every batch it feeds is written (or its shot stopped)."""

    unit: Unit


@dataclass(frozen=True)
class SubmitEndOutputs:
    """Every batch of shot ``shot`` is written: submit the tasks writing its outputs written after its
    last batch (`shot_writers("end")`: its video's join). The shot is done once each is written."""

    shot: int


@dataclass(frozen=True)
class ShotDone:
    """Shot ``shot`` is finished: every output written after its last batch is written."""

    shot: int


@dataclass(frozen=True)
class CancelShot:
    """Shot ``shot`` stops because the render was cancelled (its finished batches stay)."""

    shot: int


Instruction = (
    SubmitDecode | SubmitBlend | SubmitStartOutputs | Release | SubmitEndOutputs | ShotDone | CancelShot
)


class RenderState:
    """The state of one render of `schedule`, changed only by :meth:`handle`.

    `batches`: per shot (position in the plans), how many batches it writes. `sound`: the shots whose
    sound this render decodes. `pinned`: shots that never move to a joining worker (their pieces go
    between given workers by CUDA IPC handle). `outputs_open`: False while the output arrays are still
    being made; blends wait for :class:`OutputsOpened`. `end_outputs`: per shot, the outputs written
    after its last batch (its video, …); the shot is done once each is written (:class:`OutputWritten`).
    A shot without any never is: it finishes with its last batch, and nothing waits for more.

    Every event handled goes into :attr:`log` with the instructions it led to, so a render can be
    replayed (:meth:`replay`) and its decisions checked; :attr:`listeners` hear of each as it is handled.
    """

    def __init__(
        self,
        schedule: Schedule,
        batches: Sequence[int],
        *,
        sound: Collection[int] = (),
        pinned: Collection[int] = (),
        carried: Collection[int] = (),
        outputs_open: bool = True,
        end_outputs: Mapping[int, Collection[str]] | None = None,
    ) -> None:
        self.setup: dict[str, Any] = {
            "schedule": schedule, "batches": tuple(batches), "sound": tuple(sound),
            "pinned": frozenset(pinned), "carried": frozenset(carried), "outputs_open": outputs_open,
            "end_outputs": {p: frozenset(k) for p, k in (end_outputs or {}).items()},
        }  # fmt: skip
        self.log: list[tuple[Event, list[Instruction]]] = []
        # called with each event and its instructions once handled (a render's history on disk)
        self.listeners: list[Callable[[Event, list[Instruction]], None]] = []
        self.end_outputs: dict[int, frozenset[str]] = self.setup["end_outputs"]
        self.finishing: dict[int, set[str]] = {}  # shot → its end outputs not written yet
        self.schedule = schedule
        self.sound, self.pinned, self.carried = tuple(sound), frozenset(pinned), frozenset(carried)
        self.outputs_open = outputs_open
        self.window = schedule.window  # grows as decode workers join
        self.n_workers = schedule.n_decode  # decode slots ever given out: joins take the next ones
        self.left: set[int] = set()  # slots whose worker left
        self.cursor = 0  # next position in schedule.decodes
        self.held: dict[Unit, None] = {}  # decode results held, in submission order
        self.max_held = 0
        self.unwritten = schedule.releases()  # unit → batches it feeds not yet written
        self.batches_left = list(batches)
        self.failed: set[int] = set()
        self.finished: set[int] = set()
        self.deferred: list[int] = []  # blends waiting for the outputs
        self._moved: dict[int, int] = {}  # shot → the joined worker's slot it moved to
        self.shot_slots: dict[int, set[int]] = {}  # the decode and blend slots each shot uses
        for d in schedule.decodes:
            self.shot_slots.setdefault(d.shot, set()).add(d.slot)
        for b in schedule.blends:
            self.shot_slots.setdefault(b.shot, set()).add(b.slot)

    @property
    def moved(self) -> Mapping[int, int]:
        """Shots moved to a worker that joined mid-render: shot → its new slot."""
        return self._moved

    def slot_of(self, shot: int, scheduled: int) -> int:
        """Where a step of `shot` scheduled on slot `scheduled` runs."""
        return self._moved.get(shot, scheduled)

    def handle(self, event: Event) -> list[Instruction]:
        """Take one event; return the instructions it leads to, in the order to carry them out."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            names = ", ".join(t.__name__ for t in _HANDLERS)
            raise TypeError(f"RenderState.handle takes an event ({names}), not {event!r}")
        instructions = handler(self, event)
        self.log.append((event, instructions))
        for listener in self.listeners:
            listener(event, instructions)
        return instructions

    def replay(self) -> list[tuple[Event, list[Instruction]]]:
        """The log of a fresh state machine set up as this one was, given this one's events in order."""
        fresh = RenderState(**self.setup)
        for event, _ in self.log:
            fresh.handle(event)
        return fresh.log

    def _finish(self, shot: int) -> list[Instruction]:
        """Every batch of `shot` is written: its end outputs go (done once each is written)."""
        if self.end_outputs.get(shot):
            self.finishing[shot] = set(self.end_outputs[shot])
        return [SubmitEndOutputs(shot)]

    # -- the window ----------------------------------------------------------------------------------

    def _fill(self) -> list[Instruction]:
        """Decodes in schedule order while fewer than `window` results are held, each with the blends it
        completes (held back until the outputs exist)."""
        out: list[Instruction] = []
        decodes = self.schedule.decodes
        while self.cursor < len(decodes) and len(self.held) < self.window:
            i, step = self.cursor, decodes[self.cursor]
            self.cursor += 1
            if step.shot in self.failed:
                continue
            self.held[step.unit] = None
            out.append(SubmitDecode(i, self.slot_of(step.shot, step.slot)))
            out.extend(self._carry_on(i))
            self.max_held = max(self.max_held, len(self.held))
            for j in step.blends:
                if self.outputs_open:
                    out.append(self._blend(j))
                else:
                    self.deferred.append(j)
        return out

    def _carry_on(self, i: int) -> list[Instruction]:
        """A carried segment's previous segment goes once this one is submitted, if it feeds nothing
        still to write: its decoder state, handed to this one, was all it was kept for."""
        step = self.schedule.decodes[i]
        if step.shot not in self.carried or step.segment <= 0:
            return []
        before = (step.shot, step.tile, step.segment - 1)
        return self._release(before) if self.unwritten.get(before) == 0 else []

    def _blend(self, j: int) -> SubmitBlend:
        blend = self.schedule.blends[j]
        return SubmitBlend(j, self.slot_of(blend.shot, blend.slot))

    def _release(self, unit: Unit) -> list[Instruction]:
        if unit not in self.held:
            return []
        del self.held[unit]
        return [Release(unit)]

    def _stop(self, shot: int) -> list[Instruction]:
        self.failed.add(shot)
        out: list[Instruction] = []
        for unit in [u for u in self.held if u[0] == shot]:
            out.extend(self._release(unit))
        return out

    # -- events --------------------------------------------------------------------------------------

    def _on_Started(self, _: Started) -> list[Instruction]:
        out: list[Instruction] = []
        for p, n in enumerate(self.batches_left):
            if n == 0 and p not in self.sound:  # resumed after their last batch: only the video is left
                out.extend(self._finish(p))
        return out + self._fill()

    def _on_OutputsOpened(self, _: OutputsOpened) -> list[Instruction]:
        self.outputs_open = True
        out: list[Instruction] = [self._blend(j) for j in self.deferred if self.schedule.blends[j].shot
                                  not in self.failed]  # fmt: skip
        self.deferred.clear()
        for p in self.sound:  # written into OUT: once the outputs exist
            out.append(SubmitStartOutputs(p))
            if self.batches_left[p] == 0:
                out.extend(self._finish(p))
        return out

    def _on_BatchWritten(self, event: BatchWritten) -> list[Instruction]:
        blend = self.schedule.blends[event.blend]
        if blend.shot in self.failed:
            return []
        out: list[Instruction] = []
        for tile, segment in blend.pieces:
            unit = (blend.shot, tile, segment)
            self.unwritten[unit] -= 1
            if self.unwritten[unit] == 0:
                out.extend(self._release(unit))
        self.batches_left[blend.shot] -= 1
        if self.batches_left[blend.shot] == 0:
            out.extend(self._finish(blend.shot))
        return out + self._fill()

    def _on_ShotFailed(self, event: ShotFailed) -> list[Instruction]:
        if event.shot in self.failed:
            return []
        return self._stop(event.shot) + self._fill()

    def _on_OutputWritten(self, event: OutputWritten) -> list[Instruction]:
        """The shot is done once the last of its end outputs is written (one written at its start, the
        sound, changes nothing: its video's join waits for it)."""
        waiting = self.finishing.get(event.shot)
        if waiting is None or event.kind not in waiting:
            return []
        waiting.discard(event.kind)
        if waiting:
            return []
        del self.finishing[event.shot]
        self.finished.add(event.shot)
        return [ShotDone(event.shot)]

    def _on_WorkersJoined(self, event: WorkersJoined) -> list[Instruction]:
        """Every shot not started yet that one slot decodes and blends whole moves, round-robin, to the
        new slots (the others keep theirs), and the window grows by a worker's share, so the new workers'
        first decodes start at once."""
        old = self.n_workers
        self.n_workers += event.count
        self.window += -(-self.schedule.window // old) * event.count
        rest = self.schedule.decodes[self.cursor :]
        started = {d.shot for d in self.schedule.decodes[: self.cursor]}
        waiting = [p for p in dict.fromkeys(d.shot for d in rest)
                   if p not in started and p not in self.failed and p not in self.pinned
                   and p not in self._moved and len(self.shot_slots[p]) == 1]  # fmt: skip
        for i, shot in enumerate(waiting):
            turn = (i + old) % self.n_workers  # the new slots take the next shots first
            if turn >= old:
                self._moved[shot] = turn
        return self._fill()

    def _on_WorkerLeft(self, event: WorkerLeft) -> list[Instruction]:
        """Shots moved to the departed worker and not started yet go back to their scheduled slots."""
        self.left.add(event.slot)
        started = {d.shot for d in self.schedule.decodes[: self.cursor]}
        for shot in [p for p, slot in self._moved.items() if slot == event.slot and p not in started]:
            del self._moved[shot]
        return []

    def _on_RenderCancelled(self, _: RenderCancelled) -> list[Instruction]:
        out: list[Instruction] = []
        for p in range(len(self.batches_left)):
            if p not in self.finished and p not in self.failed:
                out.append(CancelShot(p))
                out.extend(self._stop(p))
        self.cursor = len(self.schedule.decodes)
        return out


# Each event's handler: the one place an event type meets the code that decides what it leads to.
_HANDLERS: dict[type, Callable[[RenderState, Any], list[Instruction]]] = {
    Started: RenderState._on_Started,
    OutputsOpened: RenderState._on_OutputsOpened,
    BatchWritten: RenderState._on_BatchWritten,
    ShotFailed: RenderState._on_ShotFailed,
    OutputWritten: RenderState._on_OutputWritten,
    WorkersJoined: RenderState._on_WorkersJoined,
    WorkerLeft: RenderState._on_WorkerLeft,
    RenderCancelled: RenderState._on_RenderCancelled,
}
