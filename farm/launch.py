"""The `farm` command's entry point (``farm``, ``python -m farm``): a command that will start a local cluster
starts its worker forkserver before it imports the rest of farm.

The forkserver's imports (torch first) are the longest step of a cold render's start
(`farm.run.worker_forkserver`); started from `farm.cli`, they would wait for that module's own imports
(Dask, NumPy, Zarr, farm's packages). Which command will start a local cluster is told here from its words
alone (`starts_local_cluster`), before argparse, which lives in `farm.cli`: `farm render`, `farm demo` or
`farm cluster` with no scheduler given. A wrong guess costs only time: the server of a command that does
not need it ends with the command, unused, and a command that needs one the guess missed starts it
itself, as before.

A command that returns ends without the interpreter's teardown (`run`): freeing every module and object
of Dask, NumPy and Zarr took 0.4-0.5 s after a render on a 2-core machine, against 0.05 s without. Its exit
handlers run first, and every output was closed before the command returned.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from farm import logs

# the commands that may start a local cluster, the options that make a render join a running one instead,
# and the option that may give `farm cluster` a backend starting its workers elsewhere (argparse also takes
# unambiguous prefixes: "--sched" is "--scheduler", "--back" is "--backend")
CLUSTER_COMMANDS = ("render", "demo", "cluster")
JOIN_OPTION_PREFIX = "--sch"
BACKEND_OPTION_PREFIX = "--b"


def starts_local_cluster(argv: Sequence[str]) -> bool:
    """Whether `argv` (the words after ``farm``) runs a command that will start a local cluster: `farm
    render` given neither ``--scheduler`` nor ``--scheduler-file`` (nor, without ``--workers``, a
    ``distributed.scheduler-address`` setting to join), `farm demo`, or `farm cluster` given no
    ``--backend`` (the command decides with one; ``farm.cluster-backend`` is weighed where the server
    starts)."""
    from farm import config

    words = [w for w in argv if not w.startswith("-")]
    if not words or words[0] not in CLUSTER_COMMANDS or any(w in ("-h", "--help") for w in argv):
        return False
    if words[0] == "cluster":
        return not any(w.startswith(BACKEND_OPTION_PREFIX) for w in argv)
    if words[0] == "demo":
        return True
    if any(w.startswith(JOIN_OPTION_PREFIX) for w in argv):
        return False
    workers = 1 if any(w == "--workers" or w.startswith("--workers=") for w in argv) else None
    return not config.joins_running_cluster(None, None, workers)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `farm` command for `argv` (default: this process's arguments)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if starts_local_cluster(words):
        from farm.run.worker_forkserver import forked_local_workers

        forked_local_workers(joins=False)  # the server starts now; the command asks for it again
    from farm.cli import main as run_command

    return run_command(words)


def run() -> NoReturn:
    """The `farm` console script and ``python -m farm``: `main`, then exit with its code. Once the command
    has returned and no other thread of it still runs, the exit handlers run (logging's flush, Dask's
    clean-ups) and the process ends without the interpreter's teardown; otherwise it exits as usual."""
    code = main()
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others:
        sys.exit(code)
    atexit._run_exitfuncs()  # what an exit runs before the teardown, in its order
    logs.end_process(code)
