"""The reader of the staged pretraining text of ``../shared/data`` (``en-wikipedia-2014``, ``en-gutenberg``, …,
``zh-news-cctv``, …): xz-compressed UTF-8, one paragraph a line, a blank line between documents, not tokenised (each
folder's ``SOURCE.md``). :func:`staged_text_reader` makes a recipe source's ``read``: it tokenises as the zoo's other
raw-text sources are tokenised — English paragraphs cut with :func:`~elmokit.data.tokenizers.split_english` and
tokenised with sacremoses (``MosesTokenizer(lang="en")``, ``escape=False``: PTB-style, as the English evaluation text),
Chinese paragraphs cut with :func:`~elmokit.data.tokenizers.split_chinese` and segmented into jieba words — and keeps
the tokenised text in a cache so that a rebuild does not tokenise again.

The cache: ``<root>/<folder>-<fingerprint>.txt.gz`` with ``<root>`` the reader's ``stats["text_cache"]`` when given
(:func:`~elmokit.recipes.zoo.corpora.build_corpus`'s ``text_cache``; ``elmokit zoo build`` gives ``<cache>/corpora``
beside ``<cache>/zoo``), else ``$ELMOKIT_CACHE/corpora`` (default ``~/.cache/elmokit/corpora``), one tokenised
sentence a line, a blank line after each document, gzip level 1, plus ``….json`` (the fingerprint's inputs and the
raw line count). The fingerprint is the sha256 of: the reader's :data:`READER_VERSION`, the language, the source
folder's name, each file's name and sha256, and the tokeniser's name and version
(:func:`~elmokit.data.tokenizers.segmenter_versions`). A source is written to the cache, atomically, only when it was
read to its end (a build with ``limit`` or an interrupted one leaves no partial file), so preparation resumes at
source granularity: an interrupted ``elmokit zoo build`` tokenises again only the sources it had not finished, and a
rerun with the same files and tokenisers reads every source from the cache (decompression and ``str.split`` only).
On a 1 MB sample (one thread, on a machine shared with other jobs: indicative only) the tokenisers ran at about
190k English words and 360k Chinese characters per CPU second, i.e. a few minutes of one core for the 31.4M English
words and the 22.9M Chinese characters; ``bench/corpus_prepare.py`` measures it per source on a quiet machine.

Documents with no sentence left after tokenisation are skipped (the same way from the files and from the cache, so
document numbers, which seed the held-out split, do not depend on the cache).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from elmokit.data.lines import open_binary
from elmokit.data.tokenizers import segmenter_versions
from elmokit.errors import DataError, UsageError
from elmokit.io import atomic_path, atomic_write_text, file_sha256
from elmokit.recipes.zoo.readers import Document, _raw_en_document, raw_zh_document
from elmokit.weights.native import cache_dir

__all__ = ["READER_VERSION", "staged_text_reader", "text_cache_path"]

#: Bump when the reading or tokenisation of the staged text changes (it is part of the cache fingerprint).
READER_VERSION = 1
#: The tokeniser of each language (a key of :func:`~elmokit.data.tokenizers.segmenter_versions`).
_TOKENISER = {"en": "sacremoses", "zh": "jieba"}


def _blocks(lines: Iterable[str], item: Callable[[str], Any]) -> Iterator[list]:
    """Group ``lines`` into blocks at blank lines: each block lists ``item(line)`` of its non-blank lines (a line is
    blank when ``item`` gives a false value); empty blocks are skipped."""
    block: list = []
    for line in lines:
        value = item(line)
        if value:
            block.append(value)
        elif block:
            yield block
            block = []
    if block:
        yield block


def _paragraph_documents(folder: Path, files: tuple[str, ...], stats: dict) -> Iterator[list[str]]:
    """The documents (lists of non-blank paragraphs) of the files in order; ``stats["lines"]`` counts raw lines.

    Raises:
        DataError: a file is not valid UTF-8 or not a complete xz stream (named)."""

    def paragraph(line: str) -> str:
        stats["lines"] = stats.get("lines", 0) + 1
        return line.strip()

    for name in files:
        path = folder / name
        try:
            with io.TextIOWrapper(open_binary(path), encoding="utf-8", newline="\n") as f:
                yield from _blocks(f, paragraph)
        except (EOFError, OSError, lzma.LZMAError, UnicodeDecodeError) as exc:
            raise DataError(
                f"{path}: cannot read it as xz-compressed UTF-8 text ({type(exc).__name__}: {exc})"
            ) from None


def _tokenise(language: str, paragraphs: list[str]) -> Document:
    if language == "en":
        return _raw_en_document(paragraphs)
    return [s for p in paragraphs for s in raw_zh_document(p)]


def _fingerprint(folder: Path, files: tuple[str, ...], language: str) -> dict:
    tokeniser = _TOKENISER[language]
    return {
        "reader_version": READER_VERSION,
        "language": language,
        "source": folder.name,
        "files": {name: file_sha256(folder / name) for name in files},
        "tokeniser": segmenter_versions()[tokeniser],
    }


def text_cache_path(
    folder: Path, files: tuple[str, ...], language: str, root: str | os.PathLike | None = None
) -> tuple[Path, dict]:
    """Where the tokenised text of ``files`` in ``folder`` is cached under ``root`` (default
    ``$ELMOKIT_CACHE/corpora``), and the fingerprint's inputs (see the module)."""
    info = _fingerprint(folder, files, language)
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode("utf-8")).hexdigest()[:16]
    base = Path(root) if root is not None else cache_dir() / "corpora"
    return base / f"{folder.name}-{digest}.txt.gz", info


def _read_cached(path: Path) -> Iterator[Document]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        yield from _blocks(f, str.split)


def staged_text_reader(files: tuple[str, ...], language: str) -> Callable[[Path, dict], Iterator[Document]]:
    """A source's ``read(folder, stats)`` for staged pretraining text (see the module): the documents of ``files`` (xz,
    read in order) tokenised for ``language`` (``"en"``: sacremoses; ``"zh"``: jieba), from the cache when it holds
    them. ``stats["text_cache"]``, when set, is the cache folder (see the module). ``stats`` gets ``lines`` (raw
    lines, blank ones included) and ``cache`` (the cache file, and whether it was ``"read"`` or ``"written"``; nothing
    when the read stopped early).

    Raises (when read):
        DataError: a file is not xz-compressed UTF-8 text. OSError: the cache folder cannot be written.
    """
    if language not in _TOKENISER:
        raise UsageError(f"language must be one of {sorted(_TOKENISER)}, got {language!r}")

    def read(folder: Path, stats: dict) -> Iterator[Document]:
        cache, info = text_cache_path(folder, files, language, stats.get("text_cache"))
        meta = cache.with_suffix(".json")
        if cache.is_file() and meta.is_file():
            saved = json.loads(meta.read_text(encoding="utf-8"))
            stats["lines"] = stats.get("lines", 0) + saved["lines"]
            stats["cache"] = {"path": str(cache), "how": "read"}
            yield from _read_cached(cache)
            return
        counts: dict = {}
        with atomic_path(cache) as tmp:
            with gzip.open(tmp, "wt", encoding="utf-8", newline="\n", compresslevel=1) as out:
                for paragraphs in _paragraph_documents(folder, files, counts):
                    doc = _tokenise(language, paragraphs)
                    if doc:
                        out.write("".join(" ".join(s) + "\n" for s in doc) + "\n")
                        yield doc
        stats["lines"] = stats.get("lines", 0) + counts.get("lines", 0)
        atomic_write_text(meta, json.dumps({**info, "lines": counts.get("lines", 0)}, indent=1) + "\n")
        stats["cache"] = {"path": str(cache), "how": "written"}

    return read
