"""Task configuration files (TOML) for ``elmokit tag train`` / ``elmokit classify train``.

A config names the task, its data, the word representations and the training budget. Every key is optional except
``task`` and ``data.train``/``data.dev``; unknown keys and wrong values raise :class:`~elmokit.errors.ConfigError`
naming the file and the dotted key. Relative data paths are resolved against the config file's folder. Example::

    task = "tag"                      # "tag" (BiLSTM-CRF sequence tagger) or "classify" (sentence classifier)

    [data]
    reader = "conll2003"              # conll2003 | conllu | char_ner | labelled
    train = "../../../shared/data/conll2003/eng.train"
    dev = "../../../shared/data/conll2003/eng.testa"
    test = "../../../shared/data/conll2003/eng.testb"   # optional
    scheme = "BIO"                    # tag scheme the NER readers convert to (BIO or BIOES)
    metric = "entity_f1"              # entity_f1 (seqeval) or accuracy; default by reader
    # tokenizer = "elmokit-en"        # how `predict --tokenize` splits raw text (default: the biLM's zoo tokeniser)
    # segmenter = "elmokit-zh"        # char_ner only: each character gets its word's ELMo and static vector

    [bilm]
    model = "elmokit-en"              # zoo name / model folder, "none" (no ELMo), or "random" (untrained control)
    random_like = "elmokit-en"        # with model = "random": whose architecture (and character vocabulary)
    at_output = false                 # a second mix concatenated to the BiLSTM output (Peters et al. 2018, §3.3)

    [static]
    vectors = "elmokit-en"            # zoo name (its word2vec), a vectors file, "random" or "none"

    [char_cnn]
    enabled = false                   # a task-trained character CNN (the paper's baselines have one)

    [model]
    hidden = 128                      # BiLSTM cells per direction

    [train]
    epochs = 5
    seed = 0

The section tables below (:data:`SCHEMA`) list every key, its type and its default.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from elmokit.errors import ConfigError, MissingFileError

__all__ = ["TaskConfig", "load_task_config", "task_config_from_dict", "SCHEMA", "READERS", "DEFAULT_METRIC"]

#: The readers of :mod:`elmokit.tasks.readers` a config may name, and which task kind each serves.
READERS = {"conll2003": "tag", "conllu": "tag", "char_ner": "tag", "labelled": "classify"}
#: The metric used when ``data.metric`` is not given.
DEFAULT_METRIC = {"conll2003": "entity_f1", "conllu": "accuracy", "char_ner": "entity_f1", "labelled": "accuracy"}

# key: (type, default, check(value) -> error text or None)
def _choice(*allowed):
    return lambda v: None if v in allowed else f"one of {', '.join(map(repr, allowed))}"


def _at_least(lo):
    return lambda v: None if v >= lo else f">= {lo}"


def _positive(v):
    return None if v > 0 and math.isfinite(v) else "a positive finite number"


def _rate(v):
    return None if 0 <= v < 1 else "a number in [0, 1)"


def _non_negative(v):
    return None if v >= 0 and math.isfinite(v) else "a number >= 0"


def _filters(v):
    ok = (isinstance(v, list) and v and all(isinstance(f, list) and len(f) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in f) for f in v))
    return None if ok else "a non-empty list of [width, count] pairs of positive integers"


def _nonempty(v):
    return None if v.strip() else "a non-empty string"


#: section → key → (type, default, check). ``None`` default = not set. ``data.train``/``data.dev`` are required.
SCHEMA: dict[str, dict[str, tuple]] = {
    "data": {
        "reader": (str, None, _choice(*READERS)),
        "train": (str, None, _nonempty),
        "dev": (str, None, _nonempty),
        "test": (str, None, _nonempty),
        "scheme": (str, "BIO", _choice("BIO", "BIOES")),
        "field": (str, "upos", _choice("upos", "xpos", "deprel")),
        "format": (str, "auto", _choice("auto", "tsv", "space", "trec")),
        "encoding": (str, "utf-8", _nonempty),
        "metric": (str, None, _choice("entity_f1", "accuracy")),
        "max_train_sentences": (int, 0, _at_least(0)),
        "tokenizer": (str, None, _nonempty),
        "segmenter": (str, None, _nonempty),
    },
    "bilm": {
        "model": (str, "none", _nonempty),
        "random_like": (str, None, _nonempty),
        "random_seed": (int, 0, _at_least(0)),
        "fine_tune": (bool, False, None),
        "at_output": (bool, False, None),
        "do_layer_norm": (bool, False, None),
        "dropout": (float, 0.5, _rate),
        "l2": (float, 0.001, _non_negative),
        "cache": (bool, True, None),
        "batch_size": (int, 64, _at_least(1)),
    },
    "static": {
        "vectors": (str, "none", _nonempty),
        "dim": (int, 100, _at_least(1)),
        "trainable": (bool, False, None),
        "seed": (int, 0, _at_least(0)),
    },
    "char_cnn": {
        "enabled": (bool, False, None),
        "embedding_dim": (int, 16, _at_least(1)),
        "filters": (list, [[1, 16], [2, 16], [3, 32]], _filters),
        "max_characters": (int, 15, _at_least(3)),
    },
    "model": {
        "hidden": (int, 128, _at_least(1)),
        "layers": (int, 1, _at_least(1)),
        "dropout": (float, 0.5, _rate),
        "pooling": (str, "max", _choice("max", "attention")),
    },
    "train": {
        "lr": (float, 0.001, _positive),
        "epochs": (int, 5, _at_least(1)),
        "patience": (int, 2, _at_least(1)),
        "batch_size": (int, 32, _at_least(1)),
        "clip": (float, 5.0, _positive),
        "seed": (int, 0, _at_least(0)),
    },
}
_PATH_KEYS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """A validated task configuration.

    Attributes:
        task: ``"tag"`` or ``"classify"``.
        data, bilm, static, char_cnn, model, train: the sections, every key of :data:`SCHEMA` present (defaults
            filled in; data paths absolute).
        source: the file it was read from (for messages), or ``"<dict>"``.
    """

    task: str
    data: Mapping[str, Any]
    bilm: Mapping[str, Any]
    static: Mapping[str, Any]
    char_cnn: Mapping[str, Any]
    model: Mapping[str, Any]
    train: Mapping[str, Any]
    source: str = "<dict>"

    def to_dict(self) -> dict:
        """The plain-dict form (JSON/TOML-able; ``None`` values left out), which :func:`task_config_from_dict`
        reads back."""
        out: dict[str, Any] = {"task": self.task}
        for section in SCHEMA:
            out[section] = {k: v for k, v in getattr(self, section).items() if v is not None}
        return out

    def override(self, changes: Mapping[str, Any]) -> "TaskConfig":
        """A copy with dotted keys changed, e.g. ``{"bilm.model": "none", "train.seed": 2}``, validated again.

        Raises:
            ConfigError: an unknown key or a bad value (naming the dotted key).
        """
        raw = self.to_dict()
        for dotted, value in changes.items():
            section, _, key = dotted.partition(".")
            if dotted == "task":
                raw["task"] = value
                continue
            if section not in SCHEMA or key not in SCHEMA[section]:
                raise ConfigError(f"{self.source}: override {dotted!r}: unknown key (sections: {', '.join(SCHEMA)})")
            if value is None:
                raw[section].pop(key, None)
            else:
                raw[section][key] = value
        return task_config_from_dict(raw, source=self.source)

    @property
    def metric(self) -> str:
        """``data.metric``, or the reader's default (:data:`DEFAULT_METRIC`)."""
        return self.data["metric"] or DEFAULT_METRIC[self.data["reader"]]

    @property
    def uses_elmo(self) -> bool:
        """Whether the model has ELMo inputs (``bilm.model`` is not ``"none"``)."""
        return self.bilm["model"] != "none"


def _check_value(where: str, dotted: str, value: Any, kind, check) -> Any:
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ConfigError(f"{where}: {dotted} must be {'a number' if kind is float else 'a ' + kind.__name__}, got "
                          f"{value!r}")
    if check is not None:
        expected = check(value)
        if expected:
            raise ConfigError(f"{where}: {dotted} must be {expected}, got {value!r}")
    return value


def task_config_from_dict(raw: Mapping[str, Any], *, source: str = "<dict>",
                          base_dir: str | os.PathLike | None = None) -> TaskConfig:
    """Validate a config given as a dict (the parsed TOML).

    Args:
        raw: ``{"task": ..., "data": {...}, ...}``.
        source: named in messages.
        base_dir: relative data paths are resolved against it (default: left as given); so are ``bilm.model``,
            ``bilm.random_like`` and ``static.vectors`` when such a path exists there (else they are zoo names or
            paths from the current folder).

    Raises:
        ConfigError: a missing required key, an unknown section or key, a value of the wrong type or out of range,
            a reader that does not fit the task, or contradicting options (each message names ``source`` and the
            dotted key).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: a task config must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SCHEMA) - {"task"})
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (expected task and the sections "
                          f"{', '.join(SCHEMA)})")
    task = raw.get("task")
    if task not in ("tag", "classify"):
        raise ConfigError(f"{source}: task must be 'tag' or 'classify', got {task!r}")
    sections: dict[str, dict[str, Any]] = {}
    for section, keys in SCHEMA.items():
        given = raw.get(section, {})
        if not isinstance(given, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table, got {given!r}")
        bad = sorted(set(given) - set(keys))
        if bad:
            raise ConfigError(f"{source}: unknown key {section}.{bad[0]} (expected one of {', '.join(keys)})")
        values = {}
        for key, (kind, default, check) in keys.items():
            if key in given and given[key] is not None:
                values[key] = _check_value(source, f"{section}.{key}", given[key], kind, check)
            else:
                values[key] = list(default) if isinstance(default, list) else default
        sections[section] = values
    data = sections["data"]
    for key in ("train", "dev"):
        if data[key] is None:
            raise ConfigError(f"{source}: data.{key} is required (the path of the {key} file)")
    if data["reader"] is None:
        data["reader"] = "labelled" if task == "classify" else "conll2003"
    if READERS[data["reader"]] != task:
        raise ConfigError(f"{source}: data.reader {data['reader']!r} reads {READERS[data['reader']]} data, but task is "
                          f"{task!r}")
    if task == "classify" and data["metric"] == "entity_f1":
        raise ConfigError(f"{source}: data.metric 'entity_f1' is for tagging; a classifier is scored by accuracy")
    if base_dir is not None:
        for key in _PATH_KEYS:
            if data[key] is not None and not os.path.isabs(data[key]):
                data[key] = os.path.normpath(os.path.join(base_dir, data[key]))
    if base_dir is not None:  # model folders and vector files beside the config (zoo names are left alone)
        for section, key in (("bilm", "model"), ("bilm", "random_like"), ("static", "vectors")):
            value = sections[section][key]
            if value not in (None, "none", "random") and not os.path.isabs(value) \
                    and os.path.exists(os.path.join(base_dir, value)):
                sections[section][key] = os.path.normpath(os.path.join(base_dir, value))
    bilm = sections["bilm"]
    if bilm["model"] == "random" and bilm["random_like"] is None:
        raise ConfigError(f"{source}: bilm.model = 'random' needs bilm.random_like (the model whose architecture the "
                          "untrained control copies)")
    if bilm["model"] == "none":
        if bilm["fine_tune"] or bilm["at_output"]:
            key = "fine_tune" if bilm["fine_tune"] else "at_output"
            raise ConfigError(f"{source}: bilm.{key} needs a biLM, but bilm.model is 'none'")
    if bilm["fine_tune"] and data["segmenter"] is not None:
        raise ConfigError(f"{source}: bilm.fine_tune cannot be combined with data.segmenter (characters get their "
                          "word's precomputed vectors, which a fine-tuned biLM would change)")
    if data["segmenter"] is not None and data["reader"] != "char_ner":
        raise ConfigError(f"{source}: data.segmenter is for character-tagged data (data.reader = 'char_ner'), "
                          f"not {data['reader']!r}")
    if sections["static"]["vectors"] == "none" and not sections["char_cnn"]["enabled"] and bilm["model"] == "none":
        raise ConfigError(f"{source}: the model has no input: set static.vectors, char_cnn.enabled or bilm.model")
    return TaskConfig(task=task, source=source, **sections)


def load_task_config(path: str | os.PathLike) -> TaskConfig:
    """Read and validate a TOML task config (see the module docstring).

    Raises:
        MissingFileError: no such file. ConfigError: not UTF-8 TOML (the parser's line and column), or invalid (see
            :func:`task_config_from_dict`).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"task config {path}: no such file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return task_config_from_dict(raw, source=str(path), base_dir=path.resolve().parent)
