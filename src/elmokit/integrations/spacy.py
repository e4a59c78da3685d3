"""ELMo vectors in a spaCy 3.8 pipeline (``pip install 'elmokit[spacy]'``): the ``"elmokit"`` component, registered
through the ``spacy_factories`` entry point (no import needed)::

    import spacy

    nlp = spacy.blank("en")                       # or a trained pipeline: the component reads its tokens
    nlp.add_pipe("elmokit", config={"model": "elmokit-en", "layers": "average"})
    doc = nlp("The bank closed early.")
    doc._.elmo.shape                              # (L+1, T, D) float32: every layer of the doc's tokens
    doc[1]._.elmo.shape                           # (L+1, D)
    doc[1].vector, doc[0:2].vector, doc.vector    # the configured layers; a span or doc: the mean over its tokens
    doc[1].similarity(doc[3])                     # cosine of those vectors
    docs = list(nlp.pipe(texts, batch_size=64))   # sentences batched into the Embedder
    nlp.to_disk("pipeline")                       # the model's files go inside: spacy.load("pipeline") anywhere

Config: ``model`` (required) — anything :class:`~elmokit.Embedder` takes by name: a released or zoo name, a
Hugging Face Hub name, a model folder or zip; ``layers`` — ``"average"`` (the mean of the L+1 layers, D values),
``"top"``, a layer index (0 = the token layer), or ``"all"`` (the L+1 layers concatenated, (L+1)·D, as flair's
``"all"``), the layers of ``token.vector`` / ``span.vector`` / ``doc.vector`` / ``.similarity``; ``batch_size``
(sentences per forward pass, default 64; ``nlp.pipe``'s ``batch_size`` is how many docs are embedded together);
``threads`` (torch threads while embedding; default: leave torch's setting).

What is set on each doc: ``doc._.elmo`` (the (L+1, T, D) float32 array of all layers, D = 2P: layer 0 = ``[t; t]``,
then each biLSTM layer ``[forward; backward]``); the getters ``token._.elmo`` (L+1, D) and ``span._.elmo``
(L+1, n, D) read it; ``doc.user_hooks``, ``user_span_hooks`` and ``user_token_hooks`` for ``vector``,
``has_vector``, ``vector_norm`` (not for spans: spaCy computes it from their vector) and ``similarity``.
``doc.tensor`` is left to spaCy's own components. Each doc is one sentence for the biLM (a stateless pass over its
tokens; spaCy's whitespace tokens are embedded as the original embeds them). The vectors of a doc do not depend on
the other docs of ``nlp.pipe``'s batch beyond the bound :meth:`elmokit.Embedder.embed_sentences` states (1e-5 of the
largest value of each layer), and not at all with ``batch_size=1``. A pickled doc keeps all of this; a doc read back
from a ``DocBin(store_user_data=True)`` keeps ``doc._.elmo`` but not the hooks (spaCy does not store hooks).

**Loading and saving.** The model is loaded when the component is added (``add_pipe``): a zoo or Hub name is resolved
then, and an unknown name fails there. ``nlp.to_disk(path)`` writes the model in elmokit's native format into
``path/<component>/model`` (and the settings into ``cfg.json``); ``spacy.load(path)`` reads those files, not the
``model`` named in the config, so it works where that name or folder does not exist (the pipeline's ``meta.json``
marks the component as carrying its model files, and the factory then waits for ``from_disk``).

Source: spaCy 3.8 ``Language.factory``, the ``spacy_factories`` entry point, ``Doc.set_extension`` and the user
hooks (https://spacy.io/usage/processing-pipelines#custom-components-user-hooks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmokit.embedding import Embedder
from elmokit.embedding.pooling import parse_layers, select_layers
from elmokit.errors import UsageError, import_optional
from elmokit.io import atomic_write_text
from elmokit.modules.bilm import BiLM
from elmokit.modules.threads import using_threads
from elmokit.weights.native import load_native, resolve_model_name, save_pretrained

_language = import_optional("spacy.language", "spacy", "the spaCy component (elmokit.integrations.spacy)")
_tokens = import_optional("spacy.tokens", "spacy", "the spaCy component (elmokit.integrations.spacy)")
_util = import_optional("spacy.util", "spacy", "the spaCy component (elmokit.integrations.spacy)")

__all__ = ["ElmoComponent", "make_elmokit", "FACTORY"]

FACTORY = "elmokit"
#: Where a saved pipeline keeps the component's model (inside the component's folder) and its settings.
MODEL_FOLDER, SETTINGS_NAME = "model", "cfg.json"
#: The key of ``nlp.meta`` that lists the components whose model files a saved pipeline carries.
META_KEY = "elmokit_components_with_model_files"
#: Where the configured layers' token vectors (T, D') are kept in ``doc.user_data``.
_VECTORS = ("elmokit", "vectors")


def _register_extensions() -> None:
    """``doc._.elmo`` (set by the component), ``token._.elmo`` and ``span._.elmo`` (views of it)."""
    doc_cls, span_cls, token_cls = _tokens.Doc, _tokens.Span, _tokens.Token
    if not doc_cls.has_extension("elmo"):
        doc_cls.set_extension("elmo", default=None)
    if not token_cls.has_extension("elmo"):
        token_cls.set_extension("elmo", getter=lambda t: None if t.doc._.elmo is None else t.doc._.elmo[:, t.i])
    if not span_cls.has_extension("elmo"):
        span_cls.set_extension(
            "elmo", getter=lambda s: None if s.doc._.elmo is None else s.doc._.elmo[:, s.start : s.end]
        )


def _doc_vectors(doc) -> np.ndarray:
    return doc.user_data[_VECTORS]


def _token_vector(token) -> np.ndarray:
    return _doc_vectors(token.doc)[token.i]


def _span_vector(span) -> np.ndarray:
    rows = _doc_vectors(span.doc)[span.start : span.end]
    return rows.mean(axis=0) if len(rows) else np.zeros(rows.shape[1], dtype=np.float32)


def _doc_vector(doc) -> np.ndarray:
    return _span_vector(doc[:])


def _norm(vector: np.ndarray) -> float:
    return float(np.sqrt((vector.astype(np.float64) ** 2).sum()))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = _norm(a), _norm(b)
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))


def _similarity(vector_of):
    return lambda obj, other: _cosine(vector_of(obj), np.asarray(other.vector, dtype=np.float32))


def _hooks(vector_of) -> dict[str, Any]:
    return {
        "vector": vector_of,
        "has_vector": lambda obj: True,
        "vector_norm": lambda obj: _norm(vector_of(obj)),
        "similarity": _similarity(vector_of),
    }


class ElmoComponent:
    """The ``"elmokit"`` pipeline component (see the module docstring). Made by :func:`make_elmokit`.

    Args:
        nlp, name: spaCy's (the pipeline and the component's name).
        model: a model name or folder (as :class:`~elmokit.Embedder`), or a loaded :class:`~elmokit.BiLM`.
        layers: ``"average"``, ``"top"``, a layer index or ``"all"`` (the vectors' layers).
        batch_size: sentences per forward pass. threads: torch threads while embedding (``None``: as set).
        load: load the model now (``False``: when first needed, unless :meth:`from_disk` brings it).

    Raises:
        UsageError: a bad ``layers`` (or one this model does not have), ``batch_size`` or ``threads``; the model's
            loading errors (MissingFileError, ...) when ``load``.
    """

    def __init__(
        self,
        nlp,
        name: str,
        model: object,
        layers: object = "average",
        batch_size: int = 64,
        threads: int | None = None,
        *,
        load: bool = True,
    ) -> None:
        self.name = name
        self.model = model
        self.layer_spec = parse_layers(layers)
        if self.layer_spec.kind == "mix":
            raise UsageError(f"layers {layers!r}: the spaCy component takes 'average', 'top', a layer index or 'all'")
        self.layers = layers
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise UsageError(f"threads must be an int >= 1 or None, got {threads!r}")
        self.batch_size, self.threads = batch_size, threads
        self._embedder: Embedder | None = None
        _register_extensions()
        if load:
            self._set_model(self._load_named())

    # ------------------------------------------------------------------------------------------ the model
    def _load_named(self) -> BiLM:
        """The configured model, a zoo or Hub name resolved to its folder first."""
        model = self.model
        if isinstance(model, (str, os.PathLike)):
            model = resolve_model_name(model)
        return Embedder(model).bilm

    def _set_model(self, bilm: BiLM) -> None:
        self.layer_spec.check(bilm.num_layers)
        self._embedder = Embedder(bilm, batch_size=self.batch_size, empty_tokens="keep")

    @property
    def embedder(self) -> Embedder:
        """The :class:`~elmokit.Embedder` (the model loaded on first use when it was not at construction)."""
        if self._embedder is None:
            self._set_model(self._load_named())
        return self._embedder

    # ------------------------------------------------------------------------------------------ processing
    def _vectors(self, layers: np.ndarray) -> np.ndarray:
        """(L+1, T, D) → the configured layers' token vectors (T, D'), computed as the Embedder selects layers."""
        selected = select_layers(torch.from_numpy(layers).unsqueeze(0), self.layer_spec)[0]
        if self.layer_spec.kind == "all":  # (L+1, T, D) → (T, (L+1)·D), layer 0 first
            n_layers, n_tokens, dim = selected.shape
            selected = selected.permute(1, 0, 2).reshape(n_tokens, n_layers * dim)
        return np.ascontiguousarray(selected.numpy(), dtype=np.float32)

    def _set(self, docs: list) -> None:
        """Embed ``docs`` (each one sentence) together and set their attributes and hooks."""
        words = [[token.text for token in doc] for doc in docs]
        embedder = self.embedder
        if self.threads is None:
            arrays = list(embedder.embed_sentences(words, batch_size=self.batch_size, layers="all"))
        else:
            with using_threads(self.threads):
                arrays = list(embedder.embed_sentences(words, batch_size=self.batch_size, layers="all"))
        for doc, layers in zip(docs, arrays):
            doc._.elmo = layers
            doc.user_data[_VECTORS] = self._vectors(layers)
            doc.user_hooks.update(_hooks(_doc_vector))
            # no span "vector_norm" hook: spaCy 3.8's Span.vector_norm calls the span's "vector" hook when one is
            # set (a bug); without it, it computes the norm of span.vector, which goes through the hook
            doc.user_span_hooks.update({k: v for k, v in _hooks(_span_vector).items() if k != "vector_norm"})
            doc.user_token_hooks.update(_hooks(_token_vector))

    def __call__(self, doc):
        self._set([doc])
        return doc

    def pipe(self, stream: Iterable, batch_size: int = 128) -> Iterator:
        """Embed the docs of ``stream`` ``batch_size`` at a time, yield them in order."""
        for docs in _util.minibatch(stream, size=batch_size):
            docs = list(docs)
            self._set(docs)
            yield from docs

    def initialize(self, get_examples=None, *, nlp=None) -> None:
        """spaCy's ``nlp.initialize()``: load the model if it is not loaded (nothing is trained)."""
        _ = self.embedder

    # ------------------------------------------------------------------------------------------ saving
    def to_disk(self, path: str | os.PathLike, *, exclude: Iterable[str] = ()) -> None:
        """Write the model (native format) into ``path/model`` and the settings into ``path/cfg.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_pretrained(self.embedder.bilm, path / MODEL_FOLDER)
        settings = {"layers": self.layers, "batch_size": self.batch_size, "threads": self.threads}
        settings["model"] = self.model if isinstance(self.model, (str, os.PathLike)) else None
        if settings["model"] is not None:
            settings["model"] = os.fspath(settings["model"])
        atomic_write_text(path / SETTINGS_NAME, json.dumps(settings, indent=2) + "\n")

    def from_disk(self, path: str | os.PathLike, *, exclude: Iterable[str] = ()) -> ElmoComponent:
        """Read the model that :meth:`to_disk` wrote (not the config's ``model``)."""
        self._set_model(load_native(Path(path) / MODEL_FOLDER))
        return self


def make_elmokit(nlp, name: str, model: str, layers: Any, batch_size: int, threads: int | None) -> ElmoComponent:
    """The ``"elmokit"`` factory (``nlp.add_pipe("elmokit", config={...})``; see the module docstring). In a
    pipeline read back by ``spacy.load``, whose meta marks the component as carrying its model files, the model
    comes from those files (``from_disk``) and the config's ``model`` is not loaded."""
    carried = name in (nlp.meta.get(META_KEY) or [])
    component = ElmoComponent(nlp, name, model, layers, batch_size, threads, load=not carried)
    nlp.meta[META_KEY] = sorted({*(nlp.meta.get(META_KEY) or []), name})
    return component


_language.Language.factory(
    FACTORY, default_config={"layers": "average", "batch_size": 64, "threads": None}, func=make_elmokit
)
