"""Several training processes on PyTorch's own distributed engine (``torch.distributed``, started by ``torchrun``).

``torchrun --nproc-per-node N -m elmokit train …`` starts N processes with the environment variables ``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_from_env` joins them into one process group
(``gloo`` on CPU, ``nccl`` on CUDA, each process on its own GPU ``cuda:LOCAL_RANK``). Without ``WORLD_SIZE`` (or with 1)
there is one process and no process group: :class:`DistContext` then does every collective as the identity, so the
trainer has one code path.

What the trainer shares through it (see :mod:`elmokit.pretraining.trainer`): the gradients (DistributedDataParallel),
each step's token count and loss, one flag vector per step by which process 0 decides time-based checkpoints and
evaluations and any process an interrupt, and the outcome of every step that can fail on one process only (reading
its part of the corpus, writing a checkpoint on process 0): :meth:`DistContext.agree` makes every process raise the
same error instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import torch

from elmokit.devices import resolve_device
from elmokit.errors import (CheckpointError, ConfigError, DataError, ElmoError, InputError, MissingFileError,
                            TrainingError, UsageError, WeightsError)

__all__ = ["DistContext", "init_from_env", "single_process"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class DistContext:
    """Where this process stands among the training processes.

    Attributes:
        rank: this process's index (0 = the one that writes files). world_size: number of processes.
        local_rank: index on this machine (its GPU). backend: ``"gloo"``/``"nccl"``, ``None`` for one process.
        owns_group: :func:`init_from_env` created the process group (:meth:`close` destroys it).
        comm_device: where collective tensors live (CPU for gloo, this process's GPU for nccl).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    owns_group: bool = False
    comm_device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        """Several processes (collectives are real)."""
        return self.world_size > 1 and self.backend is not None

    @property
    def is_main(self) -> bool:
        """Process 0: it writes the run's files."""
        return self.rank == 0

    # ------------------------------------------------------------------ devices
    def device_for(self, name: str | None) -> torch.device:
        """The device this process trains on for the configured ``name``.

        One process: :func:`elmokit.devices.resolve_device`. Several: ``auto`` is ``cuda:LOCAL_RANK`` when CUDA is
        available (else CPU), ``cuda`` is ``cuda:LOCAL_RANK``, ``cpu`` is the CPU.

        Raises:
            UsageError: as ``resolve_device``; with several processes, an explicit ``cuda:N`` (each process takes its
                own GPU), or fewer GPUs than processes on this machine.
        """
        if self.world_size <= 1:
            return resolve_device(name)
        text = "auto" if name is None else str(name)
        if text == "cpu":
            return torch.device("cpu")
        if text == "auto" and not torch.cuda.is_available():
            return torch.device("cpu")
        if text not in ("auto", "cuda"):
            raise UsageError(f"--device {text!r} with {self.world_size} processes: each process uses its own GPU "
                             "(cuda:LOCAL_RANK); pass --device cuda, auto or cpu")
        resolve_device("cuda")  # a clear error where CUDA is missing
        if self.local_rank >= torch.cuda.device_count():
            raise UsageError(f"process {self.rank} has LOCAL_RANK {self.local_rank} but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s): start at most that many processes per node "
                             "(torchrun --nproc-per-node)")
        return torch.device("cuda", self.local_rank)

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum (``op="sum"``) or maximum (``"max"``) of ``values`` over the processes (float64)."""
        if not self.enabled:
            return [float(v) for v in values]
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return [float(v) for v in t.cpu()]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every process is here."""
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def agree(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on every process and share the outcome: when it raised anywhere, every process raises (the one
        that failed its own exception, the others the same kind of error naming the process and its message), so that
        none waits in a collective for a process that stopped. Returns ``fn``'s result."""
        if not self.enabled:
            return fn()
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 — shared, then re-raised
            self.raise_shared(exc)
            raise
        self.raise_shared(None)
        return result

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on process 0 only (the others wait) and share its outcome as :meth:`agree` does. Returns its
        result on process 0, ``None`` elsewhere."""
        return self.agree(fn if self.is_main else (lambda: None))

    def raise_shared(self, exc: BaseException | None) -> None:
        """Collective: each process gives its error (or ``None``); if any process has one, every process raises. A
        process with its own error re-raises it; the others raise the first failing process's kind of error."""
        if not self.enabled:
            if exc is not None:
                raise exc
            return
        info = None if exc is None else _describe_error(exc)
        infos = self.all_gather_object(info)
        if exc is not None:
            raise exc
        failed = [(rank, i) for rank, i in enumerate(infos) if i is not None]
        if failed:
            rank, i = failed[0]
            raise _remote_error(rank, i)

    def close(self) -> None:
        """Destroy the process group when :func:`init_from_env` created it."""
        if self.owns_group and self.enabled:
            import torch.distributed as dist

            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            self.owns_group = False


def single_process() -> DistContext:
    """The context of a lone process (no process group)."""
    return DistContext()


def init_from_env(device: str | None = "auto") -> DistContext:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), or return a single-process context when ``WORLD_SIZE`` is missing or 1. A
    process group that already exists (made by the caller) is used as it is.

    Backend: ``nccl`` when this process trains on CUDA (``device``, see :meth:`DistContext.device_for`; the process's
    GPU is made the current one), else ``gloo``.

    Raises:
        UsageError: ``WORLD_SIZE`` > 1 without the other variables (not started by torchrun), values that are not
            numbers, or a device that cannot be used (see :meth:`DistContext.device_for`).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        ctx = DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                          local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0), backend=backend)
        if backend == "nccl":
            ctx.comm_device = torch.device("cuda", torch.cuda.current_device())
        return ctx
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return single_process()
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    except (KeyError, ValueError):
        raise UsageError(f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} but RANK/LOCAL_RANK are missing or not numbers: "
                         "start several training processes with torchrun (torchrun --nproc-per-node N -m elmokit "
                         "train …)") from None
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise UsageError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: start several training processes "
                         "with torchrun (torchrun --nproc-per-node N -m elmokit train …)")
    if not dist.is_available():
        raise UsageError("this PyTorch build has no torch.distributed: train with one process")
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank)
    train_device = ctx.device_for(device)
    backend = "nccl" if train_device.type == "cuda" else "gloo"
    if train_device.type == "cuda":
        torch.cuda.set_device(train_device)
        ctx.comm_device = train_device
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world)
    ctx.backend, ctx.owns_group = backend, True
    logger.info("process %d of %d joined (%s, %s)", rank, world, backend, train_device)
    return ctx


# ---------------------------------------------------------------------------------------------- shared errors
_SIMPLE = {c.__name__: c for c in (UsageError, ConfigError, InputError, MissingFileError, WeightsError,
                                   CheckpointError, DataError)}


def _describe_error(exc: BaseException) -> dict[str, Any]:
    return {"mro": [c.__name__ for c in type(exc).__mro__], "message": " ".join(str(exc).split()) or type(exc).__name__}


def _remote_error(rank: int, info: dict[str, Any]) -> BaseException:
    """The error a process raises for another process's failure: of the same kind where it is one of elmokit's (or an
    OS error, or an interrupt), else a TrainingError."""
    message = f"process {rank}: {info['message']}"
    for name in info["mro"]:
        if name == "KeyboardInterrupt":
            return KeyboardInterrupt()
        if name == "TrainingError":
            return TrainingError(message)
        if name in _SIMPLE:
            return _SIMPLE[name](message)
        if name == "OSError":
            return OSError(message)
    if "ElmoError" in info["mro"]:
        return ElmoError(message)
    return TrainingError(f"process {rank} failed: {info['mro'][0]}: {info['message']}")
