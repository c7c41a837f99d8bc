"""The running-scheduler backend: join a Dask scheduler started elsewhere (``--scheduler ADDRESS``,
``--scheduler-file PATH``, or Dask's ``scheduler-address`` setting). It starts nothing: the running
cluster's workers are what a render gets, set up by whoever started them."""

from __future__ import annotations

from farm.errors import FarmError
from farm.run.backends import ClusterAsk, ClusterBackend, ClusterChoice, register


class ExistingScheduler(ClusterBackend):
    name = "existing"
    label = "running cluster"
    starts_cluster = False

    def applies(self, ask: ClusterAsk) -> bool:
        return ask.joins

    def choose(self, ask: ClusterAsk) -> ClusterChoice:
        """``n_workers`` 0: the running cluster has what it has."""
        flag = ask.join_flag
        if ask.workers is not None:
            raise FarmError(
                f"--workers starts a local cluster; it cannot be combined with {flag}: the running "
                "cluster's workers are what you get (leave out --workers, or leave out "
                f"{flag} to start a local cluster of {ask.workers} workers)"
            )
        if ask.threads_per_worker is not None:
            raise FarmError(
                f"threads per worker apply to a local cluster; they cannot be combined with {flag}: "
                "set them where the running cluster's workers are started (dask worker --nthreads)"
            )
        if ask.scheduler_file is not None:
            protocol = ""  # in the file; known once connected
        else:
            assert ask.scheduler is not None
            protocol = ask.scheduler.split("://", 1)[0] if "://" in ask.scheduler else "tcp"
        return ClusterChoice(self.name, 0, protocol, 0, None, 0)


register(ExistingScheduler())
