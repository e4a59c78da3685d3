"""The main job: pretrain a small biLM on real English text that ships with the install, evaluate it, and show
context at work.

Text: the Lee news corpus (300 ABC news articles, 59,890 words) inside the gensim wheel
(``gensim.test.utils.datapath("lee_background.cor")``). It is split into sentences and tokens here; the last 10 % of
the articles are held out. The vocabulary is the training words seen at least twice (the others become ``<UNK>``, so
the model learns how likely an unseen word is). The run prints the held-out perplexity (full softmax,
forward/backward/average) beside an add-one unigram baseline over the same vocabulary and held-out text, saves the
model, and compares the vectors of "bank" in two river sentences and one money sentence, layer by layer.

Settings (chosen on this corpus with a held-out curve every 300 steps): LSTM 512 → projection 128, 2 layers, skip
connections, full softmax, Adam lr 2e-3, dropout 0.5 (the corpus has only 60k tokens: at dropout 0.1 held-out
perplexity rose again after 300 steps), batches of 32 whole sentences from a zero state — the way the model is then
evaluated and embedded (see :mod:`elmokit.training.trainer` for why this beats stream windows here).
"""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import numpy as np
import torch

from .config import CharCNNConfig, ElmoConfig, LSTMConfig
from .io import atomic_write_text

__all__ = ["run_quickstart", "load_lee_corpus", "tokenize", "quickstart_config", "BANK_SENTENCES"]

logger = logging.getLogger(__name__)

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|\w+(?:['’-]\w+)*|[^\w\s]")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'’”]))\s+(?=[\"'“‘A-Z])")

#: (label, tokens, index of "bank")
BANK_SENTENCES = [
    ("river 1", "They walked along the bank of the river .".split(), 4),
    ("river 2", "The boat drifted to the muddy bank of the stream .".split(), 6),
    ("money", "She took the money to the bank to open an account .".split(), 6),
]


def tokenize(text: str) -> list[list[str]]:
    """Split running English text into sentences (at . ! ?, or one followed by a closing quote, before a capital or an
    opening quote) and tokens (words, numbers, punctuation)."""
    return [toks for s in _SENTENCE_END.split(text) if (toks := _TOKEN.findall(s))]


def load_lee_corpus() -> tuple[list[list[str]], list[list[str]]]:
    """(train sentences, held-out sentences) from gensim's ``lee_background.cor``; the last 30 articles are held out.

    Raises:
        ImportError: gensim is not installed (it is a dependency of elmokit).
    """
    from gensim.test.utils import datapath

    docs = Path(datapath("lee_background.cor")).read_text(encoding="utf-8").splitlines()
    docs = [d for d in docs if d.strip()]
    split = len(docs) - len(docs) // 10
    train = [s for d in docs[:split] for s in tokenize(d)]
    held = [s for d in docs[split:] for s in tokenize(d)]
    return train, held


def quickstart_config() -> ElmoConfig:
    """A small biLM that trains in minutes on 2 CPU cores (output dim 256)."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(filters=[(1, 32), (2, 32), (3, 64), (4, 128), (5, 128)], n_highway=1,
                               embedding_dim=16, n_characters=261, max_characters_per_token=50, activation="relu"),
        lstm=LSTMConfig(dim=512, projection_dim=128, n_layers=2, cell_clip=3.0, proj_clip=3.0,
                        use_skip_connections=True),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def run_quickstart(out_dir: Path, minutes: float = 5.0, seed: int = 0, steps: int | None = None,
                   device: str = "cpu") -> dict:
    """Train, evaluate, save and embed (see module docstring). Returns the figures it printed (also written to
    ``out_dir/quickstart.json``).

    Args:
        out_dir: where the corpus split, checkpoints, metrics and ``train/model`` go.
        minutes: training time budget; the first 5 steps are timed and the budget becomes a fixed step count.
        steps: train exactly this many steps instead (the same training on any machine, up to float rounding).
        seed: data order, initialisation, dropout.
        device: ``"cpu"`` (default), ``"cuda"`` or ``"auto"``.

    Raises:
        ValueError: ``steps`` < 1 or ``minutes`` <= 0.
        ImportError: gensim (a dependency) is missing.
    """
    from .embedding import Embedder
    from .training.perplexity import evaluate_perplexity, unigram_perplexity
    from .training.trainer import TrainConfig, Trainer, load_lm

    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if steps is None and not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held = load_lee_corpus()
    train_file, held_file = out_dir / "train.txt", out_dir / "heldout.txt"
    atomic_write_text(train_file, "".join(" ".join(s) + "\n" for s in train))
    atomic_write_text(held_file, "".join(" ".join(s) + "\n" for s in held))
    n_train = sum(len(s) for s in train)
    print(f"corpus: gensim lee_background.cor — {len(train)} training sentences ({n_train} tokens), "
          f"{len(held)} held-out sentences ({sum(len(s) for s in held)} tokens)")

    batch_size, unroll = 32, 20  # 32 sentences a step; unroll_steps only scales the loss here
    steps_per_epoch = max(1, -(-len(train) // batch_size))
    config = TrainConfig(
        train_files=[str(train_file)], out_dir=str(out_dir / "train"), model=quickstart_config().to_options(),
        min_count=2, batching="sentences", batch_size=batch_size, unroll_steps=unroll, n_epochs=1000,
        optimizer="adam", lr=2e-3, clip_norm=5.0, dropout=0.5, n_negative_samples=0, seed=seed,
        checkpoint_every=10_000, log_every=10, device=device,
    )
    trainer = Trainer(config)
    if steps is None:
        # time budget → steps: time 20 steps after 5 of warm-up, then fix max_steps (the run is then reproducible from
        # its config and step count). The probe steps are part of the training run.
        warmup, probe_steps = 5, 20
        trainer.config.max_steps = warmup
        trainer.train()
        trainer.config.max_steps = warmup + probe_steps
        per_step = trainer.train(resume=True)["loop_seconds"] / probe_steps
        max_steps = max(warmup + probe_steps, int(minutes * 60 / per_step))
        print(f"training: ~{per_step * 1000:.0f} ms/step → {max_steps} steps (~{max_steps / steps_per_epoch:.1f} "
              f"epochs) in the {minutes:g}-minute budget")
    else:
        max_steps = steps
        print(f"training: {max_steps} steps (~{max_steps / steps_per_epoch:.1f} epochs) as asked")
    trainer.config.max_steps = max_steps
    summary = trainer.train(resume=trainer.step > 0)
    lm = load_lm(summary["model_dir"])

    ppl = evaluate_perplexity(lm, held)
    uni = unigram_perplexity(train, held, lm.vocab)
    print(f"held-out perplexity (full softmax): forward {ppl['forward']:.1f}, backward {ppl['backward']:.1f}, "
          f"average {ppl['average']:.1f}")
    print(f"unigram baseline (add-one, same vocabulary of {len(lm.vocab)}): {uni:.1f}  "
          f"→ ratio {ppl['average'] / uni:.2f}")

    embedder = Embedder(lm.bilm)
    vectors = {}
    for label, tokens, i in BANK_SENTENCES:
        vectors[label] = embedder.embed_sentence(tokens)[:, i]  # (L+1, 2P)
    n_layers = vectors["money"].shape[0]
    print('"bank" in context: cosine similarity of its vectors (layer 0 is the context-free token vector):')
    for label, tokens, _ in BANK_SENTENCES:
        print(f"  {label:8s} {' '.join(tokens)}")
    sims = {}
    for a, b in (("river 1", "river 2"), ("river 1", "money"), ("river 2", "money")):
        per_layer = [_cosine(vectors[a][j], vectors[b][j]) for j in range(n_layers)]
        sims[f"{a} ~ {b}"] = per_layer[-1]
        lower = "  ".join(f"layer {j}: {per_layer[j]:.3f}" for j in range(n_layers - 1))
        print(f"  {a:8s} ~ {b:8s}: top layer {per_layer[-1]:.3f}   ({lower})")
    holds = sims["river 1 ~ river 2"] > max(sims["river 1 ~ money"], sims["river 2 ~ money"])
    print(f"  the two river senses are {'closer to each other' if holds else 'NOT closer to each other'} than to the "
          "money sense")
    result = {"perplexity": ppl, "unigram_perplexity": uni, "ratio": ppl["average"] / uni, "bank_cosine": sims,
              "river_closer": holds, "steps": summary["steps"], "model_dir": summary["model_dir"],
              "seconds": time.perf_counter() - start}
    atomic_write_text(out_dir / "quickstart.json", json.dumps(result, indent=2) + "\n")
    print(f"model saved to {summary['model_dir']} (use it with Elmo.from_pretrained); "
          f"learning curve {summary['learning_curve'] or '(none: fewer steps than one log interval)'}; total {result['seconds'] / 60:.1f} min")
    return result
