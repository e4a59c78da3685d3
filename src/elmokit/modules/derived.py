"""Inference-time copies of weights in a faster layout, remade whenever a weight changes.

The token encoder and the LSTMs run without autograd on weights rearranged once (a contiguous (in, out) matrix with
the bias as one more row, an MKL-packed matrix). Such a copy must never go stale: it is keyed on every source
tensor's storage pointer, version counter (bumped by each in-place change: ``load_state_dict``, an optimiser step,
``mul_``), dtype and device, and rebuilt on any difference. It is not part of the state dict, and a pickled or
deep-copied module gets an empty cache. Writes through ``tensor.data`` (``w.data.copy_(…)``) do not bump the version
counter: after such writes call :meth:`elmokit.BiLM.clear_derived_weights` (a switch between ``BiLM.train()`` and
``eval()`` does).
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["DerivedWeights"]


class DerivedWeights:
    """A small cache of tensors computed from parameters, one entry per ``name``.

    ``get(name, sources, build)`` returns ``build()`` (run under ``torch.no_grad``), cached until one of ``sources``
    changes (see the module docstring). An entry is replaced whole, so threads racing to fill one both compute the
    same value and either result is kept: safe without a lock.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, object]] = {}

    @staticmethod
    def _key(sources: tuple[torch.Tensor, ...]) -> tuple:
        return tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in sources)

    def get(self, name: str, sources: tuple[torch.Tensor, ...], build: Callable[[], object]):
        key = self._key(sources)
        hit = self._entries.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            value = build()
        self._entries[name] = (key, value)
        return value

    # A copy (pickling to a worker process, copy.deepcopy) starts empty: the entries are remade on first use, and
    # some (MKL-packed matrices) cannot be pickled at all.
    def __getstate__(self) -> dict:
        return {"_entries": {}}

    def __setstate__(self, state: dict) -> None:
        self._entries = {}

    def __deepcopy__(self, memo: dict) -> "DerivedWeights":
        return DerivedWeights()

    def clear(self) -> None:
        """Drop every copy (the memory they hold is freed)."""
        self._entries.clear()
