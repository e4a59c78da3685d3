"""Sense separation: sense-labelled occurrences of a word, and how well contextual vectors separate the senses.

Protocol (issue 10, item 5): a **labelled memory** (train) and **queries** (test) of occurrences labelled by sense;
each query gets the sense of

* **1-NN**: the memory occurrence with the highest cosine similarity;
* **nearest centroid**: the sense whose centroid — the plain mean of its memory vectors — has the highest cosine
  (the "1NN" of Loureiro et al. (2021), whose sense vectors are means of BERT token vectors, compared by cosine);

ties go to the sense most frequent in memory, so a representation giving every occurrence the same vector (a static
word vector, the biLM's layer 0 for a one-token word) predicts exactly the most frequent sense;

scored by **accuracy** and **macro-F1** (the unweighted mean over the word's senses of per-sense F1; a sense never
predicted and never true in the queries counts as 0 when it is one of the word's senses — as scikit-learn's
``f1_score(average="macro", labels=senses, zero_division=0)``). The classes are often very unbalanced, which is why
macro-F1 matters: predicting the most frequent sense (**MFS**, from the memory) can have high accuracy but a
macro-F1 of about 1/(number of senses) × its F1.

Baselines beside the biLM layers:

* **MFS** (:func:`mfs_scores`).
* **static**: a single static vector per word can only ever give every occurrence the same answer, so the static
  baseline that *can* separate senses averages the word2vec vectors of the words in a window around the occurrence
  (:func:`static_context_vectors`; word2vec trained on the biLM's own text, ``$ELMOKIT_CACHE/zoo/<model>/word2vec``).
  Its settings (window, whether the target itself is included) are chosen by cross-validation on the memory only
  (:func:`choose_static_settings`), never on the queries.

Data readers: :func:`read_coarsewsd` (CoarseWSD-20, Loureiro et al., 2021) and :func:`build_apple_set` (苹果 in the
online_shopping_10_cats reviews: 水果 = the fruit; 平板, 计算机, 手机 = Apple, the company); :func:`group_split` is
the seeded, stratified split where one review never feeds both the memory and the queries. They live in
:mod:`elmokit.analysis.sense_data` (importable from here too).
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from elmokit.analysis.occurrences import Occurrence, occurrence_vectors
from elmokit.analysis.sense_data import (
    APPLE_CATEGORIES,
    CASINGS,
    AppleSet,
    SenseExample,
    build_apple_set,
    coarsewsd_senses,
    coarsewsd_words,
    group_split,
    read_coarsewsd,
    read_coarsewsd_baselines,
    recase,
    truecase_table,
)
from elmokit.errors import DataError, InputError, UsageError, import_optional
from elmokit.io import atomic_path

__all__ = [
    "SenseExample",
    "CASINGS",
    "read_coarsewsd",
    "coarsewsd_words",
    "coarsewsd_senses",
    "read_coarsewsd_baselines",
    "APPLE_CATEGORIES",
    "AppleSet",
    "build_apple_set",
    "group_split",
    "recase",
    "truecase_table",
    "nn1_predict",
    "centroid_predict",
    "accuracy",
    "macro_f1",
    "scores",
    "mfs_scores",
    "layer_scores",
    "static_context_vectors",
    "STATIC_GRID",
    "choose_static_settings",
    "cv_folds",
    "cv_score",
    "folds_macro_f1",
    "example_vectors",
    "TIE_TOLERANCE",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- classifiers, scores
def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"expected (N, D) vectors, got shape {x.shape}")
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


#: cosines within this of the best count as a tie (identical inputs give equal cosines only up to rounding)
TIE_TOLERANCE = 1e-9


def _nearest(memory: np.ndarray, labels: np.ndarray, queries: np.ndarray, priority: np.ndarray) -> np.ndarray:
    mem, q = _unit(memory), _unit(queries)
    if len(mem) == 0 or len(labels) != len(mem) or mem.shape[1] != q.shape[1]:
        raise InputError(f"nearest-neighbour: memory {mem.shape} with {len(labels)} labels, queries {q.shape}")
    out = np.empty(len(q), dtype=object)
    for a in range(0, len(q), 2048):  # bounded memory: 2048 × N similarities at a time
        sims = q[a : a + 2048] @ mem.T
        tied = sims >= sims.max(axis=1, keepdims=True) - TIE_TOLERANCE
        out[a : a + 2048] = labels[np.argmax(np.where(tied, priority[None, :], -1.0), axis=1)]
    return out


def _priority(labels: np.ndarray, counts: Counter) -> np.ndarray:
    """Tie-break order: the sense more frequent in memory first, then the earlier memory entry."""
    n = len(labels)
    return np.array([counts[lab] * (n + 1.0) + (n - i) for i, lab in enumerate(labels)])


def nn1_predict(memory: np.ndarray, memory_labels: Sequence[str], queries: np.ndarray) -> np.ndarray:
    """1-NN by cosine: each query (M, D) gets the label of its most similar memory vector (N, D). Ties (cosines
    within :data:`TIE_TOLERANCE`) go to the sense most frequent in memory, then to the earlier memory entry, so a
    representation that gives every occurrence the same vector predicts the most frequent sense (MFS); a zero
    vector has cosine 0 with all. Returns (M,) labels (object array).

    Raises: InputError: an empty memory, widths that differ or labels not lined up."""
    labels = np.asarray(list(memory_labels), dtype=object)
    return _nearest(memory, labels, queries, _priority(labels, Counter(labels.tolist())))


def centroid_predict(memory: np.ndarray, memory_labels: Sequence[str], queries: np.ndarray) -> np.ndarray:
    """Nearest centroid by cosine: each sense's centroid is the mean of its memory vectors; each query gets the
    sense whose centroid has the highest cosine (ties as :func:`nn1_predict`: the sense most frequent in memory,
    then the one that sorts first). Returns (M,) labels.

    Raises: InputError: as :func:`nn1_predict`."""
    memory = np.asarray(memory, dtype=np.float64)
    labels = np.asarray(list(memory_labels), dtype=object)
    if memory.ndim != 2 or len(memory) == 0 or len(labels) != len(memory):
        raise InputError(f"centroid_predict: memory {memory.shape} with {len(labels)} labels")
    counts = Counter(labels.tolist())
    senses = np.asarray(sorted(counts), dtype=object)
    cents = np.stack([memory[labels == s].mean(axis=0) for s in senses])
    n = len(senses)
    priority = np.array([counts[s] * (n + 1.0) + (n - i) for i, s in enumerate(senses)])
    return _nearest(cents, senses, queries, priority)


def accuracy(y_true: Sequence[str], y_pred: Sequence[str]) -> float:
    """Fraction of equal labels (0 for no queries)."""
    t, p = np.asarray(list(y_true), dtype=object), np.asarray(list(y_pred), dtype=object)
    if t.shape != p.shape:
        raise InputError(f"accuracy: {t.shape} true labels, {p.shape} predictions")
    return float((t == p).mean()) if len(t) else 0.0


def macro_f1(y_true: Sequence[str], y_pred: Sequence[str], senses: Sequence[str] | None = None) -> float:
    """Unweighted mean over ``senses`` (default: the labels seen in either) of per-sense F1 = 2PR/(P+R), 0 where
    undefined (scikit-learn ``f1_score(average="macro", zero_division=0)``).

    Raises: InputError: lengths differ."""
    f1_score = import_optional("sklearn.metrics", "senses", "macro F1 (scikit-learn)").f1_score  # optional

    t, p = list(y_true), list(y_pred)
    if len(t) != len(p):
        raise InputError(f"macro_f1: {len(t)} true labels, {len(p)} predictions")
    labels = sorted(set(t) | set(p)) if senses is None else list(senses)
    if not t or not labels:
        return 0.0
    return float(f1_score(t, p, labels=labels, average="macro", zero_division=0))


def scores(y_true: Sequence[str], y_pred: Sequence[str], senses: Sequence[str] | None = None) -> dict[str, float]:
    """``{"accuracy": ..., "macro_f1": ...}`` (fractions in [0, 1])."""
    return {"accuracy": accuracy(y_true, y_pred), "macro_f1": macro_f1(y_true, y_pred, senses)}


def mfs_scores(
    memory_labels: Sequence[str], query_labels: Sequence[str], senses: Sequence[str] | None = None
) -> dict[str, float]:
    """Scores of predicting the memory's most frequent sense for every query (ties: the sense that sorts first)."""
    counts = Counter(memory_labels)
    if not counts:
        raise InputError("mfs_scores: empty memory")
    top = max(sorted(counts), key=lambda s: counts[s])
    return scores(query_labels, [top] * len(list(query_labels)), senses)


def _both(
    memory: np.ndarray, y_mem: Sequence[str], queries: np.ndarray, y_q: Sequence[str], senses: Sequence[str] | None
) -> dict[str, dict[str, float]]:
    return {
        "1nn": scores(y_q, nn1_predict(memory, y_mem, queries), senses),
        "centroid": scores(y_q, centroid_predict(memory, y_mem, queries), senses),
    }


def layer_scores(
    memory: np.ndarray,
    y_mem: Sequence[str],
    queries: np.ndarray,
    y_q: Sequence[str],
    senses: Sequence[str] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per layer of (N, L+1, D) memory and (M, L+1, D) query vectors, and for the layer average (mean of the L+1
    layers' vectors): ``{"0": {"1nn": {"accuracy", "macro_f1"}, "centroid": {...}}, ..., "average": {...}}``.

    Raises: InputError: arrays that are not 3-D or whose layers differ."""
    mem, q = np.asarray(memory), np.asarray(queries)
    if mem.ndim != 3 or q.ndim != 3 or mem.shape[1:] != q.shape[1:]:
        raise InputError(f"layer_scores expects (N, L+1, D) and (M, L+1, D), got {mem.shape} and {q.shape}")
    out = {str(k): _both(mem[:, k], y_mem, q[:, k], y_q, senses) for k in range(mem.shape[1])}
    out["average"] = _both(mem.mean(axis=1), y_mem, q.mean(axis=1), y_q, senses)
    return out


# ---------------------------------------------------------------------------------------------- static baseline
#: The static baseline's settings searched by cross-validation on the memory: words on each side of the target
#: (``None``: the whole sentence, as cut by the experiment's context cap) × whether the target word's own vector is
#: part of the average.
STATIC_GRID = [{"window": w, "include_target": t} for w in (2, 3, 5, 10, 20, None) for t in (False, True)]


def static_context_vectors(
    kv, examples: Sequence[SenseExample], window: int | None = 5, include_target: bool = False
) -> np.ndarray:
    """The static baseline's occurrence vectors: the mean of the word2vec vectors of the tokens within ``window``
    positions of the target span (``None``: the whole sentence), the span's own tokens only with
    ``include_target``. A token missing from ``kv`` is looked up lower-cased, then capitalised, then skipped; an
    occurrence with no known token gets a zero vector (cosine 0 with everything).

    Args:
        kv: gensim ``KeyedVectors`` (:func:`elmokit.baselines.word2vec.load_word2vec`).
    Returns: (N, dim) float32.
    Raises: UsageError: a negative window."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise UsageError(f"window must be an int >= 0 or None, got {window!r}")
    dim = kv.vector_size
    cache: dict[str, np.ndarray | None] = {}

    def vec(tok: str):
        if tok not in cache:
            cache[tok] = None
            for form in (tok, tok.lower(), tok[:1].upper() + tok[1:]):
                if form in kv.key_to_index:
                    cache[tok] = kv[form]
                    break
        return cache[tok]

    out = np.zeros((len(examples), dim), dtype=np.float32)
    for n, e in enumerate(examples):
        a = 0 if window is None else max(0, e.start - window)
        b = len(e.tokens) if window is None else min(len(e.tokens), e.end + window)
        idx = [i for i in range(a, b) if include_target or not e.start <= i < e.end]
        vs = [v for i in idx if (v := vec(e.tokens[i])) is not None]
        if vs:
            out[n] = np.mean(vs, axis=0)
    return out


def cv_folds(
    labels: Sequence[str], groups: Sequence[str], folds: int = 5, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified group k-fold (scikit-learn ``StratifiedGroupKFold``, shuffled with ``seed``): ``[(train_idx,
    test_idx), ...]``, a group never on both sides.

    The number of folds is ``folds`` lowered, where needed, to what the data allow: at most the number of groups,
    and at most the number of groups of the rarest label (a label's groups are the distinct groups of its
    examples), so that every label can appear in every test fold; but never below 2 (a label with a single group
    then sits in one test fold only). With enough groups per label (as in the CoarseWSD-20 and 苹果 memories)
    ``folds`` is used as given.

    Raises:
        UsageError: ``folds`` < 2, or ``labels`` and ``groups`` of different lengths.
        DataError: not even 2 folds are possible: fewer than 2 groups, or no label with 2 or more examples."""
    model_selection = import_optional("sklearn.model_selection", "senses", "cross-validation folds (scikit-learn)")
    StratifiedGroupKFold = model_selection.StratifiedGroupKFold  # optional: scikit-learn

    if folds < 2:
        raise UsageError(f"cross-validation needs folds >= 2, got folds={folds}")
    labels, groups = list(labels), list(groups)
    if len(labels) != len(groups):
        raise UsageError(f"cv_folds: {len(labels)} labels but {len(groups)} groups")
    n_groups = len(set(groups))
    if n_groups < 2:
        raise DataError(
            f"cross-validation needs at least 2 groups, got {n_groups} group(s) in {len(labels)} example(s)"
        )
    groups_of: dict[str, set[str]] = {}
    for label, group in zip(labels, groups):
        groups_of.setdefault(label, set()).add(group)
    n_splits = max(2, min(folds, n_groups, min(len(g) for g in groups_of.values())))
    if max(Counter(labels).values()) < n_splits:  # scikit-learn refuses: every label has fewer examples than folds
        raise DataError(
            f"cross-validation needs a label with at least {n_splits} examples, got {dict(Counter(labels))}"
        )
    splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the least populated class has fewer members than n_splits" (a 1-group label)
        return [(tr, te) for tr, te in splitter.split(np.zeros(len(labels)), labels, groups)]


def cv_score(
    vectors: np.ndarray,
    examples: Sequence[SenseExample],
    senses: Sequence[str] | None,
    folds: list[tuple[np.ndarray, np.ndarray]],
    classifier: str,
) -> float:
    """Mean macro-F1 over ``folds`` of ``classifier`` (``"1nn"`` or ``"centroid"``) on (N, D) vectors."""
    predict = {"1nn": nn1_predict, "centroid": centroid_predict}[classifier]
    return folds_macro_f1(vectors, [e.label for e in examples], senses, folds, predict)


def folds_macro_f1(
    vectors: np.ndarray,
    labels: Sequence[str],
    senses: Sequence[str] | None,
    folds: Sequence[tuple[np.ndarray, np.ndarray]],
    predict,
) -> float:
    """Mean macro-F1 over ``folds`` (``[(train_idx, held_out_idx), ...]``) of ``predict(memory (n, D), memory labels,
    queries (m, D)) -> (m,) labels`` on (N, D) vectors: each fold's held-out part classified from its train part."""
    y = np.asarray(list(labels), dtype=object)
    x = np.asarray(vectors)
    return float(np.mean([macro_f1(y[te], predict(x[tr], y[tr], x[te]), senses) for tr, te in folds]))


def choose_static_settings(
    kv,
    memory: Sequence[SenseExample],
    senses: Sequence[str] | None = None,
    grid: Sequence[dict] | None = None,
    folds: int = 5,
    seed: int = 0,
) -> dict[str, dict]:
    """Choose the static baseline's settings for each classifier by ``folds``-fold stratified group
    cross-validation on the **memory only** (mean macro-F1; ties: the earlier grid entry).

    Returns ``{"1nn": {"settings": {...}, "cv_macro_f1": x}, "centroid": {...}}``.

    The folds are :func:`cv_folds` (lowered where a sense has fewer groups than ``folds``).

    Raises: UsageError: ``folds`` < 2. DataError: fewer than 2 groups in the memory (see :func:`cv_folds`)."""
    grid = STATIC_GRID if grid is None else list(grid)
    split = cv_folds([e.label for e in memory], [e.group for e in memory], folds, seed)
    best: dict[str, dict] = {}
    for setting in grid:
        vecs = static_context_vectors(kv, memory, **setting)
        for clf in ("1nn", "centroid"):
            s = cv_score(vecs, memory, senses, split, clf)
            if clf not in best or s > best[clf]["cv_macro_f1"]:
                best[clf] = {"settings": dict(setting), "cv_macro_f1": s}
    return best


# ---------------------------------------------------------------------------------------------- embedding cache
def example_vectors(
    embedder,
    examples: Sequence[SenseExample],
    *,
    context: int | None = None,
    cache_dir: str | Path | None = None,
    model_key: str = "",
    batch_size: int | None = None,
) -> np.ndarray:
    """(N, L+1, 2P) float32 contextual vectors of the examples' spans
    (:func:`elmokit.analysis.occurrences.occurrence_vectors`, each sentence cut to ``context`` tokens on each side of
    the span).

    With ``cache_dir`` the array is kept as ``<cache_dir>/<sha256 key>.npy`` (written atomically) and reused: the
    key covers ``model_key`` (say, the weight file's sha256), ``context`` and every example's tokens and span, so a
    changed input is never served stale vectors.
    """
    path = None
    if cache_dir is not None:
        h = hashlib.sha256(f"{model_key}\t{context}\n".encode())
        for e in examples:
            h.update(("\x1f".join(e.tokens) + f"\t{e.start}\t{e.end}\n").encode("utf-8"))
        path = Path(cache_dir) / f"{h.hexdigest()[:32]}.npy"
        if path.is_file():
            arr = np.load(path, allow_pickle=False)
            if arr.shape[:1] == (len(examples),):
                return arr
    sentences = [list(e.tokens) for e in examples]
    occs = [Occurrence(i, e.start, e.end) for i, e in enumerate(examples)]
    arr = occurrence_vectors(embedder, sentences, occs, context=context, batch_size=batch_size)
    if path is not None:
        with atomic_path(path, suffix=".npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
    return arr
