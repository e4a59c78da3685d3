"""ELMoForManyLangs' ``Embedder(model_dir).sents2elmo(sentences, output_layer)`` on elmokit.

``from elmokit.compat.efml import Embedder`` stands in for ``from elmoformanylangs import Embedder``: the same
constructor and ``sents2elmo`` results (``tests/test_compat_efml.py`` checks them against EFML 0.0.4.post2's own
outputs, ≤ 1e-5), read from an EFML model folder (:mod:`elmokit.weights.efml`) or any elmokit model.

Differences from EFML's code, each deliberate:

* **stateless by default**: every call starts the LSTMs from zeros, so a sentence's vectors do not depend on what ran
  before (EFML carries the state from call to call; its first call on a fresh ``Embedder`` is what this computes).
  ``stateful=True`` carries it as EFML does: sentences sorted by length (longest first, stable), cut into batches of
  ``batch_size``, each batch row starting from the state the same row reached in the previous batch;
  :meth:`Embedder.reset_states` forgets it;
* **no shuffling**: EFML visits its batches in an order drawn from Python's unseeded ``random``; here they run in
  order (only matters with ``stateful=True`` and more sentences than ``batch_size``);
* arrays are float32 always (EFML's are float32 on CPU too); the device is the CPU unless ``device=`` says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from elmokit.characters import batch_to_ids, validate_sentences
from elmokit.checks import is_int, positive_int
from elmokit.embedding.embedder import Embedder as _Embedder
from elmokit.errors import UsageError
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.weights.native import load_pretrained_bilm

__all__ = ["Embedder"]


class Embedder:
    """``Embedder(model_dir, batch_size=64)`` as ELMoForManyLangs'.

    Args:
        model_dir: an ELMoForManyLangs folder (``config.json``, ``char.dic``, ``word.dic``, ``encoder.pkl``,
            ``token_embedder.pkl``), or any model ``load_pretrained_bilm`` reads (a native folder, ``elmokit convert``
            of an EFML folder included); or a loaded :class:`~elmokit.modules.bilm.BiLM`.
        batch_size: sentences per biLM call.
        stateful: carry the LSTM state from batch to batch and call to call, as EFML does (see the module docstring);
            default ``False``: each call starts from zeros (deterministic).
        device: where to run (default: the CPU).

    Attributes:
        bilm: the :class:`BiLM`. num_layers: L + 1 (3 for the released models).

    Raises:
        UsageError / UsageTypeError: a bad ``batch_size``; MissingFileError / ConfigError / WeightsError: from the
        loader, naming the file.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike | BiLM,
        batch_size: int = 64,
        *,
        stateful: bool = False,
        device: str | torch.device | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.batch_size = positive_int("batch_size", batch_size)
        bilm = model_dir if isinstance(model_dir, BiLM) else load_pretrained_bilm(model_dir)
        self._embedder = _Embedder(bilm, batch_size=self.batch_size, device=device, empty_tokens="keep")
        self.bilm = self._embedder.bilm
        self.num_layers = self.bilm.num_layers
        self.stateful = bool(stateful)
        self._stateful_bilm = StatefulBiLM(self.bilm) if self.stateful else None

    def reset_states(self) -> None:
        """Forget the carried LSTM state (``stateful=True``): the next call starts from zeros."""
        if self._stateful_bilm is not None:
            self._stateful_bilm.reset_states()

    def _check_layer(self, output_layer: object) -> int:
        n = self.num_layers
        if not is_int(output_layer) or not -2 <= output_layer < n:
            raise UsageError(
                f"output_layer must be an int in -2 … {n - 1} (0 … {n - 1} one layer, -1 their mean, -2 all of them "
                f"as an array ({n}, tokens, dim)), got {output_layer!r}"
            )
        return int(output_layer)

    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        """Embed tokenised sentences: one float32 array per sentence, in input order, the sentence boundaries dropped.

        Args:
            sents: sentences, each a list of token strings (tokens longer than C − 2 characters are cut, as EFML).
            output_layer: 0 … L one layer, array (n, 2P); -1 the mean of the L + 1 layers, (n, 2P); -2 all of them,
                (L + 1, n, 2P). n = the sentence's tokens, 2P = 1024 for the released models.

        Raises:
            UsageError: a bad ``output_layer`` (one line naming the allowed values).
            InputTypeError: ``sents`` not a list of lists of strings (the message says which sentence/token).
        """
        layer = self._check_layer(output_layer)
        sents = validate_sentences(sents, empty_tokens="keep", name="sents")
        if self._stateful_bilm is None:
            arrays = list(self._embedder.embed_sentences(sents, self.batch_size))
        else:
            arrays = self._carried(sents)
        if layer == -2:
            return arrays
        if layer == -1:
            return [a.mean(axis=0, dtype=np.float32) for a in arrays]
        return [np.ascontiguousarray(a[layer]) for a in arrays]

    def _carried(self, sents: list[Sequence[str]]) -> list[np.ndarray]:
        """EFML's stateful order: sorted by length (longest first, stable), batches of ``batch_size`` in order, each
        row carrying the state of the same row of the previous batch → (L + 1, n, 2P) arrays in input order."""
        order = sorted(range(len(sents)), key=lambda i: -len(sents[i]))
        out: list[np.ndarray | None] = [None] * len(sents)
        vocab = self.bilm.char_vocab
        c = self.bilm.config.char_cnn.max_characters_per_token
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                ids = batch_to_ids([sents[i] for i in rows], c, char_vocab=vocab, empty_tokens="keep")
                layers = self._stateful_bilm(ids.to(self._embedder.device)).layers.float().cpu().numpy()
                for k, i in enumerate(rows):
                    out[i] = np.ascontiguousarray(layers[k, :, : len(sents[i])])
        return out  # type: ignore[return-value]
