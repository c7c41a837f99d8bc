"""A shot's GroupNorm rounds on the cluster, for decoders whose tiles share the shot's statistics.

HunyuanVideo's GroupNorms take their statistics over the whole shot (`farm.decoders.hunyuanvideo.
groupnorm_rounds`). Where a plan's tiles take them (`farm.planning.tiling.takes_statistics_rounds`), the
tiles of a shot's whole-frame group run as a chain of tasks per round: each tile's round on its own
decode worker (``(STATISTICS_ROUND, render, shot, tile, round)``), its sums taken there
(``ROUND_SUMS``), one reduction per round (``(SHOT_STATISTICS, render, shot, round)``) that the next
round of every tile takes. A round's result (the tile's activation and its resnet's residual) is a task
result: Dask keeps it on the worker that made it until the tile's next round, there, has run. The
whole chain is submitted with the group's first decode, and every tile's decode takes its last round's
pixels (`decode_tile`'s ``decoded``). Rounds are not recorded: a resumed render runs them again for
the batches it has left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from farm import keys
from farm.decoders import decoder_class, spec_from_json
from farm.planning.schedule import DecodeStep, Schedule
from farm.planning.tiling import ShotPlan, own_blocks, whole_frame_groups
from farm.worker.statistics_rounds import first_round, next_round, round_sums, shot_statistics, tile_pixels


class StatisticsRounds:
    def __init__(
        self, plans: Sequence[ShotPlan], schedule: Schedule, spec_json: dict, *, render_id: str,
        compile: bool | str, submit: Callable[..., Any], workers: Callable[[], list[str]],
    ) -> None:  # fmt: skip
        spec = spec_from_json(spec_json)
        cls = decoder_class(spec)
        self.rounds = cls.statistics_round_count(spec.config) if cls.shares_statistics(spec.config) else 0
        self.plans, self.spec_json, self.render_id, self.compile = plans, spec_json, render_id, compile
        self.submit, self.workers = submit, workers
        self.slot_of = {(s.shot, s.tile): s.slot for s in schedule.decodes}
        self.pixels: dict[tuple[int, int], Any] = {}  # (shot, tile) → its last round, until its decode

    def for_decode(self, step: DecodeStep, shared: Any, priority: int) -> Any:
        """The future of `step`'s tile's pixels from its shot's rounds (submitted with the first decode of
        its group), or None where the tile does not take them (`shared`: its whole-frame pass, or None)."""
        if not self.rounds or shared is None:
            return None
        unit = (step.shot, step.tile)
        if unit not in self.pixels:
            group = next(g for g in whole_frame_groups(self.plans[step.shot]).values() if step.tile in g)
            self._submit(step.shot, group, shared, priority)
        return self.pixels.pop(unit)

    def _submit(self, p: int, group: tuple[int, ...], shared: Any, priority: int) -> None:
        plan = self.plans[p]
        owns = own_blocks(plan)
        workers = self.workers()

        def on_its_worker(k: int) -> dict[str, Any]:
            return {"workers": [workers[self.slot_of[(p, k)]]], "allow_other_workers": True,
                    "priority": priority}  # fmt: skip

        state = {
            k: self.submit(first_round, self.spec_json, shared, plan.tiles[k], owns[k], self.compile,
                           key=(keys.STATISTICS_ROUND, self.render_id, plan.shot, plan.tiles[k].index, 0),
                           **on_its_worker(k))  # fmt: skip
            for k in group
        }
        for r in range(self.rounds):
            sums = [
                self.submit(round_sums, state[k],
                            key=(keys.ROUND_SUMS, self.render_id, plan.shot, plan.tiles[k].index, r),
                            **on_its_worker(k))  # fmt: skip
                for k in group
            ]
            reduced = (keys.SHOT_STATISTICS, self.render_id, plan.shot, r)
            stats = self.submit(shot_statistics, *sums, key=reduced, priority=priority)
            state = {
                k: self.submit(next_round, self.spec_json, state[k], stats, self.compile,
                               key=(keys.STATISTICS_ROUND, self.render_id, plan.shot, plan.tiles[k].index,
                                    r + 1), **on_its_worker(k))  # fmt: skip
                for k in group
            }
        for k in group:
            name = (keys.STATISTICS_ROUND, self.render_id, plan.shot, plan.tiles[k].index, "pixels")
            self.pixels[(p, k)] = self.submit(tile_pixels, state[k], key=name, **on_its_worker(k))
