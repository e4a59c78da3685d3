"""Batch-invariant inference: a sentence's vectors the same bits alone, in any batch, in any order, at any padding.

A matrix product whose blocking changes with the number of rows (MKL's and oneDNN's GEMMs choose their kernels and
their reduction splits by shape) rounds a row differently in another batch, and the biLM's LSTMs amplify those last
bits over a long sentence (issue 39: 1.8e-3 at 160 tokens on the small shape). With the batch-invariant path every
product of float32 CPU inference computes each row in one fixed order, whatever shares the call:

* the char CNN's convolutions, the highway layers, the token projection and the LSTMs' input products run through
  :func:`linear` (the C++ kernel ``linear_rows`` of :mod:`elmokit.modules.native`: each output summed as
  b + Σ over chunks of 128 inputs of Σ x·w in input order, rows in panels of 12 computed by one code path; the
  weights packed once and cached by :class:`~elmokit.modules.derived.DerivedWeights`);
* the highway layers' gate and carry are the kernel's epilogue (``highway_rows_invariant``);
* the LSTMs' recurrent product, gates and projection run in the fused step loop (``lstm_layer_xw``) for every row
  count, whose projection partial sums are kept per fixed slice of units (never per thread), so one thread, two
  threads and ``--workers 2`` give the same bits.

A char CNN with the ``tanh`` activation (not the released models' relu) keeps ATen's tanh, whose vectorised and
scalar forms may differ in the last bit by an element's position. Everything else on that path is elementwise (exact
IEEE operations, or the kernels' own σ/tanh per element), a copy, a gather or a max. Where the kernels cannot run
(``ELMOKIT_NATIVE=0``, no compiler, autograd, another dtype or device, bf16 autocast, LSTM sizes H or P not multiples
of 16) the ATen paths run, batch-independent only up to float rounding (docs/explanation/numerics.md).

An option, off by default: at batch 64 it ran at 0.72× the default's tokens/s (small shape, one thread, shared
machine; batch-1 latency the same), the LSTM's step loop at 64 rows being slower in the fused kernel than MKL's batched
GEMMs and the highway products at about 75 % of MKL's rate (docs/explanation/numerics.md).
:func:`batch_invariant` turns it on (or off) for a block of code in this thread or task (a context variable):
``Embedder(..., batch_invariant=True)``, ``Elmo(..., batch_invariant=True)``, ``elmokit embed --batch-invariant`` and
``elmokit serve --batch-invariant`` use it; ``ELMOKIT_BATCH_INVARIANT=1`` makes it the process default.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

import torch

from elmokit.modules import native, precision

__all__ = ["enabled", "batch_invariant", "pack_linear", "linear", "highway", "lstm_layer", "kernels_for"]

_override: contextvars.ContextVar[bool | None] = contextvars.ContextVar("elmokit_batch_invariant", default=None)


def default() -> bool:
    """The process default: off unless ``ELMOKIT_BATCH_INVARIANT=1``."""
    return os.environ.get("ELMOKIT_BATCH_INVARIANT", "0") == "1"


def enabled() -> bool:
    """Whether inference here should take the batch-invariant path (where its kernels can run)."""
    value = _override.get()
    return default() if value is None else value


@contextlib.contextmanager
def batch_invariant(on: bool | None = True) -> Iterator[None]:
    """Within the block (this thread or task), the batch-invariant path on or off (``None``: the process
    default)."""
    token = _override.set(None if on is None else bool(on))
    try:
        yield
    finally:
        _override.reset(token)


def kernels_for(*tensors: torch.Tensor):
    """The native extension when the batch-invariant path is on and may run on ``tensors`` (float32 CPU, no
    autograd wanted, not under bf16 autocast), else ``None``."""
    if not enabled() or not native.usable(*tensors):
        return None
    if precision.low_precision_dtype("cpu") is not None:  # bf16 autocast: its own paths
        return None
    module = native.kernels()
    return module if module is not None and hasattr(module, "linear_rows") else None


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """An (K, N) weight (x·W layout) and (N,) bias (zeros when ``None``) → the kernel's layout: (NB, K, 32) with
    NB = ⌈N / 32⌉ (block b holds columns 32b … 32b + 31, zero columns after N) and the (NB, 32) bias."""
    k, n = weight.shape
    nb = (n + 31) // 32
    w = torch.zeros(k, nb * 32, dtype=torch.float32)
    w[:, :n] = weight
    b = torch.zeros(nb * 32, dtype=torch.float32)
    if bias is not None:
        b[:n] = bias
    return w.view(k, nb, 32).permute(1, 0, 2).contiguous(), b.view(nb, 32).contiguous()


def linear(module, x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor], n: int) -> torch.Tensor | None:
    """x (M, K) float32 → (M, n) = x·W + b by the kernel, each row's value independent of the others (see the module
    docstring); ``packed`` from :func:`pack_linear`. ``None`` when x holds inf or NaN (the caller's ATen path)."""
    y = module.linear_rows(x.contiguous(), *packed)
    if y is None:
        return None
    return y if y.shape[1] == n else y[:, :n]


def highway(module, x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor | None:
    """One highway layer by the kernel for any rows: x (M, F), ``packed`` from
    :func:`~elmokit.modules.native.pack_highway`; ``None`` when x holds inf or NaN."""
    return module.highway_rows_invariant(x.contiguous(), *packed)


def lstm_layer(
    module,
    lstm,
    k: int,
    x: torch.Tensor,
    batch_sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_in: torch.Tensor,
    w_hh_ifoj: torch.Tensor,
    clips: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Layer ``k`` of the :class:`~elmokit.modules.lstm.BiLSTM` ``lstm`` by the batch-invariant kernels: the input
    products x·W_ih + b by ``linear_rows``, the step loop by ``lstm_layer_xw`` for any row count (as
    :meth:`BiLSTM._run_layer_inference`: x (2, N, P) packed time-major, c (2, B, H), h (2, B, P); ``w_in``
    (2, P + 1, 4H) and ``w_hh_ifoj`` (2, P, 4H) from :meth:`BiLSTM._inference_weights`) → (out (2, N, P), final c,
    final h); ``None`` for inf or NaN inputs. The packed weights are cached in ``lstm._derived``."""
    p, g = lstm.projection_dim, 4 * lstm.hidden_dim
    sources = (lstm.weight_ih[k], lstm.bias[k], lstm.weight_hh[k])
    packed_in = lstm._derived.get(
        f"invariant{k}", sources, lambda: [pack_linear(w_in[d, :p], w_in[d, p]) for d in (0, 1)]
    )
    packed_hh = lstm._derived.get(f"native{k}", sources, lambda: native.pack_lstm(w_hh_ifoj))
    xw = []
    for d in range(2):
        y = linear(module, x[d], packed_in[d], g)
        if y is None:
            return None
        xw.append(y)
    sizes = [n for n in batch_sizes if n > 0]
    w_proj = lstm.weight_proj[k].contiguous()
    result = module.lstm_layer_xw(torch.stack(xw), sizes, c.contiguous(), h.contiguous(), packed_hh, w_proj, *clips)
    return tuple(result) if result else None
