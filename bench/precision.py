"""bf16 inference against fp32: how far ``Embedder(..., precision="bf16")`` moves the vectors, and how fast it is.

Embeds the first ``--sentences`` sentences of UD English-EWT dev (``../shared/data/ud-english-ewt``, its own
tokenisation) with one model in float32 and in bf16, batch 64, and prints one JSON line: per layer the max abs
difference, that difference relative to the layer's largest float32 value (the scale docs/how-to/bf16.md quotes),
the 99.9th percentile of the per-value difference over that scale, the mean cosine between the fp32 and bf16 token
vectors; and the two embedding times (alternating fp32, bf16, fp32, bf16; the faster of each), whose ratio only
counts on a quiet machine.

Run: ``python bench/precision.py MODEL [--sentences 500] [--threads 2]`` — MODEL a model folder, e.g. the quickstart's
``runs/quickstart/train/model`` or a zoo model (``elmokit-en``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from inference import EWT_DEV, read_conllu_forms  # noqa: E402  (the same sentences as bench/inference.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a model folder or name (anything elmokit loads)")
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from elmokit import Embedder, load_pretrained_bilm

    sentences = read_conllu_forms(EWT_DEV, args.sentences)
    bilm = load_pretrained_bilm(args.model)
    embedders = {p: Embedder(bilm, batch_size=64, precision=p) for p in ("fp32", "bf16")}
    outputs, seconds = {}, {"fp32": [], "bf16": []}
    for _ in range(2):
        for p, embedder in embedders.items():
            start = time.perf_counter()
            outputs[p] = list(embedder.embed_sentences(sentences, batch_size=64))
            seconds[p].append(time.perf_counter() - start)
    full = {p: np.concatenate(v, axis=1) for p, v in outputs.items()}  # (L+1, tokens, 2P)
    layers = []
    for k in range(full["fp32"].shape[0]):
        a, b = full["fp32"][k], full["bf16"][k]
        scale = float(np.abs(a).max())
        diff = np.abs(a - b)
        cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
        layers.append(
            {
                "layer": k,
                "max_abs": float(diff.max()),
                "scale": scale,
                "max_relative_to_scale": float(diff.max()) / scale,
                "p99.9_relative_to_scale": float(np.quantile(diff, 0.999)) / scale,
                "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()),
            }
        )
    best = {p: min(v) for p, v in seconds.items()}
    print(
        json.dumps(
            {
                "model": args.model,
                "sentences": len(sentences),
                "tokens": int(full["fp32"].shape[1]),
                "threads": args.threads,
                "layers": layers,
                "seconds": seconds,
                "bf16_speedup": best["fp32"] / best["bf16"],
            }
        )
    )


if __name__ == "__main__":
    main()
