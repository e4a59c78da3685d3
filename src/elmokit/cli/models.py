"""``elmokit convert | export | info``: between the original format (options.json + HDF5) and elmokit's native one
(config.json + model.safetensors), and a model's configuration."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UsageError
from .common import RELEASED_HELP, check_input_file, check_model, path_arg, read_options_json, text_arg

__all__ = ["register", "cmd_convert", "cmd_export", "cmd_info"]


def _check_output_folder(out: Path, overwrite: bool, names: tuple[str, ...], what: str) -> None:
    """An output folder: not a file; holding none of ``names`` unless ``overwrite``.

    Raises:
        UsageError: ``out`` is a file, or already holds one of ``names`` and ``overwrite`` is false.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output {out} is a file: give a folder (it is created if missing)")
    taken = [n for n in names if (out / n).exists()]
    if taken and not overwrite:
        raise UsageError(f"{out} already holds {what} ({', '.join(taken)}): choose another folder or pass --overwrite")


def cmd_convert(args: argparse.Namespace) -> int:
    """Original options.json + weight HDF5 → native folder; refuses to replace a model unless ``--overwrite``."""
    import h5py

    from ..weights.native import save_pretrained
    from ..weights.original import load_original

    read_options_json(args.options, "options")
    check_input_file(args.weights, "weight file")
    if not h5py.is_hdf5(args.weights):
        raise UsageError(f"the weight file {args.weights} is not an HDF5 file: give the original weights "
                         "(e.g. elmo_..._weights.hdf5)")
    _check_output_folder(args.output, args.overwrite, ("config.json", "model.safetensors"), "a model")
    model = load_original(args.options, args.weights)
    save_pretrained(model, args.output)
    print(f"wrote {args.output / 'config.json'} and {args.output / 'model.safetensors'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Model → original options.json + weights.hdf5; refuses to replace an export unless ``--overwrite``."""
    from ..weights.native import load_pretrained_bilm
    from ..weights.original import export_original

    check_model(args.model)
    if Path(args.model).is_dir() and args.output.resolve() == Path(args.model).resolve():
        raise UsageError(f"the output folder {args.output} is the model's own folder: export into another folder")
    _check_output_folder(args.output, args.overwrite, ("options.json", "weights.hdf5"), "an export")
    options, weights = export_original(load_pretrained_bilm(args.model), args.output)
    print(f"wrote {options} and {weights}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print the model's parameter count, layers, output dimension and options as JSON."""
    from ..weights.native import load_pretrained_bilm

    check_model(args.model)
    model = load_pretrained_bilm(args.model)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"parameters": n, "layers": model.num_layers, "output_dim": model.output_dim,
                      "options": model.config.to_options()}, indent=2))
    return 0


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("convert", parents=parents,
                       help="original options.json + HDF5 → native folder (config.json + model.safetensors)")
    p.add_argument("options", type=path_arg, help="the original options.json (architecture)")
    p.add_argument("weights", type=path_arg, help="the original weight file (HDF5)")
    p.add_argument("output", type=path_arg, help="folder to write config.json and model.safetensors into (created "
                                                 "if missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a model already in the output folder (default: refuse)")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("export", parents=parents, help="model → original options.json + weights.hdf5 "
                                                       "(for bilm-tf / AllenNLP)")
    p.add_argument("model", type=text_arg, help=RELEASED_HELP)
    p.add_argument("output", type=path_arg, help="folder to write options.json and weights.hdf5 into (created if "
                                                 "missing; not the model's own folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an export already in the output folder (default: refuse)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", parents=parents, help="show a model's configuration and parameter count (JSON)")
    p.add_argument("model", type=text_arg, help=RELEASED_HELP)
    p.set_defaults(func=cmd_info)

