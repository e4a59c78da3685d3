"""Sharded plain-text corpora for LM pretraining, and the batchers that cut them into token batches.

Input format (bilm-tf's): UTF-8 text files ("shards"), one pre-tokenised sentence per line, tokens separated by
whitespace (``str.split()``; lines end at ``\\n``). Blank lines are skipped (bilm-tf would turn them into an empty
``<S> </S>`` sentence). Every piece here produces **token strings**; character ids are made downstream by
``elmokit.characters.batch_to_ids`` and word ids by :class:`elmokit.vocabulary.Vocabulary`.

* :class:`TextCorpus` — the files matching a glob pattern (sorted), read one shard at a time (constant memory in the
  number of shards; one shard is held in memory only when shuffling, as bilm-tf does), optionally shuffled per epoch
  (shard order and sentence order within a shard) from a seed; optionally only part ``k`` of ``n`` of it (each file's
  ``k``-th line-aligned byte range: what one of ``n`` training processes reads, without reading the rest).
* :class:`CorpusCursor` — an explicit, resumable position (epoch, shard, offset) in the multi-epoch sentence stream.
* :class:`SentenceBatcher` — batches of whole sentences, optionally bucketed by length.
* :class:`StreamWindows` — bilm-tf's training batches: ``batch_size`` continuous sentence streams cut into windows of
  ``unroll_steps`` tokens, with next-token targets for the forward and the backward LM.

All three iterators are resumable: ``state_dict()`` (plain JSON-serialisable data) taken between two batches and given
to ``load_state_dict()`` of a fresh object built with the same arguments makes it yield exactly the batches the
original would have yielded next. Shuffling uses no hidden RNG state: each permutation comes from a
``random.Random`` seeded with a string built from ``(seed, epoch[, shard])`` (or ``(seed, pool)`` for bucketing), so
the position fully determines the RNG state.
"""
from __future__ import annotations

import glob
import itertools
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from elmokit.checks import positive_int
from elmokit.errors import CorpusDecodeError, DataError, MissingFileError, UsageError

logger = logging.getLogger(__name__)

BOS = "<S>"
EOS = "</S>"

DEFAULT_MAX_TOKENS_PER_SENTENCE = 1000

DecodeErrors = Literal["strict", "replace", "ignore", "skip"]
LongSentencePolicy = Literal["split", "error"]
PatternLike = str | os.PathLike | Sequence[str | os.PathLike]

_DECODE_ERRORS = ("strict", "replace", "ignore", "skip")
_LONG_POLICIES = ("split", "error")


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
            bom = " — a UTF-16 byte-order mark: save the file as UTF-8" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
            return f"invalid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}: {exc.reason}{bom})"
    if nul >= 0:
        return f"a NUL byte at column {nul + 1} (binary data, or UTF-16 text?)"
    return None


def decode_line(raw: bytes, errors: str, path: str | os.PathLike, lineno: int | Callable[[], int]
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
    (invalid UTF-8 and NUL bytes are bad lines).

    Raises:
        UsageError: an unknown ``errors`` mode.
        MissingFileError: no such file (or a folder).
        CorpusDecodeError: a bad line with ``errors="strict"`` (names file and line); ``"skip"`` drops such lines,
            ``"replace"``/``"ignore"`` replace or drop the bad bytes.
    """
    if errors not in _DECODE_ERRORS:
        raise UsageError(f"errors must be one of {_DECODE_ERRORS}, got {errors!r}")
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: " + ("is a folder, not a text file" if path.is_dir() else "no such file"))
    out: list[tuple[int, str]] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            text, _ = decode_line(raw, errors, path, number)
            if text is None:
                continue
            if number == 1 and text.startswith("\ufeff"):  # a byte-order mark is not part of the first token
                text = text[1:]
            out.append((number, text.rstrip("\r\n")))
    return out


def _expand_pattern(pattern: PatternLike) -> list[Path]:
    patterns = [pattern] if isinstance(pattern, (str, os.PathLike)) else list(pattern)
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
                raise MissingFileError(f"{os.fspath(p)} is a folder: give its files (e.g. {os.path.join(os.fspath(p), '*.txt')!r})")
            raise MissingFileError(f"no corpus files match the pattern {os.fspath(p)!r}")
        found.update(matches)
    return [Path(s) for s in sorted(found)]


def _seeded_rng(*parts: object) -> random.Random:
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
            ``<S>``/``</S>`` in :class:`StreamWindows`), with one warning per :class:`TextCorpus`; ``"error"`` raises
            :class:`~elmokit.errors.DataError` naming file and line.
        part / parts: read only part ``part`` (0-based) of ``parts``: of every file, the lines that start in its
            ``part``-th byte range (the file's size cut into ``parts`` equal ranges, each moved forward to the next
            line start), so each line is in exactly one part and a part reads only its own bytes. The parts of one
            corpus together are the whole corpus; their shuffles are seeded apart. Default: the whole corpus.

    Raises:
        MissingFileError: a pattern matches no file (the message names the pattern).
        UsageError: a bad option value.
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
        positive_int("parts", parts)
        if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
            raise UsageError(f"part must be an int in [0, parts={parts}), got {part!r}")
        if errors not in _DECODE_ERRORS:
            raise UsageError(f"errors must be one of {_DECODE_ERRORS}, got {errors!r}")
        if long_sentences not in _LONG_POLICIES:
            raise UsageError(f"long_sentences must be one of {_LONG_POLICIES}, got {long_sentences!r}")
        if max_tokens_per_sentence is not None and (
            isinstance(max_tokens_per_sentence, bool)
            or not isinstance(max_tokens_per_sentence, int)
            or max_tokens_per_sentence < 1
        ):
            raise UsageError(f"max_tokens_per_sentence must be None or an int >= 1, got {max_tokens_per_sentence!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise UsageError(f"seed must be an int, got {type(seed).__name__}")
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
        if parts > 1:
            self._ranges = [_part_range(p, part, parts) for p in self.files]
            if all(end <= start for start, end in self._ranges):
                raise DataError(
                    f"part {part + 1} of {parts} of the corpus {_describe(pattern)!r} holds no line: the "
                    f"{len(self.files)} file(s) have fewer lines than the {parts} data parts (one per process unless "
                    "--data-parts says otherwise); use fewer processes or data parts, or more text"
                )
        self._line_bases: dict[int, int] = {}
        logger.info("corpus %r: %d shard(s)%s", _describe(pattern), len(self.files),
                    f", part {part + 1} of {parts}" if parts > 1 else "")

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
            _seeded_rng("shards", self.seed, epoch, *self._part_key).shuffle(order)
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
        start, end = self._ranges[index] or (0, None)
        n_bad = 0
        with open(path, "rb") as f:
            if start:
                f.seek(start)
            pos = start
            for lineno, raw in enumerate(f, start=1):
                if end is not None and pos >= end:
                    break
                pos += len(raw)
                text, bad = decode_line(raw, self.errors, path, lambda: self._line_number(index, lineno))
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
                path, self._line_number(index, lineno), len(tokens), limit,
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
            _seeded_rng("lines", self.seed, epoch, shard_index, *self._part_key).shuffle(lines)
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


def _as_corpus(corpus: TextCorpus | PatternLike) -> TextCorpus:
    if isinstance(corpus, TextCorpus):
        return corpus
    if isinstance(corpus, (str, os.PathLike, list, tuple)):
        return TextCorpus(corpus)
    raise UsageError(f"expected a TextCorpus or a file pattern, got {type(corpus).__name__}")


def _check_epochs(num_epochs: object) -> None:
    if num_epochs is not None:
        positive_int("num_epochs", num_epochs)


def _check_fingerprint(kind: str, saved: dict[str, Any], current: dict[str, Any]) -> None:
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
        _check_fingerprint("CorpusCursor", state["corpus"], self.corpus.fingerprint())
        _check_fingerprint("CorpusCursor", state, {"num_epochs": self.num_epochs})
        self.epoch = int(state["epoch"])
        self.shard_pos = int(state["shard_pos"])
        self.offset = int(state["offset"])
        self.epoch_sentences = int(state["epoch_sentences"])
        self.done = bool(state["done"])
        self._it = None


# ---------------------------------------------------------------------------------------------- whole sentences
class SentenceBatcher:
    """Batches of whole sentences: ``list`` of ``batch_size`` token lists (no boundary tokens; the model adds them).

    Without bucketing, batches follow the corpus order. With ``bucket_by_length``, ``pool_batches × batch_size``
    sentences are read, sorted by length (stable), cut into batches and the batches of that pool are shuffled
    (seeded from ``(corpus.seed, pool index)``): less padding, bounded memory.

    Args:
        corpus: a :class:`TextCorpus` (or a pattern, read with default options).
        batch_size: sentences per batch (``>= 1``).
        num_epochs: passes over the corpus (``None`` = forever). Pools may span an epoch boundary.
        bucket_by_length / pool_batches: see above.
        drop_last: drop the final batch when it has fewer than ``batch_size`` sentences (default: keep it).

    An iterator: ``next(batcher)`` gives the next batch; :meth:`state_dict` / :meth:`load_state_dict` resume exactly.
    """

    def __init__(
        self,
        corpus: TextCorpus | PatternLike,
        batch_size: int,
        *,
        num_epochs: int | None = 1,
        bucket_by_length: bool = False,
        pool_batches: int = 100,
        drop_last: bool = False,
    ) -> None:
        positive_int("batch_size", batch_size)
        positive_int("pool_batches", pool_batches)
        self.corpus = _as_corpus(corpus)
        self.batch_size = batch_size
        self.bucket_by_length = bool(bucket_by_length)
        self.pool_batches = pool_batches if bucket_by_length else 1
        self.drop_last = bool(drop_last)
        self._cursor = CorpusCursor(self.corpus, num_epochs)
        self._pool_index = -1  # index of the current pool (-1: none read yet)
        self._pool_start: dict[str, Any] | None = None  # cursor state before the current pool was read
        self._pool: list[list[list[str]]] | None = None
        self._emitted = 0  # batches of the current pool already returned

    def _read_pool(self) -> list[list[list[str]]]:
        sentences: list[list[str]] = []
        want = self.batch_size * self.pool_batches
        while len(sentences) < want:
            sent = self._cursor.next()
            if sent is None:
                break
            sentences.append(sent)
        if self.bucket_by_length:
            sentences.sort(key=len)
        batches = [sentences[i : i + self.batch_size] for i in range(0, len(sentences), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        if self.bucket_by_length:
            _seeded_rng("pool", self.corpus.seed, self._pool_index, *self.corpus._part_key).shuffle(batches)
        return batches

    def __iter__(self) -> SentenceBatcher:
        return self

    def __next__(self) -> list[list[str]]:
        if self._pool is None and self._pool_start is not None:
            # restored from a state dict: re-read the pool that was being served
            self._cursor.load_state_dict(self._pool_start)
            self._pool = self._read_pool()
        while self._pool is None or self._emitted >= len(self._pool):
            if self._cursor.done and self._pool is not None:
                raise StopIteration
            self._pool_index += 1
            self._pool_start = self._cursor.state_dict()
            self._pool = self._read_pool()
            self._emitted = 0
            if not self._pool:
                raise StopIteration
        batch = self._pool[self._emitted]
        self._emitted += 1
        return [list(s) for s in batch]

    def state_dict(self) -> dict[str, Any]:
        """Position: the cursor state where the current pool starts, the pool index and batches served from it."""
        return {
            "kind": "SentenceBatcher",
            "batch_size": self.batch_size,
            "bucket_by_length": self.bucket_by_length,
            "pool_batches": self.pool_batches,
            "drop_last": self.drop_last,
            "pool_index": self._pool_index,
            "pool_start": self._pool_start,
            "emitted": self._emitted,
            "cursor": self._cursor.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s position. Raises ``UsageError`` when the options or corpus differ."""
        _check_fingerprint(
            "SentenceBatcher",
            state,
            {
                "kind": "SentenceBatcher",
                "batch_size": self.batch_size,
                "bucket_by_length": self.bucket_by_length,
                "pool_batches": self.pool_batches,
                "drop_last": self.drop_last,
            },
        )
        self._cursor.load_state_dict(state["cursor"])  # validates corpus and num_epochs
        self._pool_index = int(state["pool_index"])
        self._pool_start = state["pool_start"]
        self._emitted = int(state["emitted"])
        self._pool = None


# ---------------------------------------------------------------------------------------------- bilm-tf windows
@dataclass
class StreamBatch:
    """One step of :class:`StreamWindows`: ``B`` rows × ``T`` (``unroll_steps``) token strings.

    ``forward_targets[b][t]`` is the token after ``forward_inputs[b][t]`` in row b's forward stream;
    ``backward_*`` are the same for the backward LM, whose stream holds each sentence reversed
    (``</S> wn … w1 <S>``). ``lengths[b]`` is the number of real tokens in row b: ``T`` except in the final, partial
    batches yielded with ``drop_last=False`` (shorter, possibly empty rows).
    """

    forward_inputs: list[list[str]]
    forward_targets: list[list[str]]
    backward_inputs: list[list[str]]
    backward_targets: list[list[str]]
    lengths: list[int] = field(default_factory=list)


class StreamWindows:
    """bilm-tf's training batches: ``batch_size`` continuous streams of sentences cut into ``unroll_steps`` windows.

    What bilm-tf does (``bilm/data.py``: ``LMDataset``, ``_get_batch``, ``BidirectionalLMDataset``), reproduced here:

    * each sentence is wrapped ``<S> w1 … wn </S>`` (n + 2 tokens);
    * each of the B rows keeps its current sentence; to fill a step, rows are filled in order 0 … B-1, and a row takes
      ``how_many = min(tokens left - 1, T - filled)`` tokens as inputs and the tokens one position later as targets,
      then drops those inputs; when at most one token is left (the final ``</S>``), the row pulls the next sentence
      from the shared sentence stream. So ``</S>`` is only ever a target and ``<S>`` only an input: the pair
      (``</S>`` → next ``<S>``) is never predicted; the LSTM state is carried across windows by the trainer;
    * a sentence may span several windows (and a window several sentences);
    * when the sentence stream ends, the step being filled is dropped (bilm-tf) — or, with ``drop_last=False``, the
      remaining tokens of every row are served in final partial batches (see :class:`StreamBatch`), so that evaluation
      covers every token;
    * backward LM: bilm-tf builds a second dataset over the same files with each sentence reversed and wrapped
      ``</S> wn … w1 <S>`` (its ``Vocabulary.encode(reverse=True)`` swaps the boundaries) and windows it the same way.
      Backward inputs are therefore ``</S> wn … w2 w1`` and targets ``wn … w1 <S>``.

    One deliberate difference: bilm-tf's two datasets shuffle independently, so its forward and backward rows hold
    unrelated sentences. Here the backward stream is built from the **same** sentences in the same rows: since a
    sentence has the same length in both directions, window boundaries coincide, and backward row b of step k holds the
    reversals of exactly the sentence pieces forward row b of step k holds (a window ``<S> a b`` | ``c </S>`` in the
    forward stream is ``</S> c`` | ``b a <S>`` backward). Without shuffling bilm-tf's streams coincide too.

    Args:
        corpus: a :class:`TextCorpus` (or a pattern). Its ``max_tokens_per_sentence`` chunks are separate sentences.
        batch_size: B rows (bilm-tf: 128 per GPU). unroll_steps: T tokens per window (bilm-tf: 20).
        num_epochs: passes over the corpus (``None`` = forever, bilm-tf's behaviour; the trainer then counts steps).
        drop_last: see above (default True: bilm-tf).

    An iterator of :class:`StreamBatch`; resumable with :meth:`state_dict` / :meth:`load_state_dict` (the state holds
    each row's current sentence and position, so it is small unless sentences are very long).
    """

    def __init__(
        self,
        corpus: TextCorpus | PatternLike,
        batch_size: int,
        unroll_steps: int,
        *,
        num_epochs: int | None = 1,
        drop_last: bool = True,
    ) -> None:
        positive_int("batch_size", batch_size)
        positive_int("unroll_steps", unroll_steps)
        self.corpus = _as_corpus(corpus)
        self.batch_size = batch_size
        self.unroll_steps = unroll_steps
        self.drop_last = bool(drop_last)
        self._cursor = CorpusCursor(self.corpus, num_epochs)
        self._rows: list[tuple[list[str], int] | None] = [None] * batch_size  # (sentence, wrapped tokens consumed)
        self._finished = False
        self.steps = 0  # batches yielded so far

    def __iter__(self) -> StreamWindows:
        return self

    def __next__(self) -> StreamBatch:
        if self._finished:
            raise StopIteration
        T = self.unroll_steps
        fi: list[list[str]] = []
        ft: list[list[str]] = []
        bi: list[list[str]] = []
        bt: list[list[str]] = []
        no_more_data = False
        for b in range(self.batch_size):
            f_in: list[str] = []
            f_tg: list[str] = []
            b_in: list[str] = []
            b_tg: list[str] = []
            while len(f_in) < T:
                row = self._rows[b]
                if row is None or len(row[0]) + 2 - row[1] <= 1:
                    sent = self._cursor.next()
                    if sent is None:
                        no_more_data = True
                        break
                    row = (sent, 0)
                sent, pos = row
                fwd = [BOS, *sent, EOS]
                bwd = [EOS, *reversed(sent), BOS]
                how_many = min(len(fwd) - 1 - pos, T - len(f_in))
                f_in += fwd[pos : pos + how_many]
                f_tg += fwd[pos + 1 : pos + how_many + 1]
                b_in += bwd[pos : pos + how_many]
                b_tg += bwd[pos + 1 : pos + how_many + 1]
                self._rows[b] = (sent, pos + how_many)
            fi.append(f_in)
            ft.append(f_tg)
            bi.append(b_in)
            bt.append(b_tg)
        lengths = [len(r) for r in fi]
        if no_more_data and (self.drop_last or not any(lengths)):
            self._finished = True
            raise StopIteration
        self.steps += 1
        return StreamBatch(fi, ft, bi, bt, lengths)

    def state_dict(self) -> dict[str, Any]:
        """Position: the corpus cursor, each row's current sentence and offset, the step count (JSON-serialisable)."""
        return {
            "kind": "StreamWindows",
            "batch_size": self.batch_size,
            "unroll_steps": self.unroll_steps,
            "drop_last": self.drop_last,
            "cursor": self._cursor.state_dict(),
            "rows": [None if r is None else [list(r[0]), r[1]] for r in self._rows],
            "finished": self._finished,
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s position. Raises ``UsageError`` when the options or corpus differ."""
        _check_fingerprint(
            "StreamWindows",
            state,
            {
                "kind": "StreamWindows",
                "batch_size": self.batch_size,
                "unroll_steps": self.unroll_steps,
                "drop_last": self.drop_last,
            },
        )
        self._cursor.load_state_dict(state["cursor"])
        self._rows = [None if r is None else (list(r[0]), int(r[1])) for r in state["rows"]]
        self._finished = bool(state["finished"])
        self.steps = int(state["steps"])
