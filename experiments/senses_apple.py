"""苹果 (apple the fruit / Apple the company) sense separation with the Chinese biLM (issue 10): prints the README's
table.

    ELMOKIT_CACHE=/work/cache nice -n 5 python experiments/senses_apple.py     # ~1 min on 1 CPU thread

Data (:func:`elmokit.analysis.senses.build_apple_set`): the online_shopping_10_cats reviews of 水果 (→ fruit) and
平板, 计算机, 手机 (→ Apple) that hold 苹果, segmented with the zoo tokenizer of ``elmokit-zh`` (jieba, as its
corpus); an occurrence is a sentence position where 苹果 is a whole word token (苹果 inside 小苹果, 苹果皮, 苹果电脑
is another word and is left out; the reviews where it only appears so are counted). The sense label is the review's
category, so it is as noisy as the categories are. Split (:func:`elmokit.analysis.senses.group_split`): by review,
stratified by sense, seed 0, half the reviews of each sense to the queries: a review never feeds both the labelled
memory and the queries. Sentences are cut to ``--context`` tokens on each side (default 30).

Scores: 1-NN and nearest-centroid (cosine) accuracy and macro-F1 for layers 0..L and their average, the MFS, and the
word2vec window baseline (``zoo/elmokit-zh/word2vec``, settings chosen by 5-fold group cross-validation on the
memory). Writes ``experiments/results/senses-apple.{md,json}`` and ``senses-apple.png`` (the query occurrences);
embeddings are cached under ``$ELMOKIT_CACHE/senses/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "zh-online-shopping-10cats" / "online_shopping_10_cats.csv"
RESULTS = ROOT / "experiments" / "results"


def _cell(s: dict) -> str:
    return f"{100 * s['accuracy']:.1f} / {100 * s['macro_f1']:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="online_shopping_10_cats.csv (default: %(default)s)")
    parser.add_argument("--model", default="elmokit-zh", help="biLM (default: %(default)s)")
    parser.add_argument("--context", type=int, default=30, help="tokens kept on each side (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    args = parser.parse_args(argv)

    import torch

    from elmokit import Embedder
    from elmokit.analysis.polysemy import plot_occurrences
    from elmokit.analysis.senses import (
        build_apple_set,
        centroid_predict,
        choose_static_settings,
        example_vectors,
        group_split,
        layer_scores,
        mfs_scores,
        nn1_predict,
        scores,
        static_context_vectors,
    )
    from elmokit.baselines.word2vec import load_word2vec
    from elmokit.data.tokenizers import load_tokenizer
    from elmokit.io import atomic_write_text, file_sha256
    from elmokit.weights.native import cache_dir, resolve_model_name

    torch.set_num_threads(args.threads)
    t0 = time.time()
    folder = Path(resolve_model_name(args.model))
    model_key = file_sha256(folder / "model.safetensors")
    data = build_apple_set(args.data, load_tokenizer(args.model))
    memory, queries = group_split(data.examples, 0.5, args.seed)
    assert not {e.group for e in memory} & {e.group for e in queries}
    senses = sorted({e.label for e in data.examples})
    embedder = Embedder(str(folder), batch_size=64)
    cache = cache_dir() / "senses" / "apple"
    t_embed = time.time()
    mem_v = example_vectors(embedder, memory, context=args.context, cache_dir=cache, model_key=model_key)
    q_v = example_vectors(embedder, queries, context=args.context, cache_dir=cache, model_key=model_key)
    t_embed = time.time() - t_embed
    y_mem, y_q = [e.label for e in memory], [e.label for e in queries]
    layers = layer_scores(mem_v, y_mem, q_v, y_q, senses)
    kv = load_word2vec(folder / "word2vec")
    chosen = choose_static_settings(kv, memory, senses, folds=5, seed=0)
    static = {}
    for clf, predict in (("1nn", nn1_predict), ("centroid", centroid_predict)):
        st = chosen[clf]["settings"]
        static[clf] = {
            **scores(
                y_q,
                predict(static_context_vectors(kv, memory, **st), y_mem, static_context_vectors(kv, queries, **st)),
                senses,
            ),
            "settings": st,
            "cv_macro_f1": chosen[clf]["cv_macro_f1"],
        }
    mfs = mfs_scores(y_mem, y_q, senses)

    def count(examples):
        c = Counter(e.label for e in examples)
        g = {s: len({e.group for e in examples if e.label == s}) for s in senses}
        return ", ".join(f"{s} {c[s]} ({g[s]} reviews)" for s in senses)

    st = data.stats
    lines = [
        f"苹果 in online_shopping_10_cats: fruit (水果) vs Apple (平板, 计算机, 手机). Cells: accuracy % / "
        f"macro-F1 % on the queries. Model `{args.model}`; context ±{args.context} tokens.",
        "",
    ]
    head = ["method", "1-NN", "nearest centroid"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|---:|---:|")
    lines.append(f"| MFS (memory's most frequent sense) | {_cell(mfs)} | {_cell(mfs)} |")

    def setting(st: dict) -> str:
        where = "whole (cut) sentence" if st["window"] is None else f"±{st['window']}"
        return f"{where}, target {'in' if st['include_target'] else 'out'}"

    lines.append(
        f"| word2vec window (1-NN: {setting(static['1nn']['settings'])}; centroid: "
        f"{setting(static['centroid']['settings'])}) | {_cell(static['1nn'])} | {_cell(static['centroid'])} |"
    )
    for k, r in layers.items():
        name = "layer 0 (static)" if k == "0" else ("layer average" if k == "average" else f"layer {k}")
        lines.append(f"| ELMo {name} | {_cell(r['1nn'])} | {_cell(r['centroid'])} |")
    lines.append("")

    def listing(d: dict) -> str:
        return ", ".join(f"{c} {n}" for c, n in d.items())

    lines.append(
        f"Set: {sum(st['reviews_with_word_token'].values())} reviews with 苹果 as a word token "
        f"({listing(st['reviews_with_word_token'])}), {len(data.examples)} occurrences; "
        f"{sum(st['reviews_only_inside_other_token'].values())} reviews had 苹果 only inside another word "
        f"({listing(st['reviews_only_inside_other_token'])}; longer words holding it, all reviews: "
        f"{listing(dict(list(st['longer_tokens_holding_word'].items())[:6]))}); "
        f"{sum(st['reviews_in_other_categories'].values())} reviews in other categories not used."
    )
    lines.append(
        f"Split (by review, stratified, seed {args.seed}, half of each sense's reviews to the queries): "
        f"memory {count(memory)}; queries {count(queries)}; no review on both sides."
    )
    lines.append(
        "word2vec window: 300-d skip-gram vectors of the biLM's training text averaged over ±window words, "
        "window and target-in/out chosen by 5-fold group CV on the memory (macro-F1)."
    )
    wall = time.time() - t0
    lines.append(
        f"Wall time {wall / 60:.1f} min, of which biLM embedding {t_embed:.0f} s (≈ 0 when read from "
        f"$ELMOKIT_CACHE/senses/; {args.threads} torch thread(s)); command: "
        "`ELMOKIT_CACHE=/work/cache python experiments/senses_apple.py`."
    )
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    plot_occurrences(
        q_v,
        args.out / "senses-apple.png",
        y_q,
        title=f"pingguo ('apple'): {len(y_q)} query occurrences, {args.model} (PCA per layer)",
    )
    atomic_write_text(args.out / "senses-apple.md", text)
    atomic_write_text(
        args.out / "senses-apple.json",
        json.dumps(
            {
                "model": args.model,
                "model_sha256": model_key,
                "context": args.context,
                "seed": args.seed,
                "stats": st,
                "memory": dict(Counter(y_mem)),
                "queries": dict(Counter(y_q)),
                "memory_reviews": len({e.group for e in memory}),
                "query_reviews": len({e.group for e in queries}),
                "mfs": mfs,
                "static": static,
                "layers": layers,
                "wall_seconds": round(wall, 1),
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n",
    )
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
