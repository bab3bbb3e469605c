"""The exceptions a user can cause. Each message says what was asked for, what was found, and the fix."""


class AltscaleError(Exception):
    """Base of every error whose message is for the user, not a bug report."""


class ConfigError(AltscaleError, ValueError):
    """A recipe, launch or DeepSpeed file asks for something that cannot run."""


class DataError(AltscaleError, ValueError):
    """The dataset cannot be read or does not hold usable image/caption pairs."""
