"""The elmokit error family. Each subclasses a builtin so ``except ValueError`` keeps working."""
from __future__ import annotations

__all__ = ["ElmoError", "ConfigError", "WeightsError", "InputError"]


class ElmoError(Exception):
    """Base class of every elmokit-specific error."""


class ConfigError(ElmoError, ValueError):
    """An options/config file or value is invalid (the message names the key)."""


class WeightsError(ElmoError, ValueError):
    """A weight file does not match its options (the message names the dataset and both shapes)."""


class InputError(ElmoError, ValueError):
    """Model input is malformed: wrong type, wrong shape, or an unusable sentence (the message says which)."""
