"""Everything a render is given, checked before it touches OUT or starts a cluster.

The rule (docs/guarantees.md): no command deletes or overwrites anything until every input
and option is validated and the work is known to be possible. `check_render_options` checks the
options (and encodes two tiny frames with the chosen codec, so an encoder setting it refuses fails
here, not in a worker). Each shot's own values are checked where shots are planned
(`farm.planning.jobplan.check_shots`), so a bad shot fails by name and the others render.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from farm.decoders import compile_mode
from farm.decoders.launch_pacing import launch_lead
from farm.errors import FarmError
from farm.media.colour import colour_available, output_space
from farm.media.hdr import hdr_transfer
from farm.media.sequences import FORMATS, exr_available
from farm.planning.options import parse_frame_numbers

if TYPE_CHECKING:
    from farm.media.settings import VideoSettings
    from farm.planning.options import PlanOptions

X26X_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower",
                "veryslow", "placebo")  # fmt: skip
CRF_RANGE = (0, 51)  # libx264 and libx265, 8-bit
FRAMES_DTYPES = ("uint8", "float16")
# Priorities scale a render's Dask priorities by `farm.planning.schedule.Priority.JOB` (10^6) and stay below a
# detached workflow driver's (10^12), so every priority in this range orders as given.
MAX_PRIORITY = 999_999
# The largest frame number: OpenEXR's and OpenTimelineIO's frame numbers are 32-bit signed integers
MAX_FRAME_NUMBER = 2**31 - 1
WORKERS_PER_CORE = 4  # a local CPU cluster of more worker processes than this per core only thrashes


def check_render_options(
    *,
    options: PlanOptions,
    video: VideoSettings,
    window: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    scheduler_file: str | None = None,
    priority: int = 0,
    compile: bool | str = False,
    frames: str | None = None,
) -> list[int] | None:
    """Check every option of `farm.run.render.render`; returns the parsed `frames` (frame numbers) or None."""
    from farm.run.cluster import (  # Dask distributed: off `farm plan`'s path
        choose_cluster,
        cpu_decode_threads,
        scheduler_file_address,
    )
    from farm.run.machine import detect_gpus

    # the chosen backend's checks of --workers and the addresses
    choose_cluster(scheduler=scheduler, scheduler_file=scheduler_file, workers=workers,
                   gpu_count=detect_gpus(), ucx_available=False, cpu_count=1)  # fmt: skip
    cpu_decode_threads()  # the setting, checked before a cluster starts
    if scheduler_file is not None:
        scheduler_file_address(scheduler_file)  # there, a regular file, a scheduler's
    _whole(window, "--window", 1, allow_none=True)
    launch_lead()  # read by each GPU worker's decoder; checked here, before any cluster starts
    _whole(options.batch_frames, "--batch-frames", 1)
    check_priority(priority)
    check_local_workers(workers)
    compile_mode(compile)
    check_video_settings(video)
    return parse_frame_numbers(frames) if frames else None


def check_frame_numbers_fit(first_frame: int, frames: Mapping[str, int]) -> None:
    """Every shot's last frame number (`first_frame` + its `frames` - 1) is at most `MAX_FRAME_NUMBER`."""
    if not frames:
        return
    longest = max(frames, key=lambda shot: frames[shot])
    most = MAX_FRAME_NUMBER - frames[longest] + 1
    if first_frame > most:
        raise FarmError(
            f"--first-frame {first_frame} is too large: shot {longest!r} has {frames[longest]} frames, so "
            f"its last frame number would pass {MAX_FRAME_NUMBER} (the largest EXR and OpenTimelineIO hold); "
            f"give at most {most}"
        )


def check_distinct_paths(job: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """OUT may not be the job store, nor be inside it, nor hold it: a render writes and (restarting)
    removes files under OUT, which must never be the job's."""
    from pathlib import Path

    job_real, out_real = Path(os.path.realpath(job)), Path(os.path.realpath(out))
    if job_real == out_real or out_real.is_relative_to(job_real) or job_real.is_relative_to(out_real):
        where = ("is" if job_real == out_real else "is inside" if out_real.is_relative_to(job_real)
                 else "holds")  # fmt: skip
        raise FarmError(
            f"--out {os.fspath(out)!r} {where} the job store {os.fspath(job)!r}; choose an output folder "
            "outside the job store that does not contain it"
        )


def check_priority(priority: object) -> None:
    _whole(priority, "--priority", None)
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:  # type: ignore[operator]
        raise FarmError(f"--priority {priority} is invalid; use a whole number from {-MAX_PRIORITY} to "
                        f"{MAX_PRIORITY} (higher runs first)")  # fmt: skip


def check_local_workers(workers: int | None) -> None:
    """--workers of a local cluster: at most `WORKERS_PER_CORE` processes per CPU core of this machine
    (GPU clusters are held to their GPUs by `farm.run.cluster.choose_cluster`)."""
    from farm.run.cluster import cpu_count  # Dask distributed: off `farm plan`'s path

    most = WORKERS_PER_CORE * max(1, cpu_count())
    if workers is not None and workers > most:
        raise FarmError(f"--workers {workers} is beyond this machine ({cpu_count()} CPU cores): use at most "
                        f"{most} local workers, or join a larger cluster with --scheduler")  # fmt: skip


def _whole(value: object, option: str, minimum: int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or (minimum is not None and value < minimum)
    ):
        rule = f"a whole number ≥ {minimum}" if minimum is not None else "a whole number"
        raise FarmError(f"{option} {value!r} is invalid; use {rule}")


def check_colour_settings(video: VideoSettings) -> None:
    """--hdr names a transfer; --colorspace a space this render's EXR frames or ProRes video can be
    written in, converted by OpenColorIO (H.264/H.265 video is 8-bit BT.709; an HDR render's video is its
    HLG master, which --colorspace leaves as it is)."""
    if video.hdr is not None:
        hdr_transfer(video.hdr, "--hdr")
        if video.sequence not in (None, "exr"):
            raise FarmError(f"--sequence {video.sequence}: an HDR render's frames are scene-linear; write "
                            "them as --sequence exr")  # fmt: skip
    if video.colorspace is None:
        return
    space = video.colorspace
    output_space(space, hdr=video.hdr is not None)
    if video.sequence != "exr" and video.video_space is None:
        if video.hdr is not None:
            raise FarmError(f"--colorspace {space}: an HDR render's video is its HLG master, which "
                            "--colorspace does not change; add --sequence exr or leave --colorspace out")
        if not video.enabled:
            raise FarmError(f"--colorspace {space}: colour spaces apply to EXR frames and ProRes video; add "
                            "--sequence exr or leave --colorspace out")  # fmt: skip
        if space != "g24_rec709":
            raise FarmError(f"--colorspace {space}: {video.codec} video is 8-bit display video "
                            "(g24_rec709 only); choose --codec prores_hq or prores_4444, add --sequence exr, "
                            "or give --colorspace g24_rec709")  # fmt: skip
    if space != video.frames_space and not colour_available():
        raise FarmError(f"--colorspace {space} needs the 'opencolorio' package, which is not "
                        "installed here; install it (pip install 'farm-decode[colour]') on every worker")


def check_video_settings(video: VideoSettings) -> None:
    """Codec, rate control, image sequence, first frame and Zarr dtype, then a trial encode."""
    from farm.media.video import codec_for  # PyAV: off the path of commands that encode nothing

    codec = codec_for(video.codec)
    if video.frames_dtype not in FRAMES_DTYPES:
        raise FarmError(f"--frames-dtype {video.frames_dtype!r} is invalid; choose one of "
                        f"{list(FRAMES_DTYPES)}")  # fmt: skip
    _whole(video.first_frame, "--first-frame", 0)
    if video.first_frame > MAX_FRAME_NUMBER:
        raise FarmError(f"--first-frame {video.first_frame} is invalid; use a whole number from 0 to "
                        f"{MAX_FRAME_NUMBER} (less each shot's frames: its last frame's number must fit)")
    _whole(video.encoder_threads, "farm.encoder-threads", 0)  # 0: the encoder's own choice
    _whole(video.frame_chunk_mib, "farm.frame-chunk-mib", 1)
    if video.sequence is not None:
        if video.sequence not in FORMATS:
            raise FarmError(f"--sequence {video.sequence!r} is invalid; choose one of {sorted(FORMATS)}")
        if video.sequence == "exr" and not exr_available():
            raise FarmError(
                "--sequence exr needs the 'openexr' package, which is not installed here; install it "
                "(pip install 'farm-decode[exr]') on every worker, or choose png16"
            )
    check_colour_settings(video)
    if not video.writes_video or video.hdr is not None or not codec.rate_control:
        return
    _whole(video.crf, "--crf", CRF_RANGE[0])
    if video.crf > CRF_RANGE[1]:
        raise FarmError(f"--crf {video.crf} is invalid for {video.codec}; use {CRF_RANGE[0]} to "
                        f"{CRF_RANGE[1]}")  # fmt: skip
    if video.preset not in X26X_PRESETS:
        raise FarmError(f"--preset {video.preset!r} is invalid for {video.codec}; choose one of "
                        f"{', '.join(X26X_PRESETS)}")  # fmt: skip
    _trial_encode(video)


def _trial_encode(video: VideoSettings) -> None:
    """Encode two 16x16 frames with the render's settings: what the encoder refuses fails here."""
    from farm.media.video import encode_segment  # PyAV: off the path of commands that encode nothing

    with tempfile.TemporaryDirectory(prefix="farm-check-") as folder:
        path = os.path.join(folder, "check" + video.suffix)
        try:
            # yuv420p planes where the codec takes them: what renders feed it, without RGB's conversion
            planes = np.zeros((2, 24, 16), np.uint8) if video.takes_yuv420 else None
            encode_segment(np.zeros((2, 16, 16, 3), np.uint8), path, 24, codec=video.codec, crf=video.crf,
                           preset=video.preset, threads=video.encoder_threads, yuv420=planes)  # fmt: skip
        except FarmError:
            raise
        except Exception as exc:  # PyAV raises its own error types for encoder options
            raise FarmError(
                f"the encoder refuses --codec {video.codec} --crf {video.crf} --preset {video.preset!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
