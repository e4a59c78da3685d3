"""Device check and speed ratio: the same biLM on CUDA and on the CPU, in one run.

Measures, with random weights and synthetic Zipf-distributed text (nothing to download):
1. embedding agreement: max abs diff of all layers, CUDA vs CPU, for one padded batch (float32);
2. exact resume on the device: losses of a 2×15-step interrupted run vs an uninterrupted 30-step run;
3. speed: training steps/s and embedding sentences/s on CUDA vs CPU (ratio = CUDA / CPU).

Run: ``PYTHONPATH=src python bench/device_check.py [--preset small] [--steps 20]``. Without CUDA it says so and stops.
Prints one JSON line last with the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from elmokit import PRESETS, Embedder, batch_to_ids
from elmokit.modules.bilm import BiLM
from elmokit.pretraining.trainer import TrainConfig, Trainer


def zipf_corpus(n_sentences: int, vocab_size: int = 5000, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab_size)]
    weights = [1.0 / (i + 1) for i in range(vocab_size)]
    return [rng.choices(words, weights, k=rng.randint(5, 40)) for _ in range(n_sentences)]


def train_steps_per_s(model: dict, corpus_file: Path, device: str, steps: int, out: Path, batch: int) -> float:
    """Optimiser steps per second (sampled softmax, 1024 negatives, stream windows of 20), after 3 warm-up steps."""
    cfg = TrainConfig(
        train_files=[str(corpus_file)],
        out_dir=str(out),
        model=model,
        batch_size=batch,
        unroll_steps=20,
        n_negative_samples=1024,
        n_epochs=100,
        device=device,
        progress=False,
        seed=0,
    )
    trainer = Trainer(cfg)
    trainer.lm.train()
    batches = iter(trainer.data)
    for i in range(3 + steps):
        if i == 3:
            _sync(device)
            start = time.perf_counter()
        loss = trainer._step_nll(next(batches)).loss()
        trainer.optimizer.zero_grad(set_to_none=True)
        (loss * cfg.unroll_steps).backward()
        torch.nn.utils.clip_grad_norm_(trainer.lm.parameters(), cfg.clip_norm)
        trainer.optimizer.step()
    _sync(device)
    return steps / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def embed_sentences_per_s(bilm: BiLM, sentences, device: str, batch: int) -> float:
    emb = Embedder(bilm, batch_size=batch, device=device)
    list(emb.embed_sentences(sentences[:batch]))
    _sync(device)
    start = time.perf_counter()
    n = sum(1 for _ in emb.embed_sentences(sentences))
    _sync(device)
    return n / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--embed-sentences", type=int, default=512)
    ap.add_argument("--dry-run", action="store_true", help="run every part on the CPU (checks the script itself)")
    args = ap.parse_args()
    dev = "cpu" if args.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to compare", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    result: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None,
        "preset": args.preset,
        "cpu_threads": torch.get_num_threads(),
    }
    config = PRESETS[args.preset]()
    sentences = zipf_corpus(args.embed_sentences, seed=1)

    # 1. agreement
    torch.manual_seed(0)
    cpu_model = BiLM(config).eval()
    gpu_model = BiLM(config).eval()
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model.to(dev)
    ids = batch_to_ids(sentences[:32])
    with torch.no_grad():
        a = cpu_model(ids).layers
        b = gpu_model(ids.to(dev)).layers.cpu()
    result["embed_max_abs_diff_cuda_vs_cpu"] = float((a - b).abs().max())

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in zipf_corpus(4000)))
        small = PRESETS["tiny"]().to_options()
        # 2. exact resume on the device
        base = dict(
            train_files=[str(corpus)],
            model=small,
            batch_size=8,
            unroll_steps=10,
            n_epochs=100,
            n_negative_samples=64,
            device=dev,
            progress=False,
            checkpoint_every=15,
            log_every=1,
            seed=3,
        )
        Trainer(TrainConfig(out_dir=str(tmp / "full"), max_steps=30, **base)).train()
        Trainer(TrainConfig(out_dir=str(tmp / "cut"), max_steps=15, **base)).train()
        resumed = Trainer(TrainConfig(out_dir=str(tmp / "cut"), max_steps=30, **base))
        resumed.train(resume=True)
        full = [json.loads(x)["loss"] for x in (tmp / "full" / "metrics.jsonl").read_text().splitlines()]
        cut = [json.loads(x)["loss"] for x in (tmp / "cut" / "metrics.jsonl").read_text().splitlines()]
        result["resume_steps"] = [len(full), len(cut)]
        result["resume_max_loss_diff"] = max(abs(x - y) for x, y in zip(full, cut)) if len(full) == len(cut) else None

        # 3. speed
        model = config.to_options()
        cpu_tr = train_steps_per_s(model, corpus, "cpu", max(2, args.steps // 5), tmp / "tc", args.batch)
        gpu_tr = train_steps_per_s(model, corpus, dev, args.steps, tmp / "tg", args.batch)
        result["train_steps_per_s"] = {"cpu": cpu_tr, "cuda": gpu_tr, "ratio": gpu_tr / cpu_tr}
        cpu_em = embed_sentences_per_s(cpu_model, sentences[:128], "cpu", args.batch)
        gpu_em = embed_sentences_per_s(gpu_model, sentences, dev, args.batch)
        result["embed_sentences_per_s"] = {"cpu": cpu_em, "cuda": gpu_em, "ratio": gpu_em / cpu_em}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
