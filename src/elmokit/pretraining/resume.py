"""Where a training run stands on disk: starting a new run in its folder or resuming the one there, and the
checkpoints that make a resume exact (what they hold, writing them — at an interrupt too —, loading and checking
them).

:class:`ResumeMixin` holds :class:`~elmokit.pretraining.trainer.Trainer`'s checkpoint and run-folder methods; the
file format and its verification are :mod:`elmokit.pretraining.checkpoint`, every other file of the run folder
:mod:`elmokit.pretraining.run_folder`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from elmokit import interrupts
from elmokit.errors import CheckpointError, UsageError
from elmokit.pretraining import checkpoint as ckpt
from elmokit.pretraining.data import check_corpus_unchanged, corpus_fingerprint
from elmokit.weights import check_state_fits

__all__ = ["ResumeMixin", "latest_checkpoint_step", "one_line"]

logger = logging.getLogger(__name__)


def latest_checkpoint_step(out_dir: str | os.PathLike) -> int | None:
    """The step of the newest checkpoint in ``out_dir`` that verifies (files present with the sizes and sha256 that
    ``checkpoint.json`` records), i.e. where ``Trainer.train(resume=True)`` would continue; ``None`` when there is
    nothing to resume (no checkpoint, an unreadable manifest, or no checkpoint verifies). Logs nothing."""
    return ckpt.latest_valid_step(out_dir)


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line, at most 300 characters (for messages that quote a library's error)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _describe_run(out_dir: Path, found: list[Path]) -> str:
    """What the run in ``out_dir`` holds (its files ``found``, its latest checkpoint, finished or not), for the message
    that refuses to start a new run there."""
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


class ResumeMixin:
    """:class:`~elmokit.pretraining.trainer.Trainer`'s checkpoints and run folder.

    Uses the trainer's ``config``, ``dist``, ``lm``, ``optimizer``, ``data``, ``run``, ``out_dir``, ``step``,
    ``lstm_states``, ``best``, ``hooks``, ``say`` and its clock (``_now``), and the bookkeeping attributes that
    :meth:`Trainer.__init__` sets (``_kept``, ``_saved_step``, ``_owns_out_dir``, ``_corpus``,
    ``_interrupt_handled``, ...).
    """

    # ------------------------------------------------------------------ checkpoints
    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint's tensors depend on besides the options: the vocabularies' sizes and sha256, and the
        training files' fingerprint (size, mtime, sha256 of each: on resume, a data position means something only in
        the same text)."""
        run: dict[str, Any] = {"vocab": {**self._vocab_fingerprint, "file": self.config.vocab_file}}
        if self._corpus is not None:
            run["corpus"] = {"files": self._corpus}
        if self.char_vocab is not None:
            run["char_vocab"] = {
                "size": self.char_vocab.vocab_size,
                "sha256": ckpt.text_digest(list(self.char_vocab.characters)),
            }
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
            raise UsageError(
                f"{self.out_dir} holds the checkpoints of another run: load them first "
                "(load_checkpoint(), train(resume=True)) or replace them (train(overwrite=True))"
            )
        with interrupts.deferred():
            step = self.step
            mine = (
                {str(d): s for d, s in self.data.state_dict().items()},
                {str(d): [t.detach().cpu() for t in s] for d, s in self.lstm_states.items() if s is not None},
            )
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
                    "valid_step": json.dumps(
                        self._last_valid_step == step
                        and {"step": step, "valid_files": list(self.config.valid_files or [])}
                    ),
                    "randomness": "per-step seeds",
                }
                self._kept = ckpt.write_checkpoint(
                    self.out_dir,
                    step,
                    tensors,
                    state,
                    previous=self._kept,
                    keep=self.config.keep_checkpoints,
                    run=self._run_identity(),
                    at_point=self.hooks.checkpoint_point,
                )

            self.dist.on_main(write)
            self._saved_step = step
            self._last_checkpoint_time = self._now()
        return self.out_dir / ckpt.tensor_file_name(step)

    def _on_interrupt(self, mid_step: bool) -> None:
        """Ctrl-C/SIGTERM reached the loop: write a checkpoint at the current step when it is consistent (the signal
        landed between steps) and newer than the last one, and say where the run stands."""
        why = interrupts.signal_name() or (
            "an interrupt of another process" if self.dist.enabled and self._interrupt_handled else "KeyboardInterrupt"
        )
        last = self._saved_step
        if mid_step or (self.dist.enabled and not self._interrupt_handled):
            # only without interrupts.handling_signals() (or on a second Ctrl-C): the step was cut, its state is torn
            logger.warning(
                "%s in the middle of a step: nothing saved (a cut step cannot be resumed); %s",
                why,
                f"the latest checkpoint is step {last}" if last is not None else "no checkpoint yet",
            )
            return
        if self.step == 0 or self.step == last:
            if self.dist.is_main:
                logger.warning(
                    "%s at step %d: %s",
                    why,
                    self.step,
                    f"the checkpoint of step {last} is the latest, resume continues from there"
                    if last is not None
                    else "nothing trained yet",
                )
            return
        try:
            self.save_checkpoint()
        except KeyboardInterrupt:
            pass  # deferred() re-raises the signal being handled at the end of a complete write; a second one cuts it
        except Exception as exc:  # e.g. disk full: say so, and still stop as interrupted
            logger.error(
                "%s at step %d: writing its checkpoint failed (%s); %s",
                why,
                self.step,
                one_line(exc),
                f"the latest checkpoint is step {last}" if last is not None else "no checkpoint written",
            )
            return
        if self._saved_step == self.step:
            if self.dist.is_main:
                logger.warning(
                    "%s: stopped after step %d, checkpoint written (%s); resume continues from step %d",
                    why,
                    self.step,
                    self.out_dir / ckpt.tensor_file_name(self.step),
                    self.step,
                )
            try:  # the learning curve so far (best effort: the interrupt is what matters)
                self.dist.on_main(self.run.plot)
            except Exception as exc:  # noqa: BLE001
                logger.warning("learning curve not drawn after the interrupt: %s", one_line(exc))
        else:  # a second Ctrl-C cut the write: the previous checkpoint is still the latest
            logger.warning(
                "%s again while writing the checkpoint of step %d: %s",
                why,
                self.step,
                f"the latest checkpoint is step {last}" if last is not None else "no checkpoint written",
            )

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
            raise CheckpointError(f"{t_path} cannot be loaded into the model ({one_line(exc)})") from None
        saved_optimizer = state.get("optimizer_name", self.config.optimizer)  # first-format states do not say
        if saved_optimizer != self.config.optimizer:
            raise CheckpointError(
                f"{s_path} holds the state of the optimizer {saved_optimizer!r}, this run uses "
                f"{self.config.optimizer!r}: resume with the options the run was started with, or "
                "start a new run with --overwrite"
            )
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"{s_path}: the optimiser state does not fit this run ({one_line(exc)}): it was "
                f"written with other options (optimizer {self.config.optimizer!r}?); resume with "
                "the options the run was started with, or start a new run with --overwrite"
            ) from None
        data_states, lstm_states = self._parts_of_state(state, s_path)
        try:
            self.data.load_state_dict(data_states, str(s_path))
        except (KeyError, TypeError, ValueError) as exc:  # UsageError (another corpus or options) is a ValueError
            raise CheckpointError(f"{s_path}: the saved data position does not fit this run: {one_line(exc)}") from None
        self.lstm_states = {
            d: tuple(t.to(self.device) for t in s) for d, s in lstm_states.items() if d in self.data.parts
        }
        try:
            best = json.loads(state.get("best", "null"))
        except (TypeError, ValueError):
            best = None
        if best is not None and best.get("valid_files") != list(self.config.valid_files or []):
            logger.warning(
                "the held-out files changed since the best model (step %s, held-out perplexity %.2f) was "
                "kept: the best is chosen anew on the new held-out text",
                best.get("step"),
                best.get("valid_ppl", float("nan")),
            )
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
        if (
            isinstance(evaluated, dict)
            and evaluated.get("step") == self.step
            and evaluated.get("valid_files") == list(self.config.valid_files or [])
        ):
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
            raise CheckpointError(f"{s_path}: the saved data position cannot be read ({one_line(exc)})") from None
        if saved_parts != self.data.n_parts:
            raise CheckpointError(
                f"{s_path} was written by a run with {saved_parts} data part(s), this run has "
                f"{self.data.n_parts} (--data-parts, or one per process): resume it on 1 to "
                f"{saved_parts} process(es) with its own --data-parts"
            )
        return positions, lstm_states

    def _check_run_identity(self, manifest: ckpt.Manifest) -> None:
        c = self.config
        for key, now, what in (
            ("vocab", self._vocab_fingerprint, "vocabulary"),
            ("char_vocab", self._run_identity().get("char_vocab"), "character vocabulary"),
        ):
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
                "--out-dir)"
            )

    def _check_fits(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        """The checkpoint's tensors must be exactly the model's (names and shapes), else a message naming the first
        one that differs (``load_state_dict`` would raise a long torch error listing them all)."""
        advice = (
            "it was written for another model (options, vocabulary or character vocabulary): resume with the "
            "options the run was started with (see train_config.json), or start a new run with --overwrite"
        )
        check_state_fits(self.lm.state_dict(), tensors, str(path), error=CheckpointError, advice=advice)

    def _recovery_hint(self) -> str:
        step = self._saved_step if self._saved_step is not None else latest_checkpoint_step(self.out_dir)
        if step is not None:
            return (
                f"The last good checkpoint (step {step}) in {self.out_dir} is intact: check the data and --resume, "
                "or start a new run with a lower learning rate"
            )
        return "No checkpoint was written yet: start a new run with a lower learning rate, or check the data"

    # ------------------------------------------------------------------ the output folder
    def _start_new_run(self, overwrite: bool) -> None:
        """Main process: refuse a folder holding a run (unless ``overwrite``: remove its files), create it."""
        self.run.check_is_folder()
        found = ckpt.run_files(self.out_dir)
        if found and not overwrite:
            resumable = latest_checkpoint_step(self.out_dir) is not None
            raise UsageError(
                f"{self.out_dir} already holds a training run ({_describe_run(self.out_dir, found)}): "
                "pass --overwrite to replace it"
                + (", or --resume to continue it" if resumable else " (it has no checkpoint to --resume from)")
            )
        if found:
            removed = self.run.remove_run()
            logger.warning(
                "overwrite: removed the previous run from %s (%s)", self.out_dir, ", ".join(p.name for p in removed)
            )
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
                    raise CheckpointError(
                        f"{self.out_dir} has checkpoint files ({', '.join(orphans[:4])}"
                        f"{', …' if len(orphans) > 4 else ''}) but no checkpoint.json naming them "
                        "(deleted or never written): it cannot be told which are complete. Restore "
                        "checkpoint.json, or start again with --overwrite"
                    )
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
