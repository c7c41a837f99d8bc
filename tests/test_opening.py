"""What opening OUT for a render removes is decided from the resume points alone
(`farm.run.resume.plan_opening`, no OUT in reach); `farm.store.output_kinds.open_for_render` removes it
(tests/test_output_kinds.py, on real files)."""

from __future__ import annotations

from farm.decoders.geometry import Geometry
from farm.planning.tiling import pending_plan, plan_shot
from farm.run.resume import ResumePoints, plan_opening
from farm.store.output_kinds import VIDEO, Opening

GEOMETRY = Geometry(spatial_scale=8, temporal_scale=1, causal=False)


def test_the_opening_restarts_forgets_and_clears_what_the_resume_points_say():
    restarted, damaged, fresh = (plan_shot(name, (4, 24, 2, 3), GEOMETRY, batch_frames=8) for name in "abc")
    points = ResumePoints(
        pending=[restarted, pending_plan(damaged, {0}), fresh],
        restarts={"a": {"outputs": {"video": "h264"}}},
        damaged={"b": ({1}, True), "c": (set(), False)},
    )
    assert plan_opening(points) == Opening(
        restarts={"a": {"outputs": {"video": "h264"}}},
        damaged={"b": ({1}, [VIDEO.name]), "c": (set(), [])},
        # a restarted shot's frames go with it: only the other shots' batches to render are cleared
        unfinished={"b": [(8, 16), (16, 24)], "c": [(0, 8), (8, 16), (16, 24)]},
    )


def test_nothing_to_replace_plans_an_empty_opening_and_each_shot_opens_once():
    assert plan_opening(ResumePoints()) == Opening()
    opening = Opening(restarts={"a": None}, unfinished={"b": [(0, 8)]}, damaged={"a": ((), ())})
    assert opening.shots == ["a", "b"]
