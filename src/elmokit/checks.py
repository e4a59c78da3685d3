"""Argument validators of the Python API: one home for the checks every entry point makes of its scalar arguments.

Each raises from the error family (:mod:`elmokit.errors`) following Python's conventions: a value of the wrong type
raises :class:`~elmokit.errors.UsageTypeError` (also a ``TypeError``), a value of the right type but out of range
:class:`~elmokit.errors.UsageError` (a ``ValueError``). The message names the argument, what is expected and what was
given. (Command-line options are parsed by the argparse types of :mod:`elmokit.cli.common`; configuration files by
:mod:`elmokit.config` and :mod:`elmokit.pretraining.config`, whose messages name the file and key.)
"""

from __future__ import annotations

import numbers

from elmokit.errors import UsageError, UsageTypeError

__all__ = ["is_int", "check_int", "positive_int"]


def is_int(value: object) -> bool:
    """True for an integer (Python ``int``, NumPy integer) that is not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an ``int``, checked to be an integer (not a bool) ``>= minimum``.

    Raises:
        UsageTypeError: not an integer (e.g. ``2.0``, ``"2"``, ``True``).
        UsageError: below ``minimum``.
    """
    expected = "an int" + (f" >= {minimum}" if minimum is not None else "")
    if not is_int(value):
        raise UsageTypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise UsageError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def positive_int(name: str, value: object) -> int:
    """:func:`check_int` with ``minimum=1`` (batch sizes, worker counts, part sizes, epochs)."""
    return check_int(name, value, 1)
