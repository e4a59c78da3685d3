"""Is training bit-reproducible here? Three runs of the quickstart model on its corpus: straight, straight again, and
stopped/resumed twice (as the quickstart's timing probe does). Prints the largest parameter difference of each pair and
the first logged step whose loss differs, as one JSON line.

Run: ``python bench/determinism.py [--steps 40] [--nondeterministic]``; add ``OMP_NUM_THREADS=1`` to compare.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from elmokit.io import atomic_write_text
from elmokit.pretraining.trainer import TrainConfig, Trainer
from elmokit.recipes.quickstart import load_lee_corpus, quickstart_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--nondeterministic", action="store_true", help="train without deterministic algorithms")
    args = ap.parse_args()
    n = args.steps
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train, _ = load_lee_corpus()
        atomic_write_text(tmp / "train.txt", "".join(" ".join(s) + "\n" for s in train))

        def trainer(name: str) -> Trainer:
            return Trainer(
                TrainConfig(
                    train_files=[str(tmp / "train.txt")],
                    out_dir=str(tmp / name),
                    model=quickstart_config().to_options(),
                    min_count=2,
                    batch_size=32,
                    optimizer="adam",
                    lr=2e-3,
                    clip_norm=5.0,
                    dropout=0.5,
                    n_negative_samples=0,
                    seed=0,
                    log_every=1,
                    device="cpu",
                    progress=False,
                    deterministic=not args.nondeterministic,
                )
            )

        for name, stops in (("a", [n]), ("b", [n]), ("resumed", [5, 25, n])):
            t = trainer(name)
            for i, stop in enumerate(stops):
                t.config.max_steps = stop
                t.train(resume=i > 0)
        params = {x: load_file(str(tmp / x / "model" / "model.safetensors")) for x in ("a", "b", "resumed")}
        losses = {
            x: [json.loads(line)["loss"] for line in (tmp / x / "metrics.jsonl").read_text().splitlines()]
            for x in params
        }

        def compare(x: str, y: str) -> dict:
            diff = max(float((params[x][k] - params[y][k]).abs().max()) for k in params[x])
            first = next((i + 1 for i, (p, q) in enumerate(zip(losses[x], losses[y])) if p != q), None)
            return {"max_param_diff": diff, "first_differing_logged_step": first}

        print(
            json.dumps(
                {
                    "steps": n,
                    "threads": torch.get_num_threads(),
                    "deterministic": not args.nondeterministic,
                    "straight_vs_straight": compare("a", "b"),
                    "straight_vs_resumed": compare("a", "resumed"),
                }
            )
        )


if __name__ == "__main__":
    main()
