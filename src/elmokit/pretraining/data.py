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
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..characters import CharVocabulary
from ..data.corpus import SentenceBatcher, StreamBatch, StreamWindows, TextCorpus
from ..errors import CheckpointError, UsageError
from ..vocabulary import Vocabulary
from .config import TrainConfig

__all__ = ["PartBatch", "StepBatch", "TrainingData", "part_batch_size", "parts_of_process", "vocabulary_from_counts",
           "char_vocabulary_from_counts", "PartCounts", "read_sentences"]

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
        raise UsageError(f"{world_size} processes but the run's data is in {n_parts} part(s) (data_parts, set by the "
                         f"number of processes the run started with, or --data-parts): run it on 1 to {n_parts} "
                         "processes; more would change the global batch")
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
            corpus = TextCorpus(config.train_files, shuffle=config.shuffle, seed=config.seed,
                                errors=config.decode_errors, part=d, parts=n_parts)
            size = part_batch_size(config.batch_size, n_parts, d)
            self.corpora[d] = corpus
            if config.batching == "windows":
                self.batchers[d] = StreamWindows(corpus, size, config.unroll_steps, num_epochs=config.n_epochs)
            else:
                self.batchers[d] = SentenceBatcher(corpus, size, num_epochs=config.n_epochs, bucket_by_length=True)

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
                raise CheckpointError(f"{source}: no saved data position for data part {d} (it holds parts "
                                      f"{sorted(states)})")
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
