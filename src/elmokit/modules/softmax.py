"""The word-level LM head shared by the forward and backward language models.

bilm-tf keeps one softmax (``W`` of shape (V, D), ``b`` of shape (V,)) for both directions; training uses TensorFlow's
``tf.nn.sampled_softmax_loss`` with its default sampler, ``log_uniform_candidate_sampler(unique=True,
range_max=V)``, and evaluation (perplexity) the full softmax. :class:`SoftmaxLM` provides both, plus the sampler.

Sources for the sampler (TensorFlow: ``python/ops/candidate_sampling_ops.py`` docs, ``core/kernels/range_sampler.cc``):

* base distribution ``P(k) = (log(k + 2) - log(k + 1)) / log(range_max + 1)`` for ``k`` in ``[0, range_max)``; a draw
  is ``floor(exp(u · log(range_max + 1))) - 1`` with ``u`` uniform in ``[0, 1)``;
* ``unique=True``: draw with rejection until ``num_sampled`` distinct ids are picked, counting ``num_tries`` draws;
  the expected count of an id (used as ``Q(y)``) is ``-expm1(num_tries · log1p(-P(k)))``, i.e.
  ``1 - (1 - P(k))^num_tries``,
  except when no draw was rejected (``num_tries == num_sampled``) where TensorFlow returns ``P(k) · num_sampled``
  (``ExpectedCountHelper``); we follow both branches;
* ``sampled_softmax_loss`` (``nn_impl._compute_sampled_logits``): logits of the true class and of the (batch-shared)
  samples have ``log Q`` subtracted, a sample equal to a row's target ("accidental hit") gets ``-FLT_MAX`` added, and
  the loss is the softmax cross-entropy with the true class first.

Shapes: N tokens (flattened batch × time), D input dim (the LSTM projection), V vocabulary, S sampled negatives.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from elmokit.checks import check_int, is_int, positive_int
from elmokit.errors import ConfigError, InputError, InputTypeError, UsageError
from elmokit.modules import native
from elmokit.modules.precision import gemm_rows, low_precision_dtype

logger = logging.getLogger(__name__)

__all__ = [
    "SoftmaxLM",
    "log_uniform_probs",
    "log_uniform_draws",
    "log_uniform_candidates",
    "log_uniform_expected_count",
]


# ---------------------------------------------------------------------------------------------- sampled logits
def _accidental_hits(
    targets: torch.Tensor, sampled: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) where ``sampled[column] == targets[row]``: targets (N,) long, sampled (S,) distinct long ids.

    A lookup table of each id's position among the samples, O(V + N), instead of comparing all N × S pairs (which
    took ≈ 4 % of a training step at bilm-tf's N = 2,560, S = 8,192).
    """
    position = torch.full((vocab_size,), -1, dtype=torch.long, device=targets.device)
    position[sampled] = torch.arange(sampled.numel(), device=targets.device)
    cols = position[targets]
    rows = (cols >= 0).nonzero().squeeze(1)
    return rows, cols[rows]


class _SampledLogSumExp(torch.autograd.Function):
    """``logsumexp(h · Wₛᵀ + bₛ, dim=1)`` with the accidental hits at ``-FLT_MAX``, float32, in few passes.

    Forward: (N, D) h, (S, D) Wₛ, (S,) bₛ, hit (rows, cols; rows ascending) → (N,) log-sum-exp. The (N, S) softmax is
    kept for the backward, which runs the two GEMMs with the incoming gradient g (N,) on their narrow side:
    ``∂h = g ⊙ (P · Wₛ)``, ``∂Wₛ = Pᵀ · (g ⊙ h)``, ``∂bₛ = Pᵀ · g``. The composed ops (linear, masked fill,
    logsumexp and their backward) allocate and sweep (N, S) tensors about three times more often; at bilm-tf's
    N = 2,560, S = 8,192 that was ≈ 15 % of a training step. The logits are one GEMM over all rows; the softmax then
    runs in blocks of rows (:data:`_BLOCK_ELEMENTS` logits each), so that the max, exp, sum and division sweep a block
    while it is in cache rather than four times through memory. A row's arithmetic does not depend on the block size,
    so the results equal the unblocked ones bit for bit (the product is not split by blocks: a GEMM's rounding changes
    with its row count on some CPUs' kernels).
    Equal to the composed ops up to float rounding (``tests/test_softmax.py``). Once differentiable (the saved buffer
    is consumed by the backward).

    Under bf16 autocast the GEMMs take bfloat16 copies of h and Wₛ, on :func:`~elmokit.modules.precision.gemm_rows` rows
    (h padded with zero rows: on the CPU oneDNN then compiles kernels for a few row counts, not one a batch), the
    softmax of each block is computed in float32 and kept in bfloat16 (the backward's GEMMs take bfloat16 anyway), so no
    (N, S) float32 buffer is made or cast.

    On the CPU with the native kernels (:func:`elmokit.modules.native.softmax_ops`) the softmax of each row runs as
    one fused pass over the row (``native_softmax.cpp``: its float32 copy, the hits, max, exp, sum, the division and
    the write back in the product's dtype) instead of the blocks' six torch ops; same values up to the sum's order.
    """

    @staticmethod
    def forward(ctx, h, w, b, hit_rows, hit_cols):
        low = low_precision_dtype(h.device.type)
        with torch.autocast(device_type=h.device.type, enabled=False):
            # the bias as one more input column (h | 1) · (W | b)ᵀ: no separate pass writing b over the (N, S) buffer
            h1 = torch.cat([h, h.new_ones(h.shape[0], 1)], dim=1)  # (N, D + 1)
            w1 = torch.cat([w, b.unsqueeze(1)], dim=1)  # (S, D + 1)
            if low is not None:
                h1, w1 = h1.to(low), w1.to(low)
            n, s = h1.shape[0], w1.shape[0]
            # the products run on gemm_rows(n) rows (a few sizes in bfloat16 on the CPU, so that oneDNN compiles their
            # kernels once): zero rows of (h | 1) past n, whose logits are exact zeros, summed into ∂W as zeros
            rows = gemm_rows(n, h1.dtype, h1.device.type)
            if rows > n:
                h1 = F.pad(h1, (0, 0, 0, rows - n))
            # (N, S) float32, or bfloat16 under bf16: all rows' logits in one product, so that a row's logits do not
            # depend on the block it falls in (a GEMM's blocking, and so its rounding, changes with its row count:
            # 16 rows against 53 differed on AMD EPYC's kernels)
            logits = torch.mm(h1, w1.t())
            probs = logits[:n]  # the first n rows: contiguous
            ops = _native_rows(h1, w1)
            if ops is not None:  # one fused pass per row (native_softmax.cpp): the same steps as the blocks below
                lse = ops.softmax_rows_(probs, hit_rows.contiguous(), hit_cols.contiguous())
                ctx.save_for_backward(h1, w1, logits)
                ctx.dtypes = (h.dtype, w.dtype, b.dtype)
                return lse
            lse = torch.empty(n, dtype=torch.float32, device=h1.device)
            step = max(16, _BLOCK_ELEMENTS // max(s, 1))
            starts = list(range(0, n, step))
            # the hits of each block: hit_rows is ascending, so block i holds hits[cuts[i]:cuts[i + 1]]
            cuts = torch.searchsorted(hit_rows, torch.tensor([*starts, n], device=hit_rows.device)).tolist()
            for i, r0 in enumerate(starts):
                r1 = min(n, r0 + step)
                x = probs[r0:r1] if low is None else probs[r0:r1].float()  # (rows, S) float32, one block
                rows, cols = hit_rows[cuts[i] : cuts[i + 1]] - r0, hit_cols[cuts[i] : cuts[i + 1]]
                if rows.numel():
                    x[rows, cols] = torch.finfo(x.dtype).min
                top = x.amax(dim=1, keepdim=True)
                top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
                x.sub_(top).exp_()
                total = x.sum(dim=1, keepdim=True)
                x.div_(total)
                if rows.numel():
                    x[rows, cols] = 0.0  # masked logits get no gradient (as masked_fill's backward)
                if low is not None:
                    probs[r0:r1].copy_(x)
                lse[r0:r1] = (total.log_() + top).squeeze(1)
        ctx.save_for_backward(h1, w1, logits)
        ctx.dtypes = (h.dtype, w.dtype, b.dtype)
        return lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        h1, w1, probs = ctx.saved_tensors  # (R, D + 1), (S, D + 1), (R, S): R = gemm_rows(N) ≥ N rows, zeros past N
        h_dtype, w_dtype, b_dtype = ctx.dtypes
        n = grad.shape[0]
        # ∂lse/∂logits · grad = diag(grad)·P: the row scale goes to the (N, D) side of each product, not over the
        # (N, S) probabilities (one pass over them fewer): ∂h = grad ⊙ (P·Wₛ), ∂(Wₛ | bₛ) = Pᵀ·(grad ⊙ (h | 1))
        scale = F.pad(grad.float(), (0, h1.shape[0] - n)).unsqueeze(1)  # (R, 1), zeros past N
        grad_h = None
        if ctx.needs_input_grad[0]:
            grad_h = (torch.mm(probs, w1[:, :-1])[:n].float() * scale[:n]).to(h_dtype)
        grad_w = grad_b = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # (D + 1, N)·(N, S), then transposed: the small operand is copied transposed rather than the GEMM reading
            # the (N, S) probabilities transposed (1.4× faster at the zoo's N ≈ 20k, S = 4,096, float32 and bfloat16)
            h1g_t = (h1.float() * scale).t().to(probs.dtype).contiguous()  # (D + 1, N) in the GEMM's dtype
            grad_w1 = torch.mm(h1g_t, probs).t().float().contiguous()  # (S, D + 1): the last column is ∂b = Σₙ grad · P
            grad_w, grad_b = grad_w1[:, :-1].to(w_dtype), grad_w1[:, -1].to(b_dtype)
        return grad_h, grad_w, grad_b, None, None


def _native_rows(h1: torch.Tensor, w1: torch.Tensor):
    """The native softmax rows (:func:`elmokit.modules.native.softmax_ops`) where they may run on the logits
    ``h1 · w1ᵀ``: CPU, float32 or bfloat16, native kernels on (``ELMOKIT_NATIVE``), and the logits surely finite (the
    kernel's ``-ffast-math`` build assumes it): |logit| ≤ D · max|h1| · max|w1| < 1e30. Else ``None``."""
    if h1.device.type != "cpu" or h1.dtype not in (torch.float32, torch.bfloat16) or h1.numel() == 0:
        return None
    ops = native.softmax_ops()
    if ops is None:
        return None
    bound = float(h1.abs().amax()) * float(w1.abs().amax()) * h1.shape[1]
    return ops if math.isfinite(bound) and bound < 1e30 else None


# logits per block of :class:`_SampledLogSumExp`'s forward: 4 MB of float32, about a core's share of the last-level
# cache here (2**20 // 4,096 negatives = 256 rows; at least 16 rows a block)
_BLOCK_ELEMENTS = 2**20


# ---------------------------------------------------------------------------------------------- log-uniform sampler
def log_uniform_probs(range_max: int, ids: torch.Tensor | None = None) -> torch.Tensor:
    """TF's log-uniform base probabilities ``P(k) = (log(k+2) - log(k+1)) / log(range_max+1)``.

    Args:
        range_max: V, ids live in ``[0, V)``.
        ids: optional integer tensor of ids (any shape); default all of ``0 … V-1``.

    Returns:
        float64 tensor, shape of ``ids`` (or (V,)); sums to 1 over ``[0, V)``.
    """
    _check_range_max(range_max)
    if ids is None:
        ids = torch.arange(range_max)
    k = ids.to(torch.float64)
    return torch.log1p(1.0 / (k + 1.0)) / math.log(range_max + 1.0)


def log_uniform_draws(range_max: int, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` independent draws (with replacement) from the log-uniform distribution over ``[0, range_max)``.

    Uses TF's inversion ``floor(exp(u · log(range_max + 1))) - 1`` with ``u ~ U[0, 1)`` (float64).

    Returns:
        int64 tensor (n,) on the generator's device (CPU by default).
    """
    _check_range_max(range_max)
    device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=device)
    values = torch.floor(torch.exp(u * math.log(range_max + 1.0))).to(torch.int64) - 1
    return values.clamp_(0, range_max - 1)


def log_uniform_candidates(
    range_max: int, num_samples: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, int]:
    """Draw ``num_samples`` **distinct** ids by rejection, as TF's ``log_uniform_candidate_sampler(unique=True)``.

    Draws are made in chunks (deterministic for a given generator state); the picked ids keep their draw order.

    Returns:
        ``(ids, num_tries)``: int64 tensor (S,) on CPU, and the number of draws made up to and including the one that
        completed the set (needed for :func:`log_uniform_expected_count`).

    Raises:
        UsageError: ``num_samples`` not in ``[1, range_max]``, or ``range_max`` not an int >= 1.
    """
    _check_range_max(range_max)
    check_int("num_samples", num_samples, 1)
    if num_samples > range_max:
        raise UsageError(f"num_samples must be an int in [1, {range_max}] (range_max), got {num_samples!r}")
    seen = torch.zeros(range_max, dtype=torch.bool)
    picked: list[torch.Tensor] = []
    n_picked = 0
    tries_before = 0
    chunk = max(2 * num_samples, 64)
    while True:
        draws = log_uniform_draws(range_max, chunk, generator).cpu()
        uniq, inverse = torch.unique(draws, return_inverse=True)
        first = torch.full((uniq.numel(),), chunk, dtype=torch.int64)
        first.scatter_reduce_(0, inverse, torch.arange(chunk), reduce="amin")
        new = ~seen[uniq]
        new_vals, new_first = uniq[new], first[new]
        order = torch.argsort(new_first)
        new_vals, new_first = new_vals[order], new_first[order]
        need = num_samples - n_picked
        if new_vals.numel() >= need:
            picked.append(new_vals[:need])
            num_tries = tries_before + int(new_first[need - 1]) + 1
            return torch.cat(picked), num_tries
        picked.append(new_vals)
        seen[new_vals] = True
        n_picked += new_vals.numel()
        tries_before += chunk
        chunk *= 2


def log_uniform_expected_count(ids: torch.Tensor, range_max: int, num_samples: int, num_tries: int) -> torch.Tensor:
    """TF's expected count ``Q(k)`` of ids under unique log-uniform sampling (``ExpectedCountHelper``).

    ``P(k) · num_samples`` when ``num_tries == num_samples`` (no rejection happened), else
    ``-expm1(num_tries · log1p(-P(k)))``. This is TF's approximation (it treats ``num_tries`` as fixed): for the most
    frequent ids of a small vocabulary the real inclusion rate is noticeably lower (e.g. id 0 with V=50, S=10: about
    0.91 measured vs 0.99), for large V and rare ids it is close.

    Returns:
        float64 tensor, shape of ``ids``.
    """
    p = log_uniform_probs(range_max, ids)
    if num_tries == num_samples:
        return p * num_samples
    return -torch.expm1(num_tries * torch.log1p(-p))


def _check_range_max(range_max: int) -> None:
    positive_int("range_max (vocabulary size)", range_max)


# ---------------------------------------------------------------------------------------------- the LM head
class SoftmaxLM(nn.Module):
    """Word softmax ``logits = h · Wᵀ + b`` shared by both LM directions (bilm-tf's ``softmax/W``, ``softmax/b``).

    Args:
        input_dim: D, the LSTM projection dim (bilm-tf's ``softmax_dim``).
        vocab_size: V; ids are those of a frequency-sorted :class:`elmokit.vocabulary.Vocabulary` (the sampler assumes
            id order = frequency order).

    Parameters:
        weight: (V, D) float32, initialised N(0, 1/√D) as in bilm-tf; bias: (V,) zeros.

    All losses are per-token negative log-likelihoods in nats, float32 (computed in float32 even under autocast).
    Padding must be removed by the caller (select the real positions of ``h`` and ``targets``).

    Raises (constructor): ConfigError: ``input_dim`` or ``vocab_size`` not an int >= 1.
    """

    def __init__(self, input_dim: int, vocab_size: int) -> None:
        super().__init__()
        for name, value in (("input_dim", input_dim), ("vocab_size", vocab_size)):
            if not is_int(value) or value < 1:
                raise ConfigError(f"SoftmaxLM: {name} must be an int >= 1, got {value!r}")
        self.input_dim = input_dim
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, input_dim))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self._logged_fallback = False
        #: the sampled loss's gradient of ``weight`` as a sparse (COO) tensor of the rows it read (see
        #: :meth:`sampled_nll`); the caller densifies it before the optimiser (elmokit's trainer does, in one process)
        self.sparse_grad = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """bilm-tf's initialisation: ``W ~ N(0, 1/√D)``, ``b = 0``."""
        with torch.no_grad():
            self.weight.normal_(0.0, 1.0 / math.sqrt(self.input_dim))
            self.bias.zero_()

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}, vocab_size={self.vocab_size}"

    # ------------------------------------------------------------------ validation
    def _check_h(self, h: torch.Tensor, *, two_d: bool) -> None:
        if not isinstance(h, torch.Tensor):
            raise InputTypeError(f"h must be a torch.Tensor, got {type(h).__name__}")
        if not h.is_floating_point():
            raise InputTypeError(f"h must be a floating-point tensor, got dtype {h.dtype}")
        if two_d and h.dim() != 2:
            raise InputError(f"h must have shape (N, D={self.input_dim}), got {tuple(h.shape)}")
        if h.dim() < 1 or h.shape[-1] != self.input_dim:
            raise InputError(f"h's last dim must be D={self.input_dim}, got shape {tuple(h.shape)}")

    def _check_targets(self, targets: torch.Tensor, n: int) -> None:
        if not isinstance(targets, torch.Tensor):
            raise InputTypeError(f"targets must be a torch.Tensor of ids, got {type(targets).__name__}")
        if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
            raise InputTypeError(f"targets must be an integer tensor of ids, got dtype {targets.dtype}")
        if targets.dim() != 1 or targets.shape[0] != n:
            raise InputError(f"targets must have shape (N={n},), got {tuple(targets.shape)}")
        if n:
            lo, hi = int(targets.min()), int(targets.max())
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise InputError(f"target id {bad} out of range [0, {self.vocab_size}) (vocab_size)")

    # ------------------------------------------------------------------ API
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Full logits ``h · Wᵀ + b``: (..., D) → (..., V), in the dtype of the matmul (autocast applies)."""
        self._check_h(h, two_d=False)
        return F.linear(h, self.weight, self.bias)

    def full_nll(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-token NLL under the full softmax: ``-log_softmax(h Wᵀ + b)[n, targets[n]]``.

        Args:
            h: (N, D) float. targets: (N,) integer ids in ``[0, V)``.

        Returns:
            (N,) float32, nats. This is what bilm-tf evaluates for perplexity (``exp`` of the mean). Without autograd
            (evaluation) it is ``F.cross_entropy`` of the float32 logits; with autograd on float32 inputs (training)
            the same value from the fused log-sum-exp (:meth:`_full_nll_train`), equal up to float rounding.

        Raises:
            InputTypeError: (also a ``TypeError``) ``h`` not a floating tensor, ``targets`` not an integer tensor.
            InputError: wrong shapes, or an id out of range.
        """
        self._check_h(h, two_d=True)
        self._check_targets(targets, h.shape[0])
        if torch.is_grad_enabled() and h.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return self._full_nll_train(h, targets.long())
        logits = self.logits(h).float()
        return F.cross_entropy(logits, targets.long(), reduction="none")

    def _full_nll_train(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """:meth:`full_nll` with autograd: ``logsumexp(h·Wᵀ + b) − (h·W[y] + b[y])``, the log-sum-exp over all V
        words through :class:`_SampledLogSumExp` (no accidental hits): one GEMM for the logits, one pass per row for
        the softmax, the backward's two GEMMs scaled on their narrow side, instead of ``log_softmax`` and
        ``nll_loss`` with their backward (an (N, V) zero fill, a scatter and two more passes over (N, V)). The true
        logit is a row dot product in float32, as :meth:`sampled_nll`'s."""
        w_true = F.embedding(targets, self.weight, sparse=self.sparse_grad)  # (N, D)
        true_logits = (h * w_true).sum(-1).float() + self.bias[targets].float()
        none = targets.new_zeros(0)
        return _SampledLogSumExp.apply(h, self.weight, self.bias, none, none) - true_logits

    def _rows(self, targets: torch.Tensor, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of W at ``targets`` (N,) and ``sampled`` (S,): (N, D), (S, D). With :attr:`sparse_grad` (and
        autograd on) one gather whose gradient is sparse: not two dense (V, D) zero-filled gradients per call, summed
        (at 198k words they were ≈ 20 % of a zoo training step)."""
        if self.sparse_grad and torch.is_grad_enabled():
            rows = F.embedding(torch.cat([targets, sampled]), self.weight, sparse=True)
            return rows[: targets.shape[0]], rows[targets.shape[0] :]
        return self.weight[targets], self.weight[sampled]

    def sampled_nll(
        self,
        h: torch.Tensor,
        targets: torch.Tensor,
        num_samples: int,
        generator: torch.Generator | None = None,
        *,
        remove_accidental_hits: bool = True,
    ) -> torch.Tensor:
        """Per-token sampled-softmax NLL, as ``tf.nn.sampled_softmax_loss`` with its default sampler.

        One set of S distinct negatives is drawn per call from the log-uniform distribution over ``[0, V)`` and shared
        by all N rows (see :func:`log_uniform_candidates`). For row n with target y:
        ``a_y = h·W[y] + b[y] - log Q(y)``, ``a_s = h·W[s] + b[s] - log Q(s)``
        (Q = :func:`log_uniform_expected_count`),
        samples with ``s == y`` get the most negative float32 (TF adds ``-FLT_MAX``), and
        ``nll = logsumexp([a_y, a_s…]) - a_y``. It is a training objective (biased estimate, lower than the full NLL
        in general), not a perplexity.

        With :attr:`sparse_grad` set (and autograd on), the rows of W read here come from one
        ``F.embedding(sparse=True)``, so that W's gradient is a sparse tensor of those rows (same values, summed when
        densified); the caller turns it dense before clipping and the optimiser.

        When ``num_samples >= V - 1`` the full softmax is used instead (:meth:`full_nll`; exact, and the rejection
        sampler would need ever more draws to find the last ids); this is logged (INFO) once per module — the trainer
        warns about it once when training starts.

        Args:
            h: (N, D) float. targets: (N,) integer ids. num_samples: S >= 1 (bilm-tf: 8192).
            generator: torch RNG for the sampler (CPU unless it is a device generator); default global RNG.
            remove_accidental_hits: as TF (default True).

        Returns:
            (N,) float32, nats.

        Raises:
            InputError: as :meth:`full_nll`. UsageError: ``num_samples`` not an int >= 1.
        """
        self._check_h(h, two_d=True)
        self._check_targets(targets, h.shape[0])
        positive_int("num_samples", num_samples)
        V = self.vocab_size
        if num_samples >= V - 1:
            if not self._logged_fallback:
                logger.info(
                    "sampled softmax: num_samples=%d >= vocab_size-1=%d, using the full softmax instead",
                    num_samples,
                    V - 1,
                )
                self._logged_fallback = True
            return self.full_nll(h, targets)

        targets = targets.long()
        sampled, num_tries = log_uniform_candidates(V, num_samples, generator)
        sampled = sampled.to(h.device)
        log_q_true = torch.log(log_uniform_expected_count(targets, V, num_samples, num_tries)).float()
        log_q_sampled = torch.log(log_uniform_expected_count(sampled, V, num_samples, num_tries)).float()

        w_true, w_sampled = self._rows(targets, sampled)  # (N, D), (S, D)
        true_logits = (h * w_true).sum(-1).float() + self.bias[targets].float() - log_q_true  # (N,)
        # - log Q(s) folded into the bias, and no (N, 1 + S) concatenation: fewer passes over the (N, S) logits
        sampled_bias = self.bias[sampled] - log_q_sampled.to(self.bias.dtype)
        hit_rows, hit_cols = (
            _accidental_hits(targets, sampled, V)
            if remove_accidental_hits
            else (targets.new_zeros(0), targets.new_zeros(0))
        )
        if h.dtype == torch.float32 and w_sampled.dtype == torch.float32:
            sampled_lse = _SampledLogSumExp.apply(h, w_sampled, sampled_bias, hit_rows, hit_cols)
        else:  # reduced precision: the composed ops (autocast decides the matmul dtype)
            sampled_logits = F.linear(h, w_sampled, sampled_bias).float()  # (N, S)
            sampled_logits[hit_rows, hit_cols] = torch.finfo(torch.float32).min
            sampled_lse = torch.logsumexp(sampled_logits, dim=1)
        # logsumexp over [a_y, a_s…] = logaddexp(a_y, logsumexp(a_s…))
        return torch.logaddexp(true_logits, sampled_lse) - true_logits
