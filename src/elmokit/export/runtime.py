"""Loading an exported biLM (``.pt2`` or ``.onnx``, :mod:`elmokit.export.files`) as a callable with the inputs and
outputs of :meth:`elmokit.modules.bilm.BiLM.forward` (stateless, or from an explicit state)."""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from elmokit.characters import ByteCharacterMapper, CharVocabulary
from elmokit.errors import InputError, InputTypeError, MissingFileError, UsageError, WeightsError, import_optional
from elmokit.export.files import FORMATS, INPUT_NAMES, META_NAME, graph_digest
from elmokit.modules.padding import check_left_aligned, token_mask

__all__ = ["ExportedBiLM", "ExportedOutput", "load_exported"]

State = tuple[torch.Tensor, torch.Tensor]
#: the id dtypes a call takes (as BiLM.check_char_ids; uint64 has no min/max in torch)
_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_ID_DTYPES_NP = tuple(np.dtype(d) for d in (np.int64, np.int32, np.int16, np.int8, np.uint8))
#: the most ONNX Runtime threads load_exported accepts (a typo such as 100000 would hang creating them)
MAX_THREADS = 1024


@dataclass
class ExportedOutput:
    """What an :class:`ExportedBiLM` call returns (the fields of :class:`~elmokit.modules.bilm.BiLMOutput` it has).

    Attributes:
        layers: (B, L+1, T, 2P) float32, zero at padding.
        mask: (B, T) bool, True = real token.
        state: (c (2, L, B, H), h (2, L, B, P)) float32, the state reached at each row's last step.
    """

    layers: torch.Tensor
    mask: torch.Tensor
    state: State


class ExportedBiLM:
    """An exported biLM loaded for inference: ``model(char_ids, state=None) -> ExportedOutput``.

    ``char_ids``: (B, T, C) integer ids from ``batch_to_ids`` (a tensor or a numpy array; for a character-vocabulary
    model, ``batch_to_ids(sentences, C, char_vocab=model.char_vocab)``); ``state``: (c, h) as ``BiLM.forward``'s, or
    ``None`` = the model's start state (zeros unless it was exported with a stored one). Outputs are torch tensors
    on the CPU. Input is checked as :meth:`BiLM.check_char_ids` does (shape, dtype, id range, left alignment: a compiled
    program would read out of bounds on ids outside its tables).

    Attributes: ``path``, ``kind`` (``"pt2"``/``"onnx"``), ``meta`` (the file's elmokit metadata), ``char_vocab``
    (:class:`CharVocabulary` or ``None``), ``num_layers`` (L + 1), ``output_dim`` (2P), ``start_state``.
    """

    def __init__(self, path: Path, kind: str, meta: dict, run) -> None:
        self.path, self.kind, self.meta, self._run = path, kind, meta, run
        self.n_layers, self.dim, self.projection_dim = meta["n_layers"], meta["dim"], meta["projection_dim"]
        self.width, self.n_ids = meta["max_characters_per_token"], meta["n_ids"]
        self.num_layers = self.n_layers + 1
        self.output_dim = 2 * self.projection_dim
        chars = meta.get("characters")
        self.char_vocab = None if chars is None else CharVocabulary(chars, self.width)
        start = meta.get("start_state")
        self.start_state = (
            None
            if start is None
            else (torch.tensor(start["c"], dtype=torch.float32), torch.tensor(start["h"], dtype=torch.float32))
        )

    def __repr__(self) -> str:
        return f"ExportedBiLM({str(self.path)!r}, kind={self.kind!r}, layers={self.num_layers}, dim={self.output_dim})"

    def initial_state(self, batch_size: int) -> State:
        """The state a call without ``state`` starts from: the stored start state repeated, else zeros."""
        if self.start_state is None:
            return (
                torch.zeros(2, self.n_layers, batch_size, self.dim),
                torch.zeros(2, self.n_layers, batch_size, self.projection_dim),
            )
        return tuple(t.expand(-1, -1, batch_size, -1).contiguous() for t in self.start_state)

    def _check(self, char_ids) -> torch.Tensor:
        if isinstance(char_ids, np.ndarray):
            if char_ids.dtype not in _ID_DTYPES_NP:
                raise InputTypeError(
                    f"char_ids must be integer ids (an int64 array, as batch_to_ids), got numpy dtype {char_ids.dtype}"
                )
            char_ids = torch.from_numpy(np.array(char_ids, copy=not char_ids.flags.writeable))
        if not isinstance(char_ids, torch.Tensor):
            raise InputTypeError(
                f"char_ids must be a LongTensor (B, T, C) from batch_to_ids, got {type(char_ids).__name__}"
            )
        if char_ids.device.type != "cpu":
            raise InputError(f"char_ids must be on the CPU (an exported model runs there), got {char_ids.device}")
        if char_ids.dim() != 3 or char_ids.shape[-1] != self.width:
            raise InputError(f"char_ids must have shape (B, T, {self.width}), got {tuple(char_ids.shape)}")
        if char_ids.dtype not in _ID_DTYPES:
            raise InputTypeError(f"char_ids must be integer ids (a LongTensor from batch_to_ids), got {char_ids.dtype}")
        if char_ids.numel():
            lo, hi = int(char_ids.min()), int(char_ids.max())
            if lo < 0 or hi >= self.n_ids:
                raise InputError(
                    f"char_ids contain {lo if lo < 0 else hi}, outside the character table [0, {self.n_ids})"
                )
        mask = token_mask(char_ids)
        check_left_aligned(mask, "char_ids")
        self._check_scheme(char_ids[mask])
        return char_ids.to(torch.long).contiguous()

    def _check_scheme(self, real: torch.Tensor) -> None:
        """Refuse ids made for the other character scheme (as :meth:`BiLM.check_char_ids`): with a large character
        vocabulary, byte ids fall inside its table and would run to wrong vectors."""
        own, other = (
            (ByteCharacterMapper, CharVocabulary) if self.char_vocab is None else (CharVocabulary, ByteCharacterMapper)
        )
        if not real.shape[0] or own.bow_char == other.bow_char:
            return
        first, last = real[:, 0], real[:, -1]
        if bool(((first == other.bow_char) & ((last == other.pad_char) | (last == other.eow_char))).all()):
            made_by = (
                "batch_to_ids(sentences)"
                if self.char_vocab is None
                else (f"batch_to_ids(sentences, {self.width}, char_vocab=model.char_vocab)")
            )
            raise InputError(
                f"char_ids were made for the other character scheme (every token starts with its begin-of-word id "
                f"{other.bow_char}); this model's ids come from {made_by}"
            )

    def _check_state(self, state, batch_size: int) -> State:
        want = ((2, self.n_layers, batch_size, self.dim), (2, self.n_layers, batch_size, self.projection_dim))
        ok = isinstance(state, (tuple, list)) and len(state) == 2
        ok = ok and all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.device.type == "cpu" for t in state)
        if not ok or tuple(state[0].shape) != want[0] or tuple(state[1].shape) != want[1]:
            raise InputError(
                f"state must be (c, h) float CPU tensors of shapes {want[0]} and {want[1]} (2 directions, L layers, "
                "B rows)"
            )
        return tuple(t.detach().to(torch.float32).contiguous() for t in state)

    def __call__(self, char_ids, state: State | None = None) -> ExportedOutput:
        ids = self._check(char_ids)
        b, t, _ = ids.shape
        c0, h0 = self.initial_state(b) if state is None else self._check_state(state, b)
        if b == 0:
            empty = torch.zeros(0, self.num_layers, t, self.output_dim)
            return ExportedOutput(empty, torch.zeros(0, t, dtype=torch.bool), (c0, h0))
        if t == 0:  # the programs take T ≥ 1: one padding step changes nothing (its outputs are cut off again)
            ids = ids.new_zeros(b, 1, self.width)
        layers, mask, c, h = self._run(ids, c0, h0)
        return ExportedOutput(layers[:, :, :t], mask[:, :t], (c, h))


def _bad(path: Path, detail: str) -> WeightsError:
    return WeightsError(f"{path} is not a readable elmokit export: {detail}")


def _check_meta(path: Path, text: str | bytes | None, kind: str) -> dict:
    if text is None:
        raise _bad(path, "it holds no elmokit metadata (write it with `elmokit export --format pt2|onnx`)")
    try:
        meta = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"its elmokit metadata is not JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != "elmokit-export" or meta.get("kind") != kind:
        raise _bad(path, f"its metadata does not describe an elmokit {kind} export")
    if meta.get("version") != 1:
        raise _bad(path, f"format version {meta.get('version')!r}; this elmokit reads version 1")
    return meta


def _load_pt2(path: Path) -> ExportedBiLM:
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()  # every member's CRC: a damaged compiled library would crash, not fail, when loaded
            if bad is not None:
                raise _bad(path, f"its member {bad} is damaged (CRC mismatch)")
            names = [n for n in zf.namelist() if n.endswith(f"/extra/{META_NAME}")]
            text = zf.read(names[0]) if names else None
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise MissingFileError(f"exported model {path} not found") from exc
        raise _bad(path, f"not a .pt2 (zip) archive ({exc})") from exc
    meta = _check_meta(path, text, "pt2")
    try:
        runner = torch._inductor.aoti_load_package(str(path))
    except Exception as exc:  # the AOTInductor loader raises RuntimeError of many kinds
        raise _bad(path, f"AOTInductor could not load it ({' '.join(str(exc).split())[:200]})") from exc

    def run(ids, c0, h0):
        return runner(ids, c0, h0)

    return ExportedBiLM(path, "pt2", meta, run)


def _load_onnx(path: Path, threads: int | None) -> ExportedBiLM:
    onnx = import_optional("onnx", "export", "loading an ONNX export")
    ort = import_optional("onnxruntime", "export", "running an ONNX export")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise _bad(path, f"not an ONNX model ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from exc
    props = {p.key: p.value for p in model.metadata_props}
    meta = _check_meta(path, props.get("elmokit"), "onnx")
    if meta.get("graph_sha256") != graph_digest(model):
        raise _bad(path, "its graph does not match the digest written with it (the file is damaged)")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's Fail / InvalidGraph / InvalidProtobuf
        raise _bad(path, f"ONNX Runtime could not load it ({' '.join(str(exc).split())[:200]})") from exc

    def run(ids, c0, h0):
        feeds = dict(zip(INPUT_NAMES, (ids.numpy(), c0.numpy(), h0.numpy())))
        return [torch.from_numpy(a) for a in session.run(None, feeds)]

    return ExportedBiLM(path, "onnx", meta, run)


def load_exported(path: str | os.PathLike, *, threads: int | None = None) -> ExportedBiLM:
    """Load a ``.pt2`` (AOTInductor) or ``.onnx`` (ONNX Runtime) export written by ``elmokit export --format
    pt2|onnx`` / :func:`elmokit.export.export_model`.

    Args:
        path: the file; its suffix says the format.
        threads: ONNX Runtime's intra-op threads (``None``: its default); a ``.pt2`` uses torch's OpenMP setting.

    Returns an :class:`ExportedBiLM`.

    Loading a ``.pt2`` runs the native code inside it (as importing a module runs its code): load only files you made
    or trust. An ``.onnx`` file is a graph that ONNX Runtime interprets.

    Raises:
        MissingFileError: no such file. UsageError: a suffix other than ``.pt2`` / ``.onnx``; ``threads`` not a whole
            number in [1, 1024].
        WeightsError: a damaged file, or one without elmokit's metadata (one line naming the file).
        MissingExtraError: ``onnx`` / ``onnxruntime`` missing for an ONNX file (``pip install 'elmokit[export]'``).
    """
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= MAX_THREADS
    ):
        raise UsageError(f"threads must be None or a whole number from 1 to {MAX_THREADS}, got {threads!r}")
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"exported model {path} not found" + (" (it is a folder)" if path.is_dir() else ""))
    kinds = {suffix: kind for kind, suffix in FORMATS.items()}
    if path.suffix not in kinds:
        raise UsageError(f"an exported model is a .pt2 or .onnx file, got {path}")
    return _load_pt2(path) if kinds[path.suffix] == "pt2" else _load_onnx(path, threads)
