"""Pictures of a render for the farm page: a small thumbnail of each finished shot's middle frame.

The render's client makes them (`ShotThumbnails`, wrapped around the render's progress callback): once
every batch of a shot is written it reads the shot's middle frame from the Zarr frames, scales it to
`WIDTH` pixels wide, encodes a PNG on a thread of its own, and publishes it in the scheduler's metadata
(``keys.THUMBNAILS + (render_id, shot)``, base64). The farm page serves it from there
(``/farm/thumbnail/<render>/<shot>.png``, `farm.monitor`): the scheduler never reads the outputs, and
each picture is made once.
"""

from __future__ import annotations

import base64
import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from farm import keys

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

    from farm.sequences import encode_png

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


def metadata_key(render_id: str, shot: str) -> list[str]:
    return keys.metadata_path(*keys.THUMBNAILS, render_id, shot)


class ShotThumbnails:
    """A progress callback that makes each finished shot's thumbnail once and publishes it, then calls
    `inner`. `close` (or leaving its ``with`` block) waits for the last ones."""

    def __init__(self, client: Any, render_id: str, output: Any, inner: Any = None) -> None:
        self.client, self.render_id, self.output, self.inner = client, render_id, output, inner
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-thumbnail")
        self.started: set[str] = set()

    def __call__(self, stats: Any) -> None:
        for name, shot in stats.shots.items():
            finished = shot.batches_total and shot.batches_written >= shot.batches_total and not shot.error
            if finished and name not in self.started:
                self.started.add(name)
                self.pool.submit(self.publish, name)
        if self.inner is not None:
            self.inner(stats)

    def publish(self, name: str) -> None:
        """Make and publish one shot's picture, on the pool's thread: the render's driver never waits
        for a scheduler round trip of the farm page's."""
        with contextlib.suppress(Exception):  # a picture must never break a render
            picture = shot_thumbnail(self.output.frames_array(name))
            self.client.set_metadata(metadata_key(self.render_id, name), picture)

    def close(self) -> None:
        self.pool.shutdown(wait=True)  # the last pictures are published before the client closes

    def __enter__(self) -> ShotThumbnails:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
