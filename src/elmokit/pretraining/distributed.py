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

It is the one torchrun layer of elmokit: ``torchrun … -m elmokit embed`` (:mod:`elmokit.embedding.writer`) reads its
rank with :func:`torchrun_rank`, joins with :func:`init_from_env` (``command="embed"``) and shares process 0's outcome
with :meth:`DistContext.on_main`, so an error of another process is rebuilt one way (:func:`_remote_error`) for both.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from elmokit.devices import resolve_device
from elmokit.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    ElmoError,
    EmbedWorkerError,
    FolderInUseError,
    InputError,
    MissingFileError,
    TrainingError,
    UsageError,
    WeightsError,
)

__all__ = ["DistContext", "init_from_env", "single_process", "torchrun_rank"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

#: Per ``elmokit`` command run under torchrun: what its processes are called in messages, how another process's
#: failure is named (``{rank}``: that process) when it is one of elmokit's errors and when it is another exception,
#: and the error raised for the latter.
_COMMANDS: dict[str, tuple[str, str, str, type[ElmoError]]] = {
    "train": ("training", "process {rank}", "process {rank} failed", TrainingError),
    "embed": ("embedding", "process {rank} stopped", "process {rank} stopped", EmbedWorkerError),
}


@dataclass
class DistContext:
    """Where this process stands among the training processes.

    Attributes:
        rank: this process's index (0 = the one that writes files). world_size: number of processes.
        local_rank: index on this machine (its GPU). backend: ``"gloo"``/``"nccl"``, ``None`` for one process.
        owns_group: :func:`init_from_env` created the process group (:meth:`close` destroys it).
        comm_device: where collective tensors live (CPU for gloo, this process's GPU for nccl).
        command: the ``elmokit`` command the processes run (``"train"``, ``"embed"``): how another process's error
            is worded when it is raised here (:func:`_remote_error`).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    owns_group: bool = False
    comm_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    command: str = "train"

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
            raise UsageError(
                f"--device {text!r} with {self.world_size} processes: each process uses its own GPU "
                "(cuda:LOCAL_RANK); pass --device cuda, auto or cpu"
            )
        resolve_device("cuda")  # a clear error where CUDA is missing
        if self.local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"process {self.rank} has LOCAL_RANK {self.local_rank} but this machine has "
                f"{torch.cuda.device_count()} CUDA device(s): start at most that many processes per node "
                "(torchrun --nproc-per-node)"
            )
        return torch.device("cuda", self.local_rank)

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum (``op="sum"``) or maximum (``"max"``) of ``values`` over the processes (float64)."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return [float(v) for v in t.cpu()]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every process is here."""
        if self.enabled:
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
            raise _remote_error(rank, i, self.command)

    def close(self) -> None:
        """Destroy the process group when :func:`init_from_env` created it."""
        if self.owns_group and self.enabled:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            self.owns_group = False


def single_process() -> DistContext:
    """The context of a lone process (no process group)."""
    return DistContext()


def torchrun_rank(command: str = "train") -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from torchrun's environment; (0, 1) without it (``WORLD_SIZE`` missing or 1).

    Raises:
        UsageError: ``WORLD_SIZE`` > 1 without a ``RANK`` in ``0 … WORLD_SIZE - 1``, or values that are not numbers
            (not started by torchrun; the message shows how to start ``elmokit <command>`` so)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return 0, 1
        rank = int(os.environ["RANK"])
    except (KeyError, ValueError):
        raise UsageError(
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} but RANK={os.environ.get('RANK')!r} is missing "
            f"or not a number: {_how_to_start(command)}"
        ) from None
    if not 0 <= rank < world:
        raise UsageError(f"RANK={rank} is outside 0..{world - 1}: {_how_to_start(command)}")
    return rank, world


def _how_to_start(command: str) -> str:
    what = _COMMANDS[command][0]
    return f"start several {what} processes with torchrun (torchrun --nproc-per-node N -m elmokit {command} …)"


def init_from_env(
    device: str | None = "auto", *, command: str = "train", timeout: datetime.timedelta | None = None
) -> DistContext:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``), or return a single-process context when ``WORLD_SIZE`` is missing or 1. A
    process group that already exists (made by the caller) is used as it is.

    Backend: ``nccl`` when this process trains on CUDA (``device``, see :meth:`DistContext.device_for`; the process's
    GPU is made the current one), else ``gloo``. ``command``: the ``elmokit`` command being run (``"train"``,
    ``"embed"``; see :attr:`DistContext.command`). ``timeout``: of the collectives (default: torch's, 30 minutes for
    gloo); ``embed`` waits a day at its last barrier, for the slowest process's parts.

    Raises:
        UsageError: ``WORLD_SIZE`` > 1 without the other variables (not started by torchrun), values that are not
            numbers, or a device that cannot be used (see :meth:`DistContext.device_for`).
    """
    if dist.is_available() and dist.is_initialized():
        backend = str(dist.get_backend())
        ctx = DistContext(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
            backend=backend,
            command=command,
        )
        if backend == "nccl":
            ctx.comm_device = torch.device("cuda", torch.cuda.current_device())
        return ctx
    rank, world = torchrun_rank(command)
    if world <= 1:
        return DistContext(command=command)
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    except ValueError:
        raise UsageError(
            f"LOCAL_RANK={os.environ.get('LOCAL_RANK')!r} is not a number: {_how_to_start(command)}"
        ) from None
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise UsageError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: {_how_to_start(command)}")
    if not dist.is_available():
        raise UsageError(f"this PyTorch build has no torch.distributed: run elmokit {command} in one process")
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, command=command)
    device_here = ctx.device_for(device)
    backend = "nccl" if device_here.type == "cuda" else "gloo"
    if device_here.type == "cuda":
        torch.cuda.set_device(device_here)
        ctx.comm_device = device_here
    options = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world, **options)
    ctx.backend, ctx.owns_group = backend, True
    logger.info("process %d of %d joined (%s, %s)", rank, world, backend, device_here)
    return ctx


# ---------------------------------------------------------------------------------------------- shared errors
_SIMPLE = {
    c.__name__: c
    for c in (
        UsageError,
        ConfigError,
        InputError,
        MissingFileError,
        WeightsError,
        CheckpointError,
        DataError,
        FolderInUseError,
        TrainingError,
        EmbedWorkerError,
    )
}


def _describe_error(exc: BaseException) -> dict[str, Any]:
    """What another process needs to raise the same kind of error: the names of the classes of ``exc`` (its MRO) and
    its message on one line (picklable)."""
    return {"mro": [c.__name__ for c in type(exc).__mro__], "message": " ".join(str(exc).split()) or type(exc).__name__}


def _remote_error(rank: int, info: dict[str, Any], command: str = "train") -> BaseException:
    """The error a process raises for process ``rank``'s failure (``info``: :func:`_describe_error`): of the same kind
    where it is one of elmokit's (the nearest in its MRO that takes a message alone, e.g. a ``DataError`` for a
    ``CorpusDecodeError``), an OS error or an interrupt; else the command's own error (``TrainingError`` for ``train``,
    ``EmbedWorkerError`` for ``embed``). The message names the process (``process 1: …``; ``embed``: ``process 0
    stopped: …``)."""
    _, label, label_other, fallback = _COMMANDS[command]
    message = f"{label.format(rank=rank)}: {info['message']}"
    for name in info["mro"]:
        if name == "KeyboardInterrupt":
            return KeyboardInterrupt()
        if name in _SIMPLE:
            return _SIMPLE[name](message)
        if name == "OSError":
            return OSError(message)
    if "ElmoError" in info["mro"]:
        return ElmoError(message)
    return fallback(f"{label_other.format(rank=rank)}: {info['mro'][0]}: {info['message']}")
