"""The input of an ``embed_file`` run, read in parts: one streaming scan before any work (line count, each part's byte
offset, BLAKE2b digest, the lines that are not text), then any part read on its own from its offset.

Part ``k`` is lines ``k*part_size + 1 … (k+1)*part_size``; see :mod:`elmokit.embedding.writer` for the run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from elmokit.data.corpus import CorpusDecodeError, decode_line, line_problem

__all__ = ["InputScan", "scan_input", "read_part"]


@dataclass
class InputScan:
    """One streaming pass over the input: line count, byte offset of each part's first line, BLAKE2b digest, the
    lines that are not valid UTF-8 (``decode_errors="skip"``)."""

    path: Path
    size: int
    lines: int
    part_size: int
    offsets: list[int]
    digest: str
    skipped: list[int] = field(default_factory=list)

    @property
    def parts(self) -> int:
        """Number of parts (the last may be shorter)."""
        return len(self.offsets)

    def part_lines(self, k: int) -> int:
        """Lines in part ``k``."""
        return min(self.part_size, self.lines - k * self.part_size)


def scan_input(path: Path, decode_errors: str, part_size: int) -> InputScan:
    """Count lines, record part offsets, hash the bytes and check every line against
    :func:`elmokit.data.corpus.line_problem`'s rule (valid UTF-8, no NUL byte), before any work.

    Raises:
        CorpusDecodeError (a DataError): a bad line with ``decode_errors="strict"`` (names file, line and column)."""
    digest = hashlib.blake2b(digest_size=20)
    offsets: list[int] = []
    skipped: list[int] = []
    position = 0
    number = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if (number - 1) % part_size == 0:
                offsets.append(position)
            position += len(raw)
            digest.update(raw)
            if b"\0" in raw or not raw.isascii():  # only these can break the rule (the fast path skips the rest)
                problem = line_problem(raw)
                if problem is not None:
                    if decode_errors == "strict":
                        raise CorpusDecodeError(path, number, problem)
                    if decode_errors == "skip":
                        skipped.append(number)
    return InputScan(path, position, number, part_size, offsets, digest.hexdigest(), skipped)


def read_part(scan: InputScan, k: int, decode_errors: str) -> list[str | None]:
    """The lines of part ``k`` (text without the newline; ``None`` for a skipped line), read from its byte offset —
    the same splitting and decoding as :func:`elmokit.data.corpus.read_lines` (:func:`scan_input` has checked the
    lines, so ``"strict"`` cannot fail here)."""
    count = scan.part_lines(k)
    first = k * scan.part_size + 1
    out: list[str | None] = []
    with open(scan.path, "rb") as fh:
        fh.seek(scan.offsets[k])
        for number in range(first, first + count):
            text, _ = decode_line(fh.readline(), decode_errors, scan.path, number)
            if text is None:
                out.append(None)
                continue
            if number == 1 and text.startswith("\ufeff"):  # a byte-order mark is not part of the first token
                text = text[1:]
            out.append(text.rstrip("\r\n"))
    return out
