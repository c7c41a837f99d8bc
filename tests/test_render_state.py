"""The render's policy as a state machine, driven by event sequences alone: no cluster, no clock.

The same state machine runs inside `farm.run.graph.Driver` (test_schedule.py drives that against a
fake client, test_render.py on real clusters) and the planner's simulator (`predict`, below).
"""

from __future__ import annotations

import random

import pytest

from farm.errors import FarmError
from farm.planning import costmodel
from farm.planning.planner import predict
from farm.planning.render_state import (
    BatchWritten,
    CancelShot,
    OutputsOpened,
    OutputWritten,
    Release,
    RenderCancelled,
    RenderState,
    ShotDone,
    ShotFailed,
    Started,
    SubmitBlend,
    SubmitDecode,
    SubmitEndOutputs,
    SubmitStartOutputs,
    WorkerLeft,
    WorkersJoined,
)
from farm.planning.schedule import make_schedule
from farm.planning.tiling import (
    ChunkSize,
    Geometry,
    TileGrid,
    assign_round_robin,
    pending_plan,
    plan_shot,
)

GEOMETRY = Geometry(32, 8, True, carries=True)


def job(grids: list[TileGrid], n_workers: int, *, frames: int = 2, batch_frames: int = 16,
        chunk: ChunkSize = ChunkSize()):  # fmt: skip
    plans = [
        plan_shot(f"s{i}", (8, frames, 6, 8), GEOMETRY, grid, batch_frames=batch_frames, chunk=chunk)
        for i, grid in enumerate(grids)
    ]
    return assign_round_robin(plans, n_workers)


def state_of(plans, n_workers: int, *, window: int | None = None, **kwargs) -> RenderState:
    schedule = make_schedule(plans, n_decode=n_workers, n_io=0, window=window)
    return RenderState(schedule, [len(p.batches) for p in plans], **kwargs)


def of(kind, instructions) -> list:
    return [i for i in instructions if isinstance(i, kind)]


def run_to_end(state: RenderState, seed: int = 0) -> list:
    """Start the render, then write the submitted batches in a shuffled order until none is left;
    every instruction in order. Checks on the way: never more results held than the window, and a
    release only once every batch the result feeds is written."""
    rng = random.Random(seed)
    schedule = state.schedule
    written: set[int] = set()
    pending: list[int] = []
    held: set[tuple[int, int, int]] = set()
    log: list = []

    def carry_out(instructions) -> None:
        for i in instructions:
            log.append(i)
            if isinstance(i, SubmitDecode):
                held.add(schedule.decodes[i.step].unit)
            elif isinstance(i, SubmitBlend):
                pending.append(i.blend)
            elif isinstance(i, Release):
                feeds = next(d.feeds for d in schedule.decodes if d.unit == i.unit)
                fed = [j for j, b in enumerate(schedule.blends) if b.shot == i.unit[0] and b.batch in feeds]
                assert set(fed) <= written
                held.remove(i.unit)
        assert len(held) <= state.window

    carry_out(state.handle(Started()))
    carry_out(state.handle(OutputsOpened()))
    while pending:
        j = pending.pop(rng.randrange(len(pending)))
        written.add(j)
        carry_out(state.handle(BatchWritten(j)))
    return log


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "grids, chunk",
    [
        ([TileGrid()] * 5, ChunkSize()),
        ([TileGrid((1, 2, 2), (0, 2, 2))] * 3, ChunkSize()),
        ([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2))], ChunkSize(frames=3)),
        ([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2))], ChunkSize(frames=3, carry=True)),
    ],
)
def test_every_decode_goes_in_order_within_the_window_and_every_result_is_released(grids, chunk, seed):
    plans = job(grids, 2, batch_frames=8, chunk=chunk)
    state = state_of(plans, 2, window=None)
    log = run_to_end(state, seed)
    decodes = of(SubmitDecode, log)
    assert [d.step for d in decodes] == list(range(len(state.schedule.decodes)))
    assert [d.slot for d in decodes] == [d.slot for d in state.schedule.decodes]
    assert sorted(b.blend for b in of(SubmitBlend, log)) == list(range(len(state.schedule.blends)))
    assert sorted(r.unit for r in of(Release, log)) == sorted(d.unit for d in state.schedule.decodes)
    assert sorted(f.shot for f in of(SubmitEndOutputs, log)) == list(range(len(plans)))  # each once
    assert 1 <= state.max_held <= state.window


def test_a_blend_goes_right_after_the_decode_that_completes_it():
    plans = job([TileGrid((1, 1, 2), (0, 0, 2))] * 2, 2, frames=9)
    log = run_to_end(state_of(plans, 2))
    schedule = make_schedule(plans, n_decode=2, n_io=0)
    for k, instruction in enumerate(log):
        if isinstance(instruction, SubmitDecode):
            completes = schedule.decodes[instruction.step].blends
            assert [b.blend for b in log[k + 1 : k + 1 + len(completes)]] == list(completes)


def test_the_window_holds_back_decodes_until_a_batch_frees_a_tile():
    plans = job([TileGrid()] * 4, 1)  # one batch and one tile per shot
    state = state_of(plans, 1, window=2)
    first = state.handle(Started())
    assert of(SubmitDecode, first) == [SubmitDecode(0, 0), SubmitDecode(1, 0)]
    assert state.handle(OutputsOpened()) == []
    # the second shot's batch written first: its tile goes, the third shot's decode takes its place
    assert state.handle(BatchWritten(1)) == [
        Release((1, 0, -1)), SubmitEndOutputs(1), SubmitDecode(2, 0), SubmitBlend(2, 0)
    ]  # fmt: skip
    assert state.handle(BatchWritten(0))[:2] == [Release((0, 0, -1)), SubmitEndOutputs(0)]


def test_a_tile_is_released_only_after_the_last_batch_it_feeds():
    plans = job([TileGrid()], 1, frames=9, batch_frames=16)  # 65 frames: 5 batches of one tile
    state = state_of(plans, 1)
    assert of(SubmitDecode, state.handle(Started())) == [SubmitDecode(0, 0)]
    n = len(plans[0].batches)
    assert n > 2
    for j in range(n - 1):
        assert state.handle(BatchWritten(j)) == []
    assert state.handle(BatchWritten(n - 1)) == [Release((0, 0, -1)), SubmitEndOutputs(0)]


def test_blends_wait_for_the_outputs_then_go_in_order_with_the_sound():
    plans = job([TileGrid()] * 3, 1)
    plans[1] = pending_plan(plans[1], {b.index for b in plans[1].batches})  # resumed: all batches done
    state = state_of(plans, 1, sound=[1, 2], outputs_open=False)
    started = state.handle(Started())
    assert of(SubmitBlend, started) == [] and of(SubmitEndOutputs, started) == []  # 1 ends with its sound
    opened = state.handle(OutputsOpened())
    assert opened == [SubmitBlend(0, 0), SubmitBlend(1, 0), SubmitStartOutputs(1), SubmitEndOutputs(1),
                      SubmitStartOutputs(2)]  # fmt: skip


def test_a_shot_with_nothing_left_to_write_finishes_at_the_start():
    plans = job([TileGrid()] * 2, 1)
    plans[0] = pending_plan(plans[0], {b.index for b in plans[0].batches})
    assert state_of(plans, 1).handle(Started())[0] == SubmitEndOutputs(0)


def test_a_carried_segment_that_feeds_nothing_is_released_once_the_next_takes_its_state():
    carried = ChunkSize(frames=2, carry=True)
    plans = job([TileGrid()], 1, frames=9, batch_frames=8, chunk=carried)
    plans[0] = pending_plan(plans[0], {0, 1})  # the batches its first segment feeds are done
    state = state_of(plans, 1, carried={0})
    first = state.schedule.decodes[0]
    assert first.segment == 0 and first.feeds == ()  # decoded only for the state it carries
    log = state.handle(Started())
    assert log[:3] == [SubmitDecode(0, 0), SubmitDecode(1, 0), Release(first.unit)]
    uncarried = state_of(plans, 1)  # without carrying, that result stays held until its shot ends
    assert Release(first.unit) not in uncarried.handle(Started())


def test_a_failed_shot_lets_go_of_its_tiles_and_the_window_moves_on():
    plans = job([TileGrid()] * 4, 1)
    state = state_of(plans, 1, window=2)
    state.handle(Started())
    state.handle(OutputsOpened())
    out = state.handle(ShotFailed(1))
    assert out == [Release((1, 0, -1)), SubmitDecode(2, 0), SubmitBlend(2, 0)]
    assert state.handle(ShotFailed(1)) == []
    assert state.handle(BatchWritten(1)) == []  # a failed shot's late batch changes nothing


def test_a_failed_shots_later_decodes_are_skipped():
    plans = job([TileGrid()] * 3, 1)
    state = state_of(plans, 1, window=1)
    state.handle(Started())
    state.handle(ShotFailed(1))  # before its decode went out
    out = state.handle(BatchWritten(0))
    assert of(SubmitDecode, out) == [SubmitDecode(2, 0)]


def test_joined_workers_take_the_shots_not_started_round_robin_and_widen_the_window():
    plans = job([TileGrid()] * 6, 2)
    state = state_of(plans, 2, window=2)
    assert of(SubmitDecode, state.handle(Started())) == [SubmitDecode(0, 0), SubmitDecode(1, 1)]
    out = state.handle(WorkersJoined(2))
    # shots 2..5 not started: turns 2, 3, 0, 1 of four slots; the new slots take 2 and 3
    assert dict(state.moved) == {2: 2, 3: 3}
    assert state.window == 2 + 1 * 2  # a worker's share (2 / 2) per joined worker
    assert of(SubmitDecode, out) == [SubmitDecode(2, 2), SubmitDecode(3, 3)]
    assert of(SubmitBlend, out) == [SubmitBlend(2, 2), SubmitBlend(3, 3)]
    rest = state.handle(BatchWritten(0))
    assert of(SubmitDecode, rest) == [SubmitDecode(4, 0)]  # shot 4 kept its slot


def test_a_shot_started_or_split_over_slots_or_shared_by_ipc_never_moves():
    plans = job([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2)), TileGrid(), TileGrid()], 2)
    state = state_of(plans, 2, window=2, pinned={2})
    state.handle(Started())  # shot 0 and shot 1's first tile
    state.handle(WorkersJoined(1))
    assert dict(state.moved) == {3: 2}  # shot 1 started and split, shot 2 pinned


def test_a_worker_that_leaves_gives_back_the_shots_it_had_not_started():
    plans = job([TileGrid()] * 6, 2)
    state = state_of(plans, 2, window=2)
    state.handle(Started())
    state.handle(WorkersJoined(2))
    assert dict(state.moved) == {2: 2, 3: 3}  # both already submitted: they stay
    state.handle(WorkerLeft(3))
    assert dict(state.moved) == {2: 2, 3: 3} and state.left == {3}
    late = state_of(plans, 2, window=1)
    late.handle(Started())  # shot 0 only
    late.handle(WorkersJoined(2))  # shots 1..5 take turns 2, 3, 0, 1, 2; the window (3) takes 1 and 2
    assert dict(late.moved) == {1: 2, 2: 3, 5: 2}
    late.handle(WorkerLeft(2))
    assert dict(late.moved) == {1: 2, 2: 3}  # shot 5 not started: back to its own slot
    assert of(SubmitDecode, late.handle(BatchWritten(0)))[-1] == SubmitDecode(3, 1)


def test_a_cancel_stops_every_shot_not_finished():
    plans = job([TileGrid()] * 4, 1)
    state = state_of(plans, 1, window=2, end_outputs={p: ["video"] for p in range(4)})
    state.handle(Started())
    state.handle(OutputsOpened())
    state.handle(BatchWritten(0))  # shot 0 written…
    assert state.handle(OutputWritten(0, "video")) == [ShotDone(0)]  # …and finished
    out = state.handle(RenderCancelled())
    assert of(CancelShot, out) == [CancelShot(1), CancelShot(2), CancelShot(3)]
    assert sorted(r.unit for r in of(Release, out)) == [(1, 0, -1), (2, 0, -1)]
    assert of(SubmitDecode, out) == [] and not state.held
    assert state.handle(BatchWritten(1)) == []


def test_handle_takes_only_events():
    with pytest.raises(TypeError, match="takes an event"):
        state_of(job([TileGrid()], 1), 1).handle("started")  # type: ignore[arg-type]


# -- the simulator runs the same state machine ---------------------------------------------------


def test_predict_simulates_a_worker_joining_mid_render():
    cost = costmodel.load("ltx2-tiny-cpu")
    plans = job([TileGrid()] * 8, 1)
    alone = predict(plans, 1, cost)
    joined = predict(plans, 1, cost, joins=[(0.0, 1)])
    late = predict(plans, 1, cost, joins=[(alone.makespan_s * 2, 1)])
    assert joined.makespan_s < alone.makespan_s
    assert joined.n_workers == 2 and len(joined.peak_bytes_per_worker) == 2
    assert late.makespan_s == alone.makespan_s  # after the last task: nothing left to adopt
    two = predict(assign_round_robin(plans, 2), 2, cost)
    assert two.makespan_s <= joined.makespan_s


def test_predict_refuses_a_join_without_workers():
    with pytest.raises(FarmError, match="worker join"):
        predict(job([TileGrid()], 1), 1, costmodel.load("ltx2-tiny-cpu"), joins=[(1.0, 0)])


def test_a_shot_is_done_once_every_output_after_its_last_batch_is_written():
    ends = {0: ["video", "proxy"], 1: ["video"]}
    state = state_of(job([TileGrid()] * 2, 1), 1, sound=[0], end_outputs=ends)
    state.handle(Started())
    state.handle(OutputsOpened())
    assert of(SubmitEndOutputs, state.handle(BatchWritten(0))) == [SubmitEndOutputs(0)]
    assert state.handle(OutputWritten(0, "audio")) == []  # written at its start: the video waits for it
    assert state.handle(OutputWritten(0, "video")) == []  # the proxy is not written yet
    assert state.handle(OutputWritten(0, "proxy")) == [ShotDone(0)] and state.finished == {0}
    assert state.handle(OutputWritten(1, "video")) == []  # shot 1's batch is not written yet: not finishing


@pytest.mark.parametrize("seed", range(3))
def test_a_render_replayed_from_its_event_log_reaches_the_same_decisions(seed):
    plans = job([TileGrid(), TileGrid((1, 1, 2), (0, 0, 2)), TileGrid()], 2, chunk=ChunkSize(frames=3))
    state = state_of(plans, 2, window=3, outputs_open=False, end_outputs={p: ["video"] for p in range(3)})
    run_to_end(state, seed)
    state.handle(WorkersJoined(1))
    for p in range(3):
        state.handle(OutputWritten(p, "video"))
    assert [type(e) for e, _ in state.log][:2] == [Started, OutputsOpened]
    assert state.replay() == state.log
    assert sorted(i.shot for _, out in state.log for i in of(ShotDone, out)) == [0, 1, 2]


def test_the_simulator_finishes_shots_with_the_render_state_machine():
    from farm.planning.planner import shot_tasks, simulate_schedule
    from farm.planning.tiling import plan_geometry

    cost = costmodel.load("ltx2-tiny-cpu")
    assert cost.shot_overhead_s > 0
    plans = job([TileGrid()] * 3, 1)
    schedule = make_schedule(plans, n_decode=1, n_io=0)
    shots = [shot_tasks(plan, cost, None, plan_geometry(plan)) for plan in plans]
    assert simulate_schedule(shots, schedule, cost, output=True)["finished"] == [0, 1, 2]  # its "finish"
    assert simulate_schedule(shots, schedule, cost, output=False)["finished"] == []  # no outputs: no finish
