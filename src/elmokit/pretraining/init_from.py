"""Continued pretraining: the model a run starts from (``TrainConfig.init_from``, ``elmokit train --init-from``).

Accepted, as everywhere else in elmokit (:func:`elmokit.weights.native.load_pretrained_bilm`): a released model name
(downloaded once), an original-format folder (one ``*options*.json`` + one weight ``*.hdf5``, as bilm-tf and AllenNLP
ship them) or a native folder (``config.json`` + ``model.safetensors``; with ``vocab.txt`` and ``softmax.*`` tensors
when ``elmokit train`` wrote it). What the run keeps (:func:`apply_init_model`):

* the biLM (character CNN, highway, projection, both LSTM stacks) and its architecture: the run's ``model`` must be
  unset or the same architecture (:func:`check_architecture`);
* the character scheme: a UTF-8-byte model trains on bytes (``char_vocab`` must be off), a character-vocabulary model
  keeps its ``chars.txt`` (characters it has no id for become its unknown-character id);
* the softmax only when the init model is a native LM whose ``vocab.txt`` is exactly the run's vocabulary; otherwise a
  new softmax over the run's vocabulary is initialised (the released models' softmax is not part of their HDF5).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from elmokit.characters import CharVocabulary
from elmokit.config import ElmoConfig
from elmokit.errors import ConfigError, UsageError, WeightsError
from elmokit.modules.bilm import BiLM
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.vocabulary import Vocabulary
from elmokit.weights import check_state_fits
from elmokit.weights.native import CONFIG_NAME, WEIGHTS_NAME, load_pretrained_bilm, resolve_model_name

__all__ = ["InitModel", "load_init_model", "check_architecture", "apply_init_model", "describe_architecture"]

logger = logging.getLogger(__name__)


@dataclass
class InitModel:
    """A loaded init model.

    Attributes:
        source: the name or folder as given. bilm: its :class:`BiLM` (CPU, float32).
        vocab / softmax: the output vocabulary and ``{"weight" (V, P), "bias" (V,)}`` of a native LM folder, else
            ``None``.
    """

    source: str
    bilm: BiLM
    vocab: Vocabulary | None = None
    softmax: dict[str, torch.Tensor] | None = None

    @property
    def config(self) -> ElmoConfig:
        return self.bilm.config

    @property
    def char_vocab(self) -> CharVocabulary | None:
        return self.bilm.char_vocab


def load_init_model(name_or_path: str) -> InitModel:
    """Load the biLM (and, from a native LM folder, its vocabulary and softmax) of ``name_or_path``: a released name,
    a zoo name (``elmokit-en``: its folder in ``$ELMOKIT_CACHE/zoo``, softmax and vocabulary included) or a folder.

    Raises:
        UsageError / MissingFileError: not a released or zoo name nor a model folder, or a zoo model not built (as
            ``load_pretrained_bilm``).
        ConfigError / WeightsError: the options or weights cannot be read or do not fit each other (names the file and
            the tensor); a native folder whose softmax does not fit its ``vocab.txt``.
    """
    bilm = load_pretrained_bilm(name_or_path)
    init = InitModel(str(name_or_path), bilm)
    folder = Path(resolve_model_name(name_or_path))  # a zoo name (elmokit-en) → its folder, with vocab and softmax
    if folder.is_dir() and (folder / CONFIG_NAME).is_file() and (folder / "vocab.txt").is_file():
        with safe_open(str(folder / WEIGHTS_NAME), framework="pt") as fh:
            keys = set(fh.keys())
            if {"softmax.weight", "softmax.bias"} <= keys:
                init.softmax = {"weight": fh.get_tensor("softmax.weight"), "bias": fh.get_tensor("softmax.bias")}
        if init.softmax is not None:
            init.vocab = Vocabulary.from_file(folder / "vocab.txt")
            shape = tuple(init.softmax["weight"].shape)
            want = (len(init.vocab), bilm.config.lstm.projection_dim)
            if shape != want or tuple(init.softmax["bias"].shape) != (want[0],):
                raise WeightsError(
                    f"--init-from {folder}: softmax.weight has shape {shape} but vocab.txt and "
                    f"config.json imply {want}: the folder's files do not belong together"
                )
    return init


def describe_architecture(config: ElmoConfig) -> str:
    """A one-line summary: LSTM cell/projection, layers, filters, highway layers, character scheme."""
    cc, ls = config.char_cnn, config.lstm
    scheme = "UTF-8 bytes" if cc.char_vocab_size is None else f"a character vocabulary of {cc.char_vocab_size}"
    return (
        f"LSTM {ls.dim}/{ls.projection_dim} × {ls.n_layers} layers, {cc.n_filters} char filters, "
        f"{cc.n_highway} highway, {cc.max_characters_per_token} characters a token, {scheme}"
    )


def _architecture_key(config: ElmoConfig) -> dict:
    options = config.to_options()
    options = {"lstm": dict(options["lstm"]), "char_cnn": dict(options["char_cnn"])}
    options["char_cnn"].pop("char_vocab_size", None)
    if options["char_cnn"].get("n_characters") in (261, 262):  # the same 261 stored rows (with/without padding row)
        options["char_cnn"]["n_characters"] = 262
    return options


def check_architecture(init: InitModel, model: ElmoConfig | None, char_vocab: bool) -> None:
    """Check that the run's own model options and character mode fit the init model.

    Raises:
        UsageError: ``model`` is given and is another architecture than the init model's (names both); the run asks
            for a character vocabulary (``char_vocab``, ``--char-vocab``) but the init model reads UTF-8 bytes.
    """
    if model is not None and _architecture_key(model) != _architecture_key(init.config):
        raise UsageError(
            f"the model options (--preset/--options, TrainConfig.model: {describe_architecture(model)}) conflict "
            f"with --init-from {init.source} ({describe_architecture(init.config)}): continued pretraining keeps the "
            "init model's architecture; drop --preset/--options"
        )
    if char_vocab and init.char_vocab is None:
        raise UsageError(
            f"--char-vocab (TrainConfig.char_vocab) asks for a character vocabulary, but --init-from {init.source} "
            "reads UTF-8 bytes (the original character scheme) and was not trained with one: drop --char-vocab"
        )


def apply_init_model(lm: BidirectionalLM, init: InitModel) -> bool:
    """Copy the init model's biLM into ``lm`` (built with its architecture and character vocabulary) and its softmax
    when ``lm``'s vocabulary is the init model's. Returns whether the softmax was kept. A stored start state of the
    init model (:attr:`~elmokit.modules.bilm.BiLM.start_state`, a window-trained model's) is not copied: the run
    trains from zeros as every run does, and a window-trained run computes its own at the end.

    Raises:
        WeightsError: the init model's tensors do not fit ``lm`` (names the tensor and both shapes).
        ConfigError: ``lm`` reads another character vocabulary than the init model.
    """
    if (lm.char_vocab is None) != (init.char_vocab is None) or (
        lm.char_vocab is not None and list(lm.char_vocab.characters) != list(init.char_vocab.characters)
    ):
        raise ConfigError(f"--init-from {init.source}: the run's character vocabulary is not the init model's")
    state = init.bilm.state_dict()
    check_state_fits(
        lm.bilm.state_dict(),
        state,
        f"--init-from {init.source}",
        advice="the run's model was not built with the init model's architecture",
    )
    lm.bilm.load_state_dict(state)
    if init.softmax is not None and init.vocab is not None and init.vocab == lm.vocab:
        lm.softmax.load_state_dict(init.softmax)
        logger.info("--init-from %s: biLM and softmax kept (the same vocabulary of %d)", init.source, len(lm.vocab))
        return True
    why = "its vocabulary differs" if init.vocab is not None else "it has no softmax"
    logger.info(
        "--init-from %s: biLM kept; a new softmax over the run's vocabulary of %d (%s)", init.source, len(lm.vocab), why
    )
    return False
