"""The corpus API in one import: plain-text corpora for LM pretraining and the batchers that cut them into batches.

Input format (bilm-tf's): UTF-8 text files ("shards"), one pre-tokenised sentence per line, tokens separated by
whitespace (``str.split()``; lines end at ``\\n``). Blank lines are skipped (bilm-tf would turn them into an empty
``<S> </S>`` sentence). Every piece here produces **token strings**; character ids are made downstream by
``elmokit.characters.batch_to_ids`` and word ids by :class:`elmokit.vocabulary.Vocabulary`.

The names live in three modules, one concept each, and are re-exported here (``from elmokit.data.corpus import …``):

* :mod:`elmokit.data.lines` — the one line-decoding rule (:func:`line_problem`, :func:`decode_line`: valid UTF-8, no
  NUL byte) and :func:`read_lines`, the whole-file reader of ``embed``, ``score`` and ``similar``.
* :mod:`elmokit.data.shards` — :class:`TextCorpus` (sharded, shuffled per epoch from a seed, optionally one of ``n``
  byte-range parts, fingerprinted) and :class:`CorpusCursor` (a resumable position in its multi-epoch stream).
* :mod:`elmokit.data.batchers` — :class:`SentenceBatcher` (whole sentences, optionally bucketed by length) and
  :class:`StreamWindows` (bilm-tf's ``unroll_steps`` windows over ``batch_size`` continuous streams,
  :class:`StreamBatch`).

All three iterators are resumable: ``state_dict()`` (plain JSON-serialisable data) taken between two batches and given
to ``load_state_dict()`` of a fresh object built with the same arguments makes it yield exactly the batches the
original would have yielded next.
"""

from __future__ import annotations

from elmokit.data.batchers import BOS, EOS, SentenceBatcher, StreamBatch, StreamWindows
from elmokit.data.lines import DECODE_ERRORS, DecodeErrors, decode_line, line_problem, read_lines
from elmokit.data.shards import (
    DEFAULT_MAX_TOKENS_PER_SENTENCE,
    CorpusCursor,
    LongSentencePolicy,
    PatternLike,
    TextCorpus,
)
from elmokit.errors import CorpusDecodeError

__all__ = [
    "BOS",
    "DECODE_ERRORS",
    "DEFAULT_MAX_TOKENS_PER_SENTENCE",
    "EOS",
    "CorpusCursor",
    "CorpusDecodeError",
    "DecodeErrors",
    "LongSentencePolicy",
    "PatternLike",
    "SentenceBatcher",
    "StreamBatch",
    "StreamWindows",
    "TextCorpus",
    "decode_line",
    "line_problem",
    "read_lines",
]
