"""Pretraining a biLM (the bidirectional LM objective): configuration, data parts, the trainer, checkpoints,
held-out perplexity, several processes (torchrun), continued pretraining from released weights.

* :mod:`.config` — :class:`TrainConfig` and the rules for what may change on resume;
* :mod:`.objective` — :class:`BidirectionalLM` (biLM + shared softmax, the loss);
* :mod:`.data` — this process's data parts and the vocabularies counted part by part;
* :mod:`.build` — everything a run is given, made from its config (data, vocabularies, model, optimiser);
* :mod:`.trainer` — :func:`build_trainer`, :class:`Trainer`: the loop, as a sequence of named steps;
* :mod:`.step` — one optimiser step (``train_step``) and its seeds;
* :mod:`.heldout` — the held-out curve and the best model;
* :mod:`.resume` — starting or resuming a run in its folder, the trainer's checkpoints;
* :mod:`.lm_files` — saving and loading trained LMs;
* :mod:`.hooks` — where tests look into a run (:class:`~elmokit.pretraining.hooks.TrainHooks`);
* :mod:`.checkpoint` — checkpoint files written so that nothing is lost, verified before use;
* :mod:`.run_folder` — every file a run writes (main process only), the learning curve;
* :mod:`.distributed` — torchrun / DistributedDataParallel: the one torchrun context of elmokit (``embed`` too);
* :mod:`.init_from` — the model a continued pretraining run starts from;
* :mod:`.perplexity` — held-out perplexity, scores, a unigram baseline;
* :mod:`.start_state` — the fixed start state stored with a window-trained model.

The names below are imported on first use (PEP 562 ``__getattr__``; ``from elmokit.pretraining import Trainer`` works
as ever): ``elmokit embed`` imports :mod:`.distributed` while the CLI builds its parser, and that should not load the
trainer (lazy: CLI start-up).
"""

from __future__ import annotations

import importlib

#: public name → the submodule that defines it
_EXPORTS = {
    "TrainConfig": "config",
    "RESUME_MAY_CHANGE": "config",
    "BidirectionalLM": "objective",
    "DirectionalNLL": "objective",
    "evaluate_perplexity": "perplexity",
    "score_sentences": "perplexity",
    "unigram_perplexity": "perplexity",
    "Trainer": "trainer",
    "TrainingError": "trainer",
    "StepResult": "trainer",
    "build_trainer": "trainer",
    "latest_checkpoint_step": "trainer",
    "save_lm": "trainer",
    "load_lm": "trainer",
    "plot_learning_curve": "trainer",
}

__all__ = [
    "TrainConfig",
    "RESUME_MAY_CHANGE",
    "BidirectionalLM",
    "DirectionalNLL",
    "Trainer",
    "TrainingError",
    "StepResult",
    "build_trainer",
    "save_lm",
    "load_lm",
    "latest_checkpoint_step",
    "plot_learning_curve",
    "evaluate_perplexity",
    "score_sentences",
    "unigram_perplexity",
]


def __getattr__(name: str) -> object:
    """Import a public name's submodule on first use (lazy: CLI start-up, see the module docstring)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"elmokit.pretraining.{module}"), name)
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
