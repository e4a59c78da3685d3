"""Task metrics: entity F1 per type with ``seqeval`` (NER), accuracy (POS tags, sentence labels) and macro F1.

All scores are fractions in [0, 1] (multiply by 100 for the usual tables). Gold and predicted sequences must line up
one to one (same number of sentences, same length each); a mismatch is an :class:`~elmokit.errors.InputError`
naming the first sentence that differs.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from elmokit.errors import InputError, UsageError, import_optional
from elmokit.tasks.readers import SCHEMES, convert_tags

__all__ = ["entity_scores", "accuracy", "macro_f1"]


def _check_aligned(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(pred):
        raise InputError(f"gold has {len(gold)} sentences, the predictions {len(pred)}: they must line up")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if isinstance(g, str) or isinstance(p, str):
            raise InputError(f"sentence {i}: expected a list of tags, got a string")
        if len(g) != len(p):
            raise InputError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted: they must line up")


def entity_scores(gold: list[list[str]], pred: list[list[str]], scheme: str = "BIO") -> dict:
    """Entity-level (span) precision, recall and F1, overall (micro-averaged) and per entity type, with seqeval.

    Args:
        gold, pred: one tag list per sentence, in ``scheme``; aligned one to one.
        scheme: ``"BIO"`` / ``"IOB1"``: seqeval's default mode, which reads chunks as the CoNLL ``conlleval`` script
            does (a stray ``I-X`` starts an entity); ``"BIOES"``: seqeval's strict mode with the IOBES scheme (an
            entity counts only if it is well formed, B…E or S); ``"BMES"`` is converted to BIOES first.

    Returns:
        ``{"f1", "precision", "recall", "support", "per_type": {type: {"f1", "precision", "recall", "support"}}}``:
        fractions in [0, 1]; ``support`` = the number of gold entities. A type with no gold and no predicted entity
        does not appear; 0/0 scores are 0.

    Raises:
        InputError: gold and predictions do not line up. UsageError: an unknown scheme.

    Source: seqeval (Nakayama 2018) ``classification_report``; conlleval (CoNLL-2000 shared task).
    """
    if scheme not in SCHEMES:
        raise UsageError(f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    _check_aligned(gold, pred)
    metrics = import_optional("seqeval.metrics", "tasks", "span F1 (seqeval)")  # optional: seqeval
    classification_report = metrics.classification_report

    gold = [list(s) for s in gold]
    pred = [list(s) for s in pred]
    kwargs: dict = {}
    if scheme == "BMES":
        gold = [convert_tags(s, "BMES", "BIOES") for s in gold]
        pred = [convert_tags(s, "BMES", "BIOES") for s in pred]
        scheme = "BIOES"
    if scheme == "BIOES":
        from seqeval.scheme import IOBES  # optional: seqeval (present: imported above)

        kwargs = {"mode": "strict", "scheme": IOBES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns when a class has no entity at all; 0 is returned then
        report = classification_report(gold, pred, output_dict=True, zero_division=0, **kwargs)
    overall = report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0})
    per_type = {
        t: {
            "f1": float(v["f1-score"]),
            "precision": float(v["precision"]),
            "recall": float(v["recall"]),
            "support": int(v["support"]),
        }
        for t, v in sorted(report.items())
        if t not in ("micro avg", "macro avg", "weighted avg")
    }
    return {
        "f1": float(overall["f1-score"]),
        "precision": float(overall["precision"]),
        "recall": float(overall["recall"]),
        "support": int(overall["support"]),
        "per_type": per_type,
    }


def _flatten(gold: Sequence, pred: Sequence) -> tuple[list[str], list[str]]:
    """Token lists (one list per sentence) are checked and flattened; a flat list of labels is taken as it is."""
    if len(gold) != len(pred):
        raise InputError(f"gold has {len(gold)} items, the predictions {len(pred)}: they must line up")
    nested = [not isinstance(x, str) and isinstance(x, Sequence) for x in (*gold, *pred)]
    if any(nested):
        if not all(nested):
            raise InputError(
                "mix of labels and lists of labels: give one label per sentence, or one list of tags per sentence"
            )
        _check_aligned(gold, pred)
        return [t for s in gold for t in s], [t for s in pred for t in s]
    return list(gold), list(pred)


def accuracy(gold: Sequence, pred: Sequence) -> float:
    """Fraction of items predicted right: over all tokens when given one tag list per sentence (POS tagging), over
    sentences when given one label per sentence (classification).

    Raises :class:`InputError` when gold and predictions do not line up, or there is nothing to score."""
    g, p = _flatten(gold, pred)
    if not g:
        raise InputError("accuracy of nothing: no gold items")
    return sum(a == b for a, b in zip(g, p)) / len(g)


def macro_f1(gold: Sequence, pred: Sequence) -> float:
    """Unweighted mean over classes of each class's F1 = 2·TP / (2·TP + FP + FN); the classes are those in gold or
    predictions (scikit-learn's ``f1_score(average="macro")``; 0/0 counts 0). Flat labels or tag lists, as
    :func:`accuracy`.

    Raises :class:`InputError` when gold and predictions do not line up, or there is nothing to score."""
    g, p = _flatten(gold, pred)
    if not g:
        raise InputError("macro F1 of nothing: no gold items")
    f1_score = import_optional("sklearn.metrics", "tasks", "macro F1 (scikit-learn)").f1_score  # optional

    return float(f1_score(g, p, average="macro", zero_division=0))
