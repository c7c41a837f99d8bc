"""A render's own local cluster builds the render's decoder as each worker process starts
(`farm.worker.warmup.DECODER_HINT`), and the render's tasks take that decoder; a hint that names another
decoder is dropped and the render decodes as without it. Real local clusters, real weights folders."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import dask.config
import pytest
import torch
from distributed import Client
from helpers import chunk_files

from farm import logs
from farm.decoders import decoder_timings, preloads
from farm.decoders.weights import pinned_weights
from farm.inputs.synthetic import synth
from farm.run.cluster import connect
from farm.run.render import render
from farm.store.job import open_job
from farm.worker import warmup

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def weights_job(tmp_path_factory) -> Path:
    """A one-shot ltx2-tiny job whose decoder reads its weights from a diffusers folder."""
    from diffusers import AutoencoderKLLTX2Video

    from farm.decoders.ltx2 import LTX2_TINY

    work = tmp_path_factory.mktemp("preload")
    torch.manual_seed(5)
    AutoencoderKLLTX2Video(**LTX2_TINY).save_pretrained(work / "vae")
    return synth(work / "job.zarr", decoder="ltx2-tiny", weights=str(work / "vae"), seed=2).path


def hint_for(job: Path) -> dict:
    """The hint `farm render` gives its own cluster for `job`: its worker spec, as its tasks give it."""
    return {"spec": pinned_weights(open_job(job).spec).to_json(), "compile": False}


def hint_on_worker() -> object:
    return dask.config.get(warmup.DECODER_HINT, None)


def on_the_worker(client: Client, fn) -> object:
    """`fn`'s result on the cluster's one decode worker."""
    (result,) = client.run(fn).values()
    return result


def preloaded(client: Client, deadline_s: float = 180) -> dict[str, str]:
    """The one worker's preloaded decoders once its warm-up has finished."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if on_the_worker(client, warmup.warm_up_finished):
            return on_the_worker(client, preloads)
        time.sleep(0.2)
    raise AssertionError("the worker's warm-up did not finish")


def test_render_builds_its_decoder_as_the_workers_start(weights_job, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=logs.LOGGER.name)  # the workers' steps are kept for farm -v
    stats = render(weights_job, tmp_path / "out", workers=1)
    (steps,) = stats.worker_steps.values()
    assert "decoder preloaded" in steps  # built by the warm-up, from the render's hint
    assert steps["decoder preloaded"] > 0
    # its weights read beside the model's build (a named config's tensors are recorded)
    assert steps["weights read ahead"] > 0 and steps["decoder model"] > 0, steps
    assert "closed the local cluster in" in caplog.text


def test_hint_reaches_the_workers_and_the_render_takes_the_preloaded_decoder(weights_job, tmp_path):
    hint = hint_for(weights_job)
    with connect(workers=1, decoder=hint) as client:
        assert on_the_worker(client, hint_on_worker) == hint
        (name,) = preloaded(client)
        assert preloaded(client) == {name: "waiting"}
        render(weights_job, tmp_path / "out", scheduler=client.scheduler.address)
        assert on_the_worker(client, preloads) == {name: "taken"}
        assert list(on_the_worker(client, decoder_timings)["load_s"]) == [name]  # built once, by the warm-up


def test_a_hint_for_another_decoder_is_dropped_and_the_render_is_unchanged(weights_job, tmp_path):
    other = hint_for(weights_job)
    other["spec"] = {**other["spec"], "weights": {"random_seed": 9}}  # the same model, other weights
    with connect(workers=1, decoder=other) as client:
        (name,) = preloaded(client)
        assert "RANDOM weights (seed 9)" in name
        render(weights_job, tmp_path / "hinted", scheduler=client.scheduler.address)
        assert on_the_worker(client, preloads) == {name: "dropped"}
    render(weights_job, tmp_path / "plain", workers=1)
    hinted, plain = chunk_files(tmp_path / "hinted"), chunk_files(tmp_path / "plain")
    assert hinted and hinted == plain


def test_a_cluster_without_a_hint_preloads_nothing(weights_job):
    with connect(workers=1) as client:
        assert preloaded(client) == {}
        assert on_the_worker(client, hint_on_worker) is None


# A render whose workers fork from a worker forkserver that imported what a GPU machine's imports (torch,
# not diffusers: `farm.run.forkserver_imports`), so each worker's warm-up imports diffusers while its
# weights are read: the path of a GPU worker, on this CPU. Prints the worker's warm-up steps.
GPU_SHAPED = """
import json, multiprocessing, sys, time
from multiprocessing import forkserver
import dask.config
from farm.run import worker_forkserver

if __name__ == "__main__":
    job, out, hint = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([m for m in worker_forkserver.WORKER_MODULES
                                    if m != "farm.run.forkserver_imports"])
    forkserver.ensure_running()
    from farm.decoders.diffusers_vae import build_steps
    from farm.run.cluster import connect
    from farm.run.render import render
    from farm.worker import warmup
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        with connect(workers=1, decoder=hint) as client:
            deadline = time.monotonic() + 180
            while not all(client.run(warmup.warm_up_finished).values()) and time.monotonic() < deadline:
                time.sleep(0.2)
            (steps,) = client.run(lambda: {**warmup.warmup_timings(), **build_steps()}).values()
            render(job, out, scheduler=client.scheduler.address)
    print(json.dumps(steps))
"""


def test_workers_forked_before_diffusers_read_their_weights_beside_its_import(weights_job, tmp_path):
    import json
    import subprocess
    import sys

    hint = json.dumps(hint_for(weights_job))
    command = [sys.executable, "-c", GPU_SHAPED, str(weights_job), str(tmp_path / "forked"), hint]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = json.loads(run.stdout.strip().splitlines()[-1])
    assert steps["weights read ahead"] > 0 and steps["decoder model"] > 0, steps
    assert "decoder preloaded" in steps, steps
    render(weights_job, tmp_path / "plain", workers=1)
    forked, plain = chunk_files(tmp_path / "forked"), chunk_files(tmp_path / "plain")
    assert forked and forked == plain
