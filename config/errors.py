"""The exceptions a user can cause. Each message says what was asked for, what was found, and the fix."""

import sys
from collections.abc import Callable

EXIT_USER_ERROR = 2


class AltscaleError(Exception):
    """Base of every error whose message is for the user, not a bug report."""


class ConfigError(AltscaleError, ValueError):
    """A recipe, launch or DeepSpeed file asks for something that cannot run."""


class DataError(AltscaleError, ValueError):
    """The dataset cannot be read or does not hold usable image/caption pairs."""


def run_cli(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> int:
    """Run a script's `main`, a user's mistake ending in one `error:` line and exit code 2, not a traceback."""
    try:
        main(argv)
    except AltscaleError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0
