"""The bidirectional language model body: token encoder + forward/backward LSTM stacks → L+1 layer representations."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..characters import boundary_char_ids
from ..config import ElmoConfig
from ..errors import InputError
from .lstm import BiLSTM, LSTMState
from .token_encoder import TokenEncoder

__all__ = ["BiLM", "BiLMOutput", "add_sentence_boundaries", "remove_sentence_boundaries", "reverse_padded"]


@dataclass
class BiLMOutput:
    """What :meth:`BiLM.forward` returns.

    Attributes:
        layers: (B, L+1, T, 2P) float — layer 0 = [token vector; token vector], layer k = [forward_k; backward_k].
            Zero at padding.
        mask: (B, T) bool, True = real token.
        token_vectors: (B, T', P) layer-0 token vectors *with* boundaries (T' = T, or T + 2 when boundaries were
            stripped from ``layers``).
        forward_top / backward_top: (B, T', P) top-layer outputs of each direction, with boundaries, in sentence
            order (what an LM head consumes).
        mask_with_boundaries: (B, T') bool.
    """

    layers: torch.Tensor
    mask: torch.Tensor
    token_vectors: torch.Tensor
    forward_top: torch.Tensor
    backward_top: torch.Tensor
    mask_with_boundaries: torch.Tensor


def add_sentence_boundaries(char_ids: torch.Tensor, bos: list[int], eos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrap every row in ``<S> … </S>``.

    Args:
        char_ids: (B, T, C) long, 0 = padding; a row's real tokens come first.
        bos, eos: the C ids of the ``<S>`` / ``</S>`` rows.
    Returns:
        (B, T + 2, C) ids and the new (B, T + 2) bool mask. An empty sentence becomes ``<S> </S>``.
    Source: AllenNLP ``add_sentence_boundary_token_ids``.
    """
    b, t, c = char_ids.shape
    mask = char_ids[:, :, 0] > 0
    lengths = mask.sum(1)
    out = char_ids.new_zeros((b, t + 2, c))
    out[:, 1 : t + 1] = char_ids
    out[:, 0] = torch.tensor(bos, dtype=char_ids.dtype, device=char_ids.device)
    rows = torch.arange(b, device=char_ids.device)
    out[rows, lengths + 1] = torch.tensor(eos, dtype=char_ids.dtype, device=char_ids.device)
    new_mask = torch.arange(t + 2, device=char_ids.device).unsqueeze(0) < (lengths + 2).unsqueeze(1)
    return out, new_mask


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the first and last real position of each row.

    Args:
        tensor: (B, ..., T, D) with time on dim -2; mask: (B, T) bool including the boundaries.
    Returns:
        (B, ..., T - 2, D) with zeros at padding, and the (B, T - 2) mask. Source: AllenNLP ``remove_sentence_boundaries``.
    """
    lengths = mask.sum(1)
    t = mask.shape[1]
    new_mask = torch.arange(t - 2, device=mask.device).unsqueeze(0) < (lengths - 2).clamp(min=0).unsqueeze(1)
    out = tensor[..., 1 : t - 1, :]
    shape = [mask.shape[0]] + [1] * (tensor.dim() - 3) + [t - 2, 1]
    out = out * new_mask.view(shape).to(out.dtype)
    return out, new_mask


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor, time_dim: int = 1) -> torch.Tensor:
    """Reverse each row within its own length along ``time_dim`` (padding stays in place). An involution.

    ``x`` has batch on dim 0; ``lengths`` (B,) long.
    """
    t = x.shape[time_dim]
    steps = torch.arange(t, device=x.device).unsqueeze(0)  # (1, T)
    lengths = lengths.to(x.device).unsqueeze(1)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, T)
    shape = [1] * x.dim()
    shape[0], shape[time_dim] = x.shape[0], t
    index = index.view(shape).expand_as(x)
    return x.gather(time_dim, index)


class BiLM(nn.Module):
    """ELMo's biLM without the softmax: characters → token encoder → forward and backward LSTM stacks.

    Args:
        config: architecture (validated here).
        stateful: carry each batch row's LSTM state into the next call, as the original AllenNLP/bilm-tf inference
            code does (needed to reproduce their reference outputs). Off by default: then a sentence's vectors do
            not depend on its batch, padding or earlier calls. See :meth:`reset_states`.
        dropout: dropout on each LSTM layer's input while training (bilm-tf's DropoutWrapper), 0 at inference.

    ``forward(char_ids (B, T, C))`` → :class:`BiLMOutput`. Raises :class:`InputError` for a wrong shape, a C that is
    not ``max_characters_per_token``, or ids outside the character table.

    In the character-vocabulary mode, make the ids with ``batch_to_ids(..., char_vocab=bilm.char_vocab)``.
    """

    def __init__(self, config: ElmoConfig, *, stateful: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.token_encoder = TokenEncoder(config.char_cnn, config.lstm.projection_dim)
        self.bilstm = BiLSTM(config.lstm, dropout=dropout)
        bos, eos = boundary_char_ids(config.char_cnn.max_characters_per_token, config.char_cnn.char_vocab_size)
        self._bos, self._eos = bos, eos
        self.stateful = stateful
        self._state: LSTMState | None = None
        #: the character vocabulary of a model trained in the character-vocabulary mode (``config.char_cnn.char_vocab_size``
        #: set); attached by the loaders from ``chars.txt``. ``None`` for the UTF-8 byte scheme.
        self.char_vocab = None

    @property
    def num_layers(self) -> int:
        """L + 1."""
        return self.config.lstm.n_layers + 1

    @property
    def output_dim(self) -> int:
        """2P."""
        return 2 * self.config.lstm.projection_dim

    def reset_states(self) -> None:
        """Forget the carried LSTM state (stateful mode): the next batch starts from zeros."""
        self._state = None

    def check_char_ids(self, char_ids: torch.Tensor) -> None:
        """Validate a (B, T, C) id tensor; raise :class:`InputError` naming the problem (type, shape, dtype, ids out of
        the character table, or ids of the other character scheme: bytes vs. a character vocabulary)."""
        if not isinstance(char_ids, torch.Tensor):
            raise InputError(f"char_ids must be a LongTensor (B, T, C) from batch_to_ids, got {type(char_ids).__name__}")
        c = self.config.char_cnn.max_characters_per_token
        if char_ids.dim() != 3 or char_ids.shape[-1] != c:
            raise InputError(f"char_ids must have shape (B, T, {c}), got {tuple(char_ids.shape)}")
        if char_ids.dtype not in (torch.long, torch.int32, torch.int64, torch.int16, torch.uint8):
            raise InputError(f"char_ids must be integer ids, got dtype {char_ids.dtype}")
        if char_ids.numel():
            scheme = ("batch_to_ids(sentences, char_vocab=model.char_vocab)" if self.config.char_cnn.char_vocab_size
                      else "batch_to_ids(sentences) (UTF-8 bytes, no char_vocab)")
            lo, hi = int(char_ids.min()), int(char_ids.max())
            n = self.config.char_cnn.n_char_rows + 1
            if lo < 0 or hi >= n:
                raise InputError(f"char_ids contain {lo if lo < 0 else hi}, outside the character table [0, {n}); "
                                 f"this model's ids come from {scheme}")
            # every token's ids start with this model's beginning-of-word id: catches byte ids given to a
            # character-vocabulary model (and the reverse), which would otherwise run and give wrong vectors
            first = char_ids[..., 0]
            bow = self._bos[0]
            if bool(((first != 0) & (first != bow)).any()):
                raise InputError(f"char_ids do not start each token with this model's beginning-of-word id {bow}: "
                                 f"they were made for another character scheme; use {scheme}")

    def forward(self, char_ids: torch.Tensor, *, keep_sentence_boundaries: bool = False,
                add_boundaries: bool = True) -> BiLMOutput:
        """Compute all L+1 layer representations.

        Args:
            char_ids: (B, T, C) long from :func:`elmokit.batch_to_ids` (0 = padding).
            keep_sentence_boundaries: keep the ``<S>``/``</S>`` positions in ``layers`` and ``mask``.
            add_boundaries: wrap rows in ``<S> … </S>`` (default). ``False`` runs on ``char_ids`` as given (it must
                already contain boundaries if wanted, e.g. in LM training windows).
        """
        self.check_char_ids(char_ids)
        char_ids = char_ids.long()
        b = char_ids.shape[0]
        if add_boundaries:
            ids, mask = add_sentence_boundaries(char_ids, self._bos, self._eos)
        else:
            ids, mask = char_ids, char_ids[:, :, 0] > 0
        tokens = self.token_encoder(ids)  # (B, T', P)
        lengths = mask.sum(1)
        initial = self._initial_state(b, tokens) if self.stateful else None
        layer_outputs, final_state = self.run_lstm(tokens, lengths, initial)
        if self.stateful:
            self._store_state(final_state, b)
        m = mask.unsqueeze(-1).to(tokens.dtype)
        layers = [torch.cat([tokens, tokens], dim=-1) * m]
        layers.extend(torch.cat([fwd, bwd], dim=-1) for fwd, bwd in layer_outputs)
        stacked = torch.stack(layers, dim=1)  # (B, L+1, T', 2P)
        fwd_top, bwd_top = layer_outputs[-1]
        if add_boundaries and not keep_sentence_boundaries:
            out_layers, out_mask = remove_sentence_boundaries(stacked, mask)
        else:
            out_layers, out_mask = stacked, mask
        return BiLMOutput(out_layers, out_mask, tokens, fwd_top, bwd_top, mask)

    def run_lstm(self, tokens: torch.Tensor, lengths: torch.Tensor, initial_state: LSTMState | None = None,
                 ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], LSTMState]:
        """Run both directions over left-aligned token vectors (B, T, P) in sentence order.

        The backward stack sees each row reversed within its length. Returns per layer (forward (B, T, P),
        backward (B, T, P)) in sentence order, and the final (c, h) state (backward: the state after consuming the
        first token, i.e. ``<S>``).
        """
        backward_in = reverse_padded(tokens, lengths)
        outputs, state = self.run_streams(tokens, backward_in, lengths, initial_state)
        return [(fwd, reverse_padded(bwd, lengths)) for fwd, bwd in outputs], state

    def run_streams(self, forward_in: torch.Tensor, backward_in: torch.Tensor, lengths: torch.Tensor,
                    initial_state: LSTMState | None = None,
                    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], LSTMState]:
        """Run the forward stack on ``forward_in`` and the backward stack on ``backward_in``, each (B, T, P) already
        in its own reading order and left-aligned (as bilm-tf's training windows, whose backward LM reads a reversed
        stream). Rows are sorted by length internally. Returns per layer (forward, backward) outputs (B, T, P) in the
        inputs' order, and the final (c, h) state in the original row order.
        """
        b = forward_in.shape[0]
        order = torch.argsort(lengths.cpu(), descending=True, stable=True).to(forward_in.device)
        identity = bool((order == torch.arange(b, device=order.device)).all())
        if identity:
            inputs = torch.stack([forward_in, backward_in], dim=0)
            sorted_lengths = lengths
        else:
            inputs = torch.stack([forward_in.index_select(0, order), backward_in.index_select(0, order)], dim=0)
            sorted_lengths = lengths.index_select(0, order)
            if initial_state is not None:
                initial_state = (initial_state[0].index_select(2, order), initial_state[1].index_select(2, order))
        outputs, (c, h) = self.bilstm(inputs, sorted_lengths, initial_state)
        if identity:
            return [(out[0], out[1]) for out in outputs], (c, h)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(b, device=order.device)
        result = [(out[0].index_select(0, inverse), out[1].index_select(0, inverse)) for out in outputs]
        return result, (c.index_select(2, inverse), h.index_select(2, inverse))

    # ------------------------------------------------------------------ stateful mode
    def _initial_state(self, batch_size: int, like: torch.Tensor) -> LSTMState:
        if self._state is None:
            self._state = self.bilstm.zero_state(batch_size, like.device, like.dtype)
        c, h = self._state
        if c.shape[2] < batch_size:  # grow: new rows start from zeros
            zc, zh = self.bilstm.zero_state(batch_size - c.shape[2], like.device, like.dtype)
            c, h = torch.cat([c, zc], 2), torch.cat([h, zh], 2)
            self._state = (c, h)
        return c[:, :, :batch_size], h[:, :, :batch_size]

    def _store_state(self, final_state: LSTMState, batch_size: int) -> None:
        c, h = self._state
        c, h = c.clone(), h.clone()
        c[:, :, :batch_size] = final_state[0].detach()
        h[:, :, :batch_size] = final_state[1].detach()
        self._state = (c, h)  # rows outside this batch keep theirs
