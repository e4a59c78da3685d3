"""A training run's folder and every file the run writes into it — the side effects that only the main process
(rank 0) has: ``train_config.json``, ``metrics.jsonl``, checkpoints, ``best/``, ``model/``, ``learning_curve.png``.

:class:`RunFolder` with ``writer=False`` (the other processes) does nothing, so the trainer calls the same methods on
every process. Layout (see also :mod:`elmokit.pretraining.checkpoint`)::

    train_config.json   the TrainConfig (resume checks it)
    metrics.jsonl       one JSON object per line: training records ({"kind": "train", "step", "loss",
                        "train_ppl_fwd", "train_ppl_bwd", "train_ppl", "tokens_per_s", "lr"}, every log_every steps) and
                        held-out records ({"kind": "valid", "step", "valid_ppl_fwd", "valid_ppl_bwd", "valid_ppl",
                        "valid_tokens", "valid_sentences", "best"})
    checkpoint.json + ckpt-<step>.safetensors + ckpt-<step>.state.pt   the kept checkpoints
    best/               with held-out text: the model (as model/) of the step with the lowest held-out average
                        perplexity so far, and best.json ({"step", "valid_ppl", ...}); replaced as a whole (written
                        beside it, then renamed), never pruned
    model/              the final model: config.json, model.safetensors (biLM + softmax), vocab.txt [, chars.txt]
    learning_curve.png  training perplexity per logged step and, with held-out text, held-out perplexity
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elmokit.errors import MissingExtraError, UsageError, import_optional
from elmokit.io import atomic_path, atomic_write_text
from elmokit.pretraining import checkpoint as ckpt

__all__ = ["RunFolder", "plot_learning_curve", "check_outside_patterns", "run_files", "BEST_DIR", "BEST_RECORD"]

logger = logging.getLogger(__name__)

BEST_DIR = "best"
BEST_RECORD = "best.json"


class RunFolder:
    """The files of the run in ``out_dir``; every method does nothing unless ``writer`` (the main process)."""

    def __init__(self, out_dir: str | os.PathLike, writer: bool = True) -> None:
        self.path = Path(out_dir)
        self.writer = writer
        self._metrics = None

    # ------------------------------------------------------------------ the folder
    def check_is_folder(self) -> None:
        """Raises UsageError when ``out_dir`` is a file."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"the output folder {self.path} is a file: give a folder path (--out-dir)")

    def make(self) -> None:
        if self.writer:
            self.path.mkdir(parents=True, exist_ok=True)

    def remove_run(self) -> list[Path]:
        """Delete the run's own files (``--overwrite``); returns what was removed."""
        return ckpt.remove_run_files(self.path) if self.writer else []

    def write_config(self, text: str) -> None:
        if self.writer:
            atomic_write_text(self.path / "train_config.json", text)

    # ------------------------------------------------------------------ metrics
    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def delete_metrics(self) -> None:
        if self.writer:
            self.metrics_path.unlink(missing_ok=True)

    def open_metrics(self) -> None:
        if self.writer and self._metrics is None:
            self._metrics = open(self.metrics_path, "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        """Append one record to ``metrics.jsonl`` (flushed at once)."""
        if self._metrics is not None:
            self._metrics.write(json.dumps(record) + "\n")
            self._metrics.flush()

    def close_metrics(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def truncate_metrics(self, step: int) -> None:
        """Keep the records of steps <= ``step`` (a line cut by a kill, not valid JSON, is dropped too)."""
        path = self.metrics_path
        if not self.writer or not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                logger.warning("%s: dropping an unreadable line %r (cut by a kill?)", path, line[:80])
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    # ------------------------------------------------------------------ models
    def save_best(self, save: Callable[[Path], Any], record: dict[str, Any]) -> Path | None:
        """Replace ``best/`` by the model ``save(folder)`` writes plus ``best.json`` (``record``): written into a
        temporary folder beside it, which then takes its place (the old one is moved aside first and deleted after),
        so an interrupted write leaves the previous best model."""
        if not self.writer:
            return None
        target = self.path / BEST_DIR
        tmp = Path(tempfile.mkdtemp(prefix=f".{BEST_DIR}.", suffix=".tmp", dir=self.path))
        try:
            save(tmp)
            atomic_write_text(tmp / BEST_RECORD, json.dumps(record, indent=2) + "\n")
            old = None
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{BEST_DIR}.old.", suffix=".tmp", dir=self.path))
                os.replace(target, old / BEST_DIR)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def read_best(self) -> dict[str, Any] | None:
        """``best/best.json``, or ``None`` (missing or unreadable)."""
        try:
            return json.loads((self.path / BEST_DIR / BEST_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def plot(self) -> Path | None:
        return plot_learning_curve(self.metrics_path, self.path / "learning_curve.png") if self.writer else None


# ---------------------------------------------------------------------------------------------- patterns
#: Files a run writes (relative to its folder), for :func:`check_outside_patterns`.
_RUN_WRITES = (
    "train_config.json",
    "checkpoint.json",
    "metrics.jsonl",
    "learning_curve.png",
    "ckpt-1.safetensors",
    "ckpt-1.state.pt",
    "model/config.json",
    "model/model.safetensors",
    "model/vocab.txt",
    "model/chars.txt",
    f"{BEST_DIR}/{BEST_RECORD}",
    f"{BEST_DIR}/model.safetensors",
    f"{BEST_DIR}/vocab.txt",
)
_MAGIC = re.compile(r"[*?[]")


def run_files(out_dir: str | os.PathLike) -> list[Path]:
    """The files a run writes in ``out_dir`` (its checkpoints by their first name): what no input may be."""
    return [Path(out_dir) / name for name in _RUN_WRITES]


def _glob_matches(pattern: list[str], path: list[str]) -> bool:
    """Whether ``glob.glob(pattern, recursive=True)`` would yield ``path`` (both split into components): ``**`` is any
    number of components, a component with ``*``, ``?`` or ``[`` is matched by :func:`fnmatch.fnmatchcase`, and a
    name starting with ``.`` is matched only by a component that starts with ``.`` (glob skips hidden names)."""
    if not pattern:
        return not path
    head = pattern[0]
    if head == "**":
        if _glob_matches(pattern[1:], path):
            return True
        return bool(path) and not path[0].startswith(".") and _glob_matches(pattern, path[1:])
    if not path:
        return False
    if _MAGIC.search(head):
        ok = fnmatch.fnmatchcase(path[0], head) and (head.startswith(".") or not path[0].startswith("."))
    else:
        ok = path[0] == head
    return ok and _glob_matches(pattern[1:], path[1:])


def check_outside_patterns(out_dir: str | os.PathLike, patterns: Sequence[str | os.PathLike], what: str) -> None:
    """Refuse a run folder whose files a training or held-out pattern would match (``train 'corp/*' --out-dir corp``
    would read its own checkpoints as text on ``--resume``). Patterns are compared as absolute paths, as
    ``glob.glob(recursive=True)`` reads them, with every file a run writes (:data:`_RUN_WRITES`).

    Raises:
        UsageError: names the folder, the pattern, ``what`` (e.g. ``"training pattern"``) and a file it would match.
    """
    folders = {os.path.abspath(out_dir), os.path.realpath(out_dir)}
    for pattern in patterns:
        text = os.path.abspath(os.path.expanduser(os.fspath(pattern)))
        parts = [c for c in text.split(os.sep) if c]
        # glob follows symlinks: compare the pattern's literal leading folders resolved too ('lnk/*' with lnk -> corp)
        literal = next((i for i, c in enumerate(parts) if _MAGIC.search(c)), len(parts))
        resolved = [c for c in os.path.realpath(os.sep + os.sep.join(parts[:literal])).split(os.sep) if c]
        for pattern_parts, folder in itertools.product((parts, resolved + parts[literal:]), sorted(folders)):
            for name in _RUN_WRITES:
                candidate = os.path.join(folder, name)
                if _glob_matches(pattern_parts, [c for c in candidate.split(os.sep) if c]):
                    raise UsageError(
                        f"the {what} {os.fspath(pattern)!r} would match the files of the run folder {out_dir} (e.g. "
                        f"{Path(out_dir) / name}), which would then be read as text: put the run folder (--out-dir) "
                        "outside the corpus folder, or narrow the pattern"
                    )


def _read_records(metrics_path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in metrics_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def plot_learning_curve(metrics_path: Path, out_png: Path) -> Path | None:
    """The learning curve from ``metrics.jsonl`` → PNG (atomic): training perplexity (forward, backward, average) per
    logged step as lines and, where held-out records exist, held-out perplexity (full softmax) as dashed lines with
    markers in the same colours; log scale. ``None`` if nothing was logged, or when matplotlib is not installed (the
    plot is optional: one warning says so and names ``pip install 'elmokit[plots]'``)."""
    if not metrics_path.is_file():
        return None
    rows = _read_records(metrics_path)
    train = [r for r in rows if r.get("kind", "train") == "train" and "train_ppl" in r]
    valid = [r for r in rows if r.get("kind") == "valid"]
    if not train and not valid:
        return None
    try:  # optional: matplotlib ([plots]);: without it the run goes on without its curve
        matplotlib = import_optional("matplotlib", "plots", "the learning curve")
    except MissingExtraError as exc:
        logger.warning("%s not drawn: %s is not installed (%s draws it)", out_png.name, exc.package, exc.hint)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colours = {"forward": "tab:blue", "backward": "tab:orange", "average": "tab:green"}
    for suffix, name in (("_fwd", "forward"), ("_bwd", "backward"), ("", "average")):
        if train:
            ax.plot(
                [r["step"] for r in train],
                [r["train_ppl" + suffix] for r in train],
                color=colours[name],
                label=f"training, {name}",
                linewidth=1.2,
            )
        if valid:
            ax.plot(
                [r["step"] for r in valid],
                [r["valid_ppl" + suffix] for r in valid],
                color=colours[name],
                linestyle="--",
                marker="o",
                markersize=3,
                label=f"held-out, {name}",
            )
    best = [r for r in valid if r.get("best")]
    if best:
        b = min(best, key=lambda r: r["valid_ppl"])
        ax.plot(
            [b["step"]],
            [b["valid_ppl"]],
            marker="*",
            markersize=12,
            color="black",
            linestyle="none",
            label=f"best held-out: {b['valid_ppl']:.1f} at step {b['step']}",
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity")
    ax.set_title(
        "training: per logged batch, with dropout, sampled softmax if used; held-out: full softmax", fontsize=8
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out_png, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out_png
