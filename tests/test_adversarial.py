"""A farm shared by many people: hostile or careless inputs (OUT trees, job stores, weights, rates, the
farm page) are refused by what they claim, in one line, before any cluster starts, and farm writes only
inside OUT. No cluster here: every refusal tested is one that must come before a cluster (a render
that got past them would fail on the unreachable scheduler `NOWHERE` instead, and the test with it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from farm.errors import FarmError
from farm.inputs.synthetic import synth
from farm.media.settings import VideoSettings
from farm.planning.options import PlanOptions
from farm.run.render import render
from farm.store.lock import output_lock
from farm.store.output import Output

QUIET = {"log": lambda _: None}
TILES = PlanOptions(tiles=(1, 1, 1), batch_frames=8)
NOWHERE = "tcp://127.0.0.1:9"  # no scheduler: whatever gets as far as a cluster fails to connect


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("adversarial") / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, seed=3)
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- OUT is farm's, and only what farm wrote in it -------------------------------------------------


@pytest.mark.parametrize("link", [".farm/lock", ".farm", "videos", "frames.zarr", ".farm/write-test",
                                  ".farm/renders"])
def test_a_link_where_farm_keeps_its_files_is_refused(job, tmp_path, link):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "shot000.mp4"
    victim.write_bytes(b"someone else's file")
    out = tmp_path / "out"
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim if link.endswith(("lock", "test")) else elsewhere, out / link)
    with pytest.raises(FarmError, match="symbolic link") as refused:
        render(job, out, scheduler=NOWHERE, options=TILES, **QUIET)
    assert str(out / link) in str(refused.value) and "\n" not in str(refused.value)
    assert tree(elsewhere) == {"shot000.mp4": b"someone else's file"}


def test_a_link_inside_a_shots_zarr_group_is_refused(job, tmp_path):
    out = tmp_path / "out"
    (out / "frames.zarr" / "shot000").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "frames.zarr" / "shot000" / "frames")
    with pytest.raises(FarmError, match="symbolic link"):
        render(job, out, scheduler=NOWHERE, options=TILES, **QUIET)


def test_the_lock_is_never_taken_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / ".farm").mkdir(parents=True)
    os.symlink(victim, Output(out).lock_file)
    with pytest.raises(FarmError, match="symbolic link"), output_lock(out, ["shot000"], job=tmp_path / "job"):
        pass
    assert victim.read_bytes() == b"keep me"
    os.unlink(Output(out).lock_file)
    (out / ".farm" / "locks").mkdir()
    os.symlink(victim, Output(out).shot_lock_file("shot000"))  # a shot's lock
    with pytest.raises(FarmError, match="symbolic link"), output_lock(out, ["shot000"], job=tmp_path / "job"):
        pass
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize(
    ("path", "video"),
    [
        ("videos/shot000.mp4", VideoSettings()),
        ("sequences/shot000/shot000.0001.png", VideoSettings(sequence="png8")),
    ],
)
def test_files_farm_did_not_write_are_not_overwritten(job, tmp_path, path, video):
    out = tmp_path / "out"
    (out / path).parent.mkdir(parents=True)
    (out / path).write_bytes(b"the user's own")
    before = tree(out)
    with pytest.raises(FarmError, match="did not write") as refused:
        render(job, out, scheduler=NOWHERE, options=TILES, video=video, **QUIET)
    assert str(out / path) in str(refused.value) and "--restart" in str(refused.value)
    assert tree(out) == before
    # --restart is the user's consent: the render gets past the check (and on to the cluster)
    with pytest.raises(FarmError, match="scheduler|connect|127.0.0.1:9"):
        render(job, out, scheduler=NOWHERE, options=TILES, video=video, restart=True, **QUIET)


def test_a_done_marker_follows_the_umask(tmp_path):
    from farm.store.markers import mark_done

    old = os.umask(0o022)
    try:
        mark_done(tmp_path / "done" / "00000", {"chunks": {}})
    finally:
        os.umask(old)
    assert (tmp_path / "done" / "00000").stat().st_mode & 0o777 == 0o644


# ---- job stores that claim what they do not hold -------------------------------------------------


def bad_job(tmp_path: Path, shots: int = 2) -> Path:
    path = tmp_path / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=shots, frames=9, height=64, width=64, seed=3)
    return path


def edit_json(path: Path, edit) -> None:
    import json

    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def test_a_chunk_shape_beyond_the_array_is_refused_by_its_claim(tmp_path):
    job = bad_job(tmp_path, shots=1)

    def claim(meta):
        meta["chunk_grid"]["configuration"]["chunk_shape"] = [8, 2, 4096, 8192]

    edit_json(job / "shot000" / "latent" / "zarr.json", claim)
    with pytest.raises(FarmError, match="more than the array") as refused:
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, **QUIET)
    assert "shot000" in str(refused.value)


def zstd_frame_claiming(size: int) -> bytes:
    """A zstd frame header that declares `size` unpacked bytes (8-byte content size), then junk."""
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + size.to_bytes(8, "little") + b"\0" * 64


@pytest.mark.parametrize("frame", [zstd_frame_claiming(2 * 2**30), b"\x28\xb5\x2f\xfd\x00\x50" + b"\0" * 64])
def test_a_chunk_that_claims_to_unpack_beyond_its_chunk_is_refused_unread(tmp_path, frame):
    """The job-store bomb: a small zstd chunk that inflates far beyond its chunk (or does not say how
    far) fails its shot by name before any cluster; the other shot goes on (here: on to the cluster)."""
    from farm.run.resume import latent_identities
    from farm.store.job import open_job

    job = bad_job(tmp_path)
    chunk = next(
        p for p in sorted((job / "shot001" / "latent").rglob("*")) if p.is_file() and p.name != "zarr.json"
    )
    chunk.write_bytes(frame)
    hashes, errors = latent_identities(open_job(job), ["shot000", "shot001"])
    assert set(hashes) == {"shot000"} and "unpacked" in str(errors["shot001"])
    with pytest.raises(FarmError, match="scheduler|connect|127.0.0.1:9"):  # shot000 goes on
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, shots=["shot001", "shot000"],
                  **QUIET)  # fmt: skip
    with pytest.raises(FarmError, match="unpacked"):
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, shots=["shot001"], **QUIET)


@pytest.mark.parametrize("frames", [10**6, 10**9])
def test_a_shape_claim_beyond_the_maxima_is_refused_at_once(tmp_path, frames):
    from farm.planning.jobplan import plan_job
    from farm.store.job import open_job

    job = bad_job(tmp_path, shots=1)

    def claim(meta):
        meta["shape"][1] = frames

    edit_json(job / "shot000" / "latent" / "zarr.json", claim)
    with pytest.raises(FarmError, match="latent frames; farm renders at most 16384"):
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, **QUIET)
    with pytest.raises(FarmError, match="latent frames; farm renders at most 16384"):
        plan_job(open_job(job), TILES, 1)


def test_deep_attributes_fail_their_shot_only(tmp_path):
    from farm.store.job import open_job

    job = bad_job(tmp_path)
    meta = job / "shot001" / "zarr.json"
    meta.write_text(meta.read_text()[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    opened = open_job(job)
    assert opened.shots["shot001"].problem and "nests too deep" in opened.shots["shot001"].problem
    with pytest.raises(FarmError, match="nests too deep"):
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, shots=["shot001"], **QUIET)
    with pytest.raises(FarmError, match="scheduler|connect|127.0.0.1:9"):  # shot000 goes on
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, **QUIET)


def test_a_shot_folder_that_leaves_the_store_fails_by_name(tmp_path):
    import shutil

    from farm.store.job import open_job

    job = bad_job(tmp_path)
    outside = tmp_path / "outside"
    shutil.move(job / "shot001", outside)
    os.symlink(outside, job / "shot001")
    problem = open_job(job).shots["shot001"].problem
    assert problem and "outside the job store" in problem
    with pytest.raises(FarmError, match="outside the job store"):
        render(job, tmp_path / "out", scheduler=NOWHERE, options=TILES, shots=["shot001"], **QUIET)


# ---- every refusal before any cluster and any task -------------------------------------------------


@pytest.fixture(scope="module")
def too_large(tmp_path_factory) -> Path:
    """One LTX-2 shot of 121x1408x2432: a whole-frame tile is estimated at ~46 GiB (more than any
    machine this suite runs on has, CPU or GPU)."""
    path = tmp_path_factory.mktemp("too-large") / "job.zarr"
    synth(path, decoder="ltx2", shots=1, frames=121, height=1408, width=2432, seed=1)
    return path


def test_a_tile_too_large_for_this_machine_starts_no_local_cluster(too_large, tmp_path, monkeypatch):
    def no_cluster(**_):
        raise AssertionError("a cluster was started for a render that cannot fit")

    monkeypatch.setattr("farm.run.render.connect", no_cluster)  # where render looks it up
    with pytest.raises(FarmError, match="estimated to need"):
        render(too_large, tmp_path / "out", workers=1, options=TILES, **QUIET)
    assert not (tmp_path / "out").exists()


def test_a_tile_too_large_submits_nothing_to_a_shared_cluster(too_large, tmp_path, cluster3):
    def transitions(dask_scheduler=None):
        return [str(t[0]) for t in dask_scheduler.transition_log]

    with pytest.raises(FarmError, match="estimated to need"):
        render(too_large, tmp_path / "out", scheduler=cluster3.scheduler.address, options=TILES,
                  render_id="refusedfit", **QUIET)  # fmt: skip
    assert not [key for key in cluster3.run_on_scheduler(transitions) if "refusedfit" in key]


# ---- a farm page fit for a shared network ---------------------------------------------------------


def test_workflow_arguments_are_not_published():
    import dask.config

    from farm.submit import published_args

    args = ["--api-token=s3cret", "--password", "hunter2", "shots.txt", "-5"]
    assert published_args(args) == ["(5 arguments)"]
    with dask.config.set({"farm.page-arguments": "masked"}):
        masked = published_args(args)
    assert masked == ["--api-token=***", "--password", "***", "***", "***"]
    assert not any(secret in " ".join(masked) for secret in ("s3cret", "hunter2", "shots.txt"))


@pytest.fixture
def page(cluster3):
    from farm.dashboard import monitor

    link = monitor.install(cluster3)
    assert link is not None
    return link


def http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("refresh", ["%C2%B2", "9" * 5000, "-1", "1e3"])
def test_bad_query_parameters_are_a_400_not_a_500(page, refresh):
    assert http_status(f"{page}?refresh={refresh}") == 400
    assert http_status(f"{page}?refresh=5") == 200


def test_the_page_forgets_finished_renders_and_workflows_beyond_its_limits(page, cluster3):
    import json
    import time
    import urllib.request

    import dask.config

    # the newest records on the cluster (other tests' renders on it are older), so that the count limit
    # keeps exactly the last five of these whatever ran before
    now = time.time() + 1000
    for i in range(12):
        cluster3.set_metadata(["farm", "renders", f"old-{i}"], {
            "state": "done", "started": now - 100 + i, "updated": now - 100 + i, "job": "j", "out": "o",
            "shots": {},
        })  # fmt: skip
        cluster3.set_metadata(["farm", "submissions", f"sub-{i}"], {
            "script": "/home/someone/secret/wf.py", "args": ["(1 argument)"], "state": "done",
            "started": now - 100 + i, "finished": now - 99 + i, "host": "node7", "pid": 4242, "user": "ann",
            "log": ["x" * 5000],
        })  # fmt: skip
    ancient = time.time() - 7200
    cluster3.set_metadata(["farm", "renders", "ancient"], {"state": "failed", "started": ancient,
                                                           "updated": ancient, "shots": {}})  # fmt: skip
    with dask.config.set({"farm.page-keep-renders": 5, "farm.page-keep-hours": 1}):
        from farm.dashboard.monitor import PRUNE_EVERY_S

        time.sleep(0.1)
        deadline = time.time() + PRUNE_EVERY_S + 5
        while True:
            with urllib.request.urlopen(page.replace("/farm", "/farm/api/renders.json"), timeout=20) as r:
                snap = json.loads(r.read())
            mine = [r["render"] for r in snap["renders"] if r["render"].startswith(("old-", "ancient"))]
            if len(mine) <= 5 or time.time() > deadline:
                break
            time.sleep(1)
    assert set(mine) == {f"old-{i}" for i in range(7, 12)}
    subs = [s for s in snap["submissions"] if s["submission"].startswith("sub-")]
    assert {s["submission"] for s in subs} == {f"sub-{i}" for i in range(7, 12)}
    for s in subs:
        assert "host" not in s and "pid" not in s and s["script"] == "wf.py" and s["user"] == "ann"
        assert all(len(line) <= 300 for line in s["log"])


# ---- owners -------------------------------------------------------------------------------------


def test_cancelling_another_users_render_needs_force(cluster3):
    import time

    from farm import submit
    from farm.owner import current_user

    address = cluster3.scheduler.address
    record = {"state": "running", "started": time.time(), "updated": time.time(), "shots": {},
              "owner": {"user": "someone-else", "host": "node7"}}  # fmt: skip
    cluster3.set_metadata(["farm", "renders", "theirs-1"], record)
    with pytest.raises(FarmError, match="someone-else@node7.*--force"):
        submit.cancel("theirs-1", address, log=lambda _: None)
    assert cluster3.get_metadata(["farm", "cancelled"], default={}).get("theirs-1") is None
    mine = {**record, "owner": {"user": current_user(), "host": "here"}}
    cluster3.set_metadata(["farm", "renders", "mine-1"], mine)
    assert submit.cancel("mine-1", address, log=lambda _: None, quiet_for=0.1) == 0
    assert submit.cancel("theirs-1", address, log=lambda _: None, quiet_for=0.1, force=True) == 0
    # a submitted workflow's renders belong to whoever submitted it
    cluster3.set_metadata(
        ["farm", "submissions", "s9"], {"state": "done", "user": "someone-else", "host": "h"}
    )
    cluster3.set_metadata(["farm", "renders", "s9.1-job"], mine)
    with pytest.raises(FarmError, match="someone-else"):
        submit.cancel("s9.1-job", address, log=lambda _: None)


# ---- weights checked whole, by a pickle reader that builds nothing ---------------------------------


def cut_safetensors(tmp_path: Path) -> tuple[Path, int]:
    """A .safetensors file cut at half its bytes (its header whole): (path, bytes missing)."""
    from safetensors.numpy import save_file

    path = tmp_path / "vae.safetensors"
    save_file({"decoder.conv_in.weight": np.ones((64, 64, 3), np.float32)}, str(path))
    size = path.stat().st_size
    os.truncate(path, size // 2)
    return path, size - size // 2


def one_line_refusal(result, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_a_safetensors_file_cut_short_is_refused_by_synth_ingest_and_render(tmp_path):
    import json

    from tests.helpers import farm

    cut, missing = cut_safetensors(tmp_path)
    made = farm("synth", str(tmp_path / "a.zarr"), "--decoder", "ltx2-tiny", "--weights", str(cut))
    one_line_refusal(made, str(cut), "cut short", f"{missing} bytes missing")
    assert not (tmp_path / "a.zarr").exists()
    latent = tmp_path / "latent.npy"
    np.save(latent, np.zeros((8, 2, 4, 4), np.float32))
    ingested = farm("ingest", str(tmp_path / "b.zarr"), str(latent), "--decoder", "ltx2-tiny",
                    "--weights", str(cut), "--latents", "denormalized")  # fmt: skip
    one_line_refusal(ingested, str(cut), f"{missing} bytes missing")
    job = bad_job(tmp_path, shots=1)  # random weights, then pointed at the cut file
    meta = json.loads((job / "zarr.json").read_text())
    meta["attributes"]["farm"]["decoder"]["weights"] = {"path": str(cut)}
    (job / "zarr.json").write_text(json.dumps(meta))
    rendered = farm("render", str(job), "--out", str(tmp_path / "out"), "--scheduler", NOWHERE)
    one_line_refusal(rendered, str(cut), f"{missing} bytes missing")


def torch_zip(tmp_path: Path, tensors: dict) -> Path:
    import torch

    path = tmp_path / "vae.pt"
    torch.save(tensors, path)
    return path


def rewrite_member(path: Path, edit) -> None:
    """Rewrite a zip archive with each member's bytes passed through `edit(name, data)`."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info, data in members:
            z.writestr(info.filename, edit(info.filename, data))


def test_a_pt_archive_with_a_short_member_is_refused_with_what_is_missing(tmp_path):
    import torch

    from farm.decoders.checkpoints import read_tensor_infos

    path = torch_zip(tmp_path, {"decoder.conv_in.weight": torch.ones(1000)})
    rewrite_member(path, lambda name, data: data[:1000] if "/data/" in name else data)
    with pytest.raises(FarmError, match="cut short: 3000 bytes missing") as refused:
        read_tensor_infos([path])
    assert str(path) in str(refused.value)


def test_a_pt_storage_far_larger_than_its_tensors_is_refused_unread(tmp_path):
    import torch

    from farm.decoders.checkpoints import read_tensor_infos

    big = torch.zeros(2**21)  # 8 MiB of storage behind 96 floats
    path = torch_zip(tmp_path, {"decoder.conv_in.weight": big[:96]})
    with pytest.raises(FarmError, match="declares 8388608 bytes for tensors of 384 bytes"):
        read_tensor_infos([path])
    fine = torch_zip(tmp_path, {"decoder.conv_in.weight": big[:96].clone()})
    assert read_tensor_infos([fine])["decoder.conv_in.weight"].shape == (96,)


@pytest.mark.parametrize(
    "payload",
    [b"ctorch._utils\n_rebuild_tensor_v2\n)R.", b"ctorch\nFloatStorage\n)R.",
     b"}(X\x01\x00\x00\x00aQ\x8c\x01xu."],  # fmt: skip
    ids=["rebuild-without-arguments", "storage-called", "bad-persistent-id"],
)
def test_a_crafted_pickle_is_refused_in_one_line(tmp_path, payload):
    import torch

    from farm.decoders.checkpoints import read_tensor_infos

    path = torch_zip(tmp_path, {"decoder.conv_in.weight": torch.ones(4)})
    rewrite_member(path, lambda name, data: payload if name.endswith("data.pkl") else data)
    with pytest.raises(FarmError, match="not a torch checkpoint farm can read") as refused:
        read_tensor_infos([path])
    assert "\n" not in str(refused.value)


# ---- one line for every error a user can cause -----------------------------------------------------


@pytest.mark.parametrize("fps", ["1/1000000000", "1000000007/1000000006", "0.001"])
def test_absurd_or_inexact_rates_are_refused_at_synth_and_ingest(tmp_path, fps):
    from farm.store.job import write_shot

    with pytest.raises(FarmError, match="from 1/100 to 1000"):
        synth(tmp_path / "a.zarr", decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, fps=fps)
    job = bad_job(tmp_path, shots=1)
    with pytest.raises(FarmError, match="from 1/100 to 1000"):
        write_shot(job, "extra", np.zeros((8, 2, 2, 2), np.float32), fps=fps)


def test_install_hints_name_the_distribution():
    import re

    root = Path(__file__).resolve().parents[1]
    files = [*(root / "farm").rglob("*.py"), *(root / "docs").glob("*.md"), root / "README.md"]
    texts = [p.read_text() for p in files]
    assert not [m for t in texts for m in re.findall(r"install ['\"]?farm\[", t)]


def test_demo_refuses_to_replace_a_job_store_it_did_not_make(tmp_path):
    from tests.helpers import farm

    theirs = tmp_path / "job.zarr"
    synth(theirs, decoder="ltx2-tiny", shots=1, frames=9, height=64, width=64, seed=9)
    before = tree(theirs)
    result = farm("demo", "--out", str(tmp_path), "--workers", "1")
    one_line_refusal(result, str(theirs), "did not make")
    assert tree(theirs) == before


def test_a_client_without_tls_settings_is_told_before_it_connects_to_a_tls_scheduler(job, tmp_path):
    from farm import submit

    with pytest.raises(FarmError, match="speaks TLS, but this client cannot") as refused:
        render(job, tmp_path / "out", scheduler="tls://127.0.0.1:9", options=TILES, **QUIET)
    assert "distributed.comm.tls.ca-file is not set" in str(refused.value)
    with pytest.raises(FarmError, match="speaks TLS"):
        submit.client_for("tls://127.0.0.1:9")


@pytest.fixture
def full_disk(tmp_path):
    """A 4 MiB file system of its own (tmpfs; needs the right to mount, else the test is skipped)."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=4M", "tmpfs", str(disk)]
    mounted = subprocess.run(command, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small file system here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as fh, pytest.raises(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def test_a_full_disk_on_a_worker_is_one_line_naming_the_disk(full_disk, tmp_path):
    from farm.errors import FarmRuntimeError
    from farm.planning.tiling import Batch
    from farm.store.frames import prepare_output
    from farm.store.job import open_job
    from farm.worker.tasks import BlendedFrames, write_batch

    out = Output(full_disk / "out")
    prepare_output(out, open_job(bad_job(tmp_path, shots=1)), [("shot000", (9, 64, 64), 8)])
    fill(full_disk)
    frames = np.random.default_rng(0).integers(0, 255, (8, 64, 64, 3), dtype=np.uint8)
    with pytest.raises(FarmRuntimeError, match="is full on") as refused:
        write_batch(out, Batch("shot000", 0, 0, 8, (0,)), BlendedFrames(frames))
    assert str(out.root) in str(refused.value) and "\n" not in str(refused.value)


def test_farm_errors_on_workers_leave_no_traceback_and_shots_sharing_one_share_a_line():
    import logging

    from farm.cli import failure_lines
    from farm.run.graph import ShotOutcome
    from farm.worker.transport_plugin import FarmErrorsInOneLine

    def compute_failed(exception: str) -> logging.LogRecord:
        text = "Compute Failed\nKey: %s\nState: %s\nTask: %s\nException: %r\nTraceback: %r\n"
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, text,
                                 ("k", "executing", "task", exception, "  File ..."), None)  # fmt: skip

    keep = FarmErrorsInOneLine()
    assert not keep.filter(compute_failed("FarmRuntimeError('the disk holding ... is full')"))
    assert keep.filter(compute_failed("ZeroDivisionError('division by zero')"))
    full = "the disk holding '/o' is full on node7; finished batches are kept"
    failed = [ShotOutcome(s, 0, error=full) for s in ("a", "b", "c")]
    failed.append(ShotOutcome("d", 0, error="shot 'd': latent holds NaN"))
    assert failure_lines(failed) == [f"shots 'a', 'b', 'c': {full}", "shot 'd': latent holds NaN"]


def test_a_latent_pt_whose_storage_dwarfs_its_tensor_is_refused_at_ingest(tmp_path):
    import torch

    from farm.inputs.ingest import ingest

    latent = torch.zeros(2**21)[: 8 * 2 * 2 * 3].reshape(8, 2, 2, 3)  # 96 floats in 8 MiB of storage
    torch.save(latent, tmp_path / "shot.pt")
    job = bad_job(tmp_path, shots=1)  # the files follow the job's decoder
    with pytest.raises(FarmError, match="declares 8388608 bytes for tensors of 384 bytes"):
        ingest(job, [str(tmp_path / "shot.pt")])
    torch.save(latent.clone(), tmp_path / "whole.pt")
    ingest(job, [str(tmp_path / "whole.pt")])


def test_ingest_refuses_a_latent_beyond_the_maxima_before_reading_it(tmp_path):
    from farm.inputs.ingest import ingest

    job = bad_job(tmp_path, shots=1)
    np.lib.format.open_memmap(tmp_path / "long.npy", mode="w+", dtype=np.float32, shape=(8, 20_000, 2, 2))
    with pytest.raises(FarmError, match="20000 latent frames; farm renders at most 16384"):
        ingest(job, [str(tmp_path / "long.npy")])


def test_a_render_whose_latents_cannot_be_read_submits_nothing_to_a_shared_cluster(tmp_path, cluster3):
    from farm.store.job import write_shot

    def transitions(dask_scheduler=None):
        return [str(t[0]) for t in dask_scheduler.transition_log]

    job = bad_job(tmp_path, shots=1)
    nan = np.zeros((8, 2, 2, 2), np.float32)
    nan[:, 1] = np.nan
    write_shot(job, "shot000", nan, fps=24)
    with pytest.raises(FarmError, match="NaN or Inf"):
        render(job, tmp_path / "out", scheduler=cluster3.scheduler.address, options=TILES,
                  render_id="refusednan", **QUIET)  # fmt: skip
    assert not [key for key in cluster3.run_on_scheduler(transitions) if "refusednan" in key]
    assert not (tmp_path / "out").exists()


def test_a_worker_never_writes_into_a_folder_that_became_a_link(tmp_path):
    from farm.planning.tiling import Batch
    from farm.store.frames import prepare_output
    from farm.store.job import open_job
    from farm.worker.tasks import BlendedFrames, encode_batch, write_batch

    out = Output(tmp_path / "out")
    prepare_output(out, open_job(bad_job(tmp_path, shots=1)), [("shot000", (9, 64, 64), 8)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    segments = out.segments_dir("shot000")
    segments.rmdir()
    os.symlink(elsewhere, segments)  # swapped in after the render's own check
    batch, frames = Batch("shot000", 0, 0, 8, (0,)), BlendedFrames(np.zeros((8, 64, 64, 3), np.uint8))
    with pytest.raises(FarmError, match="became a symbolic link"):
        encode_batch(out, batch, frames, 24.0, VideoSettings(), {})
    frames_dir = out.frames_array("shot000")
    os.rename(frames_dir, tmp_path / "frames-moved")
    os.symlink(tmp_path / "frames-moved", frames_dir)
    with pytest.raises(FarmError, match="became a symbolic link"):
        write_batch(out, batch, frames)
    assert not list(elsewhere.iterdir())


def test_the_page_shows_outputs_relative_to_out():
    from farm.dashboard.monitor import summarize

    shots = {"a": {"batches_total": 1, "batches_written": 1, "video": "/shows/ep01/out/videos/a.mp4"}}
    record = {"out": "/shows/ep01/out", "shots": shots}
    shot = summarize("r1", record, None, {}, False, 0.0)["shots"][0]
    assert shot["video"] == "videos/a.mp4"
