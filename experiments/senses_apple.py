"""苹果 (apple the fruit / Apple the company) sense separation with the Chinese biLM (issue 10): prints the
table of docs/explanation/senses.md.

    nice -n 5 python experiments/senses_apple.py --threads 1     # ~1 min on 1 CPU thread (models: $ELMOKIT_CACHE)

Data (:func:`elmokit.analysis.senses.build_apple_set`): the online_shopping_10_cats reviews of 水果 (→ fruit) and
平板, 计算机, 手机 (→ Apple) that hold 苹果, segmented with the zoo tokenizer of ``elmokit-zh`` (jieba, as its
corpus); an occurrence is a sentence position where 苹果 is a whole word token (苹果 inside 小苹果, 苹果皮, 苹果电脑
is another word and is left out; the reviews where it only appears so are counted). The sense label is the review's
category, so it is as noisy as the categories are. Split (:func:`elmokit.analysis.senses.group_split`): by review,
stratified by sense, seed 0, half the reviews of each sense to the queries: a review never feeds both the labelled
memory and the queries. Sentences are cut to ``--context`` tokens on each side (default 30).

Scores: 1-NN and nearest-centroid (cosine) accuracy and macro-F1 for layers 0..L and their average, the MFS, and the
word2vec window baseline (``zoo/elmokit-zh/word2vec``, settings chosen by 5-fold group cross-validation on the
memory).

Fair protocol (issue 27, :mod:`elmokit.analysis.sense_protocol`), as ``senses_coarsewsd.py``: ELMo's layer, fixed mix
and window, the word2vec window's settings and the linear probe's C and class weighting are all chosen by the same
stratified group 5-fold cross-validation on the memory (a review is a group); the queries are read once, for the
chosen settings' scores; the [ELMo; word2vec window] row joins the two parts' choices, each L2-normalised. The old
fixed-layer rows stay in the table beside the new ones.

Another model than the zoo's (a quick check): ``--model DIR --word2vec DIR --segmenter jieba`` (a folder without
``tokenizer.json``: segment the reviews with jieba, as the zoo and quickstart Chinese corpora are).

Writes ``experiments/results/senses-apple.{md,json}`` and ``senses-apple.png`` (the query occurrences);
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

from sense_tables import choices_table, protocol_note, summary_table

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "zh-online-shopping-10cats" / "online_shopping_10_cats.csv"
RESULTS = ROOT / "experiments" / "results"


def _cell(s: dict) -> str:
    return f"{100 * s['accuracy']:.1f} / {100 * s['macro_f1']:.1f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="online_shopping_10_cats.csv (default: %(default)s)")
    parser.add_argument("--model", default="elmokit-zh", help="biLM (default: %(default)s)")
    parser.add_argument("--context", type=int, default=30, help="tokens kept on each side (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="split seed (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    parser.add_argument("--word2vec", type=Path, default=None, help="word2vec folder (default: <model>/word2vec)")
    parser.add_argument(
        "--segmenter",
        choices=("model", "jieba"),
        default="model",
        help="model: the zoo model's recorded tokeniser; jieba: jieba words (default: %(default)s)",
    )
    parser.add_argument(
        "--windows", default="0,2,5", help="ELMo windows (± tokens) offered to the choice (default: %(default)s)"
    )
    parser.add_argument(
        "--folds", type=int, default=5, help="cross-validation folds on the memory (default: %(default)s)"
    )
    return parser


@dataclass
class Split:
    """The sense set and its split: the memory (labelled) and the queries, by review."""

    data: Any
    memory: list
    queries: list
    senses: list[str]
    folder: Path
    model_key: str


@dataclass
class Scores:
    """Everything measured: the window vectors' target-span layers (``mem_v``, ``q_v``), the old protocol's rows
    (``layers``, ``static``, ``mfs``), the fair protocol's result, and the biLM embedding time."""

    mem_v: Any
    q_v: Any
    layers: dict
    fair: dict
    static: dict
    mfs: dict
    t_embed: float


def split_data(args: argparse.Namespace) -> Split:
    """The 苹果 set segmented as ``--segmenter`` says, split by review (half of each sense's reviews to the
    queries)."""
    from elmokit.analysis.senses import build_apple_set, group_split
    from elmokit.data.tokenizers import load_tokenizer, split_chinese, word_tokenizer
    from elmokit.io import file_sha256
    from elmokit.weights.native import resolve_model_name

    folder = Path(resolve_model_name(args.model))
    model_key = file_sha256(folder / "model.safetensors")
    if args.segmenter == "jieba":
        words_of = word_tokenizer("jieba")
        tokenize = lambda text: [t for sent in split_chinese(text) if (t := words_of(sent))]
    else:
        tokenize = load_tokenizer(args.model)
    data = build_apple_set(args.data, tokenize)
    memory, queries = group_split(data.examples, 0.5, args.seed)
    assert not {e.group for e in memory} & {e.group for e in queries}
    senses = sorted({e.label for e in data.examples})
    return Split(data, memory, queries, senses, folder, model_key)


def score(args: argparse.Namespace, windows: list[int], sp: Split) -> Scores:
    """Embed the memory and the queries (cached), score the fixed layers, MFS, and run the fair protocol (ELMo and
    word2vec families); the old word2vec row is the fair protocol's word2vec choice for 1-NN / centroid (same grid,
    folds, tie rule)."""
    from elmokit import Embedder
    from elmokit.analysis.sense_protocol import (
        elmo_candidates,
        fair_protocol,
        static_candidates,
        static_setting_name,
        window_vectors,
    )
    from elmokit.analysis.senses import STATIC_GRID, layer_scores, mfs_scores
    from elmokit.baselines.word2vec import load_word2vec
    from elmokit.weights.native import cache_dir

    memory, queries, senses = sp.memory, sp.queries, sp.senses
    embedder = Embedder(str(sp.folder), batch_size=64)
    cache = cache_dir() / "senses" / "apple"
    t_embed = time.time()
    mem_w = window_vectors(embedder, memory, windows, context=args.context, cache_dir=cache, model_key=sp.model_key)
    q_w = window_vectors(embedder, queries, windows, context=args.context, cache_dir=cache, model_key=sp.model_key)
    mem_v, q_v = mem_w[0], q_w[0]  # the target span: the old protocol's vectors
    t_embed = time.time() - t_embed
    y_mem, y_q = [e.label for e in memory], [e.label for e in queries]
    layers = layer_scores(mem_v, y_mem, q_v, y_q, senses)
    kv = load_word2vec(args.word2vec or sp.folder / "word2vec")
    fam_mem = {"elmo": elmo_candidates(mem_w), "word2vec": static_candidates(kv, memory)}
    fam_q = {"elmo": elmo_candidates(q_w), "word2vec": static_candidates(kv, queries)}
    fair = fair_protocol(fam_mem, fam_q, y_mem, [e.group for e in memory], y_q, senses, folds=args.folds, seed=0)
    grid_of = {static_setting_name(st): st for st in STATIC_GRID}
    static = {}
    for clf in ("1nn", "centroid"):
        got = fair["families"]["word2vec"][clf]
        static[clf] = {
            "accuracy": got["accuracy"],
            "macro_f1": got["macro_f1"],
            "settings": grid_of[got["setting"]],
            "cv_macro_f1": got["cv_macro_f1"],
        }
    mfs = mfs_scores(y_mem, y_q, senses)
    return Scores(mem_v, q_v, layers, fair, static, mfs, t_embed)


def _setting(st: dict) -> str:
    where = "whole (cut) sentence" if st["window"] is None else f"±{st['window']}"
    return f"{where}, target {'in' if st['include_target'] else 'out'}"


def old_table(sc: Scores) -> list[str]:
    """The old protocol's table: MFS, the word2vec window, ELMo's fixed layers at the target."""
    lines = ["| method | 1-NN | nearest centroid |", "|---|---:|---:|"]
    lines.append(f"| MFS (memory's most frequent sense) | {_cell(sc.mfs)} | {_cell(sc.mfs)} |")
    lines.append(
        f"| word2vec window (1-NN: {_setting(sc.static['1nn']['settings'])}; centroid: "
        f"{_setting(sc.static['centroid']['settings'])}) | {_cell(sc.static['1nn'])} | {_cell(sc.static['centroid'])} |"
    )
    for k, r in sc.layers.items():
        name = "layer 0 (static)" if k == "0" else ("layer average" if k == "average" else f"layer {k}")
        lines.append(f"| ELMo {name} | {_cell(r['1nn'])} | {_cell(r['centroid'])} |")
    return lines


def _listing(d: dict) -> str:
    return ", ".join(f"{c} {n}" for c, n in d.items())


def set_notes(args: argparse.Namespace, sp: Split) -> list[str]:
    """The set's counts, the split's and the word2vec window's note."""

    def count(examples):
        c = Counter(e.label for e in examples)
        g = {s: len({e.group for e in examples if e.label == s}) for s in sp.senses}
        return ", ".join(f"{s} {c[s]} ({g[s]} reviews)" for s in sp.senses)

    st = sp.data.stats
    return [
        f"Set: {sum(st['reviews_with_word_token'].values())} reviews with 苹果 as a word token "
        f"({_listing(st['reviews_with_word_token'])}), {len(sp.data.examples)} occurrences; "
        f"{sum(st['reviews_only_inside_other_token'].values())} reviews had 苹果 only inside another word "
        f"({_listing(st['reviews_only_inside_other_token'])}; longer words holding it, all reviews: "
        f"{_listing(dict(list(st['longer_tokens_holding_word'].items())[:6]))}); "
        f"{sum(st['reviews_in_other_categories'].values())} reviews in other categories not used.",
        f"Split (by review, stratified, seed {args.seed}, half of each sense's reviews to the queries): "
        f"memory {count(sp.memory)}; queries {count(sp.queries)}; no review on both sides.",
        "word2vec window: 300-d skip-gram vectors of the biLM's training text averaged over ±window words, "
        "window and target-in/out chosen by 5-fold group CV on the memory (macro-F1).",
    ]


def report_head(args: argparse.Namespace, windows: list[int], sc: Scores) -> list[str]:
    """The title, the fair protocol's summary and choices tables, the protocol's note and the old table's title."""
    return [
        f"苹果 in online_shopping_10_cats, fair protocol (settings chosen on the memory only). Cells: accuracy % / "
        f"macro-F1 % on the queries. Model `{args.model}`; context ±{args.context} tokens.",
        "",
        *summary_table({"苹果": sc.fair}, {"苹果": sc.layers}),
        "",
        *choices_table({"苹果": sc.fair}),
        "",
        protocol_note(args.folds, windows),
        "",
        "The old protocol's table (fixed layers at the target; the word2vec window chosen on the memory):",
        "",
    ]


def write_outputs(args: argparse.Namespace, windows: list[int], sp: Split, sc: Scores, text: str, wall: float) -> None:
    """senses-apple.png (the query occurrences), .md (``text``) and .json in ``--out``."""
    from elmokit.analysis.polysemy import plot_occurrences
    from elmokit.io import atomic_write_text

    y_mem, y_q = [e.label for e in sp.memory], [e.label for e in sp.queries]
    args.out.mkdir(parents=True, exist_ok=True)
    plot_occurrences(
        sc.q_v,
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
                "model_sha256": sp.model_key,
                "context": args.context,
                "seed": args.seed,
                "stats": sp.data.stats,
                "memory": dict(Counter(y_mem)),
                "queries": dict(Counter(y_q)),
                "memory_reviews": len({e.group for e in sp.memory}),
                "query_reviews": len({e.group for e in sp.queries}),
                "mfs": sc.mfs,
                "static": sc.static,
                "layers": sc.layers,
                "windows": windows,
                "folds": args.folds,
                "fair": {"mfs": sc.fair["mfs"], "families": sc.fair["families"]},
                "fair_cv": sc.fair["choices"],
                "wall_seconds": round(wall, 1),
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n",
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    if 0 not in windows:
        parser.error("--windows must include 0 (the target span, as the old protocol reads it)")

    import torch

    torch.set_num_threads(args.threads)
    t0 = time.time()
    sp = split_data(args)
    sc = score(args, windows, sp)
    lines = [*report_head(args, windows, sc), *old_table(sc), "", *set_notes(args, sp)]
    wall = time.time() - t0
    lines.append(
        f"Wall time {wall / 60:.1f} min, of which biLM embedding {sc.t_embed:.0f} s (≈ 0 when read from "
        f"$ELMOKIT_CACHE/senses/; {args.threads} torch thread(s)); command: "
        f"`python experiments/senses_apple.py --threads {args.threads}` (models from $ELMOKIT_CACHE; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end)."
    )
    text = "\n".join(lines) + "\n"
    write_outputs(args, windows, sp, sc, text, wall)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
