"""Character CNN: character embeddings → 1-D convolutions of several widths → max over positions → activation.

Source: bilm-tf ``BidirectionalLanguageModel._build_word_char_embeddings``; Kim et al. (2016) char-aware LM.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from elmokit.errors import ConfigError, InputError
from elmokit.modules import invariant, native
from elmokit.modules.derived import DerivedWeights

__all__ = ["CharCNN", "window_max"]


class CharCNN(nn.Module):
    """Character embedding + convolutions with max-pooling over the character positions.

    Args:
        n_char_rows: learned embedding rows (261 for the byte scheme). Id 0 is padding: a constant zero row kept
            outside the parameters, so the published parameter counts hold.
        embedding_dim: D, char embedding size.
        filters: ``(width, count)`` per convolution; outputs are concatenated in this order.
        activation: ``"relu"`` or ``"tanh"``, applied after the max (the original's order).

    Shapes: ``forward(char_ids: LongTensor (N, C)) -> FloatTensor (N, F)`` with F = Σ counts. Convolutions are
    "valid" (no padding) with bias; the in-word pad id takes part in the max, as in the original.
    """

    def __init__(
        self, n_char_rows: int, embedding_dim: int, filters: list[tuple[int, int]], activation: str = "relu"
    ) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.filters = [(int(w), int(n)) for w, n in filters]
        #: (n_char_rows, D): row k is the embedding of id k + 1 (id 0 = padding = zeros).
        self.char_embedding = nn.Parameter(torch.empty(n_char_rows, embedding_dim))
        self.convolutions = nn.ModuleList(nn.Conv1d(embedding_dim, n, kernel_size=w) for w, n in self.filters)
        if activation not in ("relu", "tanh"):
            raise ConfigError(f"char_cnn.activation must be 'relu' or 'tanh', got {activation!r}")
        self.activation = activation
        self._derived = DerivedWeights()
        self.reset_parameters()

    @property
    def output_dim(self) -> int:
        """F, the total number of filters."""
        return sum(n for _, n in self.filters)

    def reset_parameters(self) -> None:
        """Random initialisation (uniform ±1 embeddings, as bilm-tf; PyTorch default for convolutions)."""
        nn.init.uniform_(self.char_embedding, -1.0, 1.0)
        for conv in self.convolutions:
            conv.reset_parameters()

    def embedding_table(self) -> torch.Tensor:
        """(n_char_rows + 1, D) lookup table with the zero padding row prepended."""
        return F.pad(self.char_embedding, (0, 0, 1, 0))

    #: tokens per im2col chunk: the (chunk·(C − w + 1), n) GEMM output then stays cache-sized for the max; measured
    #: on 2 cores (small configuration, 600 tokens): 64–128 per chunk 38–41 ms, one chunk 85 ms, Conv1d 148 ms.
    chunk_size = 128

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """``char_ids`` (N, C) long → (N, F) float.

        The convolutions run as GEMMs over unfolded windows (im2col), in chunks of :attr:`chunk_size` tokens: all
        widths in one GEMM where possible, else one per width (see :meth:`_pooled`), with the bias added after the
        max (max(x + b) = max(x) + b).

        **Only the windows that can differ are computed** (exact): a token's ids end in a run of one repeated id (the
        pad character after end-of-word, in every scheme); every window lying wholly inside that run holds the same
        characters, so it gives the same convolution output as the first such window. For a token whose run starts at
        position t, the windows starting at 0 … t are enough (0 … C − w when no window fits in the run). Tokens are
        sorted by t and each chunk computes ``min(max t + 1, C − w + 1)`` windows per width: an English word of 5
        letters needs 8 of the 44–50 windows. The result equals ``Conv1d`` followed by a max over all windows up to
        float rounding (≤ 1e-6 in ``tests/test_fast_paths.py``), with autograd too.

        Source of the semantics: bilm-tf ``_build_word_char_embeddings`` (valid convolution, max over all C − w + 1
        positions, then the activation).
        """
        if char_ids.dim() != 2:
            raise InputError(f"char_ids must be (N, C), got shape {tuple(char_ids.shape)}")
        n, c = char_ids.shape
        w_max = max(w for w, _ in self.filters)
        if c < w_max:
            raise InputError(f"char_ids have {c} characters per token, fewer than the widest filter ({w_max})")
        x = F.embedding(char_ids, self.embedding_table())  # (N, C, D)
        if n == 0:
            return x.new_zeros(0, self.output_dim)
        tails = self.tail_starts(char_ids)
        order = torch.argsort(tails, stable=True)
        sorted_tails = tails[order].tolist()
        identity = bool((order == torch.arange(n, device=order.device)).all())
        xs = x if identity else x.index_select(0, order)
        # split, not slices: its backward is one concatenation (each slice's backward would zero-fill a gradient the
        # size of all of x, quadratic in the number of chunks)
        parts = xs.split(self.chunk_size)
        outs = []
        exact = None if self.training else invariant.kernels_for(x, *self.parameters())
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        all_widths = None
        if exact is None and sorted_tails[min(self.chunk_size, n) - 1] + 1 <= c - w_max + 1:
            # some chunk runs all widths as one GEMM: their weight made once per call (with autograd, one pad and
            # concatenation and their backward, not one per chunk)
            all_widths = self._all_widths(grad)
        for i, part in enumerate(parts):
            last = sorted_tails[min((i + 1) * self.chunk_size, n) - 1]  # the chunk's largest run start
            pooled = None if exact is None else self._pooled_invariant(exact, part, last)
            outs.append(self._pooled(part, last, grad, all_widths) if pooled is None else pooled)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        if not identity:
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(n, device=order.device)
            out = out.index_select(0, inverse)
        return torch.relu(out) if self.activation == "relu" else torch.tanh(out)

    @staticmethod
    def tail_starts(char_ids: torch.Tensor) -> torch.Tensor:
        """(N, C) ids → (N,) long: the first position of each row's final run of one repeated id (its last id), i.e.
        1 + the last position whose id differs from the row's last id (0 when the whole row is one id)."""
        c = char_ids.shape[1]
        differs = char_ids != char_ids[:, -1:]
        positions = torch.arange(1, c + 1, device=char_ids.device)
        return torch.where(differs, positions, 0).amax(dim=1)

    def _all_widths_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every filter as one (F, D·w_max) matrix (narrower filters zero-padded on the right of their window) and the
        (F,) biases, in output order."""
        w_max = max(w for w, _ in self.filters)
        d = self.embedding_dim
        weight = torch.cat(
            [
                F.pad(conv.weight, (0, w_max - w)).reshape(count, d * w_max)
                for (w, count), conv in zip(self.filters, self.convolutions)
            ]
        )
        return weight, torch.cat([conv.bias for conv in self.convolutions])

    def _all_widths(self, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_all_widths_weight`: built now with autograd, the cached copy without."""
        if grad:
            return self._all_widths_weight()
        return self._derived.get("all_widths", tuple(self.parameters()), self._all_widths_weight)

    def _pooled(
        self, x: torch.Tensor, run_start: int, grad: bool, all_widths: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """(N, C, D) char embeddings → (N, F) max-pooled convolution outputs before the activation, computing for each
        width w only the windows starting at 0 … min(run_start, C − w) (``run_start`` ≥ every row's
        :meth:`tail_starts`; see :meth:`forward`). ``grad``: whether autograd records this call; ``all_widths``: the
        (weight, bias) of :meth:`_all_widths_weight` (made by the caller when a chunk may use it, else ``None``).

        When every width has all of those start positions (``run_start`` ≤ C − w_max: all but very long tokens in
        the byte scheme), all widths run as **one** GEMM: windows of the widest filter (w_max characters) at each
        start, times every filter zero-padded to w_max characters ((N·S, D·w_max) × (D·w_max, F)); the zero weights
        add exact zeros. Otherwise (a chunk with a long token, or a short C as the character-vocabulary mode's 10)
        each width is its own GEMM over its own windows.
        """
        n, c, d = x.shape
        # With autograd, the max with its argmax (window_max): the backward writes the gradient at the argmax, where
        # amax's backward compares, counts and divides over all (N, S, n) outputs; ties then send the whole gradient
        # to one of the equal windows (the first) instead of splitting it. Windows that tie because they hold the same
        # characters (repeated pad windows) give the same parameter gradients either way; windows with different
        # characters tie only when a filter's outputs are exactly equal (e.g. an all-zero filter), and then the
        # gradient is another valid subgradient than Conv1d's (the value is the same).
        # Measured on bilm-tf's training settings: amax's backward was ≈ 30 % of a step.
        pool = window_max if grad else _amax_positions
        w_max = max(w for w, _ in self.filters)
        if run_start + 1 <= c - w_max + 1:
            positions = run_start + 1
            cols = x[:, : positions + w_max - 1].unfold(1, w_max, 1).reshape(n * positions, d * w_max)
            weight, bias = all_widths if all_widths is not None else self._all_widths(grad)
            y = torch.mm(cols, weight.t()).view(n, positions, -1)
            return pool(y) + bias
        pooled = []
        for (w, count), conv in zip(self.filters, self.convolutions):
            positions = min(run_start + 1, c - w + 1)
            xw = x if positions == c - w + 1 else x[:, : positions + w - 1]
            cols = xw.unfold(1, w, 1).reshape(n * positions, d * w)  # (N·L, D·w), window order matches conv.weight
            y = torch.mm(cols, conv.weight.reshape(count, d * w).t()).view(n, positions, count)
            pooled.append(pool(y) + conv.bias)
        return torch.cat(pooled, dim=-1)

    def _pooled_invariant(self, module, x: torch.Tensor, run_start: int) -> torch.Tensor | None:
        """:meth:`_pooled` by the batch-invariant kernel (:mod:`elmokit.modules.invariant`): every window of w_max
        characters (zero characters appended past C) times every filter zero-padded to w_max characters, one fixed
        summation order per window whatever the chunk, so a token's maximum is the same bits in any batch (the windows
        a chunk computes beyond a token's own run start repeat its window at that start). Width w's maximum is over
        the starts 0 … min(run_start, C − w). ``None`` when x holds inf or NaN."""
        n, c, d = x.shape
        w_max = max(w for w, _ in self.filters)
        positions = min(run_start + 1, c)
        xs = x if positions + w_max - 1 <= c else F.pad(x, (0, 0, 0, positions + w_max - 1 - c))
        cols = xs[:, : positions + w_max - 1].unfold(1, w_max, 1).reshape(n * positions, d * w_max)
        weight, bias = self._derived.get("all_widths", tuple(self.parameters()), self._all_widths_weight)
        packed = self._derived.get("invariant", tuple(self.parameters()), lambda: invariant.pack_linear(weight.t()))
        y = invariant.linear(module, cols, packed, self.output_dim)
        if y is None:
            return None
        y = y.view(n, positions, -1)
        if positions <= c - w_max + 1:  # every width has all these starts
            return y.amax(dim=1) + bias
        pooled, offset = [], 0
        for w, count in self.filters:
            pooled.append(y[:, : min(positions, c - w + 1), offset : offset + count].amax(dim=1))
            offset += count
        return torch.cat(pooled, dim=-1) + bias

    def forward_conv1d(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Reference path with ``nn.Conv1d`` (what :meth:`forward` must equal); (N, C) long → (N, F)."""
        x = F.embedding(char_ids, self.embedding_table()).transpose(1, 2)  # (N, D, C)
        out = torch.cat([conv(x).amax(dim=-1) for conv in self.convolutions], dim=-1)
        return torch.relu(out) if self.activation == "relu" else torch.tanh(out)


def _amax_positions(y: torch.Tensor) -> torch.Tensor:
    """(N, S, F) → (N, F): the maximum over the S window positions, without its argmax (no autograd wanted)."""
    return y.amax(dim=1)


class _WindowMax(torch.autograd.Function):
    """:func:`window_max` through the native kernels (``native_train.cpp``'s ``window_max``)."""

    @staticmethod
    def forward(ctx, y, ops):
        found = ops.window_max(y)
        if found:
            values, index = found
        else:  # inf or NaN in y (the kernel assumes finite values): torch's max, the same semantics
            values, where = y.max(dim=1)
            index = where.to(torch.uint8)
        ctx.save_for_backward(index)
        ctx.meta = (y.shape[1], ops)
        return values

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        positions, ops = ctx.meta
        return ops.window_max_backward(grad, index, positions), None


def window_max(y: torch.Tensor) -> torch.Tensor:
    """The char CNN's max-pooling over window positions, with autograd: (N, S, F) → (N, F), y's dtype.

    The gradient goes to the first position holding each maximum (ties: one window takes it all, as ``torch.max``'s
    backward; see :meth:`CharCNN._pooled`). On the CPU in float32 or bfloat16 with at most 255 positions (every
    character scheme of ELMo: C ≤ 50 characters a token) the native kernels run (``native_train.cpp``: one pass
    vectorised over the filters, a uint8 argmax saved; ``torch.max(dim=1)``'s int64 argmax reduction took ≈ 10 % of a
    bf16 training step at bilm-tf's settings); elsewhere (``ELMOKIT_NATIVE=0``, other devices and dtypes)
    ``torch.max(dim=1)``.

    Raises nothing of its own: a y holding inf or NaN takes ``torch.max`` inside the native path.

    Source: bilm-tf ``_build_word_char_embeddings`` (``tf.reduce_max`` over the convolution's positions).
    """
    ops = native.train_ops() if y.device.type == "cpu" and y.dtype in (torch.float32, torch.bfloat16) else None
    if ops is None or not hasattr(ops, "window_max") or not 1 <= y.shape[1] <= 255 or y.numel() == 0:
        return y.max(dim=1).values
    return _WindowMax.apply(y, ops)
