"""Downstream tables: frozen ELMo against static vectors, a task-trained char CNN and a random-weight biLM.

One script, one table per ``--task`` (``weibo``, ``sst2``, ``sst5``, ``conll2003``, ``ewt``); each row is the same
model, data and budget (configs/tasks/<task>.toml) with one change:

* ``static`` — word2vec only (the zoo model's, trained on the biLM's own pretraining text);
* ``static + char CNN`` — plus a task-trained character CNN (the paper's baselines have character features);
* ``static + ELMo`` — plus a learned mix of the pretrained biLM's layers (frozen, layers cached once);
* ``static + random biLM`` — the same biLM architecture with random weights (features.random_bilm_like): the control
  that shows whether a gain comes from pretraining or from the extra architecture.

Each row runs 3 seeds (initialisation, batch order, dropout) and reports the test score's mean ± sample std; a gain
over a row is claimed only when the difference of means exceeds the sum of the two stds. The biLM layers are cached
under $ELMOKIT_CACHE/features/ (default ~/.cache/elmokit; never in git), so rows and seeds reuse them. Writes
experiments/results/downstream-<task>.md/.json and downstream-<task>-layers.png, prints the table last.

    nice -n 5 python experiments/downstream.py --task sst2        # models and features from $ELMOKIT_CACHE
"""

from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import elmokit  # noqa: E402,F401  (before torch: elmokit's OpenMP wait setting applies, see elmokit.modules.threads)
from elmokit.modules.threads import default_threads  # noqa: E402
from elmokit.tasks.config import load_task_config  # noqa: E402
from elmokit.tasks.report import mean_std, plot_layer_weights, results_table, write_results  # noqa: E402
from elmokit.tasks.training import prepare_task, train_from_config  # noqa: E402
from elmokit.weights.native import cache_dir  # noqa: E402

TASKS = {
    "weibo": ("weibo-ner.toml", "Weibo NER (Chinese, weiboNER_2nd_conll)", "test entity F1"),
    "sst2": ("sst2.toml", "SST-2 (stsa.binary)", "test accuracy"),
    "sst5": ("sst5.toml", "SST-5 (stsa.fine)", "test accuracy"),
    "conll2003": ("conll2003.toml", "CoNLL-2003 English NER", "test entity F1"),
    "ewt": ("ewt-upos.toml", "UD English-EWT UPOS", "test accuracy"),
}
SHORT = {"weibo": "Weibo NER", "sst2": "SST-2", "sst5": "SST-5", "conll2003": "CoNLL-2003", "ewt": "EWT UPOS"}
ROWS = {
    "static": {"bilm.model": "none", "bilm.at_output": False},
    "static + char CNN": {"bilm.model": "none", "bilm.at_output": False, "char_cnn.enabled": True},
    "static + ELMo": {},
    "static + random biLM": {"bilm.model": "random"},
    # the paper's setting: ELMo added to a baseline that has character features (run with --rows, not by default)
    "static + char CNN + ELMo": {"char_cnn.enabled": True},
}
DEFAULT_ROWS = ["static", "static + char CNN", "static + ELMo", "static + random biLM"]


def say(text: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {text}", flush=True)


def run_row(config, name: str, seeds: list[int]) -> dict:
    start = time.perf_counter()
    prepared = prepare_task(config, log=lambda m: say(f"  {name}: {m}"))  # data, biLM, vectors, layers: once a row
    runs = []
    for seed in seeds:
        t0 = time.perf_counter()
        model = train_from_config(
            config,
            seed=seed,
            prepared=prepared,
            log=lambda m: say(f"  {name} seed {seed}: {m}"),  # noqa: B023
        )
        r = model.results
        runs.append(
            {
                "seed": seed,
                "test": r["test"]["score"],
                "dev": r["dev"]["score"],
                "best_epoch": r["best_epoch"],
                "epochs_run": len(model.history),
                "train_seconds": r["train_seconds"],
                "seconds": round(time.perf_counter() - t0, 1),
                "mix_weights": r["mix_weights"],
                "per_type": r["test"].get("per_type"),
            }
        )
        say(
            f"{name} seed {seed}: test {r['test']['score']:.2f}, dev {r['dev']['score']:.2f} "
            f"(best epoch {r['best_epoch']}, {runs[-1]['seconds']:.0f} s)"
        )
    seconds = time.perf_counter() - start
    say(f"row {name!r}: {seconds / 60:.1f} min for {len(seeds)} seeds")
    return {"name": name, "runs": runs, "seconds": seconds, "bilm": prepared.bilm_record}


def plot_rows(task: str, rows: list[dict], out: Path, n_seeds: int) -> None:
    """The layer-weight PNG: mean softmax(s) over seeds per ELMo row (plotted through log, as the plot takes raw s);
    ``rows`` are the JSON rows (``name``/``row`` and ``runs`` with ``mix_weights``)."""
    weights, gammas = {}, {}
    for r in rows:
        name = r.get("name") or r.get("row")
        mixes = [run["mix_weights"][0] for run in r["runs"] if run["mix_weights"]]
        if mixes:
            n = len(mixes[0]["weights"])
            mean_w = [sum(m["weights"][j] for m in mixes) / len(mixes) for j in range(n)]
            weights[name.replace("static + ", "")] = [math.log(w) for w in mean_w]
            gammas[name.replace("static + ", "")] = sum(m["gamma"] for m in mixes) / len(mixes)
            say(
                f"{name}: mean softmax(s) = [{', '.join(f'{w:.3f}' for w in mean_w)}], "
                f"gamma = {gammas[name.replace('static + ', '')]:.3f}"
            )
    if weights:
        plot_layer_weights(
            weights, gammas, out / f"downstream-{task}-layers.png", f"{SHORT[task]}: layer weights ({n_seeds} seeds)"
        )


SUMMARY_ORDER = ["conll2003", "ewt", "sst2", "sst5", "weibo"]


def summary_table(results: Path) -> str:
    """One Markdown table of the five tasks' test scores (mean ± std over seeds) from their saved JSON, with each
    task's epochs, training sentences and total minutes: docs/explanation/downstream.md's table."""
    import json

    from elmokit.tasks.report import format_mean_std

    head = (
        ["task (metric; budget)"]
        + list(ROWS)
        + ["ELMo vs static", "ELMo vs char CNN", "ELMo vs random biLM", "char CNN + ELMo vs char CNN"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task in SUMMARY_ORDER:
        path = results / f"downstream-{task}.json"
        if not path.is_file():
            continue
        saved = json.loads(path.read_text(encoding="utf-8"))
        rows = {r["row"]: r for r in saved["rows"]}
        meta = saved["meta"]
        epochs = {r["epochs_run"] for row in saved["rows"] for r in row["runs"]}
        sub = meta.get("train_sentences", "")
        train = f"first {sub.split()[2]} train sentences" if sub.startswith("the first ") else "all train sentences"
        budget = (
            f"≤ {max(epochs)} epochs, {train}, {meta.get('total_minutes')} min for {len(rows)} rows × "
            f"{len(meta.get('seeds', []))} seeds"
        )
        cells = [f"{TASKS[task][1]} ({TASKS[task][2]}; {budget})"]
        cells += [format_mean_std(rows[r]["test"]["mean"], rows[r]["test"]["std"]) if r in rows else "—" for r in ROWS]

        def versus(other: str, mine: str = "static + ELMo") -> str:
            a, b = rows.get(mine), rows.get(other)  # noqa: B023 (called in this iteration)
            if a is None or b is None:
                return "—"
            delta = a["test"]["mean"] - b["test"]["mean"]
            beyond = abs(delta) > a["test"]["std"] + b["test"]["std"]
            return f"{delta:+.1f}" + (" (beyond spread)" if beyond else " (within)")

        cells += [
            versus("static"),
            versus("static + char CNN"),
            versus("static + random biLM"),
            versus("static + char CNN", "static + char CNN + ELMo"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), help="the table to make (required unless --summary)")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print docs/explanation/downstream.md's one-table summary of the five tasks from their JSON (no training)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--rows",
        nargs="+",
        default=DEFAULT_ROWS,
        choices=list(ROWS),
        metavar="ROW",
        help=f"rows to run (default: the four of the issue; also {list(ROWS)[-1]!r})",
    )
    parser.add_argument("--epochs", type=int, default=None, help="override train.epochs of the config")
    parser.add_argument("--max-train-sentences", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    parser.add_argument(
        "--threads",
        type=int,
        default=default_threads(),
        help="torch threads (default: %(default)s, elmokit's default; the documented tables were made "
        "with --threads 1, which repeats them exactly)",
    )
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the layer-weight PNG from the table's JSON (no training)"
    )
    return parser


def load_config(args: argparse.Namespace):
    """The task's config (configs/tasks/<task>.toml) with ``--epochs`` and ``--max-train-sentences`` applied."""
    config = load_task_config(ROOT / "configs" / "tasks" / TASKS[args.task][0])
    if args.epochs is not None:
        config = config.override({"train.epochs": args.epochs})
    if args.max_train_sentences is not None:
        config = config.override({"data.max_train_sentences": args.max_train_sentences})
    return config


def table_rows(rows: list[dict]) -> tuple[list[dict], dict]:
    """``(table rows, stats)``: one table row per run row (test and dev per seed, Δ vs static with its verdict,
    best epochs, minutes), and each row's ``(mean, std)`` of its test scores by name."""
    scores = {r["name"]: [run["test"] for run in r["runs"]] for r in rows}
    stats = {name: mean_std(v) for name, v in scores.items()}
    out = []
    for r in rows:
        name = r["name"]
        mean, std = stats[name]
        row = {
            "row": name,
            "test": scores[name],
            "dev": [run["dev"] for run in r["runs"]],
            "seeds": " ".join(f"{run['test']:.1f}" for run in r["runs"]),
            "best epochs": " ".join(str(run["best_epoch"]) for run in r["runs"]),
            "min / row": round(r["seconds"] / 60, 1),
        }
        if name != "static" and "static" in stats:
            b_mean, b_std = stats["static"]
            gain = mean - b_mean
            row["Δ vs static"] = f"{gain:+.1f}" + (
                " (beyond spread)" if abs(gain) > std + b_std else " (within spread)"
            )
        out.append(row)
    return out, stats


def claims(stats: dict) -> list[str]:
    """One line per comparison of two rows that both ran: the difference of means and whether it is beyond the sum
    of the two sample stds."""
    lines = []
    for a, b in (
        ("static + ELMo", "static"),
        ("static + ELMo", "static + char CNN"),
        ("static + ELMo", "static + random biLM"),
        ("static + random biLM", "static"),
        ("static + char CNN + ELMo", "static + char CNN"),
    ):
        if a in stats and b in stats:
            (ma, sa), (mb, sb) = stats[a], stats[b]
            verdict = (
                "gain beyond the spread"
                if ma - mb > sa + sb
                else ("loss beyond the spread" if mb - ma > sa + sb else "no difference beyond the spread")
            )
            lines.append(f"{a} vs {b}: {ma - mb:+.2f} ({verdict}: |Δ| vs std sum {sa + sb:.2f})")
    return lines


def columns(metric_name: str) -> list[tuple[str, str]]:
    """The table's (key, header) columns."""
    return [
        ("row", "row"),
        ("test", metric_name + " (mean ± std)"),
        ("dev", "dev (mean ± std)"),
        ("seeds", "test per seed"),
        ("Δ vs static", "Δ test vs static"),
        ("best epochs", "best epoch per seed"),
        ("min / row", "minutes / row (3 seeds)"),
    ]


def run_meta(args, argv, config, rows: list[dict], claim_lines: list[str], total: float, load_before) -> dict:
    """The table's metadata: title, columns, the command, the config, model, budget and data, the biLMs, seeds,
    claims, timings and the machine (its load average now, after the runs)."""
    config_file, title, metric_name = TASKS[args.task]
    t = config.train
    return {
        "title": f"{title}: frozen ELMo vs static vectors ({metric_name}, mean ± std over {len(args.seeds)} seeds)",
        "columns": columns(metric_name),
        "command": f"ELMOKIT_CACHE={cache_dir()} nice -n 5 python experiments/downstream.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": f"configs/tasks/{config_file}",
        "model": (
            ("BiLSTM-CRF tagger" if config.task == "tag" else f"BiLSTM classifier, {config.model.pooling} pooling")
            + f", {config.model.layers} x {config.model.hidden} cells per direction, dropout "
            f"{config.model.dropout}; ELMo: one ScalarMix at the input (L2 {config.bilm.l2} on s, dropout "
            f"{config.bilm.dropout}), biLM frozen, layers cached"
        ),
        "budget": (
            f"at most {t.epochs} epochs (early stopping on dev, patience {t.patience}), Adam lr {t.lr}, "
            f"batch {t.batch_size}, clip {t.clip}; the paper trains for many more epochs with larger "
            "models — these are 2-core budgets, so absolute scores are lower"
        ),
        "data": {k: getattr(config.data, k) for k in ("train", "dev", "test")},
        "train_sentences": (
            f"the first {config.data.max_train_sentences:,} sentences of the train file "
            "(data.max_train_sentences: the 2-core budget); dev and test in full"
            if config.data.max_train_sentences
            else "all; dev and test in full"
        ),
        "static_vectors": config.static.vectors,
        "bilms": {r["name"]: (r["bilm"] or {}).get("name") for r in rows},
        "seeds": args.seeds,
        "claims (a gain is claimed only when the difference of means exceeds the sum of the two sample stds)": (
            claim_lines
        ),
        "row_seconds": {r["name"]: round(r["seconds"], 1) for r in rows},
        "total_minutes": round(total / 60, 1),
        "machine": f"2 CPU cores shared with other jobs (load average {load_before[0]:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after), torch {torch.__version__}, {torch.get_num_threads()} threads",
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
    }


def replot(args: argparse.Namespace) -> None:
    """Redraw the layer-weight PNG from the table's saved JSON."""
    import json

    saved = json.loads((args.out / f"downstream-{args.task}.json").read_text(encoding="utf-8"))
    plot_rows(args.task, saved["rows"], args.out, len(saved["meta"]["seeds"]))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.summary:
        print(summary_table(args.out))
        return 0
    if args.task is None:
        parser.error("--task is required (or --summary)")
    torch.set_num_threads(args.threads)
    if args.replot:
        replot(args)
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = load_config(args)
    load_before = os.getloadavg()
    start = time.perf_counter()
    rows = []
    for name in args.rows:
        rows.append(run_row(config.override(ROWS[name]), name, args.seeds))
    total = time.perf_counter() - start

    table, stats = table_rows(rows)
    claim_lines = claims(stats)
    meta = run_meta(args, argv, config, rows, claim_lines, total, load_before)
    stem = args.out / f"downstream-{args.task}"
    json_rows = [dict(row, runs=r["runs"]) for row, r in zip(table, rows)]
    write_results(stem, json_rows, meta, columns=meta["columns"])
    plot_rows(args.task, rows, args.out, len(args.seeds))
    print()
    print(results_table(table, meta["columns"]), end="")
    print("\n".join(claim_lines))
    print(f"total {total / 60:.1f} min; rows: " + ", ".join(f"{r['name']} {r['seconds'] / 60:.1f} min" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
