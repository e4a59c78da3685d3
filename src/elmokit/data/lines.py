"""The one line-decoding rule of elmokit, and the whole-file line reader built on it.

Every command that reads text (``embed``, ``score``, ``perplexity``, ``train``, ``similar``) decodes its lines with
:func:`decode_line`: a line must be valid UTF-8 and hold no NUL byte (:func:`line_problem` says why one is not);
``errors`` says what a bad line gets (raise, replace, ignore its bad bytes, or skip it). :func:`read_lines` reads a
whole file this way, keeping line numbers (for outputs that line up with their input); training streams its shards
with :class:`elmokit.data.shards.TextCorpus` instead. :func:`open_binary` opens a text file for both, decompressing
``.xz``, ``.gz`` and ``.bz2`` files (by extension) as a stream.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from elmokit.errors import CorpusDecodeError, MissingFileError, UsageError

__all__ = [
    "COMPRESSED_SUFFIXES",
    "DECODE_ERRORS",
    "DecodeErrors",
    "check_decode_errors",
    "decode_line",
    "is_compressed",
    "line_problem",
    "open_binary",
    "read_lines",
]

DecodeErrors = Literal["strict", "replace", "ignore", "skip"]

#: the ``errors`` modes of :func:`decode_line` (``--decode-errors`` on the command line)
DECODE_ERRORS = ("strict", "replace", "ignore", "skip")


#: file name endings read through a decompressor (:func:`open_binary`), and the module that reads each
COMPRESSED_SUFFIXES = {".xz": lzma, ".gz": gzip, ".bz2": bz2}


def is_compressed(path: str | os.PathLike) -> bool:
    """Whether :func:`open_binary` decompresses ``path`` (its name ends in ``.xz``, ``.gz`` or ``.bz2``, any case)."""
    return Path(path).suffix.lower() in COMPRESSED_SUFFIXES


def open_binary(path: str | os.PathLike):
    """Open a text file for reading its raw bytes line by line: ``.xz`` / ``.gz`` / ``.bz2`` files (by their
    extension, any case) through Python's :mod:`lzma` / :mod:`gzip` / :mod:`bz2`, streamed (constant memory,
    nothing written to disk), every other file as is (``open(path, "rb")``). The caller closes it (a context manager).

    Why stream rather than decompress once into a cache: a training run reads its shards once an epoch, positions are
    counted in sentences (not bytes, see :class:`elmokit.data.shards.CorpusCursor`), so an exact resume re-reads
    one shard up to its saved sentence count whatever the encoding, and a second copy of a user's corpus on disk (a
    compressed corpus is several times smaller) is not made behind their back. The cost is the decompression time
    on every read, which ``bench/corpus_prepare.py`` measures per format against plain text.

    Raises:
        OSError: the file cannot be opened (as :func:`open`). A corrupt compressed stream raises while it is read
            (``lzma.LZMAError``, ``gzip.BadGzipFile``, ``OSError``; :class:`elmokit.data.shards.TextCorpus` turns
            them into :class:`~elmokit.errors.DataError` naming the file).
    """
    module = COMPRESSED_SUFFIXES.get(Path(path).suffix.lower())
    if module is None:
        return open(path, "rb")
    return module.open(path, "rb")


def check_decode_errors(errors: object) -> None:
    """Check an ``errors`` mode. Raises :class:`~elmokit.errors.UsageError` naming the modes when it is none of
    :data:`DECODE_ERRORS`."""
    if errors not in DECODE_ERRORS:
        raise UsageError(f"errors must be one of {DECODE_ERRORS}, got {errors!r}")


def line_problem(raw: bytes) -> str | None:
    """Why one raw line (bytes, newline included or not) is not text under elmokit's rule, or ``None`` when it is.

    The rule, the same for every command that reads text (``embed``, ``score``, ``perplexity``, ``train``,
    ``similar``): a line must be valid UTF-8 and hold no NUL byte. NUL is valid UTF-8 but never text: it comes from
    binary files and UTF-16 text read as UTF-8, and HDF5 cannot store it inside a string. Every other control
    character is kept: those Python counts as whitespace (``\\t \\v \\f \\r``, ``\\x1c``–``\\x1f``, ``\\x85``)
    separate tokens like a space, the others are characters of their token.

    Returns e.g. ``"invalid UTF-8 (byte 0xff at column 3: invalid start byte)"`` or ``"a NUL byte at column 7
    (binary data, or UTF-16 text?)"`` — the first problem in the line (columns count bytes, from 1)."""
    nul = raw.find(b"\0")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if nul < 0 or exc.start < nul:
            utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
            bom = " — a UTF-16 byte-order mark: save the file as UTF-8" if utf16 else ""
            return f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}: {exc.reason}{bom})"
    if nul >= 0:
        return f"a NUL byte at column {nul + 1} (binary data, or UTF-16 text?)"
    return None


def decode_line(
    raw: bytes, errors: str, path: str | os.PathLike, lineno: int | Callable[[], int]
) -> tuple[str | None, bool]:
    """One raw line as text under :func:`line_problem`'s rule: ``(text, bad)``; ``text`` is ``None`` for a line
    ``errors="skip"`` leaves out; ``bad`` says whether the line broke the rule.

    ``errors`` is what a bad line gets: ``"strict"`` raises; ``"replace"`` decodes invalid bytes as U+FFFD and turns
    each NUL into U+FFFD; ``"ignore"`` drops them; ``"skip"`` drops the line. ``lineno`` (1-based) may be a function
    that computes it, called only for the error.

    Raises:
        CorpusDecodeError: a bad line with ``errors="strict"``, naming ``path``, the line and the first problem."""
    try:
        text = raw.decode("utf-8")
        if "\0" not in text:
            return text, False
    except UnicodeDecodeError:
        pass
    if errors == "strict":
        number = lineno() if callable(lineno) else lineno
        raise CorpusDecodeError(Path(path), number, line_problem(raw) or "not text")
    if errors == "skip":
        return None, True
    text = raw.decode("utf-8", errors=errors)
    return text.replace("\0", "\ufffd" if errors == "replace" else ""), True


def read_lines(path: str | os.PathLike, errors: str = "strict") -> list[tuple[int, str]]:
    """Every line of one UTF-8 text file as ``(line number (1-based), text without the newline)``, blank lines too.

    For commands whose output must line up with their input lines (``embed``, ``score``); training reads
    :class:`TextCorpus` instead (streamed, shuffled, blank lines dropped). Lines are decoded by :func:`decode_line`
    (invalid UTF-8 and NUL bytes are bad lines). A ``.xz`` / ``.gz`` / ``.bz2`` file is decompressed
    (:func:`open_binary`).

    Raises:
        UsageError: an unknown ``errors`` mode.
        MissingFileError: no such file (or a folder).
        CorpusDecodeError: a bad line with ``errors="strict"`` (names file and line); ``"skip"`` drops such lines,
            ``"replace"``/``"ignore"`` replace or drop the bad bytes.
    """
    check_decode_errors(errors)
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: " + ("is a folder, not a text file" if path.is_dir() else "no such file"))
    out: list[tuple[int, str]] = []
    with open_binary(path) as fh:
        for number, raw in enumerate(fh, 1):
            text, _ = decode_line(raw, errors, path, number)
            if text is None:
                continue
            if number == 1 and text.startswith("\ufeff"):  # a byte-order mark is not part of the first token
                text = text[1:]
            out.append((number, text.rstrip("\r\n")))
    return out
