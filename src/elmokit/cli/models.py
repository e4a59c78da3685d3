"""``elmokit convert | export | info``: between the original format (options.json + HDF5) and elmokit's native one
(config.json + model.safetensors), and a model's configuration."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from elmokit.cli.common import (
    RELEASED_HELP,
    check_input_file,
    check_model,
    model_folder,
    model_inputs,
    path_arg,
    read_options_json,
    text_arg,
)
from elmokit.errors import DataError, InputError, UsageError
from elmokit.io import atomic_write_text, check_creatable_folder, check_output_path
from elmokit.vocabulary import Vocabulary

__all__ = ["register", "cmd_convert", "cmd_export", "cmd_info"]


def _check_output_folder(out: Path, overwrite: bool, names: tuple[str, ...], what: str) -> None:
    """An output folder: not a file; holding none of ``names`` unless ``overwrite``.

    Raises:
        UsageError: ``out`` is a file (or below one), or already holds one of ``names`` and ``overwrite`` is false.
    """
    check_creatable_folder(out, "the output")  # a file, or below one
    taken = [n for n in names if (out / n).exists()]
    if taken and not overwrite:
        raise UsageError(f"{out} already holds {what} ({', '.join(taken)}): choose another folder or pass --overwrite")


def _check_not_inside(out: Path, folder: Path | None, model: str, option: str) -> None:
    """``out`` must not be ``folder`` (the model's own folder) nor inside it: no command writes inside a model folder.

    Raises: UsageError naming both."""
    if folder is not None and out.resolve().is_relative_to(folder.resolve()):
        where = "the model's own folder" if out.resolve() == folder.resolve() else f"inside the model folder {model}"
        raise UsageError(
            f"the output folder {out} is {where}: {option} into another folder (no command writes "
            "inside a model folder)"
        )


def cmd_convert(args: argparse.Namespace) -> int:
    """An original-format or ELMoForManyLangs model → native folder (config.json + model.safetensors, and for
    ELMoForManyLangs its char.dic + word.dic): ``convert MODEL OUT`` (a folder with an options.json and a weight HDF5,
    an ELMoForManyLangs folder, a zip of one such as the NLPL repository's — its meta.json and vocabulary are written
    beside, see :func:`_write_archive_files` — or a released name) or ``convert OPTIONS WEIGHTS OUT``; refuses to
    replace a model unless ``--overwrite``, and an output inside the model's folder."""
    import h5py  # lazy: CLI start-up

    from elmokit.weights.efml import is_efml_folder  # lazy: CLI start-up
    from elmokit.weights.native import load_pretrained_bilm, save_pretrained  # lazy: CLI start-up
    from elmokit.weights.original import load_original  # lazy: CLI start-up

    if len(args.paths) not in (2, 3):
        raise UsageError(
            f"convert takes MODEL OUT or OPTIONS WEIGHTS OUT, got {len(args.paths)} path(s): "
            f"{' '.join(map(str, args.paths))}"
        )
    output = args.paths[-1]
    model_files = ("config.json", "model.safetensors")
    if len(args.paths) == 2:
        model = str(args.paths[0])
        check_model(model)
        folder = model_folder(model)
        efml = folder is not None and is_efml_folder(folder)  # its char.dic and word.dic are written beside
        if folder is not None and (folder / "config.json").is_file() and not efml:
            raise UsageError(
                f"the model {model} is already in elmokit's format (config.json + model.safetensors): "
                "use it as it is (`elmokit export` writes the original format)"
            )
        model_files += ("char.dic", "word.dic") if efml else ()
        _check_not_inside(output, folder, model, "convert")
        # a zip's meta.json and vocab.txt too, and (an EFML folder, or a zip that may hold one) char.dic + word.dic
        names = model_files + (("meta.json", "vocab.txt", "char.dic", "word.dic") if folder is None else ())
        _check_output_folder(output, args.overwrite, names, "a model")
        bilm = load_pretrained_bilm(model)
    else:
        options, weights = args.paths[0], args.paths[1]
        read_options_json(options, "options")
        check_input_file(weights, "weight file")
        if not h5py.is_hdf5(weights):
            raise UsageError(
                f"the weight file {weights} is not an HDF5 file: give the original weights (e.g. elmo_..._weights.hdf5)"
            )
        if output.exists() and output.resolve() == weights.resolve().parent:
            raise UsageError(
                f"the output folder {output} holds the original model: convert into another folder (no "
                "command writes inside a model folder)"
            )
        _check_output_folder(output, args.overwrite, ("config.json", "model.safetensors"), "a model")
        bilm = load_original(options, weights)
    save_pretrained(bilm, output)
    dics = ["char.dic", "word.dic"] if getattr(bilm.char_vocab, "words", None) is not None else []  # EFML's
    files = [output / name for name in ["config.json", "model.safetensors", *dics]]
    files += _write_archive_files(bilm, output)
    print(f"wrote {', '.join(map(str, files[:-1]))} and {files[-1]}")
    return 0


def _write_archive_files(bilm, output: Path) -> list[Path]:
    """Beside a model converted from a zip (:mod:`elmokit.weights.archive`): its ``meta.json`` as it was, and its
    vocabulary as ``vocab.txt`` when it is one elmokit reads (the three specials, no duplicates; else left out with a
    note). Returns the files written."""
    written = []
    meta, words = getattr(bilm, "source_meta", None), getattr(bilm, "source_vocab", None)
    if meta is not None:
        atomic_write_text(output / "meta.json", json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        written.append(output / "meta.json")
    if words is not None:
        try:
            Vocabulary(words)
        except (DataError, InputError) as exc:
            print(f"note: the archive's vocabulary is not written ({exc})", file=sys.stderr)
        else:
            atomic_write_text(output / "vocab.txt", "".join(w + "\n" for w in words))
            written.append(output / "vocab.txt")
    return written


def _model_vocabulary(model: str) -> Path | None:
    """The word vocabulary a model folder holds (``vocab.txt``, as ``elmokit train`` and the zoo write it), or
    ``None`` (a released model, an original-format folder without one)."""
    path = Path(model)
    return path / "vocab.txt" if path.is_dir() and (path / "vocab.txt").is_file() else None


def cmd_export(args: argparse.Namespace) -> int:
    """Model → original options.json + weights.hdf5, and ``vocab.txt`` when the model has a word vocabulary (bilm-tf's
    tools read it beside the two); with ``--format pt2|onnx`` one program file instead (:func:`_export_program`);
    refuses to replace an export unless ``--overwrite``."""
    from elmokit.weights.native import load_pretrained_bilm, resolve_model_name  # lazy: CLI start-up
    from elmokit.weights.original import export_original  # lazy: CLI start-up

    args.model = str(resolve_model_name(args.model))  # a zoo name → its folder
    check_model(args.model)
    _check_not_inside(args.output, model_folder(args.model), args.model, "export")
    if args.format != "original":
        return _export_program(args)
    program = {".pt2": "pt2", ".onnx": "onnx"}.get(args.output.suffix)
    if program is not None:  # a forgotten --format would write a folder of that name
        raise UsageError(
            f"OUT {args.output} names a .{program} file: pass --format {program} (the default format, original, "
            "writes a folder of options.json + weights.hdf5)"
        )
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


def _export_program(args: argparse.Namespace) -> int:
    """``export MODEL OUT.pt2|OUT.onnx --format pt2|onnx``: the biLM's inference path as one file
    (:func:`elmokit.export.export_model`); refuses to replace a file unless ``--overwrite``."""
    import time  # lazy: CLI start-up

    from elmokit.export import FORMATS, check_exportable, export_model  # lazy: CLI start-up
    from elmokit.export.files import check_output_file, is_elmokit_export  # lazy: CLI start-up
    from elmokit.weights.native import load_pretrained_bilm  # lazy: CLI start-up

    out, suffix = args.output, FORMATS[args.format]
    if out.suffix != suffix:
        raise UsageError(f"--format {args.format} writes one file ending in {suffix}: got OUT {out}")
    if out.is_dir():
        raise UsageError(f"the output {out} is a folder: --format {args.format} writes one file (e.g. model{suffix})")
    check_output_path(  # none of the model's files; an existing file only with --overwrite, and only an export
        out,
        model_inputs(args.model),
        overwrite=args.overwrite,
        ours=is_elmokit_export,
        kind="a program elmokit exported",
        create_folder=True,
    )
    model = check_exportable(load_pretrained_bilm(args.model))  # refuses before the slow trace
    check_output_file(out)  # so does an output that cannot be written
    start = time.perf_counter()
    export_model(model, out, args.format)
    size = out.stat().st_size / 2**20
    print(f"wrote {out} ({args.format}, {size:.1f} MiB, exported in {time.perf_counter() - start:.1f} s)")
    return 0


def _kernels_info() -> dict:
    """Where this environment's native batch-1 kernels come from (:func:`elmokit.modules.native.status`), loading
    them (or building them, once per environment) as ``embed`` would."""
    from elmokit.modules import native  # lazy: CLI start-up

    native.kernels()
    return native.status()


def cmd_info(args: argparse.Namespace) -> int:
    """Print the model's parameter count, layers, output dimension, start state (``"zero"``, or how the stored one was
    made), options and where the native kernels came from as JSON (and, for a zoo model, its card's summary; for a
    zip, the archive, its ``meta.json`` fields under ``"meta"`` and its vocabulary size; for a folder with a
    ``meta.json``, that)."""
    from elmokit.weights.native import load_pretrained_bilm, resolve_model_name  # lazy: CLI start-up

    args.model = str(resolve_model_name(args.model))
    check_model(args.model)
    model = load_pretrained_bilm(args.model)
    n = sum(p.numel() for p in model.parameters())
    info = {
        "parameters": n,
        "layers": model.num_layers,
        "output_dim": model.output_dim,
        "start_state": (model.start_state_source or "stored") if model.start_state is not None else "zero",
        "options": model.config.to_options(),
    }
    info.update(_source_info(model, Path(args.model)))
    info["native_kernels"] = _kernels_info()
    if model.config.char_cnn.word_embedding_dim is not None:
        info = {**_efml_info(model, converted=not _holds_efml(Path(args.model))), **info}
    card = Path(args.model) / "card.json"
    if card.is_file():
        from elmokit.recipes.zoo.card import read_card  # lazy: CLI start-up

        data = read_card(card.parent)
        if data is not None:
            fig = data["figures"]
            info["zoo"] = {
                "name": data["name"],
                "rebuild_command": data["rebuild_command"],
                "heldout_average_perplexity": fig["heldout"]["bilm"]["average"],
                "kneser_ney_3": fig["heldout"]["kneser_ney_3"]["average"],
                "kneser_ney_5_modified": (fig["heldout"].get("kneser_ney_5_modified") or {}).get("average"),
                "unigram": fig["heldout"]["unigram_add_one"],
                "card": str(card.parent / "README.md"),
            }
    print(json.dumps(info, indent=2))
    return 0


def _holds_efml(path: Path) -> bool:
    """Whether ``path`` is an ELMoForManyLangs folder, or a zip whose model is one (not a native folder converted from
    one, which keeps the ``.dic`` files beside its ``model.safetensors``)."""
    import zipfile  # lazy: CLI start-up

    from elmokit.weights.archive import is_model_archive  # lazy: CLI start-up
    from elmokit.weights.efml import MARKERS, is_efml_folder  # lazy: CLI start-up

    if not (path.is_file() and is_model_archive(path)):
        return is_efml_folder(path)
    with zipfile.ZipFile(path) as zf:  # already read once by the loader
        names = {name.rsplit("/", 1)[-1] for name in zf.namelist()}
    return "model.safetensors" not in names and any(name in names for name in MARKERS)


def _efml_info(model, converted: bool) -> dict:
    """What ``info`` says first about a model read from (or ``converted`` from) an ELMoForManyLangs folder."""
    cc, vocab = model.config.char_cnn, model.char_vocab
    source = model.config.extra.get("efml", {})
    return {
        "format": "elmokit (converted from ELMoForManyLangs)" if converted else "ELMoForManyLangs",
        "architecture": source.get("architecture"),
        "word_vocab_size": len(vocab.words),
        "char_vocab_size": len(vocab.chars),
        "word_embedding_dim": cc.word_embedding_dim,
        "char_embedding_dim": cc.embedding_dim,
        "max_characters_per_token": cc.max_characters_per_token,
        "filters": [list(f) for f in cc.filters],
        "lstm": {"dim": model.config.lstm.dim, "projection_dim": model.config.lstm.projection_dim},
        "softmax": "none: the released EFML models carry no LM head (no perplexity or scores)",
    }


def _source_info(model, path: Path) -> dict:
    """What a model loaded from a zip keeps of it (:mod:`elmokit.weights.archive`), or a folder's ``meta.json`` (as
    ``convert ZIP OUT`` writes it): ``{"archive", "meta", "vocab_words"}``, the keys it has."""
    out: dict = {}
    if getattr(model, "source_archive", None):
        out["archive"] = model.source_archive
    meta = getattr(model, "source_meta", None)
    if meta is None and path.is_dir() and (path / "meta.json").is_file():
        try:
            meta = json.loads((path / "meta.json").read_text(encoding="utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            meta = None
    if meta is not None:
        out["meta"] = meta
    if getattr(model, "source_vocab", None) is not None:
        out["vocab_words"] = len(model.source_vocab)
    return out


_MODEL_HELP = f"{RELEASED_HELP}, or a model trained here (elmokit-en, elmokit-zh: `elmokit zoo build`)"


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert",
        parents=parents,
        help="original options.json + HDF5 → native folder (config.json + model.safetensors)",
        usage="elmokit convert [-h] [-v] [--overwrite] MODEL OUT | OPTIONS WEIGHTS OUT",
        description="Convert an original-format or ELMoForManyLangs model to elmokit's native format. MODEL OUT: "
        "MODEL is a folder holding an *options*.json and a weight *.hdf5, an ELMoForManyLangs folder (char.dic, "
        "word.dic, encoder.pkl, token_embedder.pkl, config.json), a zip of one (an NLPL model archive: its "
        "meta.json and vocabulary are written beside), or a released name "
        "(small, medium, original, original-5.5b); OPTIONS WEIGHTS OUT: the two files "
        "named. OUT is the folder to write config.json and model.safetensors into "
        "(created if missing; not inside the model's folder).",
    )
    p.add_argument(
        "paths",
        nargs="+",
        type=path_arg,
        metavar="PATH",
        help="MODEL OUT (a model folder, zip or released name, then the output folder), or OPTIONS WEIGHTS OUT "
        "(the original options.json, its weight HDF5, then the output folder)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a model already in the output folder (default: refuse)"
    )
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "export",
        parents=parents,
        help="model → original options.json + weights.hdf5 (+ vocab.txt) (for bilm-tf / AllenNLP), or with "
        "--format pt2|onnx one deployable program file (AOTInductor .pt2 / ONNX)",
    )
    p.add_argument("model", type=text_arg, help=_MODEL_HELP)
    p.add_argument(
        "output",
        type=path_arg,
        help="folder to write options.json, weights.hdf5 and (when the model has "
        "one) vocab.txt into (created if missing; not inside the model's "
        "folder); with --format pt2|onnx the file to write (OUT.pt2 / OUT.onnx)",
    )
    p.add_argument(
        "--format",
        choices=("original", "pt2", "onnx"),
        default="original",
        help="original (default): options.json + weights.hdf5; pt2: torch.export + AOTInductor package; onnx: ONNX "
        "model (needs elmokit[export]); both take char ids (B, T, C) and a state, give all layers + mask + state, "
        "any B and T (load with elmokit.export.load_exported)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an export already in the output folder (default: refuse)"
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "info",
        parents=parents,
        help="show a model's configuration and parameter count, and where the native kernels came from (JSON)",
    )
    p.add_argument("model", type=text_arg, help=_MODEL_HELP)
    p.set_defaults(func=cmd_info)
