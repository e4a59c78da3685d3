"""ELMo token embeddings for flair (``pip install 'elmokit[flair]'``, flair 0.15): any model elmokit loads, as a flair
``TokenEmbeddings``, in place of flair's own ``ELMoEmbeddings`` (which needs AllenNLP 0.9, uninstallable today)::

    from flair.models import SequenceTagger
    from elmokit.integrations.flair import ELMoEmbeddings

    embeddings = ELMoEmbeddings("small", embedding_mode="all")  # or a folder, a zip, options_file= + weight_file=
    tagger = SequenceTagger(hidden_size=256, embeddings=embeddings, tag_dictionary=..., tag_type="ner")

The same constructor as flair's ``ELMoEmbeddings`` (``model``, ``options_file``, ``weight_file``, ``embedding_mode``)
and the same vectors: each token gets, under the name ``elmo-<model>-<mode>``, the concatenation of the L+1 layers
(``"all"``, (L+1)·D values: layer 0 = ``[t; t]``, then each biLSTM layer ``[forward; backward]``), the top layer
(``"top"``, D) or their mean (``"average"``, D), where D = 2P (1024 for the released models). flair's embeddings
(via AllenNLP 0.9) carried the LSTM state from batch to batch; these are stateless: a sentence's vectors do not depend
on the other sentences of its mini-batch or on the order of training (see :mod:`elmokit.compat.allennlp`). A
whitespace-only token (flair keeps ``" "`` as a token) is embedded, as flair's AllenNLP-based embeddings embedded it.

**Saving.** The biLM is a submodule: a saved ``SequenceTagger`` (``tagger.save(path)``) holds its weights in its
state dict and its architecture (options, character vocabulary, start state) in the embeddings' parameters, so
``SequenceTagger.load(path)`` works without the original model files, in any process where elmokit is installed (the
file names this module, which is imported when it is read). The weights are frozen (``requires_grad`` off, as the
embeddings are static).

Source: flair 0.15.1 ``flair.embeddings.legacy.ELMoEmbeddings`` (its contract: ``name``, ``embedding_length``,
``_add_embeddings_internal``, ``static_embeddings``; serialisation as flair 0.15's ``to_params`` / ``from_params``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elmokit.characters import CharVocabulary
from elmokit.config import ElmoConfig
from elmokit.elmo import Elmo
from elmokit.embedding import Embedder, resolve_model
from elmokit.errors import UsageError, UsageTypeError, import_optional
from elmokit.modules.bilm import BiLM, StatefulBiLM

_flair_base = import_optional("flair.embeddings.base", "flair", "elmokit.integrations.flair (flair embeddings)")

__all__ = ["ELMoEmbeddings", "EMBEDDING_MODES"]

EMBEDDING_MODES = ("all", "top", "average")
#: flair's model names → elmokit's released names (flair's "pt" and "pubmed" are not released models here: pass
#: their folders)
_FLAIR_NAMES = {"large": "original-5.5b", "5.5b": "original-5.5b"}


@dataclass
class SavedArchitecture:
    """What a saved flair model keeps of the biLM besides its weights (which are in the model's state dict): the
    options, the character vocabulary (``None`` for the byte scheme) and the stored start state (``None`` = zeros).
    Defined here so that reading a saved model imports this module, which registers :class:`ELMoEmbeddings`."""

    options: dict[str, Any]
    characters: list[str] | None
    start_state: tuple[torch.Tensor, torch.Tensor] | None
    start_state_source: str | None

    @classmethod
    def of(cls, bilm: BiLM) -> SavedArchitecture:
        vocab = getattr(bilm, "char_vocab", None)
        state = bilm.start_state
        return cls(
            options=bilm.config.to_options(),
            characters=list(vocab.characters) if vocab is not None else None,
            start_state=None if state is None else (state[0].detach().cpu(), state[1].detach().cpu()),
            start_state_source=bilm.start_state_source,
        )

    def build(self) -> BiLM:
        """A :class:`BiLM` of this architecture (weights to be loaded from the state dict)."""
        config = ElmoConfig.from_options(self.options, source="the saved flair embeddings")
        bilm = BiLM(config)
        if self.characters is not None:
            bilm.char_vocab = CharVocabulary(self.characters, config.char_cnn.max_characters_per_token)
        if self.start_state is not None:
            bilm.set_start_state(self.start_state, self.start_state_source)
        return bilm


def _load(model: object, options_file: object, weight_file: object) -> tuple[BiLM, str]:
    """(the biLM, the label in the embeddings' name)."""
    if options_file is not None or weight_file is not None:
        if options_file is None or weight_file is None:
            raise UsageError("pass options_file and weight_file together (or a model name, folder or zip as model)")
        path = Path(os.fspath(options_file))
        return resolve_model(options_file, weight_file), path.parent.name if path.stem == "options" else path.stem
    if isinstance(model, Embedder):
        return model.bilm, "custom"
    if isinstance(model, (BiLM, StatefulBiLM, Elmo)):
        return resolve_model(model), "custom"
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        name = _FLAIR_NAMES.get(text.lower(), text) if isinstance(text, str) else text
        return resolve_model(name), Path(text).name or str(text)
    raise UsageTypeError(
        f"model must be a model name, folder or zip, or a loaded BiLM / Elmo / Embedder, got {type(model).__name__}"
    )


@_flair_base.register_embeddings("ElmokitELMoEmbeddings")
class ELMoEmbeddings(_flair_base.TokenEmbeddings):
    """ELMo token embeddings for flair from any model elmokit loads (flair's ``ELMoEmbeddings`` contract).

    Args:
        model: a released name (``"small"``, ``"medium"``, ``"original"``, ``"original-5.5b"``; flair's ``"large"``
            / ``"5.5B"`` mean the last), a zoo name, a model folder or zip, or a loaded :class:`~elmokit.BiLM`,
            :class:`~elmokit.Elmo` or :class:`~elmokit.Embedder`. Ignored when ``options_file`` and ``weight_file``
            are given.
        options_file, weight_file: an original ``options.json`` and its HDF5, together.
        embedding_mode: ``"all"`` (the L+1 layers concatenated, (L+1)·D values), ``"top"`` (the top layer, D) or
            ``"average"`` (the mean of the L+1 layers, D).
        batch_size: sentences per forward pass (at most; a flair mini-batch is split into these).

    Each token's vector is a float32 tensor on the biLM's device (flair moves the model to ``flair.device``), equal to
    :meth:`elmokit.Embedder.embed_batch`'s for the sentence with ``layers=embedding_mode`` (``"all"`` flattened
    layer by layer).

    Raises:
        UsageError: an unknown ``embedding_mode``, only one of ``options_file`` / ``weight_file``; as
            :func:`elmokit.embedding.resolve_model` for the model (MissingFileError, ConfigError, WeightsError).
        UsageTypeError: a model of another type.
    """

    def __init__(
        self,
        model: object = "original",
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        embedding_mode: str = "all",
        *,
        batch_size: int = 64,
        name: str | None = None,
    ) -> None:
        if embedding_mode not in EMBEDDING_MODES:
            raise UsageError(f"embedding_mode must be one of {EMBEDDING_MODES}, got {embedding_mode!r}")
        bilm, label = (model, None) if isinstance(model, SavedArchitecture) else _load(model, options_file, weight_file)
        if isinstance(bilm, SavedArchitecture):
            bilm = bilm.build()
        self.name = name or f"elmo-{label}-{embedding_mode}"
        self.static_embeddings = True
        super().__init__()
        self.embedding_mode = embedding_mode
        self.bilm = bilm.eval().requires_grad_(False)  # a submodule: saved with (and moved with) the flair model
        self._embedder = Embedder(self.bilm, batch_size=batch_size, empty_tokens="keep")
        layers = self.bilm.num_layers if embedding_mode == "all" else 1
        self._embedding_length = layers * self.bilm.output_dim

    @property
    def embedding_length(self) -> int:
        """(L+1)·D for ``"all"``, else D (D = 2P)."""
        return self._embedding_length

    def train(self, mode: bool = True) -> ELMoEmbeddings:
        """As :meth:`torch.nn.Module.train`, but the frozen biLM stays in evaluation mode."""
        super().train(mode)
        self.bilm.eval()
        return self

    def _add_embeddings_internal(self, sentences: list) -> list:
        """Set each token's embedding (see the class docstring) for a list of flair ``Sentence``."""
        embedder = self._embedder
        embedder.device = next(self.bilm.parameters()).device  # flair may have moved the model
        words = [[token.text for token in sentence] for sentence in sentences]
        arrays = embedder.embed_sentences(words, layers=self.embedding_mode)
        for sentence, array in zip(sentences, arrays):
            vectors = torch.from_numpy(array)
            if self.embedding_mode == "all":  # (L+1, n, D) → (n, (L+1)·D), layer 0 first
                n_layers, n_tokens, dim = vectors.shape  # explicit sizes: an empty sentence has n = 0
                vectors = vectors.permute(1, 0, 2).reshape(n_tokens, n_layers * dim)
            vectors = vectors.to(embedder.device)
            for token, vector in zip(sentence, vectors):
                token.set_embedding(self.name, vector)
        return sentences

    def extra_repr(self) -> str:
        return f"model={self.name}"

    def __str__(self) -> str:
        return self.name

    # ------------------------------------------------------------------------------ flair 0.15 serialisation
    def to_params(self) -> dict[str, Any]:
        """What flair saves besides the state dict (see the module docstring, "Saving")."""
        return {
            "architecture": SavedArchitecture.of(self.bilm),
            "embedding_mode": self.embedding_mode,
            "name": self.name,
            "batch_size": self._embedder.batch_size,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ELMoEmbeddings:
        """The embeddings of :meth:`to_params`, with an untrained biLM of that architecture (flair then loads the
        weights from the state dict)."""
        return cls(
            params["architecture"],
            embedding_mode=params["embedding_mode"],
            batch_size=params.get("batch_size", 64),
            name=params["name"],
        )
