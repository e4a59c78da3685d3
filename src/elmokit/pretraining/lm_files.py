"""A trained LM on disk: :func:`save_lm` writes the native folder (biLM, softmax, vocabulary), :func:`load_lm` reads it
back as a :class:`~elmokit.pretraining.objective.BidirectionalLM` (what ``elmokit train`` leaves in ``model/`` and
``best/``, and what perplexity, scoring and continued pretraining read)."""

from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import load_file

from elmokit.errors import MissingFileError, WeightsError
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.vocabulary import Vocabulary
from elmokit.weights.efml import check_has_lm_head
from elmokit.weights.native import WEIGHTS_NAME, load_native, resolve_model_name, save_pretrained

__all__ = ["save_lm", "load_lm"]


def save_lm(lm: BidirectionalLM, out_dir: str | os.PathLike) -> Path:
    """Save a trained LM in the native format: the biLM (loadable by :func:`elmokit.load_native`, ``Elmo``), the softmax
    (``softmax.weight``, ``softmax.bias``), ``vocab.txt`` and, in character-vocabulary mode, ``chars.txt``."""
    return save_pretrained(
        lm.bilm,
        out_dir,
        vocab_lines=lm.vocab.tokens,
        extra_tensors={f"softmax.{k}": v for k, v in lm.softmax.state_dict().items()},
    )


def load_lm(model_dir: str | os.PathLike) -> BidirectionalLM:
    """Load :func:`save_lm`'s folder (or a zoo model name, ``elmokit-en``) as a :class:`BidirectionalLM` (eval mode).

    Raises:
        MissingFileError: the folder lacks ``config.json``, the weights or ``vocab.txt``, or the weights hold no softmax
            (only an embedding model was saved); a zoo model that is not built.
        UsageError: an ELMoForManyLangs folder (no softmax in its releases).
        WeightsError: the softmax does not fit ``vocab.txt`` and the config.
    """
    model_dir = Path(resolve_model_name(model_dir))
    check_has_lm_head(model_dir)  # an ELMoForManyLangs folder: one line saying it has no softmax
    missing = [n for n in ("config.json", WEIGHTS_NAME, "vocab.txt") if not (model_dir / n).is_file()]
    if missing:
        raise MissingFileError(
            f"{model_dir} is not a trained LM folder (no {', '.join(missing)}): perplexity and "
            "scoring need the model/ folder that `elmokit train` writes (biLM + softmax + vocab)"
        )
    bilm = load_native(model_dir)
    vocab = Vocabulary.from_file(model_dir / "vocab.txt")
    tensors = load_file(str(model_dir / WEIGHTS_NAME))
    if "softmax.weight" not in tensors:
        raise MissingFileError(f"{model_dir}/{WEIGHTS_NAME} has no softmax: it is an embedding-only model")
    lm = BidirectionalLM(bilm.config, vocab, dropout=0.0, char_vocab=bilm.char_vocab)
    lm.bilm.load_state_dict(bilm.state_dict())
    lm.bilm.set_start_state(bilm.start_state, bilm.start_state_source)  # not in state_dict (see BiLM.start_state)
    if tuple(tensors["softmax.weight"].shape) != tuple(lm.softmax.weight.shape):
        raise WeightsError(
            f"{model_dir}: softmax.weight has shape {tuple(tensors['softmax.weight'].shape)} but "
            f"vocab.txt and the config imply {tuple(lm.softmax.weight.shape)}"
        )
    lm.softmax.load_state_dict({"weight": tensors["softmax.weight"], "bias": tensors["softmax.bias"]})
    return lm.eval()
