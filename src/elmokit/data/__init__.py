"""Data pipelines: sharded text corpora and LM batchers (token strings; ids are made downstream)."""

from elmokit.data.corpus import (
    BOS,
    DEFAULT_MAX_TOKENS_PER_SENTENCE,
    EOS,
    CorpusCursor,
    CorpusDecodeError,
    SentenceBatcher,
    StreamBatch,
    StreamWindows,
    TextCorpus,
)

__all__ = [
    "BOS",
    "DEFAULT_MAX_TOKENS_PER_SENTENCE",
    "EOS",
    "CorpusCursor",
    "CorpusDecodeError",
    "SentenceBatcher",
    "StreamBatch",
    "StreamWindows",
    "TextCorpus",
]
