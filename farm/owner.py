"""Who started a render or a workflow: recorded with it on the scheduler, so `farm cancel` can refuse
another user's (`farm.submit.check_owners`) and the farm page can say whose it is."""

from __future__ import annotations

import getpass
import os
import socket


def current_user() -> str:
    """This process' user name (what a render or workflow records as its owner)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid())


def owner() -> dict[str, str]:
    """This process' user and host."""
    return {"user": current_user(), "host": socket.gethostname()}
