"""The context-independent token encoder (ELMo layer 0): char CNN → highway → linear projection (ELMoForManyLangs
models: a learned word embedding concatenated before the highway output, then the projection)."""

from __future__ import annotations

import torch
from torch import nn

from elmokit.config import CharCNNConfig
from elmokit.errors import InputError
from elmokit.modules import invariant
from elmokit.modules.char_cnn import CharCNN
from elmokit.modules.derived import DerivedWeights
from elmokit.modules.highway import Highway
from elmokit.modules.precision import gemm_rows, low_precision_dtype
from elmokit.modules.unique_rows import unique_rows

__all__ = ["TokenEncoder"]


class TokenEncoder(nn.Module):
    """Character ids of tokens → token vectors.

    Args:
        config: the ``char_cnn`` section.
        projection_dim: P, the LSTM input size.

    ``forward(char_ids: LongTensor (B, T, C)) -> FloatTensor (B, T, P)``. Positions whose ids are all 0 (padding)
    get a zero vector; every other position is encoded (AllenNLP's rule: a token is real when any id is non-zero).
    The CNN runs once per **distinct** token of the batch (not on every padded slot), which is where most of the
    original's time went; results are identical to running it on every position. Without autograd, more than
    :attr:`inference_chunk` distinct tokens are encoded in chunks (memory stays bounded on a very long input).

    Source: bilm-tf ``_build_word_char_embeddings`` (conv → max → activation → highway → projection with bias).

    **Word embedding** (``config.word_embedding_dim`` set: ELMoForManyLangs models, :mod:`elmokit.weights.efml`): the
    ids are (B, T, C + 1), the last column a word id in [0, ``n_words``); the token vector is
    ``projection([word_embedding[word id]; highway(cnn(char ids))])`` (word part first), the projection's input then
    ``word_embedding_dim + F`` wide. Source: ELMoForManyLangs ``ConvTokenEmbedder.forward``.
    """

    #: without autograd, more distinct tokens than this are encoded in chunks of this many (bounded memory for very
    #: long inputs: the small configuration's highway holds ≈ 24 KB of activations a token); batches below it run as
    #: one piece, exactly as before
    inference_chunk = 4096

    def __init__(self, config: CharCNNConfig, projection_dim: int) -> None:
        super().__init__()
        self.config = config
        self.char_cnn = CharCNN(config.n_char_rows, config.embedding_dim, config.filters, config.activation)
        self.highway = Highway(self.char_cnn.output_dim, config.n_highway)
        #: (n_words, word_embedding_dim) learned word rows, or ``None`` (every model but ELMoForManyLangs')
        self.word_embedding = (
            nn.Embedding(config.n_words, config.word_embedding_dim) if config.word_embedding_dim is not None else None
        )
        words = config.word_embedding_dim or 0
        self.projection = nn.Linear(words + self.char_cnn.output_dim, projection_dim)
        self.output_dim = projection_dim
        self._derived = DerivedWeights()

    def encode_unique(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Encode N tokens given as (N, C) ids — (N, C + 1) with the word id last when the model has a word
        embedding — (no de-duplication, no masking) → (N, P)."""
        if self.word_embedding is None:
            return self._project(self.highway(self.char_cnn(char_ids)))
        chars = self.highway(self.char_cnn(char_ids[:, :-1]))
        return self._project(torch.cat([self.word_embedding(char_ids[:, -1]), chars], dim=-1))

    def _encode_unique_padded(self, unique: torch.Tensor) -> torch.Tensor:
        """:meth:`encode_unique` of (U, C) ids → (U, P). In training under bf16 autocast on the CPU the encoder runs
        on :func:`~elmokit.modules.precision.gemm_rows` (U) rows, the first token repeated past U and its copies'
        vectors dropped (no gradient reaches them): the char CNN's and highway's products then come in a few row
        counts, whose oneDNN kernels are compiled once, rather than in new ones every batch (issue 40)."""
        n = unique.shape[0]
        low = low_precision_dtype(unique.device.type) if torch.is_grad_enabled() else None
        rows = gemm_rows(n, low, unique.device.type) if low is not None else n
        if rows == n:
            return self.encode_unique(unique)
        return self.encode_unique(torch.cat([unique, unique[:1].expand(rows - n, -1)]))[:n]

    def _project(self, z: torch.Tensor) -> torch.Tensor:
        """The projection (N, F) → (N, P): by the batch-invariant kernel where it runs
        (:mod:`elmokit.modules.invariant`; weights packed once, cached), else ``nn.Linear``."""
        weight, bias = self.projection.weight, self.projection.bias
        module = invariant.kernels_for(z, weight, bias) if z.dim() == 2 else None
        if module is not None:
            packed = self._derived.get("invariant", (weight, bias), lambda: invariant.pack_linear(weight.t(), bias))
            y = invariant.linear(module, z, packed, self.output_dim)
            if y is not None:
                return y
        return self.projection(z)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        if char_ids.dim() != 3:
            raise InputError(f"char_ids must be (B, T, C), got shape {tuple(char_ids.shape)}")
        b, t, c = char_ids.shape
        flat = char_ids.reshape(b * t, c)
        real = (flat != 0).any(dim=1)  # padding rows are all zero
        out = flat.new_zeros((b * t, self.output_dim), dtype=self.projection.weight.dtype)
        if not bool(real.any()):
            return out.view(b, t, self.output_dim)
        tokens = flat[real]
        unique, inverse = unique_rows(tokens)
        if unique.shape[0] > self.inference_chunk and not torch.is_grad_enabled():
            # a very long input (e.g. one 10,000-token sentence): bound the highway/projection activations
            encoded = torch.cat([self.encode_unique(part) for part in unique.split(self.inference_chunk)], dim=0)
        else:
            encoded = self._encode_unique_padded(unique)
        # float32 out even under bf16 autocast (the projection's product is then bfloat16): the LSTMs take float32
        out = out.index_put((real.nonzero().squeeze(1),), encoded[inverse].to(out.dtype))
        return out.view(b, t, self.output_dim)
