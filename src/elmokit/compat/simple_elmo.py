"""simple_elmo's API on elmokit: ``ElmoModel().load(path)``, ``get_elmo_vectors``, ``get_elmo_vector_average``.

For code written against simple_elmo (ltgoslo/simple_elmo, TensorFlow), written from its documentation (its README):
the names, arguments, defaults and output shapes are simple_elmo's; the vectors are elmokit's
(:class:`~elmokit.embedding.Embedder`, stateless), equal to ``Embedder(model).embed_sentences(texts, layers=...)``.

* ``load(path, max_batch_size=32, limit=100, full=False)``: ``path`` is an NLPL zip (:mod:`elmokit.weights.archive`),
  a folder with ``options.json`` + ``model.hdf5`` (or one ``*.hdf5``) and optional ``vocab.txt`` / ``vocab.txt.gz``,
  or anything :func:`~elmokit.weights.native.load_pretrained_bilm` reads (a native folder, a released name).
  ``limit``: the first ``limit`` words of the vocabulary are cached (their token vectors computed once:
  :class:`~elmokit.elmo.TokenVectorCache`), as simple_elmo caches their character ids; it changes no vector beyond
  float rounding. ``full=True`` (simple_elmo: a TensorFlow checkpoint for language modelling) is refused.
* ``get_elmo_vectors(texts, warmup=True, layers="average", session=None)`` → float32 (n_texts, max_len, 2P) for
  ``"average"`` (the plain mean of the L+1 layers) and ``"top"``, (n_texts, L+1, max_len, 2P) for ``"all"``; rows
  past a text's length are zeros.
* ``get_elmo_vector_average(texts, warmup=True, layers="average", session=None)`` → float32 (n_texts, 2P) (``"all"``:
  (n_texts, L+1, 2P)): the mean over a text's tokens, scaled to unit L2 norm; an empty text gives zeros.

``texts`` is a list of texts, each a list of tokens (simple_elmo's documented input; a text given as one string is
refused, naming the fix ``text.split()``; a blank token is embedded, as simple_elmo's bilm-tf batcher embeds it,
where elmokit's own :class:`~elmokit.embedding.Embedder` refuses it by default). ``warmup`` is accepted and has no
effect: simple_elmo runs the original's stateful biLM and warms its carried state up first; elmokit's inference is
stateless, so a text's vectors never depend on what ran before. ``session`` (TensorFlow's) must be ``None``.
``get_elmo_substitutes`` (simple_elmo's language-model predictions, from ``full=True`` models) is refused.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from elmokit.characters import validate_sentences
from elmokit.checks import check_int, positive_int
from elmokit.embedding import Embedder
from elmokit.errors import InputTypeError, UsageError
from elmokit.modules.bilm import BiLM
from elmokit.weights.archive import read_vocab_words
from elmokit.weights.native import load_pretrained_bilm

__all__ = ["ElmoModel", "LAYERS"]

#: simple_elmo's ``layers`` values.
LAYERS = ("average", "top", "all")


class ElmoModel:
    """simple_elmo's ``ElmoModel`` (see the module docstring): create it empty, then :meth:`load` a model.

    Attributes:
        bilm: the loaded :class:`~elmokit.modules.bilm.BiLM` (``None`` before :meth:`load`).
        embedder: the :class:`~elmokit.embedding.Embedder` that computes the vectors.
        max_batch_size: texts per forward pass (at most).
        vocab: the cached words (the vocabulary's first ``limit``; ``None`` without a vocabulary).
    """

    def __init__(self) -> None:
        self.bilm: BiLM | None = None
        self.embedder: Embedder | None = None
        self.max_batch_size = 32
        self.vocab: list[str] | None = None

    def load(
        self, directory: str | os.PathLike, max_batch_size: int = 32, limit: int = 100, full: bool = False
    ) -> ElmoModel:
        """Load a model (simple_elmo's ``load``); returns ``self``.

        Args:
            directory: an NLPL zip, an original folder (``options.json`` + ``model.hdf5``), a native folder or a
                released name.
            max_batch_size: texts per forward pass (at most), as simple_elmo splits its input.
            limit: how many words of ``vocab.txt`` / ``vocab.txt.gz`` (from the first line) to cache; ``0``: none.
            full: must be ``False``: elmokit reads no TensorFlow checkpoint.

        Raises:
            UsageError: ``full=True``; a bad ``max_batch_size`` / ``limit`` (``UsageTypeError`` for a wrong type).
            MissingFileError / WeightsError / ConfigError / UsageError: from
                :func:`~elmokit.weights.native.load_pretrained_bilm` (not a model, a TensorFlow-checkpoint zip, a
                damaged file: one line naming it).
        """
        if full:
            raise UsageError(
                "full=True loads simple_elmo's TensorFlow checkpoint for language modelling, which elmokit does "
                "not read: load the HDF5 model (full=False) for vectors; for an LM, train or convert one with elmokit"
            )
        self.max_batch_size = positive_int("max_batch_size", max_batch_size)
        limit = check_int("limit", limit, 0)
        bilm = load_pretrained_bilm(directory)
        words = getattr(bilm, "source_vocab", None)
        if words is None and Path(directory).is_dir():
            words = read_vocab_words(directory)
        self.vocab = words[:limit] if words and limit else None
        self.bilm = bilm
        self.embedder = Embedder(bilm, batch_size=self.max_batch_size, vocab_to_cache=self.vocab, empty_tokens="keep")
        return self

    def _ready(self, texts: object, layers: object, session: object, what: str) -> list[Sequence[str]]:
        if self.embedder is None:
            raise UsageError(f"{what}: no model loaded: call ElmoModel().load(PATH) first")
        if session is not None:
            raise UsageError(
                f"{what}: session is a TensorFlow session, which elmokit has no use for: leave it out (None)"
            )
        if layers not in LAYERS:
            raise UsageError(f"{what}: layers={layers!r}; expected one of {', '.join(map(repr, LAYERS))}")
        if isinstance(texts, Sequence) and not isinstance(texts, str) and texts and isinstance(texts[0], str):
            raise InputTypeError(
                f"{what}: texts must be a list of texts, each a list of tokens, got a list of strings: "
                "for raw texts pass [text.split() for text in texts]; for one tokenised text pass [tokens]"
            )
        return validate_sentences(texts, empty_tokens="keep", name="texts")

    def get_elmo_vectors(
        self, texts: Sequence[Sequence[str]], warmup: bool = True, layers: str = "average", session: object = None
    ) -> np.ndarray:
        """Token vectors of each text, padded with zeros to the longest (simple_elmo's ``get_elmo_vectors``).

        Returns:
            float32 (n_texts, max_len, 2P) for ``layers="average"`` (mean of the L+1 layers) or ``"top"``;
            (n_texts, L+1, max_len, 2P) for ``"all"``. ``warmup`` has no effect (stateless inference).

        Raises:
            InputTypeError: ``texts`` not a list of lists of str (a text given as a string: tokenise it).
            UsageError: no model loaded, a bad ``layers``, a ``session``. A blank token is embedded (as
            simple_elmo's bilm-tf batcher encodes it: begin-of-word, end-of-word).
        """
        texts = self._ready(texts, layers, session, "get_elmo_vectors")
        arrays = list(self.embedder.embed_sentences(texts, layers=layers))
        longest = max((len(t) for t in texts), default=0)
        width = self.embedder.output_dim
        if layers == "all":
            out = np.zeros((len(texts), self.embedder.num_layers, longest, width), dtype=np.float32)
            for i, arr in enumerate(arrays):  # (L+1, n_i, 2P)
                out[i, :, : arr.shape[1]] = arr
        else:
            out = np.zeros((len(texts), longest, width), dtype=np.float32)
            for i, arr in enumerate(arrays):  # (n_i, 2P)
                out[i, : arr.shape[0]] = arr
        return out

    def get_elmo_vector_average(
        self, texts: Sequence[Sequence[str]], warmup: bool = True, layers: str = "average", session: object = None
    ) -> np.ndarray:
        """One vector per text: the mean of its token vectors, scaled to unit L2 norm (simple_elmo's
        ``get_elmo_vector_average``).

        Returns:
            float32 (n_texts, 2P) for ``layers="average"`` / ``"top"``, (n_texts, L+1, 2P) for ``"all"`` (each layer
            normalised on its own); zeros for an empty text. ``warmup`` has no effect (stateless inference).

        Raises:
            as :meth:`get_elmo_vectors`.
        """
        texts = self._ready(texts, layers, session, "get_elmo_vector_average")
        width = self.embedder.output_dim
        shape = (len(texts), self.embedder.num_layers, width) if layers == "all" else (len(texts), width)
        if not texts:
            return np.zeros(shape, dtype=np.float32)
        means = np.stack(list(self.embedder.embed_sentences(texts, layers=layers, pool="mean")))
        norms = np.linalg.norm(means, axis=-1, keepdims=True)
        return (means / np.where(norms > 0, norms, 1)).astype(np.float32, copy=False)

    def get_elmo_substitutes(self, *args: object, **kwargs: object) -> None:
        """simple_elmo's language-model substitutes: refused (they need a ``full=True`` TensorFlow model).

        Raises:
            UsageError: always."""
        raise UsageError(
            "get_elmo_substitutes needs simple_elmo's full=True TensorFlow language model, which elmokit does not "
            "read; elmokit's own LMs score text with `elmokit perplexity` / `elmokit score`"
        )
