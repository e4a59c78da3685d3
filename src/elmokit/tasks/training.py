"""Training downstream task models (:mod:`elmokit.tasks.models`), and the names of the task-model workflow:

* :func:`fit` — Adam, gradient clipping, early stopping on the dev score with patience, the best epoch's weights kept;
  seeded (model initialisation, batch order, dropout) and so repeatable on the CPU;
* :func:`train_from_config` — a :class:`~elmokit.tasks.config.TaskConfig` → built model
  (:func:`~elmokit.tasks.building.build_from_config`), trained, scored on dev and test, saved (what
  ``elmokit tag train`` runs).

The other steps live in their own modules and are importable from here too: :class:`TaskData` and the readers'
glue (:mod:`elmokit.tasks.datasets`), the task's biLM and its feature cache (:mod:`elmokit.tasks.frozen_bilm`),
:class:`TaskModel` (:mod:`elmokit.tasks.task_model`), building from a config (:mod:`elmokit.tasks.building`),
:func:`save_task_model` / :func:`load_task_model` (:mod:`elmokit.tasks.saving`).

Feature cache: with a frozen biLM the layers of each data file are computed once and stored under
``$ELMOKIT_CACHE/features/<biLM fingerprint[:16]>/<kind>-<sentences sha256[:24]>.safetensors`` (keys that change with
the biLM or the text, so a stale file is never used); float16, (L+1)·D·2 bytes per token.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from elmokit import interrupts
from elmokit.errors import TrainingError
from elmokit.io import lock_folder
from elmokit.modules.bilm import BiLM
from elmokit.tasks.building import PreparedTask, build_from_config, prepare_task
from elmokit.tasks.config import TaskConfig
from elmokit.tasks.datasets import TaskData, aligned_segmenter, char_words, read_task_file
from elmokit.tasks.frozen_bilm import compute_features, describe_bilm, resolve_bilm
from elmokit.tasks.saving import FORMAT_VERSION, load_task_model, save_task_model
from elmokit.tasks.task_model import TaskModel, load_task_state, task_state
from elmokit.weights.fingerprint import bilm_fingerprint

__all__ = [
    "TaskData",
    "TaskModel",
    "fit",
    "build_from_config",
    "train_from_config",
    "save_task_model",
    "load_task_model",
    "bilm_fingerprint",
    "describe_bilm",
    "resolve_bilm",
    "read_task_file",
    "aligned_segmenter",
    "FORMAT_VERSION",
    "PreparedTask",
    "prepare_task",
    "char_words",
    "compute_features",
]

logger = logging.getLogger(__name__)


def _batches(n: int, batch_size: int, rng: random.Random, lengths: Sequence[int]) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort within pools of 20 batches by length, shuffle the
    batches (less padding than plain random batches, still a random order each epoch)."""
    order = list(range(n))
    rng.shuffle(order)
    pool = batch_size * 20
    batches = []
    for start in range(0, n, pool):
        part = sorted(order[start : start + pool], key=lambda i: lengths[i])
        batches.extend(part[k : k + batch_size] for k in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


@dataclass(frozen=True)
class _Step:
    """One optimiser step's settings: the optimiser and its parameters, the gradient clip (total norm), the ELMo
    mixes' λ (``l2``) and the learning rate (named in the message of a non-finite loss)."""

    optimiser: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    clip: float
    l2: float
    lr: float


def _train_epoch(
    model: TaskModel,
    train: TaskData,
    batches: list[list[int]],
    step: _Step,
    *,
    epoch: int,
    steps: int,
    max_steps: int | None,
) -> tuple[list[float], int]:
    """One epoch's optimiser steps over ``batches`` (stopping at ``max_steps`` steps in all): the losses, and the
    step count after it. Raises :class:`TrainingError` on a NaN or infinite loss; checks for Ctrl-C between steps."""
    module, device = model.module, model.device
    module.train()
    losses = []
    for indices in batches:
        interrupts.check()
        batch = model.batch(train, indices, targets=True).to(device)
        loss = module.loss(batch) + module.inputs.l2_penalty(step.l2).to(device)
        if not torch.isfinite(loss):
            raise TrainingError(
                f"epoch {epoch}, step {steps + 1}: the loss is {float(loss)} (lower train.lr, now {step.lr})"
            )
        step.optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(step.params, step.clip)
        step.optimiser.step()
        losses.append(float(loss.detach()))
        steps += 1
        if max_steps is not None and steps >= max_steps:
            break
    return losses, steps


def _epoch_record(epoch: int, steps: int, losses: list[float], dev_score: float, start: float) -> dict:
    """The history entry of an epoch that began at ``start`` (``time.perf_counter()``)."""
    return {
        "epoch": epoch,
        "steps": steps,
        "train_loss": sum(losses) / max(len(losses), 1),
        "first_loss": losses[0] if losses else None,
        "dev": dev_score,
        "seconds": round(time.perf_counter() - start, 2),
    }


@dataclass
class _BestEpoch:
    """Early stopping: the best dev ``score`` so far, its ``epoch`` and a copy of the task weights (``state``), and
    the epochs since (``bad``)."""

    patience: int
    score: float = -math.inf
    epoch: int = 0
    state: dict | None = None
    bad: int = 0

    def out_of_patience(self, module: torch.nn.Module, epoch: int, score: float) -> bool:
        """Keep ``module``'s weights when ``score`` is better; whether ``patience`` epochs passed without one."""
        if score > self.score:
            self.score, self.epoch, self.bad = score, epoch, 0
            self.state = copy.deepcopy(task_state(module))
            return False
        self.bad += 1
        return self.bad >= self.patience


def fit(
    model: TaskModel,
    train: TaskData,
    dev: TaskData,
    *,
    epochs: int = 5,
    patience: int = 2,
    lr: float = 1e-3,
    batch_size: int = 32,
    clip: float = 5.0,
    l2: float = 0.001,
    seed: int = 0,
    max_steps: int | None = None,
    unseen: str = "error",
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Train ``model`` on ``train`` with early stopping on the dev score; the best epoch's weights are restored.

    Adam on the trainable parameters (the frozen biLM is not among them), loss = task loss + λ·Σ s² over the ELMo
    mixes (``l2``), gradients clipped to ``clip`` (total norm), one dev evaluation per epoch; training stops after
    ``patience`` epochs without a better dev score. Batch order and dropout come from ``seed``
    (``torch.manual_seed`` and a ``random.Random``), so a CPU run repeats exactly.

    Returns the history: per epoch ``{"epoch", "steps", "train_loss" (mean), "dev" (score), "seconds"}``; also set
    on ``model.history``, with ``model.results["best_epoch"]`` and ``["dev"]``.

    Raises:
        DataError: a training or dev label problem (naming ``FILE:LINE``).
        TrainingError: the loss became NaN or infinite.
        KeyboardInterrupt: Ctrl-C/SIGTERM (checked between steps).
    """

    say = log or logger.info
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = [p for p in model.module.parameters() if p.requires_grad]
    step = _Step(torch.optim.Adam(params, lr=lr), params, clip=clip, l2=l2, lr=lr)
    model.check_labels(dev, unseen)
    lengths = [len(t) for t in train.tokens]
    best = _BestEpoch(patience)
    history: list[dict] = []
    steps = 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        batches = _batches(len(train), batch_size, rng, lengths)
        losses, steps = _train_epoch(model, train, batches, step, epoch=epoch, steps=steps, max_steps=max_steps)
        dev_score = model.evaluate(dev, unseen=unseen)["score"]
        record = _epoch_record(epoch, steps, losses, dev_score, start)
        history.append(record)
        say(
            f"epoch {epoch}: train loss {record['train_loss']:.4f}, dev {model.config.metric} {dev_score:.2f} "
            f"({record['seconds']:.1f} s)"
        )
        if best.out_of_patience(model.module, epoch, dev_score):
            say(f"early stop: no better dev score for {patience} epoch(s); best epoch {best.epoch}")
            break
        if max_steps is not None and steps >= max_steps:
            break
    if best.state is not None:
        load_task_state(model.module, best.state)
    model.history = history
    model.results.update(best_epoch=best.epoch, dev=best.score, steps=steps)
    return history


def _scores(model: TaskModel, data: dict[str, TaskData], unseen: str, train_seconds: float) -> dict:
    """``model.results`` after training: best epoch, steps, seconds, seed, mix weights and the dev/test scores."""
    results = {
        "best_epoch": model.results.get("best_epoch"),
        "steps": model.results.get("steps"),
        "train_seconds": round(train_seconds, 2),
        "seed": model.config.train.seed,
        "mix_weights": model.mix_weights(),
    }
    for name in ("dev", "test"):
        if name in data:
            results[name] = model.evaluate(data[name], unseen=unseen)
    return results


def train_from_config(
    config: TaskConfig,
    *,
    out_dir: str | os.PathLike | None = None,
    seed: int | None = None,
    bilm: BiLM | None = None,
    device: str | torch.device = "cpu",
    max_steps: int | None = None,
    log: Callable[[str], None] | None = None,
    unseen: str = "error",
    prepared: PreparedTask | None = None,
    progress: bool = False,
) -> TaskModel:
    """Build (:func:`~elmokit.tasks.building.build_from_config`), train (:func:`fit`), evaluate on dev and test, and
    (with ``out_dir``) save a model from a config. ``seed`` overrides ``train.seed`` (initialisation, batch order,
    dropout); ``prepared`` (a :func:`~elmokit.tasks.building.prepare_task` of this config) is shared by several
    seeds of one config (the data, biLM, static vectors and cached layers are made once); ``progress``: bars while the
    biLM layers are computed.

    ``model.results`` then holds ``{"dev": {...}, "test": {...}, "best_epoch", "train_seconds", "seed",
    "mix_weights"}`` (scores from :meth:`TaskModel.evaluate`).

    With ``out_dir``, the folder's writer lock is held from the start (:func:`elmokit.io.lock_folder`): a second
    training run into the same folder is refused (:class:`~elmokit.errors.FolderInUseError`) instead of replacing this
    one's model under it.

    Raises:
        the errors of :func:`~elmokit.tasks.building.build_from_config`, :func:`fit` and :func:`save_task_model`.
    """
    lock = lock_folder(out_dir, "task model folder (--out)") if out_dir is not None else None
    try:
        if seed is not None:
            config = config.override({"train.seed": seed})
        t = config.train
        model, data = build_from_config(config, bilm=bilm, log=log, prepared=prepared, progress=progress)
        model.to(device)
        start = time.perf_counter()
        fit(
            model,
            data["train"],
            data["dev"],
            epochs=t.epochs,
            patience=t.patience,
            lr=t.lr,
            batch_size=t.batch_size,
            clip=t.clip,
            l2=config.bilm.l2,
            seed=t.seed,
            max_steps=max_steps,
            unseen=unseen,
            log=log,
        )
        model.results = _scores(model, data, unseen, time.perf_counter() - start)
        if out_dir is not None:
            save_task_model(model, out_dir)
        return model
    finally:
        if lock is not None:
            lock.release()
