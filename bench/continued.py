"""Continued pretraining pays: a biLM trained on corpus A and then on corpus B beats one trained on B from scratch for
the same number of steps on B, by held-out perplexity on B (full softmax).

* corpus A: WikiText-2 valid + test (``../shared/data/wikitext-2``), lower-cased and cut into sentences at " . "
  (Wikipedia);
* corpus B: PTB valid (``../shared/data/ptb-mikolov``) for training, the first ``--heldout-lines`` of PTB test held
  out (Wall Street Journal news);
* the same small architecture, optimiser and batch for every run (``--steps-a`` steps on A; then ``--steps-b`` on B
  with ``--init-from`` the A model — a new softmax over B's vocabulary, the biLM kept — against ``--steps-b`` on B
  from a random initialisation). Both B runs use B's vocabulary (words seen twice) and evaluate B's held-out text every
  ``--steps-b / 5`` steps.

Run: ``python bench/continued.py [--steps-a 200] [--steps-b 100] [--threads 2]`` (about a minute or two on 2 cores
with the defaults). Prints a table, then one JSON line: the figures and the ratio continued / scratch of the final
held-out average perplexity (below 1: continued pretraining wins).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from elmokit.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmokit.pretraining.trainer import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def architecture() -> ElmoConfig:
    """Small enough for a CPU minute: char CNN 128 filters, 1 highway, LSTM 256 → 64, 2 layers, skip connections."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 16), (2, 16), (3, 32), (4, 64)],
            n_highway=1,
            embedding_dim=8,
            n_characters=262,
            max_characters_per_token=20,
            activation="relu",
        ),
        lstm=LSTMConfig(
            dim=256, projection_dim=64, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True
        ),
    )


def corpus_a(path: Path) -> int:
    text = "".join((SHARED / "wikitext-2" / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt"))
    sentences = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("="):
            continue
        for piece in line.lower().split(" . "):
            tokens = piece.split()
            if len(tokens) >= 3:
                sentences.append(" ".join(tokens + ["."]))
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return len(sentences)


def run(name: str, train: Path, out: Path, steps: int, args, **kw) -> dict:
    config = TrainConfig(
        train_files=[str(train)],
        out_dir=str(out),
        batch_size=args.batch_size,
        n_epochs=1000,
        max_steps=steps,
        optimizer="adam",
        lr=2e-3,
        dropout=0.1,
        n_negative_samples=0,
        min_count=2,
        seed=args.seed,
        checkpoint_every=10_000,
        log_every=10,
        progress=False,
        device="cpu",
        **kw,
    )
    start = time.perf_counter()
    summary = Trainer(config).train()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], round(r["valid_ppl"], 2)) for r in rows if r["kind"] == "valid"]
    return {
        "run": name,
        "steps": summary["steps"],
        "seconds": round(time.perf_counter() - start, 1),
        "valid": summary.get("valid"),
        "curve": curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps-a", type=int, default=200, help="steps on corpus A (WikiText-2)")
    ap.add_argument("--steps-b", type=int, default=100, help="steps on corpus B (PTB), for both B runs")
    ap.add_argument("--batch-size", type=int, default=32, help="sentences per step")
    ap.add_argument("--heldout-lines", type=int, default=500, help="PTB test lines held out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = architecture().to_options()
    with tempfile.TemporaryDirectory(prefix="elmokit-continued-") as tmp:
        tmp = Path(tmp)
        n_a = corpus_a(tmp / "a.txt")
        ptb = SHARED / "ptb-mikolov"
        (tmp / "b.txt").write_text((ptb / "ptb.valid.txt").read_text(encoding="utf-8"), encoding="utf-8")
        held = (ptb / "ptb.test.txt").read_text(encoding="utf-8").splitlines()[: args.heldout_lines]
        (tmp / "held.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
        every = max(1, args.steps_b // 5)
        on_b = dict(valid_files=[str(tmp / "held.txt")], valid_every=every)
        a = run("A from scratch", tmp / "a.txt", tmp / "a", args.steps_a, args, model=model)
        scratch = run("B from scratch", tmp / "b.txt", tmp / "scratch", args.steps_b, args, model=model, **on_b)
        continued = run(
            "A, then B (--init-from)",
            tmp / "b.txt",
            tmp / "continued",
            args.steps_b,
            args,
            init_from=str(tmp / "a" / "model"),
            **on_b,
        )
    print(
        f"corpus A: WikiText-2 valid+test, {n_a} sentences; corpus B: PTB valid; held out: {len(held)} lines of "
        f"PTB test; {args.batch_size} sentences a step"
    )
    print(f"{'run':28s}{'steps on A':>11s}{'steps on B':>11s}{'held-out ppl on B (fwd / bwd / avg)':>40s}{'s':>7s}")
    for r, steps_a in ((scratch, 0), (continued, args.steps_a)):
        v = r["valid"]
        figures = f"{v['valid_ppl_fwd']:.1f} / {v['valid_ppl_bwd']:.1f} / {v['valid_ppl']:.1f}"
        seconds = r["seconds"] + (a["seconds"] if steps_a else 0)
        print(f"{r['run']:28s}{steps_a:>11d}{r['steps']:>11d}{figures:>40s}{seconds:>7.1f}")
    print(f"held-out curve on B (step, average): scratch {scratch['curve']}")
    print(f"                                     continued {continued['curve']}")
    ratio = continued["valid"]["valid_ppl"] / scratch["valid"]["valid_ppl"]
    print(
        json.dumps(
            {
                "steps_a": args.steps_a,
                "steps_b": args.steps_b,
                "batch_size": args.batch_size,
                "threads": torch.get_num_threads(),
                "scratch": scratch["valid"],
                "continued": continued["valid"],
                "scratch_curve": scratch["curve"],
                "continued_curve": continued["curve"],
                "seconds": {"a": a["seconds"], "scratch": scratch["seconds"], "continued": continued["seconds"]},
                "ratio": ratio,
            }
        )
    )


if __name__ == "__main__":
    main()
