"""The bidirectional language model objective: a :class:`BiLM` plus one softmax shared by both directions.

Loss and perplexity follow bilm-tf (see ``../shared/docs/original-format.md``): per direction the mean negative
log-likelihood (nats) of its targets; the training loss is ``0.5 · (NLL_fwd + NLL_bwd)``; the reported average
perplexity is ``exp(0.5 · (NLL_fwd + NLL_bwd))`` with the full softmax.

:meth:`BidirectionalLM.forward` runs one batch of either batching mode and returns plain tensors, so the model can be
wrapped in :class:`torch.nn.parallel.DistributedDataParallel` (which hooks ``forward``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from elmokit.characters import CharVocabulary, batch_to_ids
from elmokit.config import ElmoConfig
from elmokit.errors import ConfigError
from elmokit.modules.bilm import BiLM
from elmokit.modules.dropout import dropout
from elmokit.modules.lstm import LSTMState
from elmokit.modules.softmax import SoftmaxLM
from elmokit.vocabulary import Vocabulary

__all__ = ["BidirectionalLM", "DirectionalNLL"]


@dataclass
class DirectionalNLL:
    """Per-token NLL of each direction (nats, float32) for the real targets of a batch.

    Attributes:
        forward, backward: (N_f,), (N_b,) per-token NLL.
        forward_rows, backward_rows: (N_f,), (N_b,) long — the batch row of each target (for per-sentence sums).
    """

    forward: torch.Tensor
    backward: torch.Tensor
    forward_rows: torch.Tensor
    backward_rows: torch.Tensor

    def loss(self) -> torch.Tensor:
        """0.5 · (mean NLL_fwd + mean NLL_bwd), the bilm-tf objective (before its ``unroll_steps`` scale)."""
        return 0.5 * (self.forward.mean() + self.backward.mean())


class BidirectionalLM(nn.Module):
    """biLM + shared softmax over a word :class:`Vocabulary`.

    Args:
        config: biLM architecture.
        vocab: output vocabulary (frequency-sorted for sampled softmax).
        dropout: bilm-tf's dropout (0.1): on every LSTM layer's input and on the top layer before the softmax.
        char_vocab: character-vocabulary input mode (``config.char_cnn.char_vocab_size`` must equal its size).

    The token encoder and softmax are shared by the two directions; the LSTM stacks are not.

    Raises:
        ConfigError: ``config.char_cnn.char_vocab_size`` and ``char_vocab`` disagree (or one is missing).
    """

    def __init__(
        self, config: ElmoConfig, vocab: Vocabulary, *, dropout: float = 0.1, char_vocab: CharVocabulary | None = None
    ) -> None:
        super().__init__()
        if char_vocab is not None and config.char_cnn.char_vocab_size != char_vocab.vocab_size:
            raise ConfigError(
                f"config.char_cnn.char_vocab_size={config.char_cnn.char_vocab_size} but the character "
                f"vocabulary has {char_vocab.vocab_size} ids"
            )
        if char_vocab is None and config.char_cnn.char_vocab_size is not None:
            raise ConfigError(
                f"config.char_cnn.char_vocab_size={config.char_cnn.char_vocab_size}: pass the character "
                "vocabulary (char_vocab=) that its ids come from"
            )
        self.bilm = BiLM(config, dropout=dropout)
        self.bilm.char_vocab = char_vocab
        self.softmax = SoftmaxLM(config.lstm.projection_dim, len(vocab))
        self.vocab = vocab
        self.char_vocab = char_vocab
        self.dropout = dropout
        self._frozen_bilm = False

    @property
    def config(self) -> ElmoConfig:
        return self.bilm.config

    def forward(
        self,
        batch: Any,
        *,
        batching: str = "sentences",
        state: LSTMState | None = None,
        num_samples: int = 0,
        generator: torch.Generator | None = None,
        freeze_bilm: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, LSTMState | None]:
        """NLL of one training batch: ``(forward (N,), backward (N,), new LSTM state or None)``, float32 nats.

        Args:
            batch: ``batching="sentences"``: a list of token lists (see :meth:`sentence_nll`); ``"windows"``: a
                :class:`elmokit.data.corpus.StreamBatch` (see :meth:`window_nll`, which carries ``state``).
            num_samples / generator: sampled softmax negatives (0 = full softmax) and their generator.
            freeze_bilm: run the biLM without autograd (no gradient reaches it: only the softmax learns).

        Tuples of tensors, not a :class:`DirectionalNLL`, so that DistributedDataParallel finds the outputs.
        """
        self._frozen_bilm = bool(freeze_bilm)
        try:
            if batching == "windows":
                nll, new_state = self.window_nll(
                    batch.forward_inputs,
                    batch.forward_targets,
                    batch.backward_inputs,
                    batch.backward_targets,
                    state,
                    num_samples=num_samples,
                    generator=generator,
                )
                return nll.forward, nll.backward, new_state
            nll = self.sentence_nll(batch, num_samples=num_samples, generator=generator)
            return nll.forward, nll.backward, None
        finally:
            self._frozen_bilm = False

    def _bilm_context(self):
        return torch.no_grad() if self._frozen_bilm else contextlib.nullcontext()

    def char_ids(self, sentences: Sequence[Sequence[str]]) -> torch.Tensor:
        """Character ids (B, T, C) on the model's device."""
        ids = batch_to_ids(sentences, self.config.char_cnn.max_characters_per_token, char_vocab=self.char_vocab)
        return ids.to(self.softmax.weight.device)

    def word_ids(self, sentences: Sequence[Sequence[str]], length: int) -> torch.Tensor:
        """(B, length) long word ids, padded with -1."""
        out = torch.full((len(sentences), length), -1, dtype=torch.long)
        for i, s in enumerate(sentences):
            if s:
                out[i, : len(s)] = torch.tensor(self.vocab.encode(s), dtype=torch.long)
        return out.to(self.softmax.weight.device)

    def _nll(
        self, h: torch.Tensor, targets: torch.Tensor, num_samples: int, generator: torch.Generator | None
    ) -> torch.Tensor:
        if self.training and self.dropout > 0:
            h = dropout(h, self.dropout)  # elmokit.modules.dropout: a hashed mask
        if num_samples and self.training:
            return self.softmax.sampled_nll(h, targets, num_samples, generator)
        return self.softmax.full_nll(h, targets)

    # ------------------------------------------------------------------ bilm-tf stream windows
    def window_nll(
        self,
        forward_inputs: Sequence[Sequence[str]],
        forward_targets: Sequence[Sequence[str]],
        backward_inputs: Sequence[Sequence[str]],
        backward_targets: Sequence[Sequence[str]],
        state: LSTMState | None,
        *,
        num_samples: int = 0,
        generator: torch.Generator | None = None,
    ) -> tuple[DirectionalNLL, LSTMState]:
        """NLL of one step of stream windows (:class:`elmokit.data.corpus.StreamBatch`), carrying LSTM state.

        Inputs/targets are B rows of up to T tokens (rows may be shorter in final partial batches). ``state`` is the
        (c, h) from the previous step (``None`` = zeros); the returned state is detached (truncated BPTT).
        """
        lengths = torch.tensor([len(r) for r in forward_inputs], dtype=torch.long)
        t = int(lengths.max()) if len(lengths) else 0
        b = len(forward_inputs)
        ids = self.char_ids(list(forward_inputs) + list(backward_inputs))  # one encoder pass, shared by directions
        with self._bilm_context():
            tokens = self.bilm.token_encoder(ids)
            fwd_in, bwd_in = tokens[:b], tokens[b:]
            outputs, new_state = self.bilm.run_streams(fwd_in, bwd_in, lengths.to(tokens.device), state)
        fwd_top, bwd_top = outputs[-1]
        mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).to(tokens.device)
        rows = torch.arange(b, device=tokens.device).unsqueeze(1).expand(b, t)[mask]
        f_t = self.word_ids(forward_targets, t)[mask]
        b_t = self.word_ids(backward_targets, t)[mask]
        nll = DirectionalNLL(
            self._nll(fwd_top[mask], f_t, num_samples, generator),
            self._nll(bwd_top[mask], b_t, num_samples, generator),
            rows,
            rows,
        )
        return nll, (new_state[0].detach(), new_state[1].detach())

    # ------------------------------------------------------------------ independent sentences
    def sentence_nll(
        self, sentences: Sequence[Sequence[str]], *, num_samples: int = 0, generator: torch.Generator | None = None
    ) -> DirectionalNLL:
        """NLL of whole sentences, each wrapped ``<S> w1 … wn </S>`` and read from a zero state.

        Forward targets are ``w1 … wn </S>`` (from ``<S> … wn``); backward targets ``<S> w1 … wn`` (from ``w1 … </S>``
        read right to left): n + 1 targets per direction. Full softmax unless training with ``num_samples``.
        """
        ids = self.char_ids(sentences)
        with self._bilm_context():
            out = self.bilm(ids, keep_sentence_boundaries=True)
        mask = out.mask_with_boundaries  # (B, T+2)
        t2 = mask.shape[1]
        words = self.word_ids(
            [
                [self.vocab.id_to_token(self.vocab.bos_id), *s, self.vocab.id_to_token(self.vocab.eos_id)]
                for s in sentences
            ],
            t2,
        )
        target_mask = mask[:, 1:]
        b = mask.shape[0]
        rows = torch.arange(b, device=mask.device).unsqueeze(1).expand(b, t2 - 1)[target_mask]
        fwd = self._nll(out.forward_top[:, :-1][target_mask], words[:, 1:][target_mask], num_samples, generator)
        bwd = self._nll(out.backward_top[:, 1:][target_mask], words[:, :-1][target_mask], num_samples, generator)
        return DirectionalNLL(fwd, bwd, rows, rows)

    def score(self, sentences: Sequence[Sequence[str]]) -> list[tuple[float, float]]:
        """Per-sentence log-probability (nats) under each direction, full softmax, eval mode.

        Returns B pairs (log p_fwd(sentence), log p_bwd(sentence)): the sum over the n + 1 targets of
        :meth:`sentence_nll` (so ``</S>`` resp. ``<S>`` is included), negated.
        """
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                nll = self.sentence_nll(sentences)
        finally:
            self.train(was_training)
        b = len(sentences)
        f = torch.zeros(b, dtype=torch.float64).index_add_(0, nll.forward_rows.cpu(), nll.forward.double().cpu())
        k = torch.zeros(b, dtype=torch.float64).index_add_(0, nll.backward_rows.cpu(), nll.backward.double().cpu())
        return [(-float(f[i]), -float(k[i])) for i in range(b)]
