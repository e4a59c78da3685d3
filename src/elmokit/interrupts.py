"""Ctrl-C / SIGTERM handling that cannot be swallowed.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when a signal arrives, and an exception
raised inside a destructor or weakref callback is only printed ("Exception ignored in …"), so a plain handler can be
lost. Here the handler first *records* the signal; code that must not be cut in the middle (a training step, a
checkpoint write) runs inside :func:`deferred`, which raises at its end instead; long loops call :func:`check` at safe
points; and the CLI asks :func:`requested` when a command returns, so a swallowed interrupt still ends in exit 130.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["handling_signals", "deferred", "check", "requested", "clear", "signal_name"]

_received: list[int] = []  # signals received since the last clear(), in order
_depth = 0  # nesting depth of deferred() regions


def _handler(signum, frame):  # noqa: ARG001
    _received.append(signum)
    if _depth == 0 or len(_received) > 1 and _received[-1] == signal.SIGINT and _received[-2] == signal.SIGINT:
        # outside a deferred region, or Ctrl-C pressed twice: stop now
        raise KeyboardInterrupt


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Install the handler for SIGINT and SIGTERM (SIGTERM then unwinds like Ctrl-C, so atomic writes clean up) for
    the duration of the block, and restore the previous handlers afterwards. Does nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear()
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the block without being cut by Ctrl-C/SIGTERM (one signal); if one arrived, raise ``KeyboardInterrupt``
    at the block's end. A second Ctrl-C inside the block still stops at once."""
    global _depth
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _received:
        raise KeyboardInterrupt


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal was received (call at safe points of long loops)."""
    if _received and _depth == 0:
        raise KeyboardInterrupt


def requested() -> bool:
    """Whether Ctrl-C or SIGTERM was received since the handler was installed."""
    return bool(_received)


def signal_name() -> str | None:
    """``"SIGINT"``/``"SIGTERM"`` of the first signal received, or ``None``."""
    return signal.Signals(_received[0]).name if _received else None


def clear() -> None:
    """Forget received signals."""
    _received.clear()
