"""Sharded plain-text corpora read as a resumable stream of sentences (token lists).

Input format (bilm-tf's): UTF-8 text files ("shards"), one pre-tokenised sentence per line, tokens separated by
whitespace (``str.split()``; lines end at ``\\n``), decoded by :func:`elmokit.data.lines.decode_line`. Blank lines are
skipped (bilm-tf would turn them into an empty ``<S> </S>`` sentence). A shard whose name ends in ``.xz``, ``.gz`` or
``.bz2`` is decompressed as it is read (:func:`elmokit.data.lines.open_binary`: streamed, nothing written to disk).

* :class:`TextCorpus` — the files matching a glob pattern (sorted), read one shard at a time (constant memory in the
  number of shards; one shard is held in memory only when shuffling, as bilm-tf does), optionally shuffled per epoch
  (shard order and sentence order within a shard) from a seed; optionally only part ``k`` of ``n`` of it (each file's
  ``k``-th line-aligned byte range: what one of ``n`` training processes reads, without reading the rest).
* :class:`CorpusCursor` — an explicit, resumable position (epoch, shard, offset) in the multi-epoch sentence stream.
  The offset counts sentences, not bytes, so a resume is exact for compressed shards too: it re-reads (decompresses)
  the shard from its start and skips that many sentences — the same sentences an uninterrupted run took, in the same
  order. A compressed shard cannot be cut into byte ranges; read by ``n`` parts, part ``k`` takes its lines
  ``k, k + n, k + 2n, …`` (each part decompresses the whole file; each line is still in exactly one part).

Shuffling uses no hidden RNG state: each permutation comes from :func:`seeded_rng` seeded with a string built from
``(seed, epoch[, shard])``, so the position fully determines the RNG state. The batchers that cut this stream into
batches are in :mod:`elmokit.data.batchers`.
"""

from __future__ import annotations

import glob
import itertools
import logging
import lzma
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from elmokit.checks import check_int, positive_int
from elmokit.data.lines import DecodeErrors, check_decode_errors, decode_line, is_compressed, open_binary
from elmokit.errors import DataError, MissingFileError, UsageError, UsageTypeError

__all__ = [
    "DEFAULT_MAX_TOKENS_PER_SENTENCE",
    "CorpusCursor",
    "LongSentencePolicy",
    "PatternLike",
    "TextCorpus",
    "check_saved_options",
    "seeded_rng",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS_PER_SENTENCE = 1000

LongSentencePolicy = Literal["split", "error"]
PatternLike = str | os.PathLike | Sequence[str | os.PathLike]

_LONG_POLICIES = ("split", "error")


def _expand_pattern(pattern: PatternLike) -> list[Path]:
    """The regular files ``pattern`` (a glob pattern, a path, or a list or tuple of those) names, sorted.

    Raises:
        UsageTypeError: ``pattern`` (or one of its items) is not a str or path.
        MissingFileError: a pattern matches no file, or names a folder."""
    patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else pattern
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, (str, os.PathLike)) for p in patterns):
        raise UsageTypeError(
            f"pattern must be a glob pattern or path (str or os.PathLike), or a list of them; got "
            f"{pattern!r} ({type(pattern).__name__})"
        )
    if not patterns:
        raise MissingFileError("no corpus files: empty list of patterns")
    found: set[str] = set()
    for p in patterns:
        s = os.path.expanduser(os.fspath(p))
        if os.path.isfile(s):  # a literal path, even if it contains glob metacharacters
            found.add(s)
            continue
        matches = [m for m in glob.glob(s, recursive=True) if os.path.isfile(m)]
        if not matches:
            if os.path.isdir(s):
                example = os.path.join(os.fspath(p), "*.txt")
                raise MissingFileError(f"{os.fspath(p)} is a folder: give its files (e.g. {example!r})")
            raise MissingFileError(f"no corpus files match the pattern {os.fspath(p)!r}")
        found.update(matches)
    return [Path(s) for s in sorted(found)]


def seeded_rng(*parts: object) -> random.Random:
    """A ``random.Random`` seeded from ``parts`` (e.g. ``("lines", seed, epoch, shard)``): every shuffle of the corpus
    and its batchers takes its own, so a position in the stream determines the RNG state."""
    # String seeds are hashed with SHA-512 by random.seed (version 2): stable across runs and Python versions.
    return random.Random("elmokit:" + ":".join(str(p) for p in parts))


class TextCorpus:
    """A set of text shards: one pre-tokenised sentence per line, tokens split on whitespace.

    Args:
        pattern: a glob pattern (``"data/train-*.txt"``, ``**`` allowed), a file path, or a list of those. Matching
            regular files are sorted by path (duplicates removed).
        shuffle: shuffle per epoch: the shard order, and the sentences within each shard (the shard is then read into
            memory whole, as bilm-tf does; without shuffling a shard is streamed line by line).
        seed: seed of the per-epoch shuffles (epoch ``e`` of seed ``s`` always gives the same order).
        errors: invalid UTF-8: ``"strict"`` (default) raises :class:`CorpusDecodeError` naming file and line;
            ``"replace"`` decodes bad bytes as U+FFFD; ``"ignore"`` drops the bad bytes; ``"skip"`` drops the whole
            line. The non-strict modes log one warning per shard with the number of affected lines.
        max_tokens_per_sentence: longest sentence (tokens, without boundaries) passed on; ``None`` = no limit. Default
            1000: far above natural sentences (the 1B Word Benchmark's are < 100 tokens on average) but it keeps one
            runaway line (e.g. a 100,000-token document without line breaks) from making a huge padded batch.
        long_sentences: what to do with a longer line: ``"split"`` (default) cuts it into consecutive chunks of at most
            ``max_tokens_per_sentence`` tokens, each then treated as a sentence of its own (so each gets its own
            ``<S>``/``</S>`` in :class:`~elmokit.data.batchers.StreamWindows`), with one warning per
            :class:`TextCorpus`; ``"error"`` raises :class:`~elmokit.errors.DataError` naming file and line.
        part / parts: read only part ``part`` (0-based) of ``parts``: of every file, the lines that start in its
            ``part``-th byte range (the file's size cut into ``parts`` equal ranges, each moved forward to the next
            line start), so each line is in exactly one part and a part reads only its own bytes. The parts of one
            corpus together are the whole corpus; their shuffles are seeded apart. Default: the whole corpus. A
            compressed file (``.xz``, ``.gz``, ``.bz2``) has no byte ranges: part ``k`` takes its lines ``k, k + n,
            …`` (1-based line numbers ``≡ k + 1 (mod n)``), blank lines included in the count.

    Compressed files (names ending in ``.xz``, ``.gz``, ``.bz2``, any case) are decompressed while they are read
    (:func:`elmokit.data.lines.open_binary`); everything else (decoding, shuffling, positions, resume) is as for plain
    files, since positions count sentences. A corrupt or truncated compressed file raises
    :class:`~elmokit.errors.DataError` naming it when it is read.

    Raises:
        MissingFileError: a pattern matches no file (the message names the pattern).
        UsageTypeError: ``pattern`` is not a str, path or list of them, or an option has the wrong type
            (``seed=1.5``, ``parts="2"``); also a ``TypeError``.
        UsageError: a bad option value (``parts=0``, ``errors="bogus"``).
        DataError: ``parts`` > 1 and this part holds no byte of any file (the files have fewer lines than parts).

    Iterating (``sentences(epoch)``, ``iter(corpus)``) raises :class:`~elmokit.errors.DataError` ``("no sentences in
    …")`` when a whole epoch produced no sentence (empty files, only blank lines or only skipped lines), and
    :class:`CorpusDecodeError` (a ``DataError``) for invalid UTF-8 with ``errors="strict"``, naming file:line.
    """

    def __init__(
        self,
        pattern: PatternLike,
        *,
        shuffle: bool = False,
        seed: int = 0,
        errors: DecodeErrors = "strict",
        max_tokens_per_sentence: int | None = DEFAULT_MAX_TOKENS_PER_SENTENCE,
        long_sentences: LongSentencePolicy = "split",
        part: int = 0,
        parts: int = 1,
    ) -> None:
        parts = positive_int("parts", parts)
        part = check_int("part", part, 0)
        if part >= parts:
            raise UsageError(f"part must be an int in [0, parts={parts}), got {part!r}")
        check_decode_errors(errors)
        if long_sentences not in _LONG_POLICIES:
            raise UsageError(f"long_sentences must be one of {_LONG_POLICIES}, got {long_sentences!r}")
        if max_tokens_per_sentence is not None:
            max_tokens_per_sentence = positive_int("max_tokens_per_sentence", max_tokens_per_sentence)
        seed = check_int("seed", seed)
        self.pattern = pattern
        self.files: list[Path] = _expand_pattern(pattern)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.errors: DecodeErrors = errors
        self.max_tokens_per_sentence = max_tokens_per_sentence
        self.long_sentences: LongSentencePolicy = long_sentences
        self._warned_long = False
        self.part = part
        self.parts = parts
        #: extra RNG seed parts that keep the shuffles of the parts of one corpus apart (none for the whole corpus,
        #: so that its orders stay those of earlier versions)
        self._part_key: tuple[str, ...] = () if parts == 1 else (f"part{part}/{parts}",)
        # (start, end) byte range of each file read by this part; None = the whole file
        self._ranges: list[tuple[int, int] | None] = [None] * len(self.files)
        #: files read through a decompressor (split into parts by line number, not by bytes)
        self._compressed = [is_compressed(p) for p in self.files]
        if parts > 1:
            self._ranges = [None if z else _part_range(p, part, parts) for p, z in zip(self.files, self._compressed)]
            if not any(self._compressed) and all(end <= start for start, end in self._ranges):
                raise DataError(
                    f"part {part + 1} of {parts} of the corpus {_describe(pattern)!r} holds no line: the "
                    f"{len(self.files)} file(s) have fewer lines than the {parts} data parts (one per process unless "
                    "--data-parts says otherwise); use fewer processes or data parts, or more text"
                )
        self._line_bases: dict[int, int] = {}
        logger.info(
            "corpus %r: %d shard(s)%s",
            _describe(pattern),
            len(self.files),
            f", part {part + 1} of {parts}" if parts > 1 else "",
        )

    def __repr__(self) -> str:
        part = f", part={self.part}, parts={self.parts}" if self.parts > 1 else ""
        return (
            f"TextCorpus({_describe(self.pattern)!r}, files={len(self.files)}, shuffle={self.shuffle}, "
            f"seed={self.seed}, errors={self.errors!r}, max_tokens_per_sentence={self.max_tokens_per_sentence}{part})"
        )

    # ------------------------------------------------------------------ order
    def shard_order(self, epoch: int) -> list[int]:
        """Indices into :attr:`files` in the order epoch ``epoch`` reads them (sorted order unless shuffling)."""
        order = list(range(len(self.files)))
        if self.shuffle:
            seeded_rng("shards", self.seed, epoch, *self._part_key).shuffle(order)
        return order

    # ------------------------------------------------------------------ reading
    def _line_number(self, index: int, relative: int) -> int:
        """The 1-based line number in ``files[index]`` of the ``relative``-th line of this part's byte range (the
        lines before the range are counted only when a message needs the number)."""
        byte_range = self._ranges[index]
        if byte_range is None or byte_range[0] == 0:
            return relative
        if index not in self._line_bases:
            count, todo = 0, byte_range[0]
            with open(self.files[index], "rb") as f:
                while todo > 0:
                    block = f.read(min(todo, 1 << 20))
                    if not block:
                        break
                    count += block.count(b"\n")
                    todo -= len(block)
            self._line_bases[index] = count
        return self._line_bases[index] + relative

    def _lines(self, index: int) -> Iterator[tuple[int, list[str]]]:
        """(line number within this part's range of the shard, tokens) of the non-blank lines of one shard, streamed."""
        path = self.files[index]
        if self._compressed[index]:
            yield from self._compressed_lines(index)
            return
        start, end = self._ranges[index] or (0, None)
        with open(path, "rb") as f:
            if start:
                f.seek(start)
            yield from self._decoded(index, f, start, end, 1)

    def _compressed_lines(self, index: int) -> Iterator[tuple[int, list[str]]]:
        """:meth:`_lines` of a compressed shard: decompressed as read; this part's lines by line number (see the
        class). A corrupt or truncated stream raises :class:`DataError` naming the file."""
        path = self.files[index]
        try:
            with open_binary(path) as f:
                yield from self._decoded(index, f, 0, None, self.parts)
        except (EOFError, OSError, lzma.LZMAError) as exc:  # truncated; gzip.BadGzipFile, bz2's OSError; corrupt .xz
            raise DataError(
                f"{path}: cannot decompress it as {path.suffix.lower()} ({type(exc).__name__}: {exc}); is the file "
                "complete and compressed as its name says?"
            ) from None

    def _decoded(self, index: int, f, start: int, end: int | None, every: int) -> Iterator[tuple[int, list[str]]]:
        """The non-blank lines of the open binary file ``f`` (positioned at byte ``start``) up to byte ``end``, or
        every ``every``-th line from this part's first (``every`` > 1: a compressed file read by parts)."""
        path = self.files[index]
        n_bad = 0
        pos = start
        for lineno, raw in enumerate(f, start=1):
            if end is not None and pos >= end:
                break
            pos += len(raw)
            if every > 1 and (lineno - 1) % every != self.part:
                continue
            text, bad = decode_line(raw, self.errors, path, lambda: self._line_number(index, lineno))  # noqa: B023
            n_bad += bad
            if text is None:
                continue
            if lineno == 1 and start == 0 and text.startswith("\ufeff"):
                text = text[1:]
            tokens = text.split()
            if tokens:
                yield lineno, tokens
        if n_bad:
            what = "skipped" if self.errors == "skip" else f"decoded with errors={self.errors!r}"
            logger.warning("%s: %d line(s) with invalid UTF-8 or NUL bytes %s", path, n_bad, what)

    def _chunks(self, index: int, lineno: int, tokens: list[str]) -> Iterator[list[str]]:
        limit = self.max_tokens_per_sentence
        if limit is None or len(tokens) <= limit:
            yield tokens
            return
        path = self.files[index]
        if self.long_sentences == "error":
            raise DataError(
                f"{path}:{self._line_number(index, lineno)}: sentence of {len(tokens)} tokens exceeds "
                f"max_tokens_per_sentence={limit} (use long_sentences='split' or a larger limit)"
            )
        if not self._warned_long:
            logger.warning(
                "%s:%d: sentence of %d tokens split into chunks of at most %d tokens (max_tokens_per_sentence); "
                "further long lines are split silently",
                path,
                self._line_number(index, lineno),
                len(tokens),
                limit,
            )
            self._warned_long = True
        for start in range(0, len(tokens), limit):
            yield tokens[start : start + limit]

    def iter_shard(self, shard_index: int, epoch: int = 0) -> Iterator[list[str]]:
        """The sentences of shard ``files[shard_index]`` (this part's range of it) in epoch ``epoch``'s order (lines
        shuffled when shuffling).

        Long lines are split or rejected (see the class). Yields lists of tokens (no boundary tokens).
        """
        if self.shuffle:
            lines = list(self._lines(shard_index))
            seeded_rng("lines", self.seed, epoch, shard_index, *self._part_key).shuffle(lines)
            source: Iterator[tuple[int, list[str]]] = iter(lines)
        else:
            source = self._lines(shard_index)
        for lineno, tokens in source:
            yield from self._chunks(shard_index, lineno, tokens)

    def sentences(self, epoch: int = 0) -> Iterator[list[str]]:
        """All sentences of one epoch, shard by shard.

        Raises:
            DataError: ``no sentences in …`` when the epoch produced nothing; invalid UTF-8 (``errors="strict"``) or a
                too long line (``long_sentences="error"``), naming file:line.
        """
        n = 0
        for shard in self.shard_order(epoch):
            for sent in self.iter_shard(shard, epoch):
                n += 1
                yield sent
        if n == 0:
            raise self.empty_error()

    def __iter__(self) -> Iterator[list[str]]:
        return self.sentences(0)

    def empty_error(self) -> DataError:
        """The error raised when an epoch yields no sentence (names the pattern, the files and the part)."""
        names = ", ".join(str(p) for p in self.files[:5]) + (", …" if len(self.files) > 5 else "")
        if self.parts > 1:
            return DataError(
                f"no sentences in part {self.part + 1} of {self.parts} of {_describe(self.pattern)!r} "
                f"({len(self.files)} file(s): {names}): its lines are blank or skipped; use fewer processes or data "
                "parts, or more text"
            )
        return DataError(
            f"no sentences in {_describe(self.pattern)!r} ({len(self.files)} file(s): {names}): "
            "the files are empty or hold only blank/skipped lines"
        )

    def fingerprint(self) -> dict[str, Any]:
        """What a saved position depends on (file names, shuffle, seed, splitting, part); stored in state dicts."""
        out: dict[str, Any] = {
            "files": [p.name for p in self.files],
            "shuffle": self.shuffle,
            "seed": self.seed,
            "errors": self.errors,
            "max_tokens_per_sentence": self.max_tokens_per_sentence,
        }
        if self.parts > 1:
            out["part"], out["parts"] = self.part, self.parts
        return out


def _part_range(path: Path, part: int, parts: int) -> tuple[int, int]:
    """The byte range ``[start, end)`` of ``path`` that part ``part`` of ``parts`` reads: the file's size cut into
    ``parts`` equal ranges, each bound moved forward to the start of the next line (so a line belongs to the range its
    first byte is in). Reads one line at each of the two bounds."""
    size = path.stat().st_size

    def bound(k: int) -> int:
        if k >= parts:
            return size
        pos = k * size // parts
        if pos == 0:
            return 0
        with open(path, "rb") as f:
            f.seek(pos - 1)
            if f.read(1) == b"\n":
                return pos
            f.readline()
            return f.tell()

    return bound(part), bound(part + 1)


def _describe(pattern: PatternLike) -> str:
    if isinstance(pattern, (str, os.PathLike)):
        return os.fspath(pattern)
    return ", ".join(os.fspath(p) for p in pattern)


def _check_epochs(num_epochs: object) -> None:
    if num_epochs is not None:
        positive_int("num_epochs", num_epochs)


def check_saved_options(kind: str, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Check that a state dict ``saved`` by a ``kind`` object was made with the ``current`` options.

    Raises:
        UsageError: an option differs (the message names it, both values and the fix)."""
    for key, value in current.items():
        if saved.get(key) != value:
            raise UsageError(
                f"{kind}.load_state_dict: the state was saved with {key}={saved.get(key)!r}, this object has "
                f"{key}={value!r}; build it with the same corpus and options"
            )


# ---------------------------------------------------------------------------------------------- cursor
class CorpusCursor:
    """An explicit position in the sentence stream of a corpus over ``num_epochs`` epochs (``None`` = forever).

    The position is (``epoch``, ``shard_pos`` = index into that epoch's shard order, ``offset`` = sentences already
    taken from that shard). Restoring re-opens the shard and skips ``offset`` sentences (re-reading at most one shard).

    Raises (from :meth:`next`): :class:`~elmokit.errors.DataError` ``("no sentences in …")`` when an epoch ends
    without any sentence, or when a resumed shard holds fewer sentences than the saved position (the file changed);
    decoding and long-line errors from :class:`TextCorpus`.
    """

    def __init__(self, corpus: TextCorpus, num_epochs: int | None = 1) -> None:
        _check_epochs(num_epochs)
        self.corpus = corpus
        self.num_epochs = num_epochs
        self.epoch = 0
        self.shard_pos = 0
        self.offset = 0
        self.epoch_sentences = 0
        self.done = False
        self._it: Iterator[list[str]] | None = None
        self._order_epoch = -1
        self._order: list[int] = []

    def _shard_order(self) -> list[int]:
        if self._order_epoch != self.epoch:
            self._order = self.corpus.shard_order(self.epoch)
            self._order_epoch = self.epoch
        return self._order

    def next(self) -> list[str] | None:
        """The next sentence (list of tokens), or ``None`` once ``num_epochs`` epochs are exhausted."""
        while not self.done:
            if self._it is None:
                order = self._shard_order()
                if self.shard_pos >= len(order):
                    if self.epoch_sentences == 0:
                        raise self.corpus.empty_error()
                    self.epoch += 1
                    self.shard_pos = self.offset = self.epoch_sentences = 0
                    if self.num_epochs is not None and self.epoch >= self.num_epochs:
                        self.done = True
                    continue
                self._it = self.corpus.iter_shard(order[self.shard_pos], self.epoch)
                if self.offset:
                    skipped = sum(1 for _ in itertools.islice(self._it, self.offset))
                    if skipped != self.offset:
                        raise DataError(
                            f"cannot resume: shard {self.corpus.files[order[self.shard_pos]]} has {skipped} "
                            f"sentences, the saved position is at {self.offset} (the file changed?)"
                        )
            sent = next(self._it, None)
            if sent is None:
                self._it = None
                self.shard_pos += 1
                self.offset = 0
                continue
            self.offset += 1
            self.epoch_sentences += 1
            return sent
        return None

    def state_dict(self) -> dict[str, Any]:
        """The position (plain ints/bools) plus the corpus fingerprint."""
        return {
            "epoch": self.epoch,
            "shard_pos": self.shard_pos,
            "offset": self.offset,
            "epoch_sentences": self.epoch_sentences,
            "done": self.done,
            "num_epochs": self.num_epochs,
            "corpus": self.corpus.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`.

        Raises:
            UsageError: the state was saved for other files / seed / shuffle / options or another ``num_epochs``.
        """
        check_saved_options("CorpusCursor", state["corpus"], self.corpus.fingerprint())
        check_saved_options("CorpusCursor", state, {"num_epochs": self.num_epochs})
        self.epoch = int(state["epoch"])
        self.shard_pos = int(state["shard_pos"])
        self.offset = int(state["offset"])
        self.epoch_sentences = int(state["epoch_sentences"])
        self.done = bool(state["done"])
        self._it = None
