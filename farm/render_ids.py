"""Render ids: the render a farm task key belongs to, and which renders a `farm cancel` covers.

A render's task keys are ``(prefix, render_id, shot, …)`` (`farm.keys`); a submitted workflow ``s1`` names
its renders ``s1.<n>-<job>``, so cancelling ``s1`` cancels them all. Pure: used by the driver
(`farm.run.graph`), the farm page (`farm.dashboard.monitor`), workflows and `farm cancel` (`farm.submit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def render_of(key: Any) -> str | None:
    """The render id of a farm task key ``(prefix, render_id, shot, …)``; None for other keys (Dask's
    own collections use ``(name, 0, 1)``-style keys, whose second element is not a string)."""
    if isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str) and isinstance(key[1], str):
        return key[1]
    return None


def render_matches(render_id: str, target: str) -> bool:
    """Whether `render_id` is `target` or one of its renders (a submission ``s1`` owns ``s1.2-job``)."""
    return render_id == target or render_id.startswith(target + ".")


def is_cancelled(render_id: str, cancelled: Mapping[str, Any]) -> bool:
    """Whether `farm cancel` records (`cancelled`: target id → record) cover the render `render_id`."""
    return any(render_matches(render_id, target) for target in cancelled)
