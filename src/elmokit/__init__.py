"""elmokit: ELMo deep contextualized word representations (Peters et al., NAACL 2018) in modern PyTorch.

Pipeline: tokens → :func:`batch_to_ids` (character ids) → :class:`BiLM` (char CNN, highway, projection, forward and
backward LSTM stacks) → L+1 layers → :class:`ScalarMix` → downstream tasks. :class:`Elmo` bundles a frozen biLM
with K mixes behind AllenNLP's signature.
"""
from . import threads as _threads

_threads.configure_openmp()  # before anything below imports torch (OpenMP reads its settings once, at load)

from .characters import CharVocabulary, batch_to_ids
from .config import (
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
from .elmo import Elmo, TokenVectorCache
from .embedding import Embedder
from .errors import (CheckpointError, ConfigError, DataError, ElmoError, InputError, MissingFileError, UsageError,
                     WeightsError)
from .modules.bilm import BiLM, BiLMOutput
from .modules.scalar_mix import ScalarMix
from .weights.native import load_native, load_pretrained_bilm, save_pretrained
from .weights.original import export_original, load_original

__version__ = "0.1.0"

__all__ = [
    "BiLM", "BiLMOutput", "Elmo", "Embedder", "ScalarMix", "batch_to_ids", "CharVocabulary",
    "ElmoConfig", "CharCNNConfig", "LSTMConfig", "PRESETS",
    "elmo_small", "elmo_medium", "elmo_original", "elmo_original_5b", "elmo_tiny",
    "load_original", "export_original", "save_pretrained", "load_native", "load_pretrained_bilm",
    "TokenVectorCache",
    "ElmoError", "UsageError", "ConfigError", "InputError", "MissingFileError", "WeightsError", "CheckpointError",
    "DataError",
]
