"""Pictures of a render for the farm page: a small thumbnail of each finished shot's middle frame.

The render's client makes them (`ShotThumbnails`, wrapped around the render's progress callback): once
the batch holding a shot's middle frame is written it reads that frame from the Zarr frames, scales it
to `WIDTH` pixels wide and encodes a PNG on a thread of its own (while the shot's later batches are
still decoding, so the end of a render never waits for it); once every batch of the shot is written it
publishes the picture in the scheduler's metadata
(``keys.THUMBNAILS + (render_id, shot)``, base64). The farm page serves it from there
(``/farm/thumbnail/<render>/<shot>.png``, `farm.dashboard.monitor`): the scheduler never reads the outputs,
and each picture is made once.
"""

from __future__ import annotations

import base64
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from farm import keys
from farm.media.sequences import encode_png

WIDTH = 160  # pixels: a table-row picture, a few kB as PNG


def middle_frame(frames_array: Path) -> tuple[int, np.ndarray]:
    """The index and the uint8 RGB pixels ``[H, W, 3]`` of the middle frame of a shot's Zarr frames."""
    import zarr

    arr = zarr.open_array(store=str(frames_array), mode="r")
    index = int(arr.shape[0]) // 2
    frame = np.asarray(arr[index])
    if frame.dtype != np.uint8:  # float16 master copy in [0, 1]
        frame = np.round(np.clip(frame.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)
    return index, frame


def thumbnail_png(frame: np.ndarray, width: int = WIDTH) -> bytes:
    """`frame` (uint8 ``[H, W, 3]``) scaled to `width` pixels wide (area filter, aspect kept), as PNG."""
    import av

    height, full_width, _ = frame.shape
    width = min(width, full_width)
    scaled_height = max(2, round(height * width / full_width))
    image = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
    small = image.reformat(width=width, height=scaled_height, interpolation="AREA").to_ndarray()
    return encode_png(small)


def shot_thumbnail(frames_array: Path) -> dict[str, Any]:
    """What the farm page needs of a shot's picture: the PNG (base64), its frame and size."""
    index, frame = middle_frame(frames_array)
    png = thumbnail_png(frame)
    return {"png": base64.b64encode(png).decode("ascii"), "frame_index": index, "bytes": len(png)}


def middle_batch(plan: Any) -> int | None:
    """The index of the batch of `plan` (a whole `farm.planning.tiling.ShotPlan`) that holds the shot's middle
    frame (the frame `middle_frame` reads)."""
    middle = plan.pixel_shape[0] // 2
    return next((b.index for b in plan.batches if b.start <= middle < b.stop), None)


def metadata_key(render_id: str, shot: str) -> list[str]:
    return keys.metadata_path(*keys.THUMBNAILS, render_id, shot)


class ShotThumbnails:
    """A progress callback that makes each shot's thumbnail once, as soon as the batch holding its
    middle frame is written (`middle_batch`: shot → that batch's index; without it, once the shot is
    finished), publishes it once the shot is finished, then calls `inner`. `close` (or leaving its
    ``with`` block) waits for the last ones."""

    def __init__(
        self,
        client: Any,
        render_id: str,
        output: Any,
        inner: Any = None,
        middle_batch: dict[str, int | None] | None = None,
    ) -> None:
        self.client, self.render_id, self.output, self.inner = client, render_id, output, inner
        self.middle_batch = middle_batch or {}
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-thumbnail")
        self.pictures: dict[str, Any] = {}  # shot → future of its picture (None if it failed)
        self.published: set[str] = set()
        self.looked: dict[str, int] = {}  # shot → its batches written when its middle marker was looked for

    def __call__(self, stats: Any) -> None:
        for name, shot in stats.shots.items():
            if shot.error:
                continue
            finished = shot.batches_total and shot.batches_written >= shot.batches_total
            if name not in self.pictures and (finished or self._middle_written(name, shot.batches_written)):
                self.pictures[name] = self.pool.submit(self.make, name)
            if finished and name not in self.published:
                self.published.add(name)
                self.pool.submit(self.publish, name)  # one thread: after the picture is made
        if self.inner is not None:
            self.inner(stats)

    def _middle_written(self, name: str, written: int) -> bool:
        """Whether the batch holding the shot's middle frame is marked done: looked up on disk only when
        the shot has written a batch since the last look (this runs after every batch of the render)."""
        batch = self.middle_batch.get(name)
        if batch is None or self.looked.get(name) == written:
            return False
        self.looked[name] = written
        return self.output.done_marker(name, batch).exists()

    def make(self, name: str) -> dict[str, Any] | None:
        """One shot's picture, on the pool's thread: the render's driver never waits for it."""
        with contextlib.suppress(Exception):  # a picture must never break a render
            return shot_thumbnail(self.output.frames_array(name))
        return None

    def publish(self, name: str) -> None:
        """Publish one finished shot's picture (made before, on this same thread)."""
        picture = self.pictures[name].result()
        if picture is not None:
            with contextlib.suppress(Exception):
                self.client.set_metadata(metadata_key(self.render_id, name), picture)

    def close(self) -> None:
        self.pool.shutdown(wait=True)  # the last pictures are published before the client closes

    def __enter__(self) -> ShotThumbnails:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
