"""From a :class:`~elmokit.tasks.config.TaskConfig` to an untrained :class:`~elmokit.tasks.task_model.TaskModel`, in
named steps:

1. :func:`~elmokit.tasks.datasets.read_task_data` — the train/dev[/test] files;
2. :func:`task_labels` — the label set of the training file;
3. :func:`load_config_bilm` — the biLM (or the one given) and the record a saved model keeps of it;
4. :func:`add_static_tokens` — character data: each character's word (``data.segmenter``);
5. :func:`static_table` — the static vectors' vocabulary and table;
6. :func:`cache_layers` — the frozen biLM's layers of each file, computed once (or read from the disk cache);
7. :func:`build_model` — the seeded module (:func:`build_module`) in a :class:`TaskModel`.

Steps 1–6 make a :class:`PreparedTask` (:func:`prepare_task`), which several seeds of one config share: only step 7
runs again (``build_from_config(config, prepared=...)``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from elmokit.elmo import Elmo
from elmokit.errors import UsageError
from elmokit.modules.bilm import BiLM
from elmokit.tasks.config import TaskConfig
from elmokit.tasks.datasets import TaskData, char_words, read_task_data, segmenter_for
from elmokit.tasks.frozen_bilm import compute_features, describe_bilm, resolve_bilm
from elmokit.tasks.models import SentenceClassifier, SequenceTagger, TokenInputs
from elmokit.tasks.static import StaticVectors, build_vocab
from elmokit.tasks.task_model import TaskModel

__all__ = [
    "PreparedTask",
    "prepare_task",
    "build_from_config",
    "build_model",
    "build_module",
    "make_elmo",
    "task_labels",
    "load_config_bilm",
    "add_static_tokens",
    "static_table",
    "cache_layers",
]

logger = logging.getLogger(__name__)

Say = Callable[[str], None]


@dataclass
class PreparedTask:
    """What a config gives before its model is built (steps 1–6 of the module docstring); shared by several seeds.

    Attributes:
        config: the config it was prepared for (:meth:`check_fits` compares another with it).
        data: ``{"train", "dev"[, "test"]: TaskData}``, static tokens and cached layers filled in.
        labels: the K sorted training labels (tags or classes).
        bilm: the biLM (eval mode), or ``None`` without ELMo; bilm_record: its :func:`describe_bilm` record.
        segmenter: the character → word segmenter (``data.segmenter``), or ``None``.
        vocab: the static vocabulary (V words), or ``None``; table: its (V, dim) float32 vectors, or ``None``.
    """

    config: TaskConfig
    data: dict[str, TaskData]
    labels: list[str]
    bilm: BiLM | None = None
    bilm_record: dict | None = None
    segmenter: Callable[[str], list[str]] | None = None
    vocab: list[str] | None = None
    table: torch.Tensor | None = None

    def check_fits(self, config: TaskConfig) -> None:
        """Refuse a config that differs from :attr:`config` outside ``[train]`` (seeds, epochs… may differ).

        Raises:
            UsageError: naming the first section that differs.
        """
        mine, theirs = self.config.to_dict(), config.to_dict()
        for key in mine:  # "task" and the sections, in file order
            if key != "train" and mine[key] != theirs[key]:
                raise UsageError(
                    f"this PreparedTask was made for another config ({key} differs): prepare_task(config) for this one"
                )


def task_labels(config: TaskConfig, train: TaskData) -> list[str]:
    """The sorted set of training tags (tagging) or classes (classification)."""
    if config.task == "tag":
        return sorted({t for tags in train.targets for t in tags})
    return sorted(set(train.targets))


def load_config_bilm(config: TaskConfig, bilm: BiLM | None, say: Say) -> tuple[BiLM | None, dict | None]:
    """``(biLM, record)``: ``bilm`` if given, else ``bilm.model`` loaded; ``(None, None)`` without ELMo (a ``bilm``
    given is then ignored). Raises the loaders' errors (UsageError, MissingFileError, WeightsError)."""
    if not config.uses_elmo:
        return None, None
    b = config.bilm
    if bilm is None:
        say(f"loading biLM {b.model}")
        bilm = resolve_bilm(b.model, random_like=b.random_like, random_seed=b.random_seed)
    return bilm, describe_bilm(b.model, bilm, random_like=b.random_like, random_seed=b.random_seed)


def add_static_tokens(data: dict[str, TaskData], segment: Callable[[str], list[str]] | None) -> None:
    """With a segmenter, each character's static lookup string becomes its word (:func:`char_words`)."""
    if segment is not None:
        for part in data.values():
            part.static_tokens = char_words(part.tokens, segment)


def static_table(
    config: TaskConfig, data: dict[str, TaskData], say: Say
) -> tuple[list[str] | None, torch.Tensor | None]:
    """``(vocab, table)`` of ``static.vectors`` (``(None, None)`` for ``"none"``): the training words, plus the
    dev/test words the pretrained vectors know (frozen vectors are looked up, not learned, so no label is used); a
    random table covers the training words only. Table: (V, dim) float32.

    Raises:
        MissingFileError / DataError: the vectors file (from :meth:`StaticVectors.load`).
    """
    s = config.static
    if s.vectors == "none":
        return None, None

    def words(part: TaskData) -> list[list[str]]:
        return part.static_tokens if part.static_tokens is not None else part.tokens

    if s.vectors == "random":
        vocab = build_vocab(words(data["train"]))
        vectors = StaticVectors.random(vocab, s.dim, s.seed)
    else:
        vectors = StaticVectors.load(s.vectors)
        vocab = build_vocab([w for part in data.values() for w in words(part)])
    table = vectors.matrix_for(vocab)
    say(
        f"static vectors {s.vectors}: {len(vocab)} words, dim {table.shape[1]}, coverage "
        f"{100 * vectors.coverage(vocab):.1f} %"
    )
    return vocab, table


def cache_layers(config: TaskConfig, prepared: PreparedTask, say: Say, progress: bool) -> None:
    """A frozen biLM's layers of each data file (``TaskData.features``), computed once or read from the disk cache
    (``bilm.cache``); nothing for a fine-tuned biLM or none. ``progress``: a tqdm bar per file."""
    if prepared.bilm is None or config.bilm.fine_tune:
        return
    for name, part in prepared.data.items():
        start = time.perf_counter()
        part.features = compute_features(
            prepared.bilm,
            part.tokens,
            segmenter=prepared.segmenter,
            segmenter_name=config.data.segmenter,
            use_disk=config.bilm.cache,
            batch_size=config.bilm.batch_size,
            progress=f"biLM layers of {name}" if progress else False,
        )
        say(f"biLM layers of {name} ({len(part)} sentences): {time.perf_counter() - start:.1f} s")


def prepare_task(
    config: TaskConfig, *, bilm: BiLM | None = None, log: Say | None = None, progress: bool = False
) -> PreparedTask:
    """Steps 1–6: read the data, load the biLM (or use ``bilm``), the static vectors and the cached layers.

    Raises:
        MissingFileError / DataError: data files; UsageError / WeightsError: the biLM or vectors.
    """
    say = log or logger.info
    data = read_task_data(config)
    bilm, record = load_config_bilm(config, bilm, say)
    segment = segmenter_for(config.data.segmenter) if config.data.segmenter is not None else None
    add_static_tokens(data, segment)
    vocab, table = static_table(config, data, say)
    prepared = PreparedTask(config, data, task_labels(config, data["train"]), bilm, record, segment, vocab, table)
    cache_layers(config, prepared, say, progress)
    return prepared


def make_elmo(config: TaskConfig, bilm: BiLM | None) -> Elmo | None:
    """The task's :class:`~elmokit.Elmo` on ``bilm`` (one mix, two with ``bilm.at_output``), or ``None``."""
    if bilm is None:
        return None
    b = config.bilm
    return Elmo(
        bilm=bilm,
        num_output_representations=2 if b.at_output else 1,
        requires_grad=b.fine_tune,
        do_layer_norm=b.do_layer_norm,
        dropout=b.dropout,
        layer_norm_mask="tokens",
    )


def build_module(
    config: TaskConfig, n_labels: int, vocab: Sequence[str] | None, static_table: torch.Tensor | None, elmo: Elmo | None
) -> SequenceTagger | SentenceClassifier:
    """The config's :class:`TokenInputs` (static table, char CNN, ELMo) and tagger or classifier over them
    (initialised from torch's global RNG)."""
    cc = config.char_cnn
    char_cnn = (
        {"embedding_dim": cc.embedding_dim, "filters": cc.filters, "max_characters": cc.max_characters}
        if cc.enabled
        else None
    )
    inputs = TokenInputs(
        vocab,
        static_table,
        static_trainable=config.static.trainable,
        char_cnn=char_cnn,
        elmo=elmo,
        elmo_at_output=config.bilm.at_output,
    )
    m = config.model
    if config.task == "tag":
        return SequenceTagger(inputs, n_labels, hidden=m.hidden, layers=m.layers, dropout=m.dropout)
    return SentenceClassifier(inputs, n_labels, hidden=m.hidden, layers=m.layers, dropout=m.dropout, pooling=m.pooling)


def build_model(config: TaskConfig, prepared: PreparedTask, seed: int | None = None) -> TaskModel:
    """Step 7: the untrained :class:`TaskModel`, initialised from ``torch.manual_seed(seed)`` (default
    ``train.seed``)."""
    torch.manual_seed(config.train.seed if seed is None else seed)
    module = build_module(
        config, len(prepared.labels), prepared.vocab, prepared.table, make_elmo(config, prepared.bilm)
    )
    return TaskModel(config.task, module, prepared.labels, config, prepared.bilm_record, segmenter=prepared.segmenter)


def build_from_config(
    config: TaskConfig,
    *,
    bilm: BiLM | None = None,
    seed: int | None = None,
    log: Say | None = None,
    prepared: PreparedTask | None = None,
    progress: bool = False,
) -> tuple[TaskModel, dict[str, TaskData]]:
    """Read the data, load the biLM (or use ``bilm``) and the static vectors, compute (or load) the cached layers,
    and build the untrained model (the steps of the module docstring).

    Args:
        config: the task config.
        bilm: a biLM to use instead of ``bilm.model`` (for tests or a model already loaded), recorded under the
            config's name.
        seed: the model-initialisation seed (default ``train.seed``).
        prepared: a :func:`prepare_task` of this config (it may differ in ``[train]``), for several seeds: only the
            model is built anew.
        progress: a tqdm bar per data file while its biLM layers are computed (``elmokit tag|classify train`` shows
            them; minutes for CoNLL-2003 on 2 cores).

    Returns ``(model, {"train", "dev"[, "test"]: TaskData})``.

    Raises:
        MissingFileError / DataError: data files; UsageError / WeightsError: the biLM or vectors; UsageError:
        ``prepared`` for another config, or given with ``bilm``.
    """
    if prepared is None:
        prepared = prepare_task(config, bilm=bilm, log=log, progress=progress)
    elif bilm is not None:
        raise UsageError("give either bilm or prepared (which holds its biLM), not both")
    else:
        prepared.check_fits(config)
    return build_model(config, prepared, seed), prepared.data
