"""``elmokit embed MODEL INPUT OUTPUT``: a text file, one sentence per line → HDF5 (streamed, in resumable parts)."""

from __future__ import annotations

import argparse
from pathlib import Path

from elmokit.cli.common import (
    DECODE_CHOICES,
    DEVICE_HELP,
    RELEASED_HELP,
    add_threads_option,
    check_input_file,
    check_model,
    model_inputs,
    path_arg,
    positive_int,
    resolve_cli_device,
    text_arg,
)
from elmokit.data.corpus import read_lines
from elmokit.embedding import Embedder
from elmokit.embedding import writer as embed_output
from elmokit.embedding.pooling import parse_layers
from elmokit.embedding.reader import INDEX_NAME, check_embeddings_output, work_folder
from elmokit.errors import DataError, MissingFileError, UsageError
from elmokit.io import check_not_an_input, check_writable_folder

__all__ = ["register", "cmd_embed"]


def _layers_arg(text: str):
    """argparse type for --layers: all | top | average | a layer number | L+1 comma-separated mix weights."""
    try:
        return parse_layers(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("layers ")) from None


def _read_word_list(path: Path) -> list[str]:
    """--cache-vocab: one word per line (UTF-8, a BOM allowed), blank lines skipped."""
    check_input_file(path, "--cache-vocab file")
    words = [text.strip() for _, text in read_lines(path) if text.strip()]
    if not words:
        raise DataError(f"the --cache-vocab file {path} holds no words (expected one word per line)")
    return words


def _layers(args: argparse.Namespace):
    """--layers, or AllenNLP's --all/--top/--average (the same choice twice is fine, two different ones are not)."""
    alias = args.layers_alias
    if alias is not None and args.layers is not None and args.layers != parse_layers(alias):
        raise UsageError(f"--{alias} and --layers {args.layers.text()} ask for different layers: give one of them")
    if alias is not None:
        return parse_layers(alias)
    return args.layers if args.layers is not None else parse_layers("all")


def _check_output(args: argparse.Namespace) -> None:
    """OUTPUT is none of the inputs (the sentences, --cache-vocab, the model's files: after symlinks and hard links),
    can be written, and replaces an existing file only with --overwrite and only when elmokit wrote it
    (:func:`elmokit.io.check_output_path`)."""
    inputs = {"input file": args.input, "--cache-vocab file": args.cache_vocab, **model_inputs(args.model)}
    if args.format == "parts":
        if args.output.exists() and not args.output.is_dir():
            raise UsageError(f"the output {args.output} is a file; --format parts writes a folder")
        if args.output.exists() and args.output.resolve() == args.input.resolve().parent:
            raise UsageError(f"the output folder {args.output} holds the input: choose a new folder")
        check_not_an_input(args.output, inputs, "the output")
        parent = args.output.resolve().parent
        if parent.exists() and not parent.is_dir():
            raise UsageError(f"the output {args.output} cannot be written: {parent} is a file, not a folder")
        if not parent.is_dir():
            raise MissingFileError(f"the output {args.output}: its folder {parent} does not exist (create it first)")
        if not args.output.exists():  # (an existing one is probed by taking its lock: a probe there could race)
            check_writable_folder(parent, args.output, "the output")
        return
    check_embeddings_output(args.output, inputs, args.overwrite, "--overwrite")


def cmd_embed(args: argparse.Namespace) -> int:
    """Check every argument (model first, then input, then output), load the model, embed, report."""
    from elmokit.weights.native import load_pretrained_bilm, resolve_model_name  # lazy: CLI start-up

    args.model = str(resolve_model_name(args.model))  # a zoo name → its folder (or the error saying how to build it)
    check_model(args.model)
    check_input_file(args.input)
    _check_output(args)
    layers = _layers(args)
    words = _read_word_list(args.cache_vocab) if args.cache_vocab is not None else None
    device = resolve_cli_device(args.device)
    embedder = Embedder(
        load_pretrained_bilm(args.model),
        batch_size=args.batch_size,
        device=device,
        precision=args.precision,
        batch_invariant=args.batch_invariant,
    )
    embedder.output_spec(layers, args.pool, args.keep_sentence_boundaries, args.dtype)  # a bad --layers: before work
    if words is not None:
        embedder.set_token_cache(words)
    n = embedder.embed_file(
        args.input,
        args.output,
        layers=layers,
        decode_errors=args.decode_errors,
        progress=not args.no_progress,
        format=args.format,
        pool=args.pool,
        keep_sentence_boundaries=args.keep_sentence_boundaries,
        dtype=args.dtype,
        use_sentence_keys=args.use_sentence_keys,
        forget_sentences=args.forget_sentences,
        tokenizer=args.tokenizer,
        resume=args.resume,
        workers=args.workers,
        worker_threads=args.worker_threads,
        part_size=args.part_size,
        model_name=args.model,
        overwrite=args.overwrite,
    )
    rank, world = embed_output.torchrun_rank()
    if rank != 0:  # under torchrun: process 0 merges and reports
        return 0
    skipped = embedder.skipped_lines
    note = (
        f" ({len(skipped)} undecodable line(s) skipped, each an empty dataset: line "
        f"{', '.join(map(str, skipped[:10]))}{' ...' if len(skipped) > 10 else ''})"
        if skipped
        else ""
    )
    print(f"embedded {n - len(skipped)} sentences → {args.output}{note}")
    return 0


def embed_interrupted_note(args: argparse.Namespace) -> str:
    """What an interrupted ``embed`` leaves: the finished parts, and how to continue."""
    folder = work_folder(args.output, args.format)
    if (folder / INDEX_NAME).is_file():
        return f"the finished parts are kept in {folder}: rerun the same command with --resume to continue from them"
    return "nothing partial was written"


def _add_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL, INPUT and OUTPUT."""
    p.add_argument(
        "model",
        type=text_arg,
        help=f"{RELEASED_HELP}, or a model trained here (elmokit-en, elmokit-zh: `elmokit zoo build`)",
    )
    p.add_argument("input", type=path_arg, help="text file, one sentence per line (UTF-8 whatever the locale)")
    p.add_argument(
        "output",
        type=path_arg,
        help="HDF5 file to write (an existing one only with --overwrite), or the folder for --format parts",
    )


def _add_format_options(p: argparse.ArgumentParser) -> None:
    """--format, and which layers: --layers or AllenNLP's --all / --top / --average."""
    p.add_argument(
        "--format",
        choices=["hdf5", "allennlp", "parts"],
        default="hdf5",
        help='hdf5: one file, datasets "i" + a "sentences" string dataset (constant memory); allennlp: '
        'one file, datasets "i" + the JSON "sentence_to_index" of AllenNLP\'s `elmo` command (built '
        "in memory: small files); parts: a folder of part files + index.json, not merged "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--layers",
        type=_layers_arg,
        default=None,
        metavar="LAYERS",
        help="all, top, average, a layer number (0 = token layer), or L+1 comma-separated weights of a "
        "fixed mix, e.g. 0,0.5,0.5 (default: all)",
    )
    alias = p.add_mutually_exclusive_group()
    for name, what in (("all", "all layers"), ("top", "the top layer"), ("average", "the average of the layers")):
        alias.add_argument(
            f"--{name}",
            dest="layers_alias",
            action="store_const",
            const=name,
            help=f"{what} (AllenNLP's spelling of --layers {name}; default: off)",
        )


def _add_content_options(p: argparse.ArgumentParser) -> None:
    """What each dataset holds: pooling, boundaries, precision, keys, sentence texts, tokens, the word cache."""
    p.add_argument(
        "--pool",
        choices=["none", "mean", "max"],
        default="none",
        help="one vector per token (none), or the mean / max over the sentence's real tokens (padding "
        "never counts) (default: %(default)s)",
    )
    p.add_argument(
        "--keep-sentence-boundaries",
        action="store_true",
        help="include the <S> and </S> positions (n = tokens + 2; pooled over too) (default: dropped)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="stored precision; float16 halves the file (relative error <= 2^-11) (default: %(default)s)",
    )
    p.add_argument(
        "--use-sentence-keys",
        action="store_true",
        help="name each dataset by its stripped line instead of its number (AllenNLP's "
        "use_sentence_keys; / %% NUL and a lone . are %%-escaped; a repeated line is stored once; "
        "blank lines are left out) (default: named by line number)",
    )
    p.add_argument(
        "--forget-sentences",
        action="store_true",
        help="do not store the sentence texts (AllenNLP's --forget-sentences) (default: stored)",
    )
    p.add_argument(
        "--tokenizer",
        choices=["whitespace", "moses", "jieba"],
        default="whitespace",
        help="split lines on whitespace (pre-tokenised text), or tokenise raw text with sacremoses "
        "(English Moses rules) or jieba (Chinese word segmentation) (default: %(default)s)",
    )
    p.add_argument(
        "--cache-vocab",
        type=path_arg,
        default=None,
        metavar="FILE",
        help="a word list (one per line): their token vectors are computed once and reused; other words "
        "are encoded from their characters (AllenNLP's vocab_to_cache; same results) (default: none)",
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """How the run goes: workers, parts, resume/overwrite, batches, device, bad input, progress."""
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="worker processes, each writing its own parts (default: %(default)s: in this process)",
    )
    p.add_argument(
        "--worker-threads",
        type=positive_int,
        default=1,
        help="torch threads per worker process with --workers > 1 (default: %(default)s)",
    )
    p.add_argument(
        "--part-size",
        type=positive_int,
        default=10000,
        help="lines per part: the unit of atomic writing and of --resume (default: %(default)s)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from its finished parts (same settings and input required; "
        "--batch-size and --workers may change) (default: start afresh)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing OUTPUT (a file, or a parts folder of finished embeddings), or start an "
        "interrupted run's parts again (default: refuse)",
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=64, help="sentences per forward pass, at most (default: %(default)s)"
    )
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the biLM's matrix products in bfloat16 (vectors move by about 1e-2 of their scale; see "
        "docs/how-to/bf16.md); the stored values are float32 (or --dtype) either way (default: %(default)s)",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="fp32 CPU: each sentence's vectors the same bits at any --batch-size, --workers or thread count (0.72× "
        "the tokens/s at batch 64; docs/explanation/numerics.md) (default: off)",
    )
    p.add_argument(
        "--decode-errors",
        choices=DECODE_CHOICES,
        default="strict",
        help="invalid UTF-8 in the input: stop naming the file and line (strict), replace or ignore the "
        "bad bytes, or skip the line (its dataset is then empty) (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``embed``: its arguments, then its option groups, in the order ``--help`` lists them."""
    p = sub.add_parser(
        "embed",
        parents=parents,
        help="embed a file of sentences (one per line) into HDF5",
        description="Embed a text file, one sentence per line (always read as UTF-8), into HDF5, in constant memory: "
        'dataset "i" holds line i+1\'s vectors, (L+1, n, 2P) for --layers all or (n, 2P) for one layer '
        "or a mix, pooled to (L+1, 2P) / (2P) with --pool. Work is written in parts of --part-size lines, "
        "each finalised atomically, in OUTPUT.parts/ (merged into OUTPUT at the end); an interrupted run "
        "continues with --resume. A blank line gives an empty array.",
    )
    _add_arguments(p)
    _add_format_options(p)
    _add_content_options(p)
    _add_run_options(p)
    add_threads_option(p)
    p.set_defaults(func=cmd_embed, interrupted_note=embed_interrupted_note)
