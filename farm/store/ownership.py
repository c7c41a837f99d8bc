"""OUT is farm's only where farm wrote it: checks, made before a render writes anything, that every
path it will write or remove stays inside OUT and that no file it would replace is someone else's.

- A symbolic link where farm keeps a folder or file of its own (`farm.store.output.Output`'s folders,
  the lock, a rendered shot's Zarr group and everything in it) would send farm's writes, truncations
  and removals to wherever it points: it is refused, naming it. (A final file farm renames into place
  replaces a link instead of following it, so links among finished files are harmless.)
- A shot output's file (video, sound, …: `farm.store.output_kinds`) or image of a shot that OUT holds
  no farm record of (`farm.run.resume`'s render identity) is the user's: it is refused, naming it,
  unless ``--restart`` (which allows replacing it).

Reads only, and reads only the paths of the shots being rendered (a few `lstat` calls per shot, and a
walk of each such shot's Zarr group).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from farm.errors import FarmError
from farm.media.names import is_farm_temporary
from farm.store.output import Output
from farm.store.output_kinds import SHOT_OUTPUTS, Outputs


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def farm_paths(out: Output, shots: Iterable[str]) -> list[Path]:
    """The folders and fixed files farm writes under OUT for these shots (whether they exist yet or not)."""
    state = out.state_dir
    paths = [out.frames_zarr, out.frames_zarr / "zarr.json", out.sequences_dir, state, out.lock_file,
             out.write_probe, state / "segments", state / "done", out.shot_locks_dir,
             out.guards_dir, out.renders_dir]  # fmt: skip
    for shot in shots:
        paths += [out.shot_group(shot), out.segments_dir(shot), out.done_dir(shot), out.sequence_dir(shot),
                  out.shot_lock_file(shot)]  # fmt: skip
        # the folder each shot output kind's file goes in (videos/, audio/, …), whatever its suffix
        folders = [kind.file(out, shot, "").parent for kind in SHOT_OUTPUTS]
        paths += [folder for folder in folders if folder != out.root]
    return list(dict.fromkeys(paths))


def links_in(folder: Path) -> Iterable[Path]:
    """Every symbolic link inside `folder` (not followed), the folder itself included."""
    if _is_link(folder):
        yield folder
        return
    folders = [folder]
    while folders:  # scandir's entries know whether they are links: no call per file
        try:
            entries = list(os.scandir(folders.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                yield Path(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                folders.append(Path(entry.path))


def check_no_links(out: Output, shots: Iterable[str]) -> None:
    """Refuse, naming it, a symbolic link where farm keeps its own folder or file for these shots, or
    anywhere in the Zarr group of one of them (Zarr writes chunks and metadata through links)."""
    shots = list(shots)
    found = [p for p in farm_paths(out, shots) if _is_link(p)]
    if not found:
        found = [link for shot in shots for link in links_in(out.shot_group(shot))]
    if found:
        where = found[0]
        raise FarmError(
            f"output {str(out.root)!r}: {str(where)!r} is a symbolic link (to {os.readlink(where)!r}) where "
            "farm keeps its own files; farm writes only inside OUT and never through a link. Nothing was "
            "changed: remove the link or use a new --out"
        )


def check_folders_not_links(out: Output, *folders: Path) -> None:
    """Refuse to write into any of `folders` (under OUT) when it, or a folder between it and OUT, is a
    symbolic link: checked again where a worker writes, after the render's own check of OUT."""
    for folder in folders:
        part = folder
        while part != out.root and out.root in part.parents:
            if _is_link(part):
                raise FarmError(
                    f"output {str(out.root)!r}: {str(part)!r} became a symbolic link (to "
                    f"{os.readlink(part)!r}) during the render; farm never writes through a link. Remove it "
                    "and run again"
                )
            part = part.parent


def foreign_files(
    out: Output, shot: str, outputs: Outputs, *, shot_files: bool = True
) -> list[Path]:
    """The files in this shot's final places that exist, other than farm's own temporaries: its file of
    each shot output kind `outputs` asks for (`farm.store.output_kinds.SHOT_OUTPUTS`: the video, the
    sound, …; unless not `shot_files`), and its image-sequence folder when `outputs` names a sequence. For
    a shot OUT holds no farm record of, they are not farm's."""
    found = []
    for kind in SHOT_OUTPUTS if shot_files else ():
        if kind.asked(outputs):
            path = kind.file(out, shot, kind.written_suffix(out, outputs))
            if path.exists() or _is_link(path):
                found.append(path)
    folder = out.sequence_dir(shot)
    if outputs.get("sequence") and folder.is_dir():
        found += sorted(p for p in folder.iterdir() if not is_farm_temporary(p.name))[:1]
    return found


def check_no_foreign_files(
    out: Output, shots: Iterable[str], recorded: Callable[[str], dict | None],
    asked: Callable[[str], Outputs], *, restart: bool,
) -> None:  # fmt: skip
    """Refuse to render a shot over files farm did not write: where OUT holds no record of the shot
    (`recorded(shot)` is None, `farm.run.resume.recorded_identity`) and no folder of its done markers
    (a shot whose record was damaged is `farm.run.resume`'s to refuse), whatever already sits in the
    final places of the outputs this render writes (`asked(shot)`: their identity's "outputs") is the
    user's. A shot whose record names no image sequence owns no images either. `restart` allows
    replacing them."""
    if restart:
        return
    for shot in shots:
        identity = recorded(shot)
        recorded_outputs = (identity or {}).get("outputs") or {}
        outputs = asked(shot)
        if identity is None and not out.done_dir(shot).exists():  # no record, no marker: farm never began it
            found = foreign_files(out, shot, outputs)
        elif outputs.get("sequence") and not recorded_outputs.get("sequence"):
            found = foreign_files(out, shot, outputs, shot_files=False)
        else:
            found = []
        if found:
            raise FarmError(
                f"output {str(out.root)!r}: {str(found[0])!r} is already there and farm did not write it "
                f"(OUT holds no farm render of shot {shot!r} that made it); farm does not overwrite files "
                "it did not write. Nothing was changed: move it away, use a new --out, or --restart to "
                "replace it"
            )
