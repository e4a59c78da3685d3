"""Sentence keys and the leak check of the zoo's corpora: sentences are compared by a normalised key
(:func:`sentence_key`); the kept-out sets of a recipe are indexed by key and, for long sentences, by a rolling hash
that finds them inside running text across sentence boundaries (:class:`_KeptOutIndex`); :func:`leak_check` verifies
a written corpus (no held-out sentence in train, no kept-out sentence or long kept-out span in train).
"""

from __future__ import annotations

import bisect
import os
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from elmokit.errors import DataError, MissingFileError
from elmokit.recipes.zoo.sources import Recipe, _check_files, _recipe, resolve_data_dir

__all__ = ["sentence_key", "leak_check"]


_KEY_DROP = re.compile(r"[\W_]+")


def sentence_key(tokens_or_text: str | Iterable[str]) -> str:
    """The normalised form under which sentences are compared (dedup, held-out leaks, kept-out sets): NFKC, lower
    case, only letters and digits kept (so "don't" and "do n't", or a segmented and an unsegmented Chinese sentence,
    match). A sentence with no letter or digit keys on its exact tokens instead."""
    text = tokens_or_text if isinstance(tokens_or_text, str) else " ".join(tokens_or_text)
    key = _KEY_DROP.sub("", unicodedata.normalize("NFKC", text).lower())
    return key if key else "\0" + " ".join(text.split())


class _KeptOutIndex:
    """The kept-out sentences of a recipe by key (exact matches), and the long ones (at least ``min_chars`` key
    characters) by a rolling hash of their first ``min_chars`` characters, to find them inside running text across
    sentence boundaries (a kept-out sentence that a source splits differently)."""

    _BASE = 1_000_003

    def __init__(self, recipe: Recipe, data_dir: Path) -> None:
        self.min_chars = recipe.contain_min_chars
        self.keys: dict[str, str] = {}
        self.info: list[dict] = []
        for ko in recipe.kept_out:
            stats: dict = {}
            n = 0
            for s in ko.read(data_dir / ko.folder, stats):
                self.keys.setdefault(sentence_key(s), ko.name)
                n += 1
            self.info.append(
                {
                    "name": ko.name,
                    "folder": ko.folder,
                    "files": list(ko.files),
                    "sentences": n,
                    **({"decoded_cp1252": stats["decoded_cp1252"]} if "decoded_cp1252" in stats else {}),
                }
            )
        self.long: dict[int, list[str]] = {}
        for k in self.keys:
            if len(k) >= self.min_chars and not k.startswith("\0"):
                self.long.setdefault(int(self._hashes(k[: self.min_chars])[0]), []).append(k)
        self.max_len = max((len(k) for v in self.long.values() for k in v), default=0)

    def _hashes(self, text: str):
        """Polynomial hash (mod 2^64) of every window of ``min_chars`` characters of ``text``: shape (n − W + 1,)."""
        w = self.min_chars
        c = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64) + np.uint64(1)
        n = c.size
        base, inv = np.uint64(self._BASE), np.uint64(pow(self._BASE, -1, 2**64))
        with np.errstate(over="ignore"):
            pw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n - 1, base, dtype=np.uint64))])  # B^0 … B^(n-1)
            ipw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n - 1, inv, dtype=np.uint64))])
            s = np.concatenate([[np.uint64(0)], np.cumsum(c * ipw)])  # S[i] = Σ_{k<i} c_k B^-k
            return pw[w - 1 :] * (s[w:] - s[: n - w + 1])  # Σ_{k=i}^{i+W-1} c_k B^(i+W-1-k)

    def contained(self, keys: list[str], chunk_chars: int = 2_000_000) -> dict[int, str]:
        """Indices of the sentences (given by their keys, in running order) that overlap a long kept-out sentence
        occurring in their concatenation, with the kept-out set's name."""
        if not self.long or not keys:
            return {}
        pieces = ["" if k.startswith("\0") else k for k in keys]
        offsets = [0]
        for p in pieces:
            offsets.append(offsets[-1] + len(p))
        wanted = np.fromiter(self.long, dtype=np.uint64, count=len(self.long))
        hits: dict[int, str] = {}
        start = 0
        while start < len(pieces):
            end = min(bisect.bisect_left(offsets, offsets[start] + chunk_chars, lo=start + 1), len(pieces))
            # the chunk runs on over the next pieces far enough to hold a match that starts inside it
            stop = min(bisect.bisect_left(offsets, offsets[end] + self.max_len, lo=end), len(pieces))
            text = "".join(pieces[start:stop])
            if len(text) >= self.min_chars:
                for pos in np.flatnonzero(np.isin(self._hashes(text), wanted)):
                    window = text[pos : pos + self.min_chars]
                    for k in self.long[int(self._hashes(window)[0])]:
                        if text.startswith(k, pos):
                            g = offsets[start] + int(pos)
                            first = bisect.bisect_right(offsets, g) - 1
                            last = bisect.bisect_left(offsets, g + len(k))
                            for i in range(first, last):
                                if pieces[i]:
                                    hits.setdefault(i, self.keys[k])
            start = end
        return hits


def _check_leaks(train: list[str], held: Iterable[str], index: _KeptOutIndex) -> dict:
    train_keys = [sentence_key(line) for line in train]
    kept_hits: dict[str, int] = {}
    examples: list[str] = []
    for line, k in zip(train, train_keys):
        if k in index.keys:
            name = index.keys[k]
            kept_hits[name] = kept_hits.get(name, 0) + 1
            if len(examples) < 3:
                examples.append(f"train: {line[:80]!r} is in {name}")
    spans = index.contained(train_keys)
    for i, name in spans.items():
        if len(examples) < 5:
            examples.append(f"train: {train[i][:80]!r} is part of a sentence of {name}")
    key_set = set(train_keys)
    held_in_train = 0
    for line in held:
        if sentence_key(line) in key_set:
            held_in_train += 1
            if len(examples) < 7:
                examples.append(f"heldout: {line[:80]!r} occurs in train")
    return {
        "heldout_in_train": held_in_train,
        "kept_out_in_train": sum(kept_hits.values()),
        "kept_out_in_train_by_set": kept_hits,
        "kept_out_spans_in_train": len(spans),
        "examples": examples,
    }


def leak_check(corpus_dir: str | os.PathLike, recipe: str, data_dir: str | os.PathLike | None = None) -> dict:
    """Check a built corpus (``train.txt``, ``heldout.txt`` in ``corpus_dir``) by :func:`sentence_key`: no held-out
    sentence occurs in ``train.txt``; no sentence of the recipe's kept-out sets (read whole) is a line of
    ``train.txt``, nor, when it has at least the recipe's ``contain_min_chars`` key characters, part of consecutive
    lines of it. Returns the counts (all 0) and ``examples`` (empty).

    Raises:
        DataError: a leak, naming examples. MissingFileError: a file is missing.
    """
    r = _recipe(recipe)
    corpus_dir = Path(corpus_dir)
    for name in ("train.txt", "heldout.txt"):
        if not (corpus_dir / name).is_file():
            raise MissingFileError(f"corpus file missing: {corpus_dir / name} (build_corpus writes it)")
    data = resolve_data_dir(data_dir)
    _check_files(r.kept_out, data)
    index = _KeptOutIndex(r, data)
    train = (corpus_dir / "train.txt").read_text(encoding="utf-8").splitlines()
    held = (corpus_dir / "heldout.txt").read_text(encoding="utf-8").splitlines()
    result = _check_leaks(train, held, index)
    _raise_on_leak(result, corpus_dir)
    return result


def _raise_on_leak(result: dict, where) -> None:
    if result["heldout_in_train"] or result["kept_out_in_train"] or result["kept_out_spans_in_train"]:
        raise DataError(
            f"leak in {where}: {result['heldout_in_train']} held-out sentence(s) occur in train.txt; "
            f"{result['kept_out_in_train']} train sentence(s) are sentences of kept-out sets "
            f"{result['kept_out_in_train_by_set']}; {result['kept_out_spans_in_train']} are part of a "
            "kept-out sentence; e.g. " + "; ".join(result["examples"])
        )
