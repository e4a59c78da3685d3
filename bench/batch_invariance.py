"""How far a sentence's vectors move with the batch it is embedded in: random models of every preset shape, real text.

For each preset (``small``, ``medium``, ``original``: random weights, seed 0, as :class:`elmokit.modules.bilm.BiLM`
initialises them, and the same times ``--weight-scales``: ×4 gives values and firing clips closer to a trained
model's) the first ``--sentences`` sentences of UD English-EWT dev (mixed lengths, their own tokenisation)
are embedded one at a time (the reference), then in ``--trials`` random batch compositions (random subsets of 2 to 64
sentences, in random order) with :meth:`elmokit.Embedder.embed_batch`. Printed per preset, as one JSON line each:
the largest absolute difference from the reference over all sentences, layers and trials; the largest value
magnitude of the reference (the scale); their ratio; and which layer the largest difference was in.

The first ``--sentences`` are joined by ``--long`` long ones (default 2: UD English-EWT train's longest sentence,
159 tokens, and its first 200 tokens of consecutive sentences joined), so the figures cover sentences up to 200
tokens, where the LSTMs have amplified rounding differences longest. ``--batch-invariant`` measures
``Embedder(batch_invariant=True)`` (expected: 0.0 everywhere, ``"bitwise": true``).

The batch-independence bound that ``Embedder.embed_sentences`` and docs/explanation/numerics.md state comes from
these figures.

Run: ``python bench/batch_invariance.py [--sentences 48] [--trials 12] [--presets small,medium,original]
[--batch-invariant]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from inference import EWT_DEV, read_conllu_forms  # bench/inference.py: the same sentences

EWT_TRAIN = EWT_DEV.with_name("en_ewt-ud-train.conllu")


def long_sentences(n: int) -> list[list[str]]:
    """Up to ``n`` long real sentences: EWT train's longest (159 tokens), then its first 200 tokens joined."""
    train = read_conllu_forms(EWT_TRAIN, 20000)
    joined: list[str] = []
    for s in train:
        joined += s
        if len(joined) >= 200:
            break
    return [max(train, key=len), joined[:200]][:n]


def measure(
    preset: str,
    sentences: list[list[str]],
    trials: int,
    weight_scale: float = 1.0,
    seed: int = 0,
    batch_invariant: bool = False,
) -> dict:
    """The largest batch-vs-alone difference of ``preset``'s random model on ``sentences`` (see the module doc)."""
    from elmokit import Embedder
    from elmokit.config import PRESETS
    from elmokit.modules.bilm import BiLM

    torch.manual_seed(seed)
    bilm = BiLM(PRESETS[preset]())
    with torch.no_grad():  # larger weights: values and clips closer to a trained model's
        for p in bilm.parameters():
            p.mul_(weight_scale)
    embedder = Embedder(bilm, batch_size=64, batch_invariant=batch_invariant)
    alone = [embedder.embed_sentence(s) for s in sentences]
    scale = max(float(np.abs(a).max()) for a in alone)
    rng = random.Random(seed)
    worst, where = 0.0, None
    for _ in range(trials):
        picked = rng.sample(range(len(sentences)), rng.randint(2, min(64, len(sentences))))
        for i, out in zip(picked, embedder.embed_batch([sentences[i] for i in picked])):
            diff = np.abs(out - alone[i])
            if float(diff.max()) > worst:
                worst = float(diff.max())
                where = {"sentence": i, "tokens": len(sentences[i]), "layer": int(diff.max(axis=(1, 2)).argmax())}
    return {
        "preset": preset,
        "weight_scale": weight_scale,
        "batch_invariant": batch_invariant,
        "longest": max(len(s) for s in sentences),
        "bitwise": worst == 0.0,
        "max_abs": worst,
        "scale": scale,
        "max_abs_over_scale": worst / scale,
        "at": where,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=48)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--presets", default="small,medium,original")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weight-scales", default="1,4", help="each preset is measured with its weights times each")
    ap.add_argument("--long", type=int, default=2, help="long sentences added (159 and 200 tokens)")
    ap.add_argument("--batch-invariant", action="store_true", help="measure Embedder(batch_invariant=True)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sentences = read_conllu_forms(EWT_DEV, args.sentences) + long_sentences(args.long)
    for preset in args.presets.split(","):
        for scale in map(float, args.weight_scales.split(",")):
            result = measure(preset, sentences, args.trials, scale, batch_invariant=args.batch_invariant)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
