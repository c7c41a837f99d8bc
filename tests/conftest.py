"""Shared fixtures: tiny jobs on disk and a real multi-process local Dask cluster.

Every test outside the fast tier is marked ``cluster``: tests that use a cluster fixture are marked
here, tests that start one themselves carry the mark, and tests that run farm or torch in child
processes carry ``slow``, and tests that build, decode or import diffusers models in this process
carry ``model``; both add ``cluster`` here. `pytest -m "not cluster"` runs the fast tier.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings

from farm.inputs.synthetic import smooth_latent, synth

# Fixtures that start (or hold) a Dask cluster, here and in test files ("client": test_transport's); a
# test using one, directly or through another fixture, is a cluster test.
CLUSTER_FIXTURES = frozenset({"cluster3", "scheduler3", "cluster2", "running_cluster", "client"})
# Fixtures that build a real diffusers model in the test's process: their tests are marked ``model``.
MODEL_FIXTURES = frozenset({"vae_folder"})


# Property tests (hypothesis) try 200 examples each in a full run, 40 in the fast tier (`-m "not cluster"`).
settings.register_profile("full", max_examples=200, deadline=None)
settings.register_profile("quick", max_examples=40, deadline=None)


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("quick" if "not cluster" in (config.option.markexpr or "") else "full")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        beyond_fast_tier = item.get_closest_marker("slow") or item.get_closest_marker("model")
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())) or beyond_fast_tier:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster3():
    """A real local cluster: 3 worker processes on loopback, farm's serializers installed."""
    from farm.run.cluster import connect

    with connect(workers=3) as client:
        yield client


@pytest.fixture(scope="session")
def scheduler3(cluster3) -> str:
    return cluster3.scheduler.address


@pytest.fixture
def tiny_job(tmp_path):
    """A 2-shot ltx2-tiny job: 17 frames of 128x192 and 25 frames of 96x128 (different shapes)."""
    path = tmp_path / "job.zarr"
    synth(path, decoder="ltx2-tiny", shots=1, frames=17, height=128, width=192, seed=1)
    rng = np.random.default_rng(7)
    from farm.store.job import write_shot

    write_shot(path, "b-shot.2", smooth_latent(rng, (8, 4, 3, 4)), fps=30.0)
    return path
