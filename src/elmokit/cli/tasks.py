"""``elmokit tag …`` and ``elmokit classify …``: train, apply and score downstream task models on frozen ELMo.

* ``elmokit tag train CONFIG [--out DIR] [--seed N]`` — train a BiLSTM-CRF tagger from a TOML task config
  (:mod:`elmokit.tasks.config`), early stopping on the dev file, scores on dev/test, the model saved to DIR;
* ``elmokit tag predict MODEL_DIR INPUT [--tokenize]`` — tag a file: one sentence per line, tokens separated by
  spaces (or raw text with ``--tokenize``, split as the model's biLM corpus was); writes ``token<TAB>tag`` lines, a
  blank line after each sentence (CoNLL style);
* ``elmokit tag evaluate MODEL_DIR FILE`` — score a labelled file (read with the model's reader) and print one JSON
  line (entity F1 per type, or accuracy);
* ``elmokit classify train|predict|evaluate`` — the same for a sentence classifier; ``predict`` writes
  ``label<TAB>sentence`` lines.

Blank input lines are skipped by ``predict``. A gold label the model never saw in training makes ``evaluate`` fail
with ``FILE:LINE`` (exit 1) unless ``--unseen-labels wrong`` counts it as an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elmokit.cli.common import (
    DEVICE_HELP,
    add_threads_option,
    check_input_file,
    check_output_file,
    path_arg,
    positive_int,
    print_json_line,
    resolve_cli_device,
    seed,
)
from elmokit.data.tokenizers import load_tokenizer, word_tokenizer
from elmokit.errors import DataError, UsageError, import_optional
from elmokit.io import atomic_write_text, check_creatable_folder, folder_lock
from elmokit.tasks.config import load_task_config

__all__ = ["register", "cmd_train", "cmd_predict", "cmd_evaluate"]

_WHAT = {"tag": "tagger", "classify": "classifier"}
_UNSEEN_HELP = (
    "gold labels never seen in training: error (stop, naming FILE:LINE) or wrong (count them as "
    "errors) (default: error)"
)


def _say(args: argparse.Namespace, text: str) -> None:
    print(f"elmokit {args.command} {args.task_command}: {text}", file=sys.stderr, flush=True)


def _check_kind(args: argparse.Namespace, kind: str, where: str) -> None:
    if kind != args.command:
        raise UsageError(f"{where} is a {kind!r} task ({_WHAT[kind]}): use `elmokit {kind} {args.task_command}`")


def _summary(result: dict) -> str:
    return f"{result['metric']} {result['score']:.2f} ({result['sentences']} sentences)"


def _require_task_libraries(kind: str) -> None:
    """Raise :class:`~elmokit.errors.MissingExtraError` (one line naming ``pip install 'elmokit[tasks]'``) when a
    library that the ``kind`` of task model always needs is missing: checked before any work, so that it is named at
    once rather than after the biLM layers of the data are computed."""
    if kind == "tag":
        import_optional("torchcrf", "tasks", "the CRF tagger")
    elif kind == "classify":
        import_optional("sklearn.metrics", "tasks", "macro F1 (scikit-learn)")


def cmd_train(args: argparse.Namespace) -> int:
    """Train from a config; save; print the dev/test scores (text, or one JSON line with ``--json``)."""
    from elmokit.tasks.training import train_from_config  # lazy: CLI start-up

    check_input_file(args.config, "task config")
    config = load_task_config(args.config)
    _check_kind(args, config.task, f"the config {args.config}")
    _require_task_libraries(config.task)
    out = args.out if args.out is not None else Path(f"{args.config.stem}-model")
    check_creatable_folder(out, "--out")
    device = resolve_cli_device(args.device)
    # one writer per folder: held from before the check to the saved model (train_from_config holds it again)
    with folder_lock(out, "task model folder (--out)"):
        if (out / "task.json").exists() and not args.overwrite:
            raise UsageError(
                f"--out {out} already holds a task model: pass --overwrite to replace it, or another --out"
            )
        model = train_from_config(
            config,
            out_dir=out,
            seed=args.seed,
            device=device,
            unseen=args.unseen_labels,
            log=lambda text: _say(args, text),
            progress=not args.no_progress,
        )
    r = model.results
    if args.json:
        print_json_line({"model_dir": str(out), "bilm": model.bilm_record, **r})
        return 0
    parts = [f"dev {_summary(r['dev'])}"]
    if "test" in r:
        parts.append(f"test {_summary(r['test'])}")
    print(
        f"{_WHAT[config.task]} saved to {out} (best epoch {r['best_epoch']}, {r['train_seconds']:.0f} s): "
        + "; ".join(parts)
    )
    for i, mix in enumerate(r["mix_weights"]):
        weights = ", ".join(f"{w:.3f}" for w in mix["weights"])
        print(f"ELMo mix {i} ({'input' if i == 0 else 'output'}): softmax(s) = [{weights}], gamma = {mix['gamma']:.3f}")
    return 0


def _tokenizer(model):
    """Raw line → tokens, for ``--tokenize``: characters for character-tagged data, else ``data.tokenizer`` or
    the biLM's zoo tokeniser (its corpus's), else sacremoses English."""
    config = model.config
    if config.data.reader == "char_ner":
        return lambda line: [c for c in line if not c.isspace()]
    name = config.data.tokenizer
    if name is None and model.bilm_record is not None:
        candidate = model.bilm_record.get("random_like") or model.bilm_record.get("model")
        from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

        try:
            folder = Path(resolve_model_name(candidate))
        except Exception:  # noqa: BLE001 — no zoo model: fall back below
            folder = None
        if folder is not None and (folder / "tokenizer.json").is_file():
            name = str(folder)
    if name is not None and name != "whitespace":
        tokenize = load_tokenizer(name)
        return lambda line: [t for sentence in tokenize(line) for t in sentence]
    if name == "whitespace":
        return str.split
    return word_tokenizer("moses")  # the one Moses tokeniser (its words pass the same clean-up as embed's)


def _read_input(path: Path, tokenize) -> list[list[str]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from None
    sentences = []
    for line in text.splitlines():
        if not line.strip():
            continue
        tokens = tokenize(line) if tokenize is not None else line.split()
        if tokens:
            sentences.append(tokens)
    return sentences


def cmd_predict(args: argparse.Namespace) -> int:
    """Tag or classify each line of INPUT; write the result to stdout or ``--output``."""
    from elmokit.tasks.training import TaskData, load_task_model  # lazy: CLI start-up

    check_input_file(args.input, "input")
    if args.output is not None and args.output.is_dir():
        raise UsageError(f"--output {args.output} is a folder: give a file path")
    if args.output is not None:
        inputs = {"input": args.input, "model folder": args.model_dir}
        check_output_file(args.output, inputs, overwrite=args.overwrite, what="--output")
    model = load_task_model(args.model_dir, device=resolve_cli_device(args.device))
    _check_kind(args, model.kind, f"the model {args.model_dir}")
    sentences = _read_input(args.input, _tokenizer(model) if args.tokenize else None)
    predictions = model.predict(TaskData(tokens=sentences), batch_size=args.batch_size)
    if model.kind == "tag":
        lines = []
        for tokens, tags in zip(sentences, predictions):
            lines.extend(f"{t}\t{g}" for t, g in zip(tokens, tags))
            lines.append("")
    else:
        lines = [f"{label}\t{' '.join(tokens)}" for tokens, label in zip(sentences, predictions)]
    text = "\n".join(lines) + ("\n" if lines else "")
    if args.output is not None:
        atomic_write_text(args.output, text)
        _say(args, f"{len(sentences)} sentences → {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Score a labelled file; print one JSON line."""
    from elmokit.tasks.training import load_task_model, read_task_file  # lazy: CLI start-up

    check_input_file(args.file, "labelled file")
    model = load_task_model(args.model_dir, device=resolve_cli_device(args.device))
    _check_kind(args, model.kind, f"the model {args.model_dir}")
    data = read_task_file(model.config, args.file)
    result = model.evaluate(data, unseen=args.unseen_labels, batch_size=args.batch_size)
    print_json_line({"file": str(args.file), "model_dir": str(args.model_dir), **result})
    return 0


def _train_note(args: argparse.Namespace) -> str:
    return "the model was not saved (train again; the cached biLM features are kept)"


def _add_train(tsub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], kind: str, what: str) -> None:
    """``elmokit KIND train CONFIG``."""
    p = tsub.add_parser(
        "train",
        parents=parents,
        help=f"train a {what} from a TOML task config",
        description=f"Train a {what} from a TOML task config (see elmokit.tasks.config: data "
        "files and reader, biLM, static vectors, char CNN, sizes, budget); early "
        "stopping on the dev file; dev and test scores printed; the model saved.",
    )
    p.add_argument("config", type=path_arg, help="the task config (.toml)")
    p.add_argument(
        "--out",
        type=path_arg,
        default=None,
        help="folder for the trained model (default: CONFIG_STEM-model in the current folder)",
    )
    p.add_argument(
        "--seed",
        type=seed,
        default=None,
        help="random seed for initialisation, batch order and dropout (default: train.seed of the config)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a model already in --out (default: refuse)")
    p.add_argument("--unseen-labels", choices=("error", "wrong"), default="error", help=_UNSEEN_HELP)
    p.add_argument("--device", default="auto", help=f"{DEVICE_HELP} (default: auto)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON line (default: text)")
    add_threads_option(p)
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar while the biLM layers of the data files are computed (default: shown)",
    )
    p.set_defaults(func=cmd_train, interrupted_note=_train_note)


def _add_predict(
    tsub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], kind: str, what: str
) -> None:
    """``elmokit KIND predict MODEL_DIR INPUT``."""
    p = tsub.add_parser(
        "predict",
        parents=parents,
        help=f"apply a trained {what} to new text",
        description=f"Apply a trained {what} to INPUT, one sentence per line: tokens separated "
        "by spaces, or raw text with --tokenize. "
        + (
            "Writes token<TAB>tag lines, a blank line after each sentence."
            if kind == "tag"
            else "Writes label<TAB>sentence lines."
        ),
    )
    p.add_argument("model_dir", type=path_arg, help=f"a folder written by `elmokit {kind} train`")
    p.add_argument("input", type=path_arg, help="UTF-8 text, one sentence per line (blank lines skipped)")
    p.add_argument(
        "--tokenize",
        action="store_true",
        help="INPUT is raw text: split it as the biLM's corpus was (its zoo tokeniser; characters for "
        "Chinese character tagging) (default: split on spaces)",
    )
    p.add_argument("--output", type=path_arg, default=None, help="write here instead of stdout (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file (default: refuse)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences per batch (default: 64)")
    p.add_argument("--device", default="auto", help=f"{DEVICE_HELP} (default: auto)")
    add_threads_option(p)
    p.set_defaults(func=cmd_predict)


def _add_evaluate(
    tsub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser], kind: str, what: str
) -> None:
    """``elmokit KIND evaluate MODEL_DIR FILE``."""
    p = tsub.add_parser(
        "evaluate",
        parents=parents,
        help=f"score a trained {what} on a labelled file",
        description=f"Score a trained {what} on FILE (read as its training data was) and print "
        "one JSON line: "
        + (
            "entity F1/precision/recall overall and per type (seqeval), or token accuracy."
            if kind == "tag"
            else "accuracy."
        ),
    )
    p.add_argument("model_dir", type=path_arg, help=f"a folder written by `elmokit {kind} train`")
    p.add_argument("file", type=path_arg, help="a labelled file in the model's training format")
    p.add_argument("--unseen-labels", choices=("error", "wrong"), default="error", help=_UNSEEN_HELP)
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences per batch (default: 64)")
    p.add_argument("--device", default="auto", help=f"{DEVICE_HELP} (default: auto)")
    add_threads_option(p)
    p.set_defaults(func=cmd_evaluate)


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``tag`` and ``classify``, each with ``train``, ``predict`` and ``evaluate``."""
    for kind, what, help_text in (
        ("tag", "tagger", "sequence tagging (NER, POS): a BiLSTM-CRF on [static vectors; ELMo]"),
        ("classify", "classifier", "sentence classification (SST, …): a BiLSTM with pooling on [static vectors; ELMo]"),
    ):
        top = sub.add_parser(
            kind,
            parents=parents,
            help=help_text,
            description=f"{help_text[0].upper()}{help_text[1:]}, the biLM frozen (its layers computed "
            "once per file and cached under $ELMOKIT_CACHE/features), a learned layer "
            "mix; train from a TOML config, predict, evaluate.",
        )
        tsub = top.add_subparsers(
            dest="task_command",
            required=True,
            metavar="ACTION",
            help="train (from a config), predict (new text), evaluate (a labelled file)",
        )
        _add_train(tsub, parents, kind, what)
        _add_predict(tsub, parents, kind, what)
        _add_evaluate(tsub, parents, kind, what)
