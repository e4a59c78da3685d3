"""The elmokit error family. Each subclasses a builtin so ``except ValueError`` (etc.) keeps working.

Every error that elmokit raises on purpose is an :class:`ElmoError`; the CLI turns them into one line
``elmokit <command>: error: <message>`` and an exit status:

* **2 — usage**: the call or command line is wrong and the user can fix it by changing it
  (:class:`UsageError`, :class:`ConfigError`, :class:`InputError`, :class:`MissingFileError`; argparse's own errors),
  or it needs an optional library that is not installed (:class:`MissingExtraError`: the message names the
  ``pip install 'elmokit[EXTRA]'`` that fixes it).
* **1 — failure**: the call was right but could not be completed: a damaged or mismatched file
  (:class:`WeightsError`, :class:`CheckpointError`, :class:`DataError`), a training run that cannot go on
  (:class:`TrainingError`), a folder another process is writing (:class:`FolderInUseError`), or an operating-system
  error (disk full, permission denied).

Anything else reaching the CLI is a bug: it exits 1 with ``internal error … rerun with -v`` (traceback under ``-v``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType

__all__ = [
    "ElmoError",
    "UsageError",
    "UsageTypeError",
    "ConfigError",
    "InputError",
    "InputTypeError",
    "MissingFileError",
    "WeightsError",
    "CheckpointError",
    "DataError",
    "FolderInUseError",
    "CorpusDecodeError",
    "TrainingError",
    "EmbedWorkerError",
    "MissingExtraError",
    "import_optional",
    "exit_status",
    "option_wording",
    "cli_wording",
]

#: Whether messages name command-line flags (``--resume``) or Python arguments (``resume=True``): set by the
#: ``elmokit`` command while a command runs (:func:`cli_wording`), off for library callers.
_CLI_WORDING = False


class ElmoError(Exception):
    """Base class of every elmokit-specific error."""

    #: CLI exit status for this kind of error (see the module docstring).
    exit_status = 1


class UsageError(ElmoError, ValueError):
    """The call is wrong: an option value out of range, conflicting options, an output that already exists, a path of
    the wrong kind (folder for file). The message names the option or path and what is expected."""

    exit_status = 2


class UsageTypeError(UsageError, TypeError):
    """A :class:`UsageError` for an argument of the wrong type (``batch_size=2.0``, ``workers="2"``): also a
    ``TypeError``, as Python's own functions raise for the wrong type."""


class ConfigError(ElmoError, ValueError):
    """An options/config file or value is invalid (the message names the file and key, and what is expected)."""

    exit_status = 2


class InputError(ElmoError, ValueError):
    """Model input is malformed: wrong type, wrong shape, or an unusable sentence/token (the message says which)."""

    exit_status = 2


class InputTypeError(InputError, TypeError):
    """An :class:`InputError` for model input of the wrong type (a string where a list of tokens is expected, a flat
    list where a list of sentences is): also a ``TypeError``."""


class MissingFileError(ElmoError, FileNotFoundError):
    """A file or folder the call names does not exist, or is not what it should be (the message names it)."""

    exit_status = 2


class WeightsError(ElmoError, ValueError):
    """A weight file does not match its options, or cannot be read (the message names the file/dataset and shapes)."""


class CheckpointError(ElmoError, RuntimeError):
    """A training checkpoint is damaged, missing or does not match the run (the message names the file)."""


class DataError(ElmoError, ValueError):
    """A corpus, vocabulary or text file's contents are unusable (invalid UTF-8, no sentences, ...; names file:line)."""


class FolderInUseError(ElmoError, RuntimeError):
    """Another live process holds the folder's writer lock (:func:`elmokit.io.lock_folder`): the message names the
    folder and that process (pid, start time, command). Nothing was written; the call may succeed once it has ended."""


class CorpusDecodeError(DataError):
    """A line is not text under :func:`elmokit.data.corpus.decode_line`'s rule (invalid UTF-8, or a NUL byte) with
    ``errors="strict"``. ``path`` and ``lineno`` (1-based) name it; the message says how to read it anyway.

    A :class:`DataError` (so also a ``ValueError``)."""

    def __init__(self, path: os.PathLike | str, lineno: int, detail: str) -> None:
        how = option_wording(
            "--decode-errors replace, ignore or skip", "errors= (decode_errors=) 'replace', 'ignore' or 'skip'"
        )
        super().__init__(f"{path}:{lineno}: {detail}; fix the file, or read it anyway with {how}")
        self.path = path
        self.lineno = lineno


class TrainingError(ElmoError, RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step."""


class EmbedWorkerError(ElmoError, RuntimeError):
    """A worker process of a multi-process ``embed_file`` died or failed; the finished parts are kept for resume."""


class MissingExtraError(ElmoError, ImportError):
    """An optional library that the call needs is not installed. The message is one line naming the purpose, the
    library and the ``pip install 'elmokit[EXTRA]'`` that fixes it; ``package`` is the library's pip name,
    ``extra`` the extra that installs it, ``hint`` the install command (``name``: the module that failed to import).
    Raised by :func:`import_optional`."""

    exit_status = 2

    def __init__(
        self, purpose: str, package: str, extra: str, *, name: str | None = None, reason: str | None = None
    ) -> None:
        self.purpose, self.package, self.extra = purpose, package, extra
        self.hint = f"pip install 'elmokit[{extra}]'"
        state = "is not installed" if reason is None else f"cannot be imported ({reason})"
        super().__init__(f"{purpose} needs {package}, which {state}: {self.hint}", name=name)


#: Import names whose pip name differs (the rest are the same: gensim, matplotlib, jieba, ...).
_PIP_NAMES = {"sklearn": "scikit-learn", "torchcrf": "pytorch-crf"}


def import_optional(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``"gensim.models"``) from an optional library that ``pip install 'elmokit[extra]'``
    installs (see the extras in ``pyproject.toml`` and the README). Every import of an optional library goes through
    here, inside the function that needs it, so that the core install stays importable.

    Args:
        module: the dotted module name; its first part is the library.
        extra: the extra that installs the library (``tasks``, ``plots``, ...).
        purpose: what needs it, as the start of a sentence (e.g. ``"the jieba tokenizer"``).

    Returns the module. Raises :class:`MissingExtraError` (also an ``ImportError``; CLI exit status 2) when the
    library, or a library it imports, cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        absent = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == top
        reason = None if absent else " ".join(str(exc).split())  # a broken install, or a library it needs is missing
        raise MissingExtraError(purpose, _PIP_NAMES.get(top, top), extra, name=exc.name or top, reason=reason) from exc


def exit_status(exc: BaseException) -> int:
    """The CLI exit status for an expected error: ``exc.exit_status`` for an :class:`ElmoError`, 1 for an OSError."""
    return int(getattr(exc, "exit_status", 1))


def option_wording(cli: str, api: str) -> str:
    """``cli`` (e.g. ``"--resume"``) inside an ``elmokit`` command, ``api`` (e.g. ``"resume=True"``) otherwise: a
    message names the way its reader gives the option."""
    return cli if _CLI_WORDING else api


@contextlib.contextmanager
def cli_wording() -> Iterator[None]:
    """Within this block, :func:`option_wording` gives the command-line form (the ``elmokit`` command runs its
    commands in it)."""
    global _CLI_WORDING
    previous, _CLI_WORDING = _CLI_WORDING, True
    try:
        yield
    finally:
        _CLI_WORDING = previous
