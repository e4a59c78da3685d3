"""elmokit.modules.dropout: the hashed-mask training dropout (native kernel) and its fallback."""

from __future__ import annotations

import math

import pytest
import torch

from elmokit.modules import dropout as dropout_module
from elmokit.modules.dropout import dropout


def _mask(y: torch.Tensor) -> torch.Tensor:
    return (y != 0).reshape(-1)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate_scale_and_neighbours(train_kernels, p):
    """Each element is kept with probability 1 − p (within 5 standard deviations over 2²⁰ elements), kept values are
    x / (1 − p) exactly (float32), and neighbours are independent: the rate of (kept, kept) pairs at lags 1, 2, 16 and
    across rows is (1 − p)², and the mask rows of a (1024, 1024) input are not copies of each other."""
    torch.manual_seed(0)
    x = torch.rand(1024, 1024) + 0.5  # no zeros of its own
    y = dropout(x, p)
    keep = _mask(y).double()
    n, q = keep.numel(), 1 - p
    assert abs(keep.mean().item() - q) < 5 * math.sqrt(q * p / n)
    kept = y != 0
    assert torch.equal(y[kept], x[kept] * (1 / (1 - p)))
    for lag in (1, 2, 16, 1024):
        both = (keep[:-lag] * keep[lag:]).mean().item()
        assert abs(both - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / n), lag
    rows = kept.reshape(1024, 1024)
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[512])


def test_masks_follow_the_default_generator(train_kernels):
    """The mask is one draw from torch's default generator: the same seed gives the same mask (a resumed run's), the
    next call another one; a bfloat16 input gets the float32 input's mask."""
    x = torch.ones(3, 1000)
    torch.manual_seed(7)
    a, b = dropout(x, 0.3), dropout(x, 0.3)
    torch.manual_seed(7)
    a2 = dropout(x, 0.3)
    torch.manual_seed(7)
    a16 = dropout(x.bfloat16(), 0.3)
    assert torch.equal(a, a2)
    assert not torch.equal(_mask(a), _mask(b))
    assert a16.dtype == torch.bfloat16 and torch.equal(_mask(a16), _mask(a))


def test_same_mask_for_any_thread_count(train_kernels):
    x = torch.randn(5, 70001)
    masks = []
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(3)
            masks.append(dropout(x, 0.25))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(masks[0], masks[1])


def test_gradient_is_the_mask_times_the_scale(train_kernels):
    """∂(Σ w ⊙ y)/∂x = w ⊙ mask / (1 − p): the backward recomputes the forward's mask from its seed."""
    torch.manual_seed(1)
    x = torch.randn(40, 33, requires_grad=True)
    w = torch.randn(40, 33)
    y = dropout(x, 0.4)
    (y * w).sum().backward()
    mask = (y != 0).float()
    assert 0 < mask.mean().item() < 1
    torch.testing.assert_close(x.grad, w * mask / 0.6, rtol=1e-6, atol=0)


def test_identity_when_off_and_errors():
    x = torch.randn(4, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="dropout probability"):
            dropout(x, p)


def test_fallback_is_torch_dropout(monkeypatch):
    """Without the kernels (``ELMOKIT_NATIVE=0``, no compiler) and for other dtypes: ``F.dropout`` with the same
    generator draws, so a float64 input gets exactly ``F.dropout``'s mask."""
    x = torch.randn(20, 30, dtype=torch.float64)
    torch.manual_seed(2)
    want = torch.nn.functional.dropout(x, 0.5, True)
    torch.manual_seed(2)
    assert torch.equal(dropout(x, 0.5), want)
    monkeypatch.setattr(dropout_module.native, "train_ops", lambda: None)
    x32 = x.float()
    torch.manual_seed(2)
    want32 = torch.nn.functional.dropout(x32, 0.5, True)
    torch.manual_seed(2)
    assert torch.equal(dropout(x32, 0.5), want32)
