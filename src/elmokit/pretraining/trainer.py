"""Pretraining a biLM: the training loop, checkpoints that resume exactly, held-out evaluation, one or many processes.

Optimiser defaults follow bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0), global gradient-norm clip 10,
dropout 0.1, loss ``0.5 · (NLL_fwd + NLL_bwd) · unroll_steps`` (the scale matters for Adagrad), the NLLs being the
means over every target of the step's global batch.

Shape. :func:`build_trainer` (``Trainer.from_config``) makes everything a run needs from its :class:`TrainConfig`
(:func:`elmokit.pretraining.build.build_parts`: the data parts of this process, the vocabulary, the model — from
``init_from`` when given, :mod:`elmokit.pretraining.init_from` —, the optimiser and the held-out sentences) and
hands them to :class:`Trainer`, which is given them (so a caller can hand in its own). :class:`Trainer` is the loop
(:meth:`Trainer.train`, a sequence of small named steps, as torchtune's recipes) over the concepts of its
sibling modules: one optimiser step (:mod:`elmokit.pretraining.step`, :meth:`Trainer.train_step`, which
``bench/train.py`` uses too), the held-out curve (:mod:`elmokit.pretraining.heldout`), checkpoints and the run folder
(:mod:`elmokit.pretraining.resume`), the saved LM (:mod:`elmokit.pretraining.lm_files`). Every file is written by the
main process only, through :class:`~elmokit.pretraining.run_folder.RunFolder`. Tests look in through
:class:`~elmokit.pretraining.hooks.TrainHooks` (``hooks=``, :attr:`Trainer.default_hooks`).

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

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from elmokit import interrupts
from elmokit.devices import resolve_device  # noqa: F401  (re-exported: elmokit.pretraining.trainer.resolve_device)
from elmokit.errors import TrainingError, UsageError
from elmokit.io import lock_folder
from elmokit.pretraining import checkpoint as ckpt
from elmokit.pretraining.build import build_parts, make_optimizer
from elmokit.pretraining.config import MAX_LEARNING_RATE, TrainConfig, learning_rate_at  # noqa: F401  (MAX_LEARNING_RATE re-exported)
from elmokit.pretraining.data import TrainingData
from elmokit.pretraining.distributed import DistContext, single_process
from elmokit.pretraining.heldout import VALID_BATCH_SENTENCES, HeldoutMixin
from elmokit.pretraining.hooks import TrainHooks
from elmokit.pretraining.lm_files import load_lm, save_lm
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.resume import ResumeMixin, latest_checkpoint_step
from elmokit.pretraining.run_folder import RunFolder, plot_learning_curve
from elmokit.pretraining.step import StepMixin, StepResult, step_seed

__all__ = [
    "TrainConfig",
    "Trainer",
    "TrainingError",
    "StepResult",
    "build_trainer",
    "make_optimizer",
    "save_lm",
    "load_lm",
    "latest_checkpoint_step",
    "plot_learning_curve",
    "step_seed",
    "VALID_BATCH_SENTENCES",
    "TrainHooks",
]

logger = logging.getLogger(__name__)


def enter_determinism(deterministic: bool) -> tuple[bool, bool, bool]:
    """Set the training loop's determinism and return the caller's settings for :func:`restore_determinism`.

    With ``deterministic`` (``TrainConfig.deterministic``): ``torch.use_deterministic_algorithms(True,
    warn_only=True)``, without PyTorch's filling of new uninitialised tensors with NaN
    (``torch.utils.deterministic.fill_uninitialized_memory``, which that mode turns on). The fill does not change a
    result that reads only written memory, as every op here does, and it cost a third of a bf16 step of the zoo
    recipe in a profile (hundreds of MB written per step: the sampled softmax's and the LSTM's buffers). Without
    ``deterministic`` nothing changes. Returns ``(deterministic algorithms, warn only, fill uninitialised memory)``
    as they were.
    """
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
    return before


def restore_determinism(before: tuple[bool, bool, bool]) -> None:
    """Give back the settings :func:`enter_determinism` returned."""
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = before[2]


@dataclass
class LoopState:
    """What the loop of one :meth:`Trainer.train` call carries from step to step: the progress bar, the clocks
    (``time.perf_counter`` seconds), the tokens seen (global batches, one direction), the last loss and held-out
    record, the (forward NLL, backward NLL, tokens) of the steps not logged yet, and whether a step is under way."""

    bar: Any
    rng_devices: list[torch.device]
    determinism: tuple[bool, bool, bool]
    start: float
    loop_start: float
    tokens_seen: int = 0
    last_loss: float = float("nan")
    last_valid: dict[str, Any] | None = None
    window: list[tuple[float, float, int]] = field(default_factory=list)
    mid_step: bool = False
    loop_seconds: float = 0.0


class Trainer(StepMixin, HeldoutMixin, ResumeMixin):
    """Train a :class:`BidirectionalLM` as configured; :meth:`train` runs (or resumes) to the end.

    Args:
        config: the run.
        lm: the model (its vocabulary and character vocabulary are the run's), on its device.
        optimizer: over ``lm``'s parameters. data: this process's data parts.
        dist: this process among the training processes (default: one process).
        valid: held-out sentences (for ``config.valid_files``), or ``None``.
        hooks: what tests and diagnostics see of the run (:class:`~elmokit.pretraining.hooks.TrainHooks`; default:
            :attr:`default_hooks`, which does nothing).

    ``Trainer(config)`` alone is :func:`build_trainer` (``Trainer.from_config``).

    The methods of one step are :class:`~elmokit.pretraining.step.StepMixin`'s, the held-out evaluation
    :class:`~elmokit.pretraining.heldout.HeldoutMixin`'s, checkpoints (the one at an interrupt too) and the run folder
    :class:`~elmokit.pretraining.resume.ResumeMixin`'s; this class holds the state and the loop.

    Raises (when building): see :func:`build_trainer`. From :meth:`train`: see there.
    """

    #: The hooks of a trainer built without ``hooks=`` (a test sets its own here for a run it does not build itself:
    #: the CLI in a subprocess, a zoo build).
    default_hooks: TrainHooks = TrainHooks()

    def __init__(
        self,
        config: TrainConfig,
        lm: BidirectionalLM | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        data: TrainingData | None = None,
        *,
        dist: DistContext | None = None,
        valid: list[list[str]] | None = None,
        hooks: TrainHooks | None = None,
    ) -> None:
        if lm is None or optimizer is None or data is None:
            if not (lm is None and optimizer is None and data is None):
                raise UsageError(
                    "Trainer: give the model, the optimiser and the data together, or none of them "
                    "(then build_trainer(config) makes them)"
                )
            built = build_trainer(config, dist, hooks=hooks)
            self.__dict__.update(built.__dict__)
            return
        self.config = config
        self.dist = dist or single_process()
        self.hooks = hooks if hooks is not None else self.default_hooks
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
        self._last_checkpoint_time = self._last_valid_time = self._now()
        self._owns_out_dir = False  # set once this trainer started, resumed or loaded the run in out_dir
        self._start_state_step: int | None = None  # the step whose weights the model's start state was computed for
        self._interrupt_handled = False
        self._corpus: dict[str, Any] | None = None  # the training files' fingerprint (main process), see _prepare
        #: Where the main process reports what the user should see at once (resuming from which step): the CLI
        #: prints it; by default it is logged at INFO.
        self.say: Callable[[str], None] = logger.info

    @classmethod
    def from_config(cls, config: TrainConfig, dist: DistContext | None = None) -> Trainer:
        """:func:`build_trainer`."""
        return build_trainer(config, dist)

    @property
    def model(self) -> BidirectionalLM:
        """The model being trained (``lm``)."""
        return self.lm

    @staticmethod
    def _now() -> float:
        """The clock of time-based checkpoints and evaluations (:func:`_clock`, looked up at each call so that tests
        can replace it)."""
        return _clock()

    # ------------------------------------------------------------------ around the loop
    def _checkpoint_time_due(self) -> bool:
        c = self.config
        return c.checkpoint_minutes is not None and _clock() - self._last_checkpoint_time >= 60.0 * c.checkpoint_minutes

    def _valid_time_due(self) -> bool:
        c = self.config
        return (
            self.valid is not None
            and c.valid_minutes is not None
            and _clock() - self._last_valid_time >= 60.0 * c.valid_minutes
        )

    def _decide(self) -> tuple[bool, bool, bool]:
        """After a step: (checkpoint by time, evaluate by time, interrupted). The main process's clock decides the
        first two, any process's signal the third; one collective shares them."""
        main = self.dist.is_main
        flags = self.dist.all_reduce(
            [main and self._checkpoint_time_due(), main and self._valid_time_due(), interrupts.pending()], op="max"
        )
        return bool(flags[0]), bool(flags[1]), bool(flags[2])

    def _wrap(self):
        """DistributedDataParallel around the model when there are several processes (made at each :meth:`train`,
        after a checkpoint was loaded; it checks that every process holds the same parameters)."""
        if not self.dist.enabled:
            return None
        # frozen biLM steps leave its parameters out of the graph: DDP must look for unused parameters then
        find_unused = self.step < self.config.freeze_bilm_steps
        # device_ids=None: the inputs are token strings, the model makes its tensors on its own device
        return DistributedDataParallel(self.lm, device_ids=None, find_unused_parameters=find_unused)

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
            raise UsageError(
                f"resume and overwrite exclude each other: --resume continues the run in {self.out_dir}, "
                "--overwrite replaces it"
            )
        self.dist.on_main(self.run.check_is_folder)
        lock = self.dist.on_main(lambda: lock_folder(self.out_dir, "run folder (--out-dir)"))
        try:
            return self._train(resume, overwrite)
        finally:
            if lock is not None:
                lock.release()

    def _train(self, resume: bool, overwrite: bool) -> dict[str, Any]:
        """:meth:`train`, with the folder locked: the loop's steps in order — prepare the folder, begin (bar, clocks),
        evaluate at step 0, one step at a time (each with its logging, evaluation and checkpoint), the end (last
        evaluation and checkpoint), save the model, the summary — with the interrupt handling around them."""
        self._prepare(resume, overwrite)
        loop = self._begin()
        try:
            # the per-step seeds reseed the global RNG: the caller's RNG state is given back at the end
            with torch.random.fork_rng(devices=loop.rng_devices):
                self._validate_first(loop)
                self.lm.train()
                while self._steps_left() and self._one_step(loop):
                    pass
                loop.loop_seconds = time.perf_counter() - loop.loop_start
                self._check_trained()
                self._finish_steps(loop)
        except KeyboardInterrupt:
            if not self._interrupt_handled:
                self._on_interrupt(loop.mid_step)
            raise
        finally:
            self._end(loop)
        model_dir, curve = self._save_model()
        return self._summary(loop, model_dir, curve)

    # ------------------------------------------------------------------ the loop's steps
    def _begin(self) -> LoopState:
        """Before the first step: warn when the negatives are the whole vocabulary, wrap the model for several
        processes, switch to deterministic algorithms when asked (the previous setting is kept in the state), open
        the metrics and the progress bar, start the clocks."""
        c, d = self.config, self.dist
        if d.is_main and c.n_negative_samples and c.n_negative_samples >= len(self.vocab) - 1:
            logger.warning(
                "the vocabulary has %d tokens, not more than n_negative_samples=%d (--negatives) + 1: "
                "training uses the full softmax (exact; pass 0 negatives to ask for it)",
                len(self.vocab),
                c.n_negative_samples,
            )
        self._ddp = self._wrap()
        determinism = enter_determinism(c.deterministic)
        self.run.open_metrics()
        bar = tqdm(
            total=c.max_steps,
            initial=self.step,
            unit="step",
            disable=not (c.progress and d.is_main),
            desc="training",
            mininterval=0.1 if sys.stderr.isatty() else 30.0,
        )
        start = time.perf_counter()
        self._last_checkpoint_time = self._last_valid_time = self._now()
        self._interrupt_handled = False
        self.step_seconds = []
        return LoopState(bar, [self.device] if self.device.type == "cuda" else [], determinism, start, start)

    def _validate_first(self, loop: LoopState) -> None:
        """A new run with held-out text: its perplexity at step 0 (the tokens/s clock starts after it)."""
        if self.valid is not None and self.step == 0:
            with interrupts.deferred():
                loop.last_valid = self._validate()
            loop.loop_start = time.perf_counter()  # loop_seconds and tokens/s: the steps, not this evaluation

    def _steps_left(self) -> bool:
        """``max_steps`` not reached (tested before drawing: a batch drawn and not trained on would be skipped on
        resume)."""
        return self.config.max_steps is None or self.step < self.config.max_steps

    def _one_step(self, loop: LoopState) -> bool:
        """One step — draw, forward, backward, update, hooks, log, evaluate, checkpoint — never cut by Ctrl-C/SIGTERM
        (:func:`elmokit.interrupts.deferred`): a signal is acted on at the end of the step, with the state consistent
        (checkpoint, then ``KeyboardInterrupt``). Returns ``False`` when the data ran out (nothing trained)."""
        with interrupts.deferred():
            loop.mid_step = True
            step_start = time.perf_counter()
            batch = self.next_batch()
            if batch is None:
                loop.mid_step = False
                return False
            result = self.train_step(batch)
            self.step_seconds.append(time.perf_counter() - step_start)
            self.hooks.after_step(self)
            self._record(loop, result)
            interrupted = self._evaluate_and_checkpoint(loop)
            loop.mid_step = False
            if interrupted:
                self._interrupt_handled = True
                self._on_interrupt(False)
                raise KeyboardInterrupt
        return True

    def _record(self, loop: LoopState, result: StepResult) -> None:
        """Count the step's tokens, log the training perplexities every ``log_every`` steps (token-weighted over the
        steps since the last record), move the progress bar."""
        c = self.config
        loop.tokens_seen += result.tokens
        loop.last_loss = result.loss
        loop.window.append((result.nll_forward, result.nll_backward, result.tokens))
        tokens_per_s = loop.tokens_seen / max(time.perf_counter() - loop.loop_start, 1e-9)
        if self.step % c.log_every == 0:
            n = max(1, sum(k for *_, k in loop.window))
            f = sum(a * k for a, _, k in loop.window) / n
            b = sum(bb * k for _, bb, k in loop.window) / n
            self.run.log(
                {
                    "kind": "train",
                    "step": self.step,
                    "loss": round(loop.last_loss, 6),
                    "train_ppl_fwd": _exp(f),
                    "train_ppl_bwd": _exp(b),
                    "train_ppl": _exp(0.5 * (f + b)),
                    "tokens_per_s": tokens_per_s,
                    "lr": learning_rate_at(c, self.step),
                }
            )
            loop.window = []
        loop.bar.update(1)
        # refresh=False: the bar redraws at its own interval (30 s when stderr is not a terminal)
        loop.bar.set_postfix(loss=f"{loop.last_loss:.3f}", tok_s=f"{tokens_per_s:.0f}", refresh=False)

    def _evaluate_and_checkpoint(self, loop: LoopState) -> bool:
        """After a step: evaluate the held-out text and write a checkpoint when due (by steps, or by time as the main
        process decides); return whether any process was interrupted."""
        c = self.config
        checkpoint_by_time, valid_by_time, interrupted = self._decide()
        interval = c.valid_interval if self.valid is not None else None
        if self.valid is not None and (valid_by_time or (interval and self.step % interval == 0)):
            loop.last_valid = self._validate()
        if self.step % c.checkpoint_every == 0 or checkpoint_by_time:
            self.save_checkpoint()
        return interrupted

    def _check_trained(self) -> None:
        """At least one step was made (resumed or now).

        Raises:
            TrainingError: the data yields no batch (says what to change)."""
        c = self.config
        if self.step == 0:
            raise TrainingError(
                f"no training step could be made: the data yields no batch (batching={c.batching!r}, batch "
                f"size {c.batch_size}{', unroll steps ' + str(c.unroll_steps) if c.batching == 'windows' else ''}"
                f", {c.n_epochs} epoch(s), max_steps={c.max_steps}); use a smaller batch size, more epochs or "
                "more data"
            )

    def _finish_steps(self, loop: LoopState) -> None:
        """After the last step: the held-out evaluation and the checkpoint of the last step, unless already made."""
        with interrupts.deferred():
            if self.valid is not None and self._last_valid_step != self.step:
                loop.last_valid = self._validate()
            if self._saved_step != self.step:
                self.save_checkpoint()

    def _end(self, loop: LoopState) -> None:
        """Whatever happened: close the bar and the metrics, give back the caller's deterministic-algorithms setting."""
        loop.bar.close()
        self.run.close_metrics()
        restore_determinism(loop.determinism)

    def _save_model(self) -> tuple[Path, Path | None]:
        """Save the trained LM in ``model/`` (with its start state) and draw the learning curve (main process); return
        both paths (the curve's ``None`` when nothing was drawn)."""
        d = self.dist
        model_dir = self.out_dir / "model"
        with interrupts.deferred():
            d.agree(self.refresh_start_state)
            d.on_main(lambda: save_lm(self.lm, model_dir))
        curve = d.on_main(self.run.plot)
        d.barrier()
        return model_dir, curve

    def _summary(self, loop: LoopState, model_dir: Path, curve: Path | None) -> dict[str, Any]:
        """What :meth:`train` returns (see there)."""
        seconds = time.perf_counter() - loop.start
        summary = {
            "steps": self.step,
            "tokens": loop.tokens_seen,
            "seconds": seconds,
            "loop_seconds": loop.loop_seconds,
            "final_loss": loop.last_loss if math.isfinite(loop.last_loss) else None,
            "tokens_per_s": loop.tokens_seen / max(seconds, 1e-9),
            "model_dir": str(model_dir),
            "learning_curve": str(curve) if curve else None,
        }
        if self.valid is not None:
            last_valid = loop.last_valid
            summary["valid"] = (
                None
                if last_valid is None
                else {k: last_valid[k] for k in ("step", "valid_ppl_fwd", "valid_ppl_bwd", "valid_ppl")}
            )
            summary["best"] = (
                None
                if self.best is None
                else {
                    "step": self.best["step"],
                    "valid_ppl": self.best["valid_ppl"],
                    "model_dir": str(self.out_dir / "best"),
                }
            )
        if self.dist.world_size > 1:
            summary["processes"] = self.dist.world_size
        return summary


def build_trainer(config: TrainConfig, dist: DistContext | None = None, *, hooks: TrainHooks | None = None) -> Trainer:
    """Build a :class:`Trainer` and everything it is given from ``config`` (a copy of it is kept: the caller's object
    is not changed), on this process's share of the data (:func:`elmokit.pretraining.build.build_parts` has the
    steps). Every step that may fail on one process is shared (:meth:`DistContext.agree`), so all processes raise the
    same error. ``hooks``: see :class:`Trainer`.

    Raises:
        ConfigError: options (see :meth:`TrainConfig.validate`).
        UsageError: the device; more processes than data parts; ``init_from`` options that conflict (see
            :func:`elmokit.pretraining.init_from.check_architecture`) or a name that is no model.
        MissingFileError: training/held-out files or the vocabulary missing; an init model that is not there.
        DataError: corpus or vocabulary contents unusable (naming file:line), a data part without lines.
        WeightsError: an init model whose files cannot be read or do not fit.
    """
    parts = build_parts(config, dist)
    trainer = Trainer(
        parts.config, parts.lm, parts.optimizer, parts.data, dist=parts.dist, valid=parts.valid, hooks=hooks
    )
    trainer.init_softmax_kept = parts.init_softmax_kept
    return trainer


def _clock() -> float:
    """Seconds on a monotonic clock (``checkpoint_minutes``, ``valid_minutes``); a function so tests can replace it."""
    return time.monotonic()


def _exp(x: float) -> float:
    """``math.exp`` that gives ``inf`` instead of raising for a huge loss (metrics must not stop training)."""
    return math.exp(x) if x < 700 else float("inf")
