"""Seconds a training step of a zoo recipe on its own built corpus: the probe that fits a zoo spec's step count to its
60-minute biLM budget (``max_steps`` in ``elmokit.recipes.zoo.specs``).

For each ``--precision`` (default ``fp32,bf16``): a fresh run of the spec's configuration on
``$ELMOKIT_CACHE/zoo/elmokit-<lang>/corpus/train.txt`` (the build's corpus: ``elmokit zoo build <lang>`` writes it
first), 2 threads, ``--steps`` steps at a constant learning rate (the schedule does not change a step's work); the
mean time of the steps after the first ``--skip`` (as ``experiments/recipe_study.py``'s probes), and the step count
that fills ``--minutes`` of training. Printed first: ``lscpu``'s model name and the ``torch.mm`` bf16/fp32 ratio at
2048², and the load average (probe on a quiet machine). The last line is one JSON object.

Run: ``python bench/zoo_probe.py en [--precision bf16] [--steps 100] [--skip 50] [--minutes 55]`` (50 steps skipped:
under bf16 the first batches compile oneDNN kernels for their padded row counts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import cpu_model, mm_rates  # noqa: E402  (bench/train.py)

from elmokit.allocator import keep_freed_memory  # noqa: E402
from elmokit.pretraining.trainer import TrainConfig, TrainHooks, build_trainer  # noqa: E402
from elmokit.recipes.zoo.specs import THREADS, find_spec, model_dir  # noqa: E402


class _StepTimes(TrainHooks):
    def __init__(self) -> None:
        self.times: list[float] = []

    def after_step(self, trainer) -> None:
        self.times.append(time.perf_counter())


def probe(lang: str, precision: str, steps: int, skip: int) -> float:
    """Mean seconds a step (steps ``skip + 1`` … ``steps``) of a fresh run of the zoo spec ``lang``."""
    spec = find_spec(lang)
    corpus = model_dir(lang) / "corpus" / "train.txt"
    if not corpus.is_file():
        sys.exit(f"zoo_probe: no built corpus at {corpus}: run `elmokit zoo build {lang}` first")
    work = Path(tempfile.mkdtemp(prefix=f"elmokit-zoo-probe-{lang}-"))
    train = {**spec.train, "max_steps": steps, "lr_schedule": "constant", "lr_warmup_steps": 0}
    train.update(lr_decay_steps=None, log_every=10, checkpoint_every=10 * steps, precision=precision)
    config = TrainConfig(
        train_files=[str(corpus)], out_dir=str(work / "run"), model=spec.model, device="cpu", progress=False, **train
    )
    hooks = _StepTimes()
    try:
        build_trainer(dataclasses.replace(config), hooks=hooks).train(overwrite=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    t = hooks.times[skip - 1 :]
    return (t[-1] - t[0]) / (len(t) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lang", choices=["en", "zh"])
    ap.add_argument("--precision", default="fp32,bf16", help="comma-separated, of fp32, bf16")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=55.0, help="training minutes the step count fills")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    keep_freed_memory()  # as `elmokit` does at start-up
    rates = mm_rates(THREADS)
    ratio = rates["mm_bf16_over_fp32"]
    print(f"CPU: {cpu_model()}; torch.mm bf16/fp32 at 2048²: {ratio:.2f}; load {os.getloadavg()[0]:.2f}")
    result = {"cpu": cpu_model(), "mm_gflops": rates, "mm_bf16_over_fp32": ratio, "lang": args.lang, "probes": {}}
    for precision in args.precision.split(","):
        seconds = probe(args.lang, precision, args.steps, args.skip)
        fill = int(args.minutes * 60 / seconds) // 100 * 100
        result["probes"][precision] = {"s_per_step": seconds, "steps_for_minutes": fill}
        print(f"{args.lang} {precision}: {seconds:.3f} s a step → {fill:,} steps in {args.minutes:g} min", flush=True)
    result["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
