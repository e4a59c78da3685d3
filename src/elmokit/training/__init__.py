"""Deprecated: the pretraining code is :mod:`elmokit.pretraining` (renamed when downstream task training arrived).

``elmokit.training``, ``elmokit.training.trainer``, ``.lm`` (now ``pretraining.objective``), ``.perplexity`` and
``.checkpoint`` still import, as aliases of the same modules (so patching one patches the other), with a
``DeprecationWarning``.
"""
from __future__ import annotations

import sys
import warnings

from elmokit.pretraining import *  # noqa: F401,F403
from elmokit.pretraining import __all__ as _pretraining_all
from elmokit.pretraining import checkpoint, objective, perplexity, trainer

warnings.warn("elmokit.training is deprecated: import elmokit.pretraining instead (training.lm is "
              "pretraining.objective)", DeprecationWarning, stacklevel=2)

lm = objective
for _name, _module in (("trainer", trainer), ("lm", objective), ("perplexity", perplexity),
                       ("checkpoint", checkpoint)):
    sys.modules[f"{__name__}.{_name}"] = _module

__all__ = list(_pretraining_all) + ["trainer", "lm", "perplexity", "checkpoint"]
