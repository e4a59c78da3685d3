"""``elmokit train | perplexity | score``: pretrain (or resume, or continue from released weights) a biLM, and
evaluate a trained one.

``train``'s options default to ``None`` in argparse on purpose: with ``--resume`` an option left out keeps the run's
value, and one given must equal it unless :data:`elmokit.pretraining.config.RESUME_MAY_CHANGE` lets it change (the
rules live with :class:`~elmokit.pretraining.config.TrainConfig`); the defaults a new run takes are TrainConfig's,
and the help text shows them from there (the option groups: :mod:`elmokit.cli.train_options`). :data:`OPTION_FIELDS`
maps every option to its TrainConfig field.

Several processes: ``torchrun --nproc-per-node N -m elmokit train …`` (see :mod:`elmokit.pretraining.distributed`);
only process 0 prints the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elmokit import interrupts
from elmokit.cli.common import (
    add_threads_option,
    check_input_file,
    check_model,
    print_json_line,
    read_options_json,
    resolve_cli_device,
)
from elmokit.cli.train_options import (
    add_execution_args,
    add_heldout_and_checkpoint_args,
    add_lm_file_args,
    add_model_args,
    add_optimisation_args,
    add_run_args,
)
from elmokit.config import PRESETS, ElmoConfig
from elmokit.data.corpus import read_lines
from elmokit.data.text_checks import UNK_WARN_SHARE, check_tokenisation, unk_targets, unk_warning
from elmokit.data.tokenizers import word_tokenizer
from elmokit.errors import ConfigError, DataError, ElmoError, MissingFileError, UsageError
from elmokit.io import check_creatable_folder, check_not_an_input, lock_folder

__all__ = ["register", "cmd_train", "cmd_perplexity", "cmd_score", "OPTION_FIELDS"]

#: ``train`` option (argparse dest) → TrainConfig field. ``preset`` and ``options`` both give ``model``;
#: ``nondeterministic`` and ``no_progress`` are the negations of ``deterministic`` and ``progress``.
OPTION_FIELDS = {
    "train_files": "train_files",
    "preset": "model",
    "options": "model",
    "vocab": "vocab_file",
    "min_count": "min_count",
    "max_vocab": "max_vocab",
    "char_vocab": "char_vocab",
    "batching": "batching",
    "batch_size": "batch_size",
    "unroll_steps": "unroll_steps",
    "epochs": "n_epochs",
    "max_steps": "max_steps",
    "optimizer": "optimizer",
    "lr": "lr",
    "lr_warmup_steps": "lr_warmup_steps",
    "lr_schedule": "lr_schedule",
    "lr_decay_steps": "lr_decay_steps",
    "lr_final": "lr_final",
    "clip_norm": "clip_norm",
    "dropout": "dropout",
    "negatives": "n_negative_samples",
    "seed": "seed",
    "checkpoint_every": "checkpoint_every",
    "checkpoint_minutes": "checkpoint_minutes",
    "keep_checkpoints": "keep_checkpoints",
    "log_every": "log_every",
    "decode_errors": "decode_errors",
    "device": "device",
    "precision": "precision",
    "nondeterministic": "deterministic",
    "no_progress": "progress",
    "valid_files": "valid_files",
    "valid_every": "valid_every",
    "valid_minutes": "valid_minutes",
    "init_from": "init_from",
    "freeze_bilm_steps": "freeze_bilm_steps",
    "data_parts": "data_parts",
}
_NEGATED = {"nondeterministic", "no_progress"}
_ARCHITECTURE_KEYS = {"lstm", "char_cnn"}


def _flag(field_name: str) -> str:
    """The option(s) that set a TrainConfig field, for messages (``model`` → ``--preset/--options``)."""
    if field_name == "train_files":
        return "the training files"
    if field_name == "out_dir":
        return "--out-dir"
    args = [a for a, f in OPTION_FIELDS.items() if f == field_name]
    if not args:
        return ""
    return "/".join("--" + a.replace("_", "-") for a in args)


def _model_options(args: argparse.Namespace) -> dict:
    """The architecture options dict from ``--options`` (its ``lstm`` and ``char_cnn`` sections) or ``--preset``."""
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
            print(
                f"elmokit train: note: {path}: only the architecture ('lstm', 'char_cnn') is read; training "
                f"settings {ignored} there are not used — pass them as options (--batch-size, --epochs, ...)",
                file=sys.stderr,
            )
        return options
    return PRESETS[args.preset or "small"]().to_options()


def _given(args: argparse.Namespace) -> dict:
    """TrainConfig field → value for every option given on the command line (not left at its None default)."""
    parser = args._parser
    out: dict = {}
    for arg, field_name in OPTION_FIELDS.items():
        value = getattr(args, arg)
        if value == parser.get_default(arg) or (arg == "train_files" and not value):
            continue
        if arg in ("preset", "options"):
            value = _model_options(args)
        elif arg in _NEGATED:
            value = not value
        out[field_name] = value
    return out


def _resumed_config(args: argparse.Namespace, out: Path):
    """The saved TrainConfig of the run in ``out``, with the given options applied as
    :meth:`TrainConfig.resumed` allows.

    Raises:
        MissingFileError: no ``train_config.json`` in ``out``.
        CheckpointError: it cannot be read as a TrainConfig.
        UsageError: an option that fixes the run was given with another value than the run's (all are named).
    """
    from elmokit.pretraining.config import TrainConfig  # lazy: CLI start-up

    saved = out / "train_config.json"
    if not saved.is_file():
        raise MissingFileError(f"nothing to resume in {out}: no train_config.json (drop --resume to start a run)")
    config = TrainConfig.from_json_file(saved)
    config.out_dir = str(out)  # the folder may have been moved since the run started
    changes = _given(args)
    changes["progress"] = not args.no_progress
    return config.resumed(changes, describe=_flag)


def _check_inputs_outside_the_run(args: argparse.Namespace, out: Path) -> None:
    """No file the run writes in --out-dir (its vocab.txt, model, metrics) is --vocab or --options, also through a
    symlink or a hard link (:func:`elmokit.io.check_not_an_input`): ``--overwrite`` would delete them first."""
    from elmokit.pretraining.run_folder import run_files  # lazy: CLI start-up

    inputs = {"--vocab file": args.vocab, "--options file": args.options}
    for path in run_files(out):
        check_not_an_input(path, inputs, "the run folder's file", "give a copy of it, or another --out-dir")


def cmd_train(args: argparse.Namespace) -> int:
    """Start a run in ``--out-dir`` (refused where a run already is, unless ``--overwrite``), or ``--resume`` it; with
    ``torchrun``, as one of several processes."""
    from elmokit.pretraining.config import TrainConfig  # lazy: CLI start-up
    from elmokit.pretraining.distributed import init_from_env  # lazy: CLI start-up
    from elmokit.pretraining.trainer import Trainer  # lazy: CLI start-up

    out = args.out_dir
    check_creatable_folder(out, "--out-dir")
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in --out-dir and --overwrite replaces it: give one of them")
    if args.device is not None:
        resolve_cli_device(args.device)  # fail before the corpus is read
    if args.init_from is not None:
        check_model(args.init_from)
    if args.resume:
        config = _resumed_config(args, out)
    else:
        if not args.train_files:
            raise UsageError(
                "no training files: give glob pattern(s) of the training shards (or --resume to "
                "continue the run in --out-dir)"
            )
        if args.vocab is not None:
            check_input_file(Path(args.vocab), "--vocab file")
        _check_inputs_outside_the_run(args, out)
        given = _given(args)
        given.pop("train_files", None)
        if args.init_from is None and "model" not in given:
            given["model"] = _model_options(args)  # the default preset
        # options left out take TrainConfig's defaults (the CLI's defaults are None so that --resume can tell
        # an option repeated from one left out)
        config = TrainConfig(train_files=args.train_files, out_dir=str(out), **given)
    dist = init_from_env(config.device)
    lock = None
    try:
        # one writer per run folder: taken before the corpus is read, so a second writer is refused at once (the
        # trainer holds it again while it trains)
        lock = dist.on_main(lambda: lock_folder(out, "run folder (--out-dir)"))
        trainer = Trainer(config, dist=dist)
        trainer.say = lambda text: print(f"elmokit train: {text}", file=sys.stderr, flush=True)
        summary = trainer.train(resume=True) if args.resume else trainer.train(overwrite=args.overwrite)
        if dist.is_main:
            print(json.dumps(summary, indent=2))
    except RuntimeError as exc:
        if dist.world_size > 1 and not isinstance(exc, ElmoError) and _peer_lost(exc):
            from elmokit.pretraining.trainer import TrainingError, latest_checkpoint_step  # lazy: CLI start-up

            step = latest_checkpoint_step(config.out_dir)
            kept = (
                f"the checkpoint of step {step} is kept (continue with --resume, on as many processes as its "
                "data parts allow)"
                if step is not None
                else "no checkpoint was written yet"
            )
            raise TrainingError(f"another process of this run stopped (the connection to it closed); {kept}") from None
        raise
    finally:
        if lock is not None:
            lock.release()
        dist.close()
    return 0


def _peer_lost(exc: BaseException) -> bool:
    """Whether a collective failed because another process went away (gloo/nccl report it as a RuntimeError)."""
    text = str(exc).lower()
    return any(
        s in text
        for s in (
            "connection closed by peer",
            "connection reset by peer",
            "broken pipe",
            "remote worker",
            "nccl communicator was aborted",
            "socket timeout",
        )
    )


def train_interrupted_note(args: argparse.Namespace) -> str:
    """What an interrupted ``train`` left: the latest checkpoint (and the --resume hint) or none."""
    try:
        from elmokit.pretraining.trainer import latest_checkpoint_step  # lazy: CLI start-up

        step = latest_checkpoint_step(args.out_dir)
    except Exception:  # noqa: BLE001 (the note must never hide the interrupt itself)
        step = None
    if step is None:
        if (args.out_dir / "train_config.json").is_file():  # stopped before its first checkpoint
            return (
                f"no checkpoint was written in {args.out_dir} yet: --resume starts its run again from step 0 "
                "(or start another with --overwrite)"
            )
        return f"no checkpoint was written in {args.out_dir} yet, so there is nothing to resume"
    return f"the checkpoint of step {step} in {args.out_dir} is kept (continue with --resume)"


# ---------------------------------------------------------------------------------------------- evaluation
def _check_lm_folder(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UsageError(
            f"the model {path} is a file: give the model folder that `elmokit train` writes (OUT_DIR/model)"
        )
    if not path.exists():
        raise MissingFileError(
            f"the model folder {path} does not exist: give the model folder that `elmokit train` writes (OUT_DIR/model)"
        )
    from elmokit.weights.efml import check_has_lm_head  # lazy: CLI start-up

    check_has_lm_head(path)
    if not (path / "vocab.txt").exists() and (path / "model" / "vocab.txt").is_file():
        raise MissingFileError(f"{path} is a training run folder: give its model folder, {path / 'model'}")


def _read_sentences(args: argparse.Namespace) -> list[tuple[int, list[str]]]:
    check_input_file(args.file)
    tokenize = word_tokenizer(args.tokenizer)
    return [(number, tokenize(text)) for number, text in read_lines(args.file, errors=args.decode_errors)]


def _warn(args: argparse.Namespace, text: str | None, kind: str = "warning") -> None:
    if text:
        print(f"elmokit {args.command}: {kind}: {text}", file=sys.stderr, flush=True)


def _check_text(args: argparse.Namespace, lm, lines: list[tuple[int, list[str]]]) -> None:
    """Warn (stderr) when the lines look untokenised for ``lm``
    (:func:`elmokit.data.text_checks.check_tokenisation`)."""
    _warn(args, check_tokenisation(lines, lm.config, args.tokenizer).warning())


def cmd_perplexity(args: argparse.Namespace) -> int:
    """Held-out perplexity of a trained LM over a text file (blank lines skipped), as one JSON object, with the share of
    ``<UNK>`` targets; warnings on stderr for untokenised-looking lines and a high ``<UNK>`` share."""
    from elmokit.pretraining.perplexity import evaluate_perplexity  # lazy: CLI start-up
    from elmokit.pretraining.trainer import load_lm  # lazy: CLI start-up
    from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

    args.model = Path(resolve_model_name(str(args.model)))  # a zoo name → its folder (or how to build it)
    _check_lm_folder(args.model)
    lines = [(number, tokens) for number, tokens in _read_sentences(args) if tokens]  # blank lines: no sentence
    if not lines:
        raise DataError(f"{args.file} holds no sentence (only blank lines): nothing to evaluate")
    lm = load_lm(args.model).to(resolve_cli_device(args.device))
    _check_text(args, lm, lines)
    result = evaluate_perplexity(lm, [tokens for _, tokens in lines], batch_size=args.batch_size)
    _warn(args, unk_warning(result["unk_targets"], result["tokens"], len(lm.vocab)))
    print(json.dumps(result, indent=2))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """One JSON line per input line: forward and backward log-probability (nats) and the number of ``<UNK>`` words;
    on stderr the file's ``<UNK>`` share (a warning above :data:`elmokit.data.text_checks.UNK_WARN_SHARE`) and a
    warning for untokenised-looking lines."""
    from elmokit.pretraining.perplexity import score_sentences  # lazy: CLI start-up
    from elmokit.pretraining.trainer import load_lm  # lazy: CLI start-up
    from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

    args.model = Path(resolve_model_name(str(args.model)))  # a zoo name → its folder (or how to build it)
    _check_lm_folder(args.model)
    lines = _read_sentences(args)
    lm = load_lm(args.model).to(resolve_cli_device(args.device))
    _check_text(args, lm, lines)
    scores = score_sentences(lm, [tokens for _, tokens in lines], args.batch_size)
    unknown_total = targets_total = 0
    for (number, tokens), (f, b) in zip(lines, scores):
        interrupts.check()
        unknown, targets = unk_targets(lm.vocab, [tokens])
        unknown_total += unknown
        targets_total += targets
        print_json_line(
            {
                "line": number,
                "sentence": " ".join(tokens),
                "words": len(tokens),
                "unk": unknown,
                "logprob_forward": f,
                "logprob_backward": b,
            }
        )
    warning = unk_warning(unknown_total, targets_total, len(lm.vocab))
    if warning:
        _warn(args, warning)
    elif targets_total:
        _warn(
            args,
            f"{unknown_total} of the {targets_total} targets ({100 * unknown_total / targets_total:.1f} %) are "
            f"<UNK> (a warning above {100 * UNK_WARN_SHARE:.0f} %)",
            "note",
        )
    return 0


# ---------------------------------------------------------------------------------------------- parser
def _register_train(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``elmokit train``, its options in groups (run, model, optimisation, held-out and checkpoints,
    execution)."""
    from elmokit.pretraining.config import RESUME_MAY_CHANGE  # lazy: CLI start-up

    may_change = ", ".join(sorted({_flag(f) for f in RESUME_MAY_CHANGE if _flag(f)} - {"--out-dir"}))
    p = sub.add_parser(
        "train",
        parents=parents,
        help="pretrain (or --resume) a biLM on tokenised text, one sentence per line",
        description="Pretrain a biLM; with --resume, continue the run in --out-dir from its latest checkpoint; with "
        "--init-from, continue pretraining a released or trained model on your text. Options left out "
        "take the defaults shown (on --resume: the run's own values). On --resume only "
        f"{may_change} may change. Several processes: torchrun --nproc-per-node N -m elmokit train …",
    )
    add_run_args(p)
    add_model_args(p)
    add_optimisation_args(p)
    add_heldout_and_checkpoint_args(p)
    add_execution_args(p)
    p.set_defaults(func=cmd_train, _parser=p, interrupted_note=train_interrupted_note)


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``elmokit train``, ``perplexity`` and ``score``."""
    _register_train(sub, parents)

    p = sub.add_parser(
        "perplexity",
        parents=parents,
        help="held-out perplexity (full softmax): forward, backward, average",
        description="Perplexity of each sentence read from a zero state, per direction over its words "
        "plus one boundary (</S> forward, <S> backward); unknown words count as <UNK>; "
        "blank lines are skipped.",
    )
    add_lm_file_args(p)
    add_threads_option(p)
    p.set_defaults(func=cmd_perplexity)

    p = sub.add_parser(
        "score",
        parents=parents,
        help="per-sentence log-probability (nats) under each direction, one JSON line each",
        description="One JSON line per input line (blank lines included, as empty sentences): line, "
        "sentence, words, logprob_forward = log p(w1 … wn </S>), logprob_backward = "
        "log p(<S> w1 … wn) read right to left, in nats, full softmax.",
    )
    add_lm_file_args(p)
    add_threads_option(p)
    p.set_defaults(func=cmd_score)
