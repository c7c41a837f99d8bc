"""Resume: what a render output is a render of (its identity), and what is left to do in it.

A shot's identity (`render_identity`: the latents' content hash, the decoder spec, the tile plan and
the outputs asked for) is recorded in its frames group's attrs; a later render into the same OUT
compares identities (`resume_points`) and renders only the batches not yet marked done, or refuses
(unless restarting) when OUT holds a render of something else.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.decoders import FAMILIES
from farm.decoders.base import superseded_config
from farm.decoders.sound import superseded_sound
from farm.errors import FarmError
from farm.media.settings import UNRECORDED_CRF, UNRECORDED_PRESET
from farm.planning.tiling import ChunkSize, ShotPlan, TileGrid, pending_plan, plan_identity
from farm.store.claims import array_chunk_bytes, check_chunk_files, codec_names
from farm.store.frames import FORMAT, fast_codecs
from farm.store.job import Job, read_audio_latent
from farm.store.latent_chunks import chunk_digests
from farm.store.markers import read_marker
from farm.store.output import Output, os_errors_in_one_line
from farm.store.output_kinds import (
    BATCH_OUTPUTS,
    SHOT_OUTPUTS,
    VIDEO,
    BatchOutput,
    Opening,
    ShotOutput,
    batch_checks,
    verified_batches,
)

if TYPE_CHECKING:
    from farm.media.settings import VideoSettings


def latent_identity(job: Job, shot: str) -> dict[str, Any]:
    """Content hash of a shot's latent (reads it once on the client: ~7 MB for a 121x704x1216 shot).

    The latent is read in one call; the digest covers blocks of 8 latent frames in order, as it always
    has, so older outputs still resume. Under ``"chunks"`` (never recorded in OUT, `render_identity`)
    the sha256 of each stored chunk, which workers check each chunk they read against
    (`farm.store.latent_chunks`); a chunk missing from the store is refused here."""
    import hashlib

    import zarr

    arr = zarr.open_array(store=str(job.path / shot / "latent"), mode="r")
    # no chunk unpacks beyond its claim
    check_chunk_files(job.path / shot / "latent", codec_names(arr), array_chunk_bytes(arr), shot)
    chunks = chunk_digests(job.path / shot / "latent", arr, shot)  # before the values: a chunk rewritten
    # between the two reads then fails the workers' check, never passes it
    try:
        latent = np.asarray(arr[...])
    except Exception:  # codec and store errors of many types: find the first block that fails
        latent = None
    digest = hashlib.sha256()
    for start in range(0, arr.shape[1], 8):
        block = _latent_block(arr, shot, job, start) if latent is None else latent[:, start : start + 8]
        if not np.isfinite(block).all():
            bad = np.nonzero(~np.isfinite(block).all(axis=(0, 2, 3)))[0] + start
            raise FarmError(
                f"shot {shot!r}: latent holds NaN or Inf in latent frames {bad.tolist()}; "
                "re-export the latents"
            )
        digest.update(np.ascontiguousarray(block).data)
    return {"sha256": digest.hexdigest(), "shape": list(arr.shape), "dtype": str(arr.dtype), "chunks": chunks}


def _latent_block(arr: Any, shot: str, job: Job, start: int) -> np.ndarray:
    """Latent frames ``[start, start + 8)``, or the error that names them when they cannot be read."""
    try:
        return np.asarray(arr[:, start : start + 8])
    except Exception as exc:  # codec and store errors of many types
        raise FarmError(
            f"shot {shot!r}: cannot read latent frames {start}-{min(start + 8, arr.shape[1]) - 1} from "
            f"{str(job.path)!r} (corrupt or missing chunk? {type(exc).__name__}: {exc}); repair or "
            "re-export the latents"
        ) from None


def recorded_identity(out: Output, shot: str) -> dict[str, Any] | None:
    import zarr

    if not out.shot_group(shot).exists():
        return None  # nothing recorded (and no exception from zarr to pay for per shot)
    try:
        group = zarr.open_group(store=str(out.shot_group(shot)), mode="r")
    except Exception:  # no such group yet: nothing recorded
        return None
    recorded = group.attrs.get("render")
    return dict(recorded) if isinstance(recorded, dict) else None


# What each recorded setting is called in messages: the option that sets it, as the user types it
# (identity key, then the key inside it).
SETTING_NAMES = {
    ("outputs", "video"): "--codec",
    ("outputs", "crf"): "--crf",
    ("outputs", "preset"): "--preset",
    ("outputs", "sequence"): "--sequence",
    ("outputs", "first_frame"): "--first-frame",
    ("outputs", "frames_dtype"): "--frames-dtype",
    ("outputs", "exr_values"): "--exr-values",
    ("plan", "tiles"): "--tiles",
    ("plan", "overlap"): "--overlap",
    ("plan", "batch_frames"): "--batch-frames",
    ("plan", "chunk"): "--chunk",
    ("outputs", "hdr"): "--hdr",
    ("outputs", "colorspace"): "--colorspace",
    ("outputs", "timecode"): "--timecode",
    ("plan", "pixel_shape"): "frames (F,H,W)",
    # what each tile decodes beyond its own (the decoder's measured halo and context), per tile
    ("plan", "halo"): "spatial halo",
    ("plan", "context"): "temporal context",
}
# what an identity means by a setting it leaves out (recorded only when not the default)
UNRECORDED = {("outputs", "exr_values"): "display", ("outputs", "crf"): UNRECORDED_CRF,
              ("outputs", "preset"): UNRECORDED_PRESET}


def _words(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(_words(v) for v in value)
    return str(value)


def identity_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The settings that differ between two render identities, in words (empty when they are the same):
    ``--codec: OUT has h264, this render prores_hq``."""
    out = []
    superseded = superseded_config(recorded.get("decoder"), FAMILIES)
    sound = superseded_sound(recorded)
    if sound:
        out.append(f"OUT was decoded with {sound}")
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key), current.get(key)
        if old == new:
            continue
        if key == "outputs" and sound and isinstance(old, dict) and isinstance(new, dict):
            old, new = ({k: v for k, v in d.items() if k != "audio"} for d in (old, new))
            if old == new:
                continue
        if key == "decoder" and superseded:
            out.append(f"OUT was decoded with {superseded}")
        elif key == "latents":
            out.append("the latents changed (content hash differs)")
        elif isinstance(old, dict) and isinstance(new, dict):
            for sub in sorted(set(old) | set(new)):
                if old.get(sub) != new.get(sub):
                    name = SETTING_NAMES.get((key, sub), f"{key} {sub}")
                    was, now = (d.get(sub, UNRECORDED.get((key, sub))) for d in (old, new))
                    out.append(f"{name}: OUT has {_words(was)}, this render {_words(now)}")
        else:
            out.append(f"{key}: OUT has {_words(old)}, this render {_words(new)}")
    return out


def record_identity(
    out: Output, shot: str, identity: dict[str, Any], total_batches: int, owner: str | None = None
) -> None:
    """Record what the shot is a render of, and `owner`: the render id now writing it (tasks of an
    earlier render still running on a shared cluster then write nothing into it, `farm.worker.tasks`)."""
    import zarr

    from farm.store.beneath_zarr import frames_store

    with os_errors_in_one_line(f"cannot record shot {shot!r} in {str(out.root)!r}"):
        group = zarr.open_group(store=frames_store(out), path=shot, mode="r+")
        group.attrs.update({"render": identity, "batches": total_batches, "owner": owner})


def latent_identities(job: Job, names: Sequence[str]) -> tuple[dict[str, dict], dict[str, FarmError]]:
    """Each named shot's latent hash, and the error of each shot whose latent cannot be read or hashed.

    Shots are read and hashed on threads (Zarr reads, zstd and sha256 release the GIL), through the
    `zarrs` codecs when installed (chunks decoded in Rust, no GIL): a job's latents are the largest part
    of a render's set-up, paid before the cluster starts.
    """
    from concurrent.futures import ThreadPoolExecutor

    def identity(name: str) -> dict | FarmError:
        try:
            return latent_identity(job, name)
        except FarmError as exc:
            return exc

    threads = min(32, os.cpu_count() or 1, max(len(names), 1))
    with fast_codecs(), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="farm-hash") as pool:
        results = dict(zip(names, pool.map(identity, names), strict=True))
    hashes = {k: v for k, v in results.items() if not isinstance(v, FarmError)}
    errors = {k: v for k, v in results.items() if isinstance(v, FarmError)}
    return hashes, errors


def render_identities(
    job: Job, plans: Sequence[ShotPlan], video: VideoSettings, hashes: dict[str, dict] | None = None
) -> tuple[dict[str, dict], dict[str, FarmError]]:
    """Each shot's render identity (latents hashed unless `hashes` has them), and the error of each
    shot whose latent cannot be read or hashed."""
    if hashes is None:
        hashes, errors = latent_identities(job, [p.shot for p in plans])
    else:
        errors = {}
    identities = {p.shot: render_identity(job, p, video, hashes[p.shot]) for p in plans if p.shot in hashes}
    return identities, errors


def sound_shots(job: Job, names: Sequence[str], video: VideoSettings) -> set[str]:
    """The named shots whose sound this render writes: they hold audio latents, the job an audio
    decoder, and the render was not asked to leave sound out."""
    if job.audio is None or not video.audio:
        return set()
    return {n for n in names if n in job.shots and job.shots[n].audio_shape is not None}


def audio_identity(job: Job, shot: str, video: VideoSettings) -> dict[str, Any]:
    """What a shot's sound is decoded from and written as (its audio latent's hash, the audio decoder)."""
    import hashlib

    assert job.audio is not None
    latent = read_audio_latent(job.path, shot)
    # a job made with an earlier revision of its audio config may hold latents the current one cannot take
    job.audio.check_latent(tuple(latent.shape), f"shot {shot!r}")
    if not np.isfinite(latent).all():
        raise FarmError(f"shot {shot!r}: audio latent holds NaN or Inf; re-export the latents")
    digest = hashlib.sha256(np.ascontiguousarray(latent).data).hexdigest()
    return {"sha256": digest, "shape": list(latent.shape), "decoder": job.audio.to_json(),
            "format": video.audio_format}  # fmt: skip


def outputs_asked(job: Job, shot: str, video: VideoSettings) -> dict[str, Any]:
    """The outputs a render of `video` writes for the shot, named as its identity's "outputs" name them
    (the sound by its format only: what the shot's files are, not what they are decoded from)."""
    outputs = video.identity()
    if sound_shots(job, [shot], video):
        outputs["audio"] = {"format": video.audio_format}
    return outputs


def render_identity(job: Job, plan: ShotPlan, video: VideoSettings, latents: dict | None = None) -> dict:
    latents = latents if latents is not None else latent_identity(job, plan.shot)
    identity: dict[str, Any] = {
        "latents": {k: v for k, v in latents.items() if k != "chunks"},  # the workers' check, not OUT's
        "decoder": job.spec.to_json(),
        "plan": plan_identity(plan),
        "outputs": video.identity(),
    }
    if sound_shots(job, [plan.shot], video):  # only shots with sound: outputs rendered without still resume
        identity["outputs"]["audio"] = audio_identity(job, plan.shot, video)
    return identity


@dataclass(frozen=True)
class RecordedLayout:
    """The grids and chunking an earlier render of OUT used, per shot: an auto plan keeps them, so a
    resume on another number of workers continues the same tiles and never switches a shot between
    carried and whole-tile decodes, instead of being refused (unless restarting)."""

    grids: dict[str, TileGrid] = field(default_factory=dict)
    chunks: dict[str, ChunkSize] = field(default_factory=dict)


def recorded_layout(out: Output, names: Sequence[str], restart: bool) -> RecordedLayout:
    """`RecordedLayout` of the named shots, each shot's identity read once (nothing when restarting)."""
    layout = RecordedLayout()
    for name in [] if restart else names:
        plan = (recorded_identity(out, name) or {}).get("plan")
        if not plan:
            continue
        layout.grids[name] = TileGrid(tuple(plan["tiles"]), tuple(plan["overlap"]))
        if "chunk" in plan:
            frames, height, width, overlap = plan["chunk"]
            carry = plan.get("carry", False)  # absent, True (even chunks, before tapering) or "tapered"
            layout.chunks[name] = ChunkSize(frames, height, width, tuple(overlap), carry=bool(carry),
                                            taper=carry is not True)  # fmt: skip
    return layout


@dataclass
class ResumePoints:
    """What a render does in OUT, decided before anything in it is touched.

    `pending`: plans of the batches to render; `totals`: each shot's batch count; `finish`: shots whose
    every batch is done once this render's are (their outputs written after the last batch, the video,
    are written then); `writes`: per shot output kind (`farm.store.output_kinds.SHOT_OUTPUTS`), the
    shots whose file this render writes; `restarts`: shots started over, with the identity they replace
    (None when OUT recorded none); `notes`: what to tell the user once the render starts.
    """

    pending: list[ShotPlan] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    finish: set[str] = field(default_factory=set)
    writes: dict[str, set[str]] = field(default_factory=dict)
    restarts: dict[str, dict | None] = field(default_factory=dict)
    damaged: dict[str, tuple[set[int], bool]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def nothing_to_do(self) -> bool:
        return not self.pending and not self.restarts


def resume_points(
    out: Output,
    plans: Sequence[ShotPlan],
    identities: dict[str, dict],
    *,
    restart: bool,
    frames: Sequence[int] | None = None,
    first_frame: int = 1,
) -> ResumePoints:
    """What is left to do per shot, after checking OUT holds a render of the same job (or restarting).

    Reads OUT, changes nothing: a refusal (OUT holds a render of other settings, `frames` asks for no
    frame of a shot) raises before anything is deleted; `plan_opening` then says what is removed. With
    `frames` (frame numbers, the first numbered `first_frame`) only the batches holding those frames
    are rendered; a shot's video is joined once all its batches are done. A shot is done once every
    shot output its identity asks for (video, sound) is intact in OUT; each asked for and not intact is
    written (`writes`).
    """
    points = ResumePoints()
    refused: dict[str, list[str]] = {}  # differences → the shots that have them
    check_output_identity(out)
    for plan in plans:
        if frames is not None:
            check_frames_in_shot(frames, plan, first_frame)
        recorded = recorded_identity(out, plan.shot)
        differences = identity_differences(recorded, identities[plan.shot]) if recorded is not None else []
        if recorded is None and not restart and _has_finished_work(out, plan.shot):
            raise FarmError(
                f"output {str(out.root)!r}: shot {plan.shot!r} has finished batches but no readable record "
                f"of what they are a render of ({out.shot_group(plan.shot) / 'zarr.json'} missing or "
                "damaged), so they cannot be resumed. Nothing was changed. Use --restart to render the "
                "shot over, or a new --out"
            )
        if differences and not restart:
            refused.setdefault("; ".join(differences), []).append(plan.shot)
            continue
        points.totals[plan.shot] = len(plan.batches)
        asked = [kind for kind in SHOT_OUTPUTS if kind.asked(identities[plan.shot].get("outputs") or {})]
        kept: set[str] = set()  # shot outputs intact in OUT and kept (a shot started over writes them again)
        unreadable = recorded is not None and not _frames_readable(out, plan.shot)
        if (restart or unreadable) and (recorded is not None or out.shot_group(plan.shot).exists()):
            points.restarts[plan.shot] = recorded
            why = f" ({differences[0]})" if differences else ""
            why = " (its frames array's metadata is unreadable)" if unreadable and not restart else why
            points.notes.append(f"farm: shot {plan.shot!r} starts over{why}")
            done: set[int] = set()
        elif recorded is None and out.shot_group(plan.shot).exists():
            points.restarts[plan.shot] = None  # set up by a render that stopped before recording it
            done = set()
        else:
            kept, done = _kept_outputs(out, plan, identities[plan.shot], asked, points)
            everything = kept == {kind.name for kind in asked}  # every shot output asked for is there
            repair = plan.shot in points.damaged  # damaged batches to render again
            if everything and not repair and (kept & JOINED_INTO or len(done) == len(plan.batches)):
                continue  # done (a joined video stands for its batches)
        for kind in asked:
            if kind.name not in kept:
                points.writes.setdefault(kind.name, set()).add(plan.shot)
        skipped = set()
        if frames is not None:
            wanted = {n - first_frame for n in frames}
            skipped = {b.index for b in plan.batches if not any(b.start <= i < b.stop for i in wanted)}
        if not skipped - done:  # every unfinished batch is rendered now: the shot can finish
            points.finish.add(plan.shot)
        if done:
            points.notes.append(
                f"farm: shot {plan.shot!r}: resuming, {len(done)} of {len(plan.batches)} batches already done"
            )
        points.pending.append(pending_plan(plan, done | skipped))
    if refused:
        raise other_settings_error(out, refused)
    return points


def other_settings_error(out: Output, refused: dict[str, list[str]]) -> FarmError:
    """The refusal of a render whose settings differ from those OUT recorded for some shots (`refused`:
    the differences, in words → the shots that have them)."""
    shots = [f"{'shot' if len(v) == 1 else 'shots'} {', '.join(map(repr, v))}: {k}"
             for k, v in refused.items()]  # fmt: skip
    return FarmError(
        f"output {str(out.root)!r} holds a render of other settings: " + " | ".join(shots)
        + ". Nothing was changed. Leave those options out to resume with OUT's settings, use --restart "
        "to render those shots over (their finished work is discarded), or a new --out"
    )  # fmt: skip


# The shot outputs batches' parts are joined into (the video, of segments): their parts are gone once
# it is written, so it stands for the batches, and is joined again when one of them is rendered again.
JOINED_INTO = frozenset(kind.joined_into for kind in BATCH_OUTPUTS if kind.joined_into)


def _kept_outputs(
    out: Output, plan: ShotPlan, identity: dict[str, Any], asked: Sequence[ShotOutput], points: ResumePoints
) -> tuple[set[str], set[int]]:
    """Of a resumed shot, the `asked` shot outputs kept (intact, and not to be joined again) and the
    batches done; damaged batches and lost joined outputs go into `points` (`damaged`, `notes`)."""
    outputs = identity.get("outputs") or {}
    intact = {kind.name for kind in asked if kind.intact(out, plan.shot, kind.written_suffix(out, outputs))}
    # the batch parts to check: not those joined into an output there, or into one not asked for
    joined = [kind.name for kind in SHOT_OUTPUTS if kind.name in intact or kind not in asked]
    kinds = batch_checks(joined)
    done, damaged = verified_batches(out, plan.shot, kinds, total=len(plan.batches))
    # an intact joined output (the video) is kept: a damaged batch decodes to the same frames again, so
    # that batch alone is rendered again and the video is not joined again
    kept = intact
    lost = [kind.name for kind in asked if kind.name in JOINED_INTO and kind.name not in kept
            and kind.marker(out, plan.shot).exists()]  # fmt: skip
    if damaged or lost:
        points.damaged[plan.shot] = (damaged, bool(lost))
        points.notes.append(_damage_note(out, plan.shot, damaged, lost, kinds, len(plan.batches),
                                         kept & JOINED_INTO))  # fmt: skip
    return kept, done


def _damage_note(
    out: Output, shot: str, damaged: set[int], lost: Sequence[str], kinds: Sequence[BatchOutput], total: int,
    kept: Collection[str],
) -> str:  # fmt: skip
    """What a resume found damaged in a shot (its `damaged` batches, checked for `kinds`, and its `lost`
    joined outputs) and what it renders again for it, in words; `kept`: its intact joined outputs."""
    parts: dict[int, list[str]] = {}
    for batch in sorted(damaged):
        record = read_marker(out.done_marker(shot, batch))
        parts[batch] = ["marker"] if record is None else [
            kind.name for kind in kinds if not kind.intact(out, shot, batch, record)]  # fmt: skip
    where = f"farm: shot {shot!r}:"
    if lost and damaged and all("segment" in names for names in parts.values()):
        # the segments a video is joined from are removed once it is joined: rebuilding it takes them all
        also = [f"batch {b} ({', '.join(n for n in names if n != 'segment')})"
                for b, names in parts.items() if names != ["segment"]]  # fmt: skip
        also_said = "".join(", " + a for a in also)
        return (f"{where} its {' and '.join(lost)} missing or damaged in OUT{also_said}; the segments it was "
                f"joined from are removed once joined, so {len(damaged)} of its {total} batches render again "
                "to rebuild it")  # fmt: skip
    said = [f"batch {batch} ({', '.join(names)})" for batch, names in parts.items()]
    said += [f"its {name}" for name in lost]
    again = "those batches" if len(damaged) > 1 else "that batch" if damaged else "it"
    intact = f"; its {' and '.join(sorted(kept))} intact and kept" if damaged and kept else ""
    return f"{where} {', '.join(said)} missing or damaged in OUT; rendering {again} again{intact}"


def check_frames_in_shot(frames: Sequence[int], plan: ShotPlan, first_frame: int) -> None:
    """A FarmError naming the shot's frame numbers when `frames` asks for any frame the shot lacks."""
    last = first_frame + plan.pixel_shape[0] - 1
    outside = sorted(n for n in set(frames) if not first_frame <= n <= last)
    if outside:
        beyond = f"frame {outside[0]}" if len(outside) == 1 else f"frames {outside[0]}..{outside[-1]}"
        raise FarmError(
            f"--frames asks for {beyond} beyond shot {plan.shot!r}, whose frames are numbered "
            f"{first_frame}-{last}; give frames in that range (--shots picks shots of other lengths); "
            "nothing was changed"
        )


def plan_opening(points: ResumePoints) -> Opening:
    """What opening OUT removes for the render `points` describes (`open_for_render` removes it): the
    shots it restarts, with the identity each replaces; the damaged batches and videos it found; and
    the frames of every batch to render in the other shots (a restarted shot's go with it)."""
    return Opening(
        restarts=dict(points.restarts),
        damaged={shot: (batches, [VIDEO.name] if video else [])
                 for shot, (batches, video) in points.damaged.items()},
        unfinished={plan.shot: [(b.start, b.stop) for b in plan.batches] for plan in points.pending
                    if plan.shot not in points.restarts},
    )  # fmt: skip


def check_output_identity(out: Output) -> None:
    """OUT's frames.zarr, when there is one, must be a farm render's (root metadata readable, attribute
    'farm' of this format): anything else is refused, never resumed or written into."""
    import zarr

    if not out.frames_zarr.exists():
        return
    try:
        meta = zarr.open_group(store=str(out.frames_zarr), mode="r").attrs.get("farm")
    except Exception as exc:  # zarr raises many types for damaged metadata
        meta = f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise FarmError(
            f"output {str(out.root)!r}: {str(out.frames_zarr)!r} is not a farm render's frames store (its "
            f"metadata is {meta if isinstance(meta, str) else 'missing farm attributes'}), so what it "
            "holds cannot be established. Nothing was changed. Use a new --out, or repair or remove it"
        )


def check_one_job(out: Output, job_path: str | os.PathLike[str], restart: bool) -> None:
    """OUT holds the render of one job: a render of another job store than the one OUT's root records is
    refused, nothing changed, unless `restart` (then OUT becomes the new job's). A recorded job that is
    no longer there (moved) refuses nothing: each shot's recorded latents decide (`resume_points`)."""
    from farm.safe_read import read_json

    root_meta = out.frames_zarr / "zarr.json"
    if restart or not os.path.lexists(root_meta):
        return
    try:
        meta = read_json(root_meta, f"output {str(out.root)!r}: {str(root_meta)!r}")
    except (OSError, FarmError):
        return  # unreadable: `check_output_identity` refuses it in its words
    farm_meta = (meta.get("attributes") or {}).get("farm") if isinstance(meta, dict) else None
    recorded = farm_meta.get("job") if isinstance(farm_meta, dict) else None
    if not isinstance(recorded, str):
        return
    try:
        same = os.path.samefile(recorded, job_path)
    except (OSError, ValueError):
        return
    if not same:
        raise FarmError(
            f"output {str(out.root)!r} holds a render of job {recorded!r}, not of {os.fspath(job_path)!r}; "
            "an output folder holds one job's render. Nothing was changed. Use a new --out, or --restart to "
            "make it this job's"
        )


def _has_finished_work(out: Output, shot: str) -> bool:
    """Batches marked done, or an output they were joined into."""
    joined = [kind for kind in SHOT_OUTPUTS if kind.name in JOINED_INTO]
    return bool(out.batches_done(shot)) or any(kind.marker(out, shot).exists() for kind in joined)


def _frames_readable(out: Output, shot: str) -> bool:
    """Whether the shot's frames array (when it exists) opens: its metadata is intact."""
    import zarr

    if not out.frames_array(shot).exists():
        return True
    try:
        zarr.open_array(store=str(out.frames_array(shot)), mode="r")
    except Exception:  # damaged metadata: many error types
        return False
    return True
