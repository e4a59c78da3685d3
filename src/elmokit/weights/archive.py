"""Model archives: a ``.zip`` holding one model folder, as the NLPL vector repository (vectors.nlpl.eu) distributes
ELMo models (``options.json``, ``model.hdf5``, optional ``vocab.txt`` / ``vocab.txt.gz`` and ``meta.json``).

The archive is format-agnostic: the files at its root, or in its one top folder, are extracted (safely, see
:func:`extract_model_folder`) into a temporary folder, loaded by the same folder dispatch as any model folder
(:func:`elmokit.weights.native.load_pretrained_bilm`: native, original options + HDF5, …), and the temporary folder
is removed once the weights are in memory. Extraction rather than reading members in place: h5py and safetensors need
a seekable file (a deflated member is not one, short of holding it in memory beside the model), and every folder
loader then works unchanged. The free space of the temporary folder (``$TMPDIR``) must hold the uncompressed model.

What the loaded model keeps of the archive (on the :class:`~elmokit.modules.bilm.BiLM`, the inner one of a
``StatefulBiLM``):

* ``source_meta``: ``meta.json`` parsed (a dict; ``None`` without one), shown by ``elmokit info``;
* ``source_vocab``: the words of ``vocab.txt`` / ``vocab.txt.gz`` in file order (``None`` without one). The
  vocabulary changes no vector: it is the model's training vocabulary, which ``elmokit convert ZIP OUT`` writes as
  the native folder's ``vocab.txt`` and which :class:`elmokit.compat.simple_elmo.ElmoModel` caches (its ``limit``
  first words, as simple_elmo does);
* ``source_archive``: the archive's path (a str).

Refused, each in one line naming the archive: a truncated or damaged zip, an encrypted one, a member whose name is
absolute or climbs out (``..``), a symbolic link, a name held twice, a member that holds more bytes than the zip
declares, a TensorFlow checkpoint (``model.ckpt-*.index`` / ``.data-*``, ``checkpoint``, ``*.meta``: make an HDF5 with
bilm-tf's ``dump_weights``), and a zip that holds no model (the message lists what it holds).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from elmokit.errors import ElmoError, MissingFileError, UsageError, WeightsError
from elmokit.modules.bilm import BiLM, StatefulBiLM

__all__ = ["is_model_archive", "load_model_archive", "extract_model_folder", "read_vocab_words", "META_NAME"]

logger = logging.getLogger(__name__)

META_NAME = "meta.json"
VOCAB_NAMES = ("vocab.txt", "vocab.txt.gz")
#: Files that make a folder worth handing to the folder loaders (any model format elmokit reads has one of them).
_MODEL_SUFFIXES = (".json", ".hdf5", ".h5", ".safetensors", ".pkl", ".pt")
#: A TensorFlow checkpoint's files (bilm-tf's training output: ``model.ckpt-N.index`` / ``.data-…`` / ``.meta``, and
#: the ``checkpoint`` index file).
_CHECKPOINT = re.compile(r"(^checkpoint$|\.ckpt|\.index$|\.data-\d+-of-\d+$|\.meta$)")
#: What makes a folder a checkpoint (``.index`` / ``.meta`` alone are too common to tell).
_CHECKPOINT_CORE = re.compile(r"(^checkpoint$|\.ckpt|\.data-\d+-of-\d+$)")
_JUNK = ("__MACOSX/",)
_LISTED = 12


def is_model_archive(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file to load as a model archive: a zip (:func:`zipfile.is_zipfile`, whatever its name),
    or a file named ``*.zip`` (so that a truncated one is reported as a damaged archive, not as a stray file)."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() == ".zip":
        return True
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "") if names else "nothing"


@contextmanager
def _open_zip(path: Path) -> Iterator[zipfile.ZipFile]:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise WeightsError(
            f"{path} is not a readable zip archive (truncated or damaged? {exc}): download it again"
        ) from None
    with zf:
        first = min((info.header_offset for info in zf.infolist()), default=0)
        if first > 0:  # zipfile found the directory of a zip stored inside the file (a .pkl / .pt), not the file's
            raise WeightsError(
                f"{path} is not a readable zip archive (truncated or damaged? its entries start at byte {first}, "
                "after bytes that belong to none of them: what was read is a zip stored inside it): download it again"
            )
        yield zf


def _member_path(archive: Path, info: zipfile.ZipInfo) -> PurePosixPath:
    """A member's name as a safe relative path, or WeightsError (absolute, drive letter, ``..``, NUL, symlink)."""
    name = info.filename
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\x00" in name or not parts:
        raise WeightsError(
            f"{archive}: member {name!r} has an unsafe name (absolute, or climbing out of the archive with '..'): "
            "elmokit extracts no such member; re-create the zip with relative names"
        )
    if info.create_system == 3 and stat.S_ISLNK(info.external_attr >> 16):
        raise WeightsError(
            f"{archive}: member {name!r} is a symbolic link, which elmokit does not extract: re-create the zip "
            "with the files themselves"
        )
    if info.flag_bits & 0x1:
        raise WeightsError(f"{archive}: member {name!r} is encrypted: extract it yourself and load the folder")
    return PurePosixPath(*parts)


def _model_members(archive: Path, zf: zipfile.ZipFile) -> tuple[str, dict[PurePosixPath, zipfile.ZipInfo]]:
    """The model folder's prefix in the archive (``""`` for its root, ``"name/"`` for one top folder) and its files
    (relative to that folder → their entry). Checks every name (:func:`_member_path`).

    Raises:
        WeightsError: an unsafe member, a name held twice, a TensorFlow checkpoint, no model (lists the members).
        UsageError: a PyTorch file (``torch.save`` writes a zip) given as the model."""
    files: dict[PurePosixPath, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        rel = _member_path(archive, info)
        if info.is_dir() or info.filename.startswith(_JUNK) or rel.name == ".DS_Store":
            continue
        if rel in files:
            raise WeightsError(f"{archive} holds {str(rel)!r} twice: re-create the zip with each file once")
        files[rel] = info
    prefix = ""
    tops = {rel.parts[0] for rel in files}
    if files and all(len(rel.parts) > 1 for rel in files) and len(tops) == 1:
        prefix = next(iter(tops)) + "/"
    inner = {PurePosixPath(*rel.parts[1:]) if prefix else rel: info for rel, info in files.items()}
    here = sorted(str(rel) for rel in inner if len(rel.parts) == 1)
    names = sorted(str(rel) for rel in files)
    where = f"its folder {prefix}" if prefix else "its root"
    if prefix and "data.pkl" in here and ("version" in here or ".format_version" in here):
        raise UsageError(
            f"{archive} is a PyTorch file (torch.save's zip), not a model archive: a model is a folder (or a zip of "
            "one) with options.json + model.hdf5, config.json + model.safetensors, or ELMoForManyLangs' files, or a "
            "released name; a run of `elmokit train` keeps its model in OUT_DIR/model"
        )
    weights = any(n.endswith((".hdf5", ".h5", ".safetensors")) for n in here)
    if not weights and any(_CHECKPOINT_CORE.search(n) for n in here):
        raise WeightsError(
            f"{archive} holds a TensorFlow checkpoint ({_listing([n for n in here if _CHECKPOINT.search(n)])}), "
            "not HDF5 weights: elmokit reads the HDF5 that bilm-tf's dump_weights writes from it "
            "(bin/dump_weights.py --save_dir CHECKPOINT_DIR --outfile model.hdf5); zip that with options.json"
        )
    if not any(n.lower().endswith(_MODEL_SUFFIXES) for n in here):
        deeper = sorted(
            {
                str(rel.parent) + "/"
                for rel in files
                if len(rel.parts) > 1 and rel.name.lower().endswith(_MODEL_SUFFIXES)
            }
        )
        hint = f": model files lie in {_listing(deeper)}; unzip it and load the model's folder" if deeper else ""
        raise WeightsError(
            f"{archive} holds no model at {where} (a model is options.json + model.hdf5, config.json + "
            f"model.safetensors, or an ELMoForManyLangs folder, at the root or in one top folder); it holds "
            f"{_listing(names)}{hint}"
        )
    return prefix, inner


def _check_space(archive: Path, members: dict[PurePosixPath, zipfile.ZipInfo], folder: Path) -> None:
    need = sum(info.file_size for info in members.values())
    free = shutil.disk_usage(folder).free
    if need > free:
        raise WeightsError(
            f"{archive} needs {need / 1e6:.0f} MB to extract into {folder}, which has {free / 1e6:.0f} MB free: "
            "set TMPDIR to a folder with room, or unzip it yourself and load the folder"
        )


def _copy_member(archive: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path) -> None:
    """Stream one member to ``dest``, stopping at more bytes than the zip declares for it (a zip bomb)."""
    written = 0
    try:
        with zf.open(info) as src, open(dest, "xb") as out:
            while block := src.read(1 << 20):
                written += len(block)
                if written > info.file_size:
                    raise WeightsError(
                        f"{archive}: member {info.filename!r} holds more than the {info.file_size} bytes the zip "
                        "declares: the archive is damaged or crafted; download it again"
                    )
                out.write(block)
    except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, RuntimeError) as exc:
        raise WeightsError(
            f"{archive}: member {info.filename!r} cannot be read (truncated or damaged? {exc}): download it again"
        ) from None


def extract_model_folder(archive: Path, zf: zipfile.ZipFile, folder: Path) -> str:
    """Extract the model folder of ``zf`` into the empty folder ``folder``; return its prefix in the archive (``""``
    when the model lies at the root, ``"name/"`` when it lies in one top folder).

    Only regular files of the model folder are written, each under ``folder`` (names checked: no absolute name, no
    ``..``, no symbolic link), after checking that ``folder``'s disk holds the sizes the zip declares; each member is
    cut off at its declared size and checked against its CRC (by :mod:`zipfile`).

    Raises:
        WeightsError: as :func:`_model_members`, a damaged member, not enough free space."""
    prefix, members = _model_members(archive, zf)
    _check_space(archive, members, folder)
    root = folder.resolve()
    for rel, info in members.items():
        dest = root.joinpath(*rel.parts)
        if not dest.resolve().is_relative_to(root):  # belt and braces: _member_path already refused such names
            raise WeightsError(f"{archive}: member {info.filename!r} would be written outside the folder")
        dest.parent.mkdir(parents=True, exist_ok=True)
        _copy_member(archive, zf, info, dest)
    return prefix


def read_vocab_words(folder: str | os.PathLike, *, source: str | None = None) -> list[str] | None:
    """The words of a model folder's ``vocab.txt`` (else ``vocab.txt.gz``): one per line, in file order, blank lines
    skipped, surrounding whitespace stripped; ``None`` when there is neither. ``source`` names the file in messages.

    Raises:
        WeightsError: not UTF-8 text, or a damaged gzip file (naming it)."""
    folder = Path(folder)
    for name in VOCAB_NAMES:
        path = folder / name
        if not path.is_file():
            continue
        shown = source + name if source else str(path)
        try:
            data = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
            text = data.decode("utf-8-sig")
        except (OSError, EOFError, zlib.error) as exc:
            raise WeightsError(f"{shown} is not a readable gzip file ({exc}): download it again") from None
        except UnicodeDecodeError as exc:
            raise WeightsError(f"{shown} is not UTF-8 text ({exc}): a vocabulary is one word per line") from None
        return [w for w in (line.strip() for line in text.splitlines()) if w]
    return None


def _read_meta(folder: Path, shown: str) -> dict | None:
    """``meta.json`` parsed; ``None`` without one. Metadata never blocks a model: a broken one is logged."""
    path = folder / META_NAME
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        logger.warning("%s is not UTF-8 JSON (%s): its metadata is ignored", shown, exc)
        return None
    return meta if isinstance(meta, dict) else {"meta": meta}


def _renamed_text(text: str, folder: Path, shown: str) -> str:
    """``text`` with the temporary folder's path replaced by the archive's name (``ARCHIVE:member``)."""
    return text.replace(str(folder) + os.sep, shown).replace(str(folder), shown.rstrip(":/") or shown)


def _renamed(exc: ElmoError, folder: Path, shown: str) -> ElmoError:
    """``exc`` with the temporary folder's path in its message replaced by the archive's name."""
    try:
        return type(exc)(_renamed_text(str(exc), folder, shown))
    except TypeError:  # an error class with another constructor: keep it as it is
        return exc


#: The loggers that may name the temporary folder while a model folder loads.
_LOADING_LOGGERS = ("elmokit.weights.efml", "elmokit.weights.native", "elmokit.weights.original", "elmokit.characters")


@contextmanager
def _archive_names_in_logs(folder: Path, shown: str) -> Iterator[None]:
    """While the extracted folder loads, log records name ``ARCHIVE:member`` rather than the temporary folder (which
    is gone once the model is loaded)."""

    def rename(record: logging.LogRecord) -> bool:
        record.msg, record.args = _renamed_text(record.getMessage(), folder, shown), None
        return True

    loggers = [logging.getLogger(name) for name in _LOADING_LOGGERS]
    for each in loggers:
        each.addFilter(rename)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(rename)


def _renamed_values(value: object, folder: Path, shown: str) -> object:
    """``value`` (a config's ``extra``: dicts, lists, strings) with the temporary folder named as the archive, so
    that no deleted path is kept (nor written by ``elmokit convert``): e.g. the EFML architecture file's source."""
    if isinstance(value, str):
        return _renamed_text(value, folder, shown)
    if isinstance(value, dict):
        return {k: _renamed_values(v, folder, shown) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed_values(v, folder, shown) for v in value]
    return value


def load_model_archive(path: str | os.PathLike, load_folder: Callable[[Path], BiLM]) -> BiLM:
    """Load the model folder inside a zip archive (see the module docstring) with ``load_folder`` (the folder
    dispatch: :func:`elmokit.weights.native.load_pretrained_bilm`, which passes itself), after safe extraction into a
    temporary folder that is removed before this returns. Sets ``source_meta``, ``source_vocab`` and
    ``source_archive`` on the model (the inner :class:`BiLM` of a ``StatefulBiLM``).

    Raises:
        WeightsError: a damaged or unsafe archive, a TensorFlow checkpoint, no model, a damaged vocabulary.
        MissingFileError / ConfigError / WeightsError: from the folder loader, naming ``ARCHIVE:member``.
    """
    archive = Path(path)
    if not archive.is_file():
        raise MissingFileError(f"model archive {archive}: no such file")
    with _open_zip(archive) as zf, tempfile.TemporaryDirectory(prefix="elmokit-zip-") as tmp:
        folder = Path(tmp)
        prefix = extract_model_folder(archive, zf, folder)
        shown = f"{archive}:{prefix}"
        vocab = read_vocab_words(folder, source=shown)
        meta = _read_meta(folder, shown + META_NAME)
        try:
            with _archive_names_in_logs(folder, shown):
                model = load_folder(folder)
        except ElmoError as exc:
            raise _renamed(exc, folder, shown) from None
    inner = model.bilm if isinstance(model, StatefulBiLM) else model
    inner.config.extra = _renamed_values(inner.config.extra, folder, shown)
    inner.source_meta, inner.source_vocab, inner.source_archive = meta, vocab, str(archive)
    return model
