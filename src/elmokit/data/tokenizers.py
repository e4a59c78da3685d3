"""Tokenisers and sentence splitters: the one home for turning raw text into words.

- :func:`word_tokenizer` (``"whitespace"``, ``"moses"``, ``"jieba"``): a line → its words, what ``embed``, ``score``,
  ``perplexity``, ``train`` and ``similar`` apply with ``--tokenizer``. Every tokeniser's words pass one clean-up
  (:func:`clean_tokens`: no empty word, no word holding whitespace), so a word is never a space.
- :func:`split_english` / :func:`split_chinese`: running text → sentences (the zoo corpora's rules).
- :func:`load_tokenizer`: the tokeniser a zoo model folder records in its ``tokenizer.json`` (text → sentences of
  words, as its corpus was made).

sacremoses (``"moses"``) and jieba (``"jieba"``) are optional libraries, imported on first use.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from elmokit.errors import MissingFileError, UsageError, import_optional

__all__ = [
    "TOKENIZERS",
    "word_tokenizer",
    "clean_tokens",
    "split_english",
    "split_chinese",
    "load_tokenizer",
    "segmenter_versions",
]

#: The names :func:`word_tokenizer` takes (``--tokenizer``).
TOKENIZERS = ("whitespace", "moses", "jieba")


def clean_tokens(tokens: Iterable[str]) -> list[str]:
    """Tokens without whitespace: empty ones dropped, any holding whitespace split."""
    out: list[str] = []
    for t in tokens:
        out.extend(t.split())
    return out


@functools.lru_cache(maxsize=1)
def _moses():
    sacremoses = import_optional("sacremoses", "tokenizers", "the Moses tokenizer")  # optional: sacremoses
    return sacremoses.MosesTokenizer(lang="en")


@functools.lru_cache(maxsize=1)
def _jieba():
    jieba = import_optional("jieba", "tokenizers", "the jieba tokenizer")  # optional: jieba
    jieba.setLogLevel(logging.WARNING)
    tokenizer = jieba.Tokenizer()
    tokenizer.initialize()
    return tokenizer


def _moses_words(text: str) -> list[str]:
    return clean_tokens(_moses().tokenize(text, escape=False))


def _jieba_words(text: str) -> list[str]:
    return clean_tokens(_jieba().lcut(text, HMM=True))


def word_tokenizer(name: str) -> Callable[[str], list[str]]:
    """A line → its words: ``"whitespace"`` (``str.split``), ``"moses"`` (sacremoses' English Moses tokenizer,
    ``escape=False``), ``"jieba"`` (jieba's default dictionary, precise mode, ``HMM=True``). Words never hold
    whitespace and are never empty (:func:`clean_tokens`). The tokeniser is built once per process, on first use.

    Raises:
        UsageError: an unknown name (the message lists :data:`TOKENIZERS`).
        MissingExtraError: sacremoses or jieba is not installed (``pip install 'elmokit[tokenizers]'``)."""
    if name == "whitespace":
        return str.split
    # the library is looked up on every call (a missing one is reported before any work), built once
    if name == "moses":
        import_optional("sacremoses", "tokenizers", "the Moses tokenizer")
        _moses()
        return _moses_words
    if name == "jieba":
        import_optional("jieba", "tokenizers", "the jieba tokenizer")
        _jieba()
        return _jieba_words
    raise UsageError(f"tokenizer must be one of {TOKENIZERS}, got {name!r}")


def segmenter_versions() -> dict[str, str]:
    """The tokenisers the zoo recipes use, with their versions (imports sacremoses and jieba)."""
    jieba = import_optional("jieba", "tokenizers", "the jieba tokenizer")  # optional: jieba
    sacremoses = import_optional("sacremoses", "tokenizers", "the Moses tokenizer")  # optional: sacremoses

    return {
        "sacremoses": f"sacremoses {sacremoses.__version__} (MosesTokenizer lang=en, escape=False)",
        "jieba": f"jieba {jieba.__version__} (default dictionary, precise mode, HMM=True)",
    }


# ---------------------------------------------------------------------------------------------- sentences
# English sentence splitting: at . ! ? (with closing quotes/brackets) + whitespace before a capital, digit or opening
# quote, except after a known abbreviation or a single-letter initial.
_EN_BOUNDARY = re.compile(r"[.!?]+[\"'’”)\]]*(?=\s+[\"'‘“(\[]*[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr gen col lt sgt capt cmdr adm gov sen rep rev hon pres messrs mt ft vol vols fig figs "
    "inc corp co ltd bros dept univ assn jan feb mar apr jun jul aug sep sept oct nov dec vs al approx ca cf e.g i.e "
    "u.s u.k u.n a.m p.m ave blvd rd no nos pp".split()
)


def split_english(text: str) -> list[str]:
    """Cut running English text into sentences (strings): after ``.``/``!``/``?`` (and closing quotes or brackets)
    followed by whitespace and a capital letter, a digit or an opening quote/bracket, unless the period ends a known
    abbreviation (Mr., U.S., Jan., …) or a single-letter initial."""
    out, start = [], 0
    for m in _EN_BOUNDARY.finditer(text):
        if m.group().startswith(".") and len(m.group().rstrip("\"'’”)]")) == 1:
            word = re.search(r"(\S*)$", text[start : m.start()]).group(1).lstrip("\"'‘“([").lower()
            if (
                word in _ABBREVIATIONS
                or (len(word) == 1 and word.isalpha())
                or re.fullmatch(r"(?:[a-z]\.)+[a-z]", word)
            ):
                continue
        out.append(text[start : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


_ZH_BOUNDARY = re.compile(r"[。！？!?…]+[”’」』）)】\"']*|\n+")


def split_chinese(text: str) -> list[str]:
    """Cut raw Chinese text into sentences (strings): after runs of 。！？!?… (with closing quotes/brackets) and at
    line breaks."""
    out, start = [], 0
    for m in _ZH_BOUNDARY.finditer(text):
        out.append(text[start : m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


# ---------------------------------------------------------------------------------------------- zoo models
def load_tokenizer(name_or_dir: str | os.PathLike) -> Callable[[str], list[list[str]]]:
    """The function that turns raw text into the zoo model's sentences of tokens, as its corpus was made: English
    :func:`split_english` + sacremoses, Chinese :func:`split_chinese` + jieba (the ``tokenizer.json`` of the model
    folder says which; a zoo name is resolved as the loaders do).

    Returns ``tokenize(text) -> list[list[str]]``.

    Raises:
        MissingFileError: the folder has no ``tokenizer.json`` (not a zoo model) or the zoo model is not built.
    """
    from elmokit.weights.native import resolve_model_name  # lazy: weights imports torch (CLI start-up)

    folder = Path(resolve_model_name(name_or_dir))
    info_path = folder / "tokenizer.json"
    if not info_path.is_file():
        raise MissingFileError(f"{info_path} not found: only zoo models (elmokit zoo build) record their tokeniser")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    if info.get("segmenter") == "jieba":
        return lambda text: [t for s in split_chinese(text) if (t := _jieba_words(s))]
    return lambda text: [t for s in split_english(text) if (t := _moses_words(s))]
