"""The run policy is one value: the Dask driver issues exactly its tasks, the simulator replays it.

The driver runs against a fake client here (its schedule logic, not Dask: the real-cluster renders in
test_render.py and test_resume.py run the same driver); the simulator is the planner's own.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import dask
import pytest

from farm import keys
from farm.errors import FarmError
from farm.inputs.synthetic import synth_spec
from farm.planning import costmodel
from farm.planning.planner import predict, shot_tasks, simulate_schedule
from farm.planning.schedule import LOCAL_TAIL_BATCHES, Priority, make_schedule, window_for
from farm.planning.tiling import (
    ChunkSize,
    Geometry,
    TileGrid,
    assign_round_robin,
    carried_frames,
    pending_plan,
    plan_geometry,
    plan_shot,
)
from farm.run.graph import ahead_key
from farm.store.output import Output
from farm.worker.tasks import share_piece
from tests.helpers import plans_required_window

# the decoder the fake render's tasks name (their plans are made here with GEOMETRY)
SPEC_JSON = synth_spec("ltx2-tiny").to_json()
GEOMETRY = Geometry(32, 8, True, carries=True)  # carrying matters only to plans with ChunkSize.carry


def job(grids: list[TileGrid], n_workers: int, *, frames: int = 9, batch_frames: int = 16,
        chunk: ChunkSize = ChunkSize()):  # fmt: skip
    plans = [
        plan_shot(f"s{i}", (8, frames, 6, 8), GEOMETRY, grid, batch_frames=batch_frames, chunk=chunk)
        for i, grid in enumerate(grids)
    ]
    return assign_round_robin(plans, n_workers)


JOBS = {
    "whole shots": (lambda: job([TileGrid()] * 5, 2), 2, 0),
    "spatial tiles, I/O workers": (lambda: job([TileGrid((1, 2, 2), (0, 2, 2))] * 3, 3, frames=5), 3, 2),
    "temporal tiles": (lambda: job([TileGrid((2, 1, 1), (1, 0, 0))] * 2, 2, frames=9, batch_frames=8), 2, 1),
    "streamed temporal chunks": (
        lambda: job(
            [TileGrid(), TileGrid((1, 1, 2), (0, 0, 2))],
            2,
            frames=9,
            batch_frames=8,
            chunk=ChunkSize(frames=3),
        ),
        2,
        1,
    ),
    "carried temporal chunks": (
        lambda: job(
            [TileGrid(), TileGrid((1, 1, 2), (0, 0, 2))],
            2,
            frames=9,
            batch_frames=8,
            chunk=ChunkSize(frames=3, carry=True),
        ),  # fmt: skip
        2,
        1,
    ),
    "mixed": (
        lambda: job([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2)), TileGrid((2, 1, 2), (1, 0, 2))], 4),
        4,
        3,
    ),
}


class FakeFuture:
    def __init__(self, key: tuple, fn: Any, args: tuple, fail: bool) -> None:
        self.key, self.fn, self.args = key, fn, args
        self.status = "error" if fail else "finished"

    def result(self) -> Any:
        if self.key[0] == keys.MARK_BATCH:
            return {"frames": self.args[1].frames, "write_s": 0.0, "encode_s": 0.0}
        if self.key[0] == keys.FINISH_SHOT:
            return {"video": f"{self.key[2]}.mp4"}
        if self.key[0] == keys.DECODE_AUDIO:
            return {"audio": f"{self.key[2]}.wav"}
        if self.key[0] == "write-still":
            return {"still": f"{self.key[2]}.png"}
        return None

    def exception(self) -> BaseException | None:
        return RuntimeError("boom") if self.status == "error" else None

    def add_done_callback(self, fn: Any) -> None:
        fn(self)


class FakeClient:
    """Records what the driver submits; every task 'finishes' in submission order."""

    def __init__(self, workers: list[str], io_workers: list[str], fail_shot: str | None = None) -> None:
        self.workers, self.io_workers, self.fail_shot = workers, io_workers, fail_shot
        self.submitted: list[dict[str, Any]] = []

    def submit(self, fn: Any, *args: Any, key: tuple, workers: list[str] | None = None,
               priority: int = 0, **_: Any) -> FakeFuture:  # fmt: skip
        fail = key[0] == keys.MARK_BATCH and key[2] == self.fail_shot
        worker = (workers or [None])[0]
        future = FakeFuture(key, fn, args, fail)
        self.submitted.append({"kind": key[0], "key": key, "worker": worker, "priority": priority,
                               "future": future, "options": _})  # fmt: skip
        return future

    def get_metadata(self, key: Any, default: Any = None) -> Any:
        return default

    def set_metadata(self, key: Any, value: Any) -> None:
        pass


class FifoCompletions:
    def __init__(self) -> None:
        self.queue: deque = deque()

    def add(self, fut: FakeFuture) -> None:
        self.queue.append(fut)

    def clear(self) -> None:
        self.queue.clear()

    def __iter__(self):
        while self.queue:
            fut = self.queue.popleft()
            yield fut, fut.result()


def drive(plans, n_workers: int, n_io: int, *, window: int | None = None, fail_shot: str | None = None,
          gate: bool = False, one_host: bool = False, latents_ahead: dict | None = None,
          joined: list[str] | None = None):  # fmt: skip
    """Run the driver on a fake client; workers on hosts of their own, or with `one_host` all on one;
    `joined` decode workers join once the first window is out (while the outputs are made)."""
    from farm.media.settings import VideoSettings
    from farm.run.graph import Driver, DriverOptions, RenderTargets, RenderWorkers

    workers = [f"tcp://10.0.0.{0 if one_host else i}:{1 + i}" for i in range(n_workers)]
    io_workers = [f"tcp://10.0.1.{i}:1" for i in range(n_io)]
    client = FakeClient(workers, io_workers, fail_shot)
    schedule = make_schedule(plans, n_decode=n_workers, n_io=n_io, window=window)
    targets = RenderTargets(
        job_path="job", spec_json=SPEC_JSON, out=Output(Path("out")), fps={p.shot: 24.0 for p in plans},
        video=VideoSettings(), metadata={}, finish=None,
        total_batches={p.shot: len(p.batches) for p in plans},
    )  # fmt: skip

    def outputs_ready() -> None:
        client.submitted.append({"kind": "outputs-ready", "key": ("outputs-ready",)})
        if joined:
            driver.adopt(joined)

    gate = gate or bool(joined)
    options = DriverOptions("r", completions=FifoCompletions, outputs_ready=outputs_ready if gate else None,
                            latents_ahead=latents_ahead)  # fmt: skip
    driver = Driver(client, plans, schedule, RenderWorkers(workers, io_workers), targets, options)
    stats = driver.run()
    return schedule, client, stats, workers, io_workers


@pytest.mark.parametrize("name", sorted(JOBS))
def test_driver_issues_exactly_the_schedule(name: str) -> None:
    make, n_workers, n_io = JOBS[name]
    plans = make()
    schedule, client, stats, workers, io_workers = drive(plans, n_workers, n_io)
    decodes = [s for s in client.submitted if s["kind"] == keys.DECODE_TILE]
    expected = [(plans[d.shot].shot, plans[d.shot].tiles[d.tile].index,
                 *([d.segment] if d.segment >= 0 else []), workers[d.slot])
                for d in schedule.decodes]  # fmt: skip
    assert [(*s["key"][2:], s["worker"]) for s in decodes] == expected
    assert [s["priority"] for s in decodes] == [d.priority for d in schedule.decodes]
    blends = [s for s in client.submitted if s["kind"] == keys.BLEND_BATCH]
    assert [(s["key"][2], s["key"][3], s["worker"]) for s in blends] == [
        (plans[b.shot].shot, plans[b.shot].batches[b.batch].index, workers[b.slot]) for b in schedule.blends
    ]
    writes = [s for s in client.submitted if s["kind"] == keys.WRITE_BATCH]
    assert [s["worker"] for s in writes] == [
        io_workers[b.io] if b.io is not None else workers[b.slot] for b in schedule.blends
    ]
    assert {s["priority"] for s in blends} == {Priority.BLEND}
    assert {s["priority"] for s in writes} == {Priority.OUTPUT}
    # every decode before the blends it completes, and never more tiles held than the window
    order = [(s["kind"], *s["key"][2:4]) for s in client.submitted]
    submitted = [(s["kind"], *s["key"][2:]) for s in client.submitted]
    for d in schedule.decodes:
        part = [d.segment] if d.segment >= 0 else []
        at = submitted.index((keys.DECODE_TILE, plans[d.shot].shot, plans[d.shot].tiles[d.tile].index, *part))
        for i in d.blends:
            b = schedule.blends[i]
            name = (plans[b.shot].shot, plans[b.shot].batches[b.batch].index)
            assert order.index((keys.BLEND_BATCH, *name)) > at
    assert 1 <= stats.max_tiles_held <= schedule.window
    assert stats.batches_written == len(schedule.blends) and not stats.failed
    assert all(o.video for o in stats.shots.values())
    assert stats.tiles_decoded == len(schedule.decodes)


def test_driver_holds_the_window_and_skips_a_failed_shot() -> None:
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))] * 4, 2, frames=5)
    schedule, client, stats, *_ = drive(plans, 2, 0, window=plans_required_window(plans), fail_shot="s1")
    assert stats.max_tiles_held <= schedule.window == plans_required_window(plans)
    assert [o.shot for o in stats.failed] == ["s1"] and "boom" in stats.shots["s1"].error
    assert stats.shots["s0"].video and stats.shots["s3"].video and not stats.shots["s1"].video


@pytest.mark.parametrize("name", sorted(JOBS))
def test_simulator_replays_the_schedule(name: str) -> None:
    make, n_workers, n_io = JOBS[name]
    plans = make()
    schedule = make_schedule(plans, n_decode=n_workers, n_io=n_io)
    cost = costmodel.load("ltx2-tiny-cpu")
    shots = [shot_tasks(p, cost, None, plan_geometry(p)) for p in plans]
    trace = simulate_schedule(shots, schedule, cost, output=True)["trace"]
    assert [(p, k, w) for kind, p, k, w in trace if kind == "decode"] == [
        (d.shot, d.tile, d.slot) for d in schedule.decodes
    ]
    blend_at = {(b.shot, b.batch): b for b in schedule.blends}
    for kind, p, k, w in trace:
        if kind == "blend":
            assert w == blend_at[(p, k)].slot
        elif kind in ("write", "encode"):
            io = blend_at[(p, k)].io
            assert w == (blend_at[(p, k)].slot if io is None else n_workers + io)
    blended = sorted((p, k) for kind, p, k, _ in trace if kind == "blend")
    assert blended == sorted(blend_at)


def test_prediction_follows_the_schedule_window() -> None:
    plans = job([TileGrid()] * 6, 2)
    cost = costmodel.load("ltx2-tiny-cpu")
    tight = predict(plans, 2, cost, window=1)
    loose = predict(plans, 2, cost, window=8)
    assert tight.makespan_s >= loose.makespan_s


def test_schedule_values_are_validated() -> None:
    plans = job([TileGrid()], 1)
    with pytest.raises(FarmError, match="no decode workers"):
        make_schedule(plans, n_decode=0, n_io=2)
    with pytest.raises(FarmError, match="--window"):
        window_for(1, 2, 0)
    assert window_for(1, 3) == 6 and window_for(9, 3) == 9 and window_for(1, 3, 4) == 4


def test_first_decodes_start_before_the_outputs_exist_and_no_blend_does() -> None:
    plans = job([TileGrid()] * 5, 2)
    schedule, client, stats, *_ = drive(plans, 2, 1, gate=True)
    kinds = [s["kind"] for s in client.submitted]
    ready = kinds.index("outputs-ready")
    assert kinds[:ready].count(keys.DECODE_TILE) == min(schedule.window, len(schedule.decodes))
    assert keys.BLEND_BATCH not in kinds[:ready] and keys.WRITE_BATCH not in kinds[:ready]
    blends = [s for s in client.submitted if s["kind"] == keys.BLEND_BATCH]
    assert [(s["key"][2], s["key"][3]) for s in blends] == [
        (plans[b.shot].shot, plans[b.shot].batches[b.batch].index) for b in schedule.blends
    ]
    assert stats.batches_written == len(schedule.blends) and not stats.failed


def test_streamed_tiles_decode_segment_by_segment() -> None:
    """A tile split into temporal chunks is one decode per chunk; each batch is submitted right after
    the chunk that completes it, not after the whole tile."""
    plans = job([TileGrid()], 1, frames=9, batch_frames=8, chunk=ChunkSize(frames=3))
    streamed = make_schedule(plans, n_decode=1, n_io=0)
    whole = make_schedule(plans, n_decode=1, n_io=0, stream=False)
    assert len(whole.decodes) == 1 and whole.decodes[0].segment == -1
    assert [d.segment for d in streamed.decodes] == list(range(len(streamed.decodes)))
    assert len(streamed.decodes) > 2
    # the first batch leaves after an early segment, the last after the last one
    first = next(d for d in streamed.decodes if d.blends)
    assert first.segment < streamed.decodes[-1].segment
    frames = [d.frames for d in streamed.decodes]
    assert frames[0][0] == 0 and frames[-1][1] == plans[0].pixel_shape[0]
    assert all(a[1] > b[0] for a, b in zip(frames, frames[1:], strict=False))  # chunks overlap: no gaps
    assert sum(d.share for d in streamed.decodes) == pytest.approx(1.0)
    # every batch sums its pieces per tile, in segment order
    for b in streamed.blends:
        segs = [s for _, s in b.pieces]
        assert segs == sorted(segs)
    cost = costmodel.load("ltx2-tiny-cpu")
    shots = [shot_tasks(p, cost, None, plan_geometry(p)) for p in plans]
    assert simulate_schedule(shots, streamed, cost, output=True)["makespan"] > 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: TileGrid((0, 1, 1)),
        lambda: TileGrid((1, 2, 2), (0, -1, 0)),
        lambda: TileGrid((1, 2)),  # type: ignore[arg-type]
        lambda: ChunkSize(frames=0),
        lambda: ChunkSize(height=2.5),  # type: ignore[arg-type]
        lambda: ChunkSize(overlap=(1, -2, 2)),
    ],
)
def test_tiling_values_are_validated_where_they_are_built(make) -> None:
    with pytest.raises(FarmError, match="must be|is invalid"):
        make()


def test_carried_segments_run_in_order_and_a_resume_still_decodes_their_state() -> None:
    """Carried chunks: one decode per chunk, no overlap, shares by own frames; a resumed plan whose
    first batches are done still decodes the first chunks (the later ones start from their state),
    while overlapping chunks that feed nothing are skipped."""
    carrying = Geometry(32, 8, True, carries=True)

    def plan(chunk: ChunkSize):
        return assign_round_robin([plan_shot("s", (8, 9, 6, 8), carrying, batch_frames=8, chunk=chunk)], 1)

    carried = plan(ChunkSize(frames=3, carry=True, taper=False))  # even chunks: 3, 3, 3
    full = make_schedule(carried, n_decode=1, n_io=0)
    assert [d.segment for d in full.decodes] == [0, 1, 2]
    frames = [d.frames for d in full.decodes]
    assert frames == [(0, 17), (17, 41), (41, 65)] and [d.share for d in full.decodes] == [3 / 9] * 3
    done = set(range(4))  # batches 0-3 (frames 0-31) done: the first chunk feeds nothing left
    resumed = make_schedule([pending_plan(carried[0], done)], n_decode=1, n_io=0)
    # feeds: positions in the pending batches 4-8 (frames 32-39, 40-47, … 64)
    assert [(d.segment, d.feeds) for d in resumed.decodes] == [(0, ()), (1, (0, 1)), (2, (1, 2, 3, 4))]
    # the last batches done instead: the chunks after the last one feeding a batch are not decoded
    tail_done = make_schedule([pending_plan(carried[0], set(range(3, 9)))], n_decode=1, n_io=0)
    assert [(d.segment, d.feeds) for d in tail_done.decodes] == [(0, (0, 1, 2)), (1, (2,))]
    overlapping = [pending_plan(plan(ChunkSize(frames=3))[0], done)]
    assert 0 not in [d.segment for d in make_schedule(overlapping, n_decode=1, n_io=0).decodes]


def test_a_carried_segment_takes_the_previous_segments_decode_on_the_same_worker() -> None:
    """The driver hands each carried segment the decode of the segment before it (whose result holds
    the decoder state) and pins it to the same worker; the first segment gets none."""
    plans = JOBS["carried temporal chunks"][0]()
    _, client, stats, _, _ = drive(plans, 2, 1)
    decodes = [s for s in client.submitted if s["kind"] == keys.DECODE_TILE]
    by_tile: dict[tuple, list[dict]] = {}
    for s in decodes:
        by_tile.setdefault(s["key"][2:4], []).append(s)
    n = len(carried_frames(9, 3))  # 9 latent frames by 3, tapered: 3, 3, 2, 1
    assert n == 4 and len(by_tile) == 3 and all(len(segs) == n for segs in by_tile.values())
    for segs in by_tile.values():
        assert [s["key"][4] for s in segs] == list(range(n))
        previous = [s["future"].args[-2] for s in segs]  # decode_tile's `previous` (then `ahead`)
        assert previous == [None] + [s["future"] for s in segs[:-1]]
        assert len({s["worker"] for s in segs}) == 1
    assert stats.batches_written == sum(len(p.batches) for p in plans) and not stats.failed


def test_a_latent_read_ahead_goes_to_the_decode_it_was_read_for_only() -> None:
    """`read_first_latents`' futures reach the decodes of their units (decode_tile's `ahead`), once."""
    plans = JOBS["carried temporal chunks"][0]()
    schedule = make_schedule(plans, n_decode=2, n_io=1)
    firsts = {}
    for step in schedule.decodes:
        firsts.setdefault(step.slot, ahead_key(plans[step.shot], step))
    ahead = {key: ("read", key) for key in firsts.values()}
    _, client, stats, _, _ = drive(plans, 2, 1, latents_ahead=ahead)
    decodes = [s for s in client.submitted if s["kind"] == keys.DECODE_TILE]
    given = {ahead_key(plans[d.shot], d): s["future"].args[-1]
             for d, s in zip(schedule.decodes, decodes, strict=True)}  # fmt: skip
    assert {key: a for key, a in given.items() if a is not None} == ahead
    assert sum(a is None for a in given.values()) == len(decodes) - 2 and not stats.failed


def test_each_decode_slots_last_batch_is_written_where_it_was_blended() -> None:
    """Writes go round-robin over the I/O workers, except the batches a decode slot's last decode
    completes (up to LOCAL_TAIL_BATCHES, else its last): sending them would be the render's tail
    (nothing left to hide the transfer)."""
    carried = job([TileGrid()], 1, frames=9, batch_frames=8, chunk=ChunkSize(frames=3, carry=True))
    schedule = make_schedule(carried, n_decode=1, n_io=2)
    ios = [b.io for b in schedule.blends]
    at_the_end = set(schedule.decodes[-1].blends)  # the last segment (1 latent frame) completes 2 batches
    assert len(at_the_end) == 2 and LOCAL_TAIL_BATCHES >= 2
    assert [k for k, io in enumerate(ios) if io is None] == sorted(at_the_end) == [len(ios) - 2, len(ios) - 1]
    assert set(ios[:-2]) == {0, 1}
    # a whole tile: every batch leaves after its one decode (more than LOCAL_TAIL_BATCHES); the last stays
    whole = make_schedule(job([TileGrid()], 1, frames=9, batch_frames=8), n_decode=1, n_io=2)
    assert [b.io is None for b in whole.blends] == [False] * (len(whole.blends) - 1) + [True]
    # several shots on two slots: only the last batch of each slot's last decode, not of earlier shots
    shots = make_schedule(job([TileGrid()] * 4, 2, batch_frames=8), n_decode=2, n_io=1)
    local = [(b.shot, b.batch) for b in shots.blends if b.io is None]
    last = {b.slot: (b.shot, b.batch) for b in shots.blends}
    assert sorted(local) == sorted(last.values()) and {shot for shot, _ in local} == {2, 3}
    # without I/O workers every write is already where its batch was blended
    assert all(b.io is None for b in make_schedule(carried, n_decode=1, n_io=0).blends)
    # the simulator replays the same placement: the local write runs on the decode worker's threads
    cost = costmodel.load("ltx2-tiny-cpu")
    shots_tasks = [shot_tasks(p, cost, None, plan_geometry(p)) for p in carried]
    assert simulate_schedule(shots_tasks, schedule, cost, output=True)["makespan"] > 0


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
    assert crossing == {piece: (decoded, blended) for piece, (decoded, blended) in slots.items()
                        if decoded != blended}  # fmt: skip
    for b in schedule.blends:  # a batch of one tile never crosses; one of several tiles on 2+ slots does
        pieces = {p for p in slots if (p[0], p[3]) == (b.shot, b.batch)}
        assert bool(pieces & crossing.keys()) == (len({slots[p][0] for p in pieces} | {b.slot}) > 1)
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
    shared = {(plans[s].shot, plans[s].tiles[t].index, plans[s].batches[b].index)
              for s, t, _, b in schedule.crossing()}  # fmt: skip
    cuts = _submitted_cuts(client)  # (shot, tile, batch index) → the function that cuts the piece
    assert {key for key, fn in cuts.items() if fn is share_piece} == shared
    assert shared and len(shared) < len(cuts)


def test_between_hosts_pieces_go_by_value_and_within_one_by_handle() -> None:
    from farm.run.graph import shared_over_ipc

    plans = job([TileGrid((1, 2, 2), (0, 2, 2))] * 2, 4, frames=9, batch_frames=8)
    schedule = make_schedule(plans, n_decode=4, n_io=0)
    workers = ["ucx://10.0.0.1:1", "ucx://10.0.0.1:2", "ucx://10.0.0.2:1", "ucx://10.0.0.2:2"]  # two hosts
    shared = shared_over_ipc(schedule, workers)
    host = [w.split(":")[1] for w in workers]
    within = {p for p, (a, b) in schedule.crossing().items() if host[a] == host[b]}
    assert shared == within and within and len(within) < len(schedule.crossing())
    assert shared_over_ipc(schedule, ["ucx://127.0.0.1:1", "ucx://127.0.0.1:2", "ucx://127.0.0.1:3",
                                      "ucx://127.0.0.1:4"]) == schedule.crossing().keys()  # fmt: skip
    with dask.config.set({"farm.cuda-ipc": False}):
        assert shared_over_ipc(schedule, workers) == set()


def test_pieces_are_shared_only_with_workers_that_see_the_decoding_gpu() -> None:
    from farm.run.graph import shared_over_ipc

    plans = job([TileGrid((1, 1, 2), (0, 0, 2))] * 2, 2, frames=9, batch_frames=8)
    schedule = make_schedule(plans, n_decode=2, n_io=0)
    workers = ["ucx://127.0.0.1:1", "ucx://127.0.0.1:2"]
    every_gpu = {workers[0]: ("GPU-a", ("GPU-a", "GPU-b")), workers[1]: ("GPU-b", ("GPU-b", "GPU-a"))}
    own_only = {workers[0]: ("GPU-a", ("GPU-a",)), workers[1]: ("GPU-b", ("GPU-b",))}
    one_gpu_shared = {workers[0]: ("GPU-a", ("GPU-a",)), workers[1]: ("GPU-a", ("GPU-a",))}
    cpu = {w: ("", ()) for w in workers}
    # dask-cuda's way: every worker sees every GPU
    assert shared_over_ipc(schedule, workers, lambda: every_gpu) == schedule.crossing().keys()
    assert shared_over_ipc(schedule, workers, lambda: one_gpu_shared) == schedule.crossing().keys()
    # CUDA_VISIBLE_DEVICES of one GPU each
    assert shared_over_ipc(schedule, workers, lambda: own_only) == set()
    assert shared_over_ipc(schedule, workers, lambda: cpu) == set()
    seen_by_one = {workers[0]: ("GPU-a", ("GPU-a",)), workers[1]: ("GPU-b", ("GPU-b", "GPU-a"))}
    # only worker 1 can open worker 0's pieces
    assert shared_over_ipc(schedule, workers, lambda: seen_by_one) == {
        p for p, (decoded, _) in schedule.crossing().items() if decoded == 0
    }


def test_no_piece_is_shared_across_hosts_or_with_the_setting_off() -> None:
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))], 2, frames=9, batch_frames=8)
    _, client, *_ = drive(plans, 2, 0)  # workers on two hosts
    assert all(fn is not share_piece for fn in _submitted_cuts(client).values())
    with dask.config.set({"farm.cuda-ipc": False}):
        _, client, *_ = drive(plans, 2, 0, one_host=True)
    assert all(fn is not share_piece for fn in _submitted_cuts(client).values())


def test_the_workers_gpus_are_asked_only_when_a_piece_crosses_within_a_host() -> None:
    from farm.run.graph import shared_over_ipc

    asked: list[int] = []

    def gpus() -> dict:
        asked.append(1)
        return {}

    crossing = make_schedule(
        job([TileGrid((1, 1, 2), (0, 0, 2))], 2, frames=9, batch_frames=8), n_decode=2, n_io=0
    )
    whole = make_schedule(job([TileGrid()] * 2, 2), n_decode=2, n_io=0)
    assert shared_over_ipc(whole, ["ucx://127.0.0.1:1", "ucx://127.0.0.1:2"], gpus) == set() and not asked
    assert shared_over_ipc(crossing, ["ucx://10.0.0.1:1", "ucx://10.0.0.2:1"], gpus) == set() and not asked
    assert shared_over_ipc(crossing, ["ucx://127.0.0.1:1", "ucx://127.0.0.1:2"], gpus) == set()
    assert asked == [1]  # asked once: its empty answer shares nothing


def test_a_zarr_only_batch_is_written_and_marked_by_one_task_on_its_io_worker() -> None:
    """Without video or images, each batch's write and mark are one task (no round trip between them),
    keyed as its mark and placed where the write would go."""
    from farm.media.settings import VideoSettings
    from farm.run.graph import Driver, DriverOptions, RenderTargets, RenderWorkers
    from farm.worker.tasks import write_and_mark_batch

    plans = job([TileGrid()] * 2, 1, frames=9, batch_frames=8)
    workers, io_workers = ["tcp://10.0.0.1:1"], ["tcp://10.0.1.1:1", "tcp://10.0.1.2:1"]
    client = FakeClient(workers, io_workers)
    schedule = make_schedule(plans, n_decode=1, n_io=2)
    targets = RenderTargets(job_path="job", spec_json=SPEC_JSON, out=Output(Path("out")),
                            fps={p.shot: 24.0 for p in plans}, video=VideoSettings(enabled=False),
                            metadata={}, finish=None,
                            total_batches={p.shot: len(p.batches) for p in plans})  # fmt: skip
    options = DriverOptions("r", completions=FifoCompletions)
    stats = Driver(client, plans, schedule, RenderWorkers(workers, io_workers), targets, options).run()
    assert stats.batches_written == len(schedule.blends) and not stats.failed
    kinds = [s["kind"] for s in client.submitted]
    assert keys.WRITE_BATCH not in kinds and keys.ENCODE_SEGMENT not in kinds
    marks = [s for s in client.submitted if s["kind"] == keys.MARK_BATCH]
    assert len(marks) == len(schedule.blends) and all(m["future"].fn is write_and_mark_batch for m in marks)
    where = [io_workers[b.io] if b.io is not None else workers[b.slot] for b in schedule.blends]
    assert [m["worker"] for m in marks] == where


def test_a_split_shots_tiles_start_together_on_their_workers() -> None:
    """A streamed shot split over workers submits every tile's first segment before any tile's second:
    the driver's client calls for one tile's segments (pieces, blends) no longer delay the next worker's
    first decode. Within a tile the segments keep their order, and a worker holding both tiles still
    runs the lower tile first (priority)."""
    carried = ChunkSize(frames=2, carry=True)
    for n_workers in (2, 1):
        plans = job([TileGrid((1, 1, 2), (0, 0, 2))], n_workers, frames=9, batch_frames=8, chunk=carried)
        decodes = make_schedule(plans, n_decode=n_workers, n_io=1).decodes
        assert [(d.tile, d.segment) for d in decodes[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
        assert {d.slot for d in decodes[:2]} == set(range(n_workers))
        for tile in (0, 1):  # 9 latent frames in segments of 2: five each, in order
            assert [d.segment for d in decodes if d.tile == tile] == list(range(5))
        assert all(d.priority == Priority.DECODE - plans[0].tiles[d.tile].index for d in decodes)
        # each batch still goes with the decode of its last piece, and the driver writes every batch
        submitted_with = {b: i for i, d in enumerate(decodes) for b in d.blends}
        schedule = make_schedule(plans, n_decode=n_workers, n_io=1)
        position = {d.unit: i for i, d in enumerate(decodes)}
        for k, blend in enumerate(schedule.blends):
            assert submitted_with[k] == max(position[(blend.shot, t, s)] for t, s in blend.pieces)
        _, _, stats, _, _ = drive(plans, n_workers, 1)
        assert stats.batches_written == len(plans[0].batches) and not stats.failed


@pytest.mark.parametrize("n_workers, joined", [(1, 1), (2, 1), (2, 2)])
def test_driver_and_simulator_move_the_same_shots_to_a_joined_worker(n_workers: int, joined: int) -> None:
    """A decode worker joining mid-render: the driver (adopting it) and the simulator (`predict`'s
    joins) run one state machine, so the same decodes go to the same workers."""
    plans = job([TileGrid()] * 5 + [TileGrid((1, 1, 2), (0, 0, 2))] + [TileGrid()] * 3, n_workers)
    new = [f"tcp://10.0.9.{i}:1" for i in range(joined)]
    schedule, client, stats, workers, _ = drive(plans, n_workers, 0, window=2, joined=new)
    assert stats.batches_written == len(schedule.blends) and not stats.failed
    slot = {w: k for k, w in enumerate(workers + new)}
    by_driver = sorted((s["key"][2], s["key"][3], slot[s["worker"]])
                       for s in client.submitted if s["kind"] == keys.DECODE_TILE)  # fmt: skip
    cost = costmodel.load("ltx2-tiny-cpu")
    shots = [shot_tasks(p, cost, None, plan_geometry(p)) for p in plans]
    trace = simulate_schedule(shots, schedule, cost, output=True, joins=[(0.0, joined)])["trace"]
    by_simulator = sorted((plans[p].shot, plans[p].tiles[k].index, w)
                          for kind, p, k, w in trace if kind == "decode")  # fmt: skip
    assert by_driver == by_simulator
    assert {w for *_, w in by_driver} == set(range(n_workers + joined))  # the joined workers decode


def test_the_driver_submits_each_shot_writer_at_its_time_with_the_arguments_it_builds() -> None:
    """Shot outputs come from their writers' table: the sound of the shots whose sound this render writes
    once the outputs exist, on the shot's decode worker with the render's retries; each video after its
    shot's last batch, waiting for the sound decoded in this render and muxing the shot's sound file
    either way; none where the shot has batches left to a later render (`finish`)."""
    from farm.media.settings import VideoSettings
    from farm.run.graph import Driver, DriverOptions, RenderTargets, RenderWorkers, Sound
    from farm.worker.writers import SHOT_WRITERS, ShotContext, shot_writers

    plans = job([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2)), TileGrid()], 2, frames=9, batch_frames=8)
    workers, io_workers = ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"], ["tcp://10.0.1.1:1"]
    client = FakeClient(workers, io_workers)
    targets = RenderTargets(
        job_path="job", spec_json=SPEC_JSON, out=Output(Path("out")), fps={p.shot: 24.0 for p in plans},
        video=VideoSettings(), metadata={"comment": "c"},
        total_batches={p.shot: len(p.batches) for p in plans}, finish={"s0", "s1"}, retries=3,
        sound=Sound({"config": "a"}, frozenset({"s0", "s1"}), "flac"),
        timecodes={"s1": "01:00:00:00"}, writes={"sound": {"s0"}, "video": {"s0", "s1", "s2"}},
    )  # fmt: skip
    finished: list[str] = []
    options = DriverOptions("r", completions=FifoCompletions, on_shot_finished=finished.append,
                            outputs_ready=lambda: client.submitted.append({"kind": "outputs-ready"}))
    schedule = make_schedule(plans, n_decode=2, n_io=1)
    stats = Driver(client, plans, schedule, RenderWorkers(workers, io_workers), targets, options).run()
    assert [w.kind.name for w in shot_writers("start")] == ["sound"]
    assert [w.kind.name for w in shot_writers("end")] == ["video"]

    kinds = [s["kind"] for s in client.submitted]
    shot_tasks = [s for s in client.submitted if s["kind"] in (keys.DECODE_AUDIO, keys.FINISH_SHOT)]
    assert [(s["kind"], s["key"][2]) for s in shot_tasks] == [(keys.DECODE_AUDIO, "s0")] + [
        (keys.FINISH_SHOT, shot) for shot in ("s0", "s1")
    ]  # s2's video waits for its later batches; s1's sound is in OUT already
    sound, *videos = shot_tasks
    assert kinds.index("outputs-ready") < kinds.index(keys.DECODE_AUDIO)  # written into OUT once it exists
    for video in videos:  # after the shot's last batch is marked
        marks = [i for i, s in enumerate(client.submitted) if s["kind"] == keys.MARK_BATCH
                 and s["key"][2] == video["key"][2]]  # fmt: skip
        assert client.submitted.index(video) > max(marks)

    for task, writer, waited in [(sound, SHOT_WRITERS["sound"], ()), (videos[0], SHOT_WRITERS["video"],
                                 (sound["future"],)), (videos[1], SHOT_WRITERS["video"], ())]:  # fmt: skip
        plan = next(p for p in plans if p.shot == task["key"][2])
        context = ShotContext(targets, plan)
        assert task["future"].fn is writer.task and task["key"] == (writer.key, "r", plan.shot)
        assert task["future"].args == (*writer.args(context), *waited)
        assert {k: task["options"][k] for k in writer.keywords(context)} == writer.keywords(context)
        assert task["priority"] == Priority.FINISH
    frames = 8 * (9 - 1) + 1  # 9 latent frames, 8 frames to each after the first
    assert sound["future"].args == ("job", {"config": "a"}, targets.out, "s0", frames, 24.0, "flac", True)
    assert sound["worker"] == workers[0] and sound["options"]["retries"] == 3
    assert videos[0]["worker"] is None and "retries" not in videos[0]["options"]
    assert videos[1]["future"].args[3] == {"comment": "c", "timecode": "01:00:00:00"}
    muxed = [str(Path("out/audio") / f"{shot}.flac") for shot in ("s0", "s1")]
    assert [v["options"]["sound"] for v in videos] == muxed

    assert stats.shots["s0"].files == {"sound": "s0.wav", "video": "s0.mp4"}
    assert stats.shots["s1"].files == {"video": "s1.mp4"} and stats.shots["s1"].video == "s1.mp4"
    assert stats.shots["s2"].files == {} and finished == ["s0", "s1"]


def test_a_shot_finishes_once_every_output_written_after_its_last_batch_is(monkeypatch) -> None:
    """A second writer run after the shot's last batch (a new kind's): the driver submits it beside the
    video from the table alone, and the shot finishes (its timeline entry) once both are written."""
    from dataclasses import replace

    from farm.media.settings import VideoSettings
    from farm.run.graph import Driver, DriverOptions, RenderTargets, RenderWorkers
    from farm.store.output_kinds import ShotOutput
    from farm.worker import writers

    still = ShotOutput("still", asked=lambda outputs: True, file=lambda out, shot, suffix: out.root / shot,
                       suffixes=lambda out, recorded: (".png",), every_suffix=lambda: (".png",),
                       marker=lambda out, shot: out.done_dir(shot) / "still",
                       written_suffix=lambda out, outputs: ".png")  # fmt: skip
    still_writer = replace(writers.SHOT_WRITERS["video"], kind=still, key="write-still", reports="still",
                           args=lambda c: (c.targets.out, c.shot), keywords=lambda c: {},
                           waits_on=("video",))  # fmt: skip
    monkeypatch.setitem(writers.SHOT_WRITERS, "still", still_writer)
    plans = job([TileGrid()], 1)
    client = FakeClient(["tcp://10.0.0.1:1"], [])
    targets = RenderTargets(job_path="job", spec_json=SPEC_JSON, out=Output(Path("out")), fps={"s0": 24.0},
                            video=VideoSettings(), metadata={}, finish=None,
                            total_batches={"s0": 1})  # fmt: skip
    finished: list[tuple[str, list[str]]] = []  # each shot finished, with the files written by then

    def on_shot_finished(shot: str) -> None:
        finished.append((shot, sorted(driver.stats.shots[shot].files)))

    options = DriverOptions("r", completions=FifoCompletions, on_shot_finished=on_shot_finished)
    schedule = make_schedule(plans, n_decode=1, n_io=0)
    driver = Driver(client, plans, schedule, RenderWorkers(["tcp://10.0.0.1:1"]), targets, options)
    driver.run()
    video, still_task = [s for s in client.submitted if s["kind"] in (keys.FINISH_SHOT, "write-still")]
    assert video["kind"] == keys.FINISH_SHOT
    assert still_task["future"].args == (targets.out, "s0", video["future"])  # waits for the video
    assert finished == [("s0", ["still", "video"])]
