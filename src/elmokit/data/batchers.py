"""The batchers that cut a corpus's sentence stream into LM batches of token strings.

* :class:`SentenceBatcher` — batches of whole sentences, optionally bucketed by length.
* :class:`StreamWindows` — bilm-tf's training batches: ``batch_size`` continuous sentence streams cut into windows of
  ``unroll_steps`` tokens, with next-token targets for the forward and the backward LM (:class:`StreamBatch`).

Both read a :class:`~elmokit.data.shards.TextCorpus` through a :class:`~elmokit.data.shards.CorpusCursor` and are
resumable: ``state_dict()`` (plain JSON-serialisable data) taken between two batches and given to
``load_state_dict()`` of a fresh object built with the same arguments makes it yield exactly the batches the original
would have yielded next. Bucketing shuffles with :func:`~elmokit.data.shards.seeded_rng` seeded from
``(seed, pool)``: no hidden RNG state. Character ids are made downstream by ``elmokit.characters.batch_to_ids`` and
word ids by :class:`elmokit.vocabulary.Vocabulary`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from elmokit.checks import positive_int
from elmokit.data.shards import CorpusCursor, PatternLike, TextCorpus, check_saved_options, seeded_rng
from elmokit.errors import UsageTypeError

__all__ = ["BOS", "EOS", "SentenceBatcher", "StreamBatch", "StreamWindows"]

BOS = "<S>"
EOS = "</S>"


def _as_corpus(corpus: TextCorpus | PatternLike) -> TextCorpus:
    """``corpus`` itself, or a :class:`TextCorpus` with default options over the pattern(s) it is.

    Raises:
        UsageTypeError: neither a :class:`TextCorpus` nor a pattern (str, path, list or tuple of them)."""
    if isinstance(corpus, TextCorpus):
        return corpus
    if isinstance(corpus, (str, os.PathLike, list, tuple)):
        return TextCorpus(corpus)
    raise UsageTypeError(
        f"corpus must be a TextCorpus or a file pattern (str, path or list of them), got {type(corpus).__name__}"
    )


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
            seeded_rng("pool", self.corpus.seed, self._pool_index, *self.corpus._part_key).shuffle(batches)
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
        check_saved_options(
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
        check_saved_options(
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
