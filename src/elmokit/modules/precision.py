"""Numeric precision of the biLM's computation: ``"fp32"`` (the default everywhere) or ``"bf16"`` (mixed precision).

``"bf16"`` runs the matrix products in bfloat16 under :func:`torch.autocast` (CPU or CUDA): the char CNN's
convolutions, the highway and projection layers, the LSTMs' input, recurrent and projection products, and the
softmax's logits. Everything else stays float32:

* the parameters themselves (the "master weights") and the optimiser's state: autocast casts a copy for each product;
* the LSTM gates' non-linearities, the **cell state**, the cell and projection **clips** and the carried state
  (:meth:`elmokit.modules.lstm.BiLSTM._run_layer_low_precision`): each step's recurrent product is added to the
  float32 input contribution, so the gates are computed from float32 sums;
* in training, the highway layers' σ, relu and carry (:class:`~elmokit.modules.highway.Highway`'s fused layer: one
  bfloat16 product into [transform | gate], the rest float32);
* the softmax's log-sum-exp and the losses (:mod:`elmokit.modules.softmax` computes them in float32), the loss sum,
  the gradient norm and its clipping (the gradients land in the float32 parameters' ``.grad``).

bfloat16 keeps float32's exponent range (no loss scaling is needed, unlike float16) with an 8-bit significand: each
product's inputs are rounded to a relative 2^-9, sums are accumulated in float32 by the BLAS/oneDNN kernels.

Source: mixed-precision training as in Micikevicius et al. 2018 ("Mixed precision training": fp32 master weights,
low-precision products), with bfloat16 in place of float16 (Kalamkar et al. 2019).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from elmokit.errors import ConfigError

__all__ = ["Precision", "PRECISIONS", "autocast", "check_precision", "gemm_rows", "low_precision_dtype"]

Precision = Literal["fp32", "bf16"]
#: the accepted names, the default first
PRECISIONS: tuple[str, ...] = ("fp32", "bf16")


def check_precision(precision: object, source: str = "precision") -> str:
    """Return ``precision`` when it is one of :data:`PRECISIONS`.

    Raises:
        ConfigError: naming ``source``, the value and the accepted names.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"{source} must be 'fp32' or 'bf16', got {precision!r}")
    return str(precision)


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context in which a forward pass runs at ``precision`` on ``device``: bfloat16 autocast for ``"bf16"`` (the
    device's type: ``cpu``, ``cuda``), a no-op for ``"fp32"``.

    Raises:
        ConfigError: an unknown precision, or ``"bf16"`` on a device type autocast does not support in bfloat16.
    """
    check_precision(precision)
    if precision == "fp32":
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    if device_type not in ("cpu", "cuda", "xpu", "mps"):
        raise ConfigError(f"precision 'bf16' is not available on device type {device_type!r} (cpu or cuda)")
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)


def low_precision_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast gives matrix products on ``device_type`` right now (``torch.bfloat16`` inside
    :func:`autocast` with ``"bf16"``), or ``None`` outside autocast."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def gemm_rows(n: int, dtype: torch.dtype, device_type: str) -> int:
    """The row count to run an ``n``-row matrix product at: ``n`` itself, except for bfloat16 on the CPU, where it is
    ``n`` rounded up to a multiple of 16 (``n`` < 256) or of 2^(⌊log₂ n⌋ − 3) (eight sizes an octave, at most
    12.5 % more rows).

    Why: torch runs bfloat16 products on the CPU through oneDNN, which JIT-compiles a kernel for every new shape and
    keeps it in its primitive cache. A training batch's token count changes every step, so every product over all of
    a batch's tokens compiled anew: 5–20 ms each, about 0.16 s of a 0.7–0.9 s step of the zoo recipe (issue 40,
    ``ONEDNN_VERBOSE=2``). Run on a few sizes, the kernels are compiled once each and reused. The caller pads the
    operand's extra rows with zeros (their outputs are ignored, and in a product that sums over the rows they add
    exact zeros). float32 products go through oneMKL, which compiles nothing per shape, so they keep ``n``.

    Args:
        n: rows (≥ 0).
        dtype: the product's dtype.
        device_type: ``"cpu"``, ``"cuda"``, …

    Returns:
        rows ≥ ``n``.
    """
    if dtype != torch.bfloat16 or device_type != "cpu" or n <= 0:
        return n
    quantum = 16 if n < 256 else 1 << (n.bit_length() - 4)
    return -(-n // quantum) * quantum
