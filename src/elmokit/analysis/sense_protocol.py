"""The fair sense protocol (issue 27, item 4): every representation gets its settings chosen on the train split only,
and every representation is scored by 1-NN, nearest centroid and a linear probe.

Before this protocol only the word2vec window baseline had its settings chosen (per word, by cross-validation on the
train split, :func:`elmokit.analysis.senses.choose_static_settings`) while the biLM was read at fixed layers. Here each
**family** of representations offers a set of **candidate settings**, each a (N, D) array of occurrence vectors:

* ``"elmo"`` (:func:`elmo_candidates`): each single biLM layer 0..L, the average of all L+1 layers and the average of
  the contextual layers 1..L (fixed mixes, no learned weights), each taken at the target span only (window 0) or as
  the mean of the span's and its neighbours' vectors over ±w tokens (:data:`ELMO_WINDOWS`; the same layer or mix,
  :func:`window_vectors`);
* ``"word2vec"`` (:func:`static_candidates`): the word2vec window baseline over
  :data:`elmokit.analysis.senses.STATIC_GRID` (window × target in/out), exactly as before;
* ``"concat"`` (:func:`concat_vectors`): [ELMo; word2vec window] with **each part L2-normalised** per occurrence, the
  ELMo part at the setting chosen for ELMo and the word2vec part at the setting chosen for word2vec (each for the same
  classifier, each on train). Unit parts make the cosine of two concatenated vectors exactly the mean of the two
  parts' cosines, so each part weighs the same whatever its width (256 vs 300) or scale, with no statistic fitted
  on any data; standardising each feature instead would weigh the parts by their widths and need train means and
  deviations. (The probe standardises its input anyway.)

**Choice** (:func:`choose`, :func:`select_settings`): per word, family and classifier, the candidate with the highest
mean macro-F1 over the folds of :func:`elmokit.analysis.senses.cv_folds` on the **train split only** — stratified
group 5-fold, seed 0, the very folds the word2vec window baseline is chosen on (CoarseWSD-20: each train line is its
own group; 苹果: a review is a group); ties go to the earlier candidate. The probe's settings are chosen in two stages
to bound the cost: first the candidate at :data:`PROBE_DEFAULT`, then, on that candidate, ``C`` × class weighting
over :data:`PROBE_GRID` (same folds). :func:`select_settings` takes no test data at all; :func:`score_choices` reads,
for each family and classifier, only the chosen setting's test array, once, for the final score.

**Classifiers** (:func:`predict`): ``"1nn"`` and ``"centroid"`` as :mod:`elmokit.analysis.senses`; ``"probe"``: a
linear probe, scikit-learn ``StandardScaler`` + ``LogisticRegression`` (lbfgs, multinomial for 3+ senses, L2
penalty ``C``, ``class_weight`` None or ``"balanced"``), the usual way representations are compared in the
literature (e.g. Liu et al., 2019, "Linguistic Knowledge and Transferability of Contextual Representations").
Scores: accuracy and macro-F1 over the word's senses (:func:`elmokit.analysis.senses.scores`).
"""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from elmokit.analysis.occurrences import context_window
from elmokit.analysis.sense_data import SenseExample
from elmokit.analysis.senses import (
    STATIC_GRID,
    centroid_predict,
    cv_folds,
    folds_macro_f1,
    mfs_scores,
    nn1_predict,
    scores,
    static_context_vectors,
)
from elmokit.errors import InputError, UsageError, import_optional
from elmokit.io import atomic_path

__all__ = [
    "CLASSIFIERS",
    "ELMO_WINDOWS",
    "PROBE_DEFAULT",
    "PROBE_GRID",
    "window_vectors",
    "elmo_candidates",
    "static_candidates",
    "static_setting_name",
    "unit_rows",
    "concat_vectors",
    "probe_predict",
    "predict",
    "cv_macro_f1",
    "choose",
    "select_settings",
    "score_choices",
    "fair_protocol",
    "setting_counts",
]

#: The classifiers every representation is scored with.
CLASSIFIERS = ("1nn", "centroid", "probe")
#: Tokens on each side of the target span whose contextual vectors are averaged with the span's (0: the span only).
ELMO_WINDOWS = (0, 2, 5)
#: The probe's setting while the representation's candidates are compared (stage 1 of the choice).
PROBE_DEFAULT = {"C": 1.0, "class_weight": "balanced"}
#: The probe's grid (stage 2 of the choice): inverse L2 strength × class weighting.
PROBE_GRID = [{"C": c, "class_weight": w} for w in (None, "balanced") for c in (0.01, 0.1, 1.0, 10.0)]
#: lbfgs iterations for the probe (standardised inputs converge well within this; a rare miss is not an error).
PROBE_MAX_ITER = 1000


# ---------------------------------------------------------------------------------------------- representations
def _window_key(examples: Sequence[SenseExample], windows: Sequence[int], context: int | None, model_key: str) -> str:
    h = hashlib.sha256(f"windows\t{model_key}\t{context}\t{list(windows)}\n".encode())
    for e in examples:
        h.update(("\x1f".join(e.tokens) + f"\t{e.start}\t{e.end}\n").encode("utf-8"))
    return h.hexdigest()[:32]


def window_vectors(
    embedder,
    examples: Sequence[SenseExample],
    windows: Sequence[int] = ELMO_WINDOWS,
    *,
    context: int | None = None,
    cache_dir: str | Path | None = None,
    model_key: str = "",
    batch_size: int | None = None,
) -> dict[int, np.ndarray]:
    """Contextual vectors of each example pooled over windows around its target span, in every layer.

    Each sentence is first cut to ``context`` tokens on each side of the span
    (:func:`elmokit.analysis.occurrences.context_window`) and embedded once (identical inputs once); for window
    ``w`` the vector of layer k is the mean of layer k's vectors over tokens ``[start - w, end + w)`` of the cut
    sentence (clipped at its ends). Window 0 is the span mean, the same as
    :func:`elmokit.analysis.senses.example_vectors`.

    With ``cache_dir`` the result is kept as ``<cache_dir>/<sha256 key>.npy`` (written atomically) and reused; the key
    covers ``model_key``, ``context``, ``windows`` and every example's tokens and span.

    Returns: ``{w: (N, L+1, 2P) float32}`` in the order of ``windows``.
    Raises: UsageError: a negative or non-int window, or no windows."""
    windows = list(windows)
    if not windows or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in windows):
        raise UsageError(f"windows must be a non-empty list of ints >= 0, got {windows!r}")
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{_window_key(examples, windows, context, model_key)}.npy"
        if path.is_file():
            arr = np.load(path, allow_pickle=False)
            if arr.shape[:2] == (len(windows), len(examples)):
                return {w: arr[i] for i, w in enumerate(windows)}
    keys: dict[tuple[str, ...], int] = {}
    plan: list[list[tuple[int, int, int]]] = []
    for n, e in enumerate(examples):
        toks, s, t = context_window(e.tokens, e.start, e.end, context)
        idx = keys.setdefault(tuple(toks), len(keys))
        if idx == len(plan):
            plan.append([])
        plan[idx].append((n, s, t))
    out = np.zeros((len(windows), len(examples), embedder.num_layers, embedder.output_dim), dtype=np.float32)
    for idx, arr in enumerate(embedder.embed_sentences(list(keys), batch_size)):  # arr: (L+1, T, 2P)
        for n, s, t in plan[idx]:
            for i, w in enumerate(windows):
                out[i, n] = arr[:, max(0, s - w) : min(arr.shape[1], t + w)].mean(axis=1)
    if path is not None:
        with atomic_path(path, suffix=".npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, out, allow_pickle=False)
    return {w: out[i] for i, w in enumerate(windows)}


def elmo_candidates(windows: Mapping[int, np.ndarray]) -> dict[str, np.ndarray]:
    """The ELMo family's candidates from :func:`window_vectors`' ``{w: (N, L+1, D)}``: for each window, each layer
    (``"layer k, ±w"``), the average of all layers (``"average 0-L, ±w"``) and, with L ≥ 2, of the contextual ones
    (``"average 1-L, ±w"``). Returns ``{name: (N, D) float32}``, windows in the given order, layers first.

    Raises: InputError: an array that is not 3-D, or arrays of different shapes."""
    out: dict[str, np.ndarray] = {}
    shape = None
    for w, arr in windows.items():
        arr = np.asarray(arr)
        if arr.ndim != 3 or (shape is not None and arr.shape != shape):
            raise InputError(f"elmo_candidates expects (N, L+1, D) arrays of one shape, got {arr.shape} for ±{w}")
        shape = arr.shape
        n_layers = arr.shape[1]
        for k in range(n_layers):
            out[f"layer {k}, ±{w}"] = arr[:, k]
        out[f"average 0-{n_layers - 1}, ±{w}"] = arr.mean(axis=1)
        if n_layers >= 3:
            out[f"average 1-{n_layers - 1}, ±{w}"] = arr[:, 1:].mean(axis=1)
    return out


def static_setting_name(setting: Mapping) -> str:
    """``{"window": 5, "include_target": False}`` → ``"±5, target out"`` (``None`` → ``"sentence"``)."""
    where = "sentence" if setting["window"] is None else f"±{setting['window']}"
    return f"{where}, target {'in' if setting['include_target'] else 'out'}"


def static_candidates(kv, examples: Sequence[SenseExample], grid: Sequence[Mapping] | None = None):
    """The word2vec family's candidates: ``{static_setting_name(s): static_context_vectors(kv, examples, **s)}`` for
    each setting of ``grid`` (default :data:`elmokit.analysis.senses.STATIC_GRID`), in grid order."""
    grid = STATIC_GRID if grid is None else grid
    return {static_setting_name(s): static_context_vectors(kv, examples, **s) for s in grid}


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row of (N, D) ``x`` divided by its L2 norm (a zero row stays zero). Returns float32.

    Raises: InputError: not 2-D."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"expected (N, D) vectors, got shape {x.shape}")
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0).astype(np.float32)


def concat_vectors(elmo: np.ndarray, static: np.ndarray) -> np.ndarray:
    """[unit(elmo); unit(static)]: (N, De) and (N, Ds) → (N, De + Ds) float32, each part L2-normalised per row, so
    the cosine of two such rows is the mean of the two parts' cosines (a zero part contributes 0).

    Raises: InputError: not 2-D or different numbers of rows."""
    a, b = unit_rows(elmo), unit_rows(static)
    if len(a) != len(b):
        raise InputError(f"concat_vectors: {len(a)} ELMo rows but {len(b)} word2vec rows")
    return np.concatenate([a, b], axis=1)


# ---------------------------------------------------------------------------------------------- classifiers
def probe_predict(
    memory: np.ndarray,
    memory_labels: Sequence[str],
    queries: np.ndarray,
    C: float = 1.0,
    class_weight: str | None = "balanced",
) -> np.ndarray:
    """Linear probe: scikit-learn ``StandardScaler`` then ``LogisticRegression(C=C, class_weight=class_weight,
    solver="lbfgs", max_iter=PROBE_MAX_ITER)`` fitted on (N, D) ``memory``; returns the (M,) predicted labels of
    ``queries`` (object array). A memory with one sense predicts it everywhere (nothing to fit); no queries, nothing.

    Raises: InputError: an empty memory, labels not lined up, or widths that differ. UsageError: ``C`` <= 0."""
    mem, q = np.asarray(memory, dtype=np.float64), np.asarray(queries, dtype=np.float64)
    labels = np.asarray(list(memory_labels), dtype=object)
    if mem.ndim != 2 or q.ndim != 2 or len(mem) == 0 or len(labels) != len(mem) or mem.shape[1] != q.shape[1]:
        raise InputError(f"probe: memory {mem.shape} with {len(labels)} labels, queries {q.shape}")
    if not C > 0:
        raise UsageError(f"probe: C must be > 0, got {C!r}")
    if len(set(labels.tolist())) == 1 or len(q) == 0:
        return np.full(len(q), labels[0], dtype=object)
    linear = import_optional("sklearn.linear_model", "senses", "the linear probe (scikit-learn)")
    preprocessing = import_optional("sklearn.preprocessing", "senses", "the linear probe (scikit-learn)")
    exceptions = import_optional("sklearn.exceptions", "senses", "the linear probe (scikit-learn)")
    scaler = preprocessing.StandardScaler().fit(mem)
    model = linear.LogisticRegression(C=C, class_weight=class_weight, max_iter=PROBE_MAX_ITER, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", exceptions.ConvergenceWarning)
        model.fit(scaler.transform(mem), labels.astype(str))
    return np.asarray(model.predict(scaler.transform(q)), dtype=object)


def predict(classifier: str, memory: np.ndarray, memory_labels, queries: np.ndarray, params=None) -> np.ndarray:
    """One of :data:`CLASSIFIERS` on (N, D) memory and (M, D) queries; ``params`` are the probe's (``C``,
    ``class_weight``; default :data:`PROBE_DEFAULT`), unused by the others. Returns (M,) labels.

    Raises: UsageError: an unknown classifier."""
    if classifier == "1nn":
        return nn1_predict(memory, memory_labels, queries)
    if classifier == "centroid":
        return centroid_predict(memory, memory_labels, queries)
    if classifier == "probe":
        return probe_predict(memory, memory_labels, queries, **{**PROBE_DEFAULT, **(params or {})})
    raise UsageError(f"classifier must be one of {CLASSIFIERS}, got {classifier!r}")


def cv_macro_f1(
    vectors: np.ndarray,
    labels: Sequence[str],
    senses: Sequence[str] | None,
    folds: Sequence[tuple[np.ndarray, np.ndarray]],
    classifier: str,
    params: Mapping | None = None,
) -> float:
    """Mean macro-F1 over ``folds`` (``[(train_idx, held_out_idx), ...]``) of ``classifier`` on (N, D) vectors."""
    return folds_macro_f1(vectors, labels, senses, folds, lambda m, ml, q: predict(classifier, m, ml, q, params))


# ---------------------------------------------------------------------------------------------- the choice
def choose(
    candidates: Mapping[str, np.ndarray],
    labels: Sequence[str],
    senses: Sequence[str] | None,
    folds: Sequence[tuple[np.ndarray, np.ndarray]],
    classifier: str,
    probe_grid: Sequence[Mapping] | None = None,
) -> dict:
    """Choose a family's setting for ``classifier`` by cross-validated macro-F1 on the given (train) ``candidates``
    (``{name: (N, D)}``, all lined up with ``labels``); ties: the earlier candidate, then the earlier grid entry. For
    the probe, stage 1 compares the candidates at :data:`PROBE_DEFAULT`, stage 2 the ``probe_grid`` (default
    :data:`PROBE_GRID`) on the chosen candidate.

    Returns ``{"setting": name, "params": {...} (probe) or {}, "cv_macro_f1": x, "cv": {name: x, ...},
    "cv_params": [[params, x], ...] (probe)}``.

    Raises: InputError: no candidates, or one not lined up with ``labels``."""
    if not candidates:
        raise InputError("choose: no candidate settings")
    n = len(labels)
    for name, x in candidates.items():
        if len(x) != n:
            raise InputError(f"choose: candidate {name!r} has {len(x)} rows for {n} labels")
    cv = {name: cv_macro_f1(x, labels, senses, folds, classifier) for name, x in candidates.items()}
    best = max(cv, key=lambda k: (cv[k], -list(cv).index(k)))
    out = {"setting": best, "params": {}, "cv_macro_f1": cv[best], "cv": cv}
    if classifier == "probe":
        grid = [dict(p) for p in (PROBE_GRID if probe_grid is None else probe_grid)]
        if not grid:
            raise InputError("choose: an empty probe grid")
        table = [[p, cv_macro_f1(candidates[best], labels, senses, folds, "probe", p)] for p in grid]
        i = max(range(len(table)), key=lambda j: (table[j][1], -j))
        out.update(params=table[i][0], cv_macro_f1=table[i][1], cv_params=table)
    return out


def select_settings(
    train: Mapping[str, Mapping[str, np.ndarray]],
    labels: Sequence[str],
    groups: Sequence[str],
    senses: Sequence[str] | None = None,
    *,
    classifiers: Sequence[str] = CLASSIFIERS,
    folds: int = 5,
    seed: int = 0,
    concat: tuple[str, str] | None = ("elmo", "word2vec"),
    probe_grid: Sequence[Mapping] | None = None,
) -> dict[str, dict[str, dict]]:
    """Every family's choice for every classifier, from the **train split only** (this function sees no test data).

    Args:
        train: ``{family: {setting name: (N, D) train vectors}}`` (e.g. ``{"elmo": elmo_candidates(...),
            "word2vec": static_candidates(...)}``).
        labels, groups: the N train labels and groups (the folds are :func:`elmokit.analysis.senses.cv_folds`
            ``(labels, groups, folds, seed)``, as for the word2vec baseline).
        concat: two families whose chosen settings (per classifier) are joined by :func:`concat_vectors` into the
            family ``"concat"`` (its one candidate is named ``"<first> + <second>"``; for the probe its C and class
            weighting are chosen on it); ``None``: no concatenation.

    Returns: ``{family: {classifier: choose(...)}}``.
    Raises: UsageError: an unknown classifier or ``concat`` family. DataError: too few groups (see cv_folds)."""
    for clf in classifiers:
        if clf not in CLASSIFIERS:
            raise UsageError(f"classifier must be one of {CLASSIFIERS}, got {clf!r}")
    if concat is not None and any(f not in train for f in concat):
        raise UsageError(f"concat names families {concat}, but the families are {sorted(train)}")
    split = cv_folds(labels, groups, folds, seed)
    out: dict[str, dict[str, dict]] = {}
    for family, candidates in train.items():
        out[family] = {clf: choose(candidates, labels, senses, split, clf, probe_grid) for clf in classifiers}
    if concat is not None:
        a, b = concat
        out["concat"] = {}
        for clf in classifiers:
            sa, sb = out[a][clf]["setting"], out[b][clf]["setting"]
            joined = {f"{sa} + {sb}": concat_vectors(train[a][sa], train[b][sb])}
            out["concat"][clf] = choose(joined, labels, senses, split, clf, probe_grid)
    return out


def score_choices(
    choices: Mapping[str, Mapping[str, dict]],
    train: Mapping[str, Mapping[str, np.ndarray]],
    test: Mapping[str, Mapping[str, np.ndarray]],
    train_labels: Sequence[str],
    test_labels: Sequence[str],
    senses: Sequence[str] | None = None,
    concat: tuple[str, str] | None = ("elmo", "word2vec"),
) -> dict[str, dict[str, dict]]:
    """The final test scores of :func:`select_settings`' choices: each classifier fitted on the whole train split at
    the chosen setting (and the probe's chosen ``params``), scored on the test split. Only the chosen setting's test
    array of each family is read (``test[family][setting]``; for ``"concat"`` the two parts' chosen test arrays).

    Returns ``{family: {classifier: {"accuracy", "macro_f1", "setting", "params", "cv_macro_f1"}}}``."""
    out: dict[str, dict[str, dict]] = {}
    for family, per_clf in choices.items():
        out[family] = {}
        for clf, ch in per_clf.items():
            if family == "concat":
                if concat is None:
                    raise UsageError("score_choices: the choices hold 'concat' but no concat families were named")
                sa, sb = choices[concat[0]][clf]["setting"], choices[concat[1]][clf]["setting"]
                x_tr = concat_vectors(train[concat[0]][sa], train[concat[1]][sb])
                x_te = concat_vectors(test[concat[0]][sa], test[concat[1]][sb])
            else:
                x_tr, x_te = train[family][ch["setting"]], test[family][ch["setting"]]
            pred = predict(clf, x_tr, train_labels, x_te, ch["params"])
            out[family][clf] = {
                **scores(test_labels, pred, senses),
                "setting": ch["setting"],
                "params": ch["params"],
                "cv_macro_f1": ch["cv_macro_f1"],
            }
    return out


def fair_protocol(
    train: Mapping[str, Mapping[str, np.ndarray]],
    test: Mapping[str, Mapping[str, np.ndarray]],
    train_labels: Sequence[str],
    train_groups: Sequence[str],
    test_labels: Sequence[str],
    senses: Sequence[str] | None = None,
    **options,
) -> dict:
    """:func:`select_settings` on train, then :func:`score_choices` on test, plus the MFS (the train split's most
    frequent sense). ``options``: those of :func:`select_settings`.

    Returns ``{"mfs": {"accuracy", "macro_f1"}, "families": score_choices(...), "choices": select_settings(...)}``."""
    choices = select_settings(train, train_labels, train_groups, senses, **options)
    concat = options.get("concat", ("elmo", "word2vec"))
    return {
        "mfs": mfs_scores(list(train_labels), list(test_labels), senses),
        "families": score_choices(choices, train, test, train_labels, test_labels, senses, concat),
        "choices": choices,
    }


def setting_counts(results: Sequence[Mapping], family: str, classifier: str) -> list[tuple[str, int]]:
    """How often each setting was chosen over words: ``[(setting, count), ...]`` most frequent first (ties: by
    name). ``results`` are :func:`fair_protocol` outputs."""
    c = Counter(r["families"][family][classifier]["setting"] for r in results)
    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))
