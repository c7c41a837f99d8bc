"""Resume: what a render output is a render of (its identity), and what is left to do in it.

A shot's identity (`render_identity`: the latents' content hash, the decoder spec, the tile plan and
the outputs asked for) is recorded in its frames group's attrs; a later render into the same OUT
compares identities (`resume_points`) and renders only the batches not yet marked done, or refuses
(unless restarting) when OUT holds a render of something else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.errors import FarmError
from farm.output import Output, drop_frames, restart_shot, video_done
from farm.store import Job
from farm.tiling import ShotPlan, TileGrid, pending_plan, plan_identity

if TYPE_CHECKING:
    from farm.tasks import VideoSettings


def latent_identity(job: Job, shot: str) -> dict[str, Any]:
    """Content hash of a shot's latent (reads it once on the client: ~7 MB for a 121x704x1216 shot)."""
    import hashlib

    import zarr

    arr = zarr.open_array(store=str(job.path / shot / "latent"), mode="r")
    digest = hashlib.sha256()
    for start in range(0, arr.shape[1], 8):
        try:
            block = np.ascontiguousarray(arr[:, start : start + 8])
        except Exception as exc:  # codec and store errors of many types
            raise FarmError(
                f"shot {shot!r}: cannot read latent frames {start}-{min(start + 8, arr.shape[1]) - 1} from "
                f"{str(job.path)!r} (corrupt or missing chunk? {type(exc).__name__}: {exc}); repair or "
                "re-export the latents"
            ) from None
        if not np.isfinite(block).all():
            bad = np.nonzero(~np.isfinite(block).all(axis=(0, 2, 3)))[0] + start
            raise FarmError(
                f"shot {shot!r}: latent holds NaN or Inf in latent frames {bad.tolist()}; "
                "re-export the latents"
            )
        digest.update(block.tobytes())
    return {"sha256": digest.hexdigest(), "shape": list(arr.shape), "dtype": str(arr.dtype)}


def recorded_identity(out: Output, shot: str) -> dict[str, Any] | None:
    import zarr

    try:
        group = zarr.open_group(store=str(out.shot_group(shot)), mode="r")
    except Exception:  # no such group yet: nothing recorded
        return None
    recorded = group.attrs.get("render")
    return dict(recorded) if isinstance(recorded, dict) else None


def identity_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between two render identities (empty when they are the same)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        if recorded.get(key) != current.get(key):
            if key == "latents":
                out.append("the latents changed (content hash differs)")
            else:
                out.append(f"{key}: output has {recorded.get(key)!r}, this render has {current.get(key)!r}")
    return out


def record_identity(out: Output, shot: str, identity: dict[str, Any], total_batches: int) -> None:
    import zarr

    group = zarr.open_group(store=str(out.shot_group(shot)), mode="r+")
    group.attrs.update({"render": identity, "batches": total_batches})


def render_identities(
    job: Job, plans: Sequence[ShotPlan], video: VideoSettings
) -> tuple[dict[str, dict], dict[str, FarmError]]:
    """Each shot's render identity, and the error of each shot whose latent cannot be read or hashed.

    Shots are read and hashed on threads (Zarr reads, zstd and sha256 release the GIL): a job's latents
    are the largest part of a render's set-up, paid before the first decode starts.
    """
    from concurrent.futures import ThreadPoolExecutor

    def identity(plan: ShotPlan) -> dict | FarmError:
        try:
            return render_identity(job, plan, video)
        except FarmError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(8, max(len(plans), 1)), thread_name_prefix="farm-hash") as pool:
        results = dict(zip([p.shot for p in plans], pool.map(identity, plans), strict=True))
    identities = {k: v for k, v in results.items() if not isinstance(v, FarmError)}
    errors = {k: v for k, v in results.items() if isinstance(v, FarmError)}
    return identities, errors


def render_identity(job: Job, plan: ShotPlan, video: VideoSettings) -> dict:
    return {
        "latents": latent_identity(job, plan.shot),
        "decoder": job.spec.to_json(),
        "plan": plan_identity(plan),
        "outputs": {
            "video": video.codec if video.enabled else None,
            "sequence": video.sequence,
            "first_frame": video.first_frame if video.sequence else None,
            "frames_dtype": video.frames_dtype,
            # only when not the default, so outputs rendered before the option existed still resume
            **({"exr_values": video.exr_values} if video.sequence == "exr" and video.exr_values != "display"
               else {}),
        },
    }


def recorded_grids(out: Output, plans: Sequence[ShotPlan], restart: bool) -> dict[str, TileGrid]:
    """Grids an earlier render of OUT used: an auto plan keeps them, so a resume on another number of
    workers continues the same tiles instead of being refused (unless restarting)."""
    if restart:
        return {}
    grids = {}
    for plan in plans:
        recorded = recorded_identity(out, plan.shot)
        if recorded and "plan" in recorded:
            grids[plan.shot] = TileGrid(tuple(recorded["plan"]["tiles"]), tuple(recorded["plan"]["overlap"]))
    return grids


def resume_points(
    out: Output,
    plans: Sequence[ShotPlan],
    identities: dict[str, dict],
    *,
    restart: bool,
    video: bool = True,
    frames: Sequence[int] | None = None,
    first_frame: int = 1,
    log: Callable[[str], None],
) -> tuple[list[ShotPlan], dict[str, int], set[str]]:
    """What is left to do per shot, after checking OUT holds a render of the same job (or restarting).

    With `frames` (frame numbers, the first frame numbered `first_frame`) only the batches holding those
    frames are rendered; a shot's video is joined once all its batches are done. Returns the pending
    plans, each shot's batch count and the shots whose video can be joined by this render.
    """
    pending, totals, refused, finish = [], {}, [], set()
    for plan in plans:
        recorded = recorded_identity(out, plan.shot)
        if recorded is not None:
            differences = identity_differences(recorded, identities[plan.shot])
            if differences and not restart:
                refused.append(f"shot {plan.shot!r}: " + "; ".join(differences))
                continue
            if differences or restart:
                restart_shot(out, plan.shot)
                drop_frames(out, plan.shot)
                log(f"farm: shot {plan.shot!r} starts over" + (f" ({differences[0]})" if differences else ""))
        totals[plan.shot] = len(plan.batches)
        done = out.batches_done(plan.shot)
        if video_done(out, plan.shot) or (not video and len(done) == len(plan.batches)):
            continue
        skipped = set()
        if frames is not None:
            wanted = {n - first_frame for n in frames}
            last = plan.pixel_shape[0] - 1
            if not any(0 <= i <= last for i in wanted):
                raise FarmError(
                    f"--frames asks for no frame of shot {plan.shot!r}, whose frames are numbered "
                    f"{first_frame}-{first_frame + last}"
                )
            skipped = {b.index for b in plan.batches if not any(b.start <= i < b.stop for i in wanted)}
        if not skipped - done:  # every unfinished batch is rendered now: the video can be joined
            finish.add(plan.shot)
        if done:
            log(
                f"farm: shot {plan.shot!r}: resuming, {len(done)} of {len(plan.batches)} batches already done"
            )
        pending.append(pending_plan(plan, done | skipped))
    if refused:
        raise FarmError(
            f"output {str(out.root)!r} holds a render of something else: " + " | ".join(refused)
            + ". Use a new --out, or --restart to render those shots over (their finished work is discarded)"
        )  # fmt: skip
    return pending, totals, finish
