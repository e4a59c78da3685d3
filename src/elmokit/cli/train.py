"""``elmokit train | perplexity | score``: pretrain (or resume) a biLM, and evaluate a trained one.

``train``'s options default to ``None`` in argparse on purpose: with ``--resume`` an option left out keeps the run's
value, and one given must equal it unless it is one of :data:`RESUME_MAY_CHANGE`; the defaults a new run takes are
:class:`~elmokit.training.trainer.TrainConfig`'s, and the help text shows them from there.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .. import interrupts
from ..errors import CheckpointError, ConfigError, DataError, MissingFileError, UsageError
from .common import (DECODE_CHOICES, DEVICE_HELP, check_input_file, int_at_least, non_negative_int, path_arg,
                     positive_float, positive_int, print_json_line, probability, read_options_json,
                     resolve_cli_device, seed, text_arg)

__all__ = ["register", "cmd_train", "cmd_perplexity", "cmd_score", "RESUME_MAY_CHANGE", "RESUME_FIXED"]

#: CLI option → TrainConfig field, for options that may change when a run is resumed; all others are fixed by the run
RESUME_MAY_CHANGE = {"max_steps": "max_steps", "device": "device", "checkpoint_every": "checkpoint_every",
                     "checkpoint_minutes": "checkpoint_minutes", "keep_checkpoints": "keep_checkpoints",
                     "log_every": "log_every", "nondeterministic": None}
#: CLI option → TrainConfig field, for options fixed by the run: on --resume they may be repeated, not changed
RESUME_FIXED = {"train_files": "train_files", "preset": "model", "options": "model", "vocab": "vocab_file",
                "min_count": "min_count", "max_vocab": "max_vocab", "char_vocab": "char_vocab", "batching": "batching",
                "batch_size": "batch_size", "unroll_steps": "unroll_steps", "optimizer": "optimizer", "lr": "lr",
                "clip_norm": "clip_norm", "dropout": "dropout", "negatives": "n_negative_samples", "seed": "seed",
                "decode_errors": "decode_errors", "epochs": "n_epochs"}
_ARCHITECTURE_KEYS = {"lstm", "char_cnn"}


def _model_options(args: argparse.Namespace) -> dict:
    """The architecture options dict from ``--options`` (its ``lstm`` and ``char_cnn`` sections) or ``--preset``."""
    from ..config import PRESETS, ElmoConfig

    if args.options:
        path = Path(args.options)
        options = read_options_json(path, "--options")
        ignored = sorted(set(options) - _ARCHITECTURE_KEYS)
        options = {k: v for k, v in options.items() if k in _ARCHITECTURE_KEYS}
        try:
            ElmoConfig.from_options(options)
        except ConfigError as exc:
            raise ConfigError(f"--options {path}: {exc}") from None
        if ignored:
            print(f"elmokit train: note: {path}: only the architecture ('lstm', 'char_cnn') is read; training "
                  f"settings {ignored} there are not used — pass them as options (--batch-size, --epochs, ...)",
                  file=sys.stderr)
        return options
    return PRESETS[args.preset or "small"]().to_options()


def _same_files(given: list[str], saved: list[str]) -> bool:
    return [str(Path(g)) for g in given] == [str(Path(s)) for s in saved]


def _resumed_config(args: argparse.Namespace, out: Path):
    """The saved TrainConfig of the run in ``out``, with the options that may change on --resume applied.

    Raises:
        MissingFileError: no ``train_config.json`` in ``out``.
        CheckpointError: it cannot be read as a TrainConfig.
        UsageError: an option that fixes the run was given with another value than the run's (all are named).
    """
    from ..training.trainer import TrainConfig

    saved = out / "train_config.json"
    if not saved.is_file():
        raise MissingFileError(f"nothing to resume in {out}: no train_config.json (drop --resume to start a run)")
    try:
        config = TrainConfig(**json.loads(saved.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as exc:  # not UTF-8, not JSON, not an object, unknown or missing fields
        raise CheckpointError(f"{saved} is not a readable training configuration ({exc})") from None
    config.out_dir = str(out)  # the folder may have been moved since the run started
    parser = args._parser
    given = {a for a in vars(args) if getattr(args, a) != parser.get_default(a)}
    if not args.train_files:
        given.discard("train_files")
    changed = []
    for arg, field_name in RESUME_FIXED.items():
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
        raise UsageError(f"{', '.join(changed)}: differ from the run being resumed (see {saved}); only "
                         f"{', '.join('--' + a.replace('_', '-') for a in RESUME_MAY_CHANGE)} may change on "
                         "--resume. Start a new --out-dir to change the others")
    for arg, field_name in RESUME_MAY_CHANGE.items():
        if field_name and getattr(args, arg) != parser.get_default(arg):
            setattr(config, field_name, getattr(args, arg))
    if args.nondeterministic:
        config.deterministic = False
    config.progress = not args.no_progress
    return config


def cmd_train(args: argparse.Namespace) -> int:
    """Start a run in ``--out-dir`` (refused where a run already is, unless ``--overwrite``), or ``--resume`` it."""
    from ..training.trainer import TrainConfig, Trainer

    out = args.out_dir
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out-dir {out} is a file: give a folder (it is created if missing)")
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in --out-dir and --overwrite replaces it: give one of them")
    if args.device is not None:
        resolve_cli_device(args.device)  # fail before the corpus is read
    if args.resume:
        config = _resumed_config(args, out)
    else:
        if not args.train_files:
            raise UsageError("no training files: give glob pattern(s) of the training shards (or --resume to "
                             "continue the run in --out-dir)")
        if args.vocab is not None:
            check_input_file(Path(args.vocab), "--vocab file")
        chosen = dict(
            vocab_file=args.vocab, min_count=args.min_count, max_vocab=args.max_vocab, char_vocab=args.char_vocab,
            batching=args.batching, batch_size=args.batch_size, unroll_steps=args.unroll_steps, n_epochs=args.epochs,
            max_steps=args.max_steps, optimizer=args.optimizer, lr=args.lr, clip_norm=args.clip_norm,
            dropout=args.dropout, n_negative_samples=args.negatives, seed=args.seed,
            checkpoint_every=args.checkpoint_every, checkpoint_minutes=args.checkpoint_minutes,
            keep_checkpoints=args.keep_checkpoints, log_every=args.log_every, decode_errors=args.decode_errors,
            device=args.device,
        )
        # options left out take TrainConfig's defaults (the CLI's defaults are None so that --resume can tell
        # an option repeated from one left out)
        config = TrainConfig(train_files=args.train_files, out_dir=str(out), model=_model_options(args),
                             progress=not args.no_progress, deterministic=not args.nondeterministic,
                             **{k: v for k, v in chosen.items() if v is not None})
    trainer = Trainer(config)
    summary = trainer.train(resume=True) if args.resume else trainer.train(overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0


def train_interrupted_note(args: argparse.Namespace) -> str:
    """What an interrupted ``train`` left: the latest checkpoint (and the --resume hint) or none."""
    try:
        from ..training.trainer import latest_checkpoint_step

        step = latest_checkpoint_step(args.out_dir)
    except Exception:  # noqa: BLE001 (the note must never hide the interrupt itself)
        step = None
    if step is None:
        return f"no checkpoint was written in {args.out_dir} yet, so there is nothing to resume"
    return f"the checkpoint of step {step} in {args.out_dir} is kept (continue with --resume)"


# ---------------------------------------------------------------------------------------------- evaluation
def _check_lm_folder(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UsageError(f"the model {path} is a file: give the model folder that `elmokit train` writes "
                         "(OUT_DIR/model)")
    if not path.exists():
        raise MissingFileError(f"the model folder {path} does not exist: give the model folder that `elmokit train` "
                               "writes (OUT_DIR/model)")
    if not (path / "vocab.txt").exists() and (path / "model" / "vocab.txt").is_file():
        raise MissingFileError(f"{path} is a training run folder: give its model folder, {path / 'model'}")


def _read_sentences(args: argparse.Namespace) -> list[tuple[int, list[str]]]:
    from ..data.corpus import read_lines

    check_input_file(args.file)
    return [(number, text.split()) for number, text in read_lines(args.file, errors=args.decode_errors)]


def cmd_perplexity(args: argparse.Namespace) -> int:
    """Held-out perplexity of a trained LM over a text file (blank lines skipped), as one JSON object."""
    from ..training.perplexity import evaluate_perplexity
    from ..training.trainer import load_lm

    _check_lm_folder(args.model)
    sentences = [tokens for _, tokens in _read_sentences(args) if tokens]  # blank lines are not sentences
    if not sentences:
        raise DataError(f"{args.file} holds no sentence (only blank lines): nothing to evaluate")
    lm = load_lm(args.model).to(resolve_cli_device(args.device))
    result = evaluate_perplexity(lm, sentences, batch_size=args.batch_size)
    print(json.dumps(result, indent=2))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """One JSON line per input line: forward and backward log-probability (nats)."""
    from ..training.perplexity import score_sentences
    from ..training.trainer import load_lm

    _check_lm_folder(args.model)
    lines = _read_sentences(args)
    lm = load_lm(args.model).to(resolve_cli_device(args.device))
    scores = score_sentences(lm, [tokens for _, tokens in lines], args.batch_size)
    for (number, tokens), (f, b) in zip(lines, scores):
        interrupts.check()
        print_json_line({"line": number, "sentence": " ".join(tokens), "words": len(tokens),
                         "logprob_forward": f, "logprob_backward": b})
    return 0


# ---------------------------------------------------------------------------------------------- parser
def _train_default(name: str, unit: str = "") -> str:
    """``"(default: X)"`` from TrainConfig's field ``name`` — what a new run takes when the option is left out."""
    from ..training.trainer import TrainConfig

    for f in dataclasses.fields(TrainConfig):
        if f.name == name:
            if f.default is None:
                return "(default: none)"
            return f"(default: {f.default}{unit})"
    return "(default: TrainConfig's)"


def _add_lm_file_args(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``perplexity`` and ``score``: a trained LM folder and a text file."""
    p.add_argument("model", type=path_arg, help="a trained model folder (OUT_DIR/model, as `elmokit train` writes "
                                                "it: biLM + softmax + vocab.txt)")
    p.add_argument("file", type=path_arg, help="tokenised text, one sentence per line (UTF-8)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="sentences per forward pass (default: %(default)s)")
    p.add_argument("--decode-errors", choices=DECODE_CHOICES, default="strict",
                   help="invalid UTF-8: stop naming the file and line (strict), replace or ignore the bad bytes, or "
                        "skip the line (default: %(default)s)")
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    from ..config import PRESETS
    from ..training.trainer import TrainConfig

    d = _train_default
    adagrad_lr = TrainConfig([], "", {}, optimizer="adagrad").learning_rate
    adam_lr = TrainConfig([], "", {}, optimizer="adam").learning_rate
    p = sub.add_parser(
        "train", parents=parents, help="pretrain (or --resume) a biLM on tokenised text, one sentence per line",
        description="Pretrain a biLM; with --resume, continue the run in --out-dir from its latest checkpoint. "
                    "Options left out take the defaults shown (on --resume: the run's own values). On --resume only "
                    f"{', '.join('--' + a.replace('_', '-') for a in RESUME_MAY_CHANGE)} may change.")
    p.add_argument("train_files", nargs="*", type=text_arg,
                   help="glob pattern(s) of the training shards (one tokenised sentence per line, UTF-8); may be "
                        "left out with --resume")
    p.add_argument("--out-dir", required=True, type=path_arg,
                   help="run folder: train_config.json, checkpoints, metrics.jsonl, model/")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out-dir (default: refuse, so a finished run is not lost)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out-dir from its latest checkpoint (default: start a new run)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="architecture preset (default: small)")
    p.add_argument("--options", type=text_arg,
                   help="options.json with the architecture; overrides --preset (default: none)")
    p.add_argument("--vocab", type=text_arg,
                   help="bilm-tf vocabulary file (default: built from the training files)")
    p.add_argument("--min-count", type=positive_int, help=f"words seen fewer times become <UNK> {d('min_count')}")
    p.add_argument("--max-vocab", type=int_at_least(3),
                   help="keep at most this many entries, the three specials <S> </S> <UNK> included (default: no "
                        "limit)")
    p.add_argument("--char-vocab", action="store_true",
                   help="character-vocabulary input (CJK) instead of UTF-8 bytes (default: bytes)")
    p.add_argument("--batching", choices=["sentences", "windows"], default=None,
                   help="whole sentences from a zero state (as elmokit embeds) or bilm-tf's stream windows with "
                        f"carried state {d('batching')}")
    p.add_argument("--batch-size", type=positive_int, help=f"sentences (or windows) per step {d('batch_size')}")
    p.add_argument("--unroll-steps", type=positive_int,
                   help=f"window length in tokens, and the loss scale {d('unroll_steps')}")
    p.add_argument("--epochs", type=positive_int, help=f"passes over the data {d('n_epochs')}")
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps (default: the epochs decide)")
    p.add_argument("--optimizer", choices=["adagrad", "adam"], default=None, help=f"{d('optimizer')}")
    p.add_argument("--lr", type=positive_float,
                   help=f"learning rate (default: {adagrad_lr:g} with adagrad, {adam_lr:g} with adam)")
    p.add_argument("--clip-norm", type=positive_float, help=f"global gradient-norm clip {d('clip_norm')}")
    p.add_argument("--dropout", type=probability, help=f"dropout rate, in [0, 1) {d('dropout')}")
    p.add_argument("--negatives", type=non_negative_int,
                   help=f"sampled-softmax negatives, 0 = full softmax {d('n_negative_samples')}")
    p.add_argument("--seed", type=seed, help=f"data order, initialisation, dropout, sampler {d('seed')}")
    p.add_argument("--checkpoint-every", type=positive_int, help=f"checkpoint every N steps {d('checkpoint_every')}")
    p.add_argument("--checkpoint-minutes", type=positive_float,
                   help="also checkpoint when this many minutes passed since the last one (default: off)")
    p.add_argument("--keep-checkpoints", type=positive_int,
                   help=f"how many of the latest checkpoints to keep {d('keep_checkpoints')}")
    p.add_argument("--log-every", type=positive_int, help=f"log metrics every N steps {d('log_every')}")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    p.add_argument("--device", type=text_arg, default=None, help=f"{DEVICE_HELP} {d('device')}")
    p.add_argument("--nondeterministic", action="store_true",
                   help="allow non-deterministic kernels (about 6%% faster on CPU; runs no longer repeat "
                        "bit-exactly) (default: deterministic)")
    p.add_argument("--decode-errors", choices=DECODE_CHOICES, default=None,
                   help="invalid UTF-8 in the corpus: stop naming the file and line (strict), or replace, ignore "
                        f"or skip {d('decode_errors')}")
    p.set_defaults(func=cmd_train, _parser=p, interrupted_note=train_interrupted_note)

    p = sub.add_parser("perplexity", parents=parents,
                       help="held-out perplexity (full softmax): forward, backward, average",
                       description="Perplexity of each sentence read from a zero state, per direction over its words "
                                   "plus one boundary (</S> forward, <S> backward); unknown words count as <UNK>; "
                                   "blank lines are skipped.")
    _add_lm_file_args(p)
    p.set_defaults(func=cmd_perplexity)

    p = sub.add_parser("score", parents=parents,
                       help="per-sentence log-probability (nats) under each direction, one JSON line each",
                       description="One JSON line per input line (blank lines included, as empty sentences): line, "
                                   "sentence, words, logprob_forward = log p(w1 … wn </S>), logprob_backward = "
                                   "log p(<S> w1 … wn) read right to left, in nats, full softmax.")
    _add_lm_file_args(p)
    p.set_defaults(func=cmd_score)
