"""CoarseWSD-20 sense separation with the English biLM (issue 10): prints the tables of docs/explanation/senses.md.

    nice -n 5 python experiments/senses_coarsewsd.py --threads 1     # ~6 min on 1 CPU thread (models: $ELMOKIT_CACHE)

Protocol (:mod:`elmokit.analysis.senses`): for each of the 20 words, train = the labelled memory, test = the
queries; 1-NN and nearest-centroid (cosine) accuracy and macro-F1 for the biLM's layers 0..L and their average, beside

* MFS — the memory's most frequent sense for every query;
* static — word2vec (``zoo/elmokit-en/word2vec``, trained on the biLM's own text) averaged over a window around the
  target; window and "target included" chosen per word and classifier by 5-fold cross-validation on train only;
* the authors' figures (SOURCE.md "Baselines": nearest sense centroid of BERT vectors, "1NN" in their naming, and
  supervised fastText classifiers), quoted as they are.

Casing: CoarseWSD-20 is lower-cased and elmokit-en is cased. The three ways of feeding it (:data:`CASINGS`: as is,
sentence case, truecased to each word's most frequent spelling in the biLM's training text) are compared by 5-fold
cross-validation on **train** (layer average, mean of 1-NN and centroid macro-F1 over the 20 words); the best is
used for test. Sentences are cut to ``--context`` tokens on each side of the target (default 30, to fit the CPU
budget: 6,258 of the 33,566 train + test sentences, 18.6 %, lose some tokens; the median sentence has 28).

Fair protocol (issue 27, :mod:`elmokit.analysis.sense_protocol`): the ELMo rows get what the word2vec row gets —
per word and classifier, a setting chosen by the same stratified group 5-fold cross-validation on train only: a layer,
the average of all layers or of layers 1..L, each at the target or averaged over ±``--windows`` tokens around it;
beside it the [ELMo; word2vec window] concatenation (each part L2-normalised, each part at its own choice), and a
linear probe (logistic regression, C and class weighting chosen on train) beside 1-NN and nearest centroid for every
representation. The old fixed-layer rows are still computed and printed beside the new ones; each word's chosen
settings are in the tables and the JSON (``fair``).

Another model than the zoo's (a quick check): ``--model DIR --word2vec DIR --train-text FILE`` (the biLM folder,
vectors from :func:`elmokit.baselines.word2vec.train_word2vec`, and the text the truecasing table is counted on).

Writes ``experiments/results/senses-coarsewsd.{md,json}`` and ``senses-bank.png`` (the 455 bank test occurrences);
embeddings are cached under ``$ELMOKIT_CACHE/senses/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sense_tables import choices_table, per_word_table, protocol_note, summary_table

from elmokit.modules.threads import default_threads  # (imports elmokit before torch: its OpenMP wait setting applies)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "coarsewsd-20"
RESULTS = ROOT / "experiments" / "results"


def _cell(s: dict) -> str:
    return f"{100 * s['accuracy']:.1f} / {100 * s['macro_f1']:.1f}"


def _pct(pair) -> str:
    return f"{pair[0]:.1f} / {pair[1]:.1f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="CoarseWSD-20 folder (default: %(default)s)")
    parser.add_argument("--model", default="elmokit-en", help="biLM (default: %(default)s)")
    parser.add_argument("--context", type=int, default=30, help="tokens kept on each side (default: %(default)s)")
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads(),
        help="torch threads (default: %(default)s, elmokit's default; the documented tables were made "
        "with --threads 1, which repeats them exactly)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    parser.add_argument("--words", default=None, help="comma-separated subset (default: all 20)")
    parser.add_argument("--word2vec", type=Path, default=None, help="word2vec folder (default: <model>/word2vec)")
    parser.add_argument(
        "--train-text", type=Path, default=None, help="text counted for truecasing (default: <model>/corpus/train.txt)"
    )
    parser.add_argument(
        "--windows", default="0,2,5", help="ELMo windows (± tokens) offered to the choice (default: %(default)s)"
    )
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds on train (default: %(default)s)")
    return parser


@dataclass
class Run:
    """The model, the words and their train/test examples, the truecasing table, and the embedding clock."""

    args: argparse.Namespace
    windows: list[int]
    folder: Path
    model_key: str
    cache: Path
    embedder: Any
    words: list[str]
    senses: dict
    train: dict
    test: dict
    table: dict
    t0: float
    t_embed: float = 0.0

    def cased(self, examples, casing):
        from elmokit.analysis.senses import SenseExample, recase

        return [SenseExample(recase(e.tokens, casing, self.table), e.start, e.end, e.label, e.group) for e in examples]

    def vectors(self, examples_by_word, casing):
        """``{word: {window: (n, L+1, D)}}`` of the examples recased (embeddings cached under ``$ELMOKIT_CACHE``)."""
        from elmokit.analysis.sense_protocol import window_vectors

        start = time.time()
        flat = [e for w in self.words for e in self.cased(examples_by_word[w], casing)]
        arr = window_vectors(
            self.embedder, flat, self.windows, context=self.args.context, cache_dir=self.cache, model_key=self.model_key
        )
        out, a = {}, 0
        for w in self.words:
            out[w] = {k: v[a : a + len(examples_by_word[w])] for k, v in arr.items()}
            a += len(examples_by_word[w])
        self.t_embed += time.time() - start
        return out


def load_run(args: argparse.Namespace, windows: list[int], t0: float) -> Run:
    """The biLM, the words asked for (all 20 by default) with their senses and examples, and the truecasing table
    counted on the biLM's training text."""
    from elmokit import Embedder
    from elmokit.analysis.senses import coarsewsd_senses, coarsewsd_words, read_coarsewsd, truecase_table
    from elmokit.io import file_sha256
    from elmokit.weights.native import cache_dir, resolve_model_name

    folder = Path(resolve_model_name(args.model))
    model_key = file_sha256(folder / "model.safetensors")
    cache = cache_dir() / "senses" / "coarsewsd"
    embedder = Embedder(str(folder), batch_size=64)
    words = coarsewsd_words(args.data) if args.words is None else args.words.split(",")
    senses = {w: coarsewsd_senses(args.data, w) for w in words}
    train = {w: read_coarsewsd(args.data, w, "train") for w in words}
    test = {w: read_coarsewsd(args.data, w, "test") for w in words}

    counts: Counter[str] = Counter()
    with open(args.train_text or folder / "corpus" / "train.txt", encoding="utf-8") as fh:
        for line in fh:
            counts.update(line.split())
    table = truecase_table(counts)
    return Run(args, windows, folder, model_key, cache, embedder, words, senses, train, test, table, t0)


def choose_casing(run: Run) -> tuple[str, dict, dict]:
    """``(casing, casing_cv, train vectors)``: the casing chosen by cross-validation on train, at the target span
    (window 0, as in the old protocol), layer average, mean of 1-NN and centroid macro-F1 over the words; ties go
    to the earlier casing. Only the best casing's vectors are kept in memory."""
    from elmokit.analysis.senses import CASINGS, cv_folds, cv_score

    args, words, train, senses = run.args, run.words, run.train, run.senses
    folds = {w: cv_folds([e.label for e in train[w]], [e.group for e in train[w]], args.folds, 0) for w in words}
    casing_cv = {}
    best_train = (None, -1.0, None)
    for casing in CASINGS:
        v = run.vectors(train, casing)
        per = {
            clf: float(np.mean([cv_score(v[w][0].mean(axis=1), train[w], senses[w], folds[w], clf) for w in words]))
            for clf in ("1nn", "centroid")
        }
        casing_cv[casing] = {**per, "mean": (per["1nn"] + per["centroid"]) / 2}
        print(
            f"# casing {casing}: train {args.folds}-fold CV macro-F1 (layer average) 1-NN {100 * per['1nn']:.1f}, "
            f"centroid "
            f"{100 * per['centroid']:.1f} ({time.time() - run.t0:.0f} s)",
            file=sys.stderr,
        )
        if casing_cv[casing]["mean"] > best_train[1]:  # ties: the earlier casing
            best_train = (casing, casing_cv[casing]["mean"], v)
        del v
    casing, _, train_w = best_train
    return casing, casing_cv, train_w


def _static_row(fair_w: dict, grid_of: dict) -> dict:
    """The old protocol's word2vec window row: the fair protocol's word2vec choice for 1-NN / centroid (same grid,
    folds and tie rule as choose_static_settings)."""
    static = {}
    for clf in ("1nn", "centroid"):
        got = fair_w["families"]["word2vec"][clf]
        static[clf] = {
            "accuracy": got["accuracy"],
            "macro_f1": got["macro_f1"],
            "settings": grid_of[got["setting"]],
            "cv_macro_f1": got["cv_macro_f1"],
        }
    return static


def score_words(run: Run, casing: str, train_w: dict, test_w: dict) -> tuple[dict, dict, dict]:
    """``(results, fair, authors)``: per word the old protocol's scores (MFS, word2vec window, fixed layers at the
    target span) and the fair protocol's result; the authors' figures from SOURCE.md."""
    from elmokit.analysis.sense_protocol import elmo_candidates, fair_protocol, static_candidates, static_setting_name
    from elmokit.analysis.senses import STATIC_GRID, layer_scores, mfs_scores, read_coarsewsd_baselines
    from elmokit.baselines.word2vec import load_word2vec

    args, train, test, senses = run.args, run.train, run.test, run.senses
    kv = load_word2vec(args.word2vec or run.folder / "word2vec")
    authors = read_coarsewsd_baselines(args.data / "SOURCE.md")
    grid_of = {static_setting_name(st): st for st in STATIC_GRID}
    results, fair = {}, {}
    for w in run.words:
        y_mem = [e.label for e in train[w]]
        y_q = [e.label for e in test[w]]
        tr_c, te_c = run.cased(train[w], casing), run.cased(test[w], casing)
        fam_tr = {"elmo": elmo_candidates(train_w[w]), "word2vec": static_candidates(kv, tr_c)}
        fam_te = {"elmo": elmo_candidates(test_w[w]), "word2vec": static_candidates(kv, te_c)}
        groups = [e.group for e in train[w]]
        fair[w] = fair_protocol(fam_tr, fam_te, y_mem, groups, y_q, senses[w], folds=args.folds, seed=0)
        print(f"# {w}: fair protocol done ({time.time() - run.t0:.0f} s)", file=sys.stderr)
        results[w] = {
            "n_train": len(y_mem),
            "n_test": len(y_q),
            "senses": senses[w],
            "mfs": mfs_scores(y_mem, y_q, senses[w]),
            "static": _static_row(fair[w], grid_of),
            "layers": layer_scores(train_w[w][0], y_mem, test_w[w][0], y_q, senses[w]),  # the target span
        }
    return results, fair, authors


def _avg(results: dict, words: list[str], get) -> dict:
    return {m: float(np.mean([get(results[w])[m] for w in words])) for m in ("accuracy", "macro_f1")}


def _layer_names(layer_keys: list[str]) -> dict:
    return {
        k: ("layer 0 (static)" if k == "0" else ("layer avg" if k == "average" else f"layer {k}")) for k in layer_keys
    }


def centroid_table(args, words: list[str], results: dict, authors: dict, casing: str) -> list[str]:
    """The old protocol's nearest-centroid table, with the authors' columns."""
    layer_keys = list(results[words[0]]["layers"])
    names = _layer_names(layer_keys)
    cols_a = ["MFS", "word2vec window, centroid"] + [f"ELMo {names[k]}" for k in layer_keys]
    author_cols = authors["columns"][1:]  # their MFS column is ours recomputed; keep the authors' methods
    lines = [
        f"CoarseWSD-20 test, nearest sense centroid (cosine). Cells: accuracy % / macro-F1 %. Model "
        f"`{args.model}`; casing: `{casing}` (chosen on train); each sentence cut to ±{args.context} tokens "
        "around the target.",
        "",
    ]
    head = ["word", "train/test"] + cols_a + [f"authors: {c}" for c in author_cols]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|---:|" + "---:|" * (len(head) - 2))
    for w in words:
        r = results[w]
        row = [w, f"{r['n_train']}/{r['n_test']}", _cell(r["mfs"]), _cell(r["static"]["centroid"])]
        row += [_cell(r["layers"][k]["centroid"]) for k in layer_keys]
        row += [_pct(authors["rows"][w][c]) if w in authors["rows"] else "—" for c in author_cols]
        lines.append("| " + " | ".join(row) + " |")
    row = [
        "**average**",
        "",
        _cell(_avg(results, words, lambda r: r["mfs"])),
        _cell(_avg(results, words, lambda r: r["static"]["centroid"])),
    ]
    row += [_cell(_avg(results, words, lambda r, k=k: r["layers"][k]["centroid"])) for k in layer_keys]
    row += [_pct(authors["rows"]["avg"][c]) if len(words) == 20 else "—" for c in author_cols]
    lines.append("| " + " | ".join(row) + " |")
    return lines


def one_nn_table(words: list[str], results: dict) -> list[str]:
    """The old protocol's 1-NN table."""
    layer_keys = list(results[words[0]]["layers"])
    names = _layer_names(layer_keys)
    lines = [
        "CoarseWSD-20 test, 1-NN (cosine, nearest single training occurrence). Cells: accuracy % / macro-F1 %.",
        "",
    ]
    head = ["word", "MFS", "word2vec window, 1-NN"] + [f"ELMo {names[k]}" for k in layer_keys]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|" + "---:|" * (len(head) - 1))
    for w in words:
        r = results[w]
        row = [w, _cell(r["mfs"]), _cell(r["static"]["1nn"])] + [_cell(r["layers"][k]["1nn"]) for k in layer_keys]
        lines.append("| " + " | ".join(row) + " |")
    row = [
        "**average**",
        _cell(_avg(results, words, lambda r: r["mfs"])),
        _cell(_avg(results, words, lambda r: r["static"]["1nn"])),
    ]
    row += [_cell(_avg(results, words, lambda r, k=k: r["layers"][k]["1nn"])) for k in layer_keys]
    lines.append("| " + " | ".join(row) + " |")
    return lines


def old_protocol_notes(words: list[str], results: dict, casing: str, casing_cv: dict) -> list[str]:
    """The casing choice, the word2vec window's chosen settings, and where the authors' columns come from."""
    from elmokit.analysis.senses import CASINGS

    settings = Counter(
        (
            str(results[w]["static"][c]["settings"]["window"] or "sentence"),
            results[w]["static"][c]["settings"]["include_target"],
        )
        for w in words
        for c in ("1nn", "centroid")
    )
    return [
        "Casing of the lower-cased text for the cased biLM, 5-fold CV on train (layer average, mean "
        "macro-F1 % over the words): "
        + "; ".join(
            f"`{c}` 1-NN {100 * casing_cv[c]['1nn']:.1f}, centroid {100 * casing_cv[c]['centroid']:.1f}"
            for c in CASINGS
        )
        + f" → `{casing}`.",
        "word2vec window baseline: 300-d skip-gram vectors of the biLM's training text, mean over ±window "
        "tokens or the whole (cut) sentence, target included or not, both chosen per word and classifier "
        "by 5-fold CV on train; "
        "chosen (window, target included) × count: "
        + ", ".join(f"({w_}, {t_}) × {n}" for (w_, t_), n in sorted(settings.items(), key=lambda x: -x[1]))
        + ".",
        'Authors\' columns: SOURCE.md "Baselines", recomputed there from the released predictions of '
        'Loureiro et al. (2021): "1NN" = nearest sense centroid of BERT vectors (sum of the last 4 '
        "layers); FTX = supervised fastText classifiers (not a nearest-neighbour method).",
    ]


def report(run: Run, casing: str, casing_cv: dict, results: dict, fair: dict, authors: dict) -> tuple[str, float]:
    """``(the tables as Markdown text, wall seconds so far)``: the fair protocol's summary, the old protocol's
    tables and notes, the fair protocol per word and its choices, the wall time."""
    args, words = run.args, run.words
    lines = [
        f"CoarseWSD-20 test, fair protocol, average over {len(words)} word(s). Cells: accuracy % / macro-F1 %. "
        f"Model `{args.model}`; casing `{casing}`; ±{args.context} tokens of context.",
        "",
        *summary_table(fair, {w: results[w]["layers"] for w in words}),
        "",
        protocol_note(args.folds, run.windows),
        "",
        "The old protocol's tables follow (fixed layers at the target span; the word2vec window chosen on train).",
        "",
        *centroid_table(args, words, results, authors, casing),
        "",
        *one_nn_table(words, results),
        "",
        *old_protocol_notes(words, results, casing, casing_cv),
    ]
    lines += ["", "Fair protocol per word: test macro-F1 % (word2vec window / ELMo / [ELMo; word2vec]).", ""]
    lines += per_word_table(fair)
    lines += ["", "Settings chosen on train, per word (ELMo: layer or mix, ±window; probe: C, class weights).", ""]
    lines += choices_table(fair)
    lines.append("")
    wall = time.time() - run.t0
    lines.append(
        f"Wall time {wall / 60:.1f} min, of which biLM embedding {run.t_embed / 60:.1f} min (≈ 0 when "
        f"read from $ELMOKIT_CACHE/senses/; {args.threads} torch thread(s)); command: "
        f"`python experiments/senses_coarsewsd.py {' '.join(args.command)}` (models from $ELMOKIT_CACHE unless "
        f"given; model.safetensors sha256 {run.model_key[:12]}…; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)."
    )
    return "\n".join(lines) + "\n", wall


def write_outputs(run: Run, test_w: dict, text: str, wall: float, casing: str, casing_cv: dict, results, fair):
    """senses-bank.png (the bank test occurrences, when bank is among the words), senses-coarsewsd.md and .json."""
    from elmokit.analysis.polysemy import plot_occurrences
    from elmokit.io import atomic_write_text

    args = run.args
    args.out.mkdir(parents=True, exist_ok=True)
    if "bank" in run.words:
        labels = [e.label.removeprefix("bank_") for e in run.test["bank"]]
        plot_occurrences(
            test_w["bank"][0],
            args.out / "senses-bank.png",
            labels,
            title=f"bank: {len(labels)} CoarseWSD-20 test occurrences, {args.model} (PCA per layer)",
        )
    atomic_write_text(args.out / "senses-coarsewsd.md", text)
    atomic_write_text(
        args.out / "senses-coarsewsd.json",
        json.dumps(
            {
                "model": args.model,
                "model_sha256": run.model_key,
                "casing": casing,
                "casing_cv": casing_cv,
                "context": args.context,
                "windows": run.windows,
                "folds": args.folds,
                "words": results,
                "fair": {w: {"mfs": r["mfs"], "families": r["families"]} for w, r in fair.items()},
                "fair_cv": {w: r["choices"] for w, r in fair.items()},
                "wall_seconds": round(wall, 1),
            },
            indent=1,
        )
        + "\n",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command = list(sys.argv[1:] if argv is None else argv)  # printed with the results
    windows = [int(w) for w in args.windows.split(",")]
    if 0 not in windows:
        parser.error("--windows must include 0 (the target span: the old protocol and the casing choice use it)")

    import torch

    torch.set_num_threads(args.threads)
    run = load_run(args, windows, time.time())
    casing, casing_cv, train_w = choose_casing(run)
    test_w = run.vectors(run.test, casing)
    results, fair, authors = score_words(run, casing, train_w, test_w)
    text, wall = report(run, casing, casing_cv, results, fair, authors)
    write_outputs(run, test_w, text, wall, casing, casing_cv, results, fair)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
