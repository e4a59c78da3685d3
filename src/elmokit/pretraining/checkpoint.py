"""Training checkpoints on disk: written so that nothing is lost, verified before they are used.

Layout in a run's folder (``out_dir``)::

    ckpt-<step>.safetensors   the model's tensors (``BidirectionalLM.state_dict()``), CPU, float32
    ckpt-<step>.state.pt      optimiser, the data position of every data part, the carried LSTM state of every part,
                              the best held-out record (``torch.save``; read back with
                              ``torch.load(weights_only=True)``)
    checkpoint.json           the manifest: the kept checkpoints, oldest first, each with its step and every file's
                              size (bytes) and sha256; the vocabulary the run was trained with (size, sha256); the
                              training files' fingerprint ("corpus": size, mtime_ns and sha256 of each file)

Write order (:func:`write_checkpoint`): the tensor file, then the state file, then the manifest, each to a temporary
name in the same folder that is renamed into place (:func:`elmokit.io.atomic_path`), so a process killed at any point
leaves the previous manifest, naming complete files, or the new one; files that no manifest names any more (older
checkpoints beyond ``keep``, a half-finished later one) are deleted only after the new manifest is in place.

Reading (:func:`load_latest`): the newest checkpoint in the manifest is verified (files present, sizes and sha256 as
recorded, both files loadable); a damaged one is reported with a ``WARNING`` naming the file and what is wrong, and the
previous one is tried; when none verifies, :class:`~elmokit.errors.CheckpointError` names the files. A manifest of the
first format, ``{"step": N}`` (written by elmokit before checkpoints were verified), has no sizes or hashes: its files
are verified by loading them.

Test hook: :func:`write_checkpoint` calls ``at_point(point, step)`` (the trainer's
:meth:`~elmokit.pretraining.hooks.TrainHooks.checkpoint_point`) at each point of :data:`KILL_POINTS`:
``before_write``, ``between_files`` (tensor file written, state file not), ``before_manifest`` (both files written,
manifest not) and ``after_manifest`` (manifest written, older files not yet deleted). ``tests/test_kill.py`` kills its
process with ``SIGKILL`` there to show that a resume after each of these kills continues exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from elmokit.errors import CheckpointError, option_wording
from elmokit.io import atomic_path, atomic_write_text

__all__ = [
    "MANIFEST_NAME",
    "KILL_POINTS",
    "RUN_FILE_NAMES",
    "CheckpointEntry",
    "Manifest",
    "LoadedCheckpoint",
    "tensor_file_name",
    "state_file_name",
    "read_manifest",
    "write_checkpoint",
    "entry_problems",
    "load_latest",
    "latest_valid_step",
    "run_files",
    "remove_run_files",
    "file_digest",
    "text_digest",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "checkpoint.json"
MANIFEST_FORMAT = 2
#: The points of a checkpoint write where ``write_checkpoint``'s ``at_point`` is called (in this order).
KILL_POINTS = ("before_write", "between_files", "before_manifest", "after_manifest")
#: The files and folders a training run writes into its ``out_dir`` besides ``ckpt-*`` (see
#: :mod:`elmokit.pretraining.run_folder`).
RUN_FILE_NAMES = ("checkpoint.json", "metrics.jsonl", "learning_curve.png", "train_config.json", "model", "best")

_CKPT_RE = re.compile(r"^ckpt-(\d+)\.(safetensors|state\.pt)$")
# atomic_path's temporaries: ".<name>.<random><suffix>.tmp" (and the best/ model's temporary folders)
_TMP_RE = re.compile(
    r"^\.(ckpt-\d+\.(?:safetensors|state\.pt)|checkpoint\.json|metrics\.jsonl|learning_curve\.png|"
    r"train_config\.json|best)\..+\.tmp$"
)


def tensor_file_name(step: int) -> str:
    """``ckpt-<step>.safetensors``."""
    return f"ckpt-{step}.safetensors"


def state_file_name(step: int) -> str:
    """``ckpt-<step>.state.pt``."""
    return f"ckpt-{step}.state.pt"


def text_digest(lines: list[str]) -> str:
    """sha256 (hex) of ``lines`` written one per line, UTF-8, ``\\n`` ends: the digest of the file
    :meth:`elmokit.vocabulary.Vocabulary.save` (or ``CharVocabulary.save``) writes for them."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def file_digest(path: str | os.PathLike, *, fsync: bool = False) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a file, read in 1 MiB blocks; with ``fsync`` the file is flushed to disk
    first (the writer calls it on the temporary file before it is renamed into place)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        if fsync:
            os.fsync(fh.fileno())
        while block := fh.read(1 << 20):
            h.update(block)
            size += len(block)
    return {"size": size, "sha256": h.hexdigest()}


# ---------------------------------------------------------------------------------------------- manifest
@dataclass
class CheckpointEntry:
    """One kept checkpoint: its step and, for each of its two files, ``{"size", "sha256"}`` (``None`` in a manifest of
    the first format, which recorded only the step)."""

    step: int
    files: dict[str, dict[str, Any]] | None = None

    @property
    def file_names(self) -> tuple[str, str]:
        return tensor_file_name(self.step), state_file_name(self.step)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "files": self.files}


@dataclass
class Manifest:
    """``checkpoint.json``: the kept checkpoints (oldest first) and what the run depends on (``run``: e.g.
    ``{"vocab": {"size", "sha256", "file"}}``). ``format`` 1 is the first, step-only format."""

    checkpoints: list[CheckpointEntry]
    run: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    @property
    def newest(self) -> CheckpointEntry | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def to_text(self) -> str:
        data = {
            "format": MANIFEST_FORMAT,
            "step": self.checkpoints[-1].step,
            "checkpoints": [e.to_json() for e in self.checkpoints],
            **self.run,
        }
        return json.dumps(data, indent=1) + "\n"


def read_manifest(out_dir: str | os.PathLike) -> Manifest | None:
    """The manifest of ``out_dir``, or ``None`` when there is no ``checkpoint.json``.

    Accepts both formats: ``{"format": 2, "step": N, "checkpoints": [...], "vocab": {...}}`` and the first one,
    ``{"step": N}``.

    Raises:
        CheckpointError: ``checkpoint.json`` is not valid JSON or does not have that shape (names the file).
    """
    path = Path(out_dir) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"{path} is not a readable checkpoint manifest ({exc}); start the run again with --overwrite"
        ) from None
    try:
        if isinstance(data, dict) and "checkpoints" in data:
            entries = []
            for item in data["checkpoints"]:
                files = item["files"]
                if files is not None:
                    files = {
                        str(name): {"size": int(info["size"]), "sha256": str(info["sha256"])}
                        for name, info in files.items()
                    }
                entries.append(CheckpointEntry(_as_step(item["step"]), files))
            if not entries:
                raise ValueError("no checkpoint listed")
            run = {k: v for k, v in data.items() if k not in ("format", "step", "checkpoints")}
            return Manifest(sorted(entries, key=lambda e: e.step), run, int(data.get("format", MANIFEST_FORMAT)))
        if isinstance(data, dict) and "step" in data:
            return Manifest([CheckpointEntry(_as_step(data["step"]))], {}, 1)
        raise ValueError("neither 'checkpoints' nor 'step'")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{path} does not have the shape of a checkpoint manifest ({exc}); start the run again with --overwrite"
        ) from None


def _as_step(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"step {value!r} is not an int >= 0")
    return value


# ---------------------------------------------------------------------------------------------- writing
def _nothing(point: str, step: int) -> None:
    """The ``at_point`` of a write without hook."""


def write_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    tensors: dict[str, torch.Tensor],
    state: dict[str, Any],
    *,
    previous: list[CheckpointEntry],
    keep: int,
    run: dict[str, Any],
    at_point: Callable[[str, int], None] | None = None,
) -> list[CheckpointEntry]:
    """Write the checkpoint of ``step``, then the manifest naming it and the newest ``keep - 1`` of ``previous`` with a
    smaller step, then delete every ``ckpt-*`` file the manifest does not name (and leftover temporaries).

    Args:
        tensors: name → CPU contiguous tensor (safetensors). state: anything ``torch.load(weights_only=True)`` reads.
        previous: the run's kept checkpoints so far (oldest first); entries with ``step >=`` this one are dropped (a
            resumed run that fell back past a damaged checkpoint overwrites it).
        keep: checkpoints kept (>= 1). run: extra manifest keys (the vocabulary's size and sha256).
        at_point: called as ``at_point(point, step)`` at each point of :data:`KILL_POINTS` (a test hook; ``None``:
            nothing is called).

    Returns:
        The kept entries, oldest first (the new manifest's list).
    """
    out_dir = Path(out_dir)
    point = at_point or _nothing
    point("before_write", step)
    t_name, s_name = tensor_file_name(step), state_file_name(step)
    with atomic_path(out_dir / t_name, suffix=".safetensors") as tmp:
        save_file(tensors, str(tmp))
        t_info = file_digest(tmp, fsync=True)
    point("between_files", step)
    with atomic_path(out_dir / s_name, suffix=".pt") as tmp:
        torch.save(state, tmp)
        s_info = file_digest(tmp, fsync=True)
    point("before_manifest", step)
    older = [e for e in previous if e.step < step]
    kept = (older[-(keep - 1) :] if keep > 1 else []) + [CheckpointEntry(step, {t_name: t_info, s_name: s_info})]
    atomic_write_text(out_dir / MANIFEST_NAME, Manifest(kept, run).to_text())
    point("after_manifest", step)
    _prune(out_dir, kept)
    return kept


def _prune(out_dir: Path, kept: list[CheckpointEntry]) -> None:
    names = {n for e in kept for n in e.file_names}
    for path in out_dir.iterdir():
        if (_CKPT_RE.match(path.name) and path.name not in names) or (
            path.name.startswith(".ckpt-") and _TMP_RE.match(path.name)
        ):
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- reading
def entry_problems(out_dir: str | os.PathLike, entry: CheckpointEntry) -> list[str]:
    """What is wrong with the files of ``entry`` (empty when they are present with the recorded sizes and sha256).

    Entries of the first manifest format have nothing recorded: only their presence is checked here
    (:func:`load_latest` and :func:`latest_valid_step` then load them)."""
    out_dir = Path(out_dir)
    problems = []
    for name in entry.file_names:
        path = out_dir / name
        if not path.is_file():
            problems.append(f"{path} is missing")
            continue
        info = None if entry.files is None else entry.files.get(name)
        if entry.files is not None and info is None:
            problems.append(f"{path} is not listed in {MANIFEST_NAME}")
            continue
        if info is None:
            continue
        size = path.stat().st_size
        if size != info["size"]:
            problems.append(f"{path} has {size} bytes, {MANIFEST_NAME} recorded {info['size']} (truncated or replaced)")
        elif file_digest(path)["sha256"] != info["sha256"]:
            problems.append(f"{path} does not have the sha256 recorded in {MANIFEST_NAME} (its contents changed)")
    return problems


def _read_files(out_dir: Path, entry: CheckpointEntry) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    t_path, s_path = (out_dir / n for n in entry.file_names)
    try:
        tensors = load_file(str(t_path))
    except Exception as exc:  # safetensors raises its own SafetensorError (and OSError) for a damaged file
        raise CheckpointError(f"{t_path} cannot be read ({type(exc).__name__}: {exc})") from None
    try:
        state = torch.load(s_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError / UnpicklingError / EOFError for a damaged file
        raise CheckpointError(f"{s_path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("step") != entry.step:
        raise CheckpointError(f"{s_path} does not hold the state of step {entry.step}")
    return tensors, state


@dataclass
class LoadedCheckpoint:
    """The checkpoint :func:`load_latest` found usable: its entry, tensors and state, and the manifest."""

    entry: CheckpointEntry
    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    manifest: Manifest

    @property
    def tensor_path_name(self) -> str:
        return self.entry.file_names[0]


def load_latest(out_dir: str | os.PathLike) -> LoadedCheckpoint | None:
    """Load the newest checkpoint of ``out_dir`` that verifies (see the module docstring); ``None`` when there is no
    manifest. A damaged checkpoint is skipped with a ``WARNING`` naming its file and what is wrong.

    Raises:
        CheckpointError: the manifest is unreadable, or no listed checkpoint verifies (names each file's problem).
    """
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    if manifest is None:
        return None
    failures: list[str] = []
    entries = list(reversed(manifest.checkpoints))
    for i, entry in enumerate(entries):
        problems = entry_problems(out_dir, entry)
        if not problems:
            try:
                tensors, state = _read_files(out_dir, entry)
            except CheckpointError as exc:
                problems = [str(exc)]
            else:
                return LoadedCheckpoint(entry, tensors, state, manifest)
        failures.append(f"step {entry.step}: {'; '.join(problems)}")
        then = (
            f"falling back to the checkpoint of step {entries[i + 1].step}"
            if i + 1 < len(entries)
            else "no older checkpoint is kept"
        )
        logger.warning("checkpoint of step %d is damaged: %s; %s", entry.step, "; ".join(problems), then)
    raise CheckpointError(
        f"no checkpoint in {out_dir} can be used ({' | '.join(failures)}): start the run again "
        f"with {option_wording('--overwrite', 'overwrite=True')}, or into another folder"
    )


def latest_valid_step(out_dir: str | os.PathLike) -> int | None:
    """The step of the newest checkpoint of ``out_dir`` that verifies, or ``None`` (no manifest, an unreadable one, or
    no checkpoint verifies). Logs nothing."""
    out_dir = Path(out_dir)
    try:
        manifest = read_manifest(out_dir)
    except CheckpointError:
        return None
    if manifest is None:
        return None
    for entry in reversed(manifest.checkpoints):
        if entry_problems(out_dir, entry):
            continue
        if entry.files is None:  # first format: nothing recorded, so see whether the files load
            try:
                _read_files(out_dir, entry)
            except CheckpointError:
                continue
        return entry.step
    return None


# ---------------------------------------------------------------------------------------------- the run's files
def run_files(out_dir: str | os.PathLike) -> list[Path]:
    """The files and folders of a training run present in ``out_dir`` (:data:`RUN_FILE_NAMES` and ``ckpt-*``), sorted
    by name; temporaries of interrupted writes are not counted. Empty for a missing folder."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    return sorted(
        (p for p in out_dir.iterdir() if p.name in RUN_FILE_NAMES or _CKPT_RE.match(p.name)), key=lambda p: p.name
    )


def remove_run_files(out_dir: str | os.PathLike) -> list[Path]:
    """Delete a run's own files from ``out_dir`` — ``ckpt-*``, ``checkpoint.json``, ``metrics.jsonl``,
    ``learning_curve.png``, ``train_config.json``, ``model/``, ``best/`` and the temporaries of their interrupted
    writes — and nothing else. Returns what was removed."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    removed = []
    for path in run_files(out_dir) + sorted(p for p in out_dir.iterdir() if _TMP_RE.match(p.name)):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed
