"""Ctrl-C / SIGTERM handling that cannot be swallowed, and that no signal timing turns into death by a signal.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when a signal arrives, and an exception
raised inside a destructor or weakref callback is only printed ("Exception ignored in …"), so a plain handler can be
lost. Here the handler first *records* the signal; code that must not be cut in the middle (a training step, a
checkpoint write) runs inside :func:`deferred`, which raises at its end instead; long loops call :func:`check` at safe
points; and the CLI asks :func:`requested` when a command returns, so a swallowed interrupt still ends in exit 130.

The handler raises ``KeyboardInterrupt`` only while it is *armed*: inside :func:`handling_signals`' block, which the
CLI wraps around a command's work in a ``try`` that turns the interrupt into exit 130. Outside it the handler only
records, so a signal that lands while the options are read or after the work (while the exit status is printed,
during interpreter shutdown) never raises where nothing catches it (Python would print a traceback and end the process
by SIGINT; with the handlers restored, a SIGTERM there killed it). A program's entry point calls
:func:`install_for_process` first thing (``elmokit.cli.entry``): from then until the process ends, SIGINT and SIGTERM
are recorded or raised as above, an interrupt swallowed by a destructor is not printed, and both signals are ignored
once the last exit handler has run (Python resets its own handlers to the default action late in shutdown, where a
signal would kill the process). ``elmokit.cli.entry`` also clears CPython's mark of an interrupt that ended a string
``exec``, which otherwise turns a clean exit 130 under ``python -m`` into death by SIGINT.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = [
    "handling_signals",
    "install_for_process",
    "blocked",
    "unblock",
    "deferred",
    "shielded",
    "check",
    "pending",
    "requested",
    "clear",
    "signal_name",
    "SIGNALS",
]

#: The signals handled: Ctrl-C and ``kill``'s default.
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: list[int] = []  # signals received since the last clear(), in order
_depth = 0  # nesting depth of deferred() regions
_armed = False  # inside handling_signals(): the handler may raise KeyboardInterrupt
_nesting = 0  # nesting depth of handling_signals() blocks
_process_wide = False  # install_for_process() was called: the handler stays until the process ends


def _handler(signum, frame):  # noqa: ARG001
    _received.append(signum)
    if not _armed:
        if _process_wide and len(_received) > 1 and _received[-1] == _received[-2] == signal.SIGINT:
            # Ctrl-C twice outside a command's work (e.g. a shutdown that hangs): the default action, at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return
    if _depth == 0 or len(_received) > 1 and _received[-1] == signal.SIGINT and _received[-2] == signal.SIGINT:
        # outside a deferred region, or Ctrl-C pressed twice: stop now
        raise KeyboardInterrupt


def _install() -> dict:
    return {s: signal.signal(s, _handler) for s in SIGNALS}


def _restore(previous: dict) -> None:
    """Put the previous handlers back, every one of them even when a pending signal's handler raises on the way
    (``signal.signal`` runs pending handlers first); the interrupt is re-raised afterwards."""
    pending = None
    for s, h in previous.items():
        while True:  # each failed try has run the handler of a pending signal: the next finds none pending
            try:
                signal.signal(s, h)
                break
            except KeyboardInterrupt as exc:
                pending = exc
    if pending is not None:
        raise pending


def _ignore_signals() -> None:
    """The last exit handler: from here to the end of the process SIGINT/SIGTERM are ignored (Python is about to
    reset its handlers to the default action, which would kill a process that has finished its work)."""
    with contextlib.suppress(ValueError, OSError):
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def _unraisable(unraisable) -> None:
    """``sys.unraisablehook`` of a program: an interrupt raised inside a destructor or weakref callback, where Python
    can only print it ("Exception ignored in … Traceback … KeyboardInterrupt"), is left unprinted — it was recorded,
    and the command reports it once (exit 130); anything else goes to the previous hook."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def install_for_process() -> None:
    """For a program's entry point, called before anything slow: handle SIGINT and SIGTERM from now until the process
    ends (recorded; raised as ``KeyboardInterrupt`` only inside :func:`handling_signals`), ignore them after the last
    exit handler, and do not print an interrupt that a destructor swallowed. Does nothing outside the main thread."""
    global _process_wide, _previous_unraisablehook
    if threading.current_thread() is not threading.main_thread():
        return
    clear()
    _install()
    _process_wide = True
    atexit.register(_ignore_signals)  # registered first, so it runs last
    _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Install the handler for SIGINT and SIGTERM (SIGTERM then unwinds like Ctrl-C, so atomic writes clean up) and
    arm it for the duration of the block: a signal raises ``KeyboardInterrupt`` in the block (at the end of a
    :func:`deferred` region inside it), also one that arrived before the block under :func:`install_for_process`.
    The outermost block restores the previous handlers afterwards, unless :func:`install_for_process` was called.
    Does nothing outside the main thread."""
    global _armed, _nesting
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _nesting == 0
    previous = None
    if outer:
        if not _process_wide:
            clear()
        previous = _install()
    was_armed = _armed
    _nesting += 1
    try:
        _armed = True
        if _received and _depth == 0:  # arrived before the block (while the command's options were read)
            raise KeyboardInterrupt
        yield
    finally:
        _armed = was_armed
        _nesting -= 1
        if outer and not _process_wide:
            _restore(previous)


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in the calling thread for the block (they stay pending and are handled after it).
    Processes started inside the block (``fork``/``exec``, e.g. multiprocessing's ``spawn``) inherit the blocked mask,
    so they start with those signals pending instead of dying (or printing a ``KeyboardInterrupt`` traceback) half way
    through their imports; such a process calls :func:`unblock` once its own handler is installed."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def unblock() -> None:
    """Unblock SIGINT and SIGTERM in the calling thread (in a process started inside :func:`blocked`)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


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
    if _depth == 0 and _received and _handled():
        raise KeyboardInterrupt


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Run a few statements that an interrupt must not separate (create a file and remember its name): a signal
    arriving inside the block raises ``KeyboardInterrupt`` at its end instead (outside :func:`deferred` regions, as
    it would have without the block); one received before the block is left to the caller's next :func:`check`."""
    global _depth
    before = len(_received)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _armed and len(_received) > before:
        raise KeyboardInterrupt


def _handled() -> bool:
    """Whether a recorded signal is still to be acted on: inside :func:`handling_signals`, or in a program under
    :func:`install_for_process`. After an in-process block ends (a library caller, a test calling the CLI's
    ``main``), what it recorded was its own: it never raises in later, unrelated code, whose Ctrl-C Python's own
    handler turns into ``KeyboardInterrupt`` as usual."""
    return _armed or _process_wide


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a signal was received (call at safe points of long loops) and is still handled
    (:func:`_handled`)."""
    if _received and _depth == 0 and _handled():
        raise KeyboardInterrupt


def requested() -> bool:
    """Whether Ctrl-C or SIGTERM was received since the handler was installed (also after its block ended: the CLI
    asks once the command returned)."""
    return bool(_received)


def pending() -> bool:
    """Whether a signal was received and is still to be acted on (:func:`_handled`): what a long loop asks between
    its units of work (the trainer after each step). A signal that an earlier, finished in-process block recorded (a
    test or notebook calling the CLI's ``main``) is not pending for a later library call, which Python's own handler
    interrupts as usual."""
    return bool(_received) and _handled()


def signal_name() -> str | None:
    """``"SIGINT"``/``"SIGTERM"`` of the first signal received, or ``None``."""
    return signal.Signals(_received[0]).name if _received else None


def clear() -> None:
    """Forget received signals."""
    _received.clear()
