"""The bidirectional language model body: token encoder + forward/backward LSTM stacks → L+1 layer representations.

The padded-batch helpers it uses (:func:`token_mask`, the sentence boundaries, :func:`reverse_padded`) live in
:mod:`elmokit.modules.padding` and are re-exported here."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from elmokit.characters import ByteCharacterMapper, CharVocabulary, boundary_char_ids
from elmokit.config import ElmoConfig
from elmokit.errors import InputError, InputTypeError, UsageError
from elmokit.modules import invariant
from elmokit.modules.derived import DerivedWeights
from elmokit.modules.lstm import BiLSTM, LSTMState
from elmokit.modules.padding import (
    add_sentence_boundaries,
    check_left_aligned,
    remove_sentence_boundaries,
    reverse_padded,
    token_mask,
)
from elmokit.modules.token_encoder import TokenEncoder

__all__ = [
    "BiLM",
    "BiLMOutput",
    "StatefulBiLM",
    "add_sentence_boundaries",
    "remove_sentence_boundaries",
    "reverse_padded",
    "token_mask",
]


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
        state: the LSTM state (c, h) reached at each row's last position — c (2, L, B, H), h (2, L, B, P), index 0 =
            forward stack, 1 = backward stack (which has then read the row back to its ``<S>``) — to pass as
            ``state=`` to the next call for carried-state inference. Detached from the graph when autograd is off.
    """

    layers: torch.Tensor
    mask: torch.Tensor
    token_vectors: torch.Tensor
    forward_top: torch.Tensor
    backward_top: torch.Tensor
    mask_with_boundaries: torch.Tensor
    state: LSTMState | None = None


class BiLM(nn.Module):
    """ELMo's biLM without the softmax: characters → token encoder → forward and backward LSTM stacks.

    Args:
        config: architecture (validated here).
        dropout: dropout on each LSTM layer's input while training (bilm-tf's DropoutWrapper), 0 at inference.

    The module keeps no state between calls: each call starts from ``state`` (by default the model's fixed *start
    state*: zeros, unless one is stored with the model, see :meth:`set_start_state`), so a sentence's vectors do not
    depend on its batch, padding or earlier calls, and one model may serve many threads at once. The state a call
    reaches is returned in :attr:`BiLMOutput.state`; :class:`StatefulBiLM` carries it from call to call as the
    original AllenNLP/bilm-tf inference code does (needed to reproduce their reference outputs).

    Start state: every original-format model, released model and model trained on whole sentences starts from zeros
    (:attr:`start_state` is ``None``). A model trained here on stream windows with carried state
    (``batching="windows"``) never saw a zero state in training; its trainer stores one fixed start state with it (the
    mean state at sentence starts over its training text, see :func:`elmokit.pretraining.start_state.mean_start_state`),
    which it then reads every sentence from. The start state is a non-persistent buffer: it follows ``.to(device)``
    but is not in :meth:`state_dict`, so the tensor names of every format are unchanged; the native format stores it
    beside the weights (``start_state.c`` / ``start_state.h``).

    ``forward(char_ids (B, T, C), state=None)`` → :class:`BiLMOutput`. Raises :class:`InputTypeError` (also a
    ``TypeError``) for char ids that are not an integer tensor, :class:`InputError` for a wrong shape, a C that is not
    ``max_characters_per_token``, ids outside the character table, padding before a row's real tokens, or ids that
    are all of the other character scheme. A position is a real token when any of its C ids is non-zero (AllenNLP's
    rule), so hand-made id rows work as long as real tokens come first in each row.

    In the character-vocabulary mode, make the ids with ``batch_to_ids(..., char_vocab=bilm.char_vocab)``.
    """

    def __init__(self, config: ElmoConfig, *, dropout: float = 0.0) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.token_encoder = TokenEncoder(config.char_cnn, config.lstm.projection_dim)
        self.bilstm = BiLSTM(config.lstm, dropout=dropout)
        if config.char_cnn.word_embedding_dim is None:
            bos, eos = boundary_char_ids(config.char_cnn.max_characters_per_token, config.char_cnn.char_vocab_size)
            self._bos, self._eos = bos, eos
        else:  # ELMoForManyLangs: the boundary rows come from its vocabulary (char_vocab, attached by the loader)
            self._bos = self._eos = None
        # the fixed start state (c (2, L, 1, H), h (2, L, 1, P)) or None = zeros; see set_start_state
        self.register_buffer("start_c", None, persistent=False)
        self.register_buffer("start_h", None, persistent=False)
        #: how the stored start state was made (recorded in the native file's metadata), ``None`` without one
        self.start_state_source: str | None = None
        #: the character vocabulary (``config.char_cnn.char_vocab_size`` set), attached by the loaders from
        #: ``chars.txt`` (ELMoForManyLangs: ``char.dic`` + ``word.dic``); ``None`` for the UTF-8 byte scheme.
        self._derived = DerivedWeights()  # inference-time copies (the boundary token vectors)
        self.char_vocab = None

    @property
    def char_vocab(self):
        """The :class:`~elmokit.characters.CharVocabulary` of a character-vocabulary model, else ``None``. One that
        defines its boundary rows (``defines_boundaries``: ELMoForManyLangs') sets the model's when attached."""
        return self._char_vocab

    @char_vocab.setter
    def char_vocab(self, vocab) -> None:
        self._char_vocab = vocab
        if vocab is not None and getattr(vocab, "defines_boundaries", False):
            self._bos, self._eos = vocab.boundary_ids()
            self._derived.clear()  # the cached boundary vectors belong to the old rows

    def clear_derived_weights(self) -> None:
        """Drop every inference-time weight copy of this model (:class:`~elmokit.modules.derived.DerivedWeights`:
        the highway's fused matrix, the LSTMs' reordered weights, the char CNN's all-widths matrix, the boundary
        vectors); they are remade on the next call. Copies follow every in-place change that bumps a tensor's
        version counter (``load_state_dict``, optimiser steps, ``with torch.no_grad(): w.mul_(…)``), but not writes
        through ``w.data`` (``w.data.copy_(…)``), which PyTorch does not count: call this after such writes. A switch
        between training and evaluation mode (:meth:`train` / :meth:`eval`) calls it too."""
        for module in self.modules():
            derived = getattr(module, "_derived", None)
            if isinstance(derived, DerivedWeights):
                derived.clear()

    def train(self, mode: bool = True) -> BiLM:
        """As :meth:`torch.nn.Module.train`; a change of mode also drops the inference-time weight copies
        (:meth:`clear_derived_weights`), so evaluating after training never reads stale copies (calling ``eval()`` on a
        model already in eval mode, e.g. before every batch, keeps them)."""
        changed = self.training != mode
        super().train(mode)
        if changed:
            self.clear_derived_weights()
        return self

    _elmo_lstm = property(lambda self: self, doc="Itself: AllenNLP code's elmo._elmo_lstm._elmo_lstm.reset_states()")

    def reset_states(self) -> None:
        """Nothing to forget: a :class:`BiLM` keeps no state between calls (:class:`StatefulBiLM` does)."""

    @property
    def num_layers(self) -> int:
        """L + 1."""
        return self.config.lstm.n_layers + 1

    @property
    def output_dim(self) -> int:
        """2P."""
        return 2 * self.config.lstm.projection_dim

    @property
    def stateful(self) -> bool:
        """Always ``False``: a :class:`BiLM` keeps no state (wrap it in :class:`StatefulBiLM` to carry it)."""
        return False

    def zero_state(self, batch_size: int) -> LSTMState:
        """All-zero (c, h) for ``batch_size`` rows: c (2, L, B, H), h (2, L, B, P) on the model's device and dtype."""
        return self.bilstm.zero_state(batch_size)

    @property
    def start_state(self) -> LSTMState | None:
        """The stored start state (c (2, L, 1, H), h (2, L, 1, P)) every call starts from when given no ``state``, or
        ``None`` (zeros: every original-format and sentence-trained model)."""
        if self.start_c is None:
            return None
        return self.start_c, self.start_h

    def set_start_state(self, state: LSTMState | None, source: str | None = None) -> None:
        """Store (or, with ``None``, remove) the fixed start state that calls without ``state`` start from.

        Args:
            state: (c, h), c (2, L, 1, H) and h (2, L, 1, P) floats (index 0 of dim 0 = forward stack), finite; an
                all-zero state is stored as ``None`` (the same behaviour, and a file the original format can hold).
            source: a short description of how it was made (kept in :attr:`start_state_source` and the native
                file's metadata).

        Raises:
            InputError: wrong shapes, not float tensors, or non-finite values.
        """
        if state is None:
            self.start_c = self.start_h = None
            self.start_state_source = None
            return
        self.check_state(state, 1)
        c, h = (
            t.detach().to(device=self.bilstm.bias[0].device, dtype=self.bilstm.bias[0].dtype).clone() for t in state
        )
        if not (bool(torch.isfinite(c).all()) and bool(torch.isfinite(h).all())):
            raise InputError("start state must be finite: it holds NaN or infinite values")
        if not (bool(c.any()) or bool(h.any())):
            self.set_start_state(None)
            return
        self.start_c, self.start_h = c, h
        self.start_state_source = source

    def initial_state(self, batch_size: int) -> LSTMState:
        """The state a call without ``state`` starts each of ``batch_size`` rows from: the stored start state repeated
        (:attr:`start_state`), else zeros. c (2, L, B, H), h (2, L, B, P) on the model's device and dtype."""
        if self.start_c is None:
            return self.zero_state(batch_size)
        return (
            self.start_c.expand(-1, -1, batch_size, -1).contiguous(),
            self.start_h.expand(-1, -1, batch_size, -1).contiguous(),
        )

    def check_char_ids(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Validate a (B, T, C) id tensor and return its (B, T) token mask (see :func:`token_mask`).

        Raises:
            InputTypeError: (also a ``TypeError``) not a tensor, or not an integer dtype.
            InputError: naming the problem — wrong shape, ids outside the character table,
                padding (an all-zero position) before a row's last real token, or ids that are all of the other
                character scheme (UTF-8 bytes given to a character-vocabulary model, or the reverse).
        """
        if not isinstance(char_ids, torch.Tensor):
            raise InputTypeError(
                f"char_ids must be a LongTensor (B, T, C) from batch_to_ids, got {type(char_ids).__name__}"
            )
        cc = self.config.char_cnn
        c, words = cc.id_width, cc.word_embedding_dim is not None
        byte_scheme = cc.char_vocab_size is None
        scheme = (
            f"batch_to_ids(sentences{'' if c == 50 else f', {c}'}) (UTF-8 bytes, no char_vocab)"
            if byte_scheme
            else "batch_to_ids(sentences, char_vocab=elmo.bilm.char_vocab) (for a BiLM: bilm.char_vocab; this "
            "ELMoForManyLangs model reads its word and character ids)"
            if words
            else f"batch_to_ids(sentences, {c}, char_vocab=elmo.bilm.char_vocab) (for a BiLM: bilm.char_vocab; "
            "this model reads a character vocabulary)"
        )
        if char_ids.dim() != 3 or char_ids.shape[-1] != c:
            raise InputError(
                f"char_ids must have shape (B, T, {c}), got {tuple(char_ids.shape)}; this model's ids "
                f"come from {scheme}"
            )
        if char_ids.dtype not in (torch.long, torch.int32, torch.int64, torch.int16, torch.uint8):
            raise InputTypeError(
                f"char_ids must be integer ids (a LongTensor from batch_to_ids), got dtype {char_ids.dtype}"
            )
        mask = token_mask(char_ids)
        if char_ids.numel():
            chars = char_ids[..., : cc.max_characters_per_token]
            lo, hi = int(chars.min()), int(chars.max())
            n = cc.n_char_rows + 1
            if lo < 0 or hi >= n:
                raise InputError(
                    f"char_ids contain {lo if lo < 0 else hi}, outside the character table [0, {n}); "
                    f"this model's ids come from {scheme}"
                )
            check_left_aligned(mask, "char_ids")
            if words:
                lo, hi = int(char_ids[..., -1].min()), int(char_ids[..., -1].max())
                if lo < 0 or hi >= cc.n_words:
                    raise InputError(
                        f"char_ids hold word id {lo if lo < 0 else hi} in their last column, outside the word table "
                        f"[0, {cc.n_words}); this model's ids come from {scheme}"
                    )
                if self._bos is None:
                    raise UsageError(
                        "this ELMoForManyLangs model has no vocabulary attached (bilm.char_vocab is None): load it "
                        "with load_pretrained_bilm / load_efml, which read char.dic and word.dic"
                    )
                return mask  # (the other-scheme check below is about the two fixed-id schemes)
            # ids made for the other scheme run and give wrong vectors: refuse them when every real token has the
            # other scheme's begin-of-word first and its end-of-word or in-word pad last (hand-made ids pass)
            other = CharVocabulary if byte_scheme else ByteCharacterMapper
            real = char_ids[mask]
            if real.shape[0] and other.bow_char != self._bos[0]:
                first, last = real[:, 0], real[:, -1]
                if bool(((first == other.bow_char) & ((last == other.pad_char) | (last == other.eow_char))).all()):
                    raise InputError(
                        f"char_ids were made for the other character scheme (every token starts with "
                        f"its begin-of-word id {other.bow_char}); this model's ids come from {scheme}"
                    )
        return mask

    def forward(
        self,
        char_ids: torch.Tensor,
        state: LSTMState | None = None,
        *,
        keep_sentence_boundaries: bool = False,
        add_boundaries: bool = True,
        boundary_steps: bool = True,
    ) -> BiLMOutput:
        """Compute all L+1 layer representations.

        Args:
            char_ids: (B, T, C) long from :func:`elmokit.batch_to_ids` (0 = padding).
            state: the LSTM state to start each row from, (c, h) with c (2, L, B, H) and h (2, L, B, P) (a previous
                call's :attr:`BiLMOutput.state`); ``None`` = the model's fixed start state (stateless, the default):
                zeros unless one is stored with the model (:attr:`start_state`).
            keep_sentence_boundaries: keep the ``<S>``/``</S>`` positions in ``layers`` and ``mask``.
            add_boundaries: wrap rows in ``<S> … </S>`` (default). ``False`` runs on ``char_ids`` as given (it must
                already contain boundaries if wanted, e.g. in LM training windows).
            boundary_steps: ``False`` skips each direction's last step (the forward stack reading ``</S>``, the
                backward stack reading ``<S>``): exact for every other position, but the LSTM layers are then zero
                at those two positions, :attr:`BiLMOutput.state` is ``None`` and the tops at the boundaries are zero.
                For callers that drop the boundary positions and do not carry the state (``Elmo`` without layer norm
                over the boundaries, ``Embedder``): one step fewer per layer. Needs ``add_boundaries``.

        Returns:
            :class:`BiLMOutput`, its ``state`` the (c, h) reached (``None`` with ``boundary_steps=False``).

        Raises:
            InputError: bad ``char_ids`` (see :meth:`check_char_ids`) or a ``state`` of the wrong shape.
            UsageError: ``boundary_steps=False`` with ``add_boundaries=False``.
        """
        mask = self.check_char_ids(char_ids)
        char_ids = char_ids.long()
        if not add_boundaries:
            if not boundary_steps:
                raise UsageError(
                    "boundary_steps=False skips the steps that read the <S>/</S> this call adds: it needs "
                    "add_boundaries=True"
                )
            return self._contextualise(self.token_encoder(char_ids), mask, strip=False, state=state)
        if self._encoder_needs_grad():
            # training through the boundary rows: encode them with the batch (their gradient flows)
            ids, mask = add_sentence_boundaries(char_ids, self._bos, self._eos)
            tokens = self.token_encoder(ids)  # (B, T', P)
        else:
            # the boundary vectors are constants of the model: cached, not re-encoded in every batch
            tokens, mask = self._add_boundary_vectors(self.token_encoder(char_ids), mask)
        return self._contextualise(
            tokens, mask, strip=not keep_sentence_boundaries, state=state, boundary_steps=boundary_steps
        )

    def boundary_vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``<S>`` and ``</S>`` token vectors, each (P,); without autograd cached until a token-encoder weight
        changes (:class:`~elmokit.modules.derived.DerivedWeights`), one copy per path (batch-invariant or not)."""
        if self._encoder_needs_grad():
            return self._encode_boundaries()
        name = "boundaries/invariant" if invariant.enabled() else "boundaries"
        return self._derived.get(name, tuple(self.token_encoder.parameters()), self._encode_boundaries)

    def _encoder_needs_grad(self) -> bool:
        """Whether autograd is on and the token encoder has trainable parameters."""
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.token_encoder.parameters())

    def _encode_boundaries(self) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.token_encoder.projection.weight.device
        rows = torch.tensor([self._bos, self._eos], dtype=torch.long, device=device)
        vectors = self.token_encoder.encode_unique(rows)
        return vectors[0], vectors[1]

    def _add_boundary_vectors(
        self, token_vectors: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, P) token vectors and their (B, T) mask → (B, T + 2, P) with ``<S>`` first and ``</S>`` after each
        row's last real token (zeros at padding), and the (B, T + 2) mask."""
        b, t, p = token_vectors.shape
        bos, eos = self.boundary_vectors()
        lengths = mask.sum(1)
        tokens = token_vectors.new_zeros((b, t + 2, p))
        tokens[:, 1 : t + 1] = token_vectors * mask.unsqueeze(-1).to(token_vectors.dtype)
        tokens[:, 0] = bos.to(token_vectors.dtype)
        tokens[torch.arange(b, device=tokens.device), lengths + 1] = eos.to(token_vectors.dtype)
        new_mask = torch.arange(t + 2, device=mask.device).unsqueeze(0) < (lengths + 2).unsqueeze(1)
        return tokens, new_mask

    def forward_token_vectors(
        self,
        token_vectors: torch.Tensor,
        mask: torch.Tensor,
        state: LSTMState | None = None,
        *,
        keep_sentence_boundaries: bool = False,
        boundary_steps: bool = True,
    ) -> BiLMOutput:
        """Like :meth:`forward`, from precomputed layer-0 token vectors instead of character ids (AllenNLP's cached
        char-CNN path, ``vocab_to_cache``): the ``<S>``/``</S>`` vectors are added here, then both LSTM stacks run.

        Args:
            token_vectors: (B, T, P) float, as :meth:`TokenEncoder.forward` gives (values at padding are ignored).
            mask: (B, T) bool, True = real token; real tokens first in each row.
            state, boundary_steps: as in :meth:`forward`.

        Raises:
            InputTypeError: (also a ``TypeError``) not tensors, or ``token_vectors`` not floating point.
            InputError: wrong shapes, padding before a row's last real token, or a bad ``state``.
        """
        p = self.config.lstm.projection_dim
        if not isinstance(token_vectors, torch.Tensor):
            raise InputTypeError(
                f"token_vectors must be a float tensor (B, T, {p}), got {type(token_vectors).__name__}"
            )
        if token_vectors.dim() != 3 or token_vectors.shape[-1] != p:
            raise InputError(f"token_vectors must be a float tensor (B, T, {p}), got {tuple(token_vectors.shape)}")
        if not token_vectors.is_floating_point():
            raise InputTypeError(f"token_vectors must be floating point, got dtype {token_vectors.dtype}")
        if not isinstance(mask, torch.Tensor):
            raise InputTypeError(
                f"mask must be a bool tensor {tuple(token_vectors.shape[:2])}, got {type(mask).__name__}"
            )
        if tuple(mask.shape) != tuple(token_vectors.shape[:2]):
            raise InputError(f"mask must be a bool tensor {tuple(token_vectors.shape[:2])}, got {tuple(mask.shape)}")
        mask = mask.bool()
        check_left_aligned(mask, "mask")
        tokens, new_mask = self._add_boundary_vectors(token_vectors, mask)
        return self._contextualise(
            tokens, new_mask, strip=not keep_sentence_boundaries, state=state, boundary_steps=boundary_steps
        )

    def check_state(self, state: LSTMState, batch_size: int) -> None:
        """Raise :class:`InputError` unless ``state`` is (c (2, L, B, H), h (2, L, B, P)) float tensors,
        B = ``batch_size``."""
        cfg = self.config.lstm
        want = ((2, cfg.n_layers, batch_size, cfg.dim), (2, cfg.n_layers, batch_size, cfg.projection_dim))
        ok = (
            isinstance(state, (tuple, list))
            and len(state) == 2
            and all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in state)
        )
        if not ok or tuple(state[0].shape) != want[0] or tuple(state[1].shape) != want[1]:
            got = type(state).__name__
            if isinstance(state, (tuple, list)):
                got = tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in state)
            raise InputError(
                f"state must be (c, h) float tensors of shapes {want[0]} and {want[1]} "
                f"(2 directions, L layers, B rows), got {got}"
            )

    def _contextualise(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        *,
        strip: bool,
        state: LSTMState | None,
        boundary_steps: bool = True,
    ) -> BiLMOutput:
        b = tokens.shape[0]
        lengths = mask.sum(1)
        if state is not None:
            self.check_state(state, b)
            state = (state[0].to(tokens.dtype), state[1].to(tokens.dtype))
        elif self.start_c is not None:
            state = tuple(t.to(tokens.dtype) for t in self.initial_state(b))
        layer_outputs, final_state = self.run_lstm(
            tokens, lengths, state, steps=None if boundary_steps else lengths - 1
        )
        m = mask.unsqueeze(-1).to(tokens.dtype)
        layers = [torch.cat([tokens, tokens], dim=-1) * m]
        layers.extend(torch.cat([fwd, bwd], dim=-1) for fwd, bwd in layer_outputs)
        stacked = torch.stack(layers, dim=1)  # (B, L+1, T', 2P)
        fwd_top, bwd_top = layer_outputs[-1]
        out_layers, out_mask = remove_sentence_boundaries(stacked, mask) if strip else (stacked, mask)
        return BiLMOutput(out_layers, out_mask, tokens, fwd_top, bwd_top, mask, final_state if boundary_steps else None)

    def run_lstm(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        initial_state: LSTMState | None = None,
        *,
        steps: torch.Tensor | None = None,
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], LSTMState]:
        """Run both directions over left-aligned token vectors (B, T, P) in sentence order.

        The backward stack sees each row reversed within its length. Returns per layer (forward (B, T, P),
        backward (B, T, P)) in sentence order, and the final (c, h) state (backward: the state after consuming the
        first token, i.e. ``<S>``). ``initial_state=None`` is zeros here (the stored :attr:`start_state` is applied
        by :meth:`forward`, not by this low-level runner, which the training loop uses). ``steps`` (B,) ≤ lengths:
        run each direction only that many steps of its own reading order (the outputs beyond are zero, the state is
        the one reached after them); ``None`` = ``lengths``.
        """
        backward_in = reverse_padded(tokens, lengths)
        outputs, state = self.run_streams(tokens, backward_in, lengths if steps is None else steps, initial_state)
        return [(fwd, reverse_padded(bwd, lengths)) for fwd, bwd in outputs], state

    def run_streams(
        self,
        forward_in: torch.Tensor,
        backward_in: torch.Tensor,
        lengths: torch.Tensor,
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


class StatefulBiLM(nn.Module):
    """A :class:`BiLM` that carries each batch row's LSTM state into the next call: AllenNLP's ``_ElmoBiLm`` /
    bilm-tf's inference behaviour, needed to reproduce their reference outputs.

    Row ``i`` of a call starts from the state row ``i`` reached in the last call that had a row ``i`` (at first the
    model's start state, :meth:`BiLM.initial_state`: zeros for every original-format model); a batch larger than any
    before adds rows in that start state, and rows beyond a smaller batch keep theirs. The state is
    per wrapper: do not share one wrapper between threads (the :class:`BiLM` inside may be shared freely).

    Args:
        bilm: the stateless model; its parameters are this module's (``stateful.bilm``).

    ``forward(char_ids, *, keep_sentence_boundaries=False, add_boundaries=True)`` and ``forward_token_vectors(...)``
    as :class:`BiLM`, without ``state``. Source: AllenNLP ``_EncoderBase._update_states``.
    """

    def __init__(self, bilm: BiLM) -> None:
        super().__init__()
        if not isinstance(bilm, BiLM):
            raise InputTypeError(f"StatefulBiLM wraps an elmokit BiLM, got {type(bilm).__name__}")
        self.bilm = bilm
        self._state: LSTMState | None = None

    stateful = True

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("bilm", "_state"):
                raise
            return getattr(self._modules["bilm"], name)  # config, num_layers, token_encoder, char_vocab, ...

    _elmo_lstm = property(lambda self: self, doc="Itself: elmo._elmo_lstm._elmo_lstm.reset_states() resets it")

    def reset_states(self) -> None:
        """Forget the carried state: the next call starts from the model's start state (zeros unless one is stored)."""
        self._state = None

    def forward(
        self, char_ids: torch.Tensor, *, keep_sentence_boundaries: bool = False, add_boundaries: bool = True
    ) -> BiLMOutput:
        """As :meth:`BiLM.forward`, starting from (and then keeping) the carried state."""
        b = char_ids.shape[0] if isinstance(char_ids, torch.Tensor) and char_ids.dim() == 3 else 0
        out = self.bilm(
            char_ids,
            self._initial_state(b),
            keep_sentence_boundaries=keep_sentence_boundaries,
            add_boundaries=add_boundaries,
        )
        self._store_state(out.state)
        return out

    def forward_token_vectors(
        self, token_vectors: torch.Tensor, mask: torch.Tensor, *, keep_sentence_boundaries: bool = False
    ) -> BiLMOutput:
        """As :meth:`BiLM.forward_token_vectors`, starting from (and then keeping) the carried state."""
        b = token_vectors.shape[0] if isinstance(token_vectors, torch.Tensor) and token_vectors.dim() == 3 else 0
        out = self.bilm.forward_token_vectors(
            token_vectors, mask, self._initial_state(b), keep_sentence_boundaries=keep_sentence_boundaries
        )
        self._store_state(out.state)
        return out

    def _initial_state(self, batch_size: int) -> LSTMState:
        if self._state is None:
            self._state = self.bilm.initial_state(batch_size)
        c, h = self._state
        if c.shape[2] < batch_size:  # grow: new rows start from the start state
            zc, zh = self.bilm.initial_state(batch_size - c.shape[2])
            c, h = torch.cat([c, zc.to(c)], 2), torch.cat([h, zh.to(h)], 2)
            self._state = (c, h)
        return c[:, :, :batch_size], h[:, :, :batch_size]

    def _store_state(self, final_state: LSTMState) -> None:
        c, h = self._state
        b = final_state[0].shape[2]
        c, h = c.clone(), h.clone()
        c[:, :, :b] = final_state[0].detach()
        h[:, :, :b] = final_state[1].detach()
        self._state = (c, h)  # rows outside this batch keep theirs
