"""The ``elmokit`` command line: ``main(argv)`` and one module per command group.

Conventions, the same for every command:

* options show their defaults in ``--help``; every positional argument is described; ``--device`` defaults to
  ``auto``; counts and rates are validated by argparse (an error naming the option);
* global flags (``-v/--verbose``) go before or after the command name; ``--version``;
* an expected error (:class:`~elmokit.errors.ElmoError`, ``OSError``) prints one line
  ``elmokit <command>: error: <message>``; anything else is a bug and says so:
  ``elmokit <command>: internal error: <type>: <message> (this is a bug; rerun with -v for the traceback)``;
* exit status: 0 done, 1 failed (:data:`~elmokit.errors.ElmoError.exit_status` 1, or an OS error, or a bug),
  2 usage (argparse's errors and errors with ``exit_status`` 2), 130 interrupted (Ctrl-C or SIGTERM — also when
  the interrupt was swallowed on the way, see :mod:`elmokit.interrupts`); the program (:func:`entry`) handles the
  signals from its first milliseconds to its exit, so one signal at any moment ends in 130 (or in the command's own
  status when it came after the work was done), never in death by a signal;
* output that the terminal or pipe cannot encode (an ASCII locale) is escaped, never an error once the work is done;
  a reader that goes away (``| head``) ends the command quietly with 0.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version

import elmokit
from elmokit import interrupts
from elmokit.allocator import keep_freed_memory
from elmokit.errors import ElmoError, cli_wording, exit_status
from elmokit.modules import threads

__all__ = ["main", "entry", "build_parser", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_EPILOG = """\
exit status: 0 done, 1 failed (a damaged file, a run that cannot go on, an OS error, or a bug), 2 usage error
(wrong option or argument, missing file), 130 interrupted (Ctrl-C or SIGTERM).
Global flags (-v) may also follow the command name; `elmokit COMMAND --help` shows its options and defaults."""


def _version() -> str:
    try:
        return version("elmokit")
    except PackageNotFoundError:
        return getattr(elmokit, "__version__", "unknown")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``elmokit COMMAND: error: MESSAGE (see elmokit COMMAND --help)``, exit 2."""

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``elmokit`` parser with every command registered (each command's ``func`` set as a default)."""
    from elmokit.cli import embed, hub, models, quickstart, serve, similar, tasks, train, zoo  # lazy: CLI start-up

    global_flags = _Parser(add_help=False)
    # SUPPRESS: when the flag is not repeated after the command, the value parsed before it stays
    global_flags.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log progress details; tracebacks for internal errors (default: off)",
    )
    parser = _Parser(
        prog="elmokit",
        description="ELMo: pretrain, convert, embed.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log progress details; tracebacks for internal errors (default: off)",
    )
    parser.add_argument("--version", action="version", version=f"elmokit {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = [global_flags]
    embed.register(sub, parents)
    models.register(sub, parents)
    train.register(sub, parents)
    quickstart.register(sub, parents)
    zoo.register(sub, parents)
    tasks.register(sub, parents)
    similar.register(sub, parents)
    serve.register(sub, parents)
    hub.register(sub, parents)
    return parser


def _escape_unencodable(exc: UnicodeError):
    """Codec error handler: undecodable file-name bytes go out as they came in (``surrogateescape``), any other
    character the stream cannot encode as a backslash escape (``backslashreplace``)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    try:
        return codecs.lookup_error("surrogateescape")(exc)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(exc)


codecs.register_error("elmokit-escape", _escape_unencodable)


@contextlib.contextmanager
def _tolerant_streams() -> Iterator[None]:
    """Write characters that stdout/stderr cannot encode as escapes (e.g. "→" under ``LC_ALL=C``, where Python's
    streams are ASCII with ``surrogateescape``) while the command runs, instead of failing a command whose work is
    done; restore the streams' settings afterwards."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors in ("strict", "surrogateescape"):
            with contextlib.suppress(Exception):
                previous = stream.errors
                stream.reconfigure(errors="elmokit-escape")
                changed.append((stream, previous))
    try:
        yield
    finally:
        _flush_stdout()
        for stream, previous in changed:
            with contextlib.suppress(Exception):
                stream.flush()
                stream.reconfigure(errors=previous)


def _flush_stdout() -> None:
    """Flush stdout; if the reader has gone (``| head``), point stdout at /dev/null so the flush at exit is quiet."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _process_tag() -> str:
    """``" [process R/N]"`` under torchrun (``WORLD_SIZE`` > 1), so that each process's message says whose it is."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        return ""
    return f" [process {rank}/{world}]" if world > 1 else ""


def _say(command: str, text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"elmokit {command}{_process_tag()}: {text}", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")).strip()
    return text or type(exc).__name__


def _interrupted(args: argparse.Namespace) -> int:
    note_of = getattr(args, "interrupted_note", None)
    note = "nothing partial was written"
    if note_of is not None:
        with contextlib.suppress(Exception):
            note = note_of(args)
    _say(args.command, f"interrupted ({interrupts.signal_name() or 'KeyboardInterrupt'}); {note}")
    return EXIT_INTERRUPTED


def entry() -> int:
    """The ``elmokit`` program (the console script and ``python -m elmokit``): :func:`main` with Ctrl-C/SIGTERM
    handled for the whole process from its first milliseconds (:func:`elmokit.interrupts.install_for_process`, before
    the commands' modules and torch are imported). A signal before the command's work starts ends it with 130 and
    nothing written; one after the work ended (while the status is reported, during interpreter shutdown) leaves the
    status as it was. Returns the exit status."""
    interrupts.install_for_process()
    status = main()
    # CPython marks an interrupt that ended a string exec()/eval() as unhandled even when it was caught (dataclasses,
    # namedtuple and torch generate code that way, so a signal can land there), and under `python -m` it then ends
    # the process by SIGINT instead of with the status: "killed by signal 2" after a clean exit 130. Each string
    # evaluation resets that mark, and nothing raises an interrupt after the command (the handler only records).
    exec("")  # noqa: S102 — an empty string: the reset only
    return status


def main(argv: list[str] | None = None) -> int:
    """Run ``elmokit`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status (see the module docstring);
    ``--help``/``--version`` return 0 and argparse errors 2 instead of raising ``SystemExit``."""
    with _tolerant_streams():
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a usage error argparse has printed
            return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
        logger = logging.getLogger("elmokit")
        previous_level = logger.level
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
        logger.setLevel(logging.INFO if args.verbose else logging.WARNING)
        try:
            return _run(args)
        finally:
            logger.setLevel(previous_level)


def _run(args: argparse.Namespace) -> int:
    command = args.command
    try:
        # the handler raises KeyboardInterrupt only inside this block (armed); before and after it, it records.
        # cli_wording: messages name flags (--resume), not resume=True
        with interrupts.handling_signals(), cli_wording():
            keep_freed_memory()  # freed large blocks are reused, not page-faulted in again (see elmokit.allocator)
            with contextlib.ExitStack() as stack:
                # computing commands: --threads (default: elmokit.modules.threads)
                if getattr(args, "uses_threads", False):
                    stack.enter_context(threads.using_threads(args.threads or threads.default_threads()))
                status = int(args.func(args) or 0)
            _flush_stdout()
    except BrokenPipeError:  # e.g. `elmokit score ... | head`: the reader left; nothing to report
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return _interrupted(args)
    except (ElmoError, OSError) as exc:
        if interrupts.requested():  # an error caused by the interrupt (e.g. a half-read file): report the interrupt
            return _interrupted(args)
        _say(command, f"error: {_one_line(exc)}")
        return exit_status(exc)
    except Exception as exc:  # noqa: BLE001 — a bug: say so, never pass it off as a usage error
        if interrupts.requested():
            return _interrupted(args)
        if args.verbose:
            with contextlib.suppress(OSError, ValueError):
                traceback.print_exc(file=sys.stderr)
            _say(
                command,
                f"internal error: {type(exc).__name__}: {_one_line(exc)} (this is a bug; the traceback is above)",
            )
        else:
            _say(
                command,
                f"internal error: {type(exc).__name__}: {_one_line(exc)} (this is a bug; rerun with -v "
                "for the traceback)",
            )
        return EXIT_FAILURE
    if interrupts.requested():  # a KeyboardInterrupt was swallowed on the way (e.g. in a destructor): still 130
        return _interrupted(args)
    return status
