"""The training data of one process: its parts of the corpus, each with its own batcher, and the vocabularies counted
part by part.

A run's corpus and every step's **global** batch are cut into ``P`` data parts (``TrainConfig.data_parts``, by
default the number of processes the run starts with). Part ``d`` reads the ``d``-th line-aligned byte range of every
training file (:class:`elmokit.data.corpus.TextCorpus` with ``part=d, parts=P``) and fills
:func:`part_batch_size` of the batch's sentences (or window rows). Process ``r`` of ``N`` computes the parts
``d ≡ r (mod N)`` one after the other, so any ``N`` from 1 to ``P`` computes the same steps: what a step computes
depends on ``P``, not on ``N``. With ``P = 1`` (one process) this is the whole corpus read as before.

The vocabulary (and, in the character-vocabulary mode, the character vocabulary) is counted by each part over its own
sentences and the counts are added up, so no process reads the whole corpus; the result is the one
:meth:`elmokit.vocabulary.Vocabulary.build` gives over the whole corpus (:func:`vocabulary_from_counts`).

The corpus's **fingerprint** (:func:`corpus_fingerprint`: each training file's size, modification time and sha256,
read in 1 MiB blocks) is taken when a run starts and kept in every checkpoint's manifest; ``--resume`` takes it again
and refuses a corpus whose files changed, were added or vanished, naming them (:func:`check_corpus_unchanged`), since a
saved data position (a shard and an offset in it) only means something in the text it was saved in. Its cost is one
read of the corpus at the start and at each resume: on this project's 2-core machine (AMD EPYC with SHA instructions)
sha256 ran at 1,494–1,564 MB/s (median 1,522) over a 1 GB, 4-shard text corpus in the page cache, i.e. 0.66 s per GB
(``flock /tmp/elmokit-cpu.lock python bench/corpus_fingerprint.py --size-mb 1024 --work /tmp/fp``; BLAKE2b, the other
candidate, 674 MB/s there) — plus the disk's read time for files not cached (e.g. 2 s per GB at 500 MB/s).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmokit.characters import CharVocabulary
from elmokit.data.corpus import SentenceBatcher, StreamBatch, StreamWindows, TextCorpus
from elmokit.errors import CheckpointError, DataError, UsageError
from elmokit.pretraining.config import TrainConfig
from elmokit.vocabulary import Vocabulary

__all__ = [
    "PartBatch",
    "StepBatch",
    "TrainingData",
    "part_batch_size",
    "parts_of_process",
    "vocabulary_from_counts",
    "char_vocabulary_from_counts",
    "PartCounts",
    "read_sentences",
    "corpus_fingerprint",
    "corpus_changes",
    "check_corpus_unchanged",
]

logger = logging.getLogger(__name__)


def part_batch_size(batch_size: int, n_parts: int, part: int) -> int:
    """Sentences (window rows) part ``part`` of ``n_parts`` gives to a global batch of ``batch_size``: an equal share,
    the first ``batch_size % n_parts`` parts one more."""
    return batch_size // n_parts + (1 if part < batch_size % n_parts else 0)


def parts_of_process(rank: int, world_size: int, n_parts: int) -> list[int]:
    """The data parts process ``rank`` of ``world_size`` computes: ``d ≡ rank (mod world_size)``.

    Raises:
        UsageError: more processes than data parts (a process would have nothing to compute).
    """
    if world_size > n_parts:
        raise UsageError(
            f"{world_size} processes but the run's data is in {n_parts} part(s) (data_parts, set by the "
            f"number of processes the run started with, or --data-parts): run it on 1 to {n_parts} "
            "processes; more would change the global batch"
        )
    return [d for d in range(n_parts) if d % world_size == rank]


@dataclass
class PartBatch:
    """One data part's share of a step: ``data`` is a list of sentences (token lists) or a
    :class:`~elmokit.data.corpus.StreamBatch`; ``n_tokens`` its targets per direction."""

    part: int
    data: list[list[str]] | StreamBatch
    n_tokens: int


@dataclass
class StepBatch:
    """This process's parts of one step, and ``total_tokens``: the targets per direction of the whole global batch
    (all parts, all processes), over which the loss is averaged."""

    parts: list[PartBatch]
    total_tokens: int

    @property
    def local_tokens(self) -> int:
        return sum(p.n_tokens for p in self.parts)


@dataclass
class PartCounts:
    """What data part ``part`` counted for the vocabularies: word counts, sentences, characters (in first-seen
    order)."""

    part: int
    words: Counter
    sentences: int
    chars: Counter


def count_tokens(data: list[list[str]] | StreamBatch) -> int:
    """Targets per direction of one part's batch: ``n + 1`` per sentence (``w1 … wn </S>``), or the window lengths."""
    if isinstance(data, StreamBatch):
        return int(sum(data.lengths))
    return sum(len(s) + 1 for s in data)


class TrainingData:
    """The data parts one process computes, each a :class:`TextCorpus` part with its own batcher.

    Args:
        config: the run (``train_files``, ``batching``, ``batch_size`` (global), ``unroll_steps``, ``n_epochs``,
            ``shuffle``, ``seed``, ``decode_errors``).
        parts: the part indices this process computes (:func:`parts_of_process`). n_parts: ``P``.

    Raises: as :class:`TextCorpus` (MissingFileError, DataError naming a part without lines).
    """

    def __init__(self, config: TrainConfig, parts: Sequence[int], n_parts: int) -> None:
        self.config = config
        self.n_parts = n_parts
        self.parts = list(parts)
        self.corpora: dict[int, TextCorpus] = {}
        self.batchers: dict[int, SentenceBatcher | StreamWindows] = {}
        for d in self.parts:
            corpus = TextCorpus(
                config.train_files,
                shuffle=config.shuffle,
                seed=config.seed,
                errors=config.decode_errors,
                part=d,
                parts=n_parts,
            )
            size = part_batch_size(config.batch_size, n_parts, d)
            self.corpora[d] = corpus
            if config.batching == "windows":
                self.batchers[d] = StreamWindows(corpus, size, config.unroll_steps, num_epochs=config.n_epochs)
            else:
                self.batchers[d] = SentenceBatcher(corpus, size, num_epochs=config.n_epochs, bucket_by_length=True)

    @property
    def files(self) -> list[Path]:
        """The training files: the patterns' expansion, sorted (every part reads a range of each)."""
        return list(next(iter(self.corpora.values())).files)

    def next_parts(self) -> list[PartBatch] | None:
        """The next batch of each of this process's parts, or ``None`` when one of them has run out (the run ends
        when any part of any process has). Raises the corpus's DataError (naming file:line)."""
        out = []
        for d in self.parts:
            data = next(self.batchers[d], None)
            if data is None:
                return None
            out.append(PartBatch(d, data, count_tokens(data)))
        return out

    def __iter__(self) -> Iterator[list[PartBatch]]:
        while (parts := self.next_parts()) is not None:
            yield parts

    def counts(self) -> list[PartCounts]:
        """Word, sentence and character counts of each of this process's parts (epoch 0's order)."""
        out = []
        for d in self.parts:
            words: Counter = Counter()
            chars: Counter = Counter()
            n = 0
            for sentence in self.corpora[d].sentences(0):
                n += 1
                words.update(sentence)
                for token in sentence:
                    chars.update(token)
            out.append(PartCounts(d, words, n, chars))
        return out

    # ------------------------------------------------------------------ positions
    def state_dict(self) -> dict[int, dict[str, Any]]:
        """Part → its batcher's position (JSON-serialisable)."""
        return {d: self.batchers[d].state_dict() for d in self.parts}

    def load_state_dict(self, states: dict[int, dict[str, Any]], source: str = "checkpoint") -> None:
        """Restore this process's parts from ``states`` (part → position, e.g. every part of a checkpoint).

        Raises:
            CheckpointError: a part of this process is missing from ``states``.
            UsageError: a position that does not fit its batcher (another corpus or other options).
        """
        for d in self.parts:
            if d not in states:
                raise CheckpointError(
                    f"{source}: no saved data position for data part {d} (it holds parts {sorted(states)})"
                )
            self.batchers[d].load_state_dict(states[d])


def vocabulary_from_counts(parts: Sequence[PartCounts], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
    """The vocabulary :meth:`Vocabulary.build` makes over the sentences that ``parts`` counted, from the counts alone
    (``<S>``, ``</S>``, ``<UNK>`` first, then words by descending count, ties alphabetically; ``min_count``,
    ``max_size`` including the specials; the same ``counts``).

    Raises:
        UsageError: ``min_count < 1`` or ``max_size < 3`` (as ``Vocabulary.build``).
        DataError: a token that is empty or holds whitespace (from ``Vocabulary``).
    """
    counter: Counter = Counter()
    n_sentences = 0
    for p in parts:
        counter.update(p.words)
        n_sentences += p.sentences
    return Vocabulary.from_counts(counter, n_sentences, min_count=min_count, max_size=max_size)


def char_vocabulary_from_counts(parts: Sequence[PartCounts], max_characters_per_token: int) -> CharVocabulary:
    """The character vocabulary :meth:`CharVocabulary.build` makes over the counted sentences read part after part:
    every character seen, most frequent first, ties in first-seen order (parts in part order, whichever processes
    counted them)."""
    chars: Counter = Counter()
    for p in sorted(parts, key=lambda p: p.part):
        chars.update(p.chars)
    return CharVocabulary([ch for ch, _ in chars.most_common()], max_characters_per_token=max_characters_per_token)


def read_sentences(patterns: Sequence[str], errors: str = "strict") -> list[list[str]]:
    """Every sentence of the files matching ``patterns`` (whole files, file order), e.g. the held-out text.

    Raises: as :class:`TextCorpus` (MissingFileError for a pattern matching nothing, DataError for no sentences or
    invalid UTF-8 with ``errors="strict"``).
    """
    return list(TextCorpus(list(patterns), errors=errors).sentences(0))


# ---------------------------------------------------------------------------------------------- fingerprints
#: Bytes read at a time by :func:`corpus_fingerprint` (constant memory).
FINGERPRINT_BLOCK = 1 << 20


def corpus_fingerprint(files: Sequence[str | os.PathLike]) -> dict[str, dict[str, Any]]:
    """Each file's ``{"size": bytes, "mtime_ns": int, "sha256": hex}``, keyed by its path as given (the training
    patterns' expansion), read in :data:`FINGERPRINT_BLOCK` blocks. Cost: one read of every file (sha256: 0.66 s per
    GB on the 2-core reference machine with the files cached; see the module docstring).

    Raises:
        OSError: a file cannot be read.
    """
    out: dict[str, dict[str, Any]] = {}
    for path in files:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            while block := fh.read(FINGERPRINT_BLOCK):
                h.update(block)
        out[os.fspath(path)] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": h.hexdigest()}
    return out


def _when(record: dict[str, Any]) -> str:
    try:
        return datetime.datetime.fromtimestamp(int(record["mtime_ns"]) / 1e9).strftime("%Y-%m-%d %H:%M:%S")
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return "?"


def corpus_changes(saved: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between two :func:`corpus_fingerprint` results, one phrase per file (sorted by path): ``"X was
    edited (… bytes, modified … when the run started; … bytes, modified … now)"``, ``"X was added …"``, ``"X
    vanished …"``. A file with the same size and sha256 is unchanged whatever its modification time (touched or
    copied)."""
    changes = []
    for name in sorted(set(saved) | set(now)):
        before, after = saved.get(name), now.get(name)
        if before is None:
            changes.append(f"{name} was added (it matches the training patterns now)")
        elif after is None:
            changes.append(f"{name} vanished (the training patterns no longer match it)")
        elif (before.get("size"), before.get("sha256")) != (after["size"], after["sha256"]):
            if before.get("size") == after["size"] and _when(before) == _when(after):  # size and time kept
                changes.append(
                    f"{name} was edited (the same size, {after['size']} bytes, and modification time, "
                    "but other contents: its sha256 differs)"
                )
            else:
                changes.append(
                    f"{name} was edited ({before.get('size')} bytes, modified {_when(before)} when the "
                    f"run started; {after['size']} bytes, modified {_when(after)} now)"
                )
    return changes


def check_corpus_unchanged(
    saved: dict[str, Any] | None, files: Sequence[str | os.PathLike], out_dir: str | os.PathLike
) -> dict[str, dict[str, Any]]:
    """Fingerprint ``files`` and compare with ``saved`` (the ``"corpus"`` record of the run's manifest; ``None`` for a
    run written before corpora were fingerprinted: nothing to compare). Returns the new fingerprint.

    Raises:
        DataError: a file changed, was added or vanished (one line naming them, at most three, and the ways out).
    """
    now = corpus_fingerprint(files)
    if not isinstance(saved, dict) or not isinstance(saved.get("files"), dict):
        return now
    changes = corpus_changes(saved["files"], now)
    if changes:
        shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
        raise DataError(
            f"the training text changed since the run in {Path(out_dir)} started: {shown}. Its checkpoints "
            "hold positions in the old text, so --resume would go on in other text: put back the files "
            "the run started with, or start a new run (--overwrite, or another --out-dir)"
        )
    return now
