"""The one exception type for errors a user can cause (bad input, bad options, bad paths)."""


class FarmError(Exception):
    """Something the user can fix: the message says what was wrong, where, and what would be valid.

    The CLI prints it without a traceback and exits non-zero.
    """
