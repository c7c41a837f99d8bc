"""The whole-frame passes a render's tiles decode from, for decoders with a part that sees the whole frame.

Such a decoder (`DiffusersVideoDecoder.shares_whole_frame`: Wan, HunyuanVideo, the LTX-2.5 diffusion
decoder) runs that part once over the frames a group of spatial tiles decodes and the whole frame
(``("whole-frame", render, shot, first, stop)``, on a decode worker), and each tile of the group decodes
the rest from its block of that output (`farm.worker.tasks.decode_tile`'s ``shared``). A group's pass is
submitted with its first decode and let go once its last decode is submitted: Dask keeps the result
until the decodes that take it have run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from farm import keys
from farm.decoders import decoder_class, spec_from_json
from farm.planning.schedule import DecodeStep, Schedule
from farm.planning.tiling import ShotPlan, takes_whole_frame_pass, whole_frame_groups
from farm.store.latent_chunks import LatentChunks
from farm.worker.tasks import whole_frame_pass

Group = tuple[int, tuple[int, int]]  # shot (position in the plans), latent frames [first, stop)


def whole_frame_group_of(plans: Sequence[ShotPlan], spec_json: dict) -> dict[tuple[int, int], Group]:
    """The tiles that decode from a whole-frame pass, (shot, tile) as positions in `plans` and ``plan.tiles``,
    each with its group; empty for a decoder without one. Such a tile reads no latent of its own; which
    plans take a pass: `takes_whole_frame_pass`."""
    spec = spec_from_json(spec_json)
    cls = decoder_class(spec)
    group_of: dict[tuple[int, int], Group] = {}
    for p, plan in enumerate(plans):
        if takes_whole_frame_pass(cls, spec.config, plan):
            for span, tiles in whole_frame_groups(plan).items():
                group_of.update({(p, k): (p, span) for k in tiles})
    return group_of


class WholeFramePasses:
    def __init__(
        self, plans: Sequence[ShotPlan], schedule: Schedule, spec_json: dict, *, render_id: str,
        job_path: str, latent_chunks: Mapping[str, LatentChunks], compile: bool | str,
        submit: Callable[..., Any], workers: Callable[[], list[str]],
    ) -> None:  # fmt: skip
        self.plans, self.spec_json, self.render_id = plans, spec_json, render_id
        self.job_path, self.latent_chunks, self.compile = job_path, latent_chunks, compile
        self.submit, self.workers = submit, workers
        self.group_of = whole_frame_group_of(plans, spec_json)  # (shot, tile) → its group
        self.left: dict[Group, int] = {}  # decodes of the group not submitted yet
        for step in schedule.decodes:
            group = self.group_of.get((step.shot, step.tile))
            if group is not None:
                self.left[group] = self.left.get(group, 0) + 1
        self.futures: dict[Group, Any] = {}

    def for_decode(self, step: DecodeStep, priority: int) -> Any:
        """The whole-frame pass `step`'s decode takes (its future), or None where it takes none."""
        group = self.group_of.get((step.shot, step.tile))
        if group is None:
            return None
        if group not in self.futures:
            self.futures[group] = self._submit(group, priority)
        found = self.futures[group]
        self.left[group] -= 1
        if not self.left[group]:
            del self.futures[group]
        return found

    def _submit(self, group: Group, priority: int) -> Any:
        p, (first, stop) = group
        plan = self.plans[p]
        _, _, h, w = plan.latent_shape
        region = (slice(first, stop), slice(0, h), slice(0, w))
        recorded = self.latent_chunks.get(plan.shot)
        chunks = None if recorded is None else recorded.covering(region)
        return self.submit(
            whole_frame_pass, self.job_path, self.spec_json, plan.shot, region, chunks, self.compile,
            key=(keys.WHOLE_FRAME, self.render_id, plan.shot, first, stop), workers=self.workers(),
            allow_other_workers=False, priority=priority,
        )  # fmt: skip
