"""Training dropout with a counter-based mask: bilm-tf's dropout (``tf.nn.dropout``: inverted, kept values scaled by
1 / (1 − p)) on the LSTM layers' inputs and before the softmax, at a fraction of ``torch.bernoulli_``'s cost on the
CPU.

``F.dropout`` on the CPU draws one number at a time from the generator (``bernoulli_``): at the quickstart's dropout
0.5 that was ≈ 8 % of a float32 training step (four (2, ≈1,000, 128) masks a step, 3.5 ms each, 2 threads). Here the
mask of element i is a hash of (seed, i) (``native_train.cpp``'s ``dropout_apply``: two rounds of a 32-bit integer
finaliser, vectorised, split over torch's threads), the seed one 64-bit draw from torch's default generator, so that
the trainer's per-step seeding (:func:`elmokit.pretraining.step.step_seed`) still fixes every mask, and a resumed run
draws the same ones. The backward recomputes the mask from the seed: nothing of the input's size is saved.

The masks differ from ``F.dropout``'s (another generator), not their law: each element is kept independently with
probability 1 − p (to 2⁻³²), ``tests/test_dropout.py`` checks the rate, the scaling, the gradient and the independence
of neighbours. Where the kernels are unavailable (``ELMOKIT_NATIVE=0``, no compiler), on other devices and dtypes,
``F.dropout`` runs instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elmokit.modules import native

__all__ = ["dropout"]


class _HashDropout(torch.autograd.Function):
    """``x ⊙ mask(seed) / (1 − p)``; its backward applies the same mask and scale to the incoming gradient."""

    @staticmethod
    def forward(ctx, x, p, seed, ops):
        ctx.meta = (p, seed, ops)
        return ops.dropout_apply(x, p, seed).view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        p, seed, ops = ctx.meta
        return ops.dropout_apply(grad, p, seed).view(grad.shape), None, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout: each element zeroed with probability ``p``, the others scaled by 1 / (1 − p).

    Args:
        x: any shape; float32 or bfloat16 on the CPU take the native kernel, anything else ``F.dropout``.
        p: drop probability in [0, 1). training: ``False`` (or ``p == 0``) returns ``x`` itself.

    Returns:
        a tensor of ``x``'s shape and dtype (contiguous on the native path).

    Raises:
        ValueError: ``p`` outside [0, 1) (as ``F.dropout`` for p > 1; p = 1 would drop everything).

    Source: bilm-tf's ``tf.nn.dropout`` on each LSTM layer's input and on the top layer before the softmax.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p!r}")
    if not training or p == 0.0:
        return x
    ops = (
        native.train_ops()
        if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.numel() > 0
        else None
    )
    if ops is None or not hasattr(ops, "dropout_apply"):
        return F.dropout(x, p, True)
    seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))  # one draw from the default generator
    return _HashDropout.apply(x, float(p), seed, ops)
