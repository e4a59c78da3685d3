"""Downstream tasks on frozen ELMo: sequence tagging (NER, POS) and sentence classification (SST, …).

The pipeline (data flows one way; the biLM's pretraining code is elsewhere, in :mod:`elmokit.pretraining`)::

    data file ──readers──▶ sentences (tokens, tags/label, file:line)
        │                        │
        │                        ├──▶ static.build_vocab / StaticVectors ──▶ v_w table (word2vec, random, none)
        │                        └──▶ features.compute_layer_features(biLM) ──▶ LayerFeatures (L+1 layers, cached)
        ▼
    datasets.TaskData ──▶ models.TokenInputs: x_t = [v_w; charCNN(w); ScalarMix(layers)] ──▶ SequenceTagger
                                                                                           (BiLSTM + CRF)
                                                                                      or SentenceClassifier
                                                                                           (BiLSTM + pooling)
        ──▶ training.fit (Adam, clipping, early stopping) ──▶ TaskModel.predict / evaluate (metrics, seqeval)
        ──▶ report (Markdown/JSON tables, layer-weight plots)

Modules:

* :mod:`~elmokit.tasks.readers` — CoNLL-2003 (IOB1 → BIO/BIOES), CoNLL-U, Chinese character NER, labelled sentences;
  :mod:`~elmokit.tasks.tag_schemes` — tag-scheme conversion and checking (IOB1 / BIO / BIOES / BMES);
* :mod:`~elmokit.tasks.metrics` — entity F1 per type (seqeval), accuracy;
* :mod:`~elmokit.tasks.static` — static word vectors (the zoo's word2vec, a vectors file, random);
* :mod:`~elmokit.tasks.features` — the frozen biLM's layers computed once per dataset; the random-biLM control;
* :mod:`~elmokit.tasks.models` — :class:`TokenInputs`, :class:`SequenceTagger`, :class:`SentenceClassifier`
  (they take an :class:`~elmokit.Elmo` module, live or on cached layers);
* :mod:`~elmokit.tasks.datasets` — :class:`TaskData`, reading a config's files, character → word segmentation;
* :mod:`~elmokit.tasks.frozen_bilm` — the task's biLM: loading, its record and fingerprint check, the feature cache;
* :mod:`~elmokit.tasks.task_model` — :class:`TaskModel` (prepare, predict, evaluate);
* :mod:`~elmokit.tasks.building` — a config → :class:`PreparedTask` → untrained model, in named steps;
* :mod:`~elmokit.tasks.training` — :func:`fit`, :func:`train_from_config` (and the names above, re-exported);
* :mod:`~elmokit.tasks.saving` — :func:`save_task_model` / :func:`load_task_model` (a saved model records its biLM
  and refuses another);
* :mod:`~elmokit.tasks.config` — TOML task configs as typed sections (:func:`load_task_config`);
* :mod:`~elmokit.tasks.report` — results tables and layer-weight plots.

The CLI is ``elmokit tag train|predict|evaluate`` and ``elmokit classify train|predict|evaluate``
(:mod:`elmokit.cli.tasks`); the result tables are made by ``experiments/downstream.py``.

Names are imported lazily (``from elmokit.tasks import SequenceTagger`` loads only what it needs; seqeval and
matplotlib are not imported by ``import elmokit.tasks``).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "config": [
        "TaskConfig",
        "load_task_config",
        "task_config_from_dict",
        "DataSection",
        "BilmSection",
        "StaticSection",
        "CharCnnSection",
        "ModelSection",
        "TrainSection",
    ],
    "models": ["TaskBatch", "TokenInputs", "SequenceTagger", "SentenceClassifier"],
    "training": [
        "TaskData",
        "TaskModel",
        "fit",
        "build_from_config",
        "train_from_config",
        "save_task_model",
        "load_task_model",
        "bilm_fingerprint",
        "read_task_file",
    ],
    "building": ["PreparedTask", "prepare_task"],
    "readers": [
        "TaggedSentence",
        "LabelledSentence",
        "read_conll2003",
        "read_conllu",
        "read_char_ner",
        "read_labelled",
        "convert_tags",
        "check_tags",
        "label_set",
    ],
    "metrics": ["entity_scores", "accuracy", "macro_f1"],
    "report": ["results_table", "mean_std", "write_results", "plot_layer_weights"],
    "static": ["StaticVectors", "build_vocab"],
    "features": ["LayerFeatures", "compute_layer_features", "char_features_from_words", "random_bilm_like"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'elmokit.tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
