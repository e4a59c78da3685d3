"""Static word vectors for the task models: the zoo's word2vec baselines (or any word2vec binary), a seeded random
control, and the task vocabulary they are looked up for.

The token input of the task models is x_t = [v_w; ELMo(w_t)] (Peters et al. 2018, section 3.3): ``v_w`` is a row of
:meth:`StaticVectors.matrix_for` over the task's vocabulary (:func:`build_vocab`).
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from elmokit.baselines.word2vec import VECTORS_FILE, load_word2vec
from elmokit.errors import DataError, MissingExtraError, MissingFileError, UsageError
from elmokit.weights.native import ZOO_MODELS, zoo_model_dir

__all__ = ["StaticVectors", "build_vocab", "PAD", "UNK"]

logger = logging.getLogger(__name__)

#: The padding and unknown-word entries :func:`build_vocab` puts first.
PAD, UNK = "<pad>", "<unk>"
#: The unknown-word entry of the zoo's word2vec models (the biLM vocabulary's ``<UNK>``).
MODEL_UNK = "<UNK>"


class StaticVectors:
    """A table of static word vectors: ``words[i]`` has the float32 row ``vectors[i]`` (V, dim).

    Build with :meth:`load` (a zoo name or a word2vec binary) or :meth:`random`; then :meth:`matrix_for` gives the
    embedding matrix of a task vocabulary and :meth:`coverage` how much of it the table knows.

    Args:
        words: the table's words (distinct). vectors: (V, dim) array. source: where they came from (for messages
            and records). unk: the table's own unknown-word entry (``"<UNK>"`` for the zoo models) if it has one.
    """

    def __init__(self, words: Sequence[str], vectors: np.ndarray, *, source: str = "", unk: str | None = MODEL_UNK):
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(words):
            raise UsageError(
                f"StaticVectors: {len(words)} words but vectors of shape {tuple(vectors.shape)}; "
                "expected (len(words), dim)"
            )
        self.words = list(words)
        self.vectors = vectors
        self.source = source
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise UsageError("StaticVectors: the words are not distinct")
        self.unk = unk if unk is not None and unk in self.index else None

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def load(cls, name_or_path: str | os.PathLike) -> StaticVectors:
        """Load word2vec vectors: a zoo model name (``"elmokit-en"`` → ``$ELMOKIT_CACHE/zoo/elmokit-en/word2vec/
        vectors.bin``, via :func:`elmokit.recipes.zoo.build.model_dir`), a zoo model folder, a ``word2vec`` folder, or a
        gensim word2vec binary file (read with :func:`elmokit.baselines.word2vec.load_word2vec`).

        Raises:
            MissingFileError: the vectors are not there (for a zoo name: says to build it with ``elmokit zoo build``).
            DataError: the file is not a readable word2vec binary."""
        if not isinstance(name_or_path, (str, os.PathLike)):
            raise UsageError(f"StaticVectors.load takes a zoo model name or a path, got {type(name_or_path).__name__}")
        text = os.fspath(name_or_path)
        path = Path(text)
        if text.lower() in ZOO_MODELS and not path.exists():
            path = zoo_model_dir(text.lower()) / "word2vec" / VECTORS_FILE
            if not path.is_file():
                raise MissingFileError(
                    f"{path} not found: the zoo model {text.lower()!r} is not built (its word2vec "
                    f"baseline is part of the build): run `elmokit zoo build "
                    f"{ZOO_MODELS[text.lower()]}` (ELMOKIT_CACHE={path.parents[3]})"
                )
        elif path.is_dir() and (path / "word2vec" / VECTORS_FILE).is_file():
            path = path / "word2vec" / VECTORS_FILE
        try:
            kv = load_word2vec(path)
        except (MissingFileError, MissingExtraError):  # no file, or no gensim ([baselines]): said as it is
            raise
        except Exception as exc:  # gensim raises ValueError/EOFError/UnicodeDecodeError for a damaged file
            raise DataError(f"{path}: not a readable word2vec binary file ({type(exc).__name__}: {exc})") from None
        return cls(list(kv.index_to_key), kv.vectors, source=str(path))

    @classmethod
    def random(
        cls, vocab: Sequence[str], dim: int, seed: int, *, std: float | None = None, pad: str | None = PAD
    ) -> StaticVectors:
        """The random-vector control: every word of ``vocab`` gets an N(0, std²) row from a generator seeded with
        ``seed`` (std default 1/√dim: rows of norm ≈ 1), ``pad`` a zero row. Same seed, vocabulary and dim → the
        same table; the table has no unknown-word entry of its own (``vocab``'s ``<unk>`` is a word like any other).

        Raises :class:`UsageError` for a bad ``dim``/``std``."""
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise UsageError(f"dim must be an int >= 1, got {dim!r}")
        std = 1.0 / math.sqrt(dim) if std is None else float(std)
        if not (std > 0 and math.isfinite(std)):
            raise UsageError(f"std must be a positive number, got {std!r}")
        words = list(dict.fromkeys(vocab))
        g = torch.Generator().manual_seed(int(seed))
        vectors = torch.randn((len(words), dim), generator=g, dtype=torch.float32) * std
        if pad is not None and pad in words:
            vectors[words.index(pad)] = 0.0
        return cls(words, vectors.numpy(), source=f"random(dim={dim}, seed={seed}, std={std:g})", unk=None)

    # ------------------------------------------------------------------------------------------ lookup
    @property
    def dim(self) -> int:
        """The vector width."""
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def find(self, word: str) -> int | None:
        """The row of ``word``: the exact word, else its lower-cased form, else ``None``."""
        i = self.index.get(word)
        if i is None:
            i = self.index.get(word.lower())
        return i

    def matrix_for(self, vocab: Sequence[str], *, zero: Iterable[str] = (PAD,)) -> torch.Tensor:
        """The (V, dim) float32 embedding matrix of a task vocabulary: row i is ``vocab[i]``'s vector — the exact
        word, else the lower-cased word, else the table's unknown-word vector (``<UNK>``) if it has one, else zeros.
        Entries in ``zero`` (the padding token) are zero rows."""
        zero = set(zero)
        out = np.zeros((len(vocab), self.dim), dtype=np.float32)
        unk_row = self.index[self.unk] if self.unk is not None else None
        for r, word in enumerate(vocab):
            if word in zero:
                continue
            i = self.find(word)
            if i is None:
                i = unk_row
            if i is not None:
                out[r] = self.vectors[i]
        return torch.from_numpy(out)

    def coverage(self, vocab: Sequence[str], *, specials: Iterable[str] = (PAD, UNK)) -> float:
        """The fraction of ``vocab`` (``specials`` left out) found exactly or lower-cased; 1 − coverage is the OOV
        rate. An empty vocabulary has coverage 1."""
        specials = set(specials)
        words = [w for w in vocab if w not in specials]
        if not words:
            return 1.0
        return sum(self.find(w) is not None for w in words) / len(words)

    def __repr__(self) -> str:
        return f"StaticVectors({len(self)} words × {self.dim}, {self.source or 'in memory'})"


def build_vocab(sentences: Iterable, min_count: int = 1, specials: Sequence[str] = (PAD, UNK)) -> list[str]:
    """The task vocabulary: ``specials`` first (in order), then every token seen at least ``min_count`` times,
    most frequent first, ties in string order — the same list whatever the order of the sentences.

    ``sentences``: token lists, or :class:`~elmokit.tasks.readers.TaggedSentence` / ``LabelledSentence`` (their
    ``tokens``). Raises :class:`UsageError` for a bad ``min_count`` or a string given as a sentence."""
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise UsageError(f"min_count must be an int >= 1, got {min_count!r}")
    counts: Counter[str] = Counter()
    for s in sentences:
        tokens = getattr(s, "tokens", s)
        if isinstance(tokens, str):
            raise UsageError("build_vocab expects sentences as lists of tokens, got a string")
        counts.update(tokens)
    head = list(dict.fromkeys(specials))
    taken = set(head)
    words = sorted((w for w, n in counts.items() if n >= min_count and w not in taken), key=lambda w: (-counts[w], w))
    return head + words
