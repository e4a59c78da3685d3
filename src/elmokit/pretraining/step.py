"""One optimiser step of pretraining: the step's seeds, drawing the step's batch, forward, backward and update.

:class:`StepMixin` holds :class:`~elmokit.pretraining.trainer.Trainer`'s step methods (:meth:`~StepMixin.next_batch`,
:meth:`~StepMixin.train_step`); the loop (:meth:`Trainer.train`) and ``bench/train.py`` both use them. Randomness:
the dropout masks of data part ``d`` at step ``s`` and the sampled softmax negatives of step ``s`` come from
:func:`step_seed` of ``(seed, s, d)`` and ``(seed, s)``, not from a stream carried from step to step (see the
trainer's module docstring).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from dataclasses import dataclass

import torch

from elmokit.errors import ElmoError, TrainingError
from elmokit.modules.precision import autocast
from elmokit.pretraining.config import learning_rate_at
from elmokit.pretraining.data import PartBatch, StepBatch
from elmokit.pretraining.objective import DirectionalNLL

__all__ = ["step_seed", "StepResult", "StepMixin"]


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


class StepMixin:
    """:class:`~elmokit.pretraining.trainer.Trainer`'s step: draw the next global batch, one optimiser step on it.

    Uses the trainer's ``config``, ``device``, ``dist``, ``lm``, ``optimizer``, ``data``, ``sampler``, ``step``,
    ``lstm_states`` and ``_ddp`` (see :class:`~elmokit.pretraining.trainer.Trainer`).
    """

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
        # one process: the softmax's sampled rows get a sparse gradient, made dense once below (DistributedDataParallel
        # reduces dense gradients only)
        self.lm.softmax.sparse_grad = self._ddp is None
        scale = 0.5 * self.dist.world_size * c.unroll_steps / max(1, batch.total_tokens)
        sum_f = sum_b = 0.0
        for i, part in enumerate(batch.parts):
            torch.manual_seed(step_seed(c.seed, step, "dropout", part.part))
            self.sampler.manual_seed(step_seed(c.seed, step, "negatives"))
            last = i == len(batch.parts) - 1
            sync = contextlib.nullcontext() if self._ddp is None or last else self._ddp.no_sync()
            with sync:
                with autocast(c.precision, self.device):  # the forward pass only; backward follows its dtypes
                    fwd, bwd, state = model(
                        part.data,
                        batching=c.batching,
                        state=self._state_for(part),
                        num_samples=c.n_negative_samples,
                        generator=self.sampler,
                        freeze_bilm=frozen,
                    )
                if fwd.numel() != part.n_tokens or bwd.numel() != part.n_tokens:
                    raise TrainingError(
                        f"internal: part {part.part} of step {step} has {part.n_tokens} targets, "
                        f"the model scored {fwd.numel()}/{bwd.numel()}"
                    )
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
        for p in self.lm.parameters():
            if p.grad is not None and p.grad.is_sparse:
                p.grad = p.grad.to_dense()  # one (V, D) zero fill and one indexed sum
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.lm.parameters() if p.grad is not None], c.clip_norm)
        if not torch.isfinite(grad_norm):
            raise TrainingError(
                f"non-finite gradient norm at step {step} (loss {loss:.4f}); stopping before the "
                "update. " + self._recovery_hint()
            )
        if c.lr_warmup_steps or c.lr_schedule != "constant":  # (a constant rate leaves a given optimiser's own)
            lr = learning_rate_at(c, step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
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
            f, b, state = self.lm(
                part.data,
                batching=self.config.batching,
                state=self._state_for(part),
                num_samples=self.config.n_negative_samples,
                generator=self.sampler,
            )
            if state is not None:
                self.lstm_states[part.part] = state
            fwd.append(f)
            bwd.append(b)
            rows.append(torch.zeros(f.numel(), dtype=torch.long, device=f.device))
        r = torch.cat(rows)
        return DirectionalNLL(torch.cat(fwd), torch.cat(bwd), r, r)
