"""Everything a training run is given, made from its :class:`~elmokit.pretraining.config.TrainConfig`: this process's
data parts, the vocabularies, the model (from ``init_from`` when given), the optimiser and the held-out sentences.

:func:`build_parts` makes them in that order (each a small step below);
:func:`elmokit.pretraining.trainer.build_trainer` hands them to :class:`~elmokit.pretraining.trainer.Trainer`. Every
step that may fail on one process only is shared (:meth:`~elmokit.pretraining.distributed.DistContext.agree`), so all
processes raise the same error.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch

from elmokit.characters import CharVocabulary
from elmokit.config import ElmoConfig
from elmokit.data.corpus import TextCorpus
from elmokit.errors import MissingFileError, UsageError
from elmokit.pretraining.config import TrainConfig
from elmokit.pretraining.data import (
    TrainingData,
    char_vocabulary_from_counts,
    parts_of_process,
    read_sentences,
    vocabulary_from_counts,
)
from elmokit.pretraining.distributed import DistContext, single_process
from elmokit.pretraining.init_from import InitModel, apply_init_model, check_architecture, load_init_model
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.resume import one_line
from elmokit.pretraining.run_folder import check_outside_patterns
from elmokit.vocabulary import Vocabulary

__all__ = ["TrainerParts", "build_parts", "make_optimizer"]

logger = logging.getLogger(__name__)


@dataclass
class TrainerParts:
    """What :func:`build_parts` made: the run's config (a validated copy, ``data_parts`` and, with ``init_from``, the
    architecture filled in), this process among the processes, the model on its device, the optimiser over it, this
    process's data parts, the held-out sentences (``None`` without ``valid_files``), and whether the init model's
    softmax was kept."""

    config: TrainConfig
    dist: DistContext
    lm: BidirectionalLM
    optimizer: torch.optim.Optimizer
    data: TrainingData
    valid: list[list[str]] | None
    init_softmax_kept: bool


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    """``config.optimizer`` over ``params``: Adagrad (initial accumulator 1.0, as bilm-tf) or Adam, at
    ``config.learning_rate``.

    On CPU and CUDA the optimiser is PyTorch's fused implementation (one pass over each parameter instead of one per
    arithmetic operation): the same update rule and the same state, deterministic, and several times faster on
    large parameters. A 196k-word softmax (25M weights) took 102 ms a step with the default ``foreach`` Adam and
    18 ms fused (2 threads, this project's CPU), about an eighth of the zoo recipe's step.
    """
    params = list(params)
    devices = {p.device.type for p in params}
    fused = {"fused": True} if devices and devices <= {"cpu", "cuda"} and len(devices) == 1 else {}
    if config.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=config.learning_rate, initial_accumulator_value=1.0, **fused)
    return torch.optim.Adam(params, lr=config.learning_rate, **fused)


def build_parts(config: TrainConfig, dist: DistContext | None = None) -> TrainerParts:
    """Make everything a :class:`~elmokit.pretraining.trainer.Trainer` is given from ``config`` (a copy of it is
    kept: the caller's object is not changed), on this process's share of the data.

    Steps: validate the config; load ``init_from`` (which gives the architecture); cut the data into ``data_parts``
    parts and open this process's (:func:`~elmokit.pretraining.data.parts_of_process`); the vocabulary (``vocab_file``,
    or counted part by part and added up over the processes); the character vocabulary (the init model's, or counted
    so); the model (initialised from ``seed`` without touching the global RNG, then the init model's weights); the
    optimiser; the held-out sentences.

    Raises: see :func:`elmokit.pretraining.trainer.build_trainer`.
    """
    dist = dist or single_process()
    config, init = _resolve_config(config, dist)
    device = dist.device_for(config.device)
    parts = parts_of_process(dist.rank, dist.world_size, config.data_parts)
    data = dist.agree(lambda: TrainingData(config, parts, config.data_parts))
    vocab, char_vocab, model_config = _vocabularies(config, data, dist, init)
    lm, kept_softmax = _make_model(config, model_config, vocab, char_vocab, init, device)
    optimizer = make_optimizer(config, lm.parameters())
    valid = None
    if config.valid_files:
        valid = dist.agree(lambda: read_sentences(config.valid_files, config.decode_errors))
    return TrainerParts(config, dist, lm, optimizer, data, valid, kept_softmax)


def _resolve_config(config: TrainConfig, dist: DistContext) -> tuple[TrainConfig, InitModel | None]:
    """A validated copy of ``config`` with the file patterns checked, the init model loaded (its architecture and
    character vocabulary taken over) and ``data_parts`` set (default: one per process); and the init model."""
    config = copy.copy(config).validate()
    check_outside_patterns(config.out_dir, config.train_files, "training pattern")
    if config.valid_files:
        check_outside_patterns(config.out_dir, config.valid_files, "held-out pattern (--valid-files)")
        dist.agree(lambda: _check_valid_patterns(config.valid_files))
    init = None
    if config.init_from is not None:
        init = dist.agree(lambda: load_init_model(config.init_from))
        check_architecture(init, config.model, config.char_vocab)
        config.model = copy.deepcopy(init.config)
        if init.char_vocab is not None and not config.char_vocab:
            logger.info("--init-from %s reads a character vocabulary (chars.txt): the run keeps it", config.init_from)
            config.char_vocab = True
    config.data_parts = config.data_parts or dist.world_size
    return config.validate(), init


def _check_valid_patterns(patterns) -> None:
    """Every held-out pattern matches a file (before the training text is read; the message names --valid-files)."""
    for pattern in patterns:
        try:
            TextCorpus(pattern)  # expands the pattern only; nothing is read yet
        except MissingFileError as exc:
            raise MissingFileError(f"the held-out text (valid_files, --valid-files): {exc}") from None


def _vocabularies(
    config: TrainConfig, data: TrainingData, dist: DistContext, init: InitModel | None
) -> tuple[Vocabulary, CharVocabulary | None, ElmoConfig]:
    """The word vocabulary (``vocab_file``, or counted part by part and added up over the processes), the character
    vocabulary (the init model's, counted so in ``char_vocab`` mode, else ``None``) and the model's config (with the
    character vocabulary's size)."""
    counts = None
    if config.vocab_file is None or (config.char_vocab and init is None):
        mine = dist.agree(data.counts)
        counts = [c for gathered in dist.all_gather_object(mine) for c in gathered]
    if config.vocab_file:
        vocab = dist.agree(lambda: Vocabulary.from_file(config.vocab_file))
    else:
        vocab = vocabulary_from_counts(counts, config.min_count, config.max_vocab)
    model_config = copy.deepcopy(config.model)
    char_vocab: CharVocabulary | None = None
    if init is not None:
        char_vocab = init.char_vocab
    elif config.char_vocab:
        char_vocab = char_vocabulary_from_counts(counts, model_config.char_cnn.max_characters_per_token)
        model_config.char_cnn.char_vocab_size = char_vocab.vocab_size
    return vocab, char_vocab, model_config


def _make_model(
    config: TrainConfig,
    model_config: ElmoConfig,
    vocab: Vocabulary,
    char_vocab: CharVocabulary | None,
    init: InitModel | None,
    device: torch.device,
) -> tuple[BidirectionalLM, bool]:
    """The model, initialised from ``config.seed`` without touching the global RNG, then given the init model's
    weights (when there is one), on ``device``; and whether the init model's softmax was kept.

    Raises:
        UsageError: the device cannot be used here (e.g. ``mps`` on a build without it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        lm = BidirectionalLM(model_config, vocab, dropout=config.dropout, char_vocab=char_vocab)
    kept_softmax = apply_init_model(lm, init) if init is not None else False
    try:
        lm.to(device)
    except RuntimeError as exc:  # e.g. "mps" on a build without MPS support
        raise UsageError(
            f"device {config.device!r} cannot be used here ({one_line(exc)}): use auto, cpu, cuda or cuda:N"
        ) from None
    return lm, kept_softmax
