"""Benchmark: Ray Data's ``EmbedBatches`` against ``elmokit embed`` on one machine — tokens/s on the same sentences.

Run by hand (not by CI)::

    python bench/ray_embed.py                       # 2,000 UD English-EWT train sentences, random "small" model
    python bench/ray_embed.py --sentences 500 --preset small --actors 1

The model is a random-weight biLM of a released shape (``--preset``, default ``small``: 13.6M parameters, so the
work per token is a real model's), saved to a temporary native folder; the sentences are the first ``--sentences``
of UD English-EWT train (../shared/data/ud-english-ewt), one a line, their own tokenisation.

1. Reference: ``elmokit embed MODEL in.txt out.h5 --format hdf5 --layers average --no-progress`` as a subprocess
   (its default threads: the machine's CPUs), wall time from start to exit (start-up, model load and the file
   written included).
2. Ray Data: ``ray.init(num_cpus=CPUs + 1)`` (one logical CPU for the read and write tasks, so that the actors can
   hold every core without starving them; timed apart: a cluster is started once, not per job), then
   ``read_text(in.txt) → map_batches(EmbedBatches, text_column="text", layers="average", ActorPoolStrategy(size=
   --actors), num_cpus=CPUs / actors, batch_size=--batch-size) → write_parquet``, wall time of that pipeline (actor
   start-up, model load in each actor and the files written included).

The last line printed is one JSON object: both tokens/s, the ratio Ray / embed (the issue's goal: ≥ 0.8 on one
machine), Ray's start-up, the CPU model and the bf16/fp32 ``torch.mm`` time ratio of this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))

from train import cpu_model, mm_rates  # noqa: E402  (bench/train.py: lscpu's model name, torch.mm rates at 2048²)


def _sentences(n: int) -> list[list[str]]:
    from elmokit.tasks.readers import read_conllu

    path = REPO.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-train.conllu"
    return [list(s.tokens) for s in read_conllu(path, limit=n)]


def _model(folder: Path, preset: str) -> None:
    import torch

    from elmokit.config import PRESETS
    from elmokit.modules.bilm import BiLM
    from elmokit.weights.native import save_pretrained

    torch.manual_seed(0)
    save_pretrained(BiLM(PRESETS[preset]()).eval(), folder)


def _embed_cli(model: Path, text: Path, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "elmokit", "embed", str(model), str(text), str(out)]
    cmd += ["--format", "hdf5", "--layers", "average", "--no-progress"]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _ray(model: Path, text: Path, out: Path, cpus: int, actors: int, batch_size: int) -> tuple[float, float]:
    import ray
    import ray.data

    from elmokit.integrations.ray import EmbedBatches

    start = time.perf_counter()
    ray.init(
        num_cpus=cpus + 1,  # one logical CPU beyond the cores for Ray Data's (light) read and write tasks
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO / "src")}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    started = time.perf_counter() - start
    start = time.perf_counter()
    ray.data.read_text(str(text)).map_batches(
        EmbedBatches,
        fn_constructor_kwargs={"model": str(model), "text_column": "text", "layers": "average"},
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=cpus / actors,
        batch_size=batch_size,
    ).write_parquet(str(out))
    wall = time.perf_counter() - start
    ray.shutdown()
    return started, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=2000, help="UD English-EWT train sentences (default 2000)")
    parser.add_argument("--preset", default="small", help="random model of this released shape (default small)")
    parser.add_argument("--actors", type=int, default=1, help="Ray actors (default 1, with all the CPUs)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per map_batches call (default 256)")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    sentences = _sentences(args.sentences)
    tokens = sum(len(s) for s in sentences)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _model(tmp / "model", args.preset)
        text = tmp / "in.txt"
        text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
        embed_s = _embed_cli(tmp / "model", text, tmp / "out.h5")
        ray_start_s, ray_s = _ray(tmp / "model", text, tmp / "parquet", cpus, args.actors, args.batch_size)
    result = {
        "bench": "ray_embed",
        "sentences": len(sentences),
        "tokens": tokens,
        "preset": args.preset,
        "cpus": cpus,
        "actors": args.actors,
        "embed_tokens_per_s": round(tokens / embed_s, 1),
        "ray_tokens_per_s": round(tokens / ray_s, 1),
        "ratio_ray_to_embed": round(embed_s / ray_s, 3),
        "embed_wall_s": round(embed_s, 2),
        "ray_wall_s": round(ray_s, 2),
        "ray_init_s": round(ray_start_s, 2),
        "cpu_model": cpu_model(),
        "bf16_fp32_mm_ratio": round(mm_rates(cpus)["mm_bf16_over_fp32"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
