"""The one exception type for errors a user can cause (bad input, bad options, bad paths)."""


class FarmError(Exception):
    """Something the user can fix: the message says what was wrong, where, and what would be valid.

    The CLI prints it without a traceback and exits with `exit_code`: 2, a usage error (nothing could
    start); :class:`FarmRuntimeError` 1.
    """

    exit_code = 2


class FarmRuntimeError(FarmError):
    """Something in the environment stopped a command the user gave correctly (a port another process
    holds, a scheduler that cannot start): the CLI prints it in one line and exits 1."""

    exit_code = 1
