"""Writes that cannot leave OUT: a symbolic link put where farm writes, before the render or swapped in
while it writes, is refused in one line naming it, and nothing is written outside OUT
(`farm.media.beneath`, `farm.store.beneath_zarr`; docs/guarantees.md, "farm writes only inside OUT").

The writers are called here as a worker calls them, after every earlier check, with the link already in
place: what stops them is the walk from OUT's root itself. The race test swaps folders for links every
few milliseconds during real renders on a local cluster; `FARM_TEST_RACE_RENDERS` sets how many
renders it runs (the default keeps it to about a minute).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.media.settings import VideoSettings
from farm.planning.options import PlanOptions
from farm.run.render import render
from farm.store.output import Output

QUIET = {"log": lambda _: None}
TILES = PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: a render that got past the checks fails to connect
SHOT = "shot000"
PNGS = VideoSettings(sequence="png8")
RACE_RENDERS = int(os.environ.get("FARM_TEST_RACE_RENDERS", "4"))


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("adversarial-out") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=17, height=64, width=64, seed=5)
    return path


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` (links not followed) with its content hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}  # fmt: skip


def frames8(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (8, 64, 64, 3), dtype=np.uint8)


def swap_for_link(path: Path, target: Path) -> None:
    """Put a link to `target` where `path` is (its content moved into `target` first, as a copy an
    attacker would want farm to overwrite)."""
    if path.is_dir():
        shutil.copytree(path, target, dirs_exist_ok=True)
        shutil.rmtree(path)
    target.mkdir(exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def refused(write: Callable[[], object], link: Path) -> None:
    with pytest.raises(FarmError, match="symbolic link") as caught:
        write()
    message = str(caught.value)
    assert str(link) in message and "\n" not in message


# ---- a link where farm keeps a shot's folders: refused before anything is written ------------------


SHOT_FOLDERS = [f".farm/done/{SHOT}", f".farm/segments/{SHOT}", f"sequences/{SHOT}", "audio"]


@pytest.mark.parametrize("link", SHOT_FOLDERS)
def test_a_link_at_a_shots_folder_is_refused_before_the_render(job, tmp_path, link):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"{SHOT}.0001.png").write_bytes(b"someone else's")
    out = tmp_path / "out"
    swap_for_link(out / link, elsewhere)
    before = tree(elsewhere)
    with pytest.raises(FarmError, match="symbolic link") as caught:
        render(job, out, scheduler=NOWHERE, options=TILES, video=PNGS, **QUIET)
    assert str(out / link) in str(caught.value) and "\n" not in str(caught.value)
    assert tree(elsewhere) == before


# ---- a link swapped in where a worker writes, after every check before the write -------------------


@pytest.fixture
def prepared(job, tmp_path) -> Output:
    from farm.store.frames import prepare_output, write_frames
    from farm.store.job import open_job

    out = Output(tmp_path / "out")
    prepare_output(out, open_job(job), [(SHOT, (17, 64, 64), 8)])
    write_frames(out, SHOT, 0, frames8())  # the first batch's chunks exist: a later write replaces them
    return out


def test_a_done_marker_is_never_written_through_a_link(prepared, tmp_path):
    from farm.store.markers import mark_done

    out, elsewhere = prepared, tmp_path / "elsewhere"
    swap_for_link(out.done_dir(SHOT), elsewhere)
    (elsewhere / "00001").write_bytes(b"someone else's")
    before = tree(elsewhere)
    refused(lambda: mark_done(out.done_marker(SHOT, 1), {"chunks": {}}, root=out.root), out.done_dir(SHOT))
    assert tree(elsewhere) == before


def test_a_segment_is_never_written_through_a_link(prepared, tmp_path):
    from farm.media.video import encode_segment

    out, elsewhere = prepared, tmp_path / "elsewhere"
    swap_for_link(out.segments_dir(SHOT), elsewhere)
    (elsewhere / "00000.mp4").write_bytes(b"someone else's")
    before = tree(elsewhere)
    segment = out.segment(SHOT, 0)
    refused(lambda: encode_segment(frames8(), segment, 24, root=out.root), out.segments_dir(SHOT))
    assert tree(elsewhere) == before


def test_images_are_never_written_through_a_link(prepared, tmp_path):
    from farm.media.sequences import write_frames as write_images

    out, elsewhere = prepared, tmp_path / "elsewhere"
    out.sequence_dir(SHOT).mkdir(parents=True)
    swap_for_link(out.sequence_dir(SHOT), elsewhere)
    (elsewhere / f"{SHOT}.0001.png").write_bytes(b"someone else's")
    before = tree(elsewhere)
    folder = out.sequence_dir(SHOT)
    refused(lambda: write_images(frames8(), folder, SHOT, root=out.root), folder)
    assert tree(elsewhere) == before


def test_a_video_is_never_joined_through_a_link(prepared, tmp_path):
    from farm.media.video import encode_segment, join_segments

    out, elsewhere = prepared, tmp_path / "elsewhere"
    segment = tmp_path / "segment.mp4"
    encode_segment(frames8(), segment, 24)
    swap_for_link(out.videos_dir, elsewhere)
    (elsewhere / f"{SHOT}.mp4").write_bytes(b"someone else's")
    before = tree(elsewhere)
    refused(lambda: join_segments([segment], out.video(SHOT), root=out.root), out.videos_dir)
    assert tree(elsewhere) == before


def test_a_sound_file_is_never_written_through_a_link(prepared, tmp_path):
    from farm.media.audio import write_audio

    out, elsewhere = prepared, tmp_path / "elsewhere"
    swap_for_link(out.audio_dir, elsewhere)
    (elsewhere / f"{SHOT}.wav").write_bytes(b"someone else's")
    before = tree(elsewhere)
    silence = np.zeros((2, 4800), np.int16)
    refused(lambda: write_audio(out.audio_file(SHOT), silence, 48000, "wav", root=out.root), out.audio_dir)
    assert tree(elsewhere) == before


CHUNK_FOLDER = f"frames.zarr/{SHOT}/frames/c/0"


@pytest.mark.parametrize("link", ["frames.zarr", f"frames.zarr/{SHOT}/frames", CHUNK_FOLDER])
def test_frames_are_never_written_through_a_link(prepared, tmp_path, link):
    """The whole Zarr store, an array's folder, and a chunk folder inside it: the chunks they held are
    moved to where the link points, and a write through the link would replace them there."""
    from farm.store.frames import mark_valid, write_frames

    out, elsewhere = prepared, tmp_path / "elsewhere"
    swap_for_link(out.root / link, elsewhere)
    before = tree(elsewhere)
    assert before  # chunk files (or metadata) a write through the link would replace
    refused(lambda: write_frames(out, SHOT, 0, frames8(seed=1)), out.root / link)  # other bytes than before
    if link == "frames.zarr":
        refused(lambda: mark_valid(out, SHOT, 0, 8), out.root / link)
    assert tree(elsewhere) == before


def test_the_timeline_replaces_a_link_in_its_place(tmp_path):
    pytest.importorskip("opentimelineio")
    from farm.media.timeline import TimelineShot, write_timeline

    out, victim = tmp_path / "out", tmp_path / "victim.otio"
    out.mkdir()
    victim.write_bytes(b"someone else's")
    os.symlink(victim, out / "timeline.otio")
    shot = TimelineShot(SHOT, 17, Fraction(24), None, f"videos/{SHOT}.mp4", None, True)
    write_timeline(out, [shot], name="job")
    assert victim.read_bytes() == b"someone else's"
    assert not (out / "timeline.otio").is_symlink() and b"job" in (out / "timeline.otio").read_bytes()


def test_a_folder_farm_writes_in_that_is_a_file_is_refused(prepared):
    from farm.store.markers import mark_done

    out = prepared
    shutil.rmtree(out.done_dir(SHOT))
    out.done_dir(SHOT).write_bytes(b"not a folder")
    with pytest.raises(FarmError, match="not a folder"):
        mark_done(out.done_marker(SHOT, 0), root=out.root)
    assert out.done_dir(SHOT).read_bytes() == b"not a folder"


# ---- the race: folders swapped for links while a render writes -------------------------------------


# what a render raced by links says of the shot it fails: a link met, a folder of farm's not a folder,
# a file or folder moved away while farm wrote it, segments that were moved away before the join
ONE_LINE_REASONS = ("symbolic link", "not a folder", "moved or removed", "kept disappearing", "missing")


class Swapper(threading.Thread):
    """Swaps each of `folders` for a link to `outside` and back, every few milliseconds, keeping its
    content aside inside OUT (so nothing farm wrote leaves OUT but through the link)."""

    def __init__(self, folders: list[Path], outside: Path) -> None:
        super().__init__(daemon=True)
        self.folders, self.outside, self.stop = folders, outside, threading.Event()
        self.swaps = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for folder in self.folders:
                aside = folder.with_name(f"aside-{folder.name}")
                try:
                    os.rename(folder, aside)
                except OSError:
                    continue  # not made yet
                try:
                    os.symlink(self.outside, folder)
                    self.swaps += 1
                    time.sleep(0.002)
                    os.unlink(folder)
                except OSError:
                    pass  # farm made the folder again meanwhile
                try:
                    os.rename(aside, folder)
                except OSError:
                    shutil.rmtree(aside, ignore_errors=True)  # farm's new folder holds the rest
            time.sleep(0.001)

    def finish(self) -> None:
        self.stop.set()
        self.join()
        for folder in self.folders:
            if folder.is_symlink():
                folder.unlink()


@pytest.mark.slow
def test_folders_swapped_for_links_during_renders_get_nothing_written_outside(job, tmp_path, scheduler3):
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {f"{SHOT}.0001.png": b"someone else's image", "00000": b"someone else's marker"}
    for name, data in victims.items():
        (outside / name).write_bytes(data)
    swaps = 0
    for attempt in range(RACE_RENDERS):
        out = tmp_path / f"out{attempt}"
        swapper = Swapper([out / "sequences" / SHOT, out / ".farm" / "done" / SHOT], outside)
        swapper.start()
        try:
            stats = render(job, out, scheduler=scheduler3, options=TILES, video=PNGS, **QUIET)
            errors = [shot.error or "" for shot in stats.failed]
        except FarmError as exc:  # refused as it started: a link where farm keeps its folders
            errors = [str(exc)]
        finally:
            swapper.finish()
        swaps += swapper.swaps
        assert sorted(p.name for p in outside.iterdir()) == sorted(victims)
        assert {name: (outside / name).read_bytes() for name in victims} == victims
        for error in errors:
            assert "\n" not in error and str(out) in error, error
            assert any(what in error for what in ONE_LINE_REASONS), error
    assert swaps > 10 * RACE_RENDERS  # the race ran while the renders wrote


def test_an_interrupt_while_a_folder_is_opened_closes_each_descriptor_once(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (farm.cli raises them in the main thread) can land between closing a folder's
    parent and returning the folder: the interrupt must come out, not a second close of the parent
    (EBADF, or worse another thread's descriptor that took its number)."""
    from farm.media import beneath

    (tmp_path / "a" / "b").mkdir(parents=True)
    closed: list[int] = []
    real_close = os.close

    def close_then_interrupt(fd: int) -> None:
        real_close(fd)
        if fd in closed:
            raise AssertionError(f"descriptor {fd} closed twice")
        closed.append(fd)
        if len(closed) == 1:
            raise KeyboardInterrupt  # the signal handler runs right after the first close

    monkeypatch.setattr(beneath.os, "close", close_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        beneath.open_folder(tmp_path, tmp_path / "a" / "b")
    assert len(closed) == 2  # the root, then the open child "a"
