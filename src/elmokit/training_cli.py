"""``elmokit train | perplexity | score | quickstart`` (registered on the main parser by :mod:`elmokit.cli`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]


def _model_options(args: argparse.Namespace) -> dict:
    if args.options:
        return json.loads(Path(args.options).read_text(encoding="utf-8"))
    from .config import PRESETS

    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; choose from {sorted(PRESETS)}")
    return PRESETS[args.preset]().to_options()


def cmd_train(args: argparse.Namespace) -> int:
    from .training.trainer import TrainConfig, Trainer

    out = Path(args.out_dir)
    if args.resume and (out / "train_config.json").is_file():
        config = TrainConfig(**json.loads((out / "train_config.json").read_text()))
        if args.max_steps is not None:
            config.max_steps = args.max_steps
        if args.device is not None:
            config.device = args.device
    else:
        config = TrainConfig(
            train_files=args.train_files, out_dir=str(out), model=_model_options(args), vocab_file=args.vocab,
            min_count=args.min_count, max_vocab=args.max_vocab, char_vocab=args.char_vocab, batching=args.batching,
            batch_size=args.batch_size, unroll_steps=args.unroll_steps, n_epochs=args.epochs, max_steps=args.max_steps,
            optimizer=args.optimizer, lr=args.lr, clip_norm=args.clip_norm, dropout=args.dropout,
            n_negative_samples=args.negatives, seed=args.seed, checkpoint_every=args.checkpoint_every,
            log_every=args.log_every, progress=not args.no_progress, decode_errors=args.decode_errors,
            device=args.device or "auto",
        )
    summary = Trainer(config).train(resume=args.resume)
    print(json.dumps(summary, indent=2))
    return 0


def _read_sentences(path: str) -> list[list[str]]:
    from .data.corpus import TextCorpus

    return list(TextCorpus(path).sentences(0))


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .training.perplexity import evaluate_perplexity
    from .training.trainer import load_lm

    result = evaluate_perplexity(load_lm(args.model), _read_sentences(args.file), batch_size=args.batch_size)
    print(json.dumps(result, indent=2))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from .training.perplexity import score_sentences
    from .training.trainer import load_lm

    sentences = _read_sentences(args.file)
    for tokens, (f, b) in zip(sentences, score_sentences(load_lm(args.model), sentences, args.batch_size)):
        print(json.dumps({"sentence": " ".join(tokens), "logprob_forward": f, "logprob_backward": b,
                          "tokens": len(tokens)}, ensure_ascii=False))
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run_quickstart

    run_quickstart(Path(args.out_dir), minutes=args.minutes, seed=args.seed, steps=args.steps, device=args.device)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="pretrain (or --resume) a biLM on tokenised text, one sentence per line")
    p.add_argument("train_files", nargs="*", help="glob pattern(s) of training shards")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--preset", default="small", help="architecture preset (small, medium, original, tiny)")
    p.add_argument("--options", help="options.json with the architecture (overrides --preset)")
    p.add_argument("--vocab", help="bilm-tf vocabulary file (default: built from the training files)")
    p.add_argument("--min-count", type=int, default=1)
    p.add_argument("--max-vocab", type=int)
    p.add_argument("--char-vocab", action="store_true", help="character-vocabulary input (CJK) instead of UTF-8 bytes")
    p.add_argument("--batching", choices=["sentences", "windows"], default="sentences",
                   help="whole sentences from a zero state (default, as elmokit embeds) or bilm-tf's stream windows "
                        "with carried state")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--unroll-steps", type=int, default=20)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--optimizer", choices=["adagrad", "adam"], default="adagrad")
    p.add_argument("--lr", type=float)
    p.add_argument("--clip-norm", type=float, default=10.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--negatives", type=int, default=8192, help="sampled-softmax negatives (0 = full softmax)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out-dir")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default=None, help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--decode-errors", choices=["strict", "replace", "ignore", "skip"], default="strict",
                   help="invalid UTF-8 in the corpus: stop with file and line (strict), or replace/ignore/skip")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("perplexity", help="held-out perplexity (full softmax): forward, backward, average")
    p.add_argument("model", help="a trained model folder (out_dir/model)")
    p.add_argument("file", help="tokenised text, one sentence per line")
    p.add_argument("--batch-size", type=int, default=64)
    p.set_defaults(func=cmd_perplexity)

    p = sub.add_parser("score", help="per-sentence log-probability (nats) under each direction, one JSON line each")
    p.add_argument("model")
    p.add_argument("file")
    p.add_argument("--batch-size", type=int, default=64)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("quickstart", help="train a small biLM on English text shipped with gensim, evaluate, embed")
    p.add_argument("--out-dir", default="runs/quickstart")
    p.add_argument("--minutes", type=float, default=5.0,
                   help="training time budget, turned into a number of steps after timing the first 5")
    p.add_argument("--steps", type=int, default=None, help="train exactly this many steps (overrides --minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    p.set_defaults(func=cmd_quickstart)
