"""Imported by farm's worker forkserver alone, last of its preloads (`farm.run.worker_forkserver`): the
server then ends without Python's interpreter teardown.

The server exits when the command that started it does. Tearing down an interpreter that imported torch
and diffusers takes over a second (docs/performance.md, "Cold start"), and the server holds the command's
standard output and error open meanwhile, so whatever reads them (a shell's pipe, a render manager) would
wait for it. Processes forked from the server end through ``os._exit`` already and never run this.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
