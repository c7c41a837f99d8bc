"""The table of output kinds (`farm.store.output_kinds`) on real files: each kind's files, its check
against what the markers record, its removal; a restart removes exactly the entries' files; and each
kind has the task that writes it (`farm.worker.writers`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.media.audio import FORMATS as SOUND_FORMATS
from farm.media.audio import write_audio
from farm.media.settings import VideoSettings
from farm.planning.tiling import Batch
from farm.store.frames import chunk_files, create_frames_array, create_validity
from farm.store.markers import file_digest, file_record, mark_done
from farm.store.output import Output
from farm.store.output_kinds import (
    ALL_OUTPUTS,
    BATCH_OUTPUTS,
    FRAMES,
    SEGMENT,
    SEQUENCE,
    SHOT_OUTPUTS,
    SOUND,
    VIDEO,
    Opening,
    ShotOutput,
    batch_checks,
    batch_intact,
    batch_record,
    open_for_render,
    verified_batches,
)
from farm.worker.tasks import (
    BlendedFrames,
    encode_batch,
    finish_shot,
    mark_batch,
    write_batch,
    write_sequence,
)
from farm.worker.writers import BATCH_WRITERS, SHOT_WRITERS, batch_writers

SHOT, OTHER = "a", "b"
FRAMES_N, BATCH_N = 16, 8
# what OUT records for shot "a": a PNG sequence numbered from 1, 16 frames, H.264 video, FLAC sound
RECORDED = {"outputs": {"video": "h264", "sequence": "png8", "first_frame": 1, "audio": {"format": "flac"}},
            "plan": {"pixel_shape": [FRAMES_N, 16, 24]}}  # fmt: skip


def render_shot(out: Output, shot: str) -> None:
    """Every kind of a shot written by its own task, as a render writes them: two batches' frames,
    segments and images, each batch marked; the video joined; the sound written and marked; then the
    segments encoded again (as a resumed render whose video is re-joined has them beside the video)."""
    create_frames_array(out.frames_zarr, shot, (FRAMES_N, 16, 24), BATCH_N)
    create_validity(out, shot, FRAMES_N, BATCH_N)
    for folder in (out.videos_dir, out.segments_dir(shot)):  # as prepare_output makes them
        folder.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(sum(map(ord, shot))).integers(0, 256, (FRAMES_N, 16, 24, 3), dtype=np.uint8)
    video = VideoSettings(sequence="png8", preset="ultrafast", first_frame=1)
    batches = [Batch(shot, k, BATCH_N * k, BATCH_N * (k + 1), (0,)) for k in range(2)]

    def encode_all() -> None:
        for batch in batches:
            encode_batch(out, batch, BlendedFrames(rgb[batch.start : batch.stop]), 24.0, video, {})

    for batch in batches:
        frames = BlendedFrames(rgb[batch.start : batch.stop])
        write_batch(out, batch, frames)
        write_sequence(out, batch, frames, video)
    encode_all()
    for batch in batches:
        mark_batch(out, batch, 0.0, 0.0)
    finish_shot(out, shot, 2, {})
    sound = out.audio_file(shot, ".flac")
    write_audio(sound, np.zeros((2, 4800), np.int16), 48000, "flac")
    mark_done(out.audio_done_marker(shot), file_record(sound))
    mark_done(out.cancelled_marker(shot))
    encode_all()


@pytest.fixture
def out(tmp_path: Path) -> Output:
    out = Output(tmp_path / "out")
    render_shot(out, SHOT)
    render_shot(out, OTHER)
    # files farm did not write, in the folders where the kinds live
    for path in (out.videos_dir / "notes.txt", out.sequence_dir(SHOT) / "notes.txt",
                 out.audio_dir / "notes.txt", out.shot_group(SHOT) / "notes.txt"):  # fmt: skip
        path.write_text("mine")
    return out


def still_kind(folder: str) -> ShotOutput:
    """A shot output kind added to the table: ``<folder>/<shot>.txt`` under OUT, marked done as "still"."""
    return ShotOutput("still", asked=lambda outputs: True,
                      file=lambda out, shot, suffix: out.root / folder / f"{shot}{suffix}",
                      suffixes=lambda out, recorded: (".txt",), every_suffix=lambda: (".txt",),
                      marker=lambda out, shot: out.done_dir(shot) / "still",
                      written_suffix=lambda out, outputs: ".txt")  # fmt: skip


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def kind_files(out: Output, kind_name: str, shot: str) -> set[Path]:
    """What each kind owns of a shot, spelled independently of the table."""
    return {
        "frames": {p for p in files_under(out.shot_group(shot)) if p.name != "notes.txt"},
        "segment": files_under(out.segments_dir(shot)),
        "sequence": set(out.sequence_dir(shot).glob(f"{shot}.*.png")),
        "video": {out.videos_dir / f"{shot}.mp4"},
        "sound": {out.audio_dir / f"{shot}.flac"},
    }[kind_name]


def test_the_table_names_every_kind_once_with_a_writer_task():
    names = [k.name for k in ALL_OUTPUTS]
    assert names == ["frames", "segment", "sequence", "video", "sound"]
    assert {k.scope for k in BATCH_OUTPUTS} == {"batch"} and {k.scope for k in SHOT_OUTPUTS} == {"shot"}
    assert [w.kind for w in BATCH_WRITERS] == list(BATCH_OUTPUTS)
    assert [w.kind for w in SHOT_WRITERS.values()] == list(SHOT_OUTPUTS)
    assert SOUND.every_suffix() == tuple(suffix for suffix, _, _ in SOUND_FORMATS.values())


@pytest.mark.parametrize(
    ("settings", "kinds"),
    [
        (VideoSettings(), ["frames", "segment"]),
        (VideoSettings(enabled=False), ["frames"]),
        (VideoSettings(sequence="exr"), ["frames", "segment", "sequence"]),
        (VideoSettings(enabled=False, sequence="png16"), ["frames", "sequence"]),
    ],
)
def test_a_render_writes_the_batch_outputs_its_settings_ask_for(settings, kinds):
    writers = batch_writers(settings)
    assert [w.kind.name for w in writers] == kinds
    assert VIDEO.asked(settings.identity()) is settings.enabled
    assert SEQUENCE.asked(settings.identity()) is (settings.sequence is not None)
    assert (writers[0].alone is not None) and FRAMES.asked({})  # frames always; alone with no other


def test_a_batch_marker_holds_each_kinds_part_and_each_kind_checks_its_own(out: Output):
    record = json.loads(out.done_marker(SHOT, 1).read_bytes())
    assert list(record) == ["chunks", "segment"] and record == batch_record(out, SHOT, 1, 8, 16)
    import zarr

    array_dir = out.frames_array(SHOT)
    arr = zarr.open_array(store=str(array_dir), mode="r")
    chunks = chunk_files(array_dir, arr, 8, 16)
    assert record["chunks"] == {str(c.relative_to(array_dir)): file_digest(c) for c in chunks}
    assert record["segment"] == {"name": "00001.mp4", "sha256": file_digest(out.segment(SHOT, 1))}
    assert all(kind.intact(out, SHOT, 1, record) for kind in BATCH_OUTPUTS)

    chunks[0].write_bytes(chunks[0].read_bytes()[:-1])  # a truncated chunk: the frames' check fails alone
    out.segment(SHOT, 0).write_bytes(b"not a segment")  # an altered segment: the segment's check fails
    assert not FRAMES.intact(out, SHOT, 1, record) and SEGMENT.intact(out, SHOT, 1, record)
    record0 = json.loads(out.done_marker(SHOT, 0).read_bytes())
    assert FRAMES.intact(out, SHOT, 0, record0) and not SEGMENT.intact(out, SHOT, 0, record0)
    assert verified_batches(out, SHOT, batch_checks()) == (set(), {0, 1})
    assert verified_batches(out, SHOT, batch_checks(joined=["video"])) == ({0}, {1})  # segments joined
    assert batch_intact(out, OTHER, 1, BATCH_OUTPUTS)


@pytest.mark.parametrize("kind", SHOT_OUTPUTS, ids=lambda k: k.name)
def test_a_shot_output_is_intact_only_as_its_marker_records_it(out: Output, kind):
    path = kind.file(out, SHOT, next(s for s in kind.every_suffix() if kind.file(out, SHOT, s).exists()))
    assert kind.present(out, SHOT) and not kind.damaged(out, SHOT)
    assert kind.intact(out, SHOT, path.suffix)
    path.write_bytes(path.read_bytes()[:-1])
    assert kind.damaged(out, SHOT) and not kind.intact(out, SHOT, path.suffix) and kind.present(out, SHOT)
    path.unlink()
    assert kind.damaged(out, SHOT) and not kind.present(out, SHOT)
    assert kind.intact(out, OTHER, path.suffix)  # the other shot's is untouched


@pytest.mark.parametrize("kind", ALL_OUTPUTS, ids=lambda k: k.name)
def test_each_kind_removes_exactly_its_own_files(out: Output, kind):
    expected = kind_files(out, kind.name, SHOT)
    assert expected and all(p.exists() for p in expected)
    before = files_under(out.root)
    kind.remove(out, SHOT, RECORDED)
    assert before - files_under(out.root) == expected


def test_a_restart_removes_exactly_the_entries_files_and_markers(out: Output):
    owned = set().union(*(kind_files(out, k.name, SHOT) for k in ALL_OUTPUTS))
    before = files_under(out.root)
    open_for_render(out, Opening(restarts={SHOT: RECORDED}))
    removed = before - files_under(out.root)
    markers = {out.done_marker(SHOT, 0), out.done_marker(SHOT, 1), out.video_done_marker(SHOT),
               out.audio_done_marker(SHOT), out.cancelled_marker(SHOT)}  # fmt: skip
    assert owned and removed == owned | markers
    assert all((folder / "notes.txt").exists()
               for folder in (out.videos_dir, out.sequence_dir(SHOT), out.audio_dir, out.shot_group(SHOT)))


def test_a_restart_takes_the_video_of_this_and_the_recorded_codec_only(out: Output):
    mov = out.video(SHOT, ".mov")
    mov.write_bytes(b"a ProRes render's")
    open_for_render(Output(out.root, ".mp4"), Opening(restarts={SHOT: RECORDED}))  # h264 both: the .mov stays
    assert mov.exists() and not out.video(SHOT).exists()
    prores = {**RECORDED, "outputs": {"video": "prores_hq"}}
    open_for_render(Output(out.root, ".mp4"), Opening(restarts={SHOT: prores}))
    assert not mov.exists()


def test_forgetting_a_damaged_batch_removes_its_chunks_valid_chunk_and_markers(out: Output):
    import zarr

    record = json.loads(out.done_marker(SHOT, 1).read_bytes())
    chunks = {out.frames_array(SHOT) / name for name in record["chunks"]}
    before = files_under(out.root)
    open_for_render(out, Opening(damaged={SHOT: ([1], [VIDEO.name])}))
    removed = before - files_under(out.root)
    valid = zarr.open_array(store=str(out.shot_group(SHOT) / "valid"), mode="r")
    assert removed == chunks | {out.done_marker(SHOT, 1), out.video_done_marker(SHOT),
                                out.shot_group(SHOT) / "valid" / "c" / "1"}  # fmt: skip
    assert not valid[8:].any() and valid[:8].all()


def test_opening_clears_the_chunks_of_the_batches_about_to_render_and_nothing_else(out: Output):
    import zarr

    array_dir = out.frames_array(SHOT)
    chunks = set(chunk_files(array_dir, zarr.open_array(store=str(array_dir), mode="r"), 8, 16))
    stale = out.videos_dir / f".{SHOT}.mp4.farm-abcd1234.tmp.mp4"  # a killed render's temporary
    stale.write_bytes(b"half")
    before = files_under(out.root)
    open_for_render(out, Opening(unfinished={SHOT: [(8, 16)]}))
    removed = before - files_under(out.root)
    assert chunks and removed == chunks | {out.shot_group(SHOT) / "valid" / "c" / "1", stale}
    assert out.batches_done(SHOT) == {0, 1}  # its marker goes with the resume's decision, not here


def test_opening_removes_nothing_when_what_to_remove_cannot_be_found(out: Output):
    valid_meta = out.shot_group(OTHER) / "valid" / "zarr.json"
    valid_meta.unlink()
    valid_meta.mkdir()  # OTHER's valid array cannot be opened: its unfinished chunks cannot be located
    before = files_under(out.root)
    opening = Opening(restarts={SHOT: RECORDED}, unfinished={OTHER: [(0, 8)]})
    with pytest.raises(FarmError, match=f"cannot clear what this render replaces in '{out.root}': ") as error:
        open_for_render(out, opening)
    assert "\n" not in str(error.value)
    assert files_under(out.root) == before  # the restart found first, removed nothing
def test_resume_asks_each_shot_entry_whether_its_file_is_intact_and_what_it_spares(out: Output, monkeypatch):
    """`resume_points` on a real OUT, from the table alone: a shot whose every asked output is intact is
    left alone; a lost sound is written again alone (the batches, the joined video kept); an altered
    video is joined again, its marker forgotten; and a kind added to the table (a still) is written
    where it is missing, and spares its shot once it is there."""
    import zarr

    from farm.decoders.geometry import Geometry
    from farm.planning.tiling import plan_shot
    from farm.run import resume
    from farm.run.resume import record_identity, resume_points
    from farm.store.frames import FORMAT

    zarr.open_group(store=str(out.frames_zarr), mode="r+").attrs["farm"] = {"format": FORMAT}
    plan = plan_shot(SHOT, (4, 4, 2, 3), Geometry(8, 4, causal=False), batch_frames=BATCH_N)
    identity = {"outputs": {"video": "h264", "audio": {"format": "flac"}},
                "plan": {"pixel_shape": [FRAMES_N, 16, 24]}}  # fmt: skip
    record_identity(out, SHOT, identity, 2)
    assert plan.pixel_shape == (FRAMES_N, 16, 24) and len(plan.batches) == 2

    def points() -> resume.ResumePoints:
        return resume_points(out, [plan], {SHOT: identity}, restart=False)

    assert points().pending == [] and points().writes == {}
    out.audio_file(SHOT, ".flac").unlink()
    lost_sound = points()
    assert lost_sound.writes == {"sound": {SHOT}} and lost_sound.finish == {SHOT} and not lost_sound.damaged
    assert [b.index for b in lost_sound.pending[0].batches] == []  # no batch to render: the sound alone
    sound = out.audio_file(SHOT, ".flac")
    write_audio(sound, np.zeros((2, 4800), np.int16), 48000, "flac")
    mark_done(out.audio_done_marker(SHOT), file_record(sound))
    assert points().pending == []

    video = out.video(SHOT)
    video.write_bytes(video.read_bytes()[:-1])
    altered = points()
    assert altered.writes == {"video": {SHOT}} and altered.damaged == {SHOT: (set(), True)}
    assert any("its video missing or damaged" in note for note in altered.notes)

    still = still_kind("")
    monkeypatch.setattr(resume, "SHOT_OUTPUTS", (VIDEO, SOUND, still))
    finish_shot(out, SHOT, 2, {})  # the video joined again from the segments
    assert points().writes == {"still": {SHOT}} and points().finish == {SHOT}
    (out.root / f"{SHOT}.txt").write_text("still")
    mark_done(still.marker(out, SHOT), file_record(out.root / f"{SHOT}.txt"))
    assert points().pending == []


def test_a_file_in_the_place_of_any_shot_output_of_an_unrecorded_shot_is_the_users(tmp_path, monkeypatch):
    """The ownership check asks the table: the video, the sound in the format this render writes, and a
    kind added to it (a still) are each refused where OUT holds no record of the shot."""
    from farm.store import ownership
    from farm.store.ownership import check_no_foreign_files

    out = Output(tmp_path / "out")
    asked = {"video": "h264", "sequence": None, "audio": {"format": "flac"}}
    unrecorded = lambda shot: None  # noqa: E731
    check_no_foreign_files(out, [SHOT], unrecorded, lambda shot: asked, restart=False)  # nothing there
    still = still_kind("")
    monkeypatch.setattr(ownership, "SHOT_OUTPUTS", (VIDEO, SOUND, still))
    for path in (out.video(SHOT), out.audio_file(SHOT, ".flac"), out.root / f"{SHOT}.txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's")
        with pytest.raises(FarmError, match=f"{str(path)!r} is already there and farm did not write it"):
            check_no_foreign_files(out, [SHOT], unrecorded, lambda shot: asked, restart=False)
        check_no_foreign_files(out, [SHOT], unrecorded, lambda shot: asked, restart=True)  # consented
        path.unlink()
    out.audio_file(SHOT, ".wav").write_text("another format: not in the place of this render's sound")
    check_no_foreign_files(out, [SHOT], unrecorded, lambda shot: asked, restart=False)


def test_a_link_in_place_of_the_folder_of_any_shot_output_kind_is_refused(tmp_path, monkeypatch):
    from farm.store import ownership
    from farm.store.ownership import check_no_links

    out = Output(tmp_path / "out")
    out.root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    still = still_kind("stills")
    (out.root / "stills").symlink_to(elsewhere)
    check_no_links(out, [SHOT])  # not a folder of the table's kinds
    monkeypatch.setattr(ownership, "SHOT_OUTPUTS", (VIDEO, SOUND, still))
    with pytest.raises(FarmError, match="stills"):
        check_no_links(out, [SHOT])
