"""elmokit: ELMo deep contextualized word representations (Peters et al., NAACL 2018) in modern PyTorch.

Pipeline: tokens → :func:`batch_to_ids` (character ids) → :class:`BiLM` (char CNN, highway, projection, forward and
backward LSTM stacks) → L+1 layers → :class:`ScalarMix` → downstream tasks. :class:`Elmo` bundles a frozen biLM
with K mixes behind AllenNLP's signature.

The names below are imported on first use (PEP 562 ``__getattr__``; ``from elmokit import Elmo`` works as before):
``import elmokit`` itself loads no torch, so the ``elmokit`` command installs its Ctrl-C/SIGTERM handler within
milliseconds of starting instead of after the ~2 s torch import (see :func:`elmokit.cli.entry`).
"""

from __future__ import annotations

import importlib

from elmokit.modules import threads as _threads

_threads.configure_openmp()  # before anything imports torch (OpenMP reads its settings once, when torch loads)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~40 ms of start-up); type checkers know it

__version__ = "0.1.0"

#: public name → the submodule that defines it
_EXPORTS = {
    "CharVocabulary": "characters",
    "batch_to_ids": "characters",
    "PRESETS": "config",
    "CharCNNConfig": "config",
    "ElmoConfig": "config",
    "LSTMConfig": "config",
    "elmo_medium": "config",
    "elmo_original": "config",
    "elmo_original_5b": "config",
    "elmo_small": "config",
    "elmo_tiny": "config",
    "Elmo": "elmo",
    "TokenVectorCache": "elmo",
    "Embedder": "embedding",
    "CheckpointError": "errors",
    "ConfigError": "errors",
    "DataError": "errors",
    "ElmoError": "errors",
    "InputError": "errors",
    "MissingFileError": "errors",
    "UsageError": "errors",
    "WeightsError": "errors",
    "BiLM": "modules.bilm",
    "BiLMOutput": "modules.bilm",
    "ScalarMix": "modules.scalar_mix",
    "load_native": "weights.native",
    "load_pretrained_bilm": "weights.native",
    "save_pretrained": "weights.native",
    "export_original": "weights.original",
    "load_original": "weights.original",
}

__all__ = [
    "BiLM",
    "BiLMOutput",
    "Elmo",
    "Embedder",
    "ScalarMix",
    "batch_to_ids",
    "CharVocabulary",
    "ElmoConfig",
    "CharCNNConfig",
    "LSTMConfig",
    "PRESETS",
    "elmo_small",
    "elmo_medium",
    "elmo_original",
    "elmo_original_5b",
    "elmo_tiny",
    "load_original",
    "export_original",
    "save_pretrained",
    "load_native",
    "load_pretrained_bilm",
    "TokenVectorCache",
    "ElmoError",
    "UsageError",
    "ConfigError",
    "InputError",
    "MissingFileError",
    "WeightsError",
    "CheckpointError",
    "DataError",
]


def __getattr__(name: str) -> object:
    """Import a public name's submodule on first use (lazy: CLI start-up, see the module docstring)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from elmokit.characters import CharVocabulary, batch_to_ids
    from elmokit.config import (
        PRESETS,
        CharCNNConfig,
        ElmoConfig,
        LSTMConfig,
        elmo_medium,
        elmo_original,
        elmo_original_5b,
        elmo_small,
        elmo_tiny,
    )
    from elmokit.elmo import Elmo, TokenVectorCache
    from elmokit.embedding import Embedder
    from elmokit.errors import (
        CheckpointError,
        ConfigError,
        DataError,
        ElmoError,
        InputError,
        MissingFileError,
        UsageError,
        WeightsError,
    )
    from elmokit.modules.bilm import BiLM, BiLMOutput
    from elmokit.modules.scalar_mix import ScalarMix
    from elmokit.weights.native import load_native, load_pretrained_bilm, save_pretrained
    from elmokit.weights.original import export_original, load_original
