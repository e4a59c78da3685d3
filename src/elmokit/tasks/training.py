"""Training, evaluating, saving and loading downstream task models (:mod:`elmokit.tasks.models`).

* :class:`TaskData` — a dataset ready for a model: tokens, gold tags/labels with their file:line, the static lookup
  strings, and (frozen biLM) the cached layers;
* :class:`TaskModel` — a tagger or classifier with its label set, config and biLM record: :meth:`TaskModel.predict`,
  :meth:`TaskModel.evaluate`;
* :func:`fit` — Adam, gradient clipping, early stopping on the dev score with patience, the best epoch's weights kept;
  seeded (model initialisation, batch order, dropout) and so repeatable on the CPU;
* :func:`build_from_config` / :func:`train_from_config` — a :class:`~elmokit.tasks.config.TaskConfig` → data, biLM,
  static vectors, cached features, model (what ``elmokit tag train`` runs);
* :func:`save_task_model` / :func:`load_task_model` — a folder with ``model.safetensors`` (the task weights: mixes,
  static table, char CNN, BiLSTM, CRF/output; the frozen biLM's weights are *not* copied) and ``task.json`` (config,
  labels, vocabulary, the biLM's name, file sha256 and weights fingerprint). Loading resolves the recorded biLM (or
  takes one) and refuses a biLM whose weights fingerprint differs.

**Labels never seen in training** (a gold tag or class of a dev/test file that the training file lacks): by default
evaluation raises :class:`~elmokit.errors.DataError` naming ``FILE:LINE`` and the label (``unseen="error"``); with
``unseen="wrong"`` (CLI ``--unseen-labels wrong``) they are kept as gold and counted as errors — the model cannot
predict them, so a token/sentence with such a label is wrong and an entity of an unseen type is a missed entity.

Feature cache: with a frozen biLM the layers of each data file are computed once and stored under
``$ELMOKIT_CACHE/features/<biLM weights fingerprint>/<sentences sha256>.safetensors`` (keys that change with the
weights or the text, so a stale file is never used); float16, (L+1)·D·2 bytes per token.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elmokit import interrupts
from elmokit.data.tokenizers import load_tokenizer, word_tokenizer
from elmokit.elmo import Elmo
from elmokit.errors import CheckpointError, ConfigError, DataError, MissingFileError, TrainingError, UsageError
from elmokit.io import atomic_path, atomic_write_text, file_sha256, folder_lock, lock_folder
from elmokit.modules.bilm import BiLM
from elmokit.tasks.config import TaskConfig, task_config_from_dict
from elmokit.tasks.models import TaskBatch, TokenInputs, SequenceTagger, SentenceClassifier

__all__ = [
    "TaskData", "TaskModel", "fit", "build_from_config", "train_from_config", "save_task_model", "load_task_model",
    "bilm_fingerprint", "describe_bilm", "resolve_bilm", "read_task_file", "aligned_segmenter", "FORMAT_VERSION",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_WEIGHTS, _META = "model.safetensors", "task.json"
_UNSEEN = ("error", "wrong")


# ==================================================================================================== data
@dataclass
class TaskData:
    """N sentences ready for a task model.

    Attributes:
        tokens: N token lists.
        targets: N tag lists (tagging) or N labels (classification), or ``None`` (prediction).
        sources: N ``(file, line)`` pairs (for messages), or ``None``.
        static_tokens: N lists of the strings looked up in the static table (default: the tokens).
        features: the cached biLM layers of these sentences (a :class:`~elmokit.tasks.features.LayerFeatures`), or
            ``None`` (live biLM, or none).
    """

    tokens: list[list[str]]
    targets: list | None = None
    sources: list[tuple[str, int]] | None = None
    static_tokens: list[list[str]] | None = None
    features: Any = None

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_sentences(cls, sentences: Sequence) -> "TaskData":
        """From the readers' :class:`TaggedSentence` / :class:`LabelledSentence` lists (``.tags`` or ``.label``)."""
        tokens = [list(s.tokens) for s in sentences]
        if sentences and hasattr(sentences[0], "tags"):
            targets: list = [list(s.tags) for s in sentences]
        else:
            targets = [s.label for s in sentences]
        return cls(tokens=tokens, targets=targets, sources=[(s.source, s.line) for s in sentences])

    def where(self, i: int) -> str:
        """``FILE:LINE`` of sentence i (or ``sentence i``)."""
        if self.sources is None:
            return f"sentence {i}"
        source, line = self.sources[i]
        return f"{source}:{line}"


def read_task_file(config: TaskConfig, path: str | os.PathLike) -> TaskData:
    """Read a data file with the config's reader (``data.reader``, ``scheme``, ``field``, ``format``).

    Raises:
        MissingFileError / DataError: from the readers (naming ``FILE:LINE``).
    """
    from elmokit.tasks import readers

    d = config.data
    reader = d["reader"]
    enc = d["encoding"]
    if reader == "conll2003":
        sentences = readers.read_conll2003(path, scheme=d["scheme"], encoding=enc)
    elif reader == "conllu":
        sentences = readers.read_conllu(path, field=d["field"], encoding=enc)
    elif reader == "char_ner":
        sentences = readers.read_char_ner(path, scheme=d["scheme"], encoding=enc)
    else:
        sentences = readers.read_labelled(path, format=d["format"], encoding=enc)
    if not sentences:
        raise DataError(f"{path}: no sentences")
    return TaskData.from_sentences(sentences)


def aligned_segmenter(segment: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """Wrap a segmenter so its words re-join to the input exactly: words that match the text in order are kept,
    characters a segmenter dropped or changed become one-character words (the zoo tokeniser cleans some
    characters, e.g. control characters). ``str → list[str]``."""
    def run(text: str) -> list[str]:
        words = [w for w in segment(text) if w]
        out, pos = [], 0
        for w in words:
            found = text.find(w, pos)
            if found < 0:
                continue
            out.extend(text[pos:found])  # characters skipped by the segmenter, one word each
            out.append(w)
            pos = found + len(w)
        out.extend(text[pos:])
        return out

    return run


def _segmenter(name: str) -> Callable[[str], list[str]]:
    """``"elmokit-zh"`` (any zoo model / folder with a tokenizer.json) or ``"jieba"`` → aligned ``str → words``."""
    if name == "jieba":
        return aligned_segmenter(word_tokenizer("jieba"))
    tokenize = load_tokenizer(name)
    return aligned_segmenter(lambda text: [w for sentence in tokenize(text) for w in sentence])


def char_words(char_sentences: Sequence[Sequence[str]], segment: Callable[[str], list[str]]) -> list[list[str]]:
    """For each character of each sentence, the word (of ``segment`` on the joined characters) it belongs to.

    Raises:
        DataError: the words do not re-join to the characters (use :func:`aligned_segmenter`).
    """
    out = []
    for i, chars in enumerate(char_sentences):
        words = segment("".join(chars))
        per_char = [w for w in words for _ in w]
        if "".join(words) != "".join(chars) or len(per_char) != len("".join(chars)):
            raise DataError(f"sentence {i}: the segmenter's words do not re-join to its characters")
        # a "character" token of the data may itself be longer than one code point: map by position
        out_sentence, pos = [], 0
        for c in chars:
            out_sentence.append(per_char[pos])
            pos += len(c)
        out.append(out_sentence)
    return out


# ==================================================================================================== biLM records
def bilm_fingerprint(bilm: BiLM) -> str:
    """sha256 of a biLM's weights: every state-dict tensor's name, dtype, shape and bytes, in name order. Equal for
    the same weights however they were loaded (file, zoo, random seed); used to refuse a task model's other biLM."""
    h = hashlib.sha256()
    for name, tensor in sorted(bilm.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def describe_bilm(spec: str, bilm: BiLM, *, random_like: str | None = None, random_seed: int | None = None) -> dict:
    """The record a task model keeps of its biLM: ``{"model": spec, "name", "file_sha256" (of the folder's
    model.safetensors, as the zoo card lists it; ``None`` for a random or in-memory biLM), "weights_sha256"
    (:func:`bilm_fingerprint`), "random_like", "random_seed"}``."""
    record: dict[str, Any] = {"model": spec, "name": spec, "file_sha256": None,
                              "weights_sha256": bilm_fingerprint(bilm)}
    if spec == "random":
        record.update(name=f"random({random_like}, seed {random_seed})", random_like=random_like,
                      random_seed=random_seed)
    else:
        from elmokit.weights.native import resolve_model_name

        folder = Path(resolve_model_name(spec))
        weights = folder / "model.safetensors"
        if weights.is_file():
            record["file_sha256"] = file_sha256(weights)
            record["name"] = folder.name if folder.name.startswith("elmokit-") else spec
    return record


def resolve_bilm(spec: str, *, random_like: str | None = None, random_seed: int = 0) -> BiLM:
    """A config's ``bilm.model`` → the BiLM (eval mode): a zoo name / model folder, or ``"random"`` (the untrained
    control with ``random_like``'s architecture, :func:`elmokit.tasks.features.random_bilm_like`).

    Raises:
        UsageError / MissingFileError / ConfigError / WeightsError: from the loaders.
    """
    if spec == "random":
        from elmokit.tasks.features import random_bilm_like

        return random_bilm_like(random_like, random_seed).eval()
    from elmokit.weights.native import load_pretrained_bilm

    return load_pretrained_bilm(spec).eval()


# ==================================================================================================== the model
class TaskModel:
    """A task model (tagger or classifier) with everything needed to use it on new text.

    Args:
        kind: ``"tag"`` or ``"classify"``.
        module: the :class:`SequenceTagger` / :class:`SentenceClassifier`.
        labels: the K tag/class strings (index = model output id), from the training data.
        config: the :class:`TaskConfig` it was built from.
        bilm_record: :func:`describe_bilm` of its biLM, or ``None`` without ELMo.

    Attributes:
        history: per-epoch records of :func:`fit`; results: scores recorded at training time.
    """

    def __init__(self, kind: str, module: SequenceTagger | SentenceClassifier, labels: Sequence[str],
                 config: TaskConfig, bilm_record: dict | None = None) -> None:
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
        self._segment: Callable[[str], list[str]] | None = None

    @property
    def inputs(self) -> TokenInputs:
        return self.module.inputs

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def to(self, device: torch.device | str) -> "TaskModel":
        self.module.to(device)
        return self

    # ------------------------------------------------------------------ preparing data
    @property
    def segmenter(self) -> Callable[[str], list[str]] | None:
        """The character → word segmenter (``data.segmenter``), or ``None``."""
        name = self.config.data["segmenter"]
        if name is None:
            return None
        if self._segment is None:
            self._segment = _segmenter(name)
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
            data.features = compute_features(elmo.bilm, data.tokens, segmenter=segment,
                                             segmenter_name=self.config.data["segmenter"],
                                             use_disk=cache and self.config.bilm["cache"],
                                             batch_size=self.config.bilm["batch_size"], progress=progress)
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
                raise DataError(f"{data.where(i)}: label {label!r} was never seen in training (labels: "
                                f"{', '.join(self.labels[:20])}{' …' if len(self.labels) > 20 else ''})") from None

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
        if unseen not in _UNSEEN:
            raise UsageError(f"unseen must be one of {_UNSEEN}, got {unseen!r}")
        if data.targets is None:
            raise UsageError("evaluation needs gold tags/labels")
        count = 0
        for i, gold in enumerate(data.targets):
            for label in ([gold] if self.kind == "classify" else gold):
                if label not in self.label_index:
                    if unseen == "error":
                        raise DataError(f"{data.where(i)}: label {label!r} was never seen in training (the model "
                                        "knows " + ", ".join(self.labels[:20]) + "; use --unseen-labels wrong to "
                                        "count such labels as errors)")
                    count += 1
        return count

    def evaluate(self, data: TaskData, *, unseen: str = "error", batch_size: int = 64) -> dict:
        """Score predictions against gold: ``{"metric", "score" (the metric, 0–100), "sentences", "tokens",
        "unseen_labels"}`` plus, for entity F1, ``precision``, ``recall`` and ``per_type`` (seqeval, via
        :func:`elmokit.tasks.metrics.entity_scores`), and for accuracy ``accuracy``.

        Raises:
            DataError: an unseen label (with ``unseen="error"``), a token/tag count mismatch (``FILE:LINE``).
        """
        from elmokit.tasks import metrics

        unseen_count = self.check_labels(data, unseen)
        if self.kind == "tag":
            for i, (tokens, tags) in enumerate(zip(data.tokens, data.targets)):
                if len(tokens) != len(tags):
                    raise DataError(f"{data.where(i)}: {len(tokens)} tokens but {len(tags)} tags")
        pred = self.predict(data, batch_size=batch_size)
        out: dict[str, Any] = {"metric": self.config.metric, "sentences": len(data),
                               "tokens": sum(len(t) for t in data.tokens), "unseen_labels": unseen_count}
        if self.config.metric == "entity_f1":
            scores = metrics.entity_scores([list(g) for g in data.targets], pred, scheme=self.config.data["scheme"])
            out.update(score=100.0 * scores["f1"], precision=100.0 * scores["precision"],
                       recall=100.0 * scores["recall"], per_type=scores["per_type"])
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


# ==================================================================================================== features
def _sentences_sha(tokens: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256()
    for sentence in tokens:
        h.update("\x1f".join(sentence).encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()


def compute_features(bilm: BiLM, tokens: Sequence[Sequence[str]], *, segmenter=None, segmenter_name: str | None = None,
                     use_disk: bool = True, batch_size: int = 64, progress: bool | str = False):
    """The frozen biLM's layers for ``tokens`` (:class:`~elmokit.tasks.features.LayerFeatures`), from or into the
    disk cache ``$ELMOKIT_CACHE/features/<weights fingerprint[:16]>/<what>-<sentences sha256[:24]>.safetensors``
    when ``use_disk``; with ``segmenter`` each character gets its word's vectors
    (:func:`~elmokit.tasks.features.char_features_from_words`). ``progress``: a tqdm bar over the sentences while
    they are computed (a string labels it)."""
    from elmokit.tasks import features as feats
    from elmokit.weights.native import cache_dir

    path = None
    if use_disk:
        kind = "words" if segmenter is None else f"chars-{segmenter_name}".replace("/", "_")
        path = (cache_dir() / "features" / bilm_fingerprint(bilm)[:16]
                / f"{kind}-{_sentences_sha(tokens)[:24]}.safetensors")
    tokens = [list(t) for t in tokens]
    if segmenter is None:
        return feats.compute_layer_features(bilm, tokens, batch_size=batch_size, cache_path=path, progress=progress)
    return feats.char_features_from_words(bilm, tokens, segmenter, batch_size=batch_size, cache_path=path,
                                          progress=progress)


# ==================================================================================================== training
def _batches(n: int, batch_size: int, rng: random.Random, lengths: Sequence[int]) -> list[list[int]]:
    """Shuffled batches of similar lengths: shuffle, sort within pools of 20 batches by length, shuffle the
    batches (less padding than plain random batches, still a random order each epoch)."""
    order = list(range(n))
    rng.shuffle(order)
    pool = batch_size * 20
    batches = []
    for start in range(0, n, pool):
        part = sorted(order[start : start + pool], key=lambda i: lengths[i])
        batches.extend(part[k : k + batch_size] for k in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def fit(model: TaskModel, train: TaskData, dev: TaskData, *, epochs: int = 5, patience: int = 2, lr: float = 1e-3,
        batch_size: int = 32, clip: float = 5.0, l2: float = 0.001, seed: int = 0, max_steps: int | None = None,
        unseen: str = "error", log: Callable[[str], None] | None = None) -> list[dict]:
    """Train ``model`` on ``train`` with early stopping on the dev score; the best epoch's weights are restored.

    Adam on the trainable parameters (the frozen biLM is not among them), loss = task loss + λ·Σ s² over the ELMo
    mixes (``l2``), gradients clipped to ``clip`` (total norm), one dev evaluation per epoch; training stops after
    ``patience`` epochs without a better dev score. Batch order and dropout come from ``seed``
    (``torch.manual_seed`` and a ``random.Random``), so a CPU run repeats exactly.

    Returns the history: per epoch ``{"epoch", "steps", "train_loss" (mean), "dev" (score), "seconds"}``; also set
    on ``model.history``, with ``model.results["best_epoch"]`` and ``["dev"]``.

    Raises:
        DataError: a training or dev label problem (naming ``FILE:LINE``).
        TrainingError: the loss became NaN or infinite.
        KeyboardInterrupt: Ctrl-C/SIGTERM (checked between steps).
    """

    say = log or logger.info
    torch.manual_seed(seed)
    rng = random.Random(seed)
    module = model.module
    device = model.device
    params = [p for p in module.parameters() if p.requires_grad]
    optimiser = torch.optim.Adam(params, lr=lr)
    model.check_labels(dev, unseen)
    lengths = [len(t) for t in train.tokens]
    best_score, best_state, best_epoch, bad = -math.inf, None, 0, 0
    history: list[dict] = []
    steps = 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        module.train()
        losses = []
        for indices in _batches(len(train), batch_size, rng, lengths):
            interrupts.check()
            batch = model.batch(train, indices, targets=True).to(device)
            loss = module.loss(batch) + module.inputs.l2_penalty(l2).to(device)
            if not torch.isfinite(loss):
                raise TrainingError(f"epoch {epoch}, step {steps + 1}: the loss is {float(loss)} (lower train.lr, "
                                    f"now {lr})")
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            optimiser.step()
            losses.append(float(loss.detach()))
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        dev_score = model.evaluate(dev, unseen=unseen)["score"]
        record = {"epoch": epoch, "steps": steps, "train_loss": sum(losses) / max(len(losses), 1),
                  "first_loss": losses[0] if losses else None, "dev": dev_score,
                  "seconds": round(time.perf_counter() - start, 2)}
        history.append(record)
        say(f"epoch {epoch}: train loss {record['train_loss']:.4f}, dev {model.config.metric} {dev_score:.2f} "
            f"({record['seconds']:.1f} s)")
        if dev_score > best_score:
            best_score, best_epoch, bad = dev_score, epoch, 0
            best_state = copy.deepcopy(_full_task_state(module))
        else:
            bad += 1
            if bad >= patience:
                say(f"early stop: no better dev score for {patience} epoch(s); best epoch {best_epoch}")
                break
        if max_steps is not None and steps >= max_steps:
            break
    if best_state is not None:
        _load_task_state(module, best_state)
    model.history = history
    model.results.update(best_epoch=best_epoch, dev=best_score, steps=steps)
    return history


def _non_input_state(module) -> dict:
    return {k: v for k, v in module.state_dict().items() if not k.startswith("inputs.")}


def _full_task_state(module) -> dict[str, torch.Tensor]:
    """The module's state dict without the frozen biLM: ``inputs.*`` from :meth:`TokenInputs.task_state_dict`."""
    state = {f"inputs.{k}": v for k, v in module.inputs.task_state_dict().items()}
    state.update(_non_input_state(module))
    return state


def _load_task_state(module, state: dict) -> None:
    """Load a :func:`_full_task_state` (every key but the frozen biLM's must be there)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("inputs.elmo._elmo_lstm.")]
    if missing or unexpected:
        raise CheckpointError(f"task weights do not fit the model: missing {missing[:5]}, unexpected "
                              f"{unexpected[:5]}")


# ==================================================================================================== from a config
def _build_module(config: TaskConfig, n_labels: int, vocab, static_table, elmo) -> SequenceTagger | SentenceClassifier:
    cc = config.char_cnn
    char_cnn = ({"embedding_dim": cc["embedding_dim"], "filters": cc["filters"],
                 "max_characters": cc["max_characters"]} if cc["enabled"] else None)
    inputs = TokenInputs(vocab, static_table, static_trainable=config.static["trainable"], char_cnn=char_cnn,
                         elmo=elmo, elmo_at_output=config.bilm["at_output"])
    m = config.model
    if config.task == "tag":
        return SequenceTagger(inputs, n_labels, hidden=m["hidden"], layers=m["layers"], dropout=m["dropout"])
    return SentenceClassifier(inputs, n_labels, hidden=m["hidden"], layers=m["layers"], dropout=m["dropout"],
                              pooling=m["pooling"])


def _make_elmo(config: TaskConfig, bilm: BiLM | None) -> Elmo | None:
    if bilm is None:
        return None
    b = config.bilm
    return Elmo(bilm=bilm, num_output_representations=2 if b["at_output"] else 1, requires_grad=b["fine_tune"],
                do_layer_norm=b["do_layer_norm"], dropout=b["dropout"], layer_norm_mask="tokens")


def build_from_config(config: TaskConfig, *, bilm: BiLM | None = None, seed: int | None = None,
                      log: Callable[[str], None] | None = None, reuse: dict | None = None, progress: bool = False,
                      ) -> tuple[TaskModel, dict[str, TaskData]]:
    """Read the data, load the biLM (or use ``bilm``) and the static vectors, compute (or load) the cached layers,
    and build the untrained model.

    Args:
        config: the task config.
        bilm: a biLM to use instead of ``bilm.model`` (for tests or a model already loaded), recorded under the
            config's name.
        seed: the model-initialisation seed (default ``train.seed``).
        reuse: a dict (empty at first) that keeps the data, biLM, static table and cached layers of this config for
            the next call with the same config (another seed: only the model is built anew).
        progress: a tqdm bar per data file while its biLM layers are computed (``elmokit tag|classify train`` shows
            them; minutes for CoNLL-2003 on 2 cores).

    Returns ``(model, {"train", "dev"[, "test"]: TaskData})``.

    Raises:
        MissingFileError / DataError: data files; UsageError / WeightsError: the biLM or vectors; ConfigError.
    """
    from elmokit.tasks import static as static_mod

    say = log or logger.info
    if reuse:
        torch.manual_seed(config.train["seed"] if seed is None else seed)
        module = _build_module(config, len(reuse["labels"]), reuse["vocab"], reuse["table"],
                               _make_elmo(config, reuse["bilm"]))
        model = TaskModel(config.task, module, reuse["labels"], config, reuse["record"])
        model._segment = reuse["segment"]
        return model, reuse["data"]
    d = config.data
    data = {"train": read_task_file(config, d["train"]), "dev": read_task_file(config, d["dev"])}
    if d["test"] is not None:
        data["test"] = read_task_file(config, d["test"])
    if d["max_train_sentences"]:
        t = data["train"]
        n = d["max_train_sentences"]
        data["train"] = TaskData(t.tokens[:n], t.targets[:n], t.sources[:n])
    train_targets = data["train"].targets
    labels = sorted({t for tags in train_targets for t in tags} if config.task == "tag" else set(train_targets))
    b = config.bilm
    record = None
    if config.uses_elmo:
        if bilm is None:
            say(f"loading biLM {b['model']}")
            bilm = resolve_bilm(b["model"], random_like=b["random_like"], random_seed=b["random_seed"])
        record = describe_bilm(b["model"], bilm, random_like=b["random_like"], random_seed=b["random_seed"])
    else:
        bilm = None
    elmo = _make_elmo(config, bilm)
    # static vectors: the training words, plus the dev/test words the pretrained vectors know (frozen vectors are
    # looked up, not learned, so no label is used); a random table covers the training words only
    s = config.static
    vocab = table = None
    segment = _segmenter(d["segmenter"]) if d["segmenter"] is not None else None
    if segment is not None:
        for part in data.values():
            part.static_tokens = char_words(part.tokens, segment)
    if s["vectors"] != "none":
        def words(part):
            return part.static_tokens if part.static_tokens is not None else part.tokens

        if s["vectors"] == "random":
            vocab = static_mod.build_vocab(words(data["train"]))
            vectors = static_mod.StaticVectors.random(vocab, s["dim"], s["seed"])
        else:
            vectors = static_mod.StaticVectors.load(s["vectors"])
            vocab = static_mod.build_vocab([w for part in data.values() for w in words(part)])
        table = vectors.matrix_for(vocab)
        say(f"static vectors {s['vectors']}: {len(vocab)} words, dim {table.shape[1]}, coverage "
            f"{100 * vectors.coverage(vocab):.1f} %")
    torch.manual_seed(config.train["seed"] if seed is None else seed)
    module = _build_module(config, len(labels), vocab, table, elmo)
    model = TaskModel(config.task, module, labels, config, record)
    model._segment = segment
    if elmo is not None and not b["fine_tune"]:
        for name, part in data.items():
            start = time.perf_counter()
            model.prepare(part, cache=True, progress=f"biLM layers of {name}" if progress else False)
            say(f"biLM layers of {name} ({len(part)} sentences): {time.perf_counter() - start:.1f} s")
    if reuse is not None:
        reuse.update(labels=labels, vocab=vocab, table=table, bilm=bilm, record=record, segment=segment, data=data)
    return model, data


def train_from_config(config: TaskConfig, *, out_dir: str | os.PathLike | None = None, seed: int | None = None,
                      bilm: BiLM | None = None, device: str | torch.device = "cpu", max_steps: int | None = None,
                      log: Callable[[str], None] | None = None, unseen: str = "error",
                      reuse: dict | None = None, progress: bool = False) -> TaskModel:
    """Build, train (:func:`fit`), evaluate on dev and test, and (with ``out_dir``) save a model from a config.
    ``seed`` overrides ``train.seed`` (initialisation, batch order, dropout); ``reuse`` and ``progress`` as
    :func:`build_from_config` (several seeds of one config; progress bars while the biLM layers are computed).

    ``model.results`` then holds ``{"dev": {...}, "test": {...}, "best_epoch", "train_seconds", "seed",
    "mix_weights"}`` (scores from :meth:`TaskModel.evaluate`).

    With ``out_dir``, the folder's writer lock is held from the start (:func:`elmokit.io.lock_folder`): a second
    training run into the same folder is refused (:class:`~elmokit.errors.FolderInUseError`) instead of replacing this
    one's model under it.
    """
    lock = lock_folder(out_dir, "task model folder (--out)") if out_dir is not None else None
    try:
        if seed is not None:
            config = config.override({"train.seed": seed})
        t = config.train
        model, data = build_from_config(config, bilm=bilm, log=log, reuse=reuse, progress=progress)
        model.to(device)
        start = time.perf_counter()
        fit(model, data["train"], data["dev"], epochs=t["epochs"], patience=t["patience"], lr=t["lr"],
            batch_size=t["batch_size"], clip=t["clip"], l2=config.bilm["l2"], seed=t["seed"], max_steps=max_steps,
            unseen=unseen, log=log)
        train_seconds = time.perf_counter() - start
        results = {"best_epoch": model.results.get("best_epoch"), "steps": model.results.get("steps"),
                   "train_seconds": round(train_seconds, 2), "seed": t["seed"], "mix_weights": model.mix_weights()}
        for name in ("dev", "test"):
            if name in data:
                results[name] = model.evaluate(data[name], unseen=unseen)
        model.results = results
        if out_dir is not None:
            save_task_model(model, out_dir)
        return model
    finally:
        if lock is not None:
            lock.release()


# ==================================================================================================== save / load
def save_task_model(model: TaskModel, out_dir: str | os.PathLike) -> Path:
    """Write ``out_dir/model.safetensors`` (task weights, not the frozen biLM's) and ``out_dir/task.json`` (format
    version, kind, config, labels, vocabulary, biLM record, history, results), each atomically; returns the folder.

    Raises:
        UsageError: ``out_dir`` is a file.
        FolderInUseError: another process is writing ``out_dir``.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output {out} is a file: give a folder for the task model")
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in _full_task_state(model.module).items()}
    inputs = model.inputs
    meta = {
        "format": "elmokit-task-model", "format_version": FORMAT_VERSION, "kind": model.kind,
        "config": model.config.to_dict(), "labels": model.labels, "vocab": inputs.vocab,
        "static_dim": inputs.static.embedding_dim if inputs.static is not None else None,
        "bilm": model.bilm_record, "history": model.history, "results": model.results,
    }
    with folder_lock(out, "task model folder"):  # one writer: the two files come from the same model
        with atomic_path(out / _WEIGHTS, suffix=".safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": "elmokit-task-model"})
        atomic_write_text(out / _META, json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    return out


def load_task_model(model_dir: str | os.PathLike, *, bilm: BiLM | None = None,
                    device: str | torch.device = "cpu") -> TaskModel:
    """Load a folder written by :func:`save_task_model`.

    Args:
        bilm: the biLM to use; default: the recorded one (zoo name / folder, or the random control rebuilt from its
            seed). Either way its weights fingerprint must equal the recorded one.

    Raises:
        MissingFileError: no folder, or no ``task.json`` / ``model.safetensors`` in it.
        CheckpointError: unreadable or inconsistent files, or **a biLM other than the one the model was trained
            with** (the message names both).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(model_dir)
    if not folder.is_dir():
        raise MissingFileError(f"task model folder {folder}: no such folder")
    for name in (_META, _WEIGHTS):
        if not (folder / name).is_file():
            raise MissingFileError(f"{folder / name}: missing (a task model folder holds {_META} and {_WEIGHTS}, "
                                   "written by `elmokit tag/classify train`)")
    try:
        meta = json.loads((folder / _META).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{folder / _META}: not a task model description ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "elmokit-task-model":
        raise CheckpointError(f"{folder / _META}: not an elmokit task model (no format: elmokit-task-model)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{folder / _META}: format_version {meta.get('format_version')!r}, this elmokit reads "
                              f"{FORMAT_VERSION}")
    try:
        config = task_config_from_dict(meta["config"], source=str(folder / _META))
        labels, vocab, record = list(meta["labels"]), meta.get("vocab"), meta.get("bilm")
    except (KeyError, TypeError, ConfigError) as exc:
        raise CheckpointError(f"{folder / _META}: damaged ({exc})") from None
    try:
        state = load_file(str(folder / _WEIGHTS))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise CheckpointError(f"{folder / _WEIGHTS}: unreadable ({exc})") from None
    if config.uses_elmo:
        if record is None:
            raise CheckpointError(f"{folder / _META}: the config uses a biLM but no biLM is recorded")
        given = bilm is not None
        if bilm is None:
            bilm = resolve_bilm(record["model"], random_like=record.get("random_like"),
                                random_seed=record.get("random_seed") or 0)
        fingerprint = bilm_fingerprint(bilm)
        if fingerprint != record["weights_sha256"]:
            what = "the biLM given" if given else f"the biLM {record['model']!r} found now"
            raise CheckpointError(
                f"{folder}: this task model was trained with the biLM {record['name']!r} (weights sha256 "
                f"{record['weights_sha256'][:16]}…), but {what} has weights sha256 {fingerprint[:16]}…: a task model's "
                "layer mix only fits its own biLM; use that biLM (or retrain)")
    elif bilm is not None:
        raise UsageError(f"{folder}: this task model uses no biLM; do not pass one")
    table = None
    if vocab is not None:
        key = "inputs.static.weight"
        if key not in state:
            raise CheckpointError(f"{folder / _WEIGHTS}: no {key} for the vocabulary in {_META}")
        table = torch.zeros_like(state[key])
    module = _build_module(config, len(labels), vocab, table, _make_elmo(config, bilm))
    _load_task_state(module, state)
    model = TaskModel(config.task, module, labels, config, record)
    model.history = meta.get("history") or []
    model.results = meta.get("results") or {}
    return model.to(device)
