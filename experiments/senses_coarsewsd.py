"""CoarseWSD-20 sense separation with the English biLM (issue 10): prints the README's tables.

    ELMOKIT_CACHE=/work/cache nice -n 5 python experiments/senses_coarsewsd.py     # ~5 min on 1 CPU thread

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

Writes ``experiments/results/senses-coarsewsd.{md,json}`` and ``senses-bank.png`` (the 455 bank test occurrences);
embeddings are cached under ``$ELMOKIT_CACHE/senses/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from elmokit.threads import default_threads  # (imports elmokit before torch: its OpenMP wait setting applies)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "coarsewsd-20"
RESULTS = ROOT / "experiments" / "results"


def _cell(s: dict) -> str:
    return f"{100 * s['accuracy']:.1f} / {100 * s['macro_f1']:.1f}"


def _pct(pair) -> str:
    return f"{pair[0]:.1f} / {pair[1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="CoarseWSD-20 folder (default: %(default)s)")
    parser.add_argument("--model", default="elmokit-en", help="biLM (default: %(default)s)")
    parser.add_argument("--context", type=int, default=30, help="tokens kept on each side (default: %(default)s)")
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads(),
        help="torch threads (default: %(default)s, elmokit's default; the README's tables were made "
        "with --threads 1, which repeats them exactly)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    parser.add_argument("--words", default=None, help="comma-separated subset (default: all 20)")
    args = parser.parse_args(argv)

    import torch

    from elmokit import Embedder
    from elmokit.analysis.polysemy import plot_occurrences
    from elmokit.analysis.senses import (
        CASINGS,
        SenseExample,
        centroid_predict,
        choose_static_settings,
        coarsewsd_senses,
        coarsewsd_words,
        cv_folds,
        cv_score,
        example_vectors,
        layer_scores,
        mfs_scores,
        nn1_predict,
        read_coarsewsd,
        read_coarsewsd_baselines,
        recase,
        scores,
        static_context_vectors,
        truecase_table,
    )
    from elmokit.baselines.word2vec import load_word2vec
    from elmokit.io import atomic_write_text, file_sha256
    from elmokit.weights.native import cache_dir, resolve_model_name

    torch.set_num_threads(args.threads)
    t0 = time.time()
    folder = Path(resolve_model_name(args.model))
    model_key = file_sha256(folder / "model.safetensors")
    cache = cache_dir() / "senses" / "coarsewsd"
    embedder = Embedder(str(folder), batch_size=64)
    words = coarsewsd_words(args.data) if args.words is None else args.words.split(",")
    senses = {w: coarsewsd_senses(args.data, w) for w in words}
    train = {w: read_coarsewsd(args.data, w, "train") for w in words}
    test = {w: read_coarsewsd(args.data, w, "test") for w in words}

    counts: Counter[str] = Counter()
    with open(folder / "corpus" / "train.txt", encoding="utf-8") as fh:
        for line in fh:
            counts.update(line.split())
    table = truecase_table(counts)

    def cased(examples, casing):
        return [SenseExample(recase(e.tokens, casing, table), e.start, e.end, e.label, e.group) for e in examples]

    t_embed = [0.0]

    def vectors(examples_by_word, casing):
        start = time.time()
        flat = [e for w in words for e in cased(examples_by_word[w], casing)]
        arr = example_vectors(embedder, flat, context=args.context, cache_dir=cache, model_key=model_key)
        out, a = {}, 0
        for w in words:
            out[w] = arr[a : a + len(examples_by_word[w])]
            a += len(examples_by_word[w])
        t_embed[0] += time.time() - start
        return out

    # ---- casing, chosen by cross-validation on train
    folds = {w: cv_folds([e.label for e in train[w]], [e.group for e in train[w]], 5, 0) for w in words}
    casing_cv = {}
    train_vecs = {}
    for casing in CASINGS:
        v = vectors(train, casing)
        train_vecs[casing] = v
        per = {
            clf: float(np.mean([cv_score(v[w].mean(axis=1), train[w], senses[w], folds[w], clf) for w in words]))
            for clf in ("1nn", "centroid")
        }
        casing_cv[casing] = {**per, "mean": (per["1nn"] + per["centroid"]) / 2}
        print(
            f"# casing {casing}: train 5-fold CV macro-F1 (layer average) 1-NN {100 * per['1nn']:.1f}, centroid "
            f"{100 * per['centroid']:.1f} ({time.time() - t0:.0f} s)",
            file=sys.stderr,
        )
    casing = max(CASINGS, key=lambda c: (casing_cv[c]["mean"], -CASINGS.index(c)))
    train_v = train_vecs[casing]
    test_v = vectors(test, casing)

    # ---- scores
    kv = load_word2vec(folder / "word2vec")
    authors = read_coarsewsd_baselines(args.data / "SOURCE.md")
    results = {}
    for w in words:
        y_mem = [e.label for e in train[w]]
        y_q = [e.label for e in test[w]]
        tr_c, te_c = cased(train[w], casing), cased(test[w], casing)
        chosen = choose_static_settings(kv, tr_c, senses[w], folds=5, seed=0)
        static = {}
        for clf, predict in (("1nn", nn1_predict), ("centroid", centroid_predict)):
            st = chosen[clf]["settings"]
            mem_s = static_context_vectors(kv, tr_c, **st)
            q_s = static_context_vectors(kv, te_c, **st)
            static[clf] = {
                **scores(y_q, predict(mem_s, y_mem, q_s), senses[w]),
                "settings": st,
                "cv_macro_f1": chosen[clf]["cv_macro_f1"],
            }
        results[w] = {
            "n_train": len(y_mem),
            "n_test": len(y_q),
            "senses": senses[w],
            "mfs": mfs_scores(y_mem, y_q, senses[w]),
            "static": static,
            "layers": layer_scores(train_v[w], y_mem, test_v[w], y_q, senses[w]),
        }
    layer_keys = list(results[words[0]]["layers"])

    def avg(get) -> dict:
        return {m: float(np.mean([get(results[w])[m] for w in words])) for m in ("accuracy", "macro_f1")}

    # ---- tables
    names = {
        k: ("layer 0 (static)" if k == "0" else ("layer avg" if k == "average" else f"layer {k}")) for k in layer_keys
    }
    cols_a = ["MFS", "word2vec window, centroid"] + [f"ELMo {names[k]}" for k in layer_keys]
    author_cols = authors["columns"][1:]  # their MFS column is ours recomputed; keep the authors' methods
    lines = []
    lines.append(
        f"CoarseWSD-20 test, nearest sense centroid (cosine). Cells: accuracy % / macro-F1 %. Model "
        f"`{args.model}`; casing: `{casing}` (chosen on train); each sentence cut to ±{args.context} tokens "
        "around the target."
    )
    lines.append("")
    head = ["word", "train/test"] + cols_a + [f"authors: {c}" for c in author_cols]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|---:|" + "---:|" * (len(head) - 2))
    for w in words:
        r = results[w]
        row = [w, f"{r['n_train']}/{r['n_test']}", _cell(r["mfs"]), _cell(r["static"]["centroid"])]
        row += [_cell(r["layers"][k]["centroid"]) for k in layer_keys]
        row += [_pct(authors["rows"][w][c]) if w in authors["rows"] else "—" for c in author_cols]
        lines.append("| " + " | ".join(row) + " |")
    row = ["**average**", "", _cell(avg(lambda r: r["mfs"])), _cell(avg(lambda r: r["static"]["centroid"]))]
    row += [_cell(avg(lambda r, k=k: r["layers"][k]["centroid"])) for k in layer_keys]
    row += [_pct(authors["rows"]["avg"][c]) if len(words) == 20 else "—" for c in author_cols]
    lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "CoarseWSD-20 test, 1-NN (cosine, nearest single training occurrence). Cells: accuracy % / macro-F1 %."
    )
    lines.append("")
    head = ["word", "MFS", "word2vec window, 1-NN"] + [f"ELMo {names[k]}" for k in layer_keys]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|" + "---:|" * (len(head) - 1))
    for w in words:
        r = results[w]
        row = [w, _cell(r["mfs"]), _cell(r["static"]["1nn"])] + [_cell(r["layers"][k]["1nn"]) for k in layer_keys]
        lines.append("| " + " | ".join(row) + " |")
    row = ["**average**", _cell(avg(lambda r: r["mfs"])), _cell(avg(lambda r: r["static"]["1nn"]))]
    row += [_cell(avg(lambda r, k=k: r["layers"][k]["1nn"])) for k in layer_keys]
    lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "Casing of the lower-cased text for the cased biLM, 5-fold CV on train (layer average, mean "
        "macro-F1 % over the words): "
        + "; ".join(
            f"`{c}` 1-NN {100 * casing_cv[c]['1nn']:.1f}, centroid {100 * casing_cv[c]['centroid']:.1f}"
            for c in CASINGS
        )
        + f" → `{casing}`."
    )
    settings = Counter(
        (
            str(results[w]["static"][c]["settings"]["window"] or "sentence"),
            results[w]["static"][c]["settings"]["include_target"],
        )
        for w in words
        for c in ("1nn", "centroid")
    )
    lines.append(
        "word2vec window baseline: 300-d skip-gram vectors of the biLM's training text, mean over ±window "
        "tokens or the whole (cut) sentence, target included or not, both chosen per word and classifier "
        "by 5-fold CV on train; "
        "chosen (window, target included) × count: "
        + ", ".join(f"({w_}, {t_}) × {n}" for (w_, t_), n in sorted(settings.items(), key=lambda x: -x[1]))
        + "."
    )
    lines.append(
        'Authors\' columns: SOURCE.md "Baselines", recomputed there from the released predictions of '
        'Loureiro et al. (2021): "1NN" = nearest sense centroid of BERT vectors (sum of the last 4 '
        "layers); FTX = supervised fastText classifiers (not a nearest-neighbour method)."
    )
    wall = time.time() - t0
    lines.append(
        f"Wall time {wall / 60:.1f} min, of which biLM embedding {t_embed[0] / 60:.1f} min (≈ 0 when "
        f"read from $ELMOKIT_CACHE/senses/; {args.threads} torch thread(s)); command: "
        "`ELMOKIT_CACHE=/work/cache python experiments/senses_coarsewsd.py`."
    )
    text = "\n".join(lines) + "\n"

    # ---- plot: bank test occurrences
    args.out.mkdir(parents=True, exist_ok=True)
    if "bank" in words:
        labels = [e.label.removeprefix("bank_") for e in test["bank"]]
        plot_occurrences(
            test_v["bank"],
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
                "model_sha256": model_key,
                "casing": casing,
                "casing_cv": casing_cv,
                "context": args.context,
                "words": results,
                "wall_seconds": round(wall, 1),
            },
            indent=1,
        )
        + "\n",
    )
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
