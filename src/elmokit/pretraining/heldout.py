"""The held-out curve of a training run: full-softmax perplexity of the held-out sentences, the model's start state it
is read from, and the best model so far kept in ``best/``.

:class:`HeldoutMixin` holds :class:`~elmokit.pretraining.trainer.Trainer`'s evaluation methods. Evaluations do not
touch the training's randomness, so they do not change what is trained.
"""

from __future__ import annotations

import logging
from typing import Any

from elmokit.data.corpus import TextCorpus
from elmokit.pretraining.lm_files import save_lm
from elmokit.pretraining.perplexity import perplexities, perplexity_sums
from elmokit.pretraining.start_state import describe, mean_start_state

__all__ = ["VALID_BATCH_SENTENCES", "HeldoutMixin"]

logger = logging.getLogger(__name__)

#: Sentences per forward pass of the held-out evaluation (the result does not depend on it).
VALID_BATCH_SENTENCES = 32


class HeldoutMixin:
    """:class:`~elmokit.pretraining.trainer.Trainer`'s held-out evaluation.

    Uses the trainer's ``config``, ``dist``, ``lm``, ``valid``, ``step``, ``best``, ``run`` and its clock
    (``_now``); sets ``_last_valid_step`` and ``_last_valid_time``.
    """

    def evaluate_heldout(self) -> dict[str, float]:
        """Full-softmax perplexity of the held-out sentences (each from the model's start state — zeros, or for a
        window-trained run the one :meth:`refresh_start_state` gives —, eval mode; see
        :func:`elmokit.pretraining.perplexity.evaluate_perplexity`): ``{"forward", "backward", "average", "tokens",
        "sentences"}``. Collective: each process scores its share and the sums are added up."""
        was_training = self.lm.training
        mine = (self.valid or [])[self.dist.rank :: self.dist.world_size]
        try:
            sums = perplexity_sums(self.lm, mine, VALID_BATCH_SENTENCES) if mine else (0.0, 0.0, 0, 0)
        finally:
            self.lm.train(was_training)
        total_f, total_b, n_tok, n_sent = self.dist.all_reduce(list(sums))
        return perplexities(total_f, total_b, int(n_tok), int(n_sent))

    def refresh_start_state(self) -> None:
        """Give the model the start state it is read from (:attr:`elmokit.modules.bilm.BiLM.start_state`), for the
        current weights: a window-trained run (``batching="windows"``) gets the mean carried state at sentence starts
        over the first :data:`~elmokit.pretraining.start_state.START_STATE_SENTENCES` sentences of its training files
        in file order (:func:`~elmokit.pretraining.start_state.mean_start_state`: deterministic, no randomness drawn);
        a sentence-trained run keeps zeros (none stored). Why: ``experiments/results/initial-state.md``. Called before
        each held-out evaluation and before the model is saved, on every process (each computes the same state). The
        training steps do not use it (windows carry their own state from zeros)."""
        if self.config.batching != "windows" or self._start_state_step == self.step:
            return
        corpus = TextCorpus(list(self.config.train_files), errors=self.config.decode_errors)
        state, samples = mean_start_state(self.lm, corpus.sentences(0))
        if state is None and self.dist.is_main:
            logger.warning(
                "batching='windows' but the training text has too few sentences for a start state "
                "(%d sentence start(s) seen after the first of a stream): the model is read from zeros",
                samples,
            )
        self.lm.bilm.set_start_state(state, describe(samples))
        self._start_state_step = self.step

    def _validate(self) -> dict[str, Any]:
        """Evaluate, log the held-out record, and keep the model in best/ when it is the best so far."""
        self.dist.agree(self.refresh_start_state)
        ppl = self.evaluate_heldout()
        better = self.best is None or ppl["average"] < self.best["valid_ppl"]
        record = {
            "kind": "valid",
            "step": self.step,
            "valid_ppl_fwd": ppl["forward"],
            "valid_ppl_bwd": ppl["backward"],
            "valid_ppl": ppl["average"],
            "valid_tokens": ppl["tokens"],
            "valid_sentences": ppl["sentences"],
            "best": bool(better),
        }
        if better:
            self.best = {**record, "valid_files": list(self.config.valid_files or [])}
            self.dist.on_main(lambda: self.run.save_best(lambda folder: save_lm(self.lm, folder), self.best))
        self.run.log(record)
        self._last_valid_step = self.step
        self._last_valid_time = self._now()
        logger.info(
            "held-out perplexity at step %d: forward %.2f, backward %.2f, average %.2f%s",
            self.step,
            ppl["forward"],
            ppl["backward"],
            ppl["average"],
            " (best so far)" if better else "",
        )
        return record
