"""Saving and loading task models: a folder with ``model.safetensors`` (the task weights: mixes, static table, char
CNN, BiLSTM, CRF/output; the frozen biLM's weights are *not* copied) and ``task.json`` (config, labels, vocabulary,
the biLM's name, file sha256 and fingerprint). Loading resolves the recorded biLM (or takes one) and refuses a biLM
whose fingerprint differs (:func:`~elmokit.tasks.frozen_bilm.check_recorded_bilm`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from elmokit.errors import CheckpointError, ConfigError, MissingFileError, UsageError
from elmokit.io import atomic_path, atomic_write_text, folder_lock
from elmokit.modules.bilm import BiLM
from elmokit.tasks.building import build_module, make_elmo
from elmokit.tasks.config import TaskConfig, task_config_from_dict
from elmokit.tasks.frozen_bilm import check_recorded_bilm, resolve_bilm
from elmokit.tasks.task_model import TaskModel, load_task_state, task_state

__all__ = ["save_task_model", "load_task_model", "FORMAT_VERSION", "WEIGHTS_FILE", "META_FILE"]

#: ``format_version`` of ``task.json``.
FORMAT_VERSION = 1
WEIGHTS_FILE, META_FILE = "model.safetensors", "task.json"


def save_task_model(model: TaskModel, out_dir: str | os.PathLike) -> Path:
    """Write ``out_dir/model.safetensors`` (task weights, not the frozen biLM's) and ``out_dir/task.json`` (format
    version, kind, config, labels, vocabulary, biLM record, history, results), each atomically; returns the folder.

    Raises:
        UsageError: ``out_dir`` is a file.
        FolderInUseError: another process is writing ``out_dir``.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"the output {out} is a file: give a folder for the task model")
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in task_state(model.module).items()}
    inputs = model.inputs
    meta = {
        "format": "elmokit-task-model",
        "format_version": FORMAT_VERSION,
        "kind": model.kind,
        "config": model.config.to_dict(),
        "labels": model.labels,
        "vocab": inputs.vocab,
        "static_dim": inputs.static.embedding_dim if inputs.static is not None else None,
        "bilm": model.bilm_record,
        "history": model.history,
        "results": model.results,
    }
    with folder_lock(out, "task model folder"):  # one writer: the two files come from the same model
        with atomic_path(out / WEIGHTS_FILE, suffix=".safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": "elmokit-task-model"})
        atomic_write_text(out / META_FILE, json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    return out


def _read_meta(folder: Path) -> dict:
    """``task.json`` checked: the folder, both files, the format and its version."""
    if not folder.is_dir():
        raise MissingFileError(f"task model folder {folder}: no such folder")
    for name in (META_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise MissingFileError(
                f"{folder / name}: missing (a task model folder holds {META_FILE} and "
                f"{WEIGHTS_FILE}, written by `elmokit tag/classify train`)"
            )
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{folder / META_FILE}: not a task model description ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "elmokit-task-model":
        raise CheckpointError(f"{folder / META_FILE}: not an elmokit task model (no format: elmokit-task-model)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{folder / META_FILE}: format_version {meta.get('format_version')!r}, this elmokit reads {FORMAT_VERSION}"
        )
    return meta


def _parse_meta(folder: Path, meta: dict) -> tuple[TaskConfig, list[str], list[str] | None, dict | None]:
    """``(config, labels, vocab, biLM record)`` of a checked ``task.json``."""
    try:
        config = task_config_from_dict(meta["config"], source=str(folder / META_FILE))
        return config, list(meta["labels"]), meta.get("vocab"), meta.get("bilm")
    except (KeyError, TypeError, ConfigError) as exc:
        raise CheckpointError(f"{folder / META_FILE}: damaged ({exc})") from None


def _task_bilm(folder: Path, config: TaskConfig, record: dict | None, bilm: BiLM | None) -> BiLM | None:
    """The biLM the model needs (the recorded one, or ``bilm`` when it is that one), or ``None`` without ELMo."""
    if not config.uses_elmo:
        if bilm is not None:
            raise UsageError(f"{folder}: this task model uses no biLM; do not pass one")
        return None
    if record is None:
        raise CheckpointError(f"{folder / META_FILE}: the config uses a biLM but no biLM is recorded")
    given = bilm is not None
    if bilm is None:
        bilm = resolve_bilm(
            record["model"], random_like=record.get("random_like"), random_seed=record.get("random_seed") or 0
        )
    check_recorded_bilm(record, bilm, given=given, where=folder)
    return bilm


def load_task_model(
    model_dir: str | os.PathLike, *, bilm: BiLM | None = None, device: str | torch.device = "cpu"
) -> TaskModel:
    """Load a folder written by :func:`save_task_model`.

    Args:
        bilm: the biLM to use; default: the recorded one (zoo name / folder, or the random control rebuilt from its
            seed). Either way its fingerprint must equal the recorded one.

    Raises:
        MissingFileError: no folder, or no ``task.json`` / ``model.safetensors`` in it.
        CheckpointError: unreadable or inconsistent files, or **a biLM other than the one the model was trained
            with** (the message names both).
        UsageError: a biLM given for a model that uses none.
    """
    folder = Path(model_dir)
    meta = _read_meta(folder)
    config, labels, vocab, record = _parse_meta(folder, meta)
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise CheckpointError(f"{folder / WEIGHTS_FILE}: unreadable ({exc})") from None
    bilm = _task_bilm(folder, config, record, bilm)
    table = None
    if vocab is not None:
        key = "inputs.static.weight"
        if key not in state:
            raise CheckpointError(f"{folder / WEIGHTS_FILE}: no {key} for the vocabulary in {META_FILE}")
        table = torch.zeros_like(state[key])
    module = build_module(config, len(labels), vocab, table, make_elmo(config, bilm))
    load_task_state(module, state)
    model = TaskModel(config.task, module, labels, config, record)
    model.history = meta.get("history") or []
    model.results = meta.get("results") or {}
    return model.to(device)
