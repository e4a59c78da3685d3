"""``elmokit train | perplexity | score | quickstart`` (registered on the main parser by :mod:`elmokit.cli`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


# CLI option → TrainConfig field, for options that may change when a run is resumed; all others are fixed by the run
_RESUME_MAY_CHANGE = {"max_steps": "max_steps", "device": "device", "checkpoint_every": "checkpoint_every",
                      "log_every": "log_every", "nondeterministic": None}
# CLI option → TrainConfig field, for options fixed by the run: on --resume they may be repeated, not changed
_RESUME_FIXED = {"train_files": "train_files", "preset": "model", "options": "model", "vocab": "vocab_file",
                 "min_count": "min_count", "max_vocab": "max_vocab", "char_vocab": "char_vocab", "batching": "batching",
                 "batch_size": "batch_size", "unroll_steps": "unroll_steps", "optimizer": "optimizer", "lr": "lr",
                 "clip_norm": "clip_norm", "dropout": "dropout", "negatives": "n_negative_samples", "seed": "seed",
                 "decode_errors": "decode_errors", "epochs": "n_epochs"}
_ARCHITECTURE_KEYS = {"lstm", "char_cnn"}


def _model_options(args: argparse.Namespace) -> dict:
    if args.options:
        path = Path(args.options)
        try:
            options = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc})") from None
        if not isinstance(options, dict):
            raise ValueError(f"{path} must hold a JSON object (an options.json), not {type(options).__name__}")
        ignored = sorted(set(options) - _ARCHITECTURE_KEYS)
        if ignored:
            print(f"elmokit train: note: {path}: only the architecture ('lstm', 'char_cnn') is read; training "
                  f"settings {ignored} there are not used — pass them as options (--batch-size, --epochs, ...)",
                  file=sys.stderr)
        return {k: v for k, v in options.items() if k in _ARCHITECTURE_KEYS}
    from .config import PRESETS

    preset = args.preset or "small"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    return PRESETS[preset]().to_options()


def _same_files(given: list[str], saved: list[str]) -> bool:
    return [str(Path(g)) for g in given] == [str(Path(s)) for s in saved]


def cmd_train(args: argparse.Namespace) -> int:
    from .training.trainer import TrainConfig, Trainer

    out = Path(args.out_dir)
    if args.resume:
        saved = out / "train_config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"nothing to resume in {out}: no train_config.json (drop --resume to start a run)")
        try:
            config = TrainConfig(**json.loads(saved.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{saved} is not a readable training configuration ({exc})") from None
        config.out_dir = str(out)  # the folder may have been moved since the run started
        parser = args._parser
        given = {a for a in vars(args) if getattr(args, a) != parser.get_default(a)}
        if not args.train_files:
            given.discard("train_files")
        changed = []
        for arg, field_name in _RESUME_FIXED.items():
            if arg not in given:
                continue
            if arg in ("preset", "options"):
                same = json.loads(json.dumps(_model_options(args))) == json.loads(json.dumps(config.model))
            elif arg == "train_files":
                same = _same_files(args.train_files, config.train_files)
            elif arg == "vocab":
                same = config.vocab_file is not None and _same_files([args.vocab], [config.vocab_file])
            else:
                same = getattr(args, arg) == getattr(config, field_name)
            if not same:
                changed.append("the training files" if arg == "train_files" else "--" + arg.replace("_", "-"))
        if changed:
            raise ValueError(f"{', '.join(changed)}: differ from the run being resumed (see {saved}); only "
                             f"{', '.join('--' + a.replace('_', '-') for a in _RESUME_MAY_CHANGE)} may change on "
                             "--resume. Start a new --out-dir to change the others")
        for arg, field_name in _RESUME_MAY_CHANGE.items():
            if field_name and getattr(args, arg) != parser.get_default(arg):
                setattr(config, field_name, getattr(args, arg))
        if args.nondeterministic:
            config.deterministic = False
        config.progress = not args.no_progress
    else:
        chosen = dict(
            vocab_file=args.vocab, min_count=args.min_count, max_vocab=args.max_vocab, char_vocab=args.char_vocab,
            batching=args.batching, batch_size=args.batch_size, unroll_steps=args.unroll_steps, n_epochs=args.epochs,
            max_steps=args.max_steps, optimizer=args.optimizer, lr=args.lr, clip_norm=args.clip_norm,
            dropout=args.dropout, n_negative_samples=args.negatives, seed=args.seed,
            checkpoint_every=args.checkpoint_every, log_every=args.log_every, decode_errors=args.decode_errors,
            device=args.device,
        )
        # options left out take TrainConfig's defaults (the CLI's defaults are None so that --resume can tell
        # an option repeated from one left out)
        config = TrainConfig(train_files=args.train_files, out_dir=str(out), model=_model_options(args),
                             progress=not args.no_progress, deterministic=not args.nondeterministic,
                             **{k: v for k, v in chosen.items() if v is not None})
    summary = Trainer(config).train(resume=args.resume)
    print(json.dumps(summary, indent=2))
    return 0


def _read_lines(args: argparse.Namespace) -> list[tuple[int, list[str]]]:
    from .data.corpus import read_lines

    return [(number, text.split()) for number, text in read_lines(args.file, errors=args.decode_errors)]


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .training.perplexity import evaluate_perplexity
    from .training.trainer import load_lm

    lm = load_lm(args.model)
    sentences = [tokens for _, tokens in _read_lines(args) if tokens]  # blank lines are not sentences
    result = evaluate_perplexity(lm, sentences, batch_size=args.batch_size)
    print(json.dumps(result, indent=2))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from .training.perplexity import score_sentences
    from .training.trainer import load_lm

    lm = load_lm(args.model)
    lines = _read_lines(args)
    scores = score_sentences(lm, [tokens for _, tokens in lines], args.batch_size)
    for (number, tokens), (f, b) in zip(lines, scores):
        print(json.dumps({"line": number, "sentence": " ".join(tokens), "words": len(tokens),
                          "logprob_forward": f, "logprob_backward": b}, ensure_ascii=False))
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run_quickstart

    run_quickstart(Path(args.out_dir), minutes=args.minutes, seed=args.seed, steps=args.steps, device=args.device)
    return 0


def _add_lm_file_args(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``perplexity`` and ``score``: a trained LM folder and a text file."""
    p.add_argument("model", help="a trained model folder (out_dir/model)")
    p.add_argument("file", help="tokenised text, one sentence per line")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--decode-errors", choices=["strict", "replace", "ignore", "skip"], default="strict")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="pretrain (or --resume) a biLM on tokenised text, one sentence per line")
    p.add_argument("train_files", nargs="*", help="glob pattern(s) of training shards")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--preset", default=None, help="architecture preset (small, medium, original, tiny; default small)")
    p.add_argument("--options", help="options.json with the architecture (overrides --preset)")
    p.add_argument("--vocab", help="bilm-tf vocabulary file (default: built from the training files)")
    p.add_argument("--min-count", type=int, default=None, help="default 1")
    p.add_argument("--max-vocab", type=int)
    p.add_argument("--char-vocab", action="store_true", help="character-vocabulary input (CJK) instead of UTF-8 bytes")
    p.add_argument("--batching", choices=["sentences", "windows"], default=None,
                   help="whole sentences from a zero state (default, as elmokit embeds) or bilm-tf's stream windows "
                        "with carried state (default sentences)")
    p.add_argument("--batch-size", type=int, default=None, help="default 128")
    p.add_argument("--unroll-steps", type=int, default=None, help="default 20")
    p.add_argument("--epochs", type=int, default=None, help="passes over the data (default 10)")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--optimizer", choices=["adagrad", "adam"], default=None, help="default adagrad")
    p.add_argument("--lr", type=float)
    p.add_argument("--clip-norm", type=float, default=None, help="default 10")
    p.add_argument("--dropout", type=float, default=None, help="default 0.1")
    p.add_argument("--negatives", type=int, default=None, help="sampled-softmax negatives (0 = full softmax; default 8192)")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps (default 500)")
    p.add_argument("--log-every", type=int, default=None, help="steps (default 10)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out-dir")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default=None, help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    p.add_argument("--nondeterministic", action="store_true",
                   help="allow non-deterministic kernels (about 6%% faster on CPU; runs no longer repeat bit-exactly)")
    p.add_argument("--decode-errors", choices=["strict", "replace", "ignore", "skip"], default=None,
                   help="invalid UTF-8 in the corpus: stop with file and line (strict, default), or replace/ignore/skip")
    p.set_defaults(func=cmd_train, _parser=p)

    p = sub.add_parser("perplexity", help="held-out perplexity (full softmax): forward, backward, average",
                       description="Perplexity of each sentence read from a zero state, per direction over its words "
                                   "plus one boundary (</S> forward, <S> backward); unknown words count as <UNK>; "
                                   "blank lines are skipped.")
    _add_lm_file_args(p)
    p.set_defaults(func=cmd_perplexity)

    p = sub.add_parser("score", help="per-sentence log-probability (nats) under each direction, one JSON line each",
                       description="One JSON line per input line (blank lines included, as empty sentences): line, "
                                   "sentence, words, logprob_forward = log p(w1 … wn </S>), logprob_backward = "
                                   "log p(<S> w1 … wn) read right to left, in nats, full softmax.")
    _add_lm_file_args(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("quickstart", help="train a small biLM on English text shipped with gensim, evaluate, embed")
    p.add_argument("--out-dir", default="runs/quickstart")
    p.add_argument("--minutes", type=float, default=5.0,
                   help="training time budget, turned into a number of steps after timing 20 steps (after 5 of "
                        "warm-up)")
    p.add_argument("--steps", type=int, default=None, help="train exactly this many steps (overrides --minutes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    p.set_defaults(func=cmd_quickstart)
