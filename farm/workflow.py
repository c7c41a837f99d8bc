"""The API workflow scripts use: the cluster they were submitted to, their arguments, renders that can be
cancelled.

A workflow is a Python script that uses the farm API. Run directly (``python my_workflow.py …``) it gets
no submission: `cluster()` is empty and the script chooses its cluster itself. Run through
``farm submit my_workflow.py --scheduler-file F -- ARGS…`` it learns the cluster, its submission id and
priority from here, in the foreground (a subprocess with ``FARM_SCHEDULER``, ``FARM_SUBMISSION`` and
``FARM_PRIORITY`` in its environment) and with ``--detach`` alike (the script runs inside a task on the
cluster; see `farm.submit`).

>>> import sys
>>> from farm import workflow
>>> def main(argv):                                                    # doctest: +SKIP
...     stats = workflow.render(argv[0], argv[1], **workflow.cluster())
...     return 1 if stats.failed else 0
>>> if __name__ == "__main__":                                         # doctest: +SKIP
...     sys.exit(workflow.run(main))

`render` is `farm.render` with the submission's cluster and priority, a render id under the
submission (``<submission>.<n>-<job>``, so ``farm cancel <submission>`` reaches every render it started)
and a check that stops the workflow with :class:`Cancelled` once the render or its submission is
cancelled.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError
from farm.render_ids import is_cancelled
from farm.run.request import RenderRequest

if TYPE_CHECKING:
    from distributed import Client

ENV_SCHEDULER = "FARM_SCHEDULER"
ENV_SUBMISSION = "FARM_SUBMISSION"
ENV_PRIORITY = "FARM_PRIORITY"
EXIT_CANCELLED = 130  # as for Ctrl-C: the render stopped, its finished batches are kept


class Cancelled(FarmError):
    """The render (or the submission that started it) was cancelled with `farm cancel`."""


@dataclass
class Context:
    """Where a workflow runs. ``scheduler`` is None when it was not submitted (run directly)."""

    scheduler: str | None = None
    submission: str | None = None
    priority: int = 0
    argv: list[str] = field(default_factory=list)
    detached: bool = False
    log: Callable[[str], None] | None = None
    client: Client | None = None  # for metadata; made on first use when not given
    _renders: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_render_id(self, job: str | os.PathLike) -> str | None:
        if self.submission is None:
            return None
        with self._lock:
            self._renders += 1
            n = self._renders
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(job).name.removesuffix(".zarr"))[:40]
        return f"{self.submission}.{n}-{name}"

    def metadata_client(self) -> Client | None:
        if self.client is None and self.scheduler is not None:
            from distributed import Client

            with self._lock:
                if self.client is None:
                    self.client = Client(self.scheduler, set_as_default=False)
        return self.client


_CONTEXT: contextvars.ContextVar[Context | None] = contextvars.ContextVar("farm_workflow", default=None)
_ENV_CONTEXT: Context | None = None


def context() -> Context:
    """This workflow's context: set by a detached driver, else read from the environment and sys.argv."""
    global _ENV_CONTEXT
    ctx = _CONTEXT.get()
    if ctx is not None:
        return ctx
    if _ENV_CONTEXT is None:
        try:
            priority = int(os.environ.get(ENV_PRIORITY, "0") or 0)
        except ValueError:
            priority = 0
        _ENV_CONTEXT = Context(
            scheduler=os.environ.get(ENV_SCHEDULER) or None,
            submission=os.environ.get(ENV_SUBMISSION) or None,
            priority=priority,
            argv=list(sys.argv[1:]),
        )
    return _ENV_CONTEXT


@contextlib.contextmanager
def use_context(ctx: Context):
    """Run the body (a workflow script) with `ctx` as its context (what a detached driver does)."""
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


def argv() -> list[str]:
    """The workflow's arguments (what follows ``--`` on ``farm submit``; sys.argv[1:] when run directly)."""
    return list(context().argv)


def cluster() -> dict[str, str]:
    """Keyword arguments for `farm.render` that join the submission's cluster (``{}`` if none)."""
    ctx = context()
    return {"scheduler": ctx.scheduler} if ctx.scheduler else {}


def submitted() -> bool:
    return context().scheduler is not None


def log(message: str) -> None:
    """Print a line: to stdout, or for a detached workflow to its submission's log (farm page,
    ``farm submit --detach --follow``)."""
    ctx = context()
    if ctx.log is not None:
        ctx.log(message)
    else:
        print(message, flush=True)


def cancelled(render_id: str | None) -> bool:
    """Whether `farm cancel` was asked to stop this render or its submission."""
    ctx = context()
    client = ctx.metadata_client()
    if client is None:
        return False

    targets = client.get_metadata(["farm", "cancelled"], default={}) or {}
    ids = [i for i in (render_id, ctx.submission) if i]
    return any(is_cancelled(i, targets) for i in ids)


def _mark_cancelled(render_id: str) -> None:
    client = context().metadata_client()
    if client is not None:
        with contextlib.suppress(Exception):
            client.set_metadata(["farm", "renders", render_id, "state"], "cancelled")


def render(
    job: str | os.PathLike,
    out: str | os.PathLike,
    *,
    priority: int | None = None,
    render_id: str | None = None,
    check_every: float = 0.5,
    **kwargs: Any,
):
    """`farm.render` for a workflow (one `farm.run.request.RenderRequest`): joins the submission's
    cluster unless `kwargs` name one, uses its priority unless given, names the render under the
    submission, logs through `log`, and raises :class:`Cancelled` when the render or the submission is
    cancelled (finished batches stay)."""
    from farm.run.recorded import given_settings  # with run_render: `farm.run` loads Dask distributed
    from farm.run.render import run_render  # Dask distributed: `import farm.workflow` stays free of it

    ctx = context()
    if not any(kwargs.get(k) is not None for k in ("scheduler", "scheduler_file", "workers")):
        kwargs.update(cluster())
    priority = ctx.priority if priority is None else priority
    render_id = render_id or ctx.next_render_id(job)
    kwargs.setdefault("log", log)
    if ctx.scheduler and cancelled(render_id):
        raise Cancelled(f"render {render_id} was cancelled before it started")
    user_progress = kwargs.pop("on_progress", None)
    last_check = time.monotonic()

    def on_progress(stats: Any) -> None:
        nonlocal last_check
        if user_progress is not None:
            user_progress(stats)
        now = time.monotonic()
        if ctx.scheduler and now - last_check >= check_every and not stats.seconds:
            last_check = now
            if cancelled(stats.render_id):
                raise Cancelled(f"render {stats.render_id} was cancelled")

    # as farm.render: options and video left out take what OUT recorded
    kwargs.setdefault("given", given_settings(kwargs.get("options"), kwargs.get("video")))
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k not in ("options", "video")}
    request = RenderRequest(job, out, priority=priority, render_id=render_id or "", on_progress=on_progress,
                            **kwargs)  # fmt: skip
    try:
        stats = run_render(request)
    except Cancelled:
        if render_id:
            _mark_cancelled(render_id)
        raise
    if ctx.scheduler and render_id and cancelled(render_id):
        _mark_cancelled(render_id)
        raise Cancelled(f"render {render_id} was cancelled")
    return stats


def run(main: Callable[[Sequence[str]], int | None]) -> int:
    """Call ``main(argv())`` and turn farm's errors into a message and an exit code:
    0 (or main's own code), 2 for a FarmError, 130 when cancelled or interrupted."""
    try:
        return int(main(argv()) or 0)
    except Cancelled as exc:
        log(f"farm: {exc}; finished batches are kept, run the workflow again to resume")
        return EXIT_CANCELLED
    except FarmError as exc:
        log(f"farm: error: {exc}")
        return 2
    except KeyboardInterrupt:
        log("farm: interrupted; finished batches are kept")
        return EXIT_CANCELLED
