"""One render as asked for: `RenderRequest`, the frozen value `farm.render`, ``farm render`` and
`farm.workflow.render` all build, checked once (`RenderRequest.check`) and handed whole to the steps of
`farm.run.render`."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from farm import logs
from farm.media.settings import VideoSettings
from farm.planning.options import PlanOptions, parse_frame_numbers
from farm.run.validate import check_distinct_paths, check_render_options
from farm.store.output import Output

if TYPE_CHECKING:
    from farm.run.graph import ProgressCallback  # an annotation only: building a request loads no Dask


@dataclass(frozen=True)
class RenderRequest:
    """What a render is asked to do: the job, OUT, the plan options, what it writes and where it runs
    (`farm.run.render.render` documents each value).

    Paths are made absolute when the request is built (workers started elsewhere get the same paths),
    `shots` becomes a tuple, and a render without a `render_id` is given a new random one. Building it
    reads nothing; `check` refuses what cannot render before anything is touched."""

    job_path: str | os.PathLike[str]
    out_path: str | os.PathLike[str]
    workers: int | None = None
    scheduler: str | None = None
    scheduler_file: str | None = None
    options: PlanOptions = field(default_factory=PlanOptions)  # built when used: farm.* read then
    shots: Sequence[str] | None = None
    restart: bool = False
    compile: bool | str = False
    video: VideoSettings = field(default_factory=VideoSettings)
    window: int | None = None
    log: Callable[[str], None] = logs.message
    on_progress: ProgressCallback | None = None
    priority: int = 0
    render_id: str = ""  # empty: a new random id
    frames: str | None = None
    stream: bool = True
    # the options the user set, as typed (``--batch-frames``): the others take what OUT recorded when it
    # holds a render (`farm.run.recorded`); None: every option counts as set
    given: frozenset[str] | None = None
    out: Output = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # frozen: the normalised values are set once, here, through object.__setattr__
        set_once = object.__setattr__
        set_once(self, "job_path", os.path.abspath(self.job_path))
        set_once(self, "out_path", os.path.abspath(self.out_path))
        set_once(self, "shots", None if self.shots is None else tuple(self.shots))
        set_once(self, "render_id", self.render_id or uuid.uuid4().hex[:8])
        set_once(self, "out", Output(Path(self.out_path), self.video.suffix))

    def check(self) -> None:
        """Refuse, with nothing touched, an OUT that is or holds the job store and every option that
        cannot render (`farm.run.validate.check_render_options`)."""
        check_distinct_paths(self.job_path, self.out.root)
        check_render_options(
            options=self.options, video=self.video, window=self.window, workers=self.workers,
            scheduler=self.scheduler, scheduler_file=self.scheduler_file, priority=self.priority,
            compile=self.compile, frames=self.frames,
        )  # fmt: skip

    @functools.cached_property
    def frame_numbers(self) -> list[int] | None:
        """The frame numbers `frames` names (None: every frame); read once `check` passed."""
        return parse_frame_numbers(self.frames) if self.frames else None
