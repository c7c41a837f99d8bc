"""The farm page, its JSON and the Prometheus metrics, served by a real scheduler after a real render, read
over HTTP and checked against the render's outputs; the page in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import farm
from farm.dashboard import monitor
from farm.store.frames import read_frames
from farm.store.output import Output
from farm.store.progress import output_progress

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as response:
        return response.read().decode()


class Cells(HTMLParser):
    """Collects ``data-name``/``data-value`` cells per table (``data-render``) and row (``data-shot``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        self.table: tuple[str, str] | None = None
        self.row = ""

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "table" and "data-render" in a:
            self.table = (a.get("class", ""), a["data-render"])
            self.tables[self.table] = {}
        elif tag == "tr":
            self.row = a.get("data-shot", "")
        elif tag == "td" and "data-name" in a and self.table is not None:
            self.tables[self.table].setdefault(self.row, {})[a["data-name"]] = a["data-value"]


def metrics(text: str, render: str) -> dict[tuple[str, str], float]:
    """``{(metric, shot or ""): value}`` for one render from Prometheus' text format."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(farm_\w+)\{(.*)\} (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        if labels.get("render") == render:
            out[(m.group(1), labels.get("shot", labels.get("state", "")))] = float(m.group(3))
    return out


@pytest.fixture(scope="module")
def rendered(cluster3, scheduler3, tmp_path_factory):
    """A 2-shot job rendered on the session's 3-worker cluster, with the farm monitor installed."""
    root = tmp_path_factory.mktemp("monitor")
    farm.synth(root / "job.zarr", decoder="ltx2-tiny", shots=2, frames=25, height=64, width=128, seed=5)
    out = root / "out"
    options = farm.PlanOptions(tiles=(1, 1, 2), overlap=(0, 0, 1), batch_frames=8)
    stats = farm.render(root / "job.zarr", out, scheduler=scheduler3, options=options, render_id="mon-1",
                        priority=2, log=lambda _: None)  # fmt: skip
    assert not stats.failed
    page = monitor.page_link(cluster3.dashboard_link)
    assert page is not None
    return {"out": out, "stats": stats, "page": page, "client": cluster3}


def expected(out: Path) -> dict:
    o = Output(out)
    shots = {p.shot: len(o.batches_done(p.shot)) for p in output_progress(out)}
    frames = sum(read_frames(o, s).shape[0] for s in shots)
    return {"shots": shots, "batches": sum(shots.values()), "frames": frames}


def test_json_matches_the_outputs(rendered):
    want = expected(rendered["out"])
    snapshot = json.loads(fetch(rendered["page"] + "/api/renders.json"))
    (r,) = [r for r in snapshot["renders"] if r["render"] == "mon-1"]
    assert r["state"] == "done" and r["priority"] == 2 and r["out"] == str(rendered["out"])
    assert r["batches_written"] == r["batches_total"] == want["batches"] == 8  # 2 shots x 4 batches of 8
    assert r["frames_written"] == want["frames"] == 50
    assert r["tiles_decoded"] == r["tiles_total"] == rendered["stats"].tiles_total == 4
    assert r["failures"] == 0 and r["frames_per_second"] > 0 and r["eta_s"] is None
    for shot in r["shots"]:
        assert shot["batches_written"] == want["shots"][shot["shot"]] == 4
        assert shot["tiles_decoded"] == 2  # counted from the scheduler's task transitions
        assert shot["state"] == "done" and shot["video"].endswith(f"{shot['shot']}.mp4")


def test_page_matches_the_outputs(rendered):
    want = expected(rendered["out"])
    parser = Cells()
    parser.feed(fetch(rendered["page"] + "?refresh=0"))
    render = parser.tables[("render", "mon-1")][""]
    assert render["state"] == "done" and render["priority"] == "2"
    assert int(render["batches_written"]) == want["batches"]
    assert int(render["frames_written"]) == want["frames"]
    assert int(render["tiles_decoded"]) == rendered["stats"].tiles_total
    assert int(render["failures"]) == 0 and float(render["frames_per_second"]) > 0
    shots = parser.tables[("shots", "mon-1")]
    assert {s: int(row["batches_written"]) for s, row in shots.items()} == want["shots"]
    assert {int(row["tiles_decoded"]) for row in shots.values()} == {2}


def test_thumbnails_and_batch_strips_match_the_outputs(rendered, tmp_path):
    """Each finished shot's picture is its middle Zarr frame (64x128: small already, kept at full size);
    each shot's strip has one mark per batch, all done."""
    from farm.media.sequences import read_image

    out = Output(rendered["out"])
    snapshot = json.loads(fetch(rendered["page"] + "/api/renders.json"))
    (r,) = [r for r in snapshot["renders"] if r["render"] == "mon-1"]
    root = rendered["page"].removesuffix("farm")
    for shot in r["shots"]:
        assert shot["batches"] == ["done"] * len(out.batches_done(shot["shot"])) == ["done"] * 4
        assert shot["thumbnail"] == f"farm/thumbnail/mon-1/{shot['shot']}.png"
        assert shot["thumbnail_frame"] == 12  # the middle of 25 frames
        with urllib.request.urlopen(root + shot["thumbnail"], timeout=20) as response:
            assert response.headers["Content-Type"] == "image/png"
            (tmp_path / "t.png").write_bytes(response.read())
        picture = read_image(tmp_path / "t.png")
        middle = read_frames(out, shot["shot"])[12]
        assert picture.shape == middle.shape == (64, 128, 3)
        assert np.abs(picture.astype(int) - middle).max() <= 1
    with pytest.raises(urllib.error.HTTPError, match="404"):
        fetch(root + "farm/thumbnail/mon-1/nosuchshot.png")


def test_a_thumbnail_is_made_when_its_middle_batch_is_written_and_published_when_the_shot_is(rendered):
    """The picture is read as soon as the batch holding the middle frame is done (the end of a render
    never waits for it), and published once, when the shot is finished."""
    from farm.dashboard.thumbnails import ShotThumbnails
    from farm.run.graph import RenderStats, ShotOutcome

    class Metadata:  # stands in for the client's scheduler metadata, which is all this uses
        def __init__(self) -> None:
            self.published: list[tuple[tuple[str, ...], dict]] = []

        def set_metadata(self, key: list[str], value: dict) -> None:
            self.published.append((tuple(key), value))

    out = Output(rendered["out"])
    shot = sorted(p.shot for p in output_progress(rendered["out"]))[0]
    client, outcome = Metadata(), ShotOutcome(shot, 4)
    stats = RenderStats(shots={shot: outcome})
    seen = []
    with ShotThumbnails(client, "t-1", out, seen.append, middle_batch={shot: 1}) as thumbnails:
        outcome.batches_written = 2  # batches 0 and 1 of this (finished) output are marked done
        thumbnails(stats)
        assert thumbnails.pictures[shot].result()["frame_index"] == 12 and not client.published
        outcome.batches_written = 4
        thumbnails(stats)
        thumbnails(stats)
    ((key, picture),) = client.published
    assert key[-2:] == ("t-1", shot) and picture["frame_index"] == 12 and len(seen) == 3


def test_batch_strips_follow_a_live_render(cluster3, scheduler3, tmp_path):
    """The strips change while the render runs: batches start pending and end done."""
    farm.synth(tmp_path / "job.zarr", decoder="ltx2-tiny", shots=1, frames=33, height=64, width=64, seed=2)
    page = monitor.page_link(cluster3.dashboard_link)
    seen: list[list[str]] = []

    def look(stats) -> None:
        snapshot = json.loads(fetch(page + "/api/renders.json"))
        for r in snapshot["renders"]:
            if r["render"] == "mon-live":
                seen.append(r["shots"][0]["batches"])

    farm.render(tmp_path / "job.zarr", tmp_path / "out", scheduler=scheduler3, render_id="mon-live",
                options=farm.PlanOptions(tiles=(1, 1, 1), batch_frames=8), log=lambda _: None,
                on_progress=look)  # fmt: skip
    look(None)
    assert seen and all(len(states) == 5 for states in seen), seen
    assert seen[0] == ["pending"] * 5, seen  # published as the render starts, before any task ran
    assert seen[-1] == ["done"] * 5, seen
    done = [states.count("done") for states in seen]
    assert done == sorted(done), seen  # batches only ever finish


def test_strip_shows_batches_done_before_and_skipped():
    layout = {"total": 5, "done": [0], "skipped": [4]}
    assert monitor.batch_states(layout, {1: "done", 2: "running"}, 4) == [
        "done", "done", "running", "pending", "skipped"]  # fmt: skip
    assert monitor.batch_states(None, {0: "failed"}, 2) == ["failed", "pending"]  # an older record
    states: dict[int, str] = {}
    for prefix, finish in [("blend-batch", "processing"), ("write-batch", "erred"), ("mark-batch", "memory")]:
        monitor.note_batch(states, prefix, 3, finish)
    assert states == {3: "failed"}  # a failed batch stays failed


def test_metrics_match_the_outputs(rendered):
    want = expected(rendered["out"])
    text = fetch(rendered["page"].removesuffix("/farm") + "/metrics")
    m = metrics(text, "mon-1")
    assert m[("farm_render_batches_written", "")] == m[("farm_render_batches_planned", "")] == want["batches"]
    assert m[("farm_render_frames_written", "")] == want["frames"]
    assert m[("farm_render_tiles_decoded", "")] == m[("farm_render_tiles_planned", "")] == 4
    assert m[("farm_render_failed_shots", "")] == 0 and m[("farm_render_task_errors", "")] == 0
    assert m[("farm_render_state", "done")] == 1 and m[("farm_render_priority", "")] == 2
    for shot, batches in want["shots"].items():
        assert m[("farm_shot_batches_written", shot)] == batches
        assert m[("farm_shot_tiles_decoded", shot)] == 2
    assert "dask_scheduler_workers" in text  # Dask's own metrics are still there


def test_failures_are_counted(rendered):
    """A shot error published by a render and a task that fails on the cluster both count."""
    client = rendered["client"]
    now = time.time()
    client.set_metadata(["farm", "renders", "mon-bad"], {
        "render": "mon-bad", "priority": 0, "started": now - 10, "updated": now, "state": "running",
        "job": "/jobs/<bad>.zarr", "out": "/out", "tiles_total": 4, "tiles_decoded": 1, "batches_total": 8,
        "batches_written": 2, "frames_written": 16,
        "shots": {"a": {"shot": "a", "batches_total": 4, "batches_written": 2, "video": None, "error": None},
                  "b": {"shot": "b", "batches_total": 4, "batches_written": 0, "video": None,
                        "error": "shot 'b': latent frames 3..4 hold NaN"}},
    })  # fmt: skip

    def boom() -> None:
        raise RuntimeError("decoder exploded")

    fut = client.submit(boom, key=("decode-tile", "mon-bad", "a", 7), pure=False)
    with pytest.raises(RuntimeError):
        fut.result()
    snapshot = json.loads(fetch(rendered["page"] + "/api/renders.json"))
    (r,) = [r for r in snapshot["renders"] if r["render"] == "mon-bad"]
    assert r["failed_shots"] == 1 and r["task_errors"] == 1 and r["failures"] == 2
    assert "decoder exploded" in r["last_error"]
    assert r["eta_s"] is not None and 0 < r["eta_s"] < 60  # 6 batches left at ~5 s per batch, minus age
    m = metrics(fetch(rendered["page"].removesuffix("/farm") + "/metrics"), "mon-bad")
    assert m[("farm_render_failed_shots", "")] == 1 and m[("farm_shot_failed", "b")] == 1
    html = fetch(rendered["page"] + "?refresh=0")
    assert "/jobs/&lt;bad&gt;.zarr" in html and "<bad>" not in html  # escaped
    client.set_metadata(["farm", "renders", "mon-bad", "state"], "failed")


def test_page_link_and_states():
    assert monitor.page_link("http://127.0.0.1:8787/status") == "http://127.0.0.1:8787/farm"
    assert monitor.page_link("http://h:1/prefix/status") == "http://h:1/prefix/farm"
    assert monitor.page_link(None) is None
    record = {"state": "running", "started": 0.0, "updated": 10.0, "batches_total": 4, "batches_written": 2}
    assert monitor.summarize("s1.1-a", record, None, {}, live=True, now=11.0)["state"] == "running"
    assert monitor.summarize("s1.1-a", record, None, {}, live=False, now=100.0)["state"] == "interrupted"
    assert monitor.summarize("s1.1-a", record, None, {"s1": {}}, live=True, now=11.0)["state"] == "cancelling"
    assert monitor.summarize("s1.1-a", record, None, {"s1": {}}, live=False, now=11.0)["state"] == "cancelled"
    assert monitor.summarize("s1.1-a", record, None, {"s10": {}}, live=True, now=11.0)["state"] == "running"
    done = {**record, "state": "done", "batches_written": 4}
    assert monitor.summarize("s1.1-a", done, None, {"s1": {}}, live=False, now=11.0)["state"] == "done"


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_farm_page_in_a_headless_browser(rendered, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (.ci/run installs it with apt-get where it can): "
                    "the farm page was not checked in a browser")  # fmt: skip
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "farm-page.png"
    shot.unlink(missing_ok=True)
    url = rendered["page"] + "?refresh=0"
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,800"]  # fmt: skip
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parser = Cells()
    parser.feed(dom.stdout)  # the DOM as the browser built it
    written = parser.tables[("render", "mon-1")][""]["batches_written"]
    assert int(written) == expected(rendered["out"])["batches"]
    # the pictures loaded in the browser (their onload noted the decoded width), one strip mark per batch
    shots = parser.tables[("shots", "mon-1")]
    table = re.search(r'<table class="shots" data-render="mon-1">.*?</table>', dom.stdout, re.S).group(0)
    loaded = re.findall(r'<img class="thumb"[^>]*data-loaded="(\d+)"', table)
    assert loaded == ["128"] * len(shots) == ["128", "128"], table
    assert {row["batches"] for row in shots.values()} == {"done,done,done,done"}
    assert table.count('class="b done"') == 8
    run = subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000, "the screenshot is missing or blank"
    print(f"farm page screenshot: {shot}")


def test_a_cancelled_shot_is_not_a_failure():
    shots = {
        "a": {"batches_written": 2, "batches_total": 2, "video": "a.mp4"},
        "b": {"batches_written": 1, "batches_total": 3, "error": "cancelled", "cancelled": True},
        "c": {"batches_written": 0, "batches_total": 3, "error": "decoder exploded"},
    }
    record = {"state": "cancelled", "started": 0.0, "updated": 10.0, "batches_total": 8, "shots": shots}
    r = monitor.summarize("r1", record, None, {"r1": {}}, live=False, now=11.0)
    assert r["state"] == "cancelled"
    assert [s["state"] for s in r["shots"]] == ["done", "cancelled", "failed"]
    assert r["failed_shots"] == 1 and r["cancelled_shots"] == 1 and r["failures"] == 1


def test_batches_of_a_stopped_render_are_not_shown_running():
    """Batches the scheduler saw start but never finish: running while the render runs (or its cancel
    is under way), then cancelled or interrupted as the render is, never running once it stopped."""
    counts = monitor.TaskCounts(batches={"a": {0: "done", 1: "running", 2: "running"}, "b": {0: "running"}})
    shots = {"a": {"batches_written": 1, "batches_total": 4}, "b": {"batches_written": 0, "batches_total": 2}}
    record = {"state": "running", "started": 0.0, "updated": 10.0, "batches_total": 6, "shots": shots}

    def strips(cancelled, live, now=11.0, rec=record):
        r = monitor.summarize("r1", rec, counts, cancelled, live=live, now=now)
        return r["state"], [s["batches"] for s in r["shots"]]

    def both(a1, b0):
        return [["done", a1, a1, "pending"], [b0, "pending"]]

    assert strips({}, live=True) == ("running", both("running", "running"))
    assert strips({"r1": {}}, live=True) == ("cancelling", both("running", "running"))  # tasks may still run
    assert strips({"r1": {}}, live=False) == ("cancelled", both("cancelled", "cancelled"))
    assert strips({}, live=False, now=100.0) == ("interrupted", both("interrupted", "interrupted"))
    failed = {**record, "state": "failed"}
    assert strips({}, live=False, rec=failed) == ("failed", both("pending", "pending"))  # never written
    # a shot cancelled on its own while the render goes on
    one = {**record, "shots": {**shots, "b": {**shots["b"], "error": "cancelled", "cancelled": True}}}
    assert strips({}, live=True, rec=one) == ("running", both("running", "cancelled"))
    summary = monitor.summarize("r1", record, counts, {"r1": {}}, live=False, now=11.0)
    page = monitor.render_page({"renders": [summary]})
    assert "batch 1: cancelled" in page and "batch 1: running" not in page
    assert ".b.cancelled{" in page and "<span class='b cancelled'></span>cancelled" in page  # in the legend
