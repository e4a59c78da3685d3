"""The static baseline: word2vec (gensim) with fixed settings on exactly the biLM's text and tokens.

Fixed settings (:data:`WORD2VEC_SETTINGS`): skip-gram (``sg=1``) with negative sampling (``negative=5``),
``vector_size=300`` (the dimension of the GloVe vectors ELMo's paper compares with), ``window=5``, ``sample=1e-3``,
``alpha=0.025 → min_alpha=1e-4``, ``epochs=5``, ``seed=0``, and ``workers=1``: with one worker thread gensim's
training order is fixed, so a rebuild on the same machine and versions gives bit-identical vectors (gensim seeds its
initial vectors from ``seed`` with numpy's generator, not from Python's randomised ``hash``). ``min_count=3`` is
applied as the biLM's vocabulary applies it: words seen fewer times become ``<UNK>`` before training (gensim then runs
with ``min_count=1``), so the rare words keep their place in the contexts and ``<UNK>`` gets a vector that unknown
words can use, like the biLM's softmax row.

Files written by :func:`train_word2vec` into ``out_dir``: ``vectors.bin`` (the original word2vec binary format,
float32, readable by gensim ``KeyedVectors.load_word2vec_format(binary=True)`` and other tools; no pickle) and
``word2vec.json`` (the settings, the gensim and numpy versions, corpus counts and the sha256 of both the training
text and ``vectors.bin``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from elmokit.checks import positive_int
from elmokit.errors import DataError, InputError, InputTypeError, MissingFileError, UsageError, import_optional
from elmokit.io import atomic_path, atomic_write_text, file_sha256
from elmokit.vocabulary import UNK

__all__ = ["WORD2VEC_SETTINGS", "train_word2vec", "load_word2vec", "VECTORS_FILE", "SETTINGS_FILE"]

logger = logging.getLogger(__name__)

#: The fixed settings of the static baseline (see the module docstring); ``train_word2vec(**overrides)`` may change
#: them (tests use tiny vectors), and whatever was used is written to ``word2vec.json``.
WORD2VEC_SETTINGS: dict = {
    "sg": 1,
    "vector_size": 300,
    "window": 5,
    "min_count": 3,
    "negative": 5,
    "sample": 1e-3,
    "alpha": 0.025,
    "min_alpha": 1e-4,
    "epochs": 5,
    "seed": 0,
    "workers": 1,
}
VECTORS_FILE = "vectors.bin"
SETTINGS_FILE = "word2vec.json"
_sha256_file = file_sha256


def _prepare(sentences: Iterable[Sequence[str]], min_count: int) -> tuple[list[list[str]], str, int]:
    """Token lists with words below ``min_count`` replaced by ``<UNK>``; sha256 of the text (one sentence a line,
    tokens joined by spaces, as ``train.txt``); number of tokens."""
    sents: list[list[str]] = []
    counts: Counter[str] = Counter()
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise InputTypeError(f"train_word2vec: sentence {i} is a str; pass lists of tokens (e.g. line.split())")
        s = list(s)
        for tok in s:
            if not isinstance(tok, str) or not tok or len(tok.split()) != 1 or tok != tok.strip():
                raise InputError(
                    f"train_word2vec: sentence {i} holds the token {tok!r}: tokens must be non-empty "
                    "strings without whitespace"
                )
        counts.update(s)
        sents.append(s)
    h = hashlib.sha256()
    for s in sents:
        h.update((" ".join(s) + "\n").encode("utf-8"))
    mapped = [[t if counts[t] >= min_count else UNK for t in s] for s in sents]
    return mapped, h.hexdigest(), sum(counts.values())


def train_word2vec(sentences: Iterable[Sequence[str]], out_dir: str | Path, **settings) -> Path:
    """Train the static word2vec baseline on ``sentences`` (token lists) and save it in ``out_dir``.

    Args:
        sentences: the biLM's training sentences (the tokens of ``train.txt``). Iterated once.
        out_dir: folder for ``vectors.bin`` and ``word2vec.json`` (created; earlier files there are replaced
            atomically).
        **settings: overrides of :data:`WORD2VEC_SETTINGS` (same names as gensim's ``Word2Vec`` arguments;
            ``min_count`` is applied as ``<UNK>`` replacement, see the module docstring).

    Returns:
        The path of ``vectors.bin``.

    Raises:
        UsageError: an unknown setting, or ``workers`` != 1 (a rebuild would not repeat bit-exactly).
        InputTypeError: (also a ``TypeError``) a sentence is a ``str``.
        InputError: a sentence holds an empty/whitespace token (or a non-str one).
        DataError: no tokens.
        MissingExtraError: gensim is missing (``pip install 'elmokit[baselines]'``).
    """
    unknown = sorted(set(settings) - set(WORD2VEC_SETTINGS))
    if unknown:
        raise UsageError(
            f"train_word2vec: unknown setting(s) {', '.join(unknown)} (known: {', '.join(WORD2VEC_SETTINGS)})"
        )
    config = {**WORD2VEC_SETTINGS, **settings}
    if config["workers"] != 1:
        raise UsageError(
            f"train_word2vec: workers must be 1 so that a rebuild repeats bit-exactly, got {config['workers']!r}"
        )
    min_count = config["min_count"]
    positive_int("train_word2vec: min_count", min_count)

    gensim = import_optional("gensim", "baselines", "the word2vec baseline")  # optional: gensim
    Word2Vec = gensim.models.Word2Vec

    sents, text_sha, n_tokens = _prepare(sentences, min_count)
    if n_tokens == 0:
        raise DataError("train_word2vec: no tokens to train on")
    start = time.perf_counter()
    gensim_args = {k: v for k, v in config.items() if k != "min_count"}
    model = Word2Vec(sentences=sents, min_count=1, **gensim_args)
    seconds = time.perf_counter() - start
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vectors = out_dir / VECTORS_FILE
    with atomic_path(vectors) as tmp:
        model.wv.save_word2vec_format(str(tmp), binary=True)
    meta = {
        "settings": config,
        "min_count_applied_as": f"words seen fewer than {min_count} times replaced by {UNK} before training",
        "gensim_version": gensim.__version__,
        "numpy_version": np.__version__,
        "sentences": len(sents),
        "tokens": n_tokens,
        "vocabulary": len(model.wv),
        "train_text_sha256": text_sha,
        "vectors_file": VECTORS_FILE,
        "vectors_sha256": _sha256_file(vectors),
        "train_seconds": round(seconds, 3),
    }
    atomic_write_text(out_dir / SETTINGS_FILE, json.dumps(meta, indent=2) + "\n")
    logger.info(
        "word2vec: %d words × %d dims from %d tokens in %.1f s → %s",
        len(model.wv),
        config["vector_size"],
        n_tokens,
        seconds,
        vectors,
    )
    return vectors


def load_word2vec(path: str | Path):
    """Load vectors saved by :func:`train_word2vec`: ``path`` is the ``vectors.bin`` file or its folder.

    Returns a gensim ``KeyedVectors`` (float32 vectors, shape (V, dim); ``kv[word]``, ``kv.index_to_key``).

    Raises:
        MissingFileError: ``path`` (or ``path/vectors.bin``) does not exist.
        MissingExtraError: gensim is missing (``pip install 'elmokit[baselines]'``).
    """
    path = Path(path)
    if path.is_dir():
        path = path / VECTORS_FILE
    if not path.is_file():
        raise MissingFileError(f"word2vec vectors not found: {path} (train_word2vec writes {VECTORS_FILE})")
    KeyedVectors = import_optional("gensim.models", "baselines", "the word2vec baseline").KeyedVectors

    return KeyedVectors.load_word2vec_format(str(path), binary=True)
