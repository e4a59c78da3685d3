"""Markdown tables of the fair sense protocol (:mod:`elmokit.analysis.sense_protocol`), shared by
``senses_coarsewsd.py`` and ``senses_apple.py`` (imported from the scripts' own folder)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

FAMILIES = (
    ("word2vec", "word2vec window (chosen on train)"),
    ("elmo", "ELMo (layer/mix/window chosen on train)"),
    ("concat", "[ELMo; word2vec window] (each part L2-normalised)"),
)
CLASSIFIERS = (("1nn", "1-NN"), ("centroid", "nearest centroid"), ("probe", "linear probe"))


def cell(s: Mapping) -> str:
    """``accuracy % / macro-F1 %``."""
    return f"{100 * s['accuracy']:.1f} / {100 * s['macro_f1']:.1f}"


def average(items: list[Mapping]) -> dict:
    """Mean accuracy and macro-F1 of score dicts."""
    return {m: float(np.mean([s[m] for s in items])) for m in ("accuracy", "macro_f1")}


def params_text(p: Mapping) -> str:
    """The probe's params: ``C=0.1, balanced`` (empty for the other classifiers)."""
    if not p:
        return ""
    return f"C={p['C']:g}, {'balanced' if p['class_weight'] == 'balanced' else 'unweighted'}"


def summary_table(fair: Mapping[str, Mapping], old_layers: Mapping[str, Mapping] | None = None) -> list[str]:
    """Average over the words (one word: its figures) of each row × classifier, accuracy % / macro-F1 %.

    ``fair``: ``{word: fair_protocol(...)}``; ``old_layers``: ``{word: layer_scores(...)}`` of the old protocol
    (fixed layers at the target span, 1-NN and centroid only), shown as they were computed."""
    words = list(fair)
    head = ["representation"] + [name for _, name in CLASSIFIERS]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(CLASSIFIERS)]
    mfs = cell(average([fair[w]["mfs"] for w in words]))
    lines.append(f"| MFS (train's most frequent sense) | {mfs} | {mfs} | {mfs} |")
    if old_layers:
        for k in old_layers[words[0]]:
            name = "layer 0" if k == "0" else ("layer average" if k == "average" else f"layer {k}")
            cells = [cell(average([old_layers[w][k][c] for w in words])) for c in ("1nn", "centroid")]
            lines.append(f"| ELMo {name}, fixed (old protocol) | {cells[0]} | {cells[1]} | — |")
    for fam, name in FAMILIES:
        cells = [cell(average([fair[w]["families"][fam][c] for w in words])) for c, _ in CLASSIFIERS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def per_word_table(fair: Mapping[str, Mapping]) -> list[str]:
    """Per word, macro-F1 % of word2vec / ELMo / concat under each classifier (the test split)."""
    head = ["word", "MFS"] + [f"{cn}: w2v / ELMo / concat" for _, cn in CLASSIFIERS]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for w, r in fair.items():
        row = [w, f"{100 * r['mfs']['macro_f1']:.1f}"]
        for c, _ in CLASSIFIERS:
            row.append(" / ".join(f"{100 * r['families'][f][c]['macro_f1']:.1f}" for f, _ in FAMILIES))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def choices_table(fair: Mapping[str, Mapping]) -> list[str]:
    """Per word, the settings chosen on train: ELMo's per classifier, word2vec's per classifier, the probe's C and
    class weighting for each family, and the cross-validated macro-F1 (train) of the ELMo choice."""
    head = ["word"]
    head += [f"ELMo, {cn}" for _, cn in CLASSIFIERS] + [f"word2vec, {cn}" for _, cn in CLASSIFIERS]
    head += ["probe: w2v / ELMo / concat", "train CV macro-F1 %, ELMo 1-NN / centroid / probe"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for w, r in fair.items():
        fam = r["families"]
        row = [w]
        row += [f"`{fam['elmo'][c]['setting']}`" for c, _ in CLASSIFIERS]
        row += [f"`{fam['word2vec'][c]['setting']}`" for c, _ in CLASSIFIERS]
        row.append(" / ".join(params_text(fam[f]["probe"]["params"]) for f, _ in FAMILIES))
        row.append(" / ".join(f"{100 * fam['elmo'][c]['cv_macro_f1']:.1f}" for c, _ in CLASSIFIERS))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def protocol_note(folds: int, windows: list[int]) -> str:
    """One paragraph saying how the choices were made."""
    return (
        f"Fair protocol (`elmokit.analysis.sense_protocol`): per word, family and classifier, every setting is chosen "
        f"by stratified group {folds}-fold cross-validation on the train split only (mean macro-F1; the folds the "
        "word2vec window has always been chosen on); the test split is read once, for the chosen setting's score. "
        f"ELMo candidates: each layer, the average of all layers and of layers 1..L, each at the target (±0) or "
        f"averaged with its neighbours' vectors over ±{', ±'.join(str(w) for w in windows if w)} tokens. "
        "word2vec: window × target in/out, as before. [ELMo; word2vec]: the two parts at their own choices for the "
        "same classifier, each L2-normalised (the cosine of the concatenation is the mean of the parts' cosines). "
        "Linear probe: standardised features, scikit-learn logistic regression; the setting is chosen at C=1, "
        "balanced class weights, then C ∈ {0.01, 0.1, 1, 10} × class weights {none, balanced} on that setting."
    )
