"""Writing a biLM as a file that runs without this package: an AOTInductor package (``.pt2``) or an ONNX model.

Both hold one program, :class:`~elmokit.export.program.InferenceProgram` traced by ``torch.export`` with a dynamic
batch size and sentence length, and elmokit's description of it (:func:`metadata`: the id width and range, the
dimensions, the stored start state, a character vocabulary) as JSON — in the ``.pt2`` zip as ``extra/elmokit.json``,
in the ONNX model as the ``metadata_props`` entry ``elmokit``.

Program signature (both formats; the ONNX inputs and outputs carry these names):
``char_ids`` (B, T, C) int64, ``c0`` (2, L, B, H) float32, ``h0`` (2, L, B, P) float32 →
``layers`` (B, L+1, T, 2P) float32, ``mask`` (B, T) bool, ``c`` (2, L, B, H), ``h`` (2, L, B, P).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import warnings
import zipfile
from pathlib import Path

import torch

from elmokit.errors import InputTypeError, UsageError, import_optional
from elmokit.export.program import InferenceProgram
from elmokit.io import atomic_path, atomic_write_bytes, check_writable_folder
from elmokit.modules.bilm import BiLM

__all__ = [
    "FORMATS",
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "META_NAME",
    "export_model",
    "metadata",
    "check_exportable",
    "check_output_file",
    "is_elmokit_export",
]

log = logging.getLogger(__name__)

#: the exported formats and the file suffix each must have
FORMATS = {"pt2": ".pt2", "onnx": ".onnx"}
INPUT_NAMES = ("char_ids", "c0", "h0")
OUTPUT_NAMES = ("layers", "mask", "c", "h")
#: the metadata's name: the ``.pt2`` zip's extra file, the ONNX ``metadata_props`` key (``elmokit``)
META_NAME = "elmokit.json"
FORMAT_VERSION = 1

#: the largest batch and length the programs are traced for (a bound torch.export needs; not a real limit)
_MAX_DIM = 1 << 20


def check_exportable(model) -> BiLM:
    """Return ``model`` when the exporters can hold it.

    Raises:
        InputTypeError: not a :class:`BiLM` (a ``StatefulBiLM``, whose carried state lives in Python between calls,
            or an ``Elmo``: export its ``.bilm`` and pass the state as the program's ``c0``/``h0``).
        UsageError: an ELMoForManyLangs model (a word embedding beside the characters), or weights that are not
            float32 or not on the CPU.
    """
    if not isinstance(model, BiLM):
        name = type(model).__name__
        hint = (
            ": its carried state lives in Python between calls; export the stateless model (.bilm) and carry the "
            "state through the program's c0/h0 inputs and c/h outputs"
            if name == "StatefulBiLM"
            else ""
        )
        raise InputTypeError(f"export takes an elmokit BiLM, got {name}{hint}")
    if model.config.char_cnn.word_embedding_dim is not None:
        raise UsageError(
            "export --format pt2|onnx cannot hold an ELMoForManyLangs model (a word embedding beside the "
            "characters): only character models export"
        )
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        raise UsageError(f"export traces the model on the CPU: its weights are on {sorted(devices)}; call .cpu() first")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise UsageError(f"export writes float32 programs: the model's weights are {sorted(map(str, dtypes))}")
    return model


def metadata(model: BiLM, kind: str) -> dict:
    """elmokit's description of an exported ``model`` (written beside the program): format, version, the id width C
    and the number of ids (ids must lie in [0, n_ids)), L, H, P, the clips and skip connections, the stored start
    state (c (2, L, 1, H), h (2, L, 1, P) as nested lists, or ``None`` = zeros), the character vocabulary's
    characters (``None`` for the byte scheme) and the versions that wrote it."""
    cfg = model.config
    start = model.start_state
    vocab = model.char_vocab if cfg.char_cnn.char_vocab_size is not None else None
    return {
        "format": "elmokit-export",
        "version": FORMAT_VERSION,
        "kind": kind,
        "inputs": list(INPUT_NAMES),
        "outputs": list(OUTPUT_NAMES),
        "max_characters_per_token": cfg.char_cnn.max_characters_per_token,
        "n_ids": cfg.char_cnn.n_char_rows + 1,
        "n_layers": cfg.lstm.n_layers,
        "dim": cfg.lstm.dim,
        "projection_dim": cfg.lstm.projection_dim,
        "cell_clip": cfg.lstm.cell_clip,
        "proj_clip": cfg.lstm.proj_clip,
        "use_skip_connections": cfg.lstm.use_skip_connections,
        "start_state": None if start is None else {"c": start[0].tolist(), "h": start[1].tolist()},
        "characters": None if vocab is None else list(vocab.characters),
        "elmokit": _version(),
        "torch": torch.__version__,
    }


def _version() -> str:
    try:
        return importlib.metadata.version("elmokit")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def _example(model: BiLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Example inputs to trace with: 3 rows of 5 tokens (neither 0 nor 1, so no size is specialised)."""
    cfg = model.config
    c = cfg.char_cnn.max_characters_per_token
    ids = torch.full((3, 5, c), 2, dtype=torch.long)
    ids[:, :, 0] = 1
    c0, h0 = model.zero_state(3)
    return ids, c0, h0


def _dynamic_shapes():
    batch = torch.export.Dim("batch", min=1, max=_MAX_DIM)
    time = torch.export.Dim("time", min=1, max=_MAX_DIM)
    return ({0: batch, 1: time}, {2: batch}, {2: batch})


def export_model(model: BiLM, path: str | os.PathLike, kind: str, *, inductor_configs: dict | None = None) -> Path:
    """Export ``model``'s inference path to ``path`` as ``kind`` (``"pt2"``: ``torch.export`` + AOTInductor;
    ``"onnx"``: the dynamo ONNX exporter), written atomically (a failed export leaves no file).

    Args:
        model: a float32 character :class:`BiLM` (see :func:`check_exportable`); its mode is left as it was.
        path: the file to write; its suffix must be ``.pt2`` / ``.onnx``.
        kind: ``"pt2"`` or ``"onnx"``.
        inductor_configs: ``.pt2`` only: passed to ``torch._inductor.aoti_compile_and_package`` (e.g.
            ``{"aot_inductor.compile_wrapper_opt_level": "O0"}`` compiles faster; the test suite uses it).

    Returns the path written. Load it with :func:`elmokit.export.load_exported`.

    Raises:
        UsageError: an unknown ``kind``, a wrong suffix, an output that is a folder or cannot be written (see
            :func:`check_output_file`), or a model the format cannot hold (see :func:`check_exportable`);
            InputTypeError: not a BiLM; MissingExtraError: ``onnx`` / ``onnxscript``
            missing (``pip install 'elmokit[export]'``).
    """
    if kind not in FORMATS:
        raise UsageError(f"export format must be one of {sorted(FORMATS)}, got {kind!r}")
    path = Path(path)
    if path.suffix != FORMATS[kind]:
        raise UsageError(f"a {kind} export is written to a file ending in {FORMATS[kind]}, got {path}")
    check_exportable(model)
    check_output_file(path)  # before the trace: an unwritable place would otherwise fail only after it
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch 2.13's own deprecation notes and the ONNX exporter's dimension-renaming note: nothing to act on
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            warnings.filterwarnings("ignore", message=r"# The axis name: ")
            if kind == "pt2":
                _export_pt2(model, path, inductor_configs)
            else:
                _export_onnx(model, path)
    finally:
        model.train(was_training)
    return path


def check_output_file(path: Path) -> None:
    """Refuse, before any slow work, an output ``path`` that is a folder or whose folder cannot be made or written
    in (its parent folders are created, as the atomic write would).

    Raises:
        UsageError: naming the path and the reason.
    """
    if path.is_dir():
        raise UsageError(
            f"the output {path} is a folder: an export writes one file (e.g. {path / 'model'}{path.suffix})"
        )
    parent = path.parent
    blocker = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UsageError(f"cannot write the export {path}: {blocker} is a file, not a folder")
    existed = parent.is_dir()
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"cannot write the export {path}: its folder {parent} cannot be made ({reason})") from None
    try:
        check_writable_folder(parent, path, "the export")
    except UsageError:
        if not existed:
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def is_elmokit_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a program :func:`export_model` wrote (the only kind of existing file ``--overwrite``
    replaces): a ``.pt2`` zip holding ``extra/elmokit.json``, or an ONNX file whose metadata names the format
    ``elmokit-export`` (the metadata sits after the graph: the last 16 MiB are read). Anything unreadable is not one."""
    path = Path(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                return any(n.endswith(f"/extra/{META_NAME}") for n in zf.namelist())
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - (16 << 20)))
            return b'"format": "elmokit-export"' in fh.read()
    except (OSError, zipfile.BadZipFile):
        return False


def _export_pt2(model: BiLM, path: Path, inductor_configs: dict | None) -> None:
    program = InferenceProgram(model, bind_batch=True).eval()
    exported = torch.export.export(program, _example(model), dynamic_shapes=_dynamic_shapes())
    buffer = io.BytesIO()
    torch._inductor.aoti_compile_and_package(
        exported, package_path=buffer, inductor_configs=dict(inductor_configs or {})
    )
    buffer.seek(0)
    with zipfile.ZipFile(buffer, "a") as zf:  # the archive's extra files (torch.export.pt2_archive: <root>/extra/…)
        root = zf.namelist()[0].split("/", 1)[0]
        zf.writestr(f"{root}/extra/{META_NAME}", json.dumps(metadata(model, "pt2")))
    atomic_write_bytes(path, buffer.getvalue())


def _export_onnx(model: BiLM, path: Path) -> None:
    import_optional("onnxscript", "export", "the ONNX export")
    onnx = import_optional("onnx", "export", "the ONNX export")
    program = InferenceProgram(model).eval()
    # the exporter logs a warning per torchvision operator it cannot register (torchvision is not a dependency)
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        onnx_program = torch.onnx.export(
            program,
            _example(model),
            dynamic_shapes=_dynamic_shapes(),
            dynamo=True,
            input_names=list(INPUT_NAMES),
            output_names=list(OUTPUT_NAMES),
            verbose=False,
        )
    finally:
        registration.setLevel(level)
    with atomic_path(path, suffix=".onnx") as tmp:
        onnx_program.save(str(tmp))
        # the graph's digest (nodes and weights) in the metadata: ONNX files carry no checksum, and a damaged weight
        # byte would otherwise load and run
        proto = onnx.load(str(tmp))
        meta = {**metadata(model, "onnx"), "graph_sha256": graph_digest(proto)}
        onnx.helper.set_model_props(proto, {"elmokit": json.dumps(meta)})
        onnx.save(proto, str(tmp))


def graph_digest(proto) -> str:
    """SHA-256 (hex) of an ONNX ``ModelProto``'s serialised graph (its nodes and weights)."""
    return hashlib.sha256(proto.graph.SerializeToString()).hexdigest()
