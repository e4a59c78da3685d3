"""``elmokit similar MODEL SENTENCES --word W``: how a word's contextual vectors differ between its occurrences.

Prints, per layer beside layer 0 (the static, context-free token layer), the pairwise cosine similarity of the
word's occurrences (the matrix when there are few, a summary always), with labels (``label<TAB>sentence`` lines and
``--labels``) the mean similarity within and across labels; ``--corpus`` adds the nearest contextual neighbours of
each occurrence; ``--png`` draws the 2-D PCA projection of the occurrences per layer, coloured by label. See
:mod:`elmokit.analysis.polysemy` for how a word is matched (whole tokens; for CJK words also a run of tokens, e.g.
characters, whose vectors are averaged), and for the analysis this command prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elmokit.cli.common import (
    DECODE_CHOICES,
    DEVICE_HELP,
    RELEASED_HELP,
    add_threads_option,
    check_input_file,
    check_model,
    model_inputs,
    non_negative_int,
    path_arg,
    positive_int,
    print_json_line,
    resolve_cli_device,
    text_arg,
)
from elmokit.data.corpus import read_lines
from elmokit.data.text_checks import is_cjk
from elmokit.data.tokenizers import word_tokenizer
from elmokit.errors import DataError, UsageError
from elmokit.io import check_not_an_input, check_output_path

__all__ = ["register", "cmd_similar"]

_TOKENIZERS = {"whitespace": "whitespace", "sacremoses": "moses", "moses": "moses", "jieba": "jieba"}
#: What one token is, per tokenizer (for the "matched as ..." wording).
_TOKEN_KIND = {"whitespace": "token", "moses": "Moses token", "jieba": "jieba word"}


def _layers_arg(text: str) -> list[int | str]:
    """argparse type for --layers: ``all`` or comma-separated layer numbers and/or ``average``."""
    if text.strip() == "all":
        return ["all"]
    out: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if part == "average":
            out.append("average")
        elif part.isdigit():
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(
                f"must be 'all' or comma-separated layer numbers and/or 'average', got {text!r}"
            )
    if not out:
        raise argparse.ArgumentTypeError("must name at least one layer")
    return out


def _read_sentences(
    path: Path,
    tokenize,
    labelled: bool,
    decode_errors: str = "strict",
    *,
    what: str = "sentences file",
    warn_tabs: bool = False,
) -> tuple[list[int], list[list[str]], list[str | None], list[str]]:
    """(line numbers, token lists, labels, raw texts) of the non-blank lines (lines that are not valid UTF-8: as
    ``decode_errors``, :func:`elmokit.data.corpus.read_lines`). With ``warn_tabs`` (an unlabelled read), the first
    line holding a TAB prints one warning on stderr (the file is probably labelled).

    Raises:
        DataError: no non-blank line (exit 1, as ``perplexity``, ``train`` and the task readers: the file is there but
            holds nothing to read); with ``labelled``, a line without a TAB or with an empty label; a line that is not
            text (invalid UTF-8, a NUL byte) with ``strict``."""
    numbers, sentences, labels, texts = [], [], [], []
    warned = not warn_tabs
    for number, text in read_lines(path, decode_errors):
        if not text.strip():
            continue
        label = None
        if not labelled and not warned and "\t" in text:
            warned = True
            print(
                f"elmokit similar: warning: {path}:{number}: lines contain a TAB: pass --labels if the first field "
                "is a label (label<TAB>sentence)",
                file=sys.stderr,
            )
        if labelled:
            label, sep, text = text.partition("\t")
            label = label.strip()
            if not sep or not label:
                raise DataError(
                    f"{path}:{number}: with --labels each line is 'label<TAB>sentence'; this line has "
                    f"{'no tab' if not sep else 'an empty label'}"
                )
        numbers.append(number)
        sentences.append(tokenize(text))
        labels.append(label)
        texts.append(text)
    if not sentences:
        skipped = " or skipped (--decode-errors skip)" if decode_errors == "skip" else ""
        raise DataError(
            f"the {what} {path} holds no sentences (every line is blank{skipped}): give a text file, one "
            "sentence per line"
        )
    return numbers, sentences, labels, texts


def _check_png(png: Path, model: str, inputs: dict[str, Path], overwrite: bool) -> None:
    """--png: a file path ending in .png, .svg or .pdf (the format written), none of the inputs (the sentences,
    --corpus, the model's files: after symlinks and hard links), nowhere inside the model folder, in an existing
    folder that can be written, and an existing file only with ``overwrite`` (--overwrite) and only a plot elmokit
    wrote (:func:`elmokit.io.check_output_path`).

    Raises: UsageError (folder, another suffix, an input, inside the model folder, an existing file, one elmokit did
    not write); MissingFileError (its folder is missing)."""
    from elmokit.analysis.polysemy import is_elmokit_plot, plot_format  # lazy: CLI start-up

    inputs = {**inputs, **model_inputs(model)}
    check_not_an_input(png, inputs, "--png")  # first: the worst mistake (a model's weights) is named as such
    if png.is_dir():
        raise UsageError(f"--png {png} is a folder: give a file path, e.g. {png / 'similar.png'}")
    try:
        plot_format(png)
    except UsageError:
        raise UsageError(
            f"--png {png}: a plot is written as .png, .svg or .pdf (by the suffix), not {png.suffix or 'no suffix'!r}"
        ) from None
    check_output_path(png, inputs, overwrite=overwrite, ours=is_elmokit_plot, kind="a plot elmokit wrote", what="--png")


def _how_matched(match: str, tokenizer: str, lengths: list[int] | None = None) -> str:
    """Words for how the word was matched: by ``match`` mode and tokenizer, and with ``lengths`` (tokens per found
    occurrence) what actually matched."""
    kind = _TOKEN_KIND[tokenizer]
    if match == "token" or (lengths is not None and lengths and max(lengths) == 1):
        return f"as one whole {kind}"
    runs = f"a run of whole {kind}s" + (" (e.g. characters)" if tokenizer == "whitespace" else "")
    if lengths is None:
        return f"as one whole {kind} or {runs}"
    single = sum(1 for n in lengths if n == 1)
    if not single:
        return f"as {runs}"
    return f"as one whole {kind} ({single}) or {runs} ({len(lengths) - single})"


def _snippet(tokens: list[str], start: int, end: int, width: int = 6, joiner: str = " ") -> str:
    a, b = max(0, start - width), min(len(tokens), end + width)
    left = ("… " if a > 0 else "") + joiner.join(tokens[a:start])
    right = joiner.join(tokens[end:b]) + (" …" if b < len(tokens) else "")
    return f"{left}{joiner if left else ''}[{joiner.join(tokens[start:end])}]{joiner if right else ''}{right}".strip()


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.4f}"


@dataclass
class _Input:
    """What ``similar`` read: the sentences file's line numbers, token lists, labels and raw texts, the tokenizer
    (its name and function), the word's occurrences and the match mode used."""

    numbers: list[int]
    sentences: list[list[str]]
    labels: list[str | None]
    texts: list[str]
    tokenizer: str
    tokenize: Callable[[str], list[str]]
    occurrences: list
    match: str


def _check_args(args: argparse.Namespace) -> None:
    """The checks before anything is read: --word, --layers, --neighbours/--corpus, the model (a zoo name resolved),
    the input files, --png.

    Raises:
        UsageError / MissingFileError: the bad option or file, named."""
    from elmokit.weights.native import resolve_model_name  # lazy: CLI start-up

    word = args.word
    if not word or word != word.strip() or len(word.split()) != 1:
        raise UsageError(f"--word must be one word without whitespace, got {word!r}")
    repeated = sorted({str(k) for k in args.layers if args.layers.count(k) > 1})
    if repeated:
        raise UsageError(f"--layers names {', '.join(repeated)} more than once: name each layer once")
    if args.neighbours and args.corpus is None:
        raise UsageError("--neighbours needs --corpus FILE (the text to search for neighbours)")
    args.model = str(resolve_model_name(args.model))
    check_model(args.model)
    check_input_file(args.sentences, "sentences file")
    if args.corpus is not None:
        check_input_file(args.corpus, "--corpus file")
    if args.png is not None:
        _check_png(
            args.png,
            args.model,
            {"sentences file": args.sentences, **({"--corpus file": args.corpus} if args.corpus else {})},
            args.overwrite,
        )


def _read_input(args: argparse.Namespace) -> _Input:
    """Read the sentences file and find the word's occurrences.

    Raises:
        DataError: as :func:`_read_sentences`. UsageError: the word occurs nowhere (with a hint for raw Chinese
            text read by whitespace)."""
    from elmokit.analysis.polysemy import find_occurrences  # lazy: CLI start-up

    word = args.word
    tokenizer = _TOKENIZERS[args.tokenize]
    tokenize = word_tokenizer(tokenizer)
    numbers, sentences, labels, texts = _read_sentences(
        args.sentences, tokenize, args.labels, args.decode_errors, warn_tabs=not args.labels
    )
    occurrences = find_occurrences(sentences, word, args.match, labels if args.labels else None)
    match = args.match if args.match != "auto" else ("span" if is_cjk(word) else "token")
    if not occurrences:
        hint = "check the spelling, case and tokenisation"
        if tokenizer == "whitespace" and is_cjk(word) and any(word in t for t in texts):
            hint = (
                "it only appears inside longer tokens: this looks like raw (unsegmented) Chinese text; use "
                "--tokenize jieba (word segmentation) or separate the characters by spaces"
            )
        raise UsageError(
            f"the word {word!r} occurs in none of the {len(sentences)} sentences of {args.sentences} "
            f"(matched {_how_matched(match, tokenizer)}, after --tokenize {args.tokenize}; {hint})"
        )
    return _Input(numbers, sentences, labels, texts, tokenizer, tokenize, occurrences, match)


def _wanted_layers(args: argparse.Namespace, n_layers: int) -> list[int | str]:
    """The layers --layers names for a model of ``n_layers`` layers (``all``: every layer and the average).

    Raises:
        UsageError: a layer the model does not have."""
    wanted = list(range(n_layers)) + ["average"] if args.layers == ["all"] else args.layers
    for layer in wanted:
        if layer != "average" and not 0 <= layer < n_layers:
            raise UsageError(f"--layers {layer} is not a layer of this model (0..{n_layers - 1}, or average)")
    return wanted


def _neighbours(args: argparse.Namespace, embedder, vectors, inp: _Input, joiner: str) -> dict:
    """The nearest contextual neighbours of each occurrence in --corpus (:func:`nearest_neighbours`), as the
    result's ``neighbours`` record.

    Raises:
        UsageError: --neighbour-layer is not a layer of the model. DataError: as :func:`_read_sentences`."""
    from elmokit.analysis.polysemy import nearest_neighbours  # lazy: CLI start-up

    n_layers = embedder.num_layers
    nl = args.neighbour_layer
    layer_index = n_layers - 1 if nl == "top" else nl
    if layer_index != "average" and not 0 <= int(layer_index) < n_layers:
        raise UsageError(f"--neighbour-layer {nl} is not a layer of this model (0..{n_layers - 1}, top, average)")
    q = vectors.mean(axis=1) if layer_index == "average" else vectors[:, int(layer_index)]
    same_file = args.corpus.resolve() == args.sentences.resolve()  # then its labels are not text
    corpus = (
        inp.sentences
        if same_file
        else _read_sentences(args.corpus, inp.tokenize, False, args.decode_errors, what="--corpus file")[1]
    )
    exclude = [{(tuple(inp.sentences[o.sentence]), p) for p in range(o.start, o.end)} for o in inp.occurrences]
    found = nearest_neighbours(embedder, q, corpus, args.neighbours, layer=layer_index, exclude=exclude)
    return {
        "layer": nl,
        "corpus": str(args.corpus),
        "k": args.neighbours,
        "lists": [
            [
                {
                    "score": nb.score,
                    "token": nb.token,
                    "corpus_line": nb.sentence + 1,
                    "snippet": _snippet(corpus[nb.sentence], nb.position, nb.position + 1, joiner=joiner),
                }
                for nb in row
            ]
            for row in found
        ],
    }


def _analyse(args: argparse.Namespace, inp: _Input) -> tuple[dict, list[tuple[str, object]]]:
    """Load the model, embed the occurrences and compute the per-layer similarities (and neighbours, and the plot):
    the result record (what --json prints) and the layers it shows, in order, as ``(name, cosine matrix)`` with the
    matrix an ndarray (n, n) float.

    Raises:
        UsageError: a layer the model does not have; an unusable --device."""
    import numpy as np  # lazy: CLI start-up

    from elmokit.analysis.polysemy import (  # lazy: CLI start-up
        label_similarity,
        layer_names,
        layer_similarities,
        occurrence_vectors,
        plot_occurrences,
    )
    from elmokit.embedding import Embedder  # lazy: CLI start-up
    from elmokit.weights.native import load_pretrained_bilm  # lazy: CLI start-up

    embedder = Embedder(
        load_pretrained_bilm(args.model), batch_size=args.batch_size, device=resolve_cli_device(args.device)
    )
    n_layers = embedder.num_layers
    wanted = _wanted_layers(args, n_layers)
    occurrences = inp.occurrences
    vectors = occurrence_vectors(embedder, inp.sentences, occurrences, context=args.context)
    sims = layer_similarities(vectors)  # layers 0..L, then the average
    names = layer_names(n_layers)
    rows = [(names[n_layers] if k == "average" else names[k], sims[n_layers if k == "average" else k]) for k in wanted]
    occ_labels = [o.label for o in occurrences] if args.labels else None
    joiner = "" if is_cjk(args.word) and inp.match == "span" else " "
    result = {
        "word": args.word,
        "model": args.model,
        "sentences_file": str(args.sentences),
        "match": inp.match,
        "occurrences": [
            {
                "id": i,
                "line": inp.numbers[o.sentence],
                "start": o.start,
                "end": o.end,
                "label": o.label,
                "snippet": _snippet(inp.sentences[o.sentence], o.start, o.end, joiner=joiner),
            }
            for i, o in enumerate(occurrences)
        ],
        "layers": {name: {"summary": label_similarity(m, occ_labels)} for name, m in rows},
    }
    if len(occurrences) <= args.max_matrix or args.json:
        for name, m in rows:
            result["layers"][name]["cosine"] = np.round(m, 6).tolist()
    if args.corpus is not None and args.neighbours:
        result["neighbours"] = _neighbours(args, embedder, vectors, inp, joiner)
    if args.png is not None:
        plot_occurrences(
            vectors,
            args.png,
            occ_labels,
            layers=list(wanted),
            title=f"{args.word}: {len(occurrences)} occurrences, {Path(args.model).name}",
        )
        result["png"] = str(args.png)
    return result, rows


def _print_matrices(args: argparse.Namespace, rows: list[tuple[str, object]]) -> None:
    """Each layer's cosine matrix (up to --max-matrix occurrences), else a note."""
    n = len(rows[0][1])
    if n > args.max_matrix:
        print(f"\n({n} occurrences: matrices left out above --max-matrix {args.max_matrix}; --json prints them)")
        return
    for name, m in rows:
        print(f"\nlayer {name}: cosine similarity")
        print("      " + "".join(f"{'#' + str(j):>8}" for j in range(len(m))))
        for i, r in enumerate(m):
            print(f"  {'#' + str(i):<4}" + "".join(f"{v:8.4f}" for v in r))


def _print_text(args: argparse.Namespace, result: dict, rows: list[tuple[str, object]], inp: _Input) -> None:
    """The text report: the occurrences, the matrices, the per-layer summary, the neighbours, the plot's path."""
    occurrences = inp.occurrences
    how = _how_matched(inp.match, inp.tokenizer, [o.end - o.start for o in occurrences])
    n_lines = len({o.sentence for o in occurrences})
    print(
        f"{args.word!r}: {len(occurrences)} occurrence(s) in {n_lines} of {len(inp.sentences)} sentences of "
        f"{args.sentences} (matched {how}); model {args.model}"
    )
    for occ in result["occurrences"]:
        lab = f" <{occ['label']}>" if occ["label"] is not None else ""
        print(f"  #{occ['id']:<3} line {occ['line']}{lab}: {occ['snippet']}")
    _print_matrices(args, rows)
    head = f"\n{'layer':<12}{'pairs':>7}{'mean':>9}{'min':>9}{'max':>9}"
    if args.labels:
        head += f"{'within':>9}{'across':>9}{'gap':>9}"
    print(head)
    for name, _ in rows:
        s = result["layers"][name]["summary"]
        line = f"{name:<12}{s['pairs']:>7}{_fmt(s['mean']):>9}{_fmt(s['min']):>9}{_fmt(s['max']):>9}"
        if args.labels:
            line += f"{_fmt(s['within']):>9}{_fmt(s['across']):>9}{_fmt(s['gap']):>9}"
        print(line)
    if "neighbours" in result:
        print(f"\nnearest contextual neighbours in {args.corpus} (layer {args.neighbour_layer}, cosine):")
        for i, row in enumerate(result["neighbours"]["lists"]):
            print(f"  #{i}:")
            for nb in row:
                print(f"      {nb['score']:.4f}  {nb['token']}  (line {nb['corpus_line']}: {nb['snippet']})")
    if args.png is not None:
        print(f"\nplot → {args.png}")


def cmd_similar(args: argparse.Namespace) -> int:
    """Check the arguments (model, input, output, corpus), read the occurrences, analyse them (the model loaded,
    per-layer similarities, neighbours, plot), print the result (text, or one JSON line with --json)."""
    _check_args(args)
    inp = _read_input(args)
    result, rows = _analyse(args, inp)
    if args.json:
        print_json_line(result)
    else:
        _print_text(args, result, rows, inp)
    return 0


def _neighbour_layer(text: str):
    if text in ("top", "average"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"must be a layer number, top or average, got {text!r}")


def _add_input_options(p: argparse.ArgumentParser) -> None:
    """MODEL, SENTENCES and --word, and how the lines are read and the word matched."""
    p.add_argument("model", type=text_arg, help=f"{RELEASED_HELP}, or elmokit-en / elmokit-zh")
    p.add_argument(
        "sentences",
        type=path_arg,
        help="text file, one sentence per line (label<TAB>sentence with --labels); blank lines are skipped",
    )
    p.add_argument("--word", required=True, type=text_arg, help="the word to look at, e.g. bank or 苹果")
    p.add_argument(
        "--labels",
        action="store_true",
        help="each line is label<TAB>sentence: colours the plot, adds within/across-label means (default: unlabelled)",
    )
    p.add_argument(
        "--tokenize",
        "--tokenizer",
        dest="tokenize",
        choices=sorted(_TOKENIZERS),
        default="whitespace",
        help="how lines become tokens (--tokenizer is the same option, spelt as embed spells it): "
        "whitespace (pre-tokenised), sacremoses (= moses; English), jieba (Chinese words); "
        "per-character Chinese input: separate the characters by spaces and use whitespace "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--decode-errors",
        choices=DECODE_CHOICES,
        default="strict",
        help="invalid UTF-8 in SENTENCES or --corpus: stop naming the file and line (strict), replace or "
        "ignore the bad bytes, or skip the line (default: %(default)s)",
    )
    p.add_argument(
        "--match",
        choices=["auto", "token", "span"],
        default="auto",
        help="token: the word is one token; span: a run of whole tokens spelling it; auto: span for CJK "
        "words, token otherwise (default: %(default)s)",
    )


def _add_layer_options(p: argparse.ArgumentParser) -> None:
    """Which layers are compared, and how much context each occurrence keeps."""
    p.add_argument(
        "--layers",
        type=_layers_arg,
        default=["all"],
        metavar="LAYERS",
        help="layers to print and plot: all, or comma-separated numbers and/or average, each at most "
        "once, e.g. 0,2,average (default: all = every layer and the average)",
    )
    p.add_argument(
        "--context",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="cut each sentence to N tokens on each side of the occurrence before embedding (default: whole sentences)",
    )


def _add_neighbour_options(p: argparse.ArgumentParser) -> None:
    """--corpus and its nearest contextual neighbours."""
    p.add_argument(
        "--corpus",
        type=path_arg,
        default=None,
        metavar="FILE",
        help="text file (one sentence per line, same --tokenize) searched for nearest contextual "
        "neighbours (default: none)",
    )
    p.add_argument(
        "--neighbours",
        "--neighbors",
        dest="neighbours",
        type=positive_int,
        default=None,
        metavar="K",
        help="neighbours per occurrence, with --corpus (default: 5 when --corpus is given)",
    )
    p.add_argument(
        "--neighbour-layer",
        type=_neighbour_layer,
        default="top",
        help="layer compared for neighbours: a number, top or average (default: %(default)s)",
    )


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """What is written and printed: the plot, the matrices, JSON."""
    p.add_argument(
        "--png",
        type=path_arg,
        default=None,
        metavar="OUT.png",
        help="write the 2-D PCA projection of the occurrences, one panel per layer, as PNG, SVG or PDF by the "
        "suffix (.png, .svg, .pdf) (default: none)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --png plot that elmokit wrote (default: refuse)"
    )
    p.add_argument(
        "--max-matrix",
        type=positive_int,
        default=12,
        metavar="N",
        help="print the full cosine matrices up to N occurrences, a summary above (default: %(default)s)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON line with everything instead of text (default: text)"
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Batches and device."""
    p.add_argument(
        "--batch-size", type=positive_int, default=64, help="sentences per forward pass (default: %(default)s)"
    )
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``elmokit similar``."""
    p = sub.add_parser(
        "similar",
        parents=parents,
        help="a word's contextual similarity across its occurrences, per layer",
        description="Find the occurrences of --word in SENTENCES (one sentence per line, UTF-8) and print the "
        "pairwise cosine similarity of their vectors in each layer beside layer 0 (the static, "
        "context-free token layer, where every occurrence of a one-token word is the same vector); with "
        "--labels, the mean similarity within and across labels; with --corpus, each occurrence's "
        "nearest contextual neighbours; with --png, a 2-D PCA plot per layer. A CJK word also matches a "
        "run of whole tokens spelling it (per-character input); its vector is the mean of those tokens'.",
    )
    _add_input_options(p)
    _add_layer_options(p)
    _add_neighbour_options(p)
    _add_output_options(p)
    _add_run_options(p)
    add_threads_option(p)
    p.set_defaults(func=_cmd, interrupted_note=lambda args: "nothing was written")


def _cmd(args: argparse.Namespace) -> int:
    if args.corpus is not None and args.neighbours is None:
        args.neighbours = 5
    return cmd_similar(args)
