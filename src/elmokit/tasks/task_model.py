"""The task model: a tagger or classifier (:mod:`elmokit.tasks.models`) with its label set, config and biLM record —
preparing data for it, batching, prediction and evaluation (:class:`TaskModel`), and its task weights without the
frozen biLM (:func:`task_state` / :func:`load_task_state`).

**Labels never seen in training** (a gold tag or class of a dev/test file that the training file lacks): by default
evaluation raises :class:`~elmokit.errors.DataError` naming ``FILE:LINE`` and the label (``unseen="error"``); with
``unseen="wrong"`` (CLI ``--unseen-labels wrong``) they are kept as gold and counted as errors — the model cannot
predict them, so a token/sentence with such a label is wrong and an entity of an unseen type is a missed entity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from elmokit import interrupts
from elmokit.errors import CheckpointError, DataError, UsageError
from elmokit.tasks import metrics
from elmokit.tasks.config import TaskConfig
from elmokit.tasks.datasets import TaskData, char_words, segmenter_for
from elmokit.tasks.frozen_bilm import compute_features
from elmokit.tasks.models import SentenceClassifier, SequenceTagger, TaskBatch, TokenInputs

__all__ = ["TaskModel", "task_state", "load_task_state", "UNSEEN_MODES"]

#: The values of ``unseen`` (:meth:`TaskModel.check_labels`).
UNSEEN_MODES = ("error", "wrong")


class TaskModel:
    """A task model (tagger or classifier) with everything needed to use it on new text.

    Args:
        kind: ``"tag"`` or ``"classify"``.
        module: the :class:`SequenceTagger` / :class:`SentenceClassifier`.
        labels: the K tag/class strings (index = model output id), from the training data.
        config: the :class:`TaskConfig` it was built from.
        bilm_record: :func:`~elmokit.tasks.frozen_bilm.describe_bilm` of its biLM, or ``None`` without ELMo.
        segmenter: the character → word segmenter of ``data.segmenter`` when the caller already has one (default:
            made on first use, :func:`~elmokit.tasks.datasets.segmenter_for`).

    Attributes:
        history: per-epoch records of :func:`fit`; results: scores recorded at training time.
    """

    def __init__(
        self,
        kind: str,
        module: SequenceTagger | SentenceClassifier,
        labels: Sequence[str],
        config: TaskConfig,
        bilm_record: dict | None = None,
        *,
        segmenter: Callable[[str], list[str]] | None = None,
    ) -> None:
        if kind not in ("tag", "classify"):
            raise UsageError(f"kind must be 'tag' or 'classify', got {kind!r}")
        self.kind = kind
        self.module = module
        self.labels = list(labels)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.config = config
        self.bilm_record = bilm_record
        self.history: list[dict] = []
        self.results: dict = {}
        self._segment = segmenter

    @property
    def inputs(self) -> TokenInputs:
        return self.module.inputs

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def to(self, device: torch.device | str) -> TaskModel:
        self.module.to(device)
        return self

    # ------------------------------------------------------------------ preparing data
    @property
    def segmenter(self) -> Callable[[str], list[str]] | None:
        """The character → word segmenter (``data.segmenter``), or ``None``."""
        name = self.config.data.segmenter
        if name is None:
            return None
        if self._segment is None:
            self._segment = segmenter_for(name)
        return self._segment

    def prepare(self, data: TaskData, *, cache: bool = False, progress: bool | str = False) -> TaskData:
        """Fill in what the model needs beyond tokens: the static lookup strings of character-tagged data (each
        character's word) and, where the biLM cannot run live on the tokens (characters given their word's
        vectors) or ``cache`` is asked for, the precomputed layers (``progress``: a tqdm bar while they are computed;
        a string labels it). Returns ``data`` (changed in place)."""
        segment = self.segmenter
        if segment is not None and data.static_tokens is None:
            data.static_tokens = char_words(data.tokens, segment)
        elmo = self.inputs.elmo
        if elmo is not None and data.features is None and (segment is not None or cache):
            data.features = compute_features(
                elmo.bilm,
                data.tokens,
                segmenter=segment,
                segmenter_name=self.config.data.segmenter,
                use_disk=cache and self.config.bilm.cache,
                batch_size=self.config.bilm.batch_size,
                progress=progress,
            )
        return data

    def batch(self, data: TaskData, indices: Sequence[int], *, targets: bool = False) -> TaskBatch:
        """The :class:`TaskBatch` of sentences ``indices`` of ``data`` (with target ids when ``targets``)."""
        tokens = [data.tokens[i] for i in indices]
        static = [data.static_tokens[i] for i in indices] if data.static_tokens is not None else None
        layers = mask = None
        if data.features is not None and self.inputs.elmo is not None:
            layers, mask = data.features.batch(list(indices))
        batch = self.inputs.encode(tokens, static_tokens=static, layers=layers, layer_mask=mask)
        if targets:
            batch.targets = self._target_ids(data, indices, batch.mask.shape[1])
        return batch

    def _target_ids(self, data: TaskData, indices: Sequence[int], t: int) -> torch.Tensor:
        index = self.label_index

        def lookup(label: str, i: int) -> int:
            try:
                return index[label]
            except KeyError:
                raise DataError(
                    f"{data.where(i)}: label {label!r} was never seen in training (labels: "
                    f"{', '.join(self.labels[:20])}{' …' if len(self.labels) > 20 else ''})"
                ) from None

        if self.kind == "classify":
            return torch.tensor([lookup(data.targets[i], i) for i in indices], dtype=torch.long)
        out = torch.zeros(len(indices), t, dtype=torch.long)
        for row, i in enumerate(indices):
            tags = data.targets[i]
            if len(tags) != len(data.tokens[i]):
                raise DataError(f"{data.where(i)}: {len(data.tokens[i])} tokens but {len(tags)} tags")
            out[row, : len(tags)] = torch.tensor([lookup(tag, i) for tag in tags], dtype=torch.long)
        return out

    # ------------------------------------------------------------------ prediction and evaluation
    def predict_ids(self, data: TaskData, *, batch_size: int = 64) -> list:
        """Model output ids per sentence, in ``data`` order (length-sorted batches inside)."""
        self.prepare(data)
        self.module.eval()
        order = sorted(range(len(data)), key=lambda i: len(data.tokens[i]))
        out: list = [None] * len(data)
        device = self.device
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                interrupts.check()
                chunk = order[start : start + batch_size]
                ids = self.module.decode(self.batch(data, chunk).to(device))
                for i, pred in zip(chunk, ids):
                    out[i] = pred
        return out

    def predict(self, data: TaskData | Sequence[Sequence[str]], *, batch_size: int = 64) -> list:
        """Tags (B lists of strings, one per token) or class labels (B strings) for tokenised sentences.

        Raises:
            InputError: an empty sentence or a blank token (naming the sentence).
        """
        if not isinstance(data, TaskData):
            data = TaskData(tokens=[list(s) for s in data])
        ids = self.predict_ids(data, batch_size=batch_size)
        if self.kind == "classify":
            return [self.labels[i] for i in ids]
        return [[self.labels[i] for i in seq] for seq in ids]

    def check_labels(self, data: TaskData, unseen: str = "error") -> int:
        """Count the gold labels of ``data`` that training never saw; raise on the first with ``unseen="error"``.

        Raises:
            DataError: ``FILE:LINE: label 'X' was never seen in training`` (``unseen="error"``).
            UsageError: ``unseen`` not ``"error"``/``"wrong"``; ``data`` without gold labels.
        """
        if unseen not in UNSEEN_MODES:
            raise UsageError(f"unseen must be one of {UNSEEN_MODES}, got {unseen!r}")
        if data.targets is None:
            raise UsageError("evaluation needs gold tags/labels")
        count = 0
        for i, gold in enumerate(data.targets):
            for label in [gold] if self.kind == "classify" else gold:
                if label not in self.label_index:
                    if unseen == "error":
                        raise DataError(
                            f"{data.where(i)}: label {label!r} was never seen in training (the model "
                            "knows " + ", ".join(self.labels[:20]) + "; use --unseen-labels wrong to "
                            "count such labels as errors)"
                        )
                    count += 1
        return count

    def evaluate(self, data: TaskData, *, unseen: str = "error", batch_size: int = 64) -> dict:
        """Score predictions against gold: ``{"metric", "score" (the metric, 0–100), "sentences", "tokens",
        "unseen_labels"}`` plus, for entity F1, ``precision``, ``recall`` and ``per_type`` (seqeval, via
        :func:`elmokit.tasks.metrics.entity_scores`), and for accuracy ``accuracy``.

        Raises:
            DataError: an unseen label (with ``unseen="error"``), a token/tag count mismatch (``FILE:LINE``).
        """
        unseen_count = self.check_labels(data, unseen)
        if self.kind == "tag":
            for i, (tokens, tags) in enumerate(zip(data.tokens, data.targets)):
                if len(tokens) != len(tags):
                    raise DataError(f"{data.where(i)}: {len(tokens)} tokens but {len(tags)} tags")
        pred = self.predict(data, batch_size=batch_size)
        out: dict[str, Any] = {
            "metric": self.config.metric,
            "sentences": len(data),
            "tokens": sum(len(t) for t in data.tokens),
            "unseen_labels": unseen_count,
        }
        if self.config.metric == "entity_f1":
            scores = metrics.entity_scores([list(g) for g in data.targets], pred, scheme=self.config.data.scheme)
            out.update(
                score=100.0 * scores["f1"],
                precision=100.0 * scores["precision"],
                recall=100.0 * scores["recall"],
                per_type=scores["per_type"],
            )
        else:
            if self.kind == "tag":
                gold_flat = [t for g in data.targets for t in g]
                pred_flat = [t for p in pred for t in p]
            else:
                gold_flat, pred_flat = list(data.targets), pred
            acc = metrics.accuracy(gold_flat, pred_flat)
            out.update(score=100.0 * acc, accuracy=100.0 * acc)
        return out

    def mix_weights(self) -> list[dict]:
        """Per ELMo mix: softmax(s) and γ (see :meth:`TokenInputs.mix_weights`)."""
        return self.inputs.mix_weights()


def task_state(module: SequenceTagger | SentenceClassifier) -> dict[str, torch.Tensor]:
    """The module's state dict without the frozen biLM: ``inputs.*`` from :meth:`TokenInputs.task_state_dict`, the
    rest (BiLSTM, CRF / output layer) as ``module.state_dict()`` has them. The tensors are the module's own (not
    copies)."""
    state = {f"inputs.{k}": v for k, v in module.inputs.task_state_dict().items()}
    state.update({k: v for k, v in module.state_dict().items() if not k.startswith("inputs.")})
    return state


def load_task_state(module: SequenceTagger | SentenceClassifier, state: dict) -> None:
    """Load a :func:`task_state` (every key but the frozen biLM's must be there).

    Raises:
        CheckpointError: keys missing or left over (the first five of each named).
    """
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("inputs.elmo._elmo_lstm.")]
    if missing or unexpected:
        raise CheckpointError(f"task weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
