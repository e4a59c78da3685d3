"""The training configuration: :class:`TrainConfig` (saved as ``train_config.json``) and the rules for what may change
when a run is resumed.

Choices are typed (``Literal``), and :meth:`TrainConfig.validate` checks them against the same ``Literal`` the type
names, so the type, the check and the command line's ``choices`` cannot drift apart. The biLM architecture is an
:class:`~elmokit.config.ElmoConfig` (``train_config.json`` stores it in the original ``options.json`` layout).

Resume rules (:data:`RESUME_MAY_CHANGE`, :meth:`TrainConfig.resumed`): a field that only says how long to train, where,
how often to save, log or evaluate may change on ``--resume``; every other field fixes what the run computes (its data,
model, vocabulary, optimiser, randomness) and may be repeated but not changed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from elmokit.config import ElmoConfig
from elmokit.errors import CheckpointError, ConfigError, UsageError
from elmokit.modules.precision import Precision

__all__ = [
    "TrainConfig",
    "Batching",
    "OptimizerName",
    "LRSchedule",
    "learning_rate_at",
    "DecodeErrors",
    "DeviceName",
    "Precision",
    "RESUME_MAY_CHANGE",
    "MAX_LEARNING_RATE",
    "literal_choices",
    "default_learning_rate",
]

Batching = Literal["sentences", "windows"]
OptimizerName = Literal["adagrad", "adam"]
#: The learning-rate schedule after the warm-up (:func:`learning_rate_at`).
LRSchedule = Literal["constant", "linear", "cosine"]
DecodeErrors = Literal["strict", "replace", "ignore", "skip"]
#: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"mps"``; ``"cuda:N"`` strings are accepted too.
DeviceName = Literal["auto", "cpu", "cuda", "mps"] | str

#: the fields whose value is one of a Literal type's names (checked by :meth:`TrainConfig.validate`)
_CHOICE_FIELDS = {
    "batching": Batching,
    "optimizer": OptimizerName,
    "lr_schedule": LRSchedule,
    "decode_errors": DecodeErrors,
    "precision": Precision,
}

#: ``TrainConfig.lr_final``'s default (a different value without a decay is refused: it would do nothing).
_LR_FINAL = 0.1
#: Largest accepted learning rate: far above any that trains (bilm-tf's Adagrad uses 0.2), and low enough that the
#: optimisers' float32 arithmetic cannot overflow (Adam overflowed at 1e38, Adagrad at 1e39).
MAX_LEARNING_RATE = 1e4

#: The fields that may change when a run is resumed (:meth:`TrainConfig.resumed`): how long, where and how often to
#: save, log and evaluate. Every other field fixes what the run computes.
RESUME_MAY_CHANGE: frozenset[str] = frozenset(
    {
        "out_dir",
        "max_steps",
        "device",
        "checkpoint_every",
        "checkpoint_minutes",
        "keep_checkpoints",
        "log_every",
        "progress",
        "deterministic",
        "valid_files",
        "valid_every",
        "valid_minutes",
    }
)


def literal_choices(tp: Any) -> tuple[str, ...]:
    """The string values of a ``Literal[...]`` type (also inside a union such as :data:`DeviceName`)."""
    values: list[str] = []
    for arg in typing.get_args(tp) or ():
        if isinstance(arg, str):
            values.append(arg)
        else:
            values.extend(literal_choices(arg))
    return tuple(values)


def default_learning_rate(optimizer: str) -> float:
    """0.2 for Adagrad (bilm-tf's), 1e-3 for Adam."""
    return 0.2 if optimizer == "adagrad" else 1e-3


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``train_config.json``).

    Attributes:
        train_files: glob pattern(s) of training shards (one tokenised sentence per line).
        out_dir: output folder (see :mod:`elmokit.pretraining.trainer`).
        model: the biLM architecture (an :class:`ElmoConfig`; an options dict is converted). ``None`` with
            ``init_from``: the init model's architecture (filled in when the trainer is built).
        vocab_file: bilm-tf vocabulary; ``None`` = build from the training files with ``min_count``/``max_vocab``.
        char_vocab: ``True`` = character-vocabulary input (built from the training files) instead of UTF-8 bytes.
        batching: ``"sentences"`` (default) or ``"windows"`` (bilm-tf stream windows); see the trainer's docstring.
        batch_size: rows (windows) or sentences per step — the **global** batch, over all processes.
        unroll_steps: T, window length and loss scale.
        n_epochs: passes over the data. max_steps: stop after this many steps (``None`` = epochs decide).
        optimizer: ``"adagrad"`` (lr 0.2, accumulator 1.0, as bilm-tf) or ``"adam"``.
        lr: learning rate (``None`` = 0.2 for Adagrad, 1e-3 for Adam). clip_norm: global gradient-norm clip.
        lr_warmup_steps: the rate rises linearly from ``lr / lr_warmup_steps`` at step 1 to ``lr`` at that step
            (0 = no warm-up). lr_schedule: after the warm-up, ``"constant"`` (default; bilm-tf's), ``"linear"`` or
            ``"cosine"`` decay to ``lr_final · lr`` at step ``lr_decay_steps`` (needed by a decay; the rate stays
            there afterwards). lr_final: that floor, a fraction of ``lr`` in [0, 1] (default 0.1). The rate of a
            step is a function of the step alone (:func:`learning_rate_at`), so a resume continues it exactly.
        dropout: on LSTM inputs and before the softmax. n_negative_samples: sampled softmax negatives (0 = full).
        seed: seeds data shuffling, initialisation, and the per-step seeds of dropout and the sampler.
        decode_errors: invalid UTF-8 in the corpus: ``"strict"`` (error naming file and line), ``"replace"``,
            ``"ignore"`` or ``"skip"`` (drop the line); see :class:`elmokit.data.corpus.TextCorpus`.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... With several
            processes, ``auto``/``cuda`` is each process's own GPU (``cuda:LOCAL_RANK``).
        precision: ``"fp32"`` (default) or ``"bf16"``: the forward and backward passes' matrix products in bfloat16
            under autocast, with float32 master weights, optimiser state, LSTM cell state, clips, softmax and loss
            (:mod:`elmokit.modules.precision` lists which op runs in which precision). Fixed for a run (a resume
            keeps it); held-out perplexity is measured in float32 either way.
        deterministic: run with ``torch.use_deterministic_algorithms(True, warn_only=True)`` while training (restored
            afterwards), so that a run repeats bit-exactly with several CPU threads; without it two identical
            40-step runs of the quickstart model on 2 threads differed by up to 6.8e-4 in a parameter, with it by 0
            (``bench/determinism.py``). It cost about 6 % of the step time there. PyTorch's NaN fill of new tensors,
            which that mode turns on, stays off (:func:`elmokit.pretraining.trainer.enter_determinism`).
        checkpoint_every / log_every: in steps.
        checkpoint_minutes: also write a checkpoint whenever this many minutes (wall clock) passed since the last one
            (``None`` = by steps only; > 0 when set). Checkpoints are also written at the end and on Ctrl-C/SIGTERM.
        keep_checkpoints: how many of the newest checkpoints are kept (>= 1, default 2), so that a damaged newest one
            (a truncated file) still leaves one to resume from.
        progress: show a tqdm progress bar. extra: free-form, saved with the config.
        valid_files: glob pattern(s) of held-out text (one tokenised sentence per line): its full-softmax perplexity
            is measured at step 0, every ``valid_every`` steps and/or ``valid_minutes`` minutes (every
            ``checkpoint_every`` steps when neither is given) and at the end, logged to ``metrics.jsonl`` and drawn on
            the learning curve; the model with the lowest average is kept in ``out_dir/best/``.
        valid_every: held-out evaluation every N steps (needs ``valid_files``). valid_minutes: and/or every M minutes.
        init_from: continued pretraining: a released model name, an original-format folder (``*options*.json`` +
            ``*.hdf5``) or a native folder. Its biLM weights (and its architecture: ``model`` must be ``None`` or the
            same) start the run; the softmax over this run's vocabulary is new, or the init model's own when it is a
            native model trained with the same vocabulary.
        freeze_bilm_steps: train only the softmax for the first N steps (the biLM gets no gradient and no update).
        data_parts: the number of parts the corpus and every step's global batch are cut into (``None`` = the number
            of processes the run starts with). Each part is read from its own byte ranges of the training files and
            fills its share of the batch; each process computes some of the parts, so any number of processes from 1
            to ``data_parts`` computes the same steps, and a checkpoint resumes with any of them.

    Raises (from the constructor): ConfigError for a ``model`` options dict that is not valid. From :meth:`validate`:
    ConfigError naming the field, the value and what is expected.
    """

    train_files: list[str]
    out_dir: str
    model: ElmoConfig | None = None
    vocab_file: str | None = None
    min_count: int = 1
    max_vocab: int | None = None
    char_vocab: bool = False
    batching: Batching = "sentences"
    batch_size: int = 128
    unroll_steps: int = 20
    n_epochs: int = 10
    max_steps: int | None = None
    optimizer: OptimizerName = "adagrad"
    lr: float | None = None
    lr_warmup_steps: int = 0
    lr_schedule: LRSchedule = "constant"
    lr_decay_steps: int | None = None
    lr_final: float = _LR_FINAL
    clip_norm: float = 10.0
    dropout: float = 0.1
    n_negative_samples: int = 8192
    seed: int = 0
    shuffle: bool = True
    decode_errors: DecodeErrors = "strict"
    device: DeviceName = "auto"
    precision: Precision = "fp32"
    deterministic: bool = True
    checkpoint_every: int = 500
    log_every: int = 10
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    keep_checkpoints: int = 2
    checkpoint_minutes: float | None = None
    valid_files: list[str] | None = None
    valid_every: int | None = None
    valid_minutes: float | None = None
    init_from: str | None = None
    freeze_bilm_steps: int = 0
    data_parts: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            # an empty dict is "no architecture given" (the defaults-only configs some callers build)
            self.model = ElmoConfig.from_options(self.model, source="TrainConfig.model") if self.model else None
        if isinstance(self.train_files, (str, Path)):
            self.train_files = [str(self.train_files)]
        if isinstance(self.valid_files, (str, Path)):
            self.valid_files = [str(self.valid_files)]

    # ------------------------------------------------------------------ checks
    def validate(self) -> TrainConfig:
        """Check every value; return ``self``.

        Raises:
            ConfigError: a value out of range or of the wrong kind (names the field and what is expected); no model
                (neither ``model`` nor ``init_from``).
        """
        for name, tp in _CHOICE_FIELDS.items():
            choices = literal_choices(tp)
            if getattr(self, name) not in choices:
                raise ConfigError(f"TrainConfig.{name} must be {_one_of(choices)}, got {getattr(self, name)!r}")
        if not isinstance(self.device, str) or not self.device:
            raise ConfigError(
                f"TrainConfig.device must be a device name (auto, cpu, cuda, cuda:N), got {self.device!r}"
            )
        for name in ("batch_size", "unroll_steps", "n_epochs", "checkpoint_every", "log_every", "keep_checkpoints"):
            _check_int(name, getattr(self, name), 1)
        _check_int("n_negative_samples", self.n_negative_samples, 0, "(0 = full softmax)")
        _check_int("min_count", self.min_count, 1)
        _check_int("freeze_bilm_steps", self.freeze_bilm_steps, 0, "(0 = never frozen)")
        for name in ("max_steps", "valid_every", "data_parts"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1, "(or None)")
        if self.max_vocab is not None:
            _check_int("max_vocab", self.max_vocab, 3, "(the three special tokens, or None)")
        _check_int("seed", self.seed, None)
        if not _is_number(self.clip_norm) or not self.clip_norm > 0:
            raise ConfigError(f"TrainConfig.clip_norm must be > 0, got {self.clip_norm!r}")
        if not _is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise ConfigError(f"TrainConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.lr is not None and (not _is_number(self.lr) or not 0 < self.lr <= MAX_LEARNING_RATE):
            raise ConfigError(
                f"TrainConfig.lr must be > 0 (--lr) and at most {MAX_LEARNING_RATE:g} (or None for the "
                f"optimiser's default), got {self.lr!r}"
            )
        self._validate_schedule()
        for name in ("checkpoint_minutes", "valid_minutes"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not 0 < value < math.inf):
                raise ConfigError(f"TrainConfig.{name} must be > 0 minutes (or None), got {value!r}")
        if self.valid_files is not None and (
            not isinstance(self.valid_files, list)
            or not self.valid_files
            or not all(isinstance(p, str) and p for p in self.valid_files)
        ):
            raise ConfigError(
                f"TrainConfig.valid_files must be a non-empty list of file patterns (or None), got {self.valid_files!r}"
            )
        if self.valid_files is None and (self.valid_every is not None or self.valid_minutes is not None):
            raise ConfigError(
                "--valid-every / --valid-minutes (valid_every / valid_minutes) need "
                "valid_files (--valid-files): the held-out text to evaluate"
            )
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
            raise ConfigError(f"TrainConfig.init_from must be a model name or folder (or None), got {self.init_from!r}")
        if self.freeze_bilm_steps and self.init_from is None:
            raise ConfigError(
                f"freeze_bilm_steps={self.freeze_bilm_steps} (--freeze-bilm-steps) needs a model to "
                "start from (--init-from): a freshly initialised biLM would stay random while frozen"
            )
        if self.model is None and self.init_from is None:
            raise ConfigError(
                "TrainConfig.model is missing: give an architecture (an ElmoConfig or options dict, "
                "--preset/--options) or a model to start from (init_from, --init-from)"
            )
        if self.model is not None and not isinstance(self.model, ElmoConfig):
            raise ConfigError(
                f"TrainConfig.model must be an ElmoConfig or an options dict, got {type(self.model).__name__}"
            )
        if self.model is not None:
            self.model.validate("TrainConfig.model")
        if self.data_parts is not None and self.batch_size < self.data_parts:
            raise ConfigError(
                f"batch_size={self.batch_size} (--batch-size) is smaller than data_parts="
                f"{self.data_parts} (--data-parts, or the number of processes): every data part "
                "(one per process unless --data-parts) needs at least one sentence (window row) per "
                "step; use a larger --batch-size"
            )
        return self

    def _validate_schedule(self) -> None:
        _check_int("lr_warmup_steps", self.lr_warmup_steps, 0, "(0 = no warm-up)")
        if self.lr_decay_steps is not None:
            _check_int("lr_decay_steps", self.lr_decay_steps, 1, "(or None)")
        if not _is_number(self.lr_final) or not 0 <= self.lr_final <= 1:
            raise ConfigError(f"TrainConfig.lr_final must be a fraction of lr in [0, 1], got {self.lr_final!r}")
        if self.lr_schedule == "constant" and (self.lr_decay_steps is not None or self.lr_final != _LR_FINAL):
            raise ConfigError(
                "--lr-decay-steps and --lr-final (lr_decay_steps, lr_final) set a decay: they need --lr-schedule "
                "linear or cosine (lr_schedule; the rate is constant without one)"
            )
        if self.lr_schedule != "constant" and (
            self.lr_decay_steps is None or self.lr_decay_steps <= self.lr_warmup_steps
        ):
            given = "none was given" if self.lr_decay_steps is None else f"got {self.lr_decay_steps}"
            raise ConfigError(
                f"--lr-schedule {self.lr_schedule} (lr_schedule) needs --lr-decay-steps M (lr_decay_steps), the "
                f"step where the decay ends, with M > --lr-warmup-steps ({self.lr_warmup_steps}): {given}"
            )

    @property
    def learning_rate(self) -> float:
        """``lr``, or the optimiser's default (:func:`default_learning_rate`)."""
        return self.lr if self.lr is not None else default_learning_rate(self.optimizer)

    @property
    def valid_interval(self) -> int | None:
        """Steps between held-out evaluations: ``valid_every``; ``checkpoint_every`` when only ``valid_files`` is
        given; ``None`` without ``valid_files`` or when only ``valid_minutes`` is given."""
        if self.valid_files is None:
            return None
        if self.valid_every is not None:
            return self.valid_every
        return None if self.valid_minutes is not None else self.checkpoint_every

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (``model`` in the options.json layout), as ``train_config.json`` holds it."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["model"] = None if self.model is None else self.model.to_options()
        return json.loads(json.dumps(data))

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON text (what the trainer writes to ``train_config.json``)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "train_config.json") -> TrainConfig:
        """Build from :meth:`to_dict`'s data (older files, without the newer fields, get their defaults).

        Raises:
            CheckpointError: not an object, unknown or missing fields, or an invalid model (names ``source``).
        """
        if not isinstance(data, dict):
            raise CheckpointError(
                f"{source} is not a readable training configuration (a JSON object expected, got {type(data).__name__})"
            )
        try:
            return cls(**data)
        except (TypeError, ConfigError) as exc:
            raise CheckpointError(f"{source} is not a readable training configuration ({exc})") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> TrainConfig:
        """Read ``train_config.json``.

        Raises:
            CheckpointError: not UTF-8 JSON, or not a training configuration (names the file).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"{path} is not a readable training configuration ({exc})") from None
        return cls.from_dict(data, str(path))

    # ------------------------------------------------------------------ resume rules
    def same_value(self, name: str, value: Any) -> bool:
        """Whether ``value`` for field ``name`` is this run's value (paths compared as paths, the model by its
        options, so that ``./a.txt`` is ``a.txt`` and a preset is the options dict it stands for)."""
        mine = getattr(self, name)
        if name == "model":
            other = ElmoConfig.from_options(value) if isinstance(value, dict) else value
            if mine is None or other is None:
                return mine is other
            return _canonical(mine.to_options()) == _canonical(other.to_options())
        if name in ("train_files", "valid_files"):
            if mine is None or value is None:
                return mine is value
            value = [value] if isinstance(value, str) else value
            return [str(Path(v)) for v in value] == [str(Path(m)) for m in mine]
        if name in ("vocab_file", "init_from"):
            if mine is None or value is None:
                return mine is value
            return str(Path(value)) == str(Path(mine))
        return value == mine

    def resumed(self, changes: dict[str, Any], describe=lambda name: f"TrainConfig.{name}") -> TrainConfig:
        """This (saved) run's config with ``changes`` (field → value, as given for the resume) applied.

        A field in :data:`RESUME_MAY_CHANGE` takes its new value; any other may be given only with the run's own
        value. ``describe`` names a field in the error (the CLI passes its option names).

        Raises:
            UsageError: fields that fix the run were given other values (all are named, with the fields that may
                change).
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UsageError(f"unknown TrainConfig field(s): {', '.join(unknown)}")
        changed = [
            name
            for name, value in changes.items()
            if name not in RESUME_MAY_CHANGE and not self.same_value(name, value)
        ]
        if changed:
            allowed = ", ".join(sorted({describe(n) for n in RESUME_MAY_CHANGE if describe(n)}))
            names = list(dict.fromkeys(describe(n) for n in changed))
            raise UsageError(
                f"{', '.join(names)}: {'differs' if len(names) == 1 else 'differ'} from the run being "
                f"resumed (see {Path(self.out_dir) / 'train_config.json'}); only {allowed} may change on "
                "--resume. Start a new --out-dir to change the others"
            )
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if k in RESUME_MAY_CHANGE})


def _canonical(options: dict) -> str:
    return json.dumps(options, sort_keys=True)


def _one_of(choices: tuple[str, ...]) -> str:
    quoted = [repr(c) for c in choices]
    return " or ".join(quoted) if len(quoted) <= 2 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int | None, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected = "an int" + (f" >= {minimum}" if minimum is not None else "") + (f" {note}" if note else "")
        raise ConfigError(f"TrainConfig.{name} must be {expected}, got {value!r}")


def learning_rate_at(config: TrainConfig, step: int) -> float:
    """The learning rate of optimiser step ``step`` (1-based) under ``config``'s schedule.

    Warm-up (``lr_warmup_steps`` = W > 0): ``lr · step / W`` for ``step <= W``. Then, with ``lr_schedule``
    ``"constant"``: ``lr``; ``"linear"``: ``lr · (1 - (1 - f) · p)``; ``"cosine"``:
    ``lr · (f + (1 - f) · (1 + cos πp) / 2)``, where ``f = lr_final`` and
    ``p = min(1, (step - W) / (lr_decay_steps - W))``: the rate reaches ``f · lr`` at
    ``lr_decay_steps`` and stays there. Linear warm-up and cosine decay follow the common practice of transformer and
    LSTM language-model training (bilm-tf itself keeps Adagrad's rate constant, this function's default).

    Args:
        config: a validated :class:`TrainConfig`. step: the step about to be taken (>= 1).

    Returns:
        The rate, a float (units of the optimiser's ``lr``).
    """
    lr = config.learning_rate
    warm = config.lr_warmup_steps
    if warm and step <= warm:
        return lr * step / warm
    if config.lr_schedule == "constant" or config.lr_decay_steps is None:
        return lr
    progress = min(1.0, (step - warm) / (config.lr_decay_steps - warm))
    final = config.lr_final
    if config.lr_schedule == "linear":
        return lr * (1.0 - (1.0 - final) * progress)
    return lr * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress)))
