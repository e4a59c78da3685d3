"""What every ``elmokit`` command shares: option types that validate (so a bad value is an argparse error naming the
option), the checks of model/file/folder arguments made before any work starts, and output helpers.

The checks raise the :mod:`elmokit.errors` family, one line naming the path or option and what is expected:
:class:`~elmokit.errors.MissingFileError` (nothing there, or not a model), :class:`~elmokit.errors.UsageError`
(a folder where a file is wanted and the reverse, an output that would clobber something), and
:class:`~elmokit.errors.ConfigError` (an options file that is not an options.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from elmokit.config import read_options_json as read_options
from elmokit.errors import MissingFileError, UsageError
from elmokit.io import check_not_an_input, check_writable_folder
from elmokit.modules import threads

__all__ = [
    "positive_int",
    "int_at_least",
    "non_negative_int",
    "positive_float",
    "probability",
    "fraction",
    "seed",
    "path_arg",
    "text_arg",
    "check_input_file",
    "check_model",
    "check_output_file",
    "model_inputs",
    "resolve_cli_device",
    "read_options_json",
    "print_json_line",
    "DEVICE_HELP",
    "DECODE_CHOICES",
    "RELEASED_HELP",
    "add_threads_option",
]

#: ``--decode-errors`` values (see :func:`elmokit.data.corpus.read_lines`).
DECODE_CHOICES = ("strict", "replace", "ignore", "skip")
DEVICE_HELP = "auto (CUDA when available, else CPU), cpu, cuda, cuda:N"
RELEASED_HELP = (
    "a released model name (small, medium, original, original-5.5b: downloaded once into "
    "$ELMOKIT_CACHE), or a model folder (native config.json + model.safetensors, or an original "
    "*options*.json + weight *.hdf5), or a zip of one (an NLPL model archive), or a Hugging Face Hub "
    "name org/name[@revision] (elmokit[hub]; a local folder of that name wins)"
)


# ---------------------------------------------------------------------------------------------- option types
def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:  # not a number, or more digits than Python converts
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _int(text, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_threads_option(p: argparse.ArgumentParser, default: int | None = None, note: str = "") -> None:
    """Add ``--threads N`` (torch intra-op threads for the command; the CLI's main sets them before the command
    runs) to a computing command. ``default`` None: :func:`elmokit.modules.threads.default_threads`
    (``ELMOKIT_THREADS``, else the CPUs this process may use), shown in ``--help``."""
    shown = default
    if shown is None:
        try:
            shown = threads.default_threads()
        except UsageError:  # a bad ELMOKIT_THREADS: reported as a one-line error when the command runs
            shown = None
    p.add_argument(
        "--threads",
        type=positive_int,
        default=shown,
        metavar="N",
        help=f"torch threads for the computation (default: {shown or '$ELMOKIT_THREADS'}{note}; see "
        "docs/how-to/threads.md)",
    )
    p.set_defaults(uses_threads=True)


def int_at_least(minimum: int):
    """argparse type factory: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        value = _int(text, f"an integer >= {minimum}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def seed(text: str) -> int:
    """argparse type: a random seed, an integer in [0, 2**32 - 1] (the range every RNG used here accepts)."""
    value = _int(text, "an integer from 0 to 4294967295")
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 4294967295, got {text!r}")
    return value


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _float(text, "a positive number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def probability(text: str) -> float:
    """argparse type: a number in [0, 1) (a dropout rate)."""
    value = _float(text, "a number in [0, 1)")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in [0, 1] (a fraction of another value)."""
    value = _float(text, "a number in [0, 1]")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}")
    return value


def text_arg(text: str) -> str:
    """argparse type: a non-empty string without NUL characters (a model name or folder, a glob pattern)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"must not contain a NUL character, got {text!r}")
    return text


def path_arg(text: str) -> Path:
    """argparse type: a file or folder path (not empty, which would silently mean the current folder; no NUL)."""
    return Path(text_arg(text))


# ---------------------------------------------------------------------------------------------- argument checks
def check_input_file(path: Path, what: str = "input") -> None:
    """An existing regular file.

    Raises:
        MissingFileError: nothing at ``path``.
        UsageError: ``path`` is a folder, or not a regular file (a device, a pipe).
    """
    if path.is_dir():
        raise UsageError(f"the {what} {path} is a folder: give a file")
    if not path.exists():
        raise MissingFileError(f"the {what} {path}: no such file")
    if not path.is_file():
        raise UsageError(f"the {what} {path} is not a regular file: give a file")


def check_model(name_or_path: str) -> None:
    """Check, before any other rule and without loading anything, that a model argument names a model: a released
    name, a zoo model name (``elmokit-en``, ``elmokit-zh``: resolved first to its folder in ``$ELMOKIT_CACHE/zoo``,
    :func:`elmokit.weights.native.resolve_model_name`, unless a folder of that name is here), a native folder
    (``config.json``), an ELMoForManyLangs folder, a folder with an ``*options*.json`` and a ``*.hdf5``, or a zip
    file (an NLPL model archive, :mod:`elmokit.weights.archive`). Which weight file an original folder means, what a
    zip holds, and whether the files are readable, is the loader's check
    (:func:`elmokit.weights.native.load_pretrained_bilm`).

    Raises:
        MissingFileError: no such folder and not a released or zoo name; a folder holding no model; a zoo model that
            is not built (the message says which ``elmokit zoo build`` command builds it).
        UsageError: a file where a model folder or name is wanted.
    """
    from elmokit.weights.archive import is_model_archive  # lazy: CLI start-up
    from elmokit.weights.efml import is_efml_folder  # lazy: CLI start-up
    from elmokit.weights.native import RELEASED, known_model_names, resolve_model_name  # lazy: CLI start-up

    name_or_path = resolve_model_name(name_or_path)  # a zoo name → its built folder (MissingFileError if unbuilt)
    path = Path(name_or_path)
    if path.is_dir():
        if (path / "config.json").is_file() or is_efml_folder(path):  # (the loader names an EFML file missing)
            return
        if any(path.glob("*options*.json")) and any(path.glob("*.hdf5")):
            return
        found = sorted(p.name for p in path.iterdir())
        listing = f"found {found[:12]}{' …' if len(found) > 12 else ''}" if found else "it is empty"
        raise MissingFileError(
            f"{path} is a folder but not a model: it holds neither config.json + model.safetensors (elmokit's "
            f"format) nor an *options*.json and a weight *.hdf5 (the original format); {listing}"
        )
    if path.is_file() and is_model_archive(path):  # a zip: what it holds is the loader's check
        return
    if path.exists():
        hint = (
            ": for an original options.json + weights.hdf5 pair, run `elmokit convert OPTIONS WEIGHTS OUT_DIR` "
            "and use OUT_DIR"
            if path.suffix.lower() in (".json", ".hdf5", ".h5", ".safetensors")
            else ""
        )
        raise UsageError(f"the model {path} is a file: give a model folder or a released name{hint}")
    if "/" in str(name_or_path) or os.sep in str(name_or_path):
        raise MissingFileError(
            f"the model folder {path} does not exist (a model is a folder, or a released or zoo "
            f"model name: {', '.join(known_model_names())})"
        )
    if str(name_or_path).lower() not in RELEASED:
        raise MissingFileError(
            f"unknown model {str(name_or_path)!r}: no such folder, and not a released or zoo "
            f"model name ({', '.join(known_model_names())})"
        )


def model_folder(model: str) -> Path | None:
    """The folder a model argument is read from: a zoo name's folder (``elmokit-en`` → ``$ELMOKIT_CACHE/zoo/…``), the
    folder itself, or a released model's download folder in the cache; ``None`` when it is none of these (an
    options.json given as a file). Outputs must never be written inside it (they would replace the model's files)."""
    from elmokit.weights.native import RELEASED, cache_dir, resolve_model_name  # lazy: CLI start-up

    path = Path(resolve_model_name(model))
    if path.is_dir():
        return path
    if str(model).lower() in RELEASED:
        return cache_dir() / str(model).lower()
    return None


def model_inputs(model: str) -> dict[str, Path]:
    """A model argument as the inputs an output must not be (:func:`elmokit.io.check_not_an_input`): its folder
    (:func:`model_folder`: the files in it, and anything inside it), or the model file itself (a zip archive)."""
    folder = model_folder(model)
    return {"model folder": folder} if folder is not None else {"model": Path(model)}


def check_output_file(output: Path, inputs: dict[str, Path], *, overwrite: bool, what: str = "the output") -> None:
    """A text output file path (``tag|classify predict --output``): not a folder, not one of the inputs (after
    symlinks and hard links, :func:`elmokit.io.check_not_an_input`), in a folder that exists and can be written, and
    not an existing file unless ``overwrite`` (``--overwrite``) — no command replaces a file without being told to.
    The binary outputs (embeddings, plots, exports) follow the stricter :func:`elmokit.io.check_output_path`:
    ``--overwrite`` replaces only a file elmokit recognises as its own.

    Raises:
        UsageError: ``output`` is a folder, one of ``inputs`` (named by their role; also with ``overwrite``), an
            existing file without ``overwrite``, or below a file.
        MissingFileError: the folder it would be written into does not exist.
    """
    if output.is_dir():
        raise UsageError(f"{what} {output} is a folder: give a file path, e.g. {output / 'vectors.hdf5'}")
    check_not_an_input(output, inputs, what)  # also a symlink or a hard link to one
    parent = output.resolve().parent
    if parent.exists() and not parent.is_dir():
        raise UsageError(f"{what} {output} cannot be written: {parent} is a file, not a folder")
    if not parent.is_dir():
        raise MissingFileError(f"{what} {output}: its folder {parent} does not exist (create it first)")
    check_writable_folder(parent, output, what)
    if output.exists() and not overwrite:
        raise UsageError(f"{what} {output} already exists: pass --overwrite to replace it, or choose another path")


def read_options_json(path: Path, option: str) -> dict[str, Any]:
    """Parse an original ``options.json`` (the architecture), naming ``path`` and ``option`` in every error.

    Raises:
        MissingFileError: no such file. UsageError: a folder.
        ConfigError: not UTF-8 text (an HDF5 weight file is recognised and named as such), not JSON, or not a JSON
            object.
    """
    check_input_file(path, f"{option} file")
    return read_options(
        path,
        f"{'the ' if not option.startswith('-') else ''}{option} to be an options.json (the "
        "architecture, as the original ELMo releases ship it)",
    )


def resolve_cli_device(name: str | None):
    """:func:`elmokit.devices.resolve_device`, plus a check that an ``mps`` device is available (``resolve_device``
    accepts ``mps`` on machines without it, and the model's ``.to("mps")`` then fails with a RuntimeError).

    Raises:
        UsageError: as ``resolve_device``, or ``mps`` asked for where it is not available.
    """
    import torch  # lazy: CLI start-up

    from elmokit.devices import resolve_device  # lazy: CLI start-up

    device = resolve_device(name)
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise UsageError(
            f"device {name!r} asked for, but MPS is not available on this machine (use --device cpu or auto)"
        )
    return device


# ---------------------------------------------------------------------------------------------- output
def print_json_line(obj: Any) -> None:
    """Print ``obj`` as one JSON line; characters the output cannot encode (an ASCII terminal) are written as JSON
    ``\\uXXXX`` escapes, so the line stays valid JSON whatever the locale."""
    line = json.dumps(obj, ensure_ascii=False)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        line.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        line = json.dumps(obj, ensure_ascii=True)
    print(line)
