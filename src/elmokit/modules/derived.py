"""Inference-time copies of weights in a faster layout, remade whenever a weight changes.

The token encoder and the LSTMs run without autograd on weights rearranged once (a contiguous (in, out) matrix, the
gates of the LSTMs reordered, the char CNN's filters side by side) and on the constant ``<S>``/``</S>`` vectors. Such a
copy must never go stale. An entry is used again only when, for every source tensor, all of these still hold:

* it is the **same tensor object** (held by a weak reference, so a new tensor that happens to get a freed tensor's
  address, as with ``torch.func.functional_call``, never matches);
* its storage pointer, **version counter** (bumped by each in-place change: ``load_state_dict``, ``mul_`` under
  ``no_grad``, foreach and for-loop optimiser steps), dtype and device are unchanged;
* no ``torch.optim`` optimiser has stepped since (a global step hook: **fused** optimiser steps, ``fused=True``, do
  not bump version counters).

Tensors without a version counter or storage (made under ``torch.inference_mode``; ``vmap``'s batched tensors) are
never cached: the copy is built for that call only. Not seen: writes through ``tensor.data`` (``w.data.copy_(…)``,
``torch.nn.utils.vector_to_parameters`` into a reused buffer) and writes by another process into shared memory;
after those call :meth:`elmokit.BiLM.clear_derived_weights` (a switch between ``BiLM.train()`` and ``eval()`` does).
The copies are not part of the state dict; a pickled or deep-copied module gets an empty cache.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

__all__ = ["DerivedWeights", "optimizer_steps", "sources_key", "same_sources"]

_optimizer_steps = 0


def _count_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


try:  # one global hook: every torch.optim step (fused ones included) invalidates every cached copy
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(_count_step)
except ImportError:  # a torch without global optimiser hooks: version counters only
    pass


def optimizer_steps() -> int:
    """How many ``torch.optim`` optimiser steps this process has taken (part of every cache key)."""
    return _optimizer_steps


def sources_key(sources: tuple[torch.Tensor, ...]) -> tuple | None:
    """The identity of ``sources`` as they are now (see the module docstring), or ``None`` when one cannot be tracked
    (an inference-mode or storage-less tensor). Compare two with :func:`same_sources`."""
    try:
        state = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in sources)
        refs = tuple(weakref.ref(t) for t in sources)
    except (RuntimeError, TypeError):  # inference-mode tensors (no version counter), storage-less tensors
        return None
    return refs, state, _optimizer_steps


def same_sources(key: tuple, cached: tuple) -> bool:
    """Whether two :func:`sources_key` results describe the same tensors, unchanged."""
    refs, state, steps = key
    old_refs, old_state, old_steps = cached
    return steps == old_steps and state == old_state and all(new() is old() for new, old in zip(refs, old_refs))


class DerivedWeights:
    """A small cache of tensors computed from parameters, one entry per ``name``.

    ``get(name, sources, build)`` returns ``build()`` (run under ``torch.no_grad``), cached until one of ``sources``
    changes (see the module docstring); sources that cannot be tracked give an uncached ``build()``. An entry is
    replaced whole, so threads racing to fill one both compute the same value and either result is kept: safe
    without a lock.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple, object]] = {}

    def cached(self, name: str, sources: tuple[torch.Tensor, ...], build: Callable[[], object]):
        """``build()`` cached under ``name`` as :meth:`get`, or ``None`` (nothing built) when ``sources`` cannot be
        tracked — for callers with a cheaper path than an uncached copy."""
        key = sources_key(sources)
        if key is None:
            return None
        hit = self._entries.get(name)
        if hit is not None and same_sources(key, hit[0]):
            return hit[1]
        with torch.no_grad():
            value = build()
        self._entries[name] = (key, value)
        return value

    def get(self, name: str, sources: tuple[torch.Tensor, ...], build: Callable[[], object]):
        value = self.cached(name, sources, build)
        if value is None:  # untracked sources: built for this call only
            with torch.no_grad():
                value = build()
        return value

    # A copy (pickling to a worker process, copy.deepcopy) starts empty: the entries are remade on first use.
    def __getstate__(self) -> dict:
        return {"_entries": {}}

    def __setstate__(self, state: dict) -> None:
        self._entries = {}

    def __deepcopy__(self, memo: dict) -> DerivedWeights:
        return DerivedWeights()

    def clear(self) -> None:
        """Drop every copy (the memory they hold is freed)."""
        self._entries.clear()
