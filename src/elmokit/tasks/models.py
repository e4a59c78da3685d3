"""Downstream task models on frozen ELMo: a BiLSTM-CRF sequence tagger and a BiLSTM sentence classifier.

Both read each token as ``x_t = [v_w; c_w; ELMo_t^task]`` (Peters et al. 2018, §3.3):

* ``v_w`` — a static word vector (word2vec, random, or none), a lookup in a table built for the task's vocabulary;
* ``c_w`` — optionally a task-trained character CNN (:class:`elmokit.modules.char_cnn.CharCNN`, UTF-8 bytes from
  :func:`elmokit.batch_to_ids`), the paper's baselines' character features;
* ``ELMo_t^task = γ Σ_j softmax(s)_j h_{t,j}`` — a learned :class:`~elmokit.ScalarMix` of the frozen biLM's L+1
  layers (eq. 1), one mix per place ELMo enters: the input, and with ``elmo_at_output`` a second one concatenated to
  the BiLSTM output (``[h_t; ELMo_t]``, the paper's option). The mixes get an L2 penalty λ·Σ s² and the
  :class:`~elmokit.Elmo` module's dropout.

The models take an :class:`~elmokit.Elmo` module (never file paths). Its biLM's layers come either **live**
(``Elmo.forward`` on character ids — needed to fine-tune the biLM) or **cached**: since a frozen biLM gives each
sentence the same layers every epoch, :func:`elmokit.tasks.features.compute_layer_features` runs it once per dataset
and stores ``(L+1, D)`` float16 values per token ((L+1)·D·2 bytes: 1.5 KiB a token for elmokit-en, ≈ 300 MB for
CoNLL-2003 train); :meth:`TokenInputs.encode` takes a ``layers`` batch ``(B, L+1, T, D)`` from
:meth:`LayerFeatures.batch` instead of running the biLM. Either way the *same* ScalarMix parameters of the Elmo
module mix the layers (so a model trained on cached features predicts live and the reverse); a test checks the two
paths agree to 1e-4 (the cache's float16 rounding aside).

Shapes: B sentences, T tokens (the longest of the batch), L+1 biLM layers of D = 2P, K tags or classes. Masks are
bool, True = a real token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from elmokit.characters import batch_to_ids
from elmokit.elmo import Elmo
from elmokit.errors import InputError, UsageError, import_optional
from elmokit.modules.char_cnn import CharCNN

__all__ = ["TaskBatch", "TokenInputs", "SequenceTagger", "SentenceClassifier", "PAD", "UNK"]

PAD, UNK = "<pad>", "<unk>"
#: rows of the UTF-8 byte scheme's character table (256 bytes + 5 specials; id 0 = padding is kept outside it)
_BYTE_ROWS = 261


@dataclasses.dataclass
class TaskBatch:
    """One batch of model input, made by :meth:`TokenInputs.encode`.

    Attributes:
        mask: (B, T) bool, True = real token.
        word_ids: (B, T) long ids into the static vocabulary (0 padding), or ``None`` without static vectors.
        char_ids: (B, T, C) long UTF-8 byte ids for the task's character CNN, or ``None`` without one.
        elmo_char_ids: (B, T, C') long ids for the live biLM, or ``None`` (cached layers, or no ELMo).
        layers: (B, L+1, T, D) float32 cached biLM layers, or ``None`` (live, or no ELMo).
        targets: (B, T) long tag ids (tagger; padding 0) or (B,) long class ids (classifier), or ``None``.
    """

    mask: torch.Tensor
    word_ids: torch.Tensor | None = None
    char_ids: torch.Tensor | None = None
    elmo_char_ids: torch.Tensor | None = None
    layers: torch.Tensor | None = None
    targets: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> TaskBatch:
        """The batch with every tensor on ``device``."""
        return TaskBatch(
            **{
                f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                for f in dataclasses.fields(self)
            }
        )


class TokenInputs(nn.Module):
    """The per-token input ``x_t = [v_w; c_w; ELMo_t]`` and the optional output-side ``ELMo_t`` (see the module
    docstring).

    Args:
        vocab: the static vectors' words (``vocab[0]`` must be ``"<pad>"``; ``"<unk>"`` must be in it), or ``None``
            for no static vectors. A token is looked up exactly, then lower-cased, else ``<unk>``.
        static: (V, d) float initial vectors for ``vocab`` (row 0 is zeroed: padding), or ``None`` with no vocab.
        static_trainable: train the static vectors too (default frozen, as pretrained vectors usually are).
        char_cnn: ``{"embedding_dim", "filters" [[width, count], …], "max_characters"}`` for a task-trained
            character CNN over UTF-8 bytes, or ``None``.
        elmo: an :class:`~elmokit.Elmo` with 1 mix (input) or 2 (input, output), or ``None`` for no ELMo. Its
            ``requires_grad`` decides whether the biLM is fine-tuned (then only the live path is allowed).
        elmo_at_output: use the Elmo's second mix at the output (needs ``num_output_representations >= 2``).

    ``forward(batch)`` → ``(x (B, T, output_dim), elmo_out (B, T, D) or None)``.

    Raises:
        UsageError: a vocabulary without ``<pad>`` first or without ``<unk>``, a static table of the wrong shape,
            too few mixes for ``elmo_at_output``, a cached batch for a fine-tuned biLM, layer norm that the cached
            path cannot reproduce.
    """

    def __init__(
        self,
        vocab: Sequence[str] | None = None,
        static: torch.Tensor | None = None,
        *,
        static_trainable: bool = False,
        char_cnn: Mapping | None = None,
        elmo: Elmo | None = None,
        elmo_at_output: bool = False,
    ) -> None:
        super().__init__()
        self.vocab = list(vocab) if vocab is not None else None
        self.static: nn.Embedding | None = None
        if self.vocab is not None:
            if not self.vocab or self.vocab[0] != PAD or UNK not in self.vocab:
                raise UsageError(
                    f"the static vocabulary must start with {PAD!r} and contain {UNK!r} "
                    "(tasks.static.build_vocab makes one)"
                )
            if static is None or static.dim() != 2 or static.shape[0] != len(self.vocab):
                shape = None if static is None else tuple(static.shape)
                raise UsageError(
                    f"static vectors must be a ({len(self.vocab)}, dim) tensor for the vocabulary, got {shape}"
                )
            table = static.detach().float().clone()
            table[0] = 0.0
            self.static = nn.Embedding(len(self.vocab), table.shape[1], padding_idx=0)
            with torch.no_grad():
                self.static.weight.copy_(table)
            self.static.weight.requires_grad_(bool(static_trainable))
            self._index = {w: i for i, w in enumerate(self.vocab)}
            self._unk = self._index[UNK]
        self.char_cnn_options = dict(char_cnn) if char_cnn is not None else None
        self.char_cnn: CharCNN | None = None
        if char_cnn is not None:
            self.char_cnn = CharCNN(
                _BYTE_ROWS, int(char_cnn["embedding_dim"]), [tuple(f) for f in char_cnn["filters"]], activation="relu"
            )
        self.elmo = elmo
        self.elmo_at_output = bool(elmo_at_output)
        if elmo is not None:
            if not isinstance(elmo, Elmo):
                raise UsageError(f"elmo must be an elmokit.Elmo module, got {type(elmo).__name__}")
            needed = 2 if elmo_at_output else 1
            if len(elmo.scalar_mixes) < needed:
                raise UsageError(
                    f"elmo_at_output needs an Elmo with num_output_representations >= 2, got {len(elmo.scalar_mixes)}"
                )
        elif elmo_at_output:
            raise UsageError("elmo_at_output needs an elmo module")

    # ------------------------------------------------------------------ sizes
    @property
    def elmo_dim(self) -> int:
        """D = 2P of the biLM (0 without ELMo)."""
        return self.elmo.get_output_dim() if self.elmo is not None else 0

    @property
    def output_dim(self) -> int:
        """Width of ``x_t``: static dim + character CNN filters + D."""
        return (
            (self.static.embedding_dim if self.static is not None else 0)
            + (self.char_cnn.output_dim if self.char_cnn is not None else 0)
            + self.elmo_dim
        )

    @property
    def fine_tunes_bilm(self) -> bool:
        """Whether the biLM is trained too (``Elmo(requires_grad=True)``)."""
        return self.elmo is not None and bool(self.elmo.requires_grad)

    def train(self, mode: bool = True) -> TokenInputs:
        """As ``nn.Module.train``, but a frozen biLM stays in eval mode (no biLM dropout while it is not trained)."""
        super().train(mode)
        if self.elmo is not None and not self.fine_tunes_bilm:
            self.elmo.bilm.eval()
        return self

    # ------------------------------------------------------------------ encoding
    def word_ids(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """(B, T) long ids: exact word, else lower-cased, else ``<unk>``; 0 = padding."""
        t = max((len(s) for s in sentences), default=0)
        out = torch.zeros(len(sentences), t, dtype=torch.long)
        index, unk = self._index, self._unk
        for i, sentence in enumerate(sentences):
            out[i, : len(sentence)] = torch.tensor(
                [index.get(w, index.get(w.lower(), unk)) for w in sentence], dtype=torch.long
            )
        return out

    def encode(
        self,
        sentences: Sequence[Sequence[str]],
        *,
        static_tokens: Sequence[Sequence[str]] | None = None,
        layers: torch.Tensor | None = None,
        layer_mask: torch.Tensor | None = None,
    ) -> TaskBatch:
        """Tensors for B tokenised sentences (on the CPU; move them with :meth:`TaskBatch.to`).

        Args:
            sentences: B lists of tokens (each non-empty, no blank tokens).
            static_tokens: the strings to look up in the static table per token, if not the tokens themselves (for
                character-tagged Chinese: each character's word); same lengths as ``sentences``.
            layers, layer_mask: cached biLM layers (B, L+1, T, D) and their (B, T) mask (from
                :meth:`~elmokit.tasks.features.LayerFeatures.batch`); without them the biLM runs live.

        Raises:
            InputError: an empty sentence, a blank token, ``static_tokens`` or ``layers`` that do not fit the
                sentences (the message says which sentence).
            UsageError: cached layers for a fine-tuned biLM, or with layer norm over the boundaries (the cached
                layers have none: build the Elmo with ``layer_norm_mask="tokens"``).
        """
        lengths = [len(s) for s in sentences]
        for i, n in enumerate(lengths):
            if n == 0:
                raise InputError(f"sentence {i} of the batch is empty: task models need at least one token")
        t = max(lengths, default=0)
        mask = torch.zeros(len(sentences), t, dtype=torch.bool)
        for i, n in enumerate(lengths):
            mask[i, :n] = True
        batch = TaskBatch(mask=mask)
        if self.static is not None:
            lookup = sentences if static_tokens is None else static_tokens
            if static_tokens is not None:
                for i, (s, w) in enumerate(zip(sentences, static_tokens)):
                    if len(s) != len(w):
                        raise InputError(f"sentence {i}: {len(s)} tokens but {len(w)} static_tokens")
            batch.word_ids = self.word_ids(lookup)
        if self.char_cnn is not None:
            batch.char_ids = batch_to_ids(sentences, int(self.char_cnn_options["max_characters"]))
        if self.elmo is not None:
            if layers is not None:
                self._check_cached(layers, layer_mask, mask)
                batch.layers = layers.float()
            else:
                bilm = self.elmo.bilm
                batch.elmo_char_ids = batch_to_ids(
                    sentences, bilm.config.char_cnn.max_characters_per_token, char_vocab=bilm.char_vocab
                )
        return batch

    def _check_cached(self, layers: torch.Tensor, layer_mask: torch.Tensor | None, mask: torch.Tensor) -> None:
        if self.fine_tunes_bilm:
            raise UsageError("cached biLM layers cannot train a fine-tuned biLM (requires_grad=True): run it live")
        if any(m.do_layer_norm for m in self.elmo.scalar_mixes) and self.elmo._layer_norm_mask != "tokens":
            raise UsageError(
                "cached layers have no <S>/</S> positions, so layer norm over them differs from the live "
                "Elmo's default: build the Elmo with layer_norm_mask='tokens'"
            )
        expected = (mask.shape[0], self.elmo.bilm.num_layers, mask.shape[1], self.elmo_dim)
        if layers.dim() != 4 or tuple(layers.shape) != expected:
            raise InputError(f"cached layers must have shape (B, L+1, T, D) = {expected}, got {tuple(layers.shape)}")
        if layer_mask is not None and not torch.equal(layer_mask.bool(), mask):
            raise InputError(
                "the cached layers' mask does not match the sentences' lengths (features computed for other sentences?)"
            )

    # ------------------------------------------------------------------ forward
    def _elmo_representations(self, batch: TaskBatch) -> list[torch.Tensor]:
        elmo = self.elmo
        if batch.layers is not None:
            # the Elmo's own mixes and dropout on the cached layers (ScalarMix is per position, so mixing the
            # boundary-free layers equals mixing with boundaries and removing them; layer norm checked in encode)
            # (padding zeroed, as the live Elmo's output is)
            keep = batch.mask.unsqueeze(-1).to(batch.layers.dtype)
            return [elmo._dropout(mix(batch.layers, batch.mask) * keep) for mix in elmo.scalar_mixes]
        if batch.elmo_char_ids is None:
            raise InputError("the batch has neither cached layers nor biLM character ids (made by another model?)")
        out = elmo(batch.elmo_char_ids)
        if not torch.equal(out["mask"], batch.mask):
            raise InputError("the biLM's token mask differs from the batch mask (blank tokens?)")
        return out["elmo_representations"]

    def forward(self, batch: TaskBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``batch`` → ``x`` (B, T, :attr:`output_dim`) and the output-side ELMo (B, T, D) (``None`` unless
        ``elmo_at_output``). Padding positions hold whatever the parts give there (the models mask them)."""
        parts = []
        if self.static is not None:
            parts.append(self.static(batch.word_ids))
        if self.char_cnn is not None:
            b, t, c = batch.char_ids.shape
            parts.append(self.char_cnn(batch.char_ids.reshape(b * t, c)).reshape(b, t, -1))
        elmo_out = None
        if self.elmo is not None:
            reps = self._elmo_representations(batch)
            parts.append(reps[0])
            if self.elmo_at_output:
                elmo_out = reps[1]
        return torch.cat(parts, dim=-1), elmo_out

    def l2_penalty(self, coefficient: float) -> torch.Tensor:
        """λ · Σ_mixes Σ_j s_j² (bilm-tf's regulariser on the layer weights); 0 without ELMo."""
        if self.elmo is None or coefficient == 0:
            return torch.zeros(())
        return sum(mix.l2_penalty(coefficient) for mix in self.elmo.scalar_mixes)

    def mix_weights(self) -> list[dict]:
        """Per mix: ``{"weights": softmax(s), "s": the raw s (L+1 floats each), "gamma": γ}`` (empty without
        ELMo)."""
        if self.elmo is None:
            return []
        return [
            {
                "weights": [float(w) for w in mix.weights().detach()],
                "s": [float(v) for v in mix.scalar_vector.detach()],
                "gamma": float(mix.gamma.detach()),
            }
            for mix in self.elmo.scalar_mixes
        ]

    def task_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict without the frozen biLM's weights (they belong to the biLM's own files); all of it when
        the biLM is fine-tuned."""
        state = self.state_dict()
        if self.elmo is not None and not self.fine_tunes_bilm:
            state = {k: v for k, v in state.items() if not k.startswith("elmo._elmo_lstm.")}
        return state


def _run_lstm(lstm: nn.LSTM, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A (bi)LSTM over the real tokens only (packed by length): (B, T, in) → (B, T, 2H), zero at padding."""
    lengths = mask.sum(1).cpu()
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    return out


class _Encoder(nn.Module):
    """Shared body: inputs → dropout → BiLSTM → [h; ELMo_out] → dropout (B, T, out_dim)."""

    def __init__(self, inputs: TokenInputs, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.inputs = inputs
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            inputs.output_dim,
            hidden,
            num_layers=layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.out_dim = 2 * hidden + (inputs.elmo_dim if inputs.elmo_at_output else 0)

    def encode_tokens(self, batch: TaskBatch) -> torch.Tensor:
        x, elmo_out = self.inputs(batch)
        h = _run_lstm(self.lstm, self.dropout(x), batch.mask)
        if elmo_out is not None:
            h = torch.cat([h, elmo_out], dim=-1)
        return self.dropout(h)


class SequenceTagger(_Encoder):
    """BiLSTM-CRF tagger: ``x_t`` → dropout → BiLSTM (``layers`` × ``hidden`` per direction) → ``[h_t; ELMo_t]``
    → dropout → linear emissions (B, T, K) → linear-chain CRF (:class:`torchcrf.CRF`, batch_first).

    Args:
        inputs: the :class:`TokenInputs`.
        num_tags: K.
        hidden, layers, dropout: the BiLSTM's cells per direction, depth, and the dropout on its input and output.

    ``loss(batch)`` → scalar: the CRF negative log-likelihood averaged over the sentences (``batch.targets``
    (B, T) tag ids; padding ignored by the mask). ``decode(batch)`` → B lists of tag ids (Viterbi), one per real
    token.

    Source: Lample et al. (2016) BiLSTM-CRF; Peters et al. (2018) §3.3 and the NER model of §4 (a simpler one: one
    BiLSTM layer, no GloVe).
    """

    def __init__(
        self, inputs: TokenInputs, num_tags: int, *, hidden: int = 128, layers: int = 1, dropout: float = 0.5
    ) -> None:
        super().__init__(inputs, hidden, layers, dropout)
        CRF = import_optional("torchcrf", "tasks", "the CRF tagger").CRF  # optional: pytorch-crf

        if num_tags < 1:
            raise UsageError(f"num_tags must be >= 1, got {num_tags}")
        self.num_tags = num_tags
        self.emission = nn.Linear(self.out_dim, num_tags)
        self.crf = CRF(num_tags, batch_first=True)

    def emissions(self, batch: TaskBatch) -> torch.Tensor:
        """(B, T, K) emission scores."""
        return self.emission(self.encode_tokens(batch))

    def loss(self, batch: TaskBatch) -> torch.Tensor:
        """Mean CRF negative log-likelihood per sentence. Raises :class:`InputError` without targets."""
        if batch.targets is None:
            raise InputError("loss needs batch.targets (B, T) tag ids")
        return -self.crf(self.emissions(batch), batch.targets, mask=batch.mask, reduction="mean")

    @torch.no_grad()
    def decode(self, batch: TaskBatch) -> list[list[int]]:
        """Viterbi tag ids per sentence (lists of each sentence's length)."""
        return self.crf.decode(self.emissions(batch), mask=batch.mask)


class SentenceClassifier(_Encoder):
    """BiLSTM sentence classifier: ``x_t`` → dropout → BiLSTM → ``[h_t; ELMo_t]`` → pooling over the real tokens
    → dropout → linear logits (B, K).

    Args:
        inputs: the :class:`TokenInputs`.
        num_classes: K.
        hidden, layers, dropout: as :class:`SequenceTagger`.
        pooling: ``"max"`` (element-wise max over the real tokens) or ``"attention"`` (a learned query:
            ``a_t = softmax_t(u · tanh(W h_t))`` over the real tokens, output ``Σ_t a_t h_t``).

    ``loss(batch)`` → mean cross-entropy (``batch.targets`` (B,) class ids); ``logits(batch)`` (B, K);
    ``decode(batch)`` → B class ids.

    Source: a simplification of the paper's BCN for SST (McCann et al. 2017), as in the ELMo paper's §4 sentiment
    task: BiLSTM + pooling.
    """

    def __init__(
        self,
        inputs: TokenInputs,
        num_classes: int,
        *,
        hidden: int = 128,
        layers: int = 1,
        dropout: float = 0.5,
        pooling: str = "max",
    ) -> None:
        super().__init__(inputs, hidden, layers, dropout)
        if pooling not in ("max", "attention"):
            raise UsageError(f"pooling must be 'max' or 'attention', got {pooling!r}")
        if num_classes < 1:
            raise UsageError(f"num_classes must be >= 1, got {num_classes}")
        self.pooling = pooling
        self.num_classes = num_classes
        if pooling == "attention":
            self.attention = nn.Sequential(
                nn.Linear(self.out_dim, self.out_dim), nn.Tanh(), nn.Linear(self.out_dim, 1, bias=False)
            )
        self.output = nn.Linear(self.out_dim, num_classes)

    def pooled(self, batch: TaskBatch) -> torch.Tensor:
        """(B, out_dim) sentence vectors."""
        h = self.encode_tokens(batch)
        mask = batch.mask.unsqueeze(-1)
        if self.pooling == "max":
            return h.masked_fill(~mask, float("-inf")).amax(dim=1)
        scores = self.attention(h).masked_fill(~mask, float("-inf"))
        return (torch.softmax(scores, dim=1) * h).sum(dim=1)

    def logits(self, batch: TaskBatch) -> torch.Tensor:
        """(B, K) class scores."""
        return self.output(self.pooled(batch))

    def loss(self, batch: TaskBatch) -> torch.Tensor:
        """Mean cross-entropy. Raises :class:`InputError` without targets."""
        if batch.targets is None:
            raise InputError("loss needs batch.targets (B,) class ids")
        return F.cross_entropy(self.logits(batch), batch.targets)

    @torch.no_grad()
    def decode(self, batch: TaskBatch) -> list[int]:
        """The arg-max class id per sentence."""
        return self.logits(batch).argmax(dim=-1).tolist()
