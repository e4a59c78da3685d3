"""The ``elmokit`` command line."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

__all__ = ["main"]


def _load_bilm(path: str):
    from .weights.native import load_pretrained_bilm

    return load_pretrained_bilm(path)


def cmd_embed(args: argparse.Namespace) -> int:
    from .embedding import Embedder

    from .training.trainer import resolve_device

    if not args.input.is_file():
        raise FileNotFoundError(f"{args.input}: no such file")
    if args.output.resolve() == args.input.resolve():
        raise ValueError(f"the output {args.output} is the input file: choose another output path")
    if args.output.is_dir():
        raise ValueError(f"the output {args.output} is a folder: give a file path, e.g. {args.output / 'vectors.hdf5'}")
    if Path(args.model).is_dir() and args.output.resolve().parent == Path(args.model).resolve():
        raise ValueError(f"the output {args.output} is inside the model folder {args.model}: write it elsewhere")
    device = resolve_device(args.device) if args.device else None
    embedder = Embedder(_load_bilm(args.model), batch_size=args.batch_size, device=device)
    n = embedder.embed_file(args.input, args.output, layers=args.layers)
    print(f"embedded {n} sentences → {args.output}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .weights.native import save_pretrained
    from .weights.original import load_original

    out = Path(args.output)
    taken = [n for n in ("config.json", "model.safetensors") if (out / n).exists()]
    if taken and not args.overwrite:
        raise ValueError(f"{out} already holds a model ({', '.join(taken)}): choose another folder or pass --overwrite")
    model = load_original(args.options, args.weights)
    save_pretrained(model, out)
    print(f"wrote {args.output}/config.json and model.safetensors")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .weights.original import export_original

    if Path(args.model).is_dir() and Path(args.output).resolve() == Path(args.model).resolve():
        raise ValueError(f"the output folder {args.output} is the model's own folder: export into another folder")
    options, weights = export_original(_load_bilm(args.model), args.output)
    print(f"wrote {options} and {weights}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    model = _load_bilm(args.model)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"parameters": n, "layers": model.num_layers, "output_dim": model.output_dim,
                      "options": model.config.to_options()}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elmokit", description="ELMo: pretrain, convert, embed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("embed", help="embed a file of tokenised sentences (one per line) into HDF5")
    p.add_argument("model", help="released name (small, medium, original, original-5.5b) or a model directory")
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--layers", choices=["all", "top", "average"], default="all")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N (default: cpu)")
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("convert", help="original options.json + HDF5 → native directory (config.json + safetensors)")
    p.add_argument("options", type=Path)
    p.add_argument("weights", type=Path)
    p.add_argument("output", type=Path)
    p.add_argument("--overwrite", action="store_true", help="replace a model already in the output folder")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("export", help="model directory → original options.json + weights.hdf5")
    p.add_argument("model")
    p.add_argument("output", type=Path)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", help="show a model's configuration and parameter count")
    p.add_argument("model")
    p.set_defaults(func=cmd_info)

    from . import training_cli

    training_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from .errors import ElmoError

    # SIGTERM (e.g. from `timeout` or a job scheduler) unwinds like Ctrl-C, so atomic writes remove their temporary
    # files and the last checkpoint stays the latest complete one
    try:
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    except ValueError:  # not the main thread (main() called from a worker thread): leave signals alone
        previous = None
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `elmokit score ... | head`: the reader left; nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the final flush at exit does not fail again
        return 0
    except (ElmoError, ValueError, TypeError, FileNotFoundError, OSError) as exc:
        print(f"elmokit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = " (continue with --resume)" if args.command == "train" else ""
        print(f"elmokit {args.command}: interrupted; nothing partial was written{hint}", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
