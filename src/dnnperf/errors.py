"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class DnnperfError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class UsageError(DnnperfError):
    """Bad arguments: unknown names, out-of-range numbers, unavailable devices."""
