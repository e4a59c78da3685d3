"""``elmokit embed MODEL INPUT OUTPUT``: a file of tokenised sentences → HDF5 (AllenNLP ``elmo`` command layout)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from .common import (DECODE_CHOICES, DEVICE_HELP, RELEASED_HELP, check_input_file, check_model, check_output_file,
                     path_arg, positive_int, resolve_cli_device, text_arg)

__all__ = ["register", "cmd_embed"]


def cmd_embed(args: argparse.Namespace) -> int:
    """Check every argument (model first, then input, then output), load the model, embed, report."""
    from ..embedding import Embedder
    from ..weights.native import load_pretrained_bilm, resolve_model_name

    args.model = str(resolve_model_name(args.model))  # a zoo name → its folder (or the error saying how to build it)
    check_model(args.model)
    check_input_file(args.input)
    check_output_file(args.output, {"input file": args.input})
    model_dir = Path(args.model)
    if model_dir.is_dir() and args.output.resolve().parent == model_dir.resolve():
        raise UsageError(f"the output {args.output} is inside the model folder {args.model}: write it elsewhere")
    device = resolve_cli_device(args.device)
    embedder = Embedder(load_pretrained_bilm(args.model), batch_size=args.batch_size, device=device)
    n = embedder.embed_file(args.input, args.output, layers=args.layers, decode_errors=args.decode_errors,
                            progress=not args.no_progress)
    skipped = embedder.skipped_lines
    note = (f" ({len(skipped)} undecodable line(s) skipped, each an empty dataset: line "
            f"{', '.join(map(str, skipped[:10]))}{' ...' if len(skipped) > 10 else ''})" if skipped else "")
    print(f"embedded {n - len(skipped)} sentences → {args.output}{note}")
    return 0


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "embed", parents=parents, help="embed a file of tokenised sentences (one per line) into HDF5",
        description="Embed a file of whitespace-tokenised sentences, one per line (UTF-8), into HDF5: dataset \"i\" "
                    "holds line i+1's vectors, (L+1, n, 2P) for --layers all or (n, 2P) for top/average; "
                    "\"sentence_to_index\" maps each stripped line to its dataset, as AllenNLP's `elmo` command. "
                    "A blank line gives an empty array. The output is written atomically.")
    p.add_argument("model", type=text_arg, help=f"{RELEASED_HELP}, or a model trained here (elmokit-en, elmokit-zh: "
                                                "`elmokit zoo build`)")
    p.add_argument("input", type=path_arg, help="text file, one whitespace-tokenised sentence per line (UTF-8)")
    p.add_argument("output", type=path_arg, help="HDF5 file to write (replaced if it exists)")
    p.add_argument("--layers", choices=["all", "top", "average"], default="all",
                   help="all layers, the top one, or their average (default: %(default)s)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="sentences per forward pass, at most (default: %(default)s)")
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")
    p.add_argument("--decode-errors", choices=DECODE_CHOICES, default="strict",
                   help="invalid UTF-8 in the input: stop naming the file and line (strict), replace or ignore the "
                        "bad bytes, or skip the line (its dataset is then empty) (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    p.set_defaults(func=cmd_embed)
