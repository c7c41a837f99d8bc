"""Installing farm's tensor transport (`farm.worker.transport`) on a cluster, from a driver without torch.

The plugin is pickled by the client and unpickled on workers: it lives here, away from the serializers,
so that a driver registering it never imports torch. On a worker it registers lazily: Dask's dispatchers
call `farm.worker.transport.register` the first time they meet a torch class, so a worker that has not loaded
torch yet sets up at once (the client's ``register_plugin`` waits for every worker's set-up) and loads
torch when its first decode needs it.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import WorkerPlugin

from farm.worker.ipc import Piece

if TYPE_CHECKING:
    from distributed import Client

PLUGIN_NAME = "farm-transport"


class FarmTransportPlugin(WorkerPlugin):
    """Runs `farm.worker.transport.register` on every worker, current and future (idempotent by name)."""

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        register_when_torch_loads()
        quiet_farm_errors()


class FarmErrorsInOneLine(logging.Filter):
    """Drops a worker's "Compute Failed" record (a traceback) for a task that raised farm's own one-line
    error: the render reports it to its user, by shot, in words; other failures keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Compute Failed"):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        exception = str(args[3]) if len(args) > 3 else ""
        return not exception.startswith(("FarmError(", "FarmRuntimeError(", "LinkInOutput("))


def quiet_farm_errors() -> None:
    """Install `FarmErrorsInOneLine` on this process' Dask worker logger (once)."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, FarmErrorsInOneLine) for f in worker_log.filters):
        worker_log.addFilter(FarmErrorsInOneLine())


def _register() -> None:
    from farm.worker.transport import register  # torch: loaded on a worker, never by the driver

    register()


def register_when_torch_loads() -> None:
    """Register farm's tensor serializers and ``sizeof`` now if torch is loaded, else the first time a
    dispatcher meets a torch class (replacing distributed's own lazy torch registration, which
    `farm.worker.transport.register` runs first and then overrides)."""
    if "torch" in sys.modules:
        _register()
        return
    from dask.sizeof import sizeof
    from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    for dispatch in (dask_serialize, dask_deserialize, cuda_serialize, cuda_deserialize, sizeof):
        dispatch.register_lazy("torch", _register)
    # a decoded piece's type is farm's (`farm.worker.ipc.Piece`), so no lazy torch hook sees it: its first
    # (de)serialization registers everything, then goes on with the tensor serializers

    serializers = {dask_serialize: "dask_dumps_piece", dask_deserialize: "dask_loads_piece",
                   cuda_serialize: "cuda_dumps_piece", cuda_deserialize: "cuda_loads_piece"}  # fmt: skip
    for dispatch, name in serializers.items():
        dispatch.register(Piece, _registering_first(name))


def _registering_first(name: str) -> Any:
    """A serializer for `farm.worker.ipc.Piece` that registers farm's serializers, then runs `name`'s."""

    def serializer(*args: Any) -> Any:
        from farm.worker import transport  # torch: loaded on a worker, never by the driver

        transport.register()
        return getattr(transport, name)(*args)

    return serializer


def install(client: Client) -> None:
    """Make ``client``'s cluster's workers, current and future, use farm's tensor transport.

    The client's own process registers too when it already holds torch (a script that gathers tensors);
    a driver without torch has no tensor to send or receive, and stays without it. The scheduler needs
    nothing: it forwards task results without deserializing them.
    """
    if "torch" in sys.modules:
        _register()
    client.register_plugin(FarmTransportPlugin(), name=PLUGIN_NAME)
