"""Word and sentence vectors from biLM layers: a chosen layer or a fixed mix, pooled over real tokens only.

The biLM gives, per batch, ``layers`` (B, L+1, T, 2P) float and a ``mask`` (B, T) bool (True = real token; the
positions past a sentence's end are padding, zero in ``layers``). What this module makes of them:

* **layer selection** (:class:`LayerSpec`): ``"all"`` keeps the L+1 layers; ``"top"`` the last one (the top biLSTM
  layer); ``"average"`` their plain mean (AllenNLP's ``elmo --average``); an ``int`` k layer k (0 = the context-free
  token layer); a sequence of L+1 floats w the fixed mix ``sum_j w_j h_j`` (the weights as given, not
  softmax-normalised: Peters et al. (2018) eq. (1) with ``s_j`` and ``gamma`` already applied and frozen).
* **pooling** over the time axis: ``"none"`` (one vector per token), ``"mean"`` or ``"max"`` — both over the real
  positions only (the mask), so a sentence's vector never depends on how much padding its batch had. A sentence with
  no real position (an empty sentence without its boundaries) pools to a vector of zeros.

Selection comes first, then pooling: ``max`` of a mix is the max of the mixed vectors (max does not commute with the
mix; mean does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from elmokit.errors import UsageError, UsageTypeError, option_wording

__all__ = [
    "POOL_MODES",
    "LAYER_NAMES",
    "LayerSpec",
    "OutputSpec",
    "masked_mean",
    "masked_max",
    "pool",
    "select_layers",
    "parse_layers",
]

POOL_MODES = ("none", "mean", "max")
LAYER_NAMES = ("all", "top", "average")
DTYPES = ("float32", "float16")


def _time_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) mask → broadcastable to x (B, …, T, D) (time on dim -2)."""
    if mask.dim() != 2 or x.dim() < 3 or x.shape[0] != mask.shape[0] or x.shape[-2] != mask.shape[1]:
        raise UsageError(
            f"pooling needs x (B, …, T, D) and mask (B, T) with the same B and T, got x "
            f"{tuple(x.shape)} and mask {tuple(mask.shape)}"
        )
    return mask.bool().view(mask.shape[0], *([1] * (x.dim() - 3)), mask.shape[1], 1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real positions of the time axis (dim -2).

    Args:
        x: (B, …, T, D) float, e.g. the biLM's layers (B, L+1, T, 2P) or one mix (B, T, 2P).
        mask: (B, T) bool, True = real token.
    Returns:
        (B, …, D) in ``x``'s dtype: ``sum_t mask_t x_t / sum_t mask_t``; zeros for a row with no real position.
    Raises:
        UsageError: shapes that do not line up.
    """
    m = _time_mask(x, mask)
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=-2)
    count = m.sum(dim=-2).clamp(min=1).to(x.dtype)
    return total / count


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Element-wise max over the real positions of the time axis (dim -2); padding never wins, even where every
    real value is negative. ``x`` (B, …, T, D), ``mask`` (B, T) → (B, …, D); zeros for a row with no real position.

    Raises:
        UsageError: shapes that do not line up."""
    m = _time_mask(x, mask)
    lowest = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    best = torch.where(m, x, lowest).amax(dim=-2) if x.shape[-2] else x.new_zeros(x.shape[:-2] + x.shape[-1:])
    return torch.where(m.any(dim=-2), best, torch.zeros((), dtype=x.dtype, device=x.device))


def pool(x: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """``mode`` ``"mean"`` → :func:`masked_mean`, ``"max"`` → :func:`masked_max`, ``"none"`` → ``x`` unchanged.

    Raises:
        UsageError: an unknown mode."""
    if mode == "mean":
        return masked_mean(x, mask)
    if mode == "max":
        return masked_max(x, mask)
    if mode == "none":
        return x
    raise UsageError(f"pool must be one of {POOL_MODES}, got {mode!r}")


@dataclass(frozen=True)
class LayerSpec:
    """Which layers, or which fixed mix of them, to output (see the module docstring).

    ``kind`` is ``"all"``, ``"top"``, ``"average"``, ``"layer"`` (``index`` set) or ``"mix"`` (``weights`` set)."""

    kind: str
    index: int | None = None
    weights: tuple[float, ...] | None = None

    def check(self, num_layers: int) -> LayerSpec:
        """Raise :class:`UsageError` unless this spec fits a model with ``num_layers`` = L+1 layers."""
        if self.kind == "layer" and not 0 <= int(self.index) < num_layers:
            raise UsageError(
                f"{option_wording(f'--layers {self.index}', f'layers={self.index}')} is not a layer of this model: it "
                "has layers 0 (token layer) to "
                f"{num_layers - 1} (top)"
            )
        if self.kind == "mix" and len(self.weights) != num_layers:
            raise UsageError(
                f"a fixed mix ({option_wording('--layers', 'layers')}) needs one weight per layer: this model has "
                f"{num_layers} layers (0 = token layer), got {len(self.weights)} weights {list(self.weights)}"
            )
        return self

    def text(self) -> str:
        """The spelling :func:`parse_layers` reads back: ``all``, ``2``, ``0.2,0.3,0.5``."""
        if self.kind == "layer":
            return str(self.index)
        if self.kind == "mix":
            return ",".join(repr(float(w)) for w in self.weights)
        return self.kind


def parse_layers(value: object) -> LayerSpec:
    """``"all"`` | ``"top"`` | ``"average"`` | an int (or its digits, ``"2"``) | a sequence of floats (or
    ``"0.2,0.3,0.5"``) → :class:`LayerSpec`. The model's layer count is checked later (:meth:`LayerSpec.check`).

    Raises:
        UsageTypeError: (also a ``TypeError``) a value of another type (a bool, None, a dict, a list holding
            non-numbers); the message lists the forms.
        UsageError: a string or number that is none of the forms, a negative layer, an empty or non-finite mix."""
    if isinstance(value, LayerSpec):
        return value
    forms = (
        "all, top, average, a layer number (0 = token layer), or L+1 comma-separated weights of a fixed mix "
        "(e.g. 0.2,0.3,0.5)"
    )
    if isinstance(value, str):
        text = value.strip()
        if text in LAYER_NAMES:
            return LayerSpec(text)
        if "," in text:
            try:
                weights = tuple(float(w) for w in text.split(","))
            except ValueError:
                raise UsageError(f"layers {value!r}: expected {forms}") from None
            return parse_layers(weights)
        if text.isascii() and text.isdecimal():
            return LayerSpec("layer", index=int(text))
        raise UsageError(f"layers {value!r}: expected {forms}")
    if isinstance(value, bool):
        raise UsageTypeError(f"layers {value!r}: expected {forms}")
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise UsageError(f"layers {value}: a layer number is >= 0 (0 = token layer); expected {forms}")
        return LayerSpec("layer", index=int(value))
    if (
        isinstance(value, Sequence)
        and value
        and all(isinstance(w, (int, float, np.floating, np.integer)) and not isinstance(w, bool) for w in value)
    ):
        weights = tuple(float(w) for w in value)
        if not all(math.isfinite(w) for w in weights):
            raise UsageError(f"layers {list(value)}: mix weights must be finite numbers")
        return LayerSpec("mix", weights=weights)
    empty = isinstance(value, Sequence) and not value
    raise (UsageError if empty else UsageTypeError)(f"layers {value!r}: expected {forms}")


def select_layers(layers: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
    """Apply a :class:`LayerSpec` to ``layers`` (B, L+1, T, D) → (B, L+1, T, D) for ``all``, else (B, T, D)."""
    if spec.kind == "all":
        return layers
    if spec.kind == "top":
        return layers[:, -1]
    if spec.kind == "average":
        return layers.mean(dim=1)
    if spec.kind == "layer":
        return layers[:, spec.index]
    w = torch.tensor(spec.weights, dtype=layers.dtype, device=layers.device)
    return torch.einsum("l,bltd->btd", w, layers)


@dataclass(frozen=True)
class OutputSpec:
    """What one sentence's output array is: layer selection, pooling, boundaries, dtype.

    Attributes:
        layers: a :class:`LayerSpec` (see :func:`parse_layers`).
        pool: ``"none"`` | ``"mean"`` | ``"max"``.
        keep_sentence_boundaries: include the ``<S>``/``</S>`` positions (then n = tokens + 2, and pooling covers
            them too); AllenNLP's ``Elmo(keep_sentence_boundaries=...)``.
        dtype: ``"float32"`` or ``"float16"`` (cast last, after pooling in float32).

    Shapes per sentence of n positions, D = 2P: ``all`` (L+1, n, D), others (n, D); pooled: (L+1, D) or (D,).
    """

    layers: LayerSpec = LayerSpec("all")
    pool: str = "none"
    keep_sentence_boundaries: bool = False
    dtype: str = "float32"

    @classmethod
    def make(
        cls,
        layers: object = "all",
        pool: str = "none",
        keep_sentence_boundaries: bool = False,
        dtype: str = "float32",
        num_layers: int | None = None,
    ) -> OutputSpec:
        """Build and check a spec (``num_layers`` = L+1 checks a layer number or the mix length).

        Raises:
            UsageTypeError: (also a ``TypeError``) ``layers`` of the wrong type (see :func:`parse_layers`),
                ``keep_sentence_boundaries`` not a bool.
            UsageError: a bad value (names the option and the accepted values)."""
        spec = parse_layers(layers)
        if num_layers is not None:
            spec.check(num_layers)
        if pool not in POOL_MODES:
            raise UsageError(f"pool must be one of {POOL_MODES}, got {pool!r}")
        if not isinstance(keep_sentence_boundaries, bool):
            raise UsageTypeError(f"keep_sentence_boundaries must be True or False, got {keep_sentence_boundaries!r}")
        if dtype not in DTYPES:
            raise UsageError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        return cls(spec, pool, keep_sentence_boundaries, dtype)

    def empty(self, num_layers: int, dim: int) -> np.ndarray:
        """The array of a sentence with no position: zero-length, or zeros when pooled."""
        lead = (num_layers,) if self.layers.kind == "all" else ()
        shape = lead + ((dim,) if self.pool != "none" else (0, dim))
        return np.zeros(shape, dtype=self.dtype)

    def apply(self, layers: torch.Tensor, mask: torch.Tensor) -> list[np.ndarray]:
        """(B, L+1, T, D) layers and (B, T) mask → B NumPy arrays of this spec's shape and dtype (padding cut off)."""
        selected = select_layers(layers, self.layers)
        if self.pool != "none":
            out = pool(selected, mask, self.pool).float().cpu().numpy().astype(self.dtype, copy=False)
            return list(out)
        lengths = mask.sum(1).tolist()
        out = selected.float().cpu().numpy()
        if self.layers.kind == "all":
            return [out[i, :, :n].astype(self.dtype, copy=False) for i, n in enumerate(lengths)]
        return [out[i, :n].astype(self.dtype, copy=False) for i, n in enumerate(lengths)]

    def settings(self) -> dict:
        """A JSON-able description (stored with file outputs, compared on resume)."""
        return {
            "layers": self.layers.text(),
            "pool": self.pool,
            "keep_sentence_boundaries": self.keep_sentence_boundaries,
            "dtype": self.dtype,
        }
