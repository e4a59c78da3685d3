"""Issue 27 item 2: compare up to four biLM configurations per language at one equal, short compute budget, on the
zoo recipe's new corpus, before fixing the zoo's 60-minute recipe.

    python experiments/recipe_study.py en --minutes 10        # then: zh
    python experiments/recipe_study.py en --report-only       # the table and curves from the runs on disk

For each language:

1. the zoo corpus (:func:`elmokit.recipes.zoo.corpora.build_corpus`, the recipe's own split and leak filters) into
   ``<work>/<lang>/corpus`` (reused when present), and a fixed held-out subset for the curves: every k-th sentence of
   ``heldout.txt`` so that about ``--heldout-tokens`` tokens are scored (full softmax over the whole vocabulary at
   every point would cost minutes);
2. per configuration (:data:`CONFIGS`, overrides of :data:`BASE`: the zoo spec when the study ran), a **timing
   probe**: 30 steps, 2 threads, the mean time of steps 11-30; the budget ``--minutes`` then fixes the
   configuration's step count, ``steps = minutes · 60 / (s/step)`` (rounded down to 10). The study is judged by
   that step count, so the runs themselves may share the machine: only the probes must run on a quiet one (the
   script prints the load average beside each probe);
3. the run (seeded, deterministic, 2 threads, resumable: an interrupted study continues with ``--resume``'s
   semantics — finished runs are kept, an unfinished one resumes from its newest checkpoint), its held-out subset
   perplexity at step 0 and 5 more points;
4. the interpolated Kneser-Ney 3-gram fitted on ``train.txt`` over the same vocabulary (min_count 3, shared by every
   configuration), scored on the same subset under the biLM's protocol
   (:func:`elmokit.baselines.ngram.kneser_ney_perplexity`).

Output: ``experiments/results/recipe-study-<lang>.{json,md,png}`` — the table (configuration, s/step, steps,
tokens, final held-out perplexity, ratio to KN-3) and the learning curves against budget minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from elmokit.baselines.ngram import kneser_ney_perplexity
from elmokit.io import atomic_write_text
from elmokit.pretraining import TrainConfig, build_trainer
from elmokit.pretraining.hooks import TrainHooks
from elmokit.recipes.zoo.corpora import build_corpus, write_heldout_subset
from elmokit.recipes.zoo.figures import valid_records
from elmokit.recipes.zoo.specs import THREADS
from elmokit.vocabulary import Vocabulary

RESULTS = Path(__file__).resolve().parent / "results"
PROBE_STEPS, PROBE_SKIP = 30, 10
VALID_POINTS = 5

#: A schedule for the short runs: Adam 3e-3, 200 warm-up steps, cosine decay to 0.1 × at the run's last step,
#: no dropout (at 10-60 minutes the run reads each of the new corpus's tokens at most once: nothing to over-fit).
_SCHEDULE = {"lr": 3e-3, "lr_warmup_steps": 200, "lr_schedule": "cosine", "dropout": 0.0}

#: The study's base: the zoo recipe as it was when the study ran (before the zoo took the study's ``fast``
#: configuration), so that a rerun compares the same configurations. ``max_steps`` comes from the budget.
_BASE_TRAIN = {
    "min_count": 3,
    "batching": "sentences",
    "batch_size": 64,
    "unroll_steps": 20,
    "n_epochs": 100,
    "optimizer": "adam",
    "lr": 2e-3,
    "clip_norm": 5.0,
    "n_negative_samples": 4096,
    "seed": 0,
    "shuffle": True,
    "deterministic": True,
    "keep_checkpoints": 2,
    "log_every": 10,
}
_BASE_CNN = {
    "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
    "activation": "relu",
    "embedding": {"dim": 16},
    "n_characters": 262,
    "n_highway": 1,
}
_BASE_LSTM = {
    "dim": 512,
    "projection_dim": 128,
    "n_layers": 2,
    "cell_clip": 3,
    "proj_clip": 3,
    "use_skip_connections": True,
}
BASE: dict[str, tuple[dict, dict]] = {
    "en": (
        {"char_cnn": {**_BASE_CNN, "max_characters_per_token": 50}, "lstm": _BASE_LSTM},
        {**_BASE_TRAIN, "char_vocab": False, "dropout": 0.1},
    ),
    "zh": (
        {"char_cnn": {**_BASE_CNN, "max_characters_per_token": 10}, "lstm": _BASE_LSTM},
        {**_BASE_TRAIN, "char_vocab": True, "dropout": 0.2},
    ),
}

#: name → (what it tests, model overrides {"lstm": {...}, "char_cnn": {...}}, train overrides). ``lr_decay_steps``
#: is set to the run's step count where a decay is asked for.
CONFIGS: dict[str, dict[str, tuple[str, dict, dict]]] = {
    "en": {
        "zoo": ("today's zoo recipe (LSTM 512→128, 64 sentences, Adam 2e-3 constant, dropout 0.1)", {}, {}),
        "schedule": ("zoo + warm-up 200, cosine decay, Adam 3e-3, dropout 0", {}, _SCHEDULE),
        "fast": (
            "schedule + 128 sentences a step, Adam 4e-3, 20 characters a token (more tokens a second)",
            {"char_cnn": {"max_characters_per_token": 20}},
            {**_SCHEDULE, "batch_size": 128, "lr": 4e-3},
        ),
        "wide": ("schedule + LSTM 1024→256", {"lstm": {"dim": 1024, "projection_dim": 256}}, _SCHEDULE),
    },
    "zh": {
        "zoo": ("today's zoo recipe (LSTM 512→128, 64 sentences, Adam 2e-3 constant, dropout 0.2)", {}, {}),
        "schedule": ("zoo + warm-up 200, cosine decay, Adam 3e-3, dropout 0", {}, _SCHEDULE),
        "fast": (
            "schedule + 128 sentences a step, Adam 4e-3 (more tokens a second)",
            {},
            {**_SCHEDULE, "batch_size": 128, "lr": 4e-3},
        ),
        "wide": ("schedule + LSTM 1024→256", {"lstm": {"dim": 1024, "projection_dim": 256}}, _SCHEDULE),
    },
}


def _model(lang: str, overrides: dict) -> dict:
    model = json.loads(json.dumps(BASE[lang][0]))
    for part, values in overrides.items():
        model[part].update(values)
    return model


def _config(lang: str, name: str, work: Path, steps: int, valid: Path | None) -> TrainConfig:
    _, model_over, train_over = CONFIGS[lang][name]
    train = {**BASE[lang][1], **train_over, "max_steps": steps, "checkpoint_every": max(10, steps // 6)}
    if train.get("lr_schedule", "constant") != "constant":
        train["lr_decay_steps"] = steps
    return TrainConfig(
        train_files=[str(work / "corpus" / "train.txt")],
        out_dir=str(work / name),
        model=_model(lang, model_over),
        valid_files=None if valid is None else [str(valid)],
        valid_every=None if valid is None else max(1, steps // VALID_POINTS),
        device="cpu",
        progress=False,
        extra={"study": f"{lang}/{name}"},
        **train,
    )


class _StepTimes(TrainHooks):
    def __init__(self) -> None:
        self.times: list[float] = []

    def after_step(self, trainer) -> None:
        self.times.append(time.perf_counter())


def probe(lang: str, name: str, work: Path) -> dict:
    """Seconds a step of configuration ``name`` (mean of steps 11-30 of a fresh run, 2 threads)."""
    folder = work / f"probe-{name}"
    config = dataclasses.replace(_config(lang, name, work, PROBE_STEPS, None), out_dir=str(folder), log_every=10)
    # the schedule does not change a step's work: the probe keeps the rate constant (its 30 steps hold no decay)
    config = dataclasses.replace(config, lr_schedule="constant", lr_warmup_steps=0, lr_decay_steps=None)
    hooks = _StepTimes()
    load = os.getloadavg()[0]
    trainer = build_trainer(config, hooks=hooks)
    trainer.train(overwrite=True)
    t = hooks.times[PROBE_SKIP - 1 :]
    seconds = (t[-1] - t[0]) / (len(t) - 1)
    shutil.rmtree(folder)
    return {"s_per_step": seconds, "loadavg_before": round(load, 2), "loadavg_after": round(os.getloadavg()[0], 2)}


def heldout_subset(work: Path, tokens: int) -> Path:
    """The curve's held-out subset (:func:`elmokit.recipes.zoo.corpora.write_heldout_subset`: every k-th sentence of
    ``corpus/heldout.txt``, about ``tokens`` tokens), written once."""
    out = work / "corpus" / "heldout-curve.txt"
    if not out.exists():
        write_heldout_subset(work / "corpus", tokens)
    return out


def _finished(folder: Path, steps: int) -> bool:
    return (folder / "model" / "config.json").exists() and any(
        r["step"] == steps for r in valid_records(folder / "metrics.jsonl")
    )


def run(lang: str, name: str, work: Path, steps: int, valid: Path) -> dict:
    folder = work / name
    config = _config(lang, name, work, steps, valid)
    t0 = time.perf_counter()
    if not _finished(folder, steps):
        resume = (folder / "checkpoint.json").exists()
        summary = build_trainer(config).train(resume=resume, overwrite=not resume)
        # tokens read: exact for a run made in one call; a resumed run's summary counts only its own part
        summary["resumed"] = resume
        atomic_write_text(folder / "summary.json", json.dumps(summary, indent=2) + "\n")
    metrics = folder / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.startswith("{")]
    train_rows = [r for r in rows if r.get("kind") == "train"]
    return {
        "steps": steps,
        "seconds_this_call": round(time.perf_counter() - t0, 1),
        "valid": [
            {k: r[k] for k in ("step", "valid_ppl", "valid_ppl_fwd", "valid_ppl_bwd")} for r in valid_records(metrics)
        ],
        "final_train_ppl": train_rows[-1]["train_ppl"] if train_rows else None,
        "batch_size": config.batch_size,
        "train": {
            k: v
            for k, v in dataclasses.asdict(config).items()
            if k not in ("model", "train_files", "out_dir", "valid_files", "extra")
        },
        "model": {"lstm": config.model.to_options()["lstm"], "char_cnn": config.model.to_options()["char_cnn"]},
    }


def kneser_ney(work: Path, valid: Path, vocab_file: Path) -> dict:
    """KN-3 on ``train.txt`` over the runs' vocabulary, scored on the held-out subset (cached in ``kn3.json``)."""
    cache = work / f"kn3-{valid.stem}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    vocab = Vocabulary.from_file(vocab_file)
    with open(work / "corpus" / "train.txt", encoding="utf-8") as f:
        train = [line.split() for line in f if line.strip()]
    held = [line.split() for line in valid.read_text(encoding="utf-8").splitlines() if line.strip()]
    result = kneser_ney_perplexity(train, held, vocab, order=3)
    atomic_write_text(cache, json.dumps(result, indent=2) + "\n")
    return result


def report(lang: str, study: dict) -> str:
    kn = study.get("kneser_ney_3")
    lines = [
        f"Recipe study, {lang}: equal budget {study['minutes']:g} min a configuration (step counts from quiet "
        f"30-step probes, 2 threads); held-out subset {study['heldout_subset']['tokens']:,} tokens "
        f"({study['heldout_subset']['sentences']:,} sentences) of the zoo corpus's held-out split; "
        f"corpus {study['corpus_tokens'] / 1e6:.1f}M training tokens."
        + (f" Kneser-Ney 3-gram (same split, vocabulary): **{kn['average']:.1f}**." if kn else ""),
        "",
        "| configuration | what it tests | s/step (probe) | steps | tokens read | held-out ppl | × KN-3 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in study["configs"].items():
        if "run" not in r:
            continue
        final = r["run"]["valid"][-1]["valid_ppl"] if r["run"]["valid"] else float("nan")
        tokens = r["run"].get("tokens")
        lines.append(
            f"| `{name}` | {r['what']} | {r['probe']['s_per_step']:.3f} | {r['run']['steps']:,} | "
            f"{'' if tokens is None else f'{tokens / 1e6:.2f}M'} | **{final:.1f}** | "
            f"{final / kn['average']:.2f} |"
            if kn
            else f"| `{name}` | {r['what']} | {r['probe']['s_per_step']:.3f} | {r['run']['steps']:,} | "
            f"{'' if tokens is None else f'{tokens / 1e6:.2f}M'} | **{final:.1f}** | — |"
        )
    return "\n".join(lines) + "\n"


def plot(lang: str, study: dict, path: Path) -> None:
    import matplotlib  # optional: the figure only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: the figure only

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, r in study["configs"].items():
        if "run" not in r or not r["run"]["valid"]:
            continue
        sps = r["probe"]["s_per_step"]
        xs = [v["step"] * sps / 60 for v in r["run"]["valid"] if v["step"] > 0]
        ys = [v["valid_ppl"] for v in r["run"]["valid"] if v["step"] > 0]
        ax.plot(xs, ys, marker="o", label=name)
    if study.get("kneser_ney_3"):
        ax.axhline(study["kneser_ney_3"]["average"], color="grey", linestyle="--", label="Kneser-Ney 3-gram")
    ax.set_xlabel("budget minutes (steps × probe s/step)")
    ax.set_ylabel("held-out perplexity (average of directions)")
    ax.set_yscale("log")
    ax.set_title(f"Recipe study, {lang}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# long: one study from corpus to table, each stage resumable
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lang", choices=sorted(CONFIGS))
    p.add_argument("--minutes", type=float, default=10.0, help="the equal budget of every configuration")
    p.add_argument("--configs", default=None, help="comma-separated subset of the configurations (default: all)")
    p.add_argument("--heldout-tokens", type=int, default=20000)
    p.add_argument("--work", type=Path, default=None, help="default: $ELMOKIT_CACHE/study/<lang>")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--probe-only", action="store_true", help="only the timing probes (run them on a quiet machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(THREADS)
    cache = Path(os.environ.get("ELMOKIT_CACHE", Path.home() / ".cache" / "elmokit"))
    work = args.work or cache / "study" / args.lang
    work.mkdir(parents=True, exist_ok=True)
    state_file = work / "study.json"
    study = json.loads(state_file.read_text()) if state_file.exists() else {"minutes": args.minutes, "configs": {}}
    if study["minutes"] != args.minutes:
        sys.exit(f"{state_file} was made with --minutes {study['minutes']:g}; use it or another --work")
    if not (work / "corpus" / "corpus.json").exists():
        build_corpus(args.lang, args.data_dir, work / "corpus")
    manifest = json.loads((work / "corpus" / "corpus.json").read_text())
    study["corpus_tokens"] = manifest["files"]["train.txt"]["tokens"]
    valid = heldout_subset(work, args.heldout_tokens)
    held = [x.split() for x in valid.read_text(encoding="utf-8").splitlines() if x.strip()]
    study["heldout_subset"] = {"file": valid.name, "sentences": len(held), "tokens": sum(len(s) + 1 for s in held)}
    names = args.configs.split(",") if args.configs else list(CONFIGS[args.lang])

    def save() -> None:
        atomic_write_text(state_file, json.dumps(study, indent=2) + "\n")

    if not args.report_only:
        for name in names:
            entry = study["configs"].setdefault(name, {"what": CONFIGS[args.lang][name][0]})
            if "probe" not in entry:
                entry["probe"] = probe(args.lang, name, work)
                save()
                print(f"[{args.lang}/{name}] probe {entry['probe']}", flush=True)
        if args.probe_only:
            return 0
        for name in names:
            entry = study["configs"][name]
            steps = int(args.minutes * 60 / entry["probe"]["s_per_step"]) // 10 * 10
            print(f"[{args.lang}/{name}] {steps} steps", flush=True)
            entry["run"] = run(args.lang, name, work, steps, valid)
            save()
        first = work / names[0] / "model" / "vocab.txt"
        study["kneser_ney_3"] = kneser_ney(work, valid, first)
        save()
    for name, entry in study["configs"].items():
        metrics = work / name / "metrics.jsonl"
        if "run" in entry and metrics.exists():
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.startswith("{")]
            per_step = [r for r in rows if r.get("kind") == "train"]
            summary = work / name / "summary.json"
            entry["run"]["tokens"] = json.loads(summary.read_text())["tokens"] if summary.exists() else None
            entry["run"]["logged_steps"] = len(per_step)
    save()
    RESULTS.mkdir(exist_ok=True)
    table = report(args.lang, study)
    atomic_write_text(RESULTS / f"recipe-study-{args.lang}.md", table)
    atomic_write_text(RESULTS / f"recipe-study-{args.lang}.json", json.dumps(study, indent=2) + "\n")
    plot(args.lang, study, RESULTS / f"recipe-study-{args.lang}.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
