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


def _model_vocabulary(model: str) -> Path | None:
    """The word vocabulary a model folder holds (``vocab.txt``, as ``elmokit train`` and the zoo write it), or
    ``None`` (a released model, an original-format folder without one)."""
    path = Path(model)
    return path / "vocab.txt" if path.is_dir() and (path / "vocab.txt").is_file() else None


def cmd_export(args: argparse.Namespace) -> int:
    """Model → original options.json + weights.hdf5, and ``vocab.txt`` when the model has a word vocabulary (bilm-tf's
    tools read it beside the two); refuses to replace an export unless ``--overwrite``."""
    from ..io import atomic_write_text
    from ..vocabulary import Vocabulary
    from ..weights.native import load_pretrained_bilm, resolve_model_name
    from ..weights.original import export_original

    args.model = str(resolve_model_name(args.model))  # a zoo name → its folder
    check_model(args.model)
    if Path(args.model).is_dir() and args.output.resolve() == Path(args.model).resolve():
        raise UsageError(f"the output folder {args.output} is the model's own folder: export into another folder")
    vocab_file = _model_vocabulary(args.model)
    names = ("options.json", "weights.hdf5") + (("vocab.txt",) if vocab_file else ())
    _check_output_folder(args.output, args.overwrite, names, "an export")
    vocab = Vocabulary.from_file(vocab_file) if vocab_file else None  # a damaged vocab.txt fails before writing
    options, weights = export_original(load_pretrained_bilm(args.model), args.output)
    if vocab is not None:
        atomic_write_text(args.output / "vocab.txt", "".join(t + "\n" for t in vocab.tokens))
        print(f"wrote {options}, {weights} and {args.output / 'vocab.txt'} ({len(vocab)} tokens)")
    else:
        print(f"wrote {options} and {weights} (the model has no vocab.txt: none written)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print the model's parameter count, layers, output dimension, start state (``"zero"``, or how the stored one was
    made) and options as JSON (and, for a zoo model, its card's summary)."""
    from ..weights.native import load_pretrained_bilm, resolve_model_name

    args.model = str(resolve_model_name(args.model))
    check_model(args.model)
    model = load_pretrained_bilm(args.model)
    n = sum(p.numel() for p in model.parameters())
    info = {"parameters": n, "layers": model.num_layers, "output_dim": model.output_dim,
            "start_state": (model.start_state_source or "stored") if model.start_state is not None else "zero",
            "options": model.config.to_options()}
    card = Path(args.model) / "card.json"
    if card.is_file():
        from ..zoo.build import read_card

        data = read_card(card.parent)
        if data is not None:
            fig = data["figures"]
            info["zoo"] = {"name": data["name"], "rebuild_command": data["rebuild_command"],
                           "heldout_average_perplexity": fig["heldout"]["bilm"]["average"],
                           "kneser_ney_3": fig["heldout"]["kneser_ney_3"]["average"],
                           "unigram": fig["heldout"]["unigram_add_one"], "card": str(card.parent / "README.md")}
    print(json.dumps(info, indent=2))
    return 0


_MODEL_HELP = f"{RELEASED_HELP}, or a model trained here (elmokit-en, elmokit-zh: `elmokit zoo build`)"


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

    p = sub.add_parser("export", parents=parents, help="model → original options.json + weights.hdf5 (+ vocab.txt) "
                                                       "(for bilm-tf / AllenNLP)")
    p.add_argument("model", type=text_arg, help=_MODEL_HELP)
    p.add_argument("output", type=path_arg, help="folder to write options.json, weights.hdf5 and (when the model has "
                                                 "one) vocab.txt into (created if missing; not the model's own folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an export already in the output folder (default: refuse)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", parents=parents, help="show a model's configuration and parameter count (JSON)")
    p.add_argument("model", type=text_arg, help=_MODEL_HELP)
    p.set_defaults(func=cmd_info)

