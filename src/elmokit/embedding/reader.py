"""Reading what :meth:`elmokit.Embedder.embed_file` and ``elmokit embed`` write, and the on-disk names both sides
share: :func:`open_embeddings` reads the three formats (``"allennlp"``, ``"hdf5"``, ``"parts"``: see
:mod:`elmokit.embedding.writer`) as one mapping from dataset name to array; :func:`sentence_key` names a line's dataset
with ``use_sentence_keys``; :func:`work_folder` and :func:`part_name` locate the parts of a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elmokit.errors import MissingFileError, UsageError
from elmokit.io import check_output_path

__all__ = [
    "EmbeddingReader",
    "open_embeddings",
    "sentence_key",
    "work_folder",
    "part_name",
    "is_elmokit_embeddings",
    "check_embeddings_output",
    "FORMATS",
    "INDEX_NAME",
    "LAYOUT_NAME",
    "LAYOUT_VERSION",
]

FORMATS = ("allennlp", "hdf5", "parts")
INDEX_NAME = "index.json"
LAYOUT_NAME = "elmokit-embeddings"
LAYOUT_VERSION = 1
#: The root attribute every single-file output carries (``writer = "elmokit"``), beside ``keys`` (line|sentence).
WRITER_ATTR = "writer"


def part_name(k: int) -> str:
    """``part-000042.hdf5``."""
    return f"part-{k:06d}.hdf5"


def is_elmokit_embeddings(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file that :meth:`elmokit.Embedder.embed_file` wrote (the only kind of existing
    file ``overwrite`` replaces): an HDF5 signature, and a root attribute elmokit writes — ``writer = "elmokit"``, the
    ``elmokit_format`` of format ``"hdf5"``, or ``keys`` = ``line`` / ``sentence`` (every format before ``writer``).
    Reads the first bytes and the root attributes only; anything unreadable is not one."""
    import h5py  # lazy: CLI start-up (the CLI imports this module to build its parser)

    try:
        with open(path, "rb") as fh:
            if fh.read(8) != b"\x89HDF\r\n\x1a\n":
                return False
        with h5py.File(path, "r") as h5:
            attrs = dict(h5.attrs)
    except (OSError, ValueError):
        return False

    def text(value: Any) -> str:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    return (
        text(attrs.get(WRITER_ATTR, "")) == "elmokit"
        or text(attrs.get("elmokit_format", "")).startswith(LAYOUT_NAME)
        or text(attrs.get("keys", "")) in ("line", "sentence")
    )


def check_embeddings_output(
    output: Path, inputs: Mapping[str, Any], overwrite: bool, overwrite_flag: str, create_folder: bool = False
) -> None:
    """:func:`elmokit.io.check_output_path` for an HDF5 output of embeddings: ``overwrite`` replaces only a file
    :func:`is_elmokit_embeddings` recognises. Raises as that function."""
    check_output_path(
        output,
        inputs,
        overwrite=overwrite,
        ours=is_elmokit_embeddings,
        kind="an HDF5 file of embeddings elmokit wrote",
        overwrite_flag=overwrite_flag,
        create_folder=create_folder,
    )


def work_folder(output_path: str | os.PathLike, format: str) -> Path:
    """Where the parts of a run writing ``output_path`` in ``format`` go: the output itself for ``"parts"``,
    ``<output>.parts`` beside it otherwise."""
    output_path = Path(output_path)
    return output_path if format == "parts" else output_path.with_name(output_path.name + ".parts")


# ---------------------------------------------------------------------------------------------- keys, tokenizers
def sentence_key(text: str) -> str | None:
    """The HDF5 dataset name of a line with ``use_sentence_keys``: the stripped line with ``%`` → ``%25``, ``/`` →
    ``%2F`` (HDF5's path separator), NUL → ``%00``, and a lone ``.`` (HDF5's "this group") → ``%2E``. ``None`` for a
    blank line (no dataset). ``urllib.parse.unquote`` gives the line back."""
    s = text.strip()
    if not s:
        return None
    s = s.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    return "%2E" if s == "." else s


class EmbeddingReader(Mapping):
    """Read an ``embed_file`` output of any format as a mapping from dataset name to NumPy array.

    ``reader["3"]`` (or ``reader[3]``) is line 4's array; with sentence keys, ``reader[sentence_key(line)]``.
    :meth:`sentence` gives line i+1's stripped text (where the output keeps sentences). A ``parts`` folder is read one
    part file at a time. With sentence keys, a line repeated in two parts of a ``parts`` folder is stored in both
    (the same vectors): iteration yields it twice, lookup returns the first.

    Raises:
        MissingFileError: no such file or folder. UsageError: a parts folder whose run has not finished.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        import h5py  # lazy: CLI start-up (the embed command imports this module to build its parser)

        self.path = Path(path)
        self._h5py = h5py
        self._open: tuple[int, Any] | None = None
        self._sentence_map: dict[str, str] | None = None
        if self.path.is_dir():
            index_path = self.path / INDEX_NAME
            if not index_path.is_file():
                raise MissingFileError(f"{self.path} is a folder without {INDEX_NAME}: not an embed output")
            self.index = json.loads(index_path.read_text(encoding="utf-8"))
            if not self.index.get("complete"):
                raise UsageError(f"{self.path} is an unfinished run: finish it with --resume before reading it")
            self.format = "parts"
            self.part_size = int(self.index["settings"]["part_size"])
            self.lines = int(self.index["lines"])
            self.sentence_keys = self.index.get("keys") == "sentence"
            self._file = None
        else:
            if not self.path.is_file():
                raise MissingFileError(f"{self.path}: no such file")
            self._file = h5py.File(self.path, "r")
            self.index = dict(self._file.attrs)
            self.format = "hdf5" if "elmokit_format" in self._file.attrs else "allennlp"
            keys = self.index.get("keys")
            self.sentence_keys = (
                keys == "sentence"
                if keys is not None  # AllenNLP's own files have no attributes
                else not all(k.isdigit() for k in self._file if k != "sentence_to_index")
            )
            self.lines = int(self.index.get("lines", sum(1 for k in self._file if k.isdigit())))

    def _part(self, k: int):
        if self._open is None or self._open[0] != k:
            self._close_part()
            self._open = (k, self._h5py.File(self.path / part_name(k), "r"))
        return self._open[1]

    def _close_part(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def _parts(self) -> int:
        return len(self.index["part_files"])

    def __getitem__(self, key: str | int) -> np.ndarray:
        key = str(key)
        if self._file is not None:
            if key in ("sentence_to_index", "sentences", "skipped_lines") and not self.sentence_keys:
                raise KeyError(key)
            return self._file[key][()]
        if not self.sentence_keys:
            if not key.isdigit() or int(key) >= self.lines:
                raise KeyError(key)
            return self._part(int(key) // self.part_size)[key][()]
        for k in range(self._parts()):
            part = self._part(k)
            if key in part:
                return part[key][()]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        if not self.sentence_keys:
            yield from (str(i) for i in range(self.lines))
            return
        if self._file is not None:
            yield from self._file
            return
        for k in range(self._parts()):
            yield from list(self._part(k))

    def __len__(self) -> int:
        if not self.sentence_keys:
            return self.lines
        if self._file is not None:
            return len(self._file)
        return sum(len(self._part(k)) for k in range(self._parts()))

    def sentence(self, i: int) -> str:
        """Line i+1's stripped text (numbered outputs that kept their sentences).

        Raises:
            UsageError: the output keeps no sentences (sentence keys or ``forget_sentences``)."""
        if self._file is not None and "sentences" in self._file:
            return self._file["sentences"].asstr()[i]
        if self._file is not None and "sentence_to_index" in self._file:
            if self._sentence_map is None:
                mapping = json.loads(self._file["sentence_to_index"].asstr()[0])
                self._sentence_map = {v: k for k, v in mapping.items()}
            return self._sentence_map.get(str(i), "")
        if self._file is None and not self.sentence_keys:
            part = self._part(i // self.part_size)
            if "sentences" in part:
                return part["sentences"].asstr()[i - int(part.attrs["first"])]
        raise UsageError(f"{self.path} keeps no sentence texts (written with sentence keys or forget_sentences)")

    def close(self) -> None:
        self._close_part()
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> EmbeddingReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_embeddings(path: str | os.PathLike) -> EmbeddingReader:
    """Open an ``embed_file`` output (``allennlp`` / ``hdf5`` file, or ``parts`` folder): see
    :class:`EmbeddingReader`."""
    return EmbeddingReader(path)
