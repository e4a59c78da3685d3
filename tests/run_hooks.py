"""Test-only hooks into training and embedding runs, and a test-only entry that runs the ``elmokit`` command with them.

The library reads no environment variable for these: a test passes :class:`TestHooks` to the trainer it builds
(``Trainer(config, hooks=...)``), or sets ``Trainer.default_hooks`` / ``elmokit.embedding.writer._probe`` for a run
it does not build itself. For a run in a subprocess, this file is the program::

    python tests/run_hooks.py [--digests PREFIX] [--sigint-at RANK:STEP] [--kill-at POINT:STEP]
                              [--embed-kill-at POINT:PART] -- <elmokit arguments>

(also under ``torchrun``: ``python -m torch.distributed.run ... tests/run_hooks.py ... -- train ...``), which installs
the hooks and then runs what ``python -m elmokit <elmokit arguments>`` runs (:func:`elmokit.cli.entry`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import elmokit.cli  # noqa: F401  (first: elmokit's OpenMP settings before torch, as `python -m elmokit`)
from elmokit.embedding import writer
from elmokit.pretraining.checkpoint import KILL_POINTS
from elmokit.pretraining.hooks import TrainHooks
from elmokit.pretraining.trainer import Trainer

#: The kill points of an embedding run and the writer's probe event at each: the part fully written under its
#: temporary name (not renamed yet), the part renamed (the next not begun).
EMBED_KILL_POINTS = {"before_rename": "part_written", "after_part": "part_done"}


def parameter_digest(trainer: Any) -> str:
    """sha256 over the names and bytes of ``trainer.lm``'s state dict, in order."""
    h = hashlib.sha256()
    for name, tensor in trainer.lm.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class TestHooks(TrainHooks):
    """``digests``: after every step each process appends ``{"step", "sha256"}`` of its parameters to
    ``<digests>.rank<R>.jsonl``; ``sigint_at=(rank, step)``: that process sends itself SIGINT during that step;
    ``kill_at=(point, step)``: the writing process SIGKILLs itself at that point of the checkpoint of that step."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        digests: str | None = None,
        sigint_at: tuple[int, int] | None = None,
        kill_at: tuple[str, int] | None = None,
    ) -> None:
        if kill_at is not None and kill_at[0] not in KILL_POINTS:
            raise ValueError(f"kill point {kill_at[0]!r} is not one of {KILL_POINTS}")
        self.digests, self.sigint_at, self.kill_at = digests, sigint_at, kill_at

    def after_step(self, trainer: Any) -> None:
        if self.digests:
            with open(f"{self.digests}.rank{trainer.dist.rank}.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": trainer.step, "sha256": parameter_digest(trainer)}) + "\n")
        if self.sigint_at == (trainer.dist.rank, trainer.step):
            os.kill(os.getpid(), signal.SIGINT)

    def checkpoint_point(self, point: str, step: int) -> None:
        if self.kill_at == (point, step):
            os.kill(os.getpid(), signal.SIGKILL)


def embed_kill_probe(point: str, wanted: int) -> Callable[..., None]:
    """A writer probe (``elmokit.embedding.writer._probe``) that SIGKILLs this process at ``point``
    (:data:`EMBED_KILL_POINTS`) of part ``wanted``."""
    event_wanted = EMBED_KILL_POINTS[point]

    def probe(event: str, part: int = -1, **info: Any) -> None:
        if event == event_wanted and part == wanted:
            os.kill(os.getpid(), signal.SIGKILL)

    return probe


def _pair(text: str, first=str) -> tuple[Any, int]:
    a, _, b = text.partition(":")
    return first(a), int(b)


def main(argv: list[str]) -> int:
    """Install the hooks the options ask for, then run ``elmokit`` with the arguments after ``--``."""
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="run_hooks.py")
    parser.add_argument("--digests")
    parser.add_argument("--sigint-at", type=lambda t: _pair(t, int))
    parser.add_argument("--kill-at", type=_pair)
    parser.add_argument("--embed-kill-at", type=_pair)
    args = parser.parse_args(argv[:cut])
    Trainer.default_hooks = TestHooks(args.digests, args.sigint_at, args.kill_at)
    if args.embed_kill_at:
        writer._probe = embed_kill_probe(*args.embed_kill_at)
    sys.argv = [sys.argv[0], *argv[cut + 1 :]]
    return elmokit.cli.entry()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
