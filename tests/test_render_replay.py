"""A real render's decisions come from its state machine alone: its event log, replayed into a fresh
`RenderState`, gives the same instructions, the shots' finishing included."""

from __future__ import annotations

import farm
from farm.planning.render_state import OutputWritten, RenderState, ShotDone, Started, SubmitEndOutputs
from farm.store.output import Output

QUIET = {"log": lambda _: None}


def test_a_render_replayed_from_its_event_log_reaches_the_same_decisions(tmp_path, scheduler3):
    job = tmp_path / "job.zarr"
    farm.synth(job, shots=2, frames=17, height=64, width=64, fps=24.0)
    out = Output(tmp_path / "out")
    options = farm.PlanOptions(batch_frames=8)
    stats = farm.render(job, out.root, options=options, scheduler=scheduler3, **QUIET)
    assert not stats.failed and len(stats.render_states) == 1
    state = stats.render_states[0]
    events = [event for event, _ in state.log]
    assert type(events[0]) is Started and any(isinstance(e, OutputWritten) for e in events)
    replayed = state.replay()
    assert replayed == state.log
    fresh = RenderState(**state.setup)
    assert fresh.log == [] and fresh.finished == set()  # the replay started from nothing
    decisions = [i for _, out_ in replayed for i in out_]
    assert sorted(i.shot for i in decisions if isinstance(i, SubmitEndOutputs)) == [0, 1]
    done = [i.shot for i in decisions if isinstance(i, ShotDone)]
    assert sorted(done) == [0, 1] and state.finished == {0, 1}
    assert all(stats.shots[name].video and out.video(name).exists() for name in stats.shots)
