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

Each section is a typed, frozen dataclass (:class:`DataSection`, :class:`BilmSection`, :class:`StaticSection`,
:class:`CharCnnSection`, :class:`ModelSection`, :class:`TrainSection`) whose fields are its keys, with their types,
defaults and checks; :data:`SCHEMA` lists them as tables. Code reads a config through attributes
(``config.bilm.model``, ``config.train.epochs``); the file format is unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from elmokit.errors import ConfigError, MissingFileError

__all__ = [
    "TaskConfig",
    "DataSection",
    "BilmSection",
    "StaticSection",
    "CharCnnSection",
    "ModelSection",
    "TrainSection",
    "load_task_config",
    "task_config_from_dict",
    "SCHEMA",
    "SECTIONS",
    "READERS",
    "DEFAULT_METRIC",
]

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
    ok = (
        isinstance(v, list)
        and v
        and all(
            isinstance(f, list)
            and len(f) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in f)
            for f in v
        )
    )
    return None if ok else "a non-empty list of [width, count] pairs of positive integers"


def _nonempty(v):
    return None if v.strip() else "a non-empty string"


def _key(kind: type, default: Any, check: Callable[[Any], str | None] | None = None) -> Any:
    """A section field: its TOML type, default (``None`` = not set) and check (value → what was expected, or None)."""
    meta = {"kind": kind, "check": check}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _check_value(where: str, dotted: str, value: Any, kind, check) -> Any:
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ConfigError(
            f"{where}: {dotted} must be {'a number' if kind is float else 'a ' + kind.__name__}, got {value!r}"
        )
    if check is not None:
        expected = check(value)
        if expected:
            raise ConfigError(f"{where}: {dotted} must be {expected}, got {value!r}")
    return value


class _Section:
    """A config section: a frozen dataclass whose fields are the section's keys (see :func:`_key`)."""

    name: ClassVar[str]

    @classmethod
    def from_dict(cls, given: Any, source: str) -> _Section:
        """Validate the section's table (missing keys get their defaults).

        Raises:
            ConfigError: not a table, an unknown key, or a value of the wrong type or out of range (naming ``source``
                and the dotted key).
        """
        if not isinstance(given, Mapping):
            raise ConfigError(f"{source}: [{cls.name}] must be a table, got {given!r}")
        keys = [f.name for f in dataclasses.fields(cls)]
        bad = sorted(set(given) - set(keys))
        if bad:
            raise ConfigError(f"{source}: unknown key {cls.name}.{bad[0]} (expected one of {', '.join(keys)})")
        values = {}
        for f in dataclasses.fields(cls):
            if given.get(f.name) is not None:
                values[f.name] = _check_value(
                    source, f"{cls.name}.{f.name}", given[f.name], f.metadata["kind"], f.metadata["check"]
                )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """``{key: value}`` of the keys that are set (``None`` left out), lists copied."""
        return {
            f.name: copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def __getitem__(self, key: str) -> Any:
        """The mapping form of earlier versions (``config.data["train"]``): warns; use the attribute."""
        if key not in {f.name for f in dataclasses.fields(self)}:
            raise KeyError(key)
        warnings.warn(
            f"TaskConfig sections are typed objects: read config.{self.name}.{key} instead of "
            f"config.{self.name}[{key!r}]",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self, key)


@dataclasses.dataclass(frozen=True)
class DataSection(_Section):
    """``[data]``: the data files and how to read them (paths absolute once loaded from a file)."""

    name: ClassVar[str] = "data"
    reader: str | None = _key(str, None, _choice(*READERS))
    train: str | None = _key(str, None, _nonempty)
    dev: str | None = _key(str, None, _nonempty)
    test: str | None = _key(str, None, _nonempty)
    scheme: str = _key(str, "BIO", _choice("BIO", "BIOES"))
    field: str = _key(str, "upos", _choice("upos", "xpos", "deprel"))
    format: str = _key(str, "auto", _choice("auto", "tsv", "space", "trec"))
    encoding: str = _key(str, "utf-8", _nonempty)
    metric: str | None = _key(str, None, _choice("entity_f1", "accuracy"))
    max_train_sentences: int = _key(int, 0, _at_least(0))
    tokenizer: str | None = _key(str, None, _nonempty)
    segmenter: str | None = _key(str, None, _nonempty)


@dataclasses.dataclass(frozen=True)
class BilmSection(_Section):
    """``[bilm]``: the biLM (zoo name / folder, ``"none"`` or ``"random"``) and its ELMo mix."""

    name: ClassVar[str] = "bilm"
    model: str = _key(str, "none", _nonempty)
    random_like: str | None = _key(str, None, _nonempty)
    random_seed: int = _key(int, 0, _at_least(0))
    fine_tune: bool = _key(bool, False)
    at_output: bool = _key(bool, False)
    do_layer_norm: bool = _key(bool, False)
    dropout: float = _key(float, 0.5, _rate)
    l2: float = _key(float, 0.001, _non_negative)
    cache: bool = _key(bool, True)
    batch_size: int = _key(int, 64, _at_least(1))


@dataclasses.dataclass(frozen=True)
class StaticSection(_Section):
    """``[static]``: static word vectors (zoo name, vectors file, ``"random"`` or ``"none"``)."""

    name: ClassVar[str] = "static"
    vectors: str = _key(str, "none", _nonempty)
    dim: int = _key(int, 100, _at_least(1))
    trainable: bool = _key(bool, False)
    seed: int = _key(int, 0, _at_least(0))


@dataclasses.dataclass(frozen=True)
class CharCnnSection(_Section):
    """``[char_cnn]``: the task-trained character CNN (``filters``: ``[width, count]`` pairs)."""

    name: ClassVar[str] = "char_cnn"
    enabled: bool = _key(bool, False)
    embedding_dim: int = _key(int, 16, _at_least(1))
    filters: list = _key(list, [[1, 16], [2, 16], [3, 32]], _filters)
    max_characters: int = _key(int, 15, _at_least(3))


@dataclasses.dataclass(frozen=True)
class ModelSection(_Section):
    """``[model]``: the task BiLSTM (cells per direction, layers, dropout) and the classifier's pooling."""

    name: ClassVar[str] = "model"
    hidden: int = _key(int, 128, _at_least(1))
    layers: int = _key(int, 1, _at_least(1))
    dropout: float = _key(float, 0.5, _rate)
    pooling: str = _key(str, "max", _choice("max", "attention"))


@dataclasses.dataclass(frozen=True)
class TrainSection(_Section):
    """``[train]``: Adam's learning rate, the epoch budget and early-stopping patience, batch size, clipping, seed."""

    name: ClassVar[str] = "train"
    lr: float = _key(float, 0.001, _positive)
    epochs: int = _key(int, 5, _at_least(1))
    patience: int = _key(int, 2, _at_least(1))
    batch_size: int = _key(int, 32, _at_least(1))
    clip: float = _key(float, 5.0, _positive)
    seed: int = _key(int, 0, _at_least(0))


#: The section classes, in file order.
SECTIONS: dict[str, type[_Section]] = {
    cls.name: cls for cls in (DataSection, BilmSection, StaticSection, CharCnnSection, ModelSection, TrainSection)
}
#: section → key → (type, default, check), read from the section classes. ``None`` default = not set.
#: ``data.train``/``data.dev`` are required.
SCHEMA: dict[str, dict[str, tuple]] = {
    name: {
        f.name: (
            f.metadata["kind"],
            f.default if f.default is not dataclasses.MISSING else f.default_factory(),
            f.metadata["check"],
        )
        for f in dataclasses.fields(cls)
    }
    for name, cls in SECTIONS.items()
}
_PATH_KEYS = ("train", "dev", "test")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """A validated task configuration: typed sections, read as attributes (``config.data.train``,
    ``config.train.epochs``).

    Attributes:
        task: ``"tag"`` or ``"classify"``.
        data, bilm, static, char_cnn, model, train: the sections (:class:`DataSection`, :class:`BilmSection`,
            :class:`StaticSection`, :class:`CharCnnSection`, :class:`ModelSection`, :class:`TrainSection`), every key
            present (defaults filled in; data paths absolute when read from a file).
        source: the file it was read from (for messages), or ``"<dict>"``.
    """

    task: str
    data: DataSection
    bilm: BilmSection
    static: StaticSection
    char_cnn: CharCnnSection
    model: ModelSection
    train: TrainSection
    source: str = "<dict>"

    def to_dict(self) -> dict:
        """The plain-dict form (JSON/TOML-able; ``None`` values left out), which :func:`task_config_from_dict`
        reads back."""
        out: dict[str, Any] = {"task": self.task}
        for section in SECTIONS:
            out[section] = getattr(self, section).to_dict()
        return out

    def override(self, changes: Mapping[str, Any]) -> TaskConfig:
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
        return self.data.metric or DEFAULT_METRIC[self.data.reader]

    @property
    def uses_elmo(self) -> bool:
        """Whether the model has ELMo inputs (``bilm.model`` is not ``"none"``)."""
        return self.bilm.model != "none"


def _read_task(raw: Any, source: str) -> str:
    """The top level: a table of ``task`` and the known sections; returns ``task``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: a task config must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SCHEMA) - {"task"})
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r} (expected task and the sections {', '.join(SCHEMA)})")
    task = raw.get("task")
    if task not in ("tag", "classify"):
        raise ConfigError(f"{source}: task must be 'tag' or 'classify', got {task!r}")
    return task


def _complete_data(data: DataSection, task: str, source: str) -> DataSection:
    """Required files, the reader's default for the task, and the reader and metric that fit the task."""
    for key in ("train", "dev"):
        if getattr(data, key) is None:
            raise ConfigError(f"{source}: data.{key} is required (the path of the {key} file)")
    if data.reader is None:
        data = dataclasses.replace(data, reader="labelled" if task == "classify" else "conll2003")
    if READERS[data.reader] != task:
        raise ConfigError(
            f"{source}: data.reader {data.reader!r} reads {READERS[data.reader]} data, but task is {task!r}"
        )
    if task == "classify" and data.metric == "entity_f1":
        raise ConfigError(f"{source}: data.metric 'entity_f1' is for tagging; a classifier is scored by accuracy")
    return data


def _resolve_paths(sections: dict[str, _Section], base_dir: str | os.PathLike) -> None:
    """Relative data paths → absolute against ``base_dir``; so are model folders and vector files found there (zoo
    names are left alone). Changes ``sections`` in place."""
    data = sections["data"]
    sections["data"] = dataclasses.replace(
        data,
        **{
            key: os.path.normpath(os.path.join(base_dir, getattr(data, key)))
            for key in _PATH_KEYS
            if getattr(data, key) is not None and not os.path.isabs(getattr(data, key))
        },
    )
    for section, key in (("bilm", "model"), ("bilm", "random_like"), ("static", "vectors")):
        value = getattr(sections[section], key)
        if (
            value not in (None, "none", "random")
            and not os.path.isabs(value)
            and os.path.exists(os.path.join(base_dir, value))
        ):
            sections[section] = dataclasses.replace(
                sections[section], **{key: os.path.normpath(os.path.join(base_dir, value))}
            )


def _check_combinations(sections: dict[str, _Section], source: str) -> None:
    """Options that contradict each other, or a model with no input."""
    data, bilm = sections["data"], sections["bilm"]
    if bilm.model == "random" and bilm.random_like is None:
        raise ConfigError(
            f"{source}: bilm.model = 'random' needs bilm.random_like (the model whose architecture the "
            "untrained control copies)"
        )
    if bilm.model == "none" and (bilm.fine_tune or bilm.at_output):
        key = "fine_tune" if bilm.fine_tune else "at_output"
        raise ConfigError(f"{source}: bilm.{key} needs a biLM, but bilm.model is 'none'")
    if bilm.fine_tune and data.segmenter is not None:
        raise ConfigError(
            f"{source}: bilm.fine_tune cannot be combined with data.segmenter (characters get their "
            "word's precomputed vectors, which a fine-tuned biLM would change)"
        )
    if data.segmenter is not None and data.reader != "char_ner":
        raise ConfigError(
            f"{source}: data.segmenter is for character-tagged data (data.reader = 'char_ner'), not {data.reader!r}"
        )
    if sections["static"].vectors == "none" and not sections["char_cnn"].enabled and bilm.model == "none":
        raise ConfigError(f"{source}: the model has no input: set static.vectors, char_cnn.enabled or bilm.model")


def task_config_from_dict(
    raw: Mapping[str, Any], *, source: str = "<dict>", base_dir: str | os.PathLike | None = None
) -> TaskConfig:
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
    task = _read_task(raw, source)
    sections = {name: cls.from_dict(raw.get(name, {}), source) for name, cls in SECTIONS.items()}
    sections["data"] = _complete_data(sections["data"], task, source)
    if base_dir is not None:
        _resolve_paths(sections, base_dir)
    _check_combinations(sections, source)
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
