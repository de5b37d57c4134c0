"""The one exception type for bad user input.

Anything the user can fix (a config key, a file path, a degree that does not divide the world size) raises
UserError with a one-line message naming the key/file/value and what would be valid. The entry points catch
it, print `error: <message>` and exit with code 2, without a traceback.
"""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""

    exit_code = 2
