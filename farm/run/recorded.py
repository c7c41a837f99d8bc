"""A rerun into an OUT that holds a render takes, for each shot, the settings OUT recorded for it for
every option the user did not set, so the plain command resumes whatever options each shot was given
(shots recorded with different settings render one set after another, `requests_per_recorded_settings`);
only options the user set that differ from a shot's record are refused (`farm.run.resume.resume_points`
names them).

Pure apart from reading OUT's recorded identities (`farm.run.resume.recorded_identity`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from farm.media.settings import (
    HLG_MASTER,
    RATE_CONTROLLED,
    UNRECORDED_CRF,
    UNRECORDED_PRESET,
    with_decoder_hdr,
)
from farm.run.resume import identity_differences, other_settings_error, recorded_identity

if TYPE_CHECKING:
    from farm.media.settings import VideoSettings
    from farm.planning.options import PlanOptions
    from farm.run.request import RenderRequest
    from farm.store.output import Output

# The options a render identity records, by the name the user sets them with, and where in the identity.
# --tiles, --overlap and --chunk need no entry: auto tiles keep the grids and chunking OUT recorded
# (`farm.run.resume.recorded_layout`).
RECORDED_OPTIONS: dict[str, tuple[str, ...]] = {
    "--batch-frames": ("plan", "batch_frames"),
    "--codec": ("outputs", "video"),
    "--crf": ("outputs", "crf"),
    "--preset": ("outputs", "preset"),
    "--sequence": ("outputs", "sequence"),
    "--first-frame": ("outputs", "first_frame"),
    "--frames-dtype": ("outputs", "frames_dtype"),
    "--exr-values": ("outputs", "exr_values"),
    "--audio-format": ("outputs", "audio", "format"),
    "--hdr": ("outputs", "hdr"),
    "--colorspace": ("outputs", "colorspace"),
    "--timecode": ("outputs", "timecode"),
}
# options that set what a recorded value says besides its own (no video is a recorded codec of none)
ALSO_SET_BY = {"--codec": ("--no-video",)}
MISSING = object()
# values recorded only when not these (`VideoSettings.identity`), and the outputs they are recorded for
UNRECORDED_VALUES = {"--exr-values": "display", "--crf": UNRECORDED_CRF, "--preset": UNRECORDED_PRESET}


def _recorded_for(option: str, identity: dict[str, Any]) -> bool:
    """Whether `identity` would record `option` were it not its unrecorded value."""
    if option == "--exr-values":
        return _lookup(identity, ("outputs", "sequence")) == "exr"
    return _lookup(identity, ("outputs", "video")) in RATE_CONTROLLED


def given_settings(options: object | None, video: object | None) -> frozenset[str]:
    """The options `farm.render` was given: every plan option with `options`, every output option with
    `video` (None: left out)."""
    given = {"--batch-frames"} if options is not None else set()
    if video is not None:
        given |= set(RECORDED_OPTIONS) - {"--batch-frames"} | {"--no-video"}
    return frozenset(given)


def _lookup(identity: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = identity
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return MISSING
        value = value[key]
    return value


def recorded_settings(identities: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Each `RECORDED_OPTIONS` value the given recorded identities agree on (an option whose shots
    recorded different values, or none, is left out)."""
    identities = list(identities)
    settings: dict[str, Any] = {}
    for option, path in RECORDED_OPTIONS.items():
        values = [_lookup(identity, path) for identity in identities]
        if option in UNRECORDED_VALUES:
            values = [UNRECORDED_VALUES[option] if v is MISSING and _recorded_for(option, i) else v
                      for v, i in zip(values, identities, strict=True)]  # fmt: skip
        if option == "--audio-format":
            values = [v for v in values if v is not MISSING]  # recorded only for shots with sound
        distinct = {repr(v) for v in values}
        if values and len(distinct) == 1 and values[0] is not MISSING:
            settings[option] = values[0]
    return settings


def taken_settings(settings: dict[str, Any], given: frozenset[str] | None) -> dict[str, Any]:
    """The recorded `settings` the user did not set (`given`: the options set; None: all of them)."""
    given = given if given is not None else frozenset(RECORDED_OPTIONS) | {"--no-video"}
    return {k: v for k, v in settings.items() if k not in given and not given & set(ALSO_SET_BY.get(k, ()))}


def video_with(video: VideoSettings, taken: dict[str, Any]) -> VideoSettings:
    """`video` with the output settings among `taken` (option → recorded value)."""
    changes: dict[str, Any] = {}
    if "--codec" in taken:
        codec = taken["--codec"]
        if codec is None:
            changes.update(enabled=False)
        else:  # an HDR render's video is its HLG master, which --hdr (recorded beside it) makes
            changes.update(enabled=True, **({} if codec == HLG_MASTER else {"codec": codec}))
    fields = {"--crf": "crf", "--preset": "preset",
              "--sequence": "sequence", "--frames-dtype": "frames_dtype", "--exr-values": "exr_values",
              "--audio-format": "audio_format", "--hdr": "hdr", "--colorspace": "colorspace",
              "--timecode": "timecode"}  # fmt: skip
    changes.update({fields[k]: v for k, v in taken.items() if k in fields})
    if taken.get("--first-frame") is not None:
        changes["first_frame"] = taken["--first-frame"]
    return dataclasses.replace(video, **changes) if changes else video


def options_with(options: PlanOptions, taken: dict[str, Any]) -> PlanOptions:
    """`options` with the batch frames among `taken`."""
    if "--batch-frames" not in taken:
        return options
    return dataclasses.replace(options, batch_frames=int(taken["--batch-frames"]))


def out_settings(out: Output, shots: Sequence[str]) -> dict[str, Any]:
    """The settings OUT recorded for the named shots that they agree on (none when OUT holds no render)."""
    if not out.frames_zarr.exists():
        return {}
    return recorded_settings(identity for identity in (recorded_identity(out, s) for s in shots) if identity)


def _with_taken(request: RenderRequest, taken: dict[str, Any]) -> RenderRequest:
    if not taken:
        return request
    return dataclasses.replace(request, options=options_with(request.options, taken),
                               video=video_with(request.video, taken))  # fmt: skip


def requests_per_recorded_settings(
    request: RenderRequest, shots: Sequence[str], job_shots: Sequence[str]
) -> list[tuple[RenderRequest, dict[str, Any]]]:
    """`request` as one render per set of recorded settings, each with the settings it takes: each of the
    named `shots` resumes with what OUT recorded for it in place of the options the user did not set (a
    shot OUT holds no render of takes what the job's shots in OUT agree on). One request, its shots
    unchanged, when they all agree."""
    if request.restart or not request.out.frames_zarr.exists():
        return [(request, {})]
    identities = {shot: recorded_identity(request.out, shot) for shot in job_shots}
    agreed = taken_settings(recorded_settings(i for i in identities.values() if i), request.given)
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for shot in shots:
        identity = identities.get(shot)
        taken = taken_settings(recorded_settings([identity]), request.given) if identity else agreed
        groups.setdefault(repr(sorted(taken.items())), (taken, []))[1].append(shot)
    if len(groups) <= 1:
        taken = next(iter(groups.values()))[0] if groups else {}
        return [(_with_taken(request, taken), taken)]
    parts = []
    for k, (taken, names) in enumerate(groups.values()):  # a pass's own id: `farm cancel ID` covers it
        render_id = f"{request.render_id}.{k}" if k else request.render_id
        part = dataclasses.replace(request, shots=tuple(names), render_id=render_id)
        parts.append((_with_taken(part, taken), taken))
    return parts


def differing_settings(takens: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of `takens` (settings of renders run one after another) with only the options whose values
    differ between them."""
    differ = {k for k in set().union(*takens) if len({repr(t.get(k, MISSING)) for t in takens}) > 1}
    return [{k: v for k, v in taken.items() if k in differ} for taken in takens]


def describe_settings(taken: dict[str, Any]) -> str:
    """Recorded settings as the user would set them (``--codec prores_hq``, ``--no-video``)."""
    said = ["--no-video" if (option, value) == ("--codec", None) else f"no {option}" if value is None
            else f"{option} {value}" for option, value in sorted(taken.items())]  # fmt: skip
    return ", ".join(said) or "farm's defaults"


def _settings_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """What of a render identity the recorded options set: the plan's batch frames, the outputs but the
    sound (whose identity is its latents')."""
    outputs = {k: v for k, v in (identity.get("outputs") or {}).items() if k != "audio"}
    return {"plan": {"batch_frames": (identity.get("plan") or {}).get("batch_frames")}, "outputs": outputs}


def check_passes(parts: Sequence[RenderRequest], spec_hdr: str | None) -> None:
    """Before the first of renders run one after another: refuse, with nothing changed, options the user
    set that contradict what OUT recorded for a shot of any of them (each render would refuse them only
    once the renders before it had run)."""
    refused: dict[str, list[str]] = {}
    for part in parts:
        video = with_decoder_hdr(part.video, spec_hdr)  # what the render records
        current = {"plan": {"batch_frames": part.options.batch_frames}, "outputs": video.identity()}
        for shot in part.shots or ():
            recorded = recorded_identity(part.out, shot)
            differences = identity_differences(_settings_identity(recorded), current) if recorded else []
            if differences:
                refused.setdefault("; ".join(differences), []).append(shot)
    if refused:
        raise other_settings_error(parts[0].out, refused)
