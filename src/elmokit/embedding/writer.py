"""Embedding a text file of any size: streamed, written in atomic parts, resumable, on several worker processes.

What :meth:`elmokit.Embedder.embed_file` and ``elmokit embed`` run. Memory stays constant in the file's size: the input
is read one part (``part_size`` lines) at a time, each batch's arrays are written as soon as they are computed, and no
map over the whole file is kept (except for the AllenNLP layout's ``sentence_to_index``, built at the end).

**The work folder.** Lines are cut into parts of ``part_size`` lines (part k = lines ``k*part_size + 1`` …). Each part
is written to ``part-<k>.hdf5`` under a temporary name and renamed when complete (:func:`elmokit.io.atomic_path`),
so a part file either is complete or does not exist; ``index.json`` records the settings, the input's size and
BLAKE2b digest and the model's fingerprint. The folder is the output itself for ``format="parts"``, and
``<output>.parts`` beside the output for the single-file formats, merged into the output (atomically) and deleted
at the end. An interrupted run (Ctrl-C, SIGTERM, kill -9) leaves the finished parts; ``resume=True`` checks that
nothing changed and embeds the missing parts only, with the same batches, so the result is the same file.

**A part file** holds one dataset per line of the part, named by its global dataset number (``"i"`` = line i+1) or,
with ``use_sentence_keys``, by :func:`sentence_key` of the line; and (numbered, unless ``forget_sentences``) a
``"sentences"`` string dataset, the part's stripped lines in order. Attributes ``first`` (dataset number of its first
line) and ``count``.

**Formats** (the final output): ``"allennlp"`` — one HDF5 file, datasets ``"i"`` + the JSON ``"sentence_to_index"``
(AllenNLP's ``elmo`` command); ``"hdf5"`` — one HDF5 file, datasets ``"i"`` + a ``"sentences"`` string dataset (entry i
= line i+1) + ``"skipped_lines"`` (when lines were skipped), root attributes ``elmokit_format``, ``lines`` and the
output settings; ``"parts"`` — the work folder itself, ``index.json`` with ``"complete": true`` and the part list.
:func:`open_embeddings` reads all three.

**Several processes, several machines** (``torchrun --nproc-per-node N [--nnodes M …] -m elmokit embed …``): process 0
prepares (or, with ``--resume``, checks) the work folder, every process embeds parts ``k`` with ``k % WORLD_SIZE ==
RANK`` (each may have its own ``workers``), and process 0 merges once all parts are written — the same file as one
process writes (parts are the same whoever writes them). The output folder must be one that every process sees (one
machine, or a shared file system); the processes meet in a gloo group at two barriers only.

Modules: the input scan and part reading are :mod:`elmokit.embedding.input_scan`, the worker processes
:mod:`elmokit.embedding.workers`, the torchrun processes :mod:`elmokit.pretraining.distributed` (one
:class:`~elmokit.pretraining.distributed.DistContext` for every torchrun use of elmokit).

Test hook: ``_probe`` (below), set by a test in the process that writes the parts (``tests/run_hooks.py`` sets it for
an ``elmokit embed`` subprocess); nothing reads the environment for it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmokit import interrupts
from elmokit.checks import positive_int
from elmokit.data.text_checks import check_tokenisation
from elmokit.data.tokenizers import TOKENIZERS, word_tokenizer
from elmokit.embedding.input_scan import InputScan, read_part, scan_input
from elmokit.embedding.reader import (
    FORMATS,
    INDEX_NAME,
    LAYOUT_NAME,
    LAYOUT_VERSION,
    WRITER_ATTR,
    check_embeddings_output,
    part_name,
    sentence_key,
    work_folder,
)
from elmokit.embedding.workers import UNGUARDED_EXIT, run_workers, spawn_bootstrapping
from elmokit.errors import EmbedWorkerError, MissingFileError, UsageError, option_wording
from elmokit.io import LOCK_NAME, atomic_path, atomic_write_text, check_not_an_input, check_writable_place, lock_folder
from elmokit.pretraining import distributed
from elmokit.pretraining.distributed import init_from_env
from elmokit.weights.fingerprint import bilm_fingerprint

__all__ = ["EmbedJob", "EmbedWorkerError", "scan_input", "model_fingerprint", "torchrun_rank"]

logger = logging.getLogger(__name__)

DECODE_MODES = ("strict", "replace", "ignore", "skip")
_PART_RE = re.compile(r"^part-(\d{6,})\.hdf5$")
_TMP_RE = re.compile(r"^\.(part-\d{6,}\.hdf5|index\.json)\..+\.tmp$")
#: The barrier after the parts waits for the slowest process's parts (torchrun stops the others when one fails).
BARRIER_TIMEOUT = datetime.timedelta(days=1)

#: Test/diagnostic hook: when set, called as ``_probe(event, **info)`` — ``"part_read"`` (``part``, ``held``: lines
#: read into memory), ``"batch"`` (``part``, ``held``: arrays alive), ``"part_written"`` (``part``: fully written
#: under its temporary name, not renamed yet), ``"part_done"`` (``part``: renamed). Unset in normal use; it is not
#: passed to worker processes (``workers`` > 1).
_probe: Callable[..., None] | None = None


def _notify(event: str, **info: Any) -> None:
    """Tell :data:`_probe` (when set) that ``event`` happened."""
    if _probe is not None:
        _probe(event, **info)


#: settings ``index.json`` holds only when not these defaults (folders written before the setting existed resume)
_SETTING_DEFAULTS = {"precision": "fp32"}


def model_fingerprint(bilm) -> str:
    """The biLM fingerprint (:func:`elmokit.weights.fingerprint.bilm_fingerprint`: configuration, character
    vocabulary and weights), compared on resume."""
    return bilm_fingerprint(bilm)


def torchrun_rank() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) of this ``elmokit embed`` process under torchrun; (0, 1) without it
    (:func:`elmokit.pretraining.distributed.torchrun_rank`).

    Raises:
        UsageError: WORLD_SIZE > 1 without a usable RANK (not started by torchrun)."""
    return distributed.torchrun_rank("embed")


# ---------------------------------------------------------------------------------------------- one part
@dataclass
class PartWriter:
    """Everything needed to write any part of one run (picklable: sent to worker processes)."""

    folder: Path
    scan: InputScan
    spec: Any  # OutputSpec
    batch_size: int
    tokenizer: str
    decode_errors: str
    use_sentence_keys: bool
    forget_sentences: bool

    def write(
        self, embedder, k: int, progress: Callable[[int], None] | None = None, alive: Callable[[], bool] | None = None
    ) -> None:
        """Embed part ``k`` and finalise ``part-<k>.hdf5`` atomically (fsynced before the rename)."""
        import h5py  # lazy: CLI start-up (the CLI imports this module to build its parser)

        tokenize = word_tokenizer(self.tokenizer)
        lines = read_part(self.scan, k, self.decode_errors)
        _notify("part_read", part=k, held=len(lines))
        first = k * self.scan.part_size
        names: list[str | None] = []
        seen: set[str] = set()
        for i, text in enumerate(lines):
            if not self.use_sentence_keys:
                names.append(str(first + i))
                continue
            key = sentence_key(text) if text is not None else None
            names.append(key if key is not None and key not in seen else None)
            if key is not None:
                seen.add(key)
        tokens = [tokenize(text) if text is not None and name is not None else [] for text, name in zip(lines, names)]
        l1, d = embedder.num_layers, embedder.output_dim
        empty = self.spec.empty(l1, d)
        # sentences that need the model: every named line, except undecodable (skipped) ones and, without the
        # boundaries, empty ones (a zero-length array / zero vector)
        todo = [
            i
            for i, (text, name) in enumerate(zip(lines, names))
            if name is not None and text is not None and (tokens[i] or self.spec.keep_sentence_boundaries)
        ]
        final = self.folder / part_name(k)
        with atomic_path(final) as tmp:
            with h5py.File(tmp, "w") as h5:
                h5.attrs["first"] = first
                h5.attrs["count"] = len(lines)
                needed = set(todo)
                for i, name in enumerate(names):
                    if name is not None and i not in needed:
                        h5.create_dataset(name, data=empty)
                for idx in embedder._batches([len(tokens[i]) for i in todo], self.batch_size):
                    interrupts.check()
                    if alive is not None and not alive():
                        raise KeyboardInterrupt
                    rows = [todo[j] for j in idx]
                    arrays = embedder._forward([tokens[i] for i in rows], self.spec)
                    _notify("batch", part=k, held=len(arrays))
                    for i, arr in zip(rows, arrays):
                        h5.create_dataset(names[i], data=arr)
                    del arrays
                    if progress is not None:
                        progress(len(rows))
                if not self.use_sentence_keys and not self.forget_sentences:
                    texts = ["" if t is None else t.strip() for t in lines]
                    h5.create_dataset("sentences", data=np.array(texts, dtype=object), dtype=h5py.string_dtype())
                if progress is not None:
                    progress(len(lines) - len(todo))
            _notify("part_written", part=k)
            _fsync(tmp)
        _notify("part_done", part=k)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------- the job
class EmbedJob:
    """One ``embed_file`` run; see :meth:`elmokit.Embedder.embed_file` for the arguments and errors."""

    def __init__(
        self,
        embedder,
        input_path,
        output_path,
        *,
        layers="all",
        batch_size=None,
        progress=True,
        decode_errors="strict",
        format="allennlp",
        pool="none",
        keep_sentence_boundaries=False,
        dtype="float32",
        use_sentence_keys=False,
        forget_sentences=False,
        tokenizer="whitespace",
        resume=False,
        workers=1,
        worker_threads=1,
        part_size=10000,
        model_name=None,
        overwrite=False,
    ) -> None:
        if spawn_bootstrapping():
            # a worker importing an unguarded script reached embed_file again: stop before touching any file; the
            # parent sees this exit status and names the missing guard (one message instead of a traceback here)
            raise SystemExit(UNGUARDED_EXIT)
        self.embedder = embedder
        self.spec = embedder.output_spec(layers, pool, keep_sentence_boundaries, dtype)
        if decode_errors not in DECODE_MODES:
            raise UsageError(f"decode_errors must be one of {DECODE_MODES}, got {decode_errors!r}")
        if format not in FORMATS:
            raise UsageError(f"format must be one of {FORMATS}, got {format!r}")
        if tokenizer not in TOKENIZERS:
            raise UsageError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
        self.batch_size = embedder.batch_size if batch_size is None else positive_int("batch_size", batch_size)
        self.workers = positive_int("workers", workers)
        self.worker_threads = positive_int("worker_threads", worker_threads)
        self.part_size = positive_int("part_size", part_size)
        for name, value in (
            ("use_sentence_keys", use_sentence_keys),
            ("forget_sentences", forget_sentences),
            ("resume", resume),
            ("progress", progress),
            ("overwrite", overwrite),
        ):
            if not isinstance(value, bool):
                raise UsageError(f"{name} must be True or False, got {value!r}")
        self.decode_errors, self.format, self.tokenizer = decode_errors, format, tokenizer
        self.use_sentence_keys, self.forget_sentences = use_sentence_keys, forget_sentences
        self.resume, self.progress, self.model_name = resume, progress, model_name
        self.overwrite = overwrite
        self.input_path, self.output_path = Path(input_path), Path(output_path)
        self.folder = work_folder(self.output_path, format)
        self.skipped_lines: list[int] = []
        self._check_paths()

    # -------------------------------------------------------------------- checks
    def _check_paths(self) -> None:
        inp, out = self.input_path, self.output_path
        if inp.is_dir():
            raise MissingFileError(f"input {inp} is a folder; expected a text file, one sentence per line")
        if not inp.is_file():
            raise MissingFileError(f"input file {inp}: no such file")
        check_not_an_input(out, {"input file": inp}, "the output")
        if self.format == "parts":
            if out.exists() and not out.is_dir():
                raise UsageError(f"the output {out} is a file; format 'parts' writes a folder (give a folder path)")
            if not out.exists():  # (an existing folder is probed by taking its lock: a probe file there could race)
                check_writable_place(out, "the output")
        else:
            if out.is_dir():
                raise UsageError(f"the output {out} is a folder; give the HDF5 file to write")
            flag = option_wording("--overwrite", "overwrite=True")
            check_embeddings_output(out, {"input file": inp}, self.overwrite, flag, create_folder=True)
            if self.folder.exists() and not self.folder.is_dir():
                raise UsageError(f"{self.folder} is a file: it is where the parts of {out} go; move it away")
        if self.folder.resolve() == inp.resolve().parent:
            raise UsageError(f"the output folder {self.folder} is the input's folder: choose a new folder")

    def settings(self) -> dict:
        """What a resumed run must share with the interrupted one (batch size and workers may differ)."""
        return {
            "format": self.format,
            **self.spec.settings(),
            "tokenizer": self.tokenizer,
            "use_sentence_keys": self.use_sentence_keys,
            "forget_sentences": self.forget_sentences,
            "decode_errors": self.decode_errors,
            "part_size": self.part_size,
            "cache": self.embedder.token_cache is not None,
            **({"precision": self.embedder.precision} if self.embedder.precision != "fp32" else {}),
        }

    # -------------------------------------------------------------------- the work folder
    def _ours(self, name: str) -> bool:
        return name in (INDEX_NAME, LOCK_NAME) or bool(_PART_RE.match(name) or _TMP_RE.match(name))

    def _clear_folder(self) -> None:
        """Delete the run's files from the work folder (not the writer lock it holds)."""
        for p in self.folder.iterdir():
            if p.name != LOCK_NAME:
                p.unlink()

    def _prepare_folder(self, scan: InputScan, fingerprint: str) -> set[int]:
        """Create or check the work folder; return the part numbers already finished."""
        folder = self.folder
        index_path = folder / INDEX_NAME
        wanted = {
            "layout": LAYOUT_NAME,
            "version": LAYOUT_VERSION,
            "complete": False,
            "settings": self.settings(),
            "input": {"path": str(self.input_path), "size": scan.size, "lines": scan.lines, "blake2b": scan.digest},
            "model": {"name": self.model_name, "fingerprint": fingerprint},
            "parts": scan.parts,
        }
        existing = None
        if folder.is_dir():
            foreign = sorted(p.name for p in folder.iterdir() if not self._ours(p.name))
            if foreign:
                raise UsageError(
                    f"{folder} exists and is not an elmokit parts folder (it holds {foreign[:5]}): "
                    "choose another output or move it away"
                )
            if index_path.is_file():
                try:
                    existing = json.loads(index_path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    existing = None
        if existing is not None and self.format == "parts" and existing.get("complete") and not self.resume:
            if not self.overwrite:
                raise UsageError(
                    f"the output {folder} already holds finished embeddings: pass "
                    f"{option_wording('--overwrite', 'overwrite=True')} to replace them, or choose "
                    "another output folder"
                )
            self._clear_folder()  # replaced, as asked
            existing = None
        if existing is not None and not self.resume:
            if not self.overwrite:
                raise UsageError(
                    f"{folder} holds the parts of an interrupted run: rerun with "
                    f"{option_wording('--resume', 'resume=True')} to continue it, or with "
                    f"{option_wording('--overwrite', 'overwrite=True')} to start again"
                )
            self._clear_folder()
            existing = None
        done: set[int] = set()
        if existing is not None:
            self._check_resumable(existing, wanted)
            for p in folder.iterdir():
                if _TMP_RE.match(p.name):
                    p.unlink()  # a part being written when the run was killed
            for p in folder.iterdir():
                m = _PART_RE.match(p.name)
                if m and int(m.group(1)) < scan.parts and self._part_ok(p, int(m.group(1)), scan):
                    done.add(int(m.group(1)))
            logger.info("resuming %s: %d of %d parts already done", folder, len(done), scan.parts)
        else:
            if self.resume:
                logger.info("nothing to resume in %s: starting from the beginning", folder)
            self._clear_folder()  # the folder exists: it holds the writer lock
        with interrupts.deferred():  # a new folder gets its index whole: never an empty parts folder left by Ctrl-C
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(index_path, json.dumps(wanted, indent=1, ensure_ascii=False))
        return done

    def _check_resumable(self, existing: dict, wanted: dict) -> None:
        if existing.get("layout") != LAYOUT_NAME or existing.get("version") != LAYOUT_VERSION:
            raise UsageError(
                f"{self.folder / INDEX_NAME} is not an elmokit {LAYOUT_NAME} v{LAYOUT_VERSION} index: "
                "cannot resume from it"
            )
        before, now = existing.get("settings", {}), wanted["settings"]
        keys = list(now) + [k for k in before if k not in now]  # a setting written only when not its default, too
        was = {k: before.get(k, _SETTING_DEFAULTS.get(k)) for k in keys}
        new = {k: now.get(k, _SETTING_DEFAULTS.get(k)) for k in keys}
        changed = [f"{k} (was {was[k]!r}, now {new[k]!r})" for k in keys if was[k] != new[k]]
        if changed:
            raise UsageError(
                f"cannot resume {self.folder}: changed {', '.join(changed)}; use the interrupted run's "
                "settings, or delete the folder to start again"
            )
        old_in, new_in = existing.get("input", {}), wanted["input"]
        if (old_in.get("size"), old_in.get("blake2b")) != (new_in["size"], new_in["blake2b"]):
            raise UsageError(
                f"cannot resume {self.folder}: the input {self.input_path} is not the file the "
                f"interrupted run read ({old_in.get('lines')} lines, {old_in.get('size')} bytes then; "
                f"{new_in['lines']} lines, {new_in['size']} bytes now, or different bytes)"
            )
        if existing.get("model", {}).get("fingerprint") != wanted["model"]["fingerprint"]:
            raise UsageError(
                f"cannot resume {self.folder}: it was written with another model "
                f"({existing.get('model', {}).get('name') or 'fingerprint differs'})"
            )

    def _drop_if_no_part(self) -> None:
        """Delete the work folder when it holds no finished part (only ``index.json`` and temporary files): after a
        failed run it would otherwise block a plain rerun; ``--resume`` without a folder starts afresh."""
        with contextlib.suppress(OSError):
            if self.folder.is_dir() and not any(_PART_RE.match(p.name) for p in self.folder.iterdir()):
                shutil.rmtree(self.folder)

    @staticmethod
    def _part_ok(path: Path, k: int, scan: InputScan) -> bool:
        import h5py  # lazy: CLI start-up (the CLI imports this module to build its parser)

        try:
            with h5py.File(path, "r") as h5:
                return int(h5.attrs["first"]) == k * scan.part_size and int(h5.attrs["count"]) == scan.part_lines(k)
        except (OSError, KeyError, ValueError):
            logger.warning("%s is unreadable: it is written again", path)
            return False

    # -------------------------------------------------------------------- run
    def run(self) -> int:
        """Embed every missing part, then finalise (merge or index). Returns the number of lines.

        Process 0 holds the work folder's writer lock (:func:`elmokit.io.lock_folder`) from before it looks at the
        folder to the end, so a second run into the same output is refused (:class:`~elmokit.errors.FolderInUseError`,
        naming this process) instead of mixing or deleting this run's parts."""
        self._lock = None
        try:
            return self._run()
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _lock_and_prepare(self, scan: InputScan, fingerprint: str) -> set[int]:
        self._lock = lock_folder(self.folder, "parts folder")  # creates the folder when missing
        return self._prepare_folder(scan, fingerprint)

    def _run(self) -> int:
        """:meth:`run`'s steps: scan the input, join the torchrun processes (when there are several), process 0
        prepares (or checks, for ``resume``) the work folder, every process writes its parts (every world-th), wait
        for all, process 0 finalises (merge or index). Returns the number of lines."""
        scan = self._scan()
        dist = init_from_env("cpu", command="embed", timeout=BARRIER_TIMEOUT)
        rank, world = dist.rank, dist.world_size
        if rank == 0:
            self._check_tokenisation(scan)
        fingerprint = model_fingerprint(self.embedder.bilm)
        done = dist.on_main(lambda: self._lock_and_prepare(scan, fingerprint)) or set()
        if rank != 0:
            done = self._parts_done(scan)
        todo = [k for k in range(scan.parts) if k not in done and k % world == rank]
        try:
            self._write_parts(scan, done, todo)
        except Exception:
            if world == 1:
                self._drop_if_no_part()  # a failure before any part was finished leaves nothing to resume
            raise
        dist.barrier()  # every part is written
        dist.close()
        if rank != 0:
            logger.info("process %d of %d wrote its %d part(s) to %s", rank, world, len(todo), self.folder)
            return scan.lines
        self._finalise(scan)
        logger.info("wrote %d sentences to %s", scan.lines, self.output_path)
        return scan.lines

    def _scan(self) -> InputScan:
        """Scan the input (:func:`~elmokit.embedding.input_scan.scan_input`); warn about skipped lines."""
        scan = scan_input(self.input_path, self.decode_errors, self.part_size)
        self.skipped_lines = scan.skipped
        if scan.skipped:
            shown = ", ".join(map(str, scan.skipped[:10])) + (" ..." if len(scan.skipped) > 10 else "")
            logger.warning(
                "%s: skipped %d line(s) that are not valid UTF-8 (line %s); their datasets are empty",
                self.input_path,
                len(scan.skipped),
                shown,
            )
        return scan

    def _parts_done(self, scan: InputScan) -> set[int]:
        """The parts already finished in the work folder (a process other than 0, once process 0 has prepared it)."""
        return {
            k
            for k in range(scan.parts)
            if (self.folder / part_name(k)).is_file() and self._part_ok(self.folder / part_name(k), k, scan)
        }

    def _write_parts(self, scan: InputScan, done: set[int], todo: list[int]) -> None:
        """Write the parts ``todo`` here (one worker, or one part) or with worker processes, with a progress bar over
        the whole input (the ``done`` parts counted as finished)."""
        from tqdm.auto import tqdm  # lazy: CLI start-up (the CLI imports this module to build its parser)

        writer = PartWriter(
            self.folder,
            scan,
            self.spec,
            self.batch_size,
            self.tokenizer,
            self.decode_errors,
            self.use_sentence_keys,
            self.forget_sentences,
        )
        finished = sum(scan.part_lines(k) for k in done)
        with tqdm(
            total=scan.lines, initial=finished, unit="sent", disable=not self.progress, desc="embedding", smoothing=0.05
        ) as bar:
            if self.workers == 1 or len(todo) <= 1:
                for k in todo:
                    writer.write(self.embedder, k, progress=bar.update)
            else:
                run_workers(
                    self.embedder, writer, todo, bar.update, workers=self.workers, worker_threads=self.worker_threads
                )

    #: How many lines from the start of the input :meth:`_check_tokenisation` looks at.
    CHECK_LINES = 2000

    def _check_tokenisation(self, scan: InputScan) -> None:
        """Warn (logging) when the first :attr:`CHECK_LINES` lines look untokenised for the model
        (:func:`elmokit.data.text_checks.check_tokenisation`): e.g. raw Chinese without ``--tokenizer jieba``."""
        if not scan.lines:
            return
        tokenize = word_tokenizer(self.tokenizer)
        lines = read_part(scan, 0, self.decode_errors)[: self.CHECK_LINES]
        check = check_tokenisation(
            ((i + 1, tokenize(t)) for i, t in enumerate(lines) if t is not None),
            self.embedder.bilm.config,
            self.tokenizer,
        )
        warning = check.warning(lambda name: option_wording(f"--tokenizer {name}", f"tokenizer={name!r}"))
        if warning:
            logger.warning("%s: %s", self.input_path, warning)

    # -------------------------------------------------------------------- finalise
    def _finalise(self, scan: InputScan) -> None:
        index_path = self.folder / INDEX_NAME
        index = json.loads(index_path.read_text(encoding="utf-8"))
        with interrupts.deferred():
            if self.format == "parts":
                index.update(
                    complete=True,
                    lines=scan.lines,
                    skipped_lines=scan.skipped,
                    part_files=[part_name(k) for k in range(scan.parts)],
                    keys="sentence" if self.use_sentence_keys else "line",
                )
                atomic_write_text(index_path, json.dumps(index, indent=1, ensure_ascii=False))
                return
        self._merge(scan)  # interruptible: the output appears atomically, the parts stay until it has
        with interrupts.deferred():  # the output is complete: its parts folder goes whole, never half-deleted
            shutil.rmtree(self.folder)

    def _merge(self, scan: InputScan) -> None:
        import h5py  # lazy: CLI start-up (the CLI imports this module to build its parser)

        skipped = set(scan.skipped)
        numbered = not self.use_sentence_keys
        sentence_to_index: dict[str, str] = {}
        with atomic_path(self.output_path, suffix=".hdf5") as tmp, h5py.File(tmp, "w") as out:
            out.attrs[WRITER_ATTR] = "elmokit"  # recognised by is_elmokit_embeddings: what overwrite may replace
            out.attrs["keys"] = "line" if numbered else "sentence"
            if self.format == "hdf5":
                out.attrs["elmokit_format"] = f"{LAYOUT_NAME}-hdf5-v{LAYOUT_VERSION}"
                out.attrs["lines"] = scan.lines
                for k, v in self.spec.settings().items():
                    out.attrs[k] = v
                if self.embedder.precision != "fp32":
                    out.attrs["precision"] = self.embedder.precision
                if numbered and not self.forget_sentences:
                    sentences = out.create_dataset("sentences", shape=(scan.lines,), dtype=h5py.string_dtype())
                if scan.skipped and numbered:
                    out.create_dataset("skipped_lines", data=np.array(scan.skipped, dtype=np.int64))
            for k in range(scan.parts):
                interrupts.check()
                with h5py.File(self.folder / part_name(k), "r") as src:
                    first = int(src.attrs["first"])
                    for name in src:
                        if name == "sentences" and numbered:
                            continue
                        if not numbered and name in out:
                            continue  # a repeated line: written once (the first), its vectors are the same
                        src.copy(src[name], out, name=name)
                    if numbered and not self.forget_sentences:
                        texts = src["sentences"].asstr()[()]
                        if self.format == "hdf5":
                            sentences[first : first + len(texts)] = texts
                        else:
                            for i, text in enumerate(texts):
                                if first + i + 1 not in skipped:
                                    sentence_to_index[text] = str(first + i)  # the last of repeated lines wins
            if self.format == "allennlp" and numbered and not self.forget_sentences:
                out.create_dataset(
                    "sentence_to_index", data=np.array([json.dumps(sentence_to_index)], dtype=h5py.string_dtype())
                )
