"""Pretraining a biLM: the training loop, checkpoints that resume exactly, metrics and the learning curve.

Optimiser defaults follow bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0), global gradient-norm clip 10,
dropout 0.1, loss ``0.5 · (NLL_fwd + NLL_bwd) · unroll_steps`` (the scale matters for Adagrad).

Batching. Two modes:

* ``"sentences"`` (**default**): batches of whole sentences (length-bucketed), each wrapped in ``<S> … </S>`` and read
  from a zero LSTM state. This is exactly how elmokit evaluates perplexity and embeds text (stateless: a sentence's
  vectors never depend on what came before), so the model is trained in the condition it is used in.
* ``"windows"``: bilm-tf's scheme — the corpus as one continuous stream cut into ``unroll_steps``-token windows, with
  the LSTM state carried between batches (truncated BPTT), which is how the released models were trained. A model
  trained this way almost never sees a zero state, so read statelessly it starts every sentence out of distribution:
  on the quickstart corpus (gensim's Lee news, 60k tokens, same model and optimiser, 32 rows per step), windows gave
  held-out perplexity 165 after 987 steps with the directions far apart (forward 124, backward 218), sentences 108
  after 600 steps (forward 107, backward 108). Use windows for parity with bilm-tf, for long-document corpora, or
  when you embed statefully as the original did.

Output folder layout::

    out_dir/train_config.json     the TrainConfig (resume checks it)
    out_dir/metrics.jsonl         one JSON object per logged step (step, loss, ppl_fwd, ppl_bwd, tokens/s, lr)
    out_dir/checkpoint.json       the manifest: the kept checkpoints (step, each file's size and sha256) and the
                                  vocabulary's size and sha256; written after the files it names, atomically
    out_dir/ckpt-<step>.safetensors + ckpt-<step>.state.pt   model tensors; optimiser/data/RNG/LSTM state (the newest
                                  ``keep_checkpoints`` are kept)
    out_dir/model/                final model: config.json, model.safetensors (biLM + softmax), vocab.txt
    out_dir/learning_curve.png

Nothing is lost (see :mod:`elmokit.training.checkpoint` for the file format):

* A new run refuses a folder that already holds a run (:class:`~elmokit.errors.UsageError`): ``overwrite=True``
  deletes that run's own files (the ones above, nothing else) first, ``resume=True`` continues it.
* Checkpoints: every ``checkpoint_every`` steps, every ``checkpoint_minutes`` minutes when set, at the end, and when
  the run is interrupted. The newest ``keep_checkpoints`` are kept; on resume the newest is verified (sizes, sha256,
  readable) and a damaged one is skipped with a warning for the previous one.
* Ctrl-C / SIGTERM (with :func:`elmokit.interrupts.handling_signals` installed, as the CLI does): each step (draw a
  batch, forward, backward, update, log) and each checkpoint write runs inside :func:`elmokit.interrupts.deferred`, so
  the signal lands between two steps; the trainer then writes a checkpoint at that step (when it is newer than the last
  one), logs it, and re-raises ``KeyboardInterrupt``. ``resume=True`` continues bit-exactly from there.
* Resume checks that the vocabulary (size and sha256 of its tokens) and the model's tensor shapes are those of the run,
  and says which file differs (:class:`~elmokit.errors.CheckpointError`) instead of failing inside ``torch``.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from ..characters import CharVocabulary
from ..config import ElmoConfig
from ..devices import resolve_device  # noqa: F401  (re-exported: elmokit.training.trainer.resolve_device)
from .. import interrupts
from ..data.corpus import SentenceBatcher, StreamWindows, TextCorpus
from ..errors import CheckpointError, ConfigError, ElmoError, MissingFileError, UsageError, WeightsError
from ..io import atomic_path, atomic_write_text
from ..vocabulary import Vocabulary
from ..weights import check_state_fits
from . import checkpoint as ckpt
from .lm import BidirectionalLM

__all__ = ["TrainConfig", "Trainer", "TrainingError", "save_lm", "load_lm", "latest_checkpoint_step"]

logger = logging.getLogger(__name__)


#: Largest accepted learning rate: far above any that trains (bilm-tf's Adagrad uses 0.2), and low enough that the
#: optimisers' float32 arithmetic cannot overflow (Adam overflowed at 1e38, Adagrad at 1e39).
MAX_LEARNING_RATE = 1e4


class TrainingError(ElmoError, RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step."""


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``train_config.json``).

    Attributes:
        train_files: glob pattern(s) of training shards (one tokenised sentence per line).
        out_dir: output folder (see module docstring).
        model: the biLM architecture as an options dict (``ElmoConfig.to_options()``).
        vocab_file: bilm-tf vocabulary; ``None`` = build from the training files with ``min_count``/``max_vocab``.
        char_vocab: ``True`` = character-vocabulary input (built from the training files) instead of UTF-8 bytes.
        batching: ``"sentences"`` (default) or ``"windows"`` (bilm-tf stream windows); see the module docstring.
        batch_size: rows (windows) or sentences per step. unroll_steps: T, window length and loss scale.
        n_epochs: passes over the data. max_steps: stop after this many steps (``None`` = epochs decide).
        optimizer: ``"adagrad"`` (lr 0.2, accumulator 1.0, as bilm-tf) or ``"adam"``.
        lr: learning rate (``None`` = 0.2 for Adagrad, 1e-3 for Adam). clip_norm: global gradient-norm clip.
        dropout: on LSTM inputs and before the softmax. n_negative_samples: sampled softmax negatives (0 = full).
        seed: seeds data shuffling, initialisation, dropout and the sampler.
        decode_errors: invalid UTF-8 in the corpus: ``"strict"`` (error naming file and line), ``"replace"``,
            ``"ignore"`` or ``"skip"`` (drop the line); see :class:`elmokit.data.corpus.TextCorpus`.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        deterministic: run with ``torch.use_deterministic_algorithms(True, warn_only=True)`` while training (restored
            afterwards), so that a run repeats bit-exactly with several CPU threads; without it two identical
            40-step runs of the quickstart model on 2 threads differed by up to 6.8e-4 in a parameter, with it by 0
            (``bench/determinism.py``). It cost about 6 % of the step time there.
        checkpoint_every / log_every: in steps.
        checkpoint_minutes: also write a checkpoint whenever this many minutes (wall clock) passed since the last one
            (``None`` = by steps only; > 0 when set). Checkpoints are also written at the end and on Ctrl-C/SIGTERM.
        keep_checkpoints: how many of the newest checkpoints are kept (>= 1, default 2), so that a damaged newest one
            (a truncated file) still leaves one to resume from.
        progress: show a tqdm progress bar. extra: free-form, saved with the config.

    Raises (from :meth:`validate`): ConfigError naming the field, the value and what is expected.
    """

    train_files: list[str]
    out_dir: str
    model: dict[str, Any]
    vocab_file: str | None = None
    min_count: int = 1
    max_vocab: int | None = None
    char_vocab: bool = False
    batching: str = "sentences"
    batch_size: int = 128
    unroll_steps: int = 20
    n_epochs: int = 10
    max_steps: int | None = None
    optimizer: str = "adagrad"
    lr: float | None = None
    clip_norm: float = 10.0
    dropout: float = 0.1
    n_negative_samples: int = 8192
    seed: int = 0
    shuffle: bool = True
    decode_errors: str = "strict"
    device: str = "auto"
    deterministic: bool = True
    checkpoint_every: int = 500
    log_every: int = 10
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    keep_checkpoints: int = 2
    checkpoint_minutes: float | None = None

    def validate(self) -> "TrainConfig":
        """Check every value; return ``self``.

        Raises:
            ConfigError: a value out of range or of the wrong kind (names the field and what is expected), or an
                invalid ``model`` (from :meth:`ElmoConfig.from_options`).
        """
        if self.batching not in ("windows", "sentences"):
            raise ConfigError(f"TrainConfig.batching must be 'windows' or 'sentences', got {self.batching!r}")
        if self.optimizer not in ("adagrad", "adam"):
            raise ConfigError(f"TrainConfig.optimizer must be 'adagrad' or 'adam', got {self.optimizer!r}")
        for name in ("batch_size", "unroll_steps", "n_epochs", "checkpoint_every", "log_every", "keep_checkpoints"):
            _check_int(name, getattr(self, name), 1)
        _check_int("n_negative_samples", self.n_negative_samples, 0, "(0 = full softmax)")
        _check_int("min_count", self.min_count, 1)
        if self.max_steps is not None:
            _check_int("max_steps", self.max_steps, 1, "(or None)")
        if self.max_vocab is not None:
            _check_int("max_vocab", self.max_vocab, 3, "(the three special tokens, or None)")
        _check_int("seed", self.seed, None)
        if not _is_number(self.clip_norm) or not self.clip_norm > 0:
            raise ConfigError(f"TrainConfig.clip_norm must be > 0, got {self.clip_norm!r}")
        if not _is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise ConfigError(f"TrainConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if self.lr is not None and (not _is_number(self.lr) or not 0 < self.lr <= MAX_LEARNING_RATE):
            raise ConfigError(f"TrainConfig.lr must be > 0 (--lr) and at most {MAX_LEARNING_RATE:g} (or None for the "
                              f"optimiser's default), got {self.lr!r}")
        if self.checkpoint_minutes is not None and (
                not _is_number(self.checkpoint_minutes) or not 0 < self.checkpoint_minutes < math.inf):
            raise ConfigError(f"TrainConfig.checkpoint_minutes must be > 0 minutes (or None), "
                              f"got {self.checkpoint_minutes!r}")
        if self.decode_errors not in ("strict", "replace", "ignore", "skip"):
            raise ConfigError(f"TrainConfig.decode_errors must be 'strict', 'replace', 'ignore' or 'skip', "
                              f"got {self.decode_errors!r}")
        ElmoConfig.from_options(self.model)
        return self

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (0.2 if self.optimizer == "adagrad" else 1e-3)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int | None, note: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected = "an int" + (f" >= {minimum}" if minimum is not None else "") + (f" {note}" if note else "")
        raise ConfigError(f"TrainConfig.{name} must be {expected}, got {value!r}")


# ---------------------------------------------------------------------------------------------- saving models
def save_lm(lm: BidirectionalLM, out_dir: str | os.PathLike) -> Path:
    """Save a trained LM in the native format: the biLM (loadable by :func:`elmokit.load_native`, ``Elmo``), the softmax
    (``softmax.weight``, ``softmax.bias``), ``vocab.txt`` and, in character-vocabulary mode, ``chars.txt``."""
    from ..weights.native import save_pretrained

    return save_pretrained(lm.bilm, out_dir, vocab_lines=lm.vocab.tokens,
                           extra_tensors={f"softmax.{k}": v for k, v in lm.softmax.state_dict().items()})


def load_lm(model_dir: str | os.PathLike) -> BidirectionalLM:
    """Load :func:`save_lm`'s folder as a :class:`BidirectionalLM` (eval mode).

    Raises:
        MissingFileError: the folder lacks ``config.json``, the weights or ``vocab.txt``, or the weights hold no softmax
            (only an embedding model was saved).
        WeightsError: the softmax does not fit ``vocab.txt`` and the config.
    """
    from ..weights.native import WEIGHTS_NAME, load_native

    model_dir = Path(model_dir)
    missing = [n for n in ("config.json", WEIGHTS_NAME, "vocab.txt") if not (model_dir / n).is_file()]
    if missing:
        raise MissingFileError(f"{model_dir} is not a trained LM folder (no {', '.join(missing)}): perplexity and "
                               "scoring need the model/ folder that `elmokit train` writes (biLM + softmax + vocab)")
    bilm = load_native(model_dir)
    vocab = Vocabulary.from_file(model_dir / "vocab.txt")
    tensors = load_file(str(model_dir / WEIGHTS_NAME))
    if "softmax.weight" not in tensors:
        raise MissingFileError(f"{model_dir}/{WEIGHTS_NAME} has no softmax: it is an embedding-only model")
    lm = BidirectionalLM(bilm.config, vocab, dropout=0.0, char_vocab=bilm.char_vocab)
    lm.bilm.load_state_dict(bilm.state_dict())
    if tuple(tensors["softmax.weight"].shape) != tuple(lm.softmax.weight.shape):
        raise WeightsError(f"{model_dir}: softmax.weight has shape {tuple(tensors['softmax.weight'].shape)} but "
                           f"vocab.txt and the config imply {tuple(lm.softmax.weight.shape)}")
    lm.softmax.load_state_dict({"weight": tensors["softmax.weight"], "bias": tensors["softmax.bias"]})
    return lm.eval()


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """Train a :class:`BidirectionalLM` as configured; :meth:`train` runs (or resumes) to the end.

    Raises (from the constructor): ConfigError (options, see :meth:`TrainConfig.validate`), UsageError (device),
    MissingFileError (training files or vocabulary missing), DataError (corpus or vocabulary contents unusable, naming
    file:line). From :meth:`train`: see there.
    """

    def __init__(self, config: TrainConfig) -> None:
        self.config = config.validate()
        self.out_dir = Path(config.out_dir)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        self.corpus = TextCorpus(config.train_files, shuffle=config.shuffle, seed=config.seed,
                                 errors=config.decode_errors)
        self.vocab = self._vocabulary()
        model_config = ElmoConfig.from_options(config.model)
        self.char_vocab = None
        if config.char_vocab:
            self.char_vocab = CharVocabulary.build(self.corpus.sentences(0),
                                                   max_characters_per_token=model_config.char_cnn.max_characters_per_token)
            model_config.char_cnn.char_vocab_size = self.char_vocab.vocab_size
        self.lm = BidirectionalLM(model_config, self.vocab, dropout=config.dropout, char_vocab=self.char_vocab)
        self.device = resolve_device(config.device)
        try:
            self.lm.to(self.device)
        except RuntimeError as exc:  # e.g. "mps" on a build without MPS support
            raise UsageError(f"device {config.device!r} cannot be used here ({_one_line(exc)}): use auto, cpu, cuda "
                             "or cuda:N") from None
        params = list(self.lm.parameters())
        if config.optimizer == "adagrad":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adagrad(params, lr=config.learning_rate,
                                                                        initial_accumulator_value=1.0)
        else:
            self.optimizer = torch.optim.Adam(params, lr=config.learning_rate)
        self.sampler = torch.Generator().manual_seed(config.seed + 1)
        if config.batching == "windows":
            self.data: StreamWindows | SentenceBatcher = StreamWindows(
                self.corpus, config.batch_size, config.unroll_steps, num_epochs=config.n_epochs)
        else:
            self.data = SentenceBatcher(self.corpus, config.batch_size, num_epochs=config.n_epochs,
                                        bucket_by_length=True)
        self.step = 0
        self.lstm_state = None
        self._vocab_fingerprint = self.vocab.fingerprint()
        self._kept: list[ckpt.CheckpointEntry] = []  # checkpoints of this run on disk, oldest first
        self._saved_step: int | None = None  # step of the newest checkpoint written or loaded
        self._last_checkpoint_time = _clock()
        self._owns_out_dir = False  # set once this trainer started, resumed or loaded the run in out_dir

    def _vocabulary(self) -> Vocabulary:
        c = self.config
        if c.vocab_file:
            return Vocabulary.from_file(c.vocab_file)
        return Vocabulary.build(self.corpus.sentences(0), min_count=c.min_count, max_size=c.max_vocab)

    # ------------------------------------------------------------------ checkpoints
    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint's tensors depend on besides the options: the vocabularies' sizes and sha256."""
        run: dict[str, Any] = {"vocab": {**self._vocab_fingerprint, "file": self.config.vocab_file}}
        if self.char_vocab is not None:
            run["char_vocab"] = {"size": self.char_vocab.vocab_size,
                                 "sha256": ckpt.text_digest(list(self.char_vocab.characters))}
        return run

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (see :func:`elmokit.training.checkpoint.write_checkpoint`: tensor
        file, state file, then the manifest, each atomic; the newest ``keep_checkpoints`` are kept). Runs inside
        :func:`elmokit.interrupts.deferred`, so Ctrl-C/SIGTERM during the write takes effect after it.

        Returns the path of the tensor file ``ckpt-<step>.safetensors``.

        Raises:
            UsageError: ``out_dir`` holds checkpoints of a run that this trainer neither started nor loaded (writing
                would replace its manifest and delete its checkpoints): call :meth:`load_checkpoint` or :meth:`train`.
        """
        if not self._owns_out_dir and (self.out_dir / ckpt.MANIFEST_NAME).is_file():
            raise UsageError(f"{self.out_dir} holds the checkpoints of another run: load them first "
                             "(load_checkpoint(), train(resume=True)) or replace them (train(overwrite=True))")
        with interrupts.deferred():
            step = self.step
            tensors = {k: v.detach().cpu().contiguous() for k, v in self.lm.state_dict().items()}
            state = {
                "step": step,
                "optimizer_name": self.config.optimizer,
                "optimizer": self.optimizer.state_dict(),
                "data": json.dumps(self.data.state_dict()),
                "torch_rng": torch.get_rng_state(),
                "sampler_rng": self.sampler.get_state(),
                "python_rng": json.dumps(random.getstate()),
                "lstm_state": None if self.lstm_state is None else [s.cpu() for s in self.lstm_state],
            }
            if self.device.type == "cuda":
                state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
            self._kept = ckpt.write_checkpoint(self.out_dir, step, tensors, state, previous=self._kept,
                                               keep=self.config.keep_checkpoints, run=self._run_identity())
            self._saved_step = step
            self._last_checkpoint_time = _clock()
        return self.out_dir / ckpt.tensor_file_name(step)

    def load_checkpoint(self) -> bool:
        """Restore the newest checkpoint of ``out_dir`` that verifies; return whether one was loaded (``False``: there
        is no ``checkpoint.json``). A damaged newest checkpoint is skipped with a ``WARNING`` naming the file.

        Raises:
            CheckpointError: no listed checkpoint verifies (names the files); the vocabulary changed since the run
                started (names the vocabulary file and both sizes); the checkpoint does not fit this model or run
                (names the checkpoint file and the first tensor, or the part of the state, that differs).
        """
        loaded = ckpt.load_latest(self.out_dir)
        if loaded is None:
            return False
        self._check_run_identity(loaded.manifest)
        t_path, s_path = (self.out_dir / n for n in loaded.entry.file_names)
        self._check_fits(loaded.tensors, t_path)
        state = loaded.state
        try:
            self.lm.load_state_dict(loaded.tensors)
        except RuntimeError as exc:  # names and shapes were checked; this would be e.g. a dtype torch cannot copy
            raise CheckpointError(f"{t_path} cannot be loaded into the model ({_one_line(exc)})") from None
        saved_optimizer = state.get("optimizer_name", self.config.optimizer)  # first-format states do not say
        if saved_optimizer != self.config.optimizer:
            raise CheckpointError(f"{s_path} holds the state of the optimizer {saved_optimizer!r}, this run uses "
                                  f"{self.config.optimizer!r}: resume with the options the run was started with, or "
                                  "start a new run with --overwrite")
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{s_path}: the optimiser state does not fit this run ({_one_line(exc)}): it was "
                                  f"written with other options (optimizer {self.config.optimizer!r}?); resume with "
                                  "the options the run was started with, or start a new run with --overwrite") from None
        try:
            self.data.load_state_dict(json.loads(state["data"]))
        except (KeyError, TypeError, ValueError) as exc:  # UsageError (another corpus or options) is a ValueError
            raise CheckpointError(f"{s_path}: the saved data position does not fit this run: "
                                  f"{_one_line(exc)}") from None
        try:
            torch.set_rng_state(state["torch_rng"])
            self.sampler.set_state(state["sampler_rng"])
            py = json.loads(state["python_rng"])
            random.setstate((py[0], tuple(py[1]), py[2]))
            lstm_state = state["lstm_state"]
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{s_path}: the saved random-number state cannot be restored "
                                  f"({_one_line(exc)})") from None
        self.lstm_state = None if lstm_state is None else tuple(s.to(self.device) for s in lstm_state)
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step = loaded.entry.step
        self._kept = [e for e in loaded.manifest.checkpoints if e.step <= self.step]
        self._saved_step = self.step
        self._owns_out_dir = True
        self._truncate_metrics(self.step)
        logger.info("resumed from step %d (%s)", self.step, t_path)
        return True

    def _check_run_identity(self, manifest: ckpt.Manifest) -> None:
        c = self.config
        for key, now, what in (("vocab", self._vocab_fingerprint, "vocabulary"),
                               ("char_vocab", self._run_identity().get("char_vocab"), "character vocabulary")):
            saved = manifest.run.get(key)
            if not isinstance(saved, dict) or now is None:
                continue  # a first-format manifest records none: the tensor shapes are checked instead
            if saved.get("size") == now["size"] and saved.get("sha256") == now["sha256"]:
                continue
            if key == "vocab" and c.vocab_file:
                source = f"the vocabulary file {c.vocab_file}"
            else:
                source = f"the {what} built from the training files ({', '.join(map(str, c.train_files))})"
            if saved.get("size") == now["size"]:
                how = f"has the same size ({now['size']}) but other entries or another order than when the run started"
            else:
                how = f"has {now['size']} entries now, the run was trained with {saved.get('size')}"
            raise CheckpointError(
                f"{source} {how} (checkpoints in {self.out_dir}): it was edited since. To --resume, put back the "
                f"{what} the run started with; to train with the new one, start a new run (--overwrite, or another "
                "--out-dir)")

    def _check_fits(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        """The checkpoint's tensors must be exactly the model's (names and shapes), else a message naming the first
        one that differs (``load_state_dict`` would raise a long torch error listing them all)."""
        advice = ("it was written for another model (options, vocabulary or character vocabulary): resume with the "
                  "options the run was started with (see train_config.json), or start a new run with --overwrite")
        check_state_fits(self.lm.state_dict(), tensors, str(path), error=CheckpointError, advice=advice)

    def _recovery_hint(self) -> str:
        step = self._saved_step if self._saved_step is not None else latest_checkpoint_step(self.out_dir)
        if step is not None:
            return (f"The last good checkpoint (step {step}) in {self.out_dir} is intact: check the data and --resume, "
                    "or start a new run with a lower learning rate")
        return "No checkpoint was written yet: start a new run with a lower learning rate, or check the data"

    def _truncate_metrics(self, step: int) -> None:
        """Keep the metrics of steps <= ``step`` (a line cut by a kill, not valid JSON, is dropped too)."""
        path = self.out_dir / "metrics.jsonl"
        if not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                logger.warning("%s: dropping an unreadable line %r (cut by a kill?)", path, line[:80])
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    # ------------------------------------------------------------------ the output folder
    def _start_new_run(self, overwrite: bool) -> None:
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise UsageError(f"the output folder {self.out_dir} is a file: give a folder path (--out-dir)")
        found = ckpt.run_files(self.out_dir)
        if found and not overwrite:
            resumable = latest_checkpoint_step(self.out_dir) is not None
            raise UsageError(f"{self.out_dir} already holds a training run ({_describe_run(self.out_dir, found)}): "
                             "pass --overwrite to replace it" + (", or --resume to continue it" if resumable else
                                                                 " (it has no checkpoint to --resume from)"))
        if found:
            removed = ckpt.remove_run_files(self.out_dir)
            logger.warning("overwrite: removed the previous run from %s (%s)", self.out_dir,
                           ", ".join(p.name for p in removed))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._kept, self._saved_step, self._owns_out_dir = [], None, True

    # ------------------------------------------------------------------ loop
    def _step_nll(self, batch):
        c = self.config
        if c.batching == "windows":
            nll, self.lstm_state = self.lm.window_nll(
                batch.forward_inputs, batch.forward_targets, batch.backward_inputs, batch.backward_targets,
                self.lstm_state if self._state_fits(batch) else None,
                num_samples=c.n_negative_samples, generator=self.sampler)
            return nll
        return self.lm.sentence_nll(batch, num_samples=c.n_negative_samples, generator=self.sampler)

    def _state_fits(self, batch) -> bool:
        return self.lstm_state is not None and self.lstm_state[0].shape[2] == len(batch.forward_inputs)

    def _checkpoint_due(self) -> bool:
        c = self.config
        if self.step % c.checkpoint_every == 0:
            return True
        return c.checkpoint_minutes is not None and _clock() - self._last_checkpoint_time >= 60.0 * c.checkpoint_minutes

    def _on_interrupt(self, mid_step: bool) -> None:
        """Ctrl-C/SIGTERM reached the loop: write a checkpoint at the current step when it is consistent (the signal
        landed between steps) and newer than the last one, and say where the run stands."""
        why = interrupts.signal_name() or "KeyboardInterrupt"
        last = self._saved_step
        if mid_step:
            # only without interrupts.handling_signals() (or on a second Ctrl-C): the step was cut, its state is torn
            logger.warning("%s in the middle of a step: nothing saved (a cut step cannot be resumed); %s", why,
                           f"the latest checkpoint is step {last}" if last is not None else "no checkpoint yet")
            return
        if self.step == 0 or self.step == last:
            logger.warning("%s at step %d: %s", why, self.step, f"the checkpoint of step {last} is the latest, "
                           "resume continues from there" if last is not None else "nothing trained yet")
            return
        try:
            self.save_checkpoint()
        except KeyboardInterrupt:
            pass  # deferred() re-raises the signal being handled at the end of a complete write; a second one cuts it
        except Exception as exc:  # e.g. disk full: say so, and still stop as interrupted
            logger.error("%s at step %d: writing its checkpoint failed (%s); %s", why, self.step, _one_line(exc),
                         f"the latest checkpoint is step {last}" if last is not None else "no checkpoint written")
            return
        if self._saved_step == self.step:
            logger.warning("%s: stopped after step %d, checkpoint written (%s); resume continues from step %d", why,
                           self.step, self.out_dir / ckpt.tensor_file_name(self.step), self.step)
        else:  # a second Ctrl-C cut the write: the previous checkpoint is still the latest
            logger.warning("%s again while writing the checkpoint of step %d: %s", why, self.step,
                           f"the latest checkpoint is step {last}" if last is not None else "no checkpoint written")

    def train(self, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Run to the end of the configured epochs / steps.

        Args:
            resume: continue from the newest good checkpoint in ``out_dir`` (from step 0, with a warning, when there
                is none yet).
            overwrite: start a new run in a folder that holds one: its files (``ckpt-*``, ``checkpoint.json``,
                ``metrics.jsonl``, ``learning_curve.png``, ``train_config.json``, ``model/``) are deleted first.

        Without either, a folder holding a run is refused; an empty or missing folder, or one holding only other
        files, is fine. Ctrl-C / SIGTERM (under :func:`elmokit.interrupts.handling_signals`) stops after the current
        step with a checkpoint at that step, then raises ``KeyboardInterrupt``.

        Returns a summary: steps, tokens, seconds (this call, saving included), loop_seconds (the training steps
        alone), tokens_per_s, final loss, paths.

        Raises:
            UsageError: the folder holds a run and neither ``resume`` nor ``overwrite`` is given (names the folder,
                what it holds and both ways out); both are given; ``out_dir`` is a file.
            CheckpointError: on resume, see :meth:`load_checkpoint`.
            TrainingError: a non-finite loss or gradient (names the step; the last good checkpoint is kept), or no
                batch at all.
            KeyboardInterrupt: Ctrl-C / SIGTERM, after the checkpoint at the interrupt was written.
        """
        from tqdm.auto import tqdm

        c = self.config
        if resume and overwrite:
            raise UsageError(f"resume and overwrite exclude each other: --resume continues the run in {self.out_dir}, "
                             "--overwrite replaces it")
        if resume:
            if self.out_dir.exists() and not self.out_dir.is_dir():
                raise UsageError(f"the output folder {self.out_dir} is a file: give a folder path (--out-dir)")
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if not self.load_checkpoint():
                orphans = sorted(p.name for p in self.out_dir.iterdir() if ckpt._CKPT_RE.match(p.name))
                if orphans:
                    raise CheckpointError(f"{self.out_dir} has checkpoint files ({', '.join(orphans[:4])}"
                                          f"{', …' if len(orphans) > 4 else ''}) but no checkpoint.json naming them "
                                          "(deleted or never written): it cannot be told which are complete. Restore "
                                          "checkpoint.json, or start again with --overwrite")
                logger.warning("no checkpoint in %s yet: starting from step 0", self.out_dir)
                (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)
                self._owns_out_dir = True
        else:
            self._start_new_run(overwrite)
        atomic_write_text(self.out_dir / "train_config.json", json.dumps(asdict(c), indent=2) + "\n")
        if c.n_negative_samples and c.n_negative_samples >= len(self.vocab) - 1:
            logger.warning("the vocabulary has %d tokens, not more than n_negative_samples=%d (--negatives) + 1: "
                           "training uses the full softmax (exact; pass 0 negatives to ask for it)",
                           len(self.vocab), c.n_negative_samples)
        self.lm.train()
        previous_determinism = (torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled())
        if c.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        metrics = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")
        bar = tqdm(total=c.max_steps, initial=self.step, unit="step", disable=not c.progress, desc="training",
                   mininterval=0.1 if sys.stderr.isatty() else 30.0)
        tokens_seen, start = 0, time.perf_counter()
        self._last_checkpoint_time = _clock()
        last_loss = float("nan")
        window: list[tuple[float, float, float]] = []
        mid_step = False
        try:
            batches = iter(self.data)
            while c.max_steps is None or self.step < c.max_steps:
                # one step (draw, forward, backward, update, log, checkpoint) is never cut by Ctrl-C/SIGTERM: the
                # signal raises KeyboardInterrupt at the end of the block, with the state consistent
                with interrupts.deferred():
                    mid_step = True
                    # test max_steps before drawing: a batch drawn and not trained on would be skipped after a resume
                    batch = next(batches, None)
                    if batch is None:
                        mid_step = False
                        break
                    self.step += 1
                    nll = self._step_nll(batch)
                    loss = nll.loss()
                    if not torch.isfinite(loss):
                        raise TrainingError(f"non-finite loss ({float(loss.detach())}) at step {self.step}; stopping. "
                                            + self._recovery_hint())
                    self.optimizer.zero_grad(set_to_none=True)
                    (loss * c.unroll_steps).backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.lm.parameters(), c.clip_norm)
                    if not torch.isfinite(grad_norm):
                        raise TrainingError(f"non-finite gradient norm at step {self.step} (loss "
                                            f"{float(loss.detach()):.4f}); stopping before the update. "
                                            + self._recovery_hint())
                    self.optimizer.step()
                    n_tok = int(nll.forward.numel())
                    tokens_seen += n_tok
                    last_loss = float(loss.detach())
                    window.append((float(nll.forward.detach().mean()), float(nll.backward.detach().mean()), n_tok))
                    elapsed = time.perf_counter() - start
                    if self.step % c.log_every == 0:
                        f = sum(a * n for a, _, n in window) / max(1, sum(n for *_, n in window))
                        b = sum(bb * n for _, bb, n in window) / max(1, sum(n for *_, n in window))
                        record = {"step": self.step, "loss": round(last_loss, 6), "train_ppl_fwd": _exp(f),
                                  "train_ppl_bwd": _exp(b), "train_ppl": _exp(0.5 * (f + b)),
                                  "tokens_per_s": tokens_seen / max(elapsed, 1e-9), "lr": c.learning_rate}
                        metrics.write(json.dumps(record) + "\n")
                        metrics.flush()
                        window = []
                    bar.update(1)
                    # refresh=False: the bar redraws at its own interval (30 s when stderr is not a terminal)
                    bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
                                    refresh=False)
                    if self._checkpoint_due():
                        self.save_checkpoint()
                    mid_step = False
            loop_seconds = time.perf_counter() - start
            if self.step == 0:
                raise TrainingError(
                    f"no training step could be made: the data yields no batch (batching={c.batching!r}, batch size "
                    f"{c.batch_size}{', unroll steps ' + str(c.unroll_steps) if c.batching == 'windows' else ''}, "
                    f"{c.n_epochs} epoch(s), max_steps={c.max_steps}); use a smaller batch size, more epochs or "
                    "more data")
            if self._saved_step != self.step:
                self.save_checkpoint()
        except KeyboardInterrupt:
            self._on_interrupt(mid_step)
            raise
        finally:
            bar.close()
            metrics.close()
            torch.use_deterministic_algorithms(previous_determinism[0], warn_only=previous_determinism[1])
        with interrupts.deferred():
            model_dir = save_lm(self.lm, self.out_dir / "model")
        curve = plot_learning_curve(self.out_dir / "metrics.jsonl", self.out_dir / "learning_curve.png")
        seconds = time.perf_counter() - start
        return {"steps": self.step, "tokens": tokens_seen, "seconds": seconds, "loop_seconds": loop_seconds,
                "final_loss": last_loss if math.isfinite(last_loss) else None,
                "tokens_per_s": tokens_seen / max(seconds, 1e-9), "model_dir": str(model_dir),
                "learning_curve": str(curve) if curve else None}


def latest_checkpoint_step(out_dir: str | os.PathLike) -> int | None:
    """The step of the newest checkpoint in ``out_dir`` that verifies (files present with the sizes and sha256 that
    ``checkpoint.json`` records), i.e. where ``Trainer.train(resume=True)`` would continue; ``None`` when there is
    nothing to resume (no checkpoint, an unreadable manifest, or no checkpoint verifies). Logs nothing."""
    return ckpt.latest_valid_step(out_dir)


def _describe_run(out_dir: Path, found: list[Path]) -> str:
    try:
        manifest = ckpt.read_manifest(out_dir)
    except CheckpointError:
        manifest = None
    names = [p.name + ("/" if p.is_dir() else "") for p in found]
    parts = [", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")]
    if manifest is not None and manifest.newest is not None:
        parts.append(f"latest checkpoint: step {manifest.newest.step}")
    parts.append("finished: model/ written" if (out_dir / "model").is_dir() else "not finished (no model/)")
    return "; ".join(parts)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _clock() -> float:
    """Seconds on a monotonic clock (``checkpoint_minutes``); a function so tests can replace it."""
    return time.monotonic()


def _exp(x: float) -> float:
    """``math.exp`` that gives ``inf`` instead of raising for a huge loss (metrics must not stop training)."""
    return math.exp(x) if x < 700 else float("inf")


def plot_learning_curve(metrics_path: Path, out_png: Path) -> Path | None:
    """Training perplexity (log scale) per step from ``metrics.jsonl`` → PNG (atomic). ``None`` if nothing logged."""
    if not metrics_path.is_file():
        return None
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in rows]
    for key, label in (("train_ppl_fwd", "forward"), ("train_ppl_bwd", "backward"), ("train_ppl", "average")):
        ax.plot(steps, [r[key] for r in rows], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training perplexity")
    ax.set_title("per logged batch, with dropout; sampled softmax if used", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out_png, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out_png
