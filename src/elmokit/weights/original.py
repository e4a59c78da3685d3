"""The original weight format: bilm-tf / AllenNLP ``options.json`` + HDF5 ⇄ :class:`~elmokit.modules.bilm.BiLM`.

One explicit table (:func:`conversion_table`) lists every HDF5 dataset, the model tensor it fills, and the
transform between the two layouts; loading checks every shape and the set of dataset names against it, and
exporting applies the inverse transforms, so HDF5 → model → HDF5 is bit-exact (transforms are transposes and
slices only; the LSTM forget bias of 1.0 is added at run time, never stored).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from elmokit.config import ElmoConfig
from elmokit.errors import ConfigError, MissingFileError, WeightsError
from elmokit.io import atomic_path
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.weights import load_state_checked

__all__ = ["load_original", "load_original_state", "export_original", "conversion_table", "Entry"]


@dataclass(frozen=True)
class Entry:
    """One row of the conversion table.

    Attributes:
        dataset: HDF5 dataset name.
        hdf5_shape: shape expected in the file (from the options).
        to_model: numpy array (file layout) → tensor pieces; returns ``{model_name: array}`` (one or more).
        from_model: ``{model_name: array}`` → array in file layout.
    """

    dataset: str
    hdf5_shape: tuple[int, ...]
    to_model: Callable[[np.ndarray], dict[tuple[str, int | None], np.ndarray]]
    from_model: Callable[[dict[tuple[str, int | None], np.ndarray]], np.ndarray]


def _ident(name: str, direction: int | None = None):
    return (lambda a: {(name, direction): a}), (lambda d: d[(name, direction)])


def _transpose(name: str):
    return (lambda a: {(name, None): np.ascontiguousarray(a.T)}), (lambda d: np.ascontiguousarray(d[(name, None)].T))


def conversion_table(config: ElmoConfig) -> list[Entry]:
    """Every dataset of an original weight file for ``config``, with its model tensor and layout transform.

    Model names are :class:`BiLM` ``state_dict`` keys; LSTM tensors carry a direction index (0 forward = ``RNN_0``,
    1 backward = ``RNN_1``) into the leading axis of elmokit's stacked parameters.
    """
    cc, ls = config.char_cnn, config.lstm
    d, p, h = cc.embedding_dim, ls.projection_dim, ls.dim
    f = cc.n_filters
    table: list[Entry] = [Entry("char_embed", (cc.n_char_rows, d), *_ident("token_encoder.char_cnn.char_embedding"))]
    for i, (w, n) in enumerate(cc.filters):
        # TF conv2d kernel (1, width, in, out) ⇄ torch Conv1d weight (out, in, width)
        name = f"token_encoder.char_cnn.convolutions.{i}.weight"
        table.append(
            Entry(
                f"CNN/W_cnn_{i}",
                (1, w, d, n),
                lambda a, name=name: {(name, None): np.ascontiguousarray(a[0].transpose(2, 1, 0))},
                lambda dd, name=name: np.ascontiguousarray(dd[(name, None)].transpose(2, 1, 0)[None]),
            )
        )
        table.append(Entry(f"CNN/b_cnn_{i}", (n,), *_ident(f"token_encoder.char_cnn.convolutions.{i}.bias")))
    for k in range(cc.n_highway):
        # W_carry computes the gate (it multiplies the transformed value); x·W layout → Linear (out, in)
        table.append(Entry(f"CNN_high_{k}/W_carry", (f, f), *_transpose(f"token_encoder.highway.gates.{k}.weight")))
        table.append(Entry(f"CNN_high_{k}/b_carry", (f,), *_ident(f"token_encoder.highway.gates.{k}.bias")))
        table.append(
            Entry(f"CNN_high_{k}/W_transform", (f, f), *_transpose(f"token_encoder.highway.transforms.{k}.weight"))
        )
        table.append(Entry(f"CNN_high_{k}/b_transform", (f,), *_ident(f"token_encoder.highway.transforms.{k}.bias")))
    table.append(Entry("CNN_proj/W_proj", (f, p), *_transpose("token_encoder.projection.weight")))
    table.append(Entry("CNN_proj/b_proj", (p,), *_ident("token_encoder.projection.bias")))
    for direction in (0, 1):
        for k in range(ls.n_layers):
            prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{k}/LSTMCell"
            ih, hh = f"bilstm.weight_ih.{k}", f"bilstm.weight_hh.{k}"
            # W_0 rows are [input; h_prev]: split into the input and recurrent matrices (x·W layout kept)
            table.append(
                Entry(
                    f"{prefix}/W_0",
                    (p + p, 4 * h),
                    lambda a, ih=ih, hh=hh, dr=direction: {(ih, dr): a[:p], (hh, dr): a[p:]},
                    lambda dd, ih=ih, hh=hh, dr=direction: np.concatenate([dd[(ih, dr)], dd[(hh, dr)]], axis=0),
                )
            )
            table.append(Entry(f"{prefix}/B", (4 * h,), *_ident(f"bilstm.bias.{k}", direction)))
            table.append(Entry(f"{prefix}/W_P_0", (h, p), *_ident(f"bilstm.weight_proj.{k}", direction)))
    return table


def _read_datasets(weight_file: Path) -> dict[str, np.ndarray]:
    if weight_file.is_dir():
        raise MissingFileError(f"weight file {weight_file} is a folder; expected the HDF5 weight file")
    if not weight_file.is_file():
        raise MissingFileError(f"weight file not found: {weight_file}")
    with open(weight_file, "rb") as fh:
        head = fh.read(8)
    if head.lstrip()[:1] in (b"{", b"["):
        raise WeightsError(
            f"{weight_file} is a JSON file, not an HDF5 weight file: pass the options.json as the "
            "options file and the .hdf5 as the weight file"
        )
    out: dict[str, np.ndarray] = {}
    try:
        with h5py.File(weight_file, "r") as fh:

            def visit(name: str, obj) -> None:
                if isinstance(obj, h5py.Dataset):
                    out[name] = obj[...]

            fh.visititems(visit)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        # h5py: OSError for a foreign or truncated file, others for damaged internals
        raise WeightsError(
            f"{weight_file} is not a readable HDF5 weight file (truncated or damaged? "
            f"{type(exc).__name__}: {exc}); re-download or re-export it"
        ) from None
    return out


def load_original_state(config: ElmoConfig, weight_file: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read an original HDF5 weight file into a :class:`BiLM` ``state_dict`` for ``config``.

    Raises:
        MissingFileError: no such file (or a folder).
        WeightsError: not a readable HDF5 file (names it), a dataset is missing or unexpected, or its shape differs
            from what the options imply (the message names the dataset and both shapes).
    """
    weight_file = Path(weight_file)
    data = _read_datasets(weight_file)
    table = conversion_table(config)
    expected = {e.dataset for e in table}
    # Softmax / other training-only datasets are not part of the biLM body; ignore them explicitly.
    ignorable = {k for k in data if k.startswith(("softmax/", "Model/softmax"))}
    missing = sorted(expected - set(data))
    extra = sorted(set(data) - expected - ignorable)
    if missing:
        raise WeightsError(
            f"{weight_file}: dataset(s) {missing[:5]} required by the options are missing "
            f"(options: {config.lstm.n_layers} LSTM layers, {len(config.char_cnn.filters)} filters, "
            f"{config.char_cnn.n_highway} highway layers)"
        )
    if extra:
        raise WeightsError(
            f"{weight_file}: dataset(s) {extra[:5]} are not expected by the options "
            f"({config.lstm.n_layers} LSTM layers, {len(config.char_cnn.filters)} filters, "
            f"{config.char_cnn.n_highway} highway layers): options and weights do not match"
        )
    pieces: dict[tuple[str, int | None], np.ndarray] = {}
    for entry in table:
        array = data[entry.dataset]
        if entry.dataset == "char_embed" and array.shape[0] == entry.hdf5_shape[0] + 1:
            # some files store the zero padding row too: check it is zero and drop it
            if np.any(array[0] != 0):
                raise WeightsError(f"{weight_file}: char_embed has {array.shape[0]} rows but row 0 is not zero")
            array = array[1:]
        if tuple(array.shape) != entry.hdf5_shape:
            raise WeightsError(
                f"{weight_file}: dataset {entry.dataset!r} has shape {tuple(array.shape)} but the options imply "
                f"{entry.hdf5_shape}"
            )
        if not np.issubdtype(array.dtype, np.floating):
            raise WeightsError(f"{weight_file}: dataset {entry.dataset!r} holds {array.dtype} values; expected floats")
        pieces.update(entry.to_model(array.astype(np.float32, copy=False)))
    state: dict[str, torch.Tensor] = {}
    grouped: dict[str, dict[int, np.ndarray]] = {}
    for (name, direction), array in pieces.items():
        if direction is None:
            state[name] = torch.from_numpy(np.ascontiguousarray(array))
        else:
            grouped.setdefault(name, {})[direction] = array
    for name, by_dir in grouped.items():
        state[name] = torch.from_numpy(np.stack([by_dir[0], by_dir[1]], axis=0))
    return state


def load_original(
    options_file: str | os.PathLike, weight_file: str | os.PathLike, *, stateful: bool = False, **bilm_kwargs
) -> BiLM:
    """Build a :class:`BiLM` from an original ``options.json`` + HDF5 pair (``bilm_kwargs`` go to BiLM, e.g.
    ``dropout``); ``stateful=True`` returns it wrapped in :class:`~elmokit.modules.bilm.StatefulBiLM` (the original's
    carried-state inference). Raises as :func:`load_original_state` and :meth:`ElmoConfig.from_json_file`."""
    config = ElmoConfig.from_json_file(options_file)
    model = BiLM(config, **bilm_kwargs)
    state = load_original_state(config, weight_file)
    load_state_checked(model, state, str(weight_file))
    return StatefulBiLM(model) if stateful else model


def export_original(
    model: BiLM, out_dir: str | os.PathLike, *, options_name: str = "options.json", weights_name: str = "weights.hdf5"
) -> tuple[Path, Path]:
    """Write ``model`` as an original ``options.json`` + HDF5 pair (atomically), readable by bilm-tf, AllenNLP and
    :func:`load_original`. Returns the two paths.

    Raises:
        ConfigError: a character-vocabulary model (the original format only knows UTF-8 byte ids), or a model with a
            stored non-zero start state (:attr:`~elmokit.modules.bilm.BiLM.start_state`, which a window-trained model
            reads every sentence from): the original format has no place for it, and its readers start from zeros,
            so the export would give other vectors and perplexities than the model.
    """
    config = model.config
    if config.char_cnn.char_vocab_size is not None:
        raise ConfigError(
            "this model reads a character vocabulary (char_vocab_size="
            f"{config.char_cnn.char_vocab_size}), which the original options.json + HDF5 format cannot "
            "express: share the native folder (config.json + model.safetensors + chars.txt) instead"
        )
    if getattr(model, "start_state", None) is not None:
        source = getattr(model, "start_state_source", None)
        raise ConfigError(
            f"this model starts every sentence from a stored non-zero LSTM start state"
            f"{f' ({source})' if source else ''}, which the original options.json + HDF5 format cannot "
            "hold (its readers start from zeros and would give other vectors): share the native folder "
            "(config.json + model.safetensors) instead"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    pieces: dict[tuple[str, int | None], np.ndarray] = {}
    for name, array in state.items():
        pieces[(name, None)] = array
        if name.startswith("bilstm."):
            pieces[(name, 0)], pieces[(name, 1)] = array[0], array[1]
    weights_path = out_dir / weights_name
    with atomic_path(weights_path, suffix=".hdf5") as tmp:
        with h5py.File(tmp, "w") as fh:
            for entry in conversion_table(config):
                fh.create_dataset(entry.dataset, data=entry.from_model(pieces).astype(np.float32, copy=False))
    options_path = out_dir / options_name
    config.to_json_file(options_path)
    return options_path, weights_path
