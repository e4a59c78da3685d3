"""Pretraining a biLM (the bidirectional LM objective): configuration, data parts, the trainer, checkpoints,
held-out perplexity, several processes (torchrun), continued pretraining from released weights.

* :mod:`.config` — :class:`TrainConfig` and the rules for what may change on resume;
* :mod:`.objective` — :class:`BidirectionalLM` (biLM + shared softmax, the loss);
* :mod:`.data` — this process's data parts and the vocabularies counted part by part;
* :mod:`.trainer` — :func:`build_trainer`, :class:`Trainer` (``train_step``, ``train``), saving and loading LMs;
* :mod:`.checkpoint` — checkpoint files written so that nothing is lost, verified before use;
* :mod:`.run_folder` — every file a run writes (main process only), the learning curve;
* :mod:`.distributed` — torchrun / DistributedDataParallel;
* :mod:`.init_from` — the model a continued pretraining run starts from;
* :mod:`.perplexity` — held-out perplexity, scores, a unigram baseline;
* :mod:`.start_state` — the fixed start state stored with a window-trained model.
"""
from elmokit.pretraining.config import RESUME_MAY_CHANGE, TrainConfig
from elmokit.pretraining.objective import BidirectionalLM, DirectionalNLL
from elmokit.pretraining.perplexity import evaluate_perplexity, score_sentences, unigram_perplexity
from elmokit.pretraining.trainer import (StepResult, Trainer, TrainingError, build_trainer, latest_checkpoint_step, load_lm,
                      plot_learning_curve, save_lm)

__all__ = ["TrainConfig", "RESUME_MAY_CHANGE", "BidirectionalLM", "DirectionalNLL", "Trainer", "TrainingError",
           "StepResult", "build_trainer", "save_lm", "load_lm", "latest_checkpoint_step", "plot_learning_curve",
           "evaluate_perplexity", "score_sentences", "unigram_perplexity"]
