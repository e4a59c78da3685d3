"""The strict leak filter of the zoo's large pretraining sources: n-gram overlap with every evaluation set.

The recipes' own filter (:mod:`elmokit.recipes.zoo.leaks`) drops a sentence whose key *is* a kept-out sentence or that
lies inside a long one; text scraped from the web (Wikipedia above all, which CoarseWSD-20 is drawn from) can also
quote *part* of an evaluation sentence. For the sources marked ``ngram_filter`` (the staged pretraining text), a
sentence is also dropped when it shares an n-gram with any sentence of the recipe's n-gram sets
(:attr:`~elmokit.recipes.zoo.sources.Recipe.ngram_sets`: every evaluation file of ``../shared/data``, train splits
included) — the rule ``../shared/data/PRETRAINING-TEXT-FILTER.md`` states, applied again here to the tokenised text
(so a corpus built from other copies of these sources is filtered too):

* **English**, 8-grams of tokens under two normalisations, a match under either dropping the sentence: **A** — the PTB
  bracket tokens (``-LRB-`` …) removed, lower case, ``n't``/``n’t`` rewritten as `` nt``, tokens the maximal runs of
  letters and digits (``[^\\W_]+``); **B** — brackets removed, lower case, apostrophe variants mapped to ``'``,
  whitespace around ``'`` deleted, ``n't`` split off its word, then the same runs (raw "don't", PTB "do n't" and
  WikiText "don 't" all give ``do n t``).
* **Chinese**, 13-character n-grams after NFKC and the removal of all whitespace. (The staging filter also matched the
  OpenCC t2s form of each evaluation sentence; OpenCC is not a dependency here, so the Traditional-script UD Chinese
  GSD sentences match only where their characters are the simplified ones.)

Unlike the staging rule, n-grams run across the sentence boundaries of a document (a hit drops every sentence the
n-gram touches), so an evaluation sentence that a source cuts differently is found too. N-grams are compared by a
64-bit polynomial hash (of Python's string hash of each token, or of each code point; one process builds and queries
the index, so the per-process string hashing does not matter); a false match (probability about ``2^-64`` per pair)
would only drop a sentence.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = ["NgramIndex", "english_views", "chinese_view", "NGRAM"]

#: n of each language's n-grams
NGRAM = {"en": 8, "zh": 13}
_BASE = np.uint64(1_000_003)
_BRACKETS = re.compile(r"-(?:LRB|RRB|LSB|RSB|LCB|RCB)-")
_RUNS = re.compile(r"[^\W_]+")
_NT_A = re.compile(r"n['’]t")
_APOSTROPHES = str.maketrans({c: "'" for c in "’‘`´ʼ′"})
_AROUND_APOSTROPHE = re.compile(r"\s*'\s*")
_SPACE = re.compile(r"\s+")


def english_views(text: str) -> tuple[list[str], list[str]]:
    """The tokens of ``text`` under normalisations A and B (see the module), e.g. ``"I don't"`` →
    ``(["i", "do", "nt"], ["i", "do", "n", "t"])``."""
    text = _BRACKETS.sub(" ", text).lower()
    a = _RUNS.findall(_NT_A.sub(" nt", text))
    b = _AROUND_APOSTROPHE.sub("'", text.translate(_APOSTROPHES)).replace("n't", " n't")
    return a, _RUNS.findall(b)


def chinese_view(text: str) -> str:
    """``text`` under NFKC with all whitespace removed (the Chinese rule's characters)."""
    return _SPACE.sub("", unicodedata.normalize("NFKC", text))


def _window_hashes(codes: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hash (mod 2^64) of every window of ``n`` consecutive uint64 ``codes``: shape (len − n + 1,)."""
    m = codes.size - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _BASE + codes[j : j + m]
    return h


def _token_codes(tokens: Sequence[str]) -> np.ndarray:
    return np.fromiter((hash(t) for t in tokens), dtype=np.int64, count=len(tokens)).view(np.uint64)


def _char_codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of a uint64 array by sorting (numpy 2's hash-based ``unique`` is many times slower here)."""
    a = np.sort(a)
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def _member(h: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Whether each of ``h`` is in the sorted array ``sorted_set``: bool, shape of ``h``."""
    if not sorted_set.size or not h.size:
        return np.zeros(h.size, dtype=bool)
    idx = np.minimum(np.searchsorted(sorted_set, h), sorted_set.size - 1)
    return sorted_set[idx] == h


class NgramIndex:
    """The n-grams of a language's evaluation sentences, to find them in training documents.

    Args:
        language: ``"en"`` (8-grams of tokens, views A and B) or ``"zh"`` (13-grams of characters).
        sets: objects with ``name``, ``folder``, ``files`` and ``read(folder_path, stats) -> sentences (str)`` (the
            recipe's :class:`~elmokit.recipes.zoo.sources.KeptOut` sets), read from ``data_dir``.

    Attributes:
        info: per set, ``name``, ``folder``, ``files``, ``sentences`` read and ``ngrams_added`` (distinct n-grams not
            already given by a set before it, the count ``PRETRAINING-TEXT-FILTER.md`` reports).
        size: distinct n-grams in the index.
    """

    def __init__(self, language: str, sets: Iterable, data_dir: Path) -> None:
        self.language = language
        self.n = NGRAM[language]
        self.info: list[dict] = []
        seen = np.zeros(0, dtype=np.uint64)
        for ko in sets:
            units: list = []  # token lists (each view of each sentence) or strings
            count = 0
            for sentence in ko.read(data_dir / ko.folder, {}):
                count += 1
                if language == "zh":
                    units.append(chinese_view(sentence))
                else:
                    units.extend(english_views(sentence))
            mine = _sorted_unique(self._unit_hashes(units))
            added = mine[~_member(mine, seen)]
            seen = _sorted_unique(np.concatenate([seen, added]))
            self.info.append(
                {
                    "name": ko.name,
                    "folder": ko.folder,
                    "files": list(ko.files),
                    "sentences": count,
                    "ngrams_added": int(added.size),
                }
            )
        self.hashes = seen  # sorted, unique
        self.size = int(seen.size)

    def _unit_hashes(self, units: Sequence) -> np.ndarray:
        """The hashes of the n-grams inside each unit (a token list, or a string of characters), none across two:
        all units' codes hashed at once, the windows that cross a boundary left out."""
        lengths = np.fromiter((len(u) for u in units), dtype=np.int64, count=len(units))
        if lengths.sum() < self.n:
            return np.zeros(0, dtype=np.uint64)
        if self.language == "zh":
            codes = _char_codes("".join(units))
        else:
            codes = _token_codes([t for u in units for t in u])
        owner = np.repeat(np.arange(len(units)), lengths)
        h = _window_hashes(codes, self.n)
        return h[owner[: h.size] == owner[self.n - 1 :]]

    def _found(self, h: np.ndarray) -> np.ndarray:
        return _member(h, self.hashes)

    def hits(self, document: Sequence[Sequence[str]]) -> set[int]:
        """Indices of the sentences (token lists) of ``document`` that an indexed n-gram touches; n-grams run across
        the sentences' boundaries within the document."""
        if self.language == "zh":
            views = [[chinese_view("".join(s)) for s in document]]
        else:
            per = [english_views(" ".join(s)) for s in document]
            views = [[p[0] for p in per], [p[1] for p in per]]
        out: set[int] = set()
        for view in views:
            lengths = np.fromiter((len(v) for v in view), dtype=np.int64, count=len(view))
            if lengths.sum() < self.n:
                continue
            if self.language == "zh":
                codes = _char_codes("".join(view))
            else:
                codes = _token_codes([t for v in view for t in v])
            starts = np.flatnonzero(self._found(_window_hashes(codes, self.n)))
            if starts.size:
                owner = np.repeat(np.arange(len(view)), lengths)  # sentence of each token / character
                for first, last in zip(owner[starts], owner[starts + self.n - 1]):
                    out.update(range(int(first), int(last) + 1))
        return out
