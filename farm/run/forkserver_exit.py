"""Imported first by farm's worker forkserver (`farm.run.worker_forkserver`): the server ends the moment the
command that started it does, whatever it is doing.

The server holds the command's standard output and error open, so whatever reads them (a shell's pipe, a
render manager) waits for it. Left alone it would end only once its imports were done (seconds after a
render refused in its first moment) and then through Python's interpreter teardown, over a second for one
that imported torch and diffusers. The kernel kills it instead when the command exits
(``PR_SET_PDEATHSIG``); processes forked from it do not inherit that. Imported by any other process it does
nothing: the command marks the server's environment alone, and the mark is taken out of it here.
"""

from __future__ import annotations

import ctypes
import os
import signal

# the variable the command sets in the server's environment: the command's pid
SERVER_MARK = "FARM_WORKER_FORKSERVER"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with(command_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != command_pid:  # the command ended before the signal was asked for
        os._exit(0)


_command = os.environ.pop(SERVER_MARK, "")
IN_SERVER = _command.isdigit()  # this process is the worker forkserver of a farm command
if IN_SERVER:
    end_with(int(_command))
