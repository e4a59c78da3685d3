"""Where tests and diagnostics look into a training run: :class:`TrainHooks`, whose methods the loop calls at fixed
points and which do nothing by default.

A test passes its own (``Trainer(config, hooks=...)``, ``build_trainer(config, hooks=...)``), or, for a run it does
not build itself (the CLI in a subprocess, a zoo build), sets :attr:`elmokit.pretraining.trainer.Trainer.default_hooks`.
``tests/train_hooks.py`` has the ones the suite uses: a parameter digest after every step (``tests/test_distributed.py``
compares the processes' weights), a SIGINT at a given process and step, a SIGKILL at a point of a checkpoint write
(``tests/test_kill.py``). Nothing in the training loop reads the environment for them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainHooks"]


class TrainHooks:
    """The points of a training run a hook sees; every method here does nothing (subclass and override).

    Source: the callback points of torchtune's recipes and Lightning's ``Callback``, kept to the two the suite needs.
    """

    def after_step(self, trainer: Any) -> None:
        """Called on every process after the optimiser step ``trainer.step`` (the model updated), before it is logged,
        evaluated or checkpointed, inside the step's :func:`elmokit.interrupts.deferred` block (a signal sent here is
        acted on at the end of the step, as a real Ctrl-C would be)."""

    def checkpoint_point(self, point: str, step: int) -> None:
        """Called by the process that writes the checkpoint of ``step`` at each ``point`` of
        :data:`elmokit.pretraining.checkpoint.KILL_POINTS` (see
        :func:`~elmokit.pretraining.checkpoint.write_checkpoint`)."""
