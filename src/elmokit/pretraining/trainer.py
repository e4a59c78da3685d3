"""Pretraining a biLM: the training loop, checkpoints that resume exactly, held-out evaluation, one or many processes.

Optimiser defaults follow bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0), global gradient-norm clip 10,
dropout 0.1, loss ``0.5 · (NLL_fwd + NLL_bwd) · unroll_steps`` (the scale matters for Adagrad), the NLLs being the
means over every target of the step's global batch.

Shape. :func:`build_trainer` (``Trainer.from_config``) makes everything a run needs from its :class:`TrainConfig` —
the data parts of this process (:class:`~elmokit.pretraining.data.TrainingData`), the vocabulary, the model
(:class:`BidirectionalLM`, from ``init_from`` when given: :mod:`elmokit.pretraining.init_from`), the optimiser and
the held-out sentences — and hands them to :class:`Trainer`, which is given them (so a caller can hand in its own).
:meth:`Trainer.train_step` is one optimiser step on one :class:`~elmokit.pretraining.data.StepBatch`; the loop
(:meth:`Trainer.train`) and ``bench/train.py`` both use it. Every file is written by the main process only, through
:class:`~elmokit.pretraining.run_folder.RunFolder`.

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
  when you embed statefully as the original did. A window-trained model is saved with a fixed **start state** (the
  mean carried state at sentence starts, :meth:`Trainer.refresh_start_state`), which every stateless call, the
  held-out curve and ``evaluate_perplexity`` then read each sentence from instead of zeros
  (``experiments/results/initial-state.md`` has the figures); a sentence-trained model keeps zeros.

Randomness. Initialisation comes from ``seed``; the dropout masks of data part ``d`` at step ``s`` and the sampled
softmax negatives of step ``s`` come from seeds derived from ``(seed, s, d)`` and ``(seed, s)``
(:func:`step_seed`), not from a stream carried from step to step. So a resumed run repeats the steps exactly without
saving RNG states, and every process draws what one process computing all the parts would draw: the negatives are the
same for all parts (one shared set per step, as one process would draw for the whole batch).

Many processes (``torchrun --nproc-per-node N -m elmokit train …``, :mod:`elmokit.pretraining.distributed`): the
model is wrapped in :class:`torch.nn.parallel.DistributedDataParallel` (gloo on CPU, nccl on CUDA); ``batch_size`` is
the global batch; the corpus and each batch are cut into ``data_parts`` parts (default: the number of processes at the
start), process ``r`` computes parts ``d ≡ r (mod N)``, and each part's loss is scaled so that the averaged gradients
are the gradient of the global batch's loss: N processes compute what one process computes with the same
``data_parts`` (the same losses to rounding). The main process decides time-based checkpoints and evaluations, any
process an interrupt, and all act on one shared flag vector per step; checkpoints hold every part's data position, so
a run resumes on any number of processes from 1 to ``data_parts`` (more is refused, saying what is allowed). The run
folder must be on a file system all processes see (each reads the checkpoint on resume).

Held-out curve (``valid_files``): full-softmax perplexity (forward, backward, average) at step 0, every
``valid_every`` steps and/or ``valid_minutes`` minutes and at the end, as ``{"kind": "valid", ...}`` records in
``metrics.jsonl``, drawn on the learning curve; the model of the lowest average so far is kept in ``best/``
(:mod:`elmokit.pretraining.run_folder` has the folder layout). Evaluations do not touch the training's randomness, so
they do not change what is trained.

Nothing is lost (see :mod:`elmokit.pretraining.checkpoint` for the file format):

* A new run refuses a folder that already holds a run (:class:`~elmokit.errors.UsageError`): ``overwrite=True``
  deletes that run's own files (and nothing else) first, ``resume=True`` continues it.
* Checkpoints: every ``checkpoint_every`` steps, every ``checkpoint_minutes`` minutes when set, at the end, and when
  the run is interrupted. The newest ``keep_checkpoints`` are kept; on resume the newest is verified (sizes, sha256,
  readable) and a damaged one is skipped with a warning for the previous one.
* Ctrl-C / SIGTERM (with :func:`elmokit.interrupts.handling_signals` installed, as the CLI does): each step (draw a
  batch, forward, backward, update, log, evaluate, checkpoint) runs inside :func:`elmokit.interrupts.deferred`, so the
  signal lands between two steps; the trainer then writes a checkpoint at that step (when it is newer than the last
  one), logs it, and re-raises ``KeyboardInterrupt``. ``resume=True`` continues bit-exactly from there.
* Resume checks that the vocabulary (size and sha256 of its tokens) and the model's tensor shapes are those of the run,
  and says which file differs (:class:`~elmokit.errors.CheckpointError`) instead of failing inside ``torch``.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from elmokit import interrupts
from elmokit.characters import CharVocabulary
from elmokit.devices import resolve_device  # noqa: F401  (re-exported: elmokit.pretraining.trainer.resolve_device)
from elmokit.errors import CheckpointError, ElmoError, MissingFileError, TrainingError, UsageError, WeightsError
from elmokit.io import lock_folder
from elmokit.vocabulary import Vocabulary
from elmokit.weights import check_state_fits
from elmokit.pretraining import checkpoint as ckpt
from elmokit.pretraining.config import MAX_LEARNING_RATE, TrainConfig  # noqa: F401  (MAX_LEARNING_RATE re-exported)
from elmokit.pretraining.data import (PartBatch, StepBatch, TrainingData, char_vocabulary_from_counts, check_corpus_unchanged,
                   corpus_fingerprint, parts_of_process, read_sentences, vocabulary_from_counts)
from elmokit.pretraining.distributed import DistContext, single_process
from elmokit.pretraining.objective import BidirectionalLM, DirectionalNLL
from elmokit.pretraining.run_folder import RunFolder, check_outside_patterns, plot_learning_curve

__all__ = ["TrainConfig", "Trainer", "TrainingError", "StepResult", "build_trainer", "make_optimizer", "save_lm",
           "load_lm", "latest_checkpoint_step", "plot_learning_curve", "step_seed", "VALID_BATCH_SENTENCES"]

logger = logging.getLogger(__name__)

#: Sentences per forward pass of the held-out evaluation (the result does not depend on it).
VALID_BATCH_SENTENCES = 32
#: Test hooks (like ``ELMOKIT_TEST_KILL_AT`` of the checkpoint writer): ``ELMOKIT_TEST_DIGESTS=<prefix>`` makes every
#: process append ``{"step", "sha256"}`` of its parameters after each step to ``<prefix>.rank<R>.jsonl``;
#: ``ELMOKIT_TEST_SIGINT_AT=<rank>:<step>`` makes process ``rank`` send itself SIGINT during that step.
DIGEST_ENV, SIGINT_ENV = "ELMOKIT_TEST_DIGESTS", "ELMOKIT_TEST_SIGINT_AT"


def step_seed(seed: int, step: int, what: str, part: int | None = None) -> int:
    """The seed of ``what`` (``"dropout"`` of a data part, ``"negatives"``) at ``step``: the first 63 bits of
    sha256(``elmokit:seed:step:what:part``), the same on every process and machine."""
    digest = hashlib.sha256(f"elmokit:{seed}:{step}:{what}:{part}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class StepResult:
    """What :meth:`Trainer.train_step` measured over the whole global batch: the step number, the loss
    ``0.5 · (NLL_fwd + NLL_bwd)`` (nats, before the ``unroll_steps`` scale), each direction's mean NLL, the targets
    per direction, and the gradient norm before clipping."""

    step: int
    loss: float
    nll_forward: float
    nll_backward: float
    tokens: int
    grad_norm: float


# ---------------------------------------------------------------------------------------------- saving models
def save_lm(lm: BidirectionalLM, out_dir: str | os.PathLike) -> Path:
    """Save a trained LM in the native format: the biLM (loadable by :func:`elmokit.load_native`, ``Elmo``), the softmax
    (``softmax.weight``, ``softmax.bias``), ``vocab.txt`` and, in character-vocabulary mode, ``chars.txt``."""
    from elmokit.weights.native import save_pretrained

    return save_pretrained(lm.bilm, out_dir, vocab_lines=lm.vocab.tokens,
                           extra_tensors={f"softmax.{k}": v for k, v in lm.softmax.state_dict().items()})


def load_lm(model_dir: str | os.PathLike) -> BidirectionalLM:
    """Load :func:`save_lm`'s folder (or a zoo model name, ``elmokit-en``) as a :class:`BidirectionalLM` (eval mode).

    Raises:
        MissingFileError: the folder lacks ``config.json``, the weights or ``vocab.txt``, or the weights hold no softmax
            (only an embedding model was saved); a zoo model that is not built.
        WeightsError: the softmax does not fit ``vocab.txt`` and the config.
    """
    from elmokit.weights.native import WEIGHTS_NAME, load_native, resolve_model_name

    model_dir = Path(resolve_model_name(model_dir))
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
    lm.bilm.set_start_state(bilm.start_state, bilm.start_state_source)  # not in state_dict (see BiLM.start_state)
    if tuple(tensors["softmax.weight"].shape) != tuple(lm.softmax.weight.shape):
        raise WeightsError(f"{model_dir}: softmax.weight has shape {tuple(tensors['softmax.weight'].shape)} but "
                           f"vocab.txt and the config imply {tuple(lm.softmax.weight.shape)}")
    lm.softmax.load_state_dict({"weight": tensors["softmax.weight"], "bias": tensors["softmax.bias"]})
    return lm.eval()


# ---------------------------------------------------------------------------------------------- the factory
def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    """``config.optimizer`` over ``params``: Adagrad (initial accumulator 1.0, as bilm-tf) or Adam, at
    ``config.learning_rate``."""
    params = list(params)
    if config.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=config.learning_rate, initial_accumulator_value=1.0)
    return torch.optim.Adam(params, lr=config.learning_rate)


def build_trainer(config: TrainConfig, dist: DistContext | None = None) -> "Trainer":
    """Build a :class:`Trainer` and everything it is given from ``config`` (a copy of it is kept: the caller's object
    is not changed), on this process's share of the data.

    Steps: validate the config; load ``init_from`` (which gives the architecture); cut the data into ``data_parts``
    parts and open this process's (:func:`~elmokit.pretraining.data.parts_of_process`); the vocabulary (``vocab_file``,
    or counted part by part and added up over the processes); the character vocabulary (the init model's, or counted
    so); the model (initialised from ``seed`` without touching the global RNG, then the init model's weights); the
    optimiser; the held-out sentences. Every step that may fail on one process is shared (:meth:`DistContext.agree`),
    so all processes raise the same error.

    Raises:
        ConfigError: options (see :meth:`TrainConfig.validate`).
        UsageError: the device; more processes than data parts; ``init_from`` options that conflict (see
            :func:`elmokit.pretraining.init_from.check_architecture`) or a name that is no model.
        MissingFileError: training/held-out files or the vocabulary missing; an init model that is not there.
        DataError: corpus or vocabulary contents unusable (naming file:line), a data part without lines.
        WeightsError: an init model whose files cannot be read or do not fit.
    """
    from elmokit.pretraining.init_from import apply_init_model, check_architecture, load_init_model

    dist = dist or single_process()
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
    n_parts = config.data_parts or dist.world_size
    config.data_parts = n_parts
    config.validate()
    device = dist.device_for(config.device)
    parts = parts_of_process(dist.rank, dist.world_size, n_parts)
    data = dist.agree(lambda: TrainingData(config, parts, n_parts))

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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        lm = BidirectionalLM(model_config, vocab, dropout=config.dropout, char_vocab=char_vocab)
    kept_softmax = apply_init_model(lm, init) if init is not None else False
    try:
        lm.to(device)
    except RuntimeError as exc:  # e.g. "mps" on a build without MPS support
        raise UsageError(f"device {config.device!r} cannot be used here ({_one_line(exc)}): use auto, cpu, cuda "
                         "or cuda:N") from None
    optimizer = make_optimizer(config, lm.parameters())
    valid = None
    if config.valid_files:
        valid = dist.agree(lambda: read_sentences(config.valid_files, config.decode_errors))
    trainer = Trainer(config, lm, optimizer, data, dist=dist, valid=valid)
    trainer.init_softmax_kept = kept_softmax
    return trainer


def _check_valid_patterns(patterns) -> None:
    """Every held-out pattern matches a file (before the training text is read; the message names --valid-files)."""
    from elmokit.data.corpus import TextCorpus

    for pattern in patterns:
        try:
            TextCorpus(pattern)  # expands the pattern only; nothing is read yet
        except MissingFileError as exc:
            raise MissingFileError(f"the held-out text (valid_files, --valid-files): {exc}") from None


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """Train a :class:`BidirectionalLM` as configured; :meth:`train` runs (or resumes) to the end.

    Args:
        config: the run.
        lm: the model (its vocabulary and character vocabulary are the run's), on its device.
        optimizer: over ``lm``'s parameters. data: this process's data parts.
        dist: this process among the training processes (default: one process).
        valid: held-out sentences (for ``config.valid_files``), or ``None``.

    ``Trainer(config)`` alone is :func:`build_trainer` (``Trainer.from_config``).

    Raises (when building): see :func:`build_trainer`. From :meth:`train`: see there.
    """

    def __init__(self, config: TrainConfig, lm: BidirectionalLM | None = None,
                 optimizer: torch.optim.Optimizer | None = None, data: TrainingData | None = None, *,
                 dist: DistContext | None = None, valid: list[list[str]] | None = None) -> None:
        if lm is None or optimizer is None or data is None:
            if not (lm is None and optimizer is None and data is None):
                raise UsageError("Trainer: give the model, the optimiser and the data together, or none of them "
                                 "(then build_trainer(config) makes them)")
            built = build_trainer(config, dist)
            self.__dict__.update(built.__dict__)
            return
        self.config = config
        self.dist = dist or single_process()
        self.lm = lm
        self.optimizer = optimizer
        self.data = data
        self.vocab = lm.vocab
        self.char_vocab = lm.char_vocab
        self.device = lm.softmax.weight.device
        self.out_dir = Path(config.out_dir)
        self.run = RunFolder(self.out_dir, writer=self.dist.is_main)
        self.valid = None if valid is None else sorted(valid, key=len)
        self.init_softmax_kept = False
        self.sampler = torch.Generator().manual_seed(config.seed + 1)
        self.step = 0
        #: wall seconds of each step (draw, forward, backward, update) of the latest :meth:`train` call, in order
        self.step_seconds: list[float] = []
        self.lstm_states: dict[int, Any] = {}
        self.best: dict[str, Any] | None = None  # the held-out record of the best model (in best/)
        self._ddp = None
        self._vocab_fingerprint = self.vocab.fingerprint()
        self._kept: list[ckpt.CheckpointEntry] = []  # checkpoints of this run on disk, oldest first
        self._saved_step: int | None = None  # step of the newest checkpoint written or loaded
        self._last_valid_step: int | None = None
        self._last_checkpoint_time = self._last_valid_time = _clock()
        self._owns_out_dir = False  # set once this trainer started, resumed or loaded the run in out_dir
        self._start_state_step: int | None = None  # the step whose weights the model's start state was computed for
        self._interrupt_handled = False
        self._corpus: dict[str, Any] | None = None  # the training files' fingerprint (main process), see _prepare
        #: Where the main process reports what the user should see at once (resuming from which step): the CLI
        #: prints it; by default it is logged at INFO.
        self.say: Callable[[str], None] = logger.info

    @classmethod
    def from_config(cls, config: TrainConfig, dist: DistContext | None = None) -> "Trainer":
        """:func:`build_trainer`."""
        return build_trainer(config, dist)

    @property
    def model(self) -> BidirectionalLM:
        """The model being trained (``lm``)."""
        return self.lm

    # ------------------------------------------------------------------ one step
    def next_batch(self) -> StepBatch | None:
        """Draw this process's parts of the next step; ``None`` when the data of any part of any process ran out.
        Collective: the token count of the global batch is added up over the processes, and a corpus error on one
        process (e.g. invalid UTF-8 in its part) is raised on all."""
        error, parts = None, None
        try:
            parts = self.data.next_parts()
        except (ElmoError, OSError) as exc:
            error = exc
        local = sum(p.n_tokens for p in parts) if parts else 0
        total, exhausted, failed = self.dist.all_reduce([local, parts is None and error is None, error is not None])
        if failed:
            self.dist.raise_shared(error)
        if exhausted:
            return None
        return StepBatch(parts, int(total))

    def train_step(self, batch: StepBatch) -> StepResult:
        """One optimiser step on ``batch`` (this process's parts of the global batch); returns the figures of the
        whole global batch.

        Each part is read with its own dropout seed and the step's negatives seed (:func:`step_seed`); its loss is
        ``0.5 · (Σ NLL_fwd + Σ NLL_bwd) / total_tokens · world_size · unroll_steps`` so that the gradients, summed over
        the parts and averaged over the processes (DistributedDataParallel), are those of the global batch's loss.
        With ``freeze_bilm_steps``, steps 1 … N leave the biLM as it is.

        Raises:
            TrainingError: a non-finite loss or gradient norm (names the step; nothing is updated).
        """
        c = self.config
        step = self.step + 1
        frozen = step <= c.freeze_bilm_steps
        model = self._ddp if self._ddp is not None else self.lm
        self.optimizer.zero_grad(set_to_none=True)
        scale = 0.5 * self.dist.world_size * c.unroll_steps / max(1, batch.total_tokens)
        sum_f = sum_b = 0.0
        for i, part in enumerate(batch.parts):
            torch.manual_seed(step_seed(c.seed, step, "dropout", part.part))
            self.sampler.manual_seed(step_seed(c.seed, step, "negatives"))
            last = i == len(batch.parts) - 1
            sync = contextlib.nullcontext() if self._ddp is None or last else self._ddp.no_sync()
            with sync:
                fwd, bwd, state = model(part.data, batching=c.batching, state=self._state_for(part),
                                        num_samples=c.n_negative_samples, generator=self.sampler, freeze_bilm=frozen)
                if fwd.numel() != part.n_tokens or bwd.numel() != part.n_tokens:
                    raise TrainingError(f"internal: part {part.part} of step {step} has {part.n_tokens} targets, "
                                        f"the model scored {fwd.numel()}/{bwd.numel()}")
                ((fwd.sum() + bwd.sum()) * scale).backward()
            if state is not None:
                self.lstm_states[part.part] = state
            sum_f += float(fwd.detach().double().sum())
            sum_b += float(bwd.detach().double().sum())
        sum_f, sum_b = self.dist.all_reduce([sum_f, sum_b])
        n = max(1, batch.total_tokens)
        loss = 0.5 * (sum_f + sum_b) / n
        if not math.isfinite(loss):
            raise TrainingError(f"non-finite loss ({loss}) at step {step}; stopping. " + self._recovery_hint())
        if frozen:
            for p in self.lm.bilm.parameters():
                p.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.lm.parameters() if p.grad is not None],
                                                   c.clip_norm)
        if not torch.isfinite(grad_norm):
            raise TrainingError(f"non-finite gradient norm at step {step} (loss {loss:.4f}); stopping before the "
                                "update. " + self._recovery_hint())
        self.optimizer.step()
        self.step = step
        return StepResult(step, loss, sum_f / n, sum_b / n, int(batch.total_tokens), float(grad_norm))

    def _state_for(self, part: PartBatch):
        state = self.lstm_states.get(part.part)
        if state is None or self.config.batching != "windows":
            return None
        return state if state[0].shape[2] == len(part.data.forward_inputs) else None

    def _step_nll(self, batch) -> DirectionalNLL:
        """The NLL of a step's parts (a :class:`StepBatch` or a list of :class:`PartBatch`), concatenated, with the
        model's current randomness and no update (kept for ``bench/device_check.py``; training uses
        :meth:`train_step`)."""
        parts = batch.parts if isinstance(batch, StepBatch) else batch
        fwd, bwd, rows = [], [], []
        for part in parts:
            f, b, state = self.lm(part.data, batching=self.config.batching, state=self._state_for(part),
                                  num_samples=self.config.n_negative_samples, generator=self.sampler)
            if state is not None:
                self.lstm_states[part.part] = state
            fwd.append(f)
            bwd.append(b)
            rows.append(torch.zeros(f.numel(), dtype=torch.long, device=f.device))
        r = torch.cat(rows)
        return DirectionalNLL(torch.cat(fwd), torch.cat(bwd), r, r)

    # ------------------------------------------------------------------ held-out evaluation
    def evaluate_heldout(self) -> dict[str, float]:
        """Full-softmax perplexity of the held-out sentences (each from the model's start state — zeros, or for a
        window-trained run the one :meth:`refresh_start_state` gives —, eval mode; see
        :func:`elmokit.pretraining.perplexity.evaluate_perplexity`): ``{"forward", "backward", "average", "tokens",
        "sentences"}``. Collective: each process scores its share and the sums are added up."""
        from elmokit.pretraining.perplexity import perplexities, perplexity_sums

        was_training = self.lm.training
        mine = (self.valid or [])[self.dist.rank::self.dist.world_size]
        try:
            sums = perplexity_sums(self.lm, mine, VALID_BATCH_SENTENCES) if mine else (0.0, 0.0, 0, 0)
        finally:
            self.lm.train(was_training)
        total_f, total_b, n_tok, n_sent = self.dist.all_reduce(list(sums))
        return perplexities(total_f, total_b, int(n_tok), int(n_sent))

    def refresh_start_state(self) -> None:
        """Give the model the start state it is read from (:attr:`elmokit.modules.bilm.BiLM.start_state`), for the
        current weights: a window-trained run (``batching="windows"``) gets the mean carried state at sentence starts
        over the first :data:`~elmokit.pretraining.start_state.START_STATE_SENTENCES` sentences of its training files
        in file order (:func:`~elmokit.pretraining.start_state.mean_start_state`: deterministic, no randomness drawn);
        a sentence-trained run keeps zeros (none stored). Why: ``experiments/results/initial-state.md``. Called before
        each held-out evaluation and before the model is saved, on every process (each computes the same state). The
        training steps do not use it (windows carry their own state from zeros)."""
        if self.config.batching != "windows" or self._start_state_step == self.step:
            return
        from elmokit.data.corpus import TextCorpus
        from elmokit.pretraining.start_state import describe, mean_start_state

        corpus = TextCorpus(list(self.config.train_files), errors=self.config.decode_errors)
        state, samples = mean_start_state(self.lm, corpus.sentences(0))
        if state is None and self.dist.is_main:
            logger.warning("batching='windows' but the training text has too few sentences for a start state "
                           "(%d sentence start(s) seen after the first of a stream): the model is read from zeros",
                           samples)
        self.lm.bilm.set_start_state(state, describe(samples))
        self._start_state_step = self.step

    def _validate(self) -> dict[str, Any]:
        """Evaluate, log the held-out record, and keep the model in best/ when it is the best so far."""
        self.dist.agree(self.refresh_start_state)
        ppl = self.evaluate_heldout()
        better = self.best is None or ppl["average"] < self.best["valid_ppl"]
        record = {"kind": "valid", "step": self.step, "valid_ppl_fwd": ppl["forward"],
                  "valid_ppl_bwd": ppl["backward"], "valid_ppl": ppl["average"], "valid_tokens": ppl["tokens"],
                  "valid_sentences": ppl["sentences"], "best": bool(better)}
        if better:
            self.best = {**record, "valid_files": list(self.config.valid_files or [])}
            self.dist.on_main(lambda: self.run.save_best(lambda folder: save_lm(self.lm, folder), self.best))
        self.run.log(record)
        self._last_valid_step = self.step
        self._last_valid_time = _clock()
        logger.info("held-out perplexity at step %d: forward %.2f, backward %.2f, average %.2f%s", self.step,
                    ppl["forward"], ppl["backward"], ppl["average"], " (best so far)" if better else "")
        return record

    # ------------------------------------------------------------------ checkpoints
    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint's tensors depend on besides the options: the vocabularies' sizes and sha256, and the
        training files' fingerprint (size, mtime, sha256 of each: on resume, a data position means something only in
        the same text)."""
        run: dict[str, Any] = {"vocab": {**self._vocab_fingerprint, "file": self.config.vocab_file}}
        if self._corpus is not None:
            run["corpus"] = {"files": self._corpus}
        if self.char_vocab is not None:
            run["char_vocab"] = {"size": self.char_vocab.vocab_size,
                                 "sha256": ckpt.text_digest(list(self.char_vocab.characters))}
        return run

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (see :func:`elmokit.pretraining.checkpoint.write_checkpoint`:
        tensor file, state file, then the manifest, each atomic; the newest ``keep_checkpoints`` are kept). Collective:
        the data positions and LSTM states of every part are gathered to the main process, which writes; its outcome
        is shared. Runs inside :func:`elmokit.interrupts.deferred`, so Ctrl-C/SIGTERM during the write takes effect
        after it.

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
            mine = ({str(d): s for d, s in self.data.state_dict().items()},
                    {str(d): [t.detach().cpu() for t in s] for d, s in self.lstm_states.items() if s is not None})
            gathered = self.dist.all_gather_object(mine)
            data_states = {k: v for g in gathered for k, v in g[0].items()}
            lstm_states = {k: v for g in gathered for k, v in g[1].items()}

            def write() -> None:
                tensors = {k: v.detach().cpu().contiguous() for k, v in self.lm.state_dict().items()}
                state = {
                    "step": step,
                    "optimizer_name": self.config.optimizer,
                    "optimizer": self.optimizer.state_dict(),
                    "data": json.dumps({"data_parts": self.data.n_parts, "parts": data_states}),
                    "lstm_state": lstm_states or None,
                    "best": json.dumps(self.best),
                    # the held-out text already evaluated at this step (a resume of a finished run adds no record)
                    "valid_step": json.dumps(self._last_valid_step == step and {
                        "step": step, "valid_files": list(self.config.valid_files or [])}),
                    "randomness": "per-step seeds",
                }
                self._kept = ckpt.write_checkpoint(self.out_dir, step, tensors, state, previous=self._kept,
                                                   keep=self.config.keep_checkpoints, run=self._run_identity())

            self.dist.on_main(write)
            self._saved_step = step
            self._last_checkpoint_time = _clock()
        return self.out_dir / ckpt.tensor_file_name(step)

    def load_checkpoint(self) -> bool:
        """Restore the newest checkpoint of ``out_dir`` that verifies; return whether one was loaded (``False``: there
        is no ``checkpoint.json``). A damaged newest checkpoint is skipped with a ``WARNING`` naming the file. Every
        process reads it (the folder must be shared).

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
        data_states, lstm_states = self._parts_of_state(state, s_path)
        try:
            self.data.load_state_dict(data_states, str(s_path))
        except (KeyError, TypeError, ValueError) as exc:  # UsageError (another corpus or options) is a ValueError
            raise CheckpointError(f"{s_path}: the saved data position does not fit this run: "
                                  f"{_one_line(exc)}") from None
        self.lstm_states = {d: tuple(t.to(self.device) for t in s) for d, s in lstm_states.items()
                            if d in self.data.parts}
        try:
            best = json.loads(state.get("best", "null"))
        except (TypeError, ValueError):
            best = None
        if best is not None and best.get("valid_files") != list(self.config.valid_files or []):
            logger.warning("the held-out files changed since the best model (step %s, held-out perplexity %.2f) was "
                           "kept: the best is chosen anew on the new held-out text", best.get("step"),
                           best.get("valid_ppl", float("nan")))
            best = None
        self.best = best
        self.step = loaded.entry.step
        self._kept = [e for e in loaded.manifest.checkpoints if e.step <= self.step]
        self._saved_step = self.step
        self._last_valid_step = None
        try:
            evaluated = json.loads(state.get("valid_step", "false"))
        except (TypeError, ValueError):
            evaluated = False
        if (isinstance(evaluated, dict) and evaluated.get("step") == self.step
                and evaluated.get("valid_files") == list(self.config.valid_files or [])):
            self._last_valid_step = self.step
        self._owns_out_dir = True
        self.run.truncate_metrics(self.step)
        if self.dist.is_main:
            to = f", training to step {self.config.max_steps}" if self.config.max_steps else ""
            self.say(f"resumed from step {self.step} (checkpoint {t_path}){to}")
        return True

    def _parts_of_state(self, state: dict[str, Any], s_path: Path) -> tuple[dict[int, Any], dict[int, Any]]:
        """The data position and LSTM state of each part from a checkpoint's state (also of the format written
        before data parts, which held one batcher's position)."""
        try:
            data = json.loads(state["data"])
            lstm = state.get("lstm_state")
            if isinstance(data, dict) and "parts" in data:
                saved_parts = int(data.get("data_parts", 1))
                positions = {int(k): v for k, v in data["parts"].items()}
                lstm_states = {int(k): tuple(v) for k, v in (lstm or {}).items()}
            else:  # one batcher, one carried state
                saved_parts = 1
                positions = {0: data}
                lstm_states = {} if lstm is None else {0: tuple(lstm)}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{s_path}: the saved data position cannot be read ({_one_line(exc)})") from None
        if saved_parts != self.data.n_parts:
            raise CheckpointError(f"{s_path} was written by a run with {saved_parts} data part(s), this run has "
                                  f"{self.data.n_parts} (--data-parts, or one per process): resume it on 1 to "
                                  f"{saved_parts} process(es) with its own --data-parts")
        return positions, lstm_states

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

    # ------------------------------------------------------------------ the output folder
    def _start_new_run(self, overwrite: bool) -> None:
        """Main process: refuse a folder holding a run (unless ``overwrite``: remove its files), create it."""
        self.run.check_is_folder()
        found = ckpt.run_files(self.out_dir)
        if found and not overwrite:
            resumable = latest_checkpoint_step(self.out_dir) is not None
            raise UsageError(f"{self.out_dir} already holds a training run ({_describe_run(self.out_dir, found)}): "
                             "pass --overwrite to replace it" + (", or --resume to continue it" if resumable else
                                                                 " (it has no checkpoint to --resume from)"))
        if found:
            removed = self.run.remove_run()
            logger.warning("overwrite: removed the previous run from %s (%s)", self.out_dir,
                           ", ".join(p.name for p in removed))
        self.run.make()

    def _prepare(self, resume: bool, overwrite: bool) -> None:
        """Make ``out_dir`` ready: start a new run there, or load its latest checkpoint (every process)."""
        d = self.dist
        if resume:
            d.on_main(lambda: (self.run.check_is_folder(), self.run.make()))
            d.barrier()
            d.on_main(self._check_corpus)
            if not d.agree(self.load_checkpoint):
                orphans = sorted(p.name for p in self.out_dir.iterdir() if ckpt._CKPT_RE.match(p.name))
                if orphans:
                    raise CheckpointError(f"{self.out_dir} has checkpoint files ({', '.join(orphans[:4])}"
                                          f"{', …' if len(orphans) > 4 else ''}) but no checkpoint.json naming them "
                                          "(deleted or never written): it cannot be told which are complete. Restore "
                                          "checkpoint.json, or start again with --overwrite")
                if d.is_main:
                    logger.warning("no checkpoint in %s yet: starting from step 0", self.out_dir)
                self.run.delete_metrics()
                self._reset_to_start()
        else:
            d.on_main(lambda: self._start_new_run(overwrite))
            self._reset_to_start()
            d.on_main(lambda: setattr(self, "_corpus", corpus_fingerprint(self.data.files)))
        self._owns_out_dir = True
        d.on_main(lambda: self.run.write_config(self.config.to_json()))

    def _check_corpus(self) -> None:
        """Main process, on resume: the training files must be those the run's checkpoints were written from (size
        and sha256 of each, none added or gone; see :func:`~elmokit.pretraining.data.check_corpus_unchanged`)."""
        try:
            manifest = ckpt.read_manifest(self.out_dir)
        except CheckpointError:
            manifest = None  # load_checkpoint names the damaged manifest
        saved = manifest.run.get("corpus") if manifest is not None else None
        self._corpus = check_corpus_unchanged(saved, self.data.files, self.out_dir)

    def _reset_to_start(self) -> None:
        self._kept, self._saved_step = [], None
        self.best, self._last_valid_step = None, None

    # ------------------------------------------------------------------ loop
    def _checkpoint_time_due(self) -> bool:
        c = self.config
        return c.checkpoint_minutes is not None and _clock() - self._last_checkpoint_time >= 60.0 * c.checkpoint_minutes

    def _valid_time_due(self) -> bool:
        c = self.config
        return (self.valid is not None and c.valid_minutes is not None
                and _clock() - self._last_valid_time >= 60.0 * c.valid_minutes)

    def _decide(self) -> tuple[bool, bool, bool]:
        """After a step: (checkpoint by time, evaluate by time, interrupted). The main process's clock decides the
        first two, any process's signal the third; one collective shares them."""
        main = self.dist.is_main
        hook = os.environ.get(SIGINT_ENV)
        if hook and hook == f"{self.dist.rank}:{self.step}":
            os.kill(os.getpid(), signal.SIGINT)
        flags = self.dist.all_reduce([main and self._checkpoint_time_due(), main and self._valid_time_due(),
                                      interrupts.requested()], op="max")
        return bool(flags[0]), bool(flags[1]), bool(flags[2])

    def _on_interrupt(self, mid_step: bool) -> None:
        """Ctrl-C/SIGTERM reached the loop: write a checkpoint at the current step when it is consistent (the signal
        landed between steps) and newer than the last one, and say where the run stands."""
        why = interrupts.signal_name() or (
            "an interrupt of another process" if self.dist.enabled and self._interrupt_handled else "KeyboardInterrupt")
        last = self._saved_step
        if mid_step or (self.dist.enabled and not self._interrupt_handled):
            # only without interrupts.handling_signals() (or on a second Ctrl-C): the step was cut, its state is torn
            logger.warning("%s in the middle of a step: nothing saved (a cut step cannot be resumed); %s", why,
                           f"the latest checkpoint is step {last}" if last is not None else "no checkpoint yet")
            return
        if self.step == 0 or self.step == last:
            if self.dist.is_main:
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
            if self.dist.is_main:
                logger.warning("%s: stopped after step %d, checkpoint written (%s); resume continues from step %d",
                               why, self.step, self.out_dir / ckpt.tensor_file_name(self.step), self.step)
            try:  # the learning curve so far (best effort: the interrupt is what matters)
                self.dist.on_main(self.run.plot)
            except Exception as exc:  # noqa: BLE001
                logger.warning("learning curve not drawn after the interrupt: %s", _one_line(exc))
        else:  # a second Ctrl-C cut the write: the previous checkpoint is still the latest
            logger.warning("%s again while writing the checkpoint of step %d: %s", why, self.step,
                           f"the latest checkpoint is step {last}" if last is not None else "no checkpoint written")

    def _wrap(self):
        """DistributedDataParallel around the model when there are several processes (made at each :meth:`train`,
        after a checkpoint was loaded; it checks that every process holds the same parameters)."""
        if not self.dist.enabled:
            return None
        from torch.nn.parallel import DistributedDataParallel

        # frozen biLM steps leave its parameters out of the graph: DDP must look for unused parameters then
        find_unused = self.step < self.config.freeze_bilm_steps
        # device_ids=None: the inputs are token strings, the model makes its tensors on its own device
        return DistributedDataParallel(self.lm, device_ids=None, find_unused_parameters=find_unused)

    def _write_digest(self) -> None:
        prefix = os.environ.get(DIGEST_ENV)
        if not prefix:
            return
        h = hashlib.sha256()
        for name, tensor in self.lm.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        with open(f"{prefix}.rank{self.dist.rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": self.step, "sha256": h.hexdigest()}) + "\n")

    def train(self, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Run to the end of the configured epochs / steps, holding the writer lock of ``out_dir`` throughout (the
        main process; :func:`elmokit.io.lock_folder`), so no other run starts, resumes or overwrites there meanwhile.

        Args:
            resume: continue from the newest good checkpoint in ``out_dir`` (from step 0, with a warning, when there
                is none yet).
            overwrite: start a new run in a folder that holds one: its files (``ckpt-*``, ``checkpoint.json``,
                ``metrics.jsonl``, ``learning_curve.png``, ``train_config.json``, ``model/``, ``best/``) are deleted
                first.

        Without either, a folder holding a run is refused; an empty or missing folder, or one holding only other
        files, is fine. Ctrl-C / SIGTERM (under :func:`elmokit.interrupts.handling_signals`) stops after the current
        step with a checkpoint at that step, then raises ``KeyboardInterrupt``.

        Returns a summary: steps, tokens (of the global batches, one direction), seconds (this call, saving included),
        loop_seconds (the training steps alone), tokens_per_s, final loss, paths, and with held-out text the last
        and the best held-out perplexity.

        Raises:
            UsageError: the folder holds a run and neither ``resume`` nor ``overwrite`` is given (names the folder,
                what it holds and both ways out); both are given; ``out_dir`` is a file.
            FolderInUseError: another process is writing ``out_dir`` (names its pid, start time and command).
            DataError: on resume, a training file changed, was added or vanished since the run started (named).
            CheckpointError: on resume, see :meth:`load_checkpoint`.
            TrainingError: a non-finite loss or gradient (names the step; the last good checkpoint is kept), or no
                batch at all.
            KeyboardInterrupt: Ctrl-C / SIGTERM, after the checkpoint at the interrupt was written.
        """
        if resume and overwrite:
            raise UsageError(f"resume and overwrite exclude each other: --resume continues the run in {self.out_dir}, "
                             "--overwrite replaces it")
        self.dist.on_main(self.run.check_is_folder)
        lock = self.dist.on_main(lambda: lock_folder(self.out_dir, "run folder (--out-dir)"))
        try:
            return self._train(resume, overwrite)
        finally:
            if lock is not None:
                lock.release()

    # long: the loop's steps in order (prepare, one step at a time with its logging, evaluation and checkpoints,
    # the end), with the interrupt handling around them
    def _train(self, resume: bool, overwrite: bool) -> dict[str, Any]:
        """:meth:`train`, with the folder locked."""
        from tqdm.auto import tqdm

        c, d = self.config, self.dist
        self._prepare(resume, overwrite)
        if d.is_main and c.n_negative_samples and c.n_negative_samples >= len(self.vocab) - 1:
            logger.warning("the vocabulary has %d tokens, not more than n_negative_samples=%d (--negatives) + 1: "
                           "training uses the full softmax (exact; pass 0 negatives to ask for it)",
                           len(self.vocab), c.n_negative_samples)
        self._ddp = self._wrap()
        previous_determinism = (torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled())
        if c.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        rng_devices = [self.device] if self.device.type == "cuda" else []
        self.run.open_metrics()
        bar = tqdm(total=c.max_steps, initial=self.step, unit="step", disable=not (c.progress and d.is_main),
                   desc="training", mininterval=0.1 if sys.stderr.isatty() else 30.0)
        tokens_seen, start = 0, time.perf_counter()
        loop_start = start
        self._last_checkpoint_time = self._last_valid_time = _clock()
        self._interrupt_handled = False
        last_loss = float("nan")
        last_valid = None
        window: list[tuple[float, float, int]] = []
        mid_step = False
        interval = c.valid_interval if self.valid is not None else None
        loop_seconds = 0.0
        self.step_seconds = []
        try:
            # the per-step seeds reseed the global RNG: the caller's RNG state is given back at the end
            with torch.random.fork_rng(devices=rng_devices):
                if self.valid is not None and self.step == 0:
                    with interrupts.deferred():
                        last_valid = self._validate()
                    loop_start = time.perf_counter()  # loop_seconds and tokens/s: the steps, not this evaluation
                self.lm.train()
                while c.max_steps is None or self.step < c.max_steps:
                    # one step (draw, forward, backward, update, log, evaluate, checkpoint) is never cut by
                    # Ctrl-C/SIGTERM: the signal is acted on at the end of the step, with the state consistent
                    with interrupts.deferred():
                        mid_step = True
                        step_start = time.perf_counter()
                        # test max_steps before drawing: a batch drawn and not trained on would be skipped on resume
                        batch = self.next_batch()
                        if batch is None:
                            mid_step = False
                            break
                        result = self.train_step(batch)
                        self.step_seconds.append(time.perf_counter() - step_start)
                        self._write_digest()
                        tokens_seen += result.tokens
                        last_loss = result.loss
                        window.append((result.nll_forward, result.nll_backward, result.tokens))
                        elapsed = time.perf_counter() - loop_start
                        if self.step % c.log_every == 0:
                            n = max(1, sum(k for *_, k in window))
                            f = sum(a * k for a, _, k in window) / n
                            b = sum(bb * k for _, bb, k in window) / n
                            self.run.log({"kind": "train", "step": self.step, "loss": round(last_loss, 6),
                                          "train_ppl_fwd": _exp(f), "train_ppl_bwd": _exp(b),
                                          "train_ppl": _exp(0.5 * (f + b)),
                                          "tokens_per_s": tokens_seen / max(elapsed, 1e-9), "lr": c.learning_rate})
                            window = []
                        bar.update(1)
                        # refresh=False: the bar redraws at its own interval (30 s when stderr is not a terminal)
                        bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
                                        refresh=False)
                        checkpoint_by_time, valid_by_time, interrupted = self._decide()
                        if self.valid is not None and (valid_by_time or (interval and self.step % interval == 0)):
                            last_valid = self._validate()
                        if self.step % c.checkpoint_every == 0 or checkpoint_by_time:
                            self.save_checkpoint()
                        mid_step = False
                        if interrupted:
                            self._interrupt_handled = True
                            self._on_interrupt(False)
                            raise KeyboardInterrupt
                loop_seconds = time.perf_counter() - loop_start
                if self.step == 0:
                    raise TrainingError(
                        f"no training step could be made: the data yields no batch (batching={c.batching!r}, batch "
                        f"size {c.batch_size}{', unroll steps ' + str(c.unroll_steps) if c.batching == 'windows' else ''}"
                        f", {c.n_epochs} epoch(s), max_steps={c.max_steps}); use a smaller batch size, more epochs or "
                        "more data")
                with interrupts.deferred():
                    if self.valid is not None and self._last_valid_step != self.step:
                        last_valid = self._validate()
                    if self._saved_step != self.step:
                        self.save_checkpoint()
        except KeyboardInterrupt:
            if not self._interrupt_handled:
                self._on_interrupt(mid_step)
            raise
        finally:
            bar.close()
            self.run.close_metrics()
            torch.use_deterministic_algorithms(previous_determinism[0], warn_only=previous_determinism[1])
        with interrupts.deferred():
            model_dir = self.out_dir / "model"
            d.agree(self.refresh_start_state)
            d.on_main(lambda: save_lm(self.lm, model_dir))
        curve = d.on_main(self.run.plot)
        d.barrier()
        seconds = time.perf_counter() - start
        summary = {"steps": self.step, "tokens": tokens_seen, "seconds": seconds, "loop_seconds": loop_seconds,
                   "final_loss": last_loss if math.isfinite(last_loss) else None,
                   "tokens_per_s": tokens_seen / max(seconds, 1e-9), "model_dir": str(model_dir),
                   "learning_curve": str(curve) if curve else None}
        if self.valid is not None:
            summary["valid"] = None if last_valid is None else {k: last_valid[k] for k in (
                "step", "valid_ppl_fwd", "valid_ppl_bwd", "valid_ppl")}
            summary["best"] = None if self.best is None else {
                "step": self.best["step"], "valid_ppl": self.best["valid_ppl"], "model_dir": str(self.out_dir / "best")}
        if d.world_size > 1:
            summary["processes"] = d.world_size
        return summary


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
    """Seconds on a monotonic clock (``checkpoint_minutes``, ``valid_minutes``); a function so tests can replace it."""
    return time.monotonic()


def _exp(x: float) -> float:
    """``math.exp`` that gives ``inf`` instead of raising for a huge loss (metrics must not stop training)."""
    return math.exp(x) if x < 700 else float("inf")

