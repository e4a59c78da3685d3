"""Sense-labelled occurrences of a word (:class:`SenseExample`), the data sets they come from and the split used by
:mod:`elmokit.analysis.senses`.

Data readers: :func:`read_coarsewsd` (CoarseWSD-20, Loureiro et al., 2021; :func:`recase` feeds its lower-cased text to
a cased model) and :func:`build_apple_set` (苹果 in the online_shopping_10_cats reviews: 水果 = the fruit; 平板, 计算机,
手机 = Apple, the company); :func:`group_split` is the seeded, stratified split where one review never feeds both the
memory and the queries.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from elmokit.analysis.occurrences import find_spans
from elmokit.errors import DataError, MissingFileError, UsageError

__all__ = [
    "SenseExample",
    "CASINGS",
    "read_coarsewsd",
    "coarsewsd_words",
    "coarsewsd_senses",
    "read_coarsewsd_baselines",
    "APPLE_CATEGORIES",
    "AppleSet",
    "build_apple_set",
    "group_split",
    "recase",
    "truecase_table",
]


@dataclass(frozen=True)
class SenseExample:
    """One labelled occurrence: the sentence ``tokens``, the word's token span ``[start, end)``, its sense
    ``label``, and ``group``: the source unit (a review, a sentence) — a split never puts one group on both sides."""

    tokens: tuple[str, ...]
    start: int
    end: int
    label: str
    group: str


# ---------------------------------------------------------------------------------------------- CoarseWSD-20
def _coarse_dir(root: str | Path, word: str) -> Path:
    folder = Path(root) / word
    if not folder.is_dir():
        raise MissingFileError(
            f"CoarseWSD-20 word folder {folder} not found (expected <root>/<word>/ with "
            "classes_map.txt and {train,test}.{data,gold}.txt)"
        )
    return folder


def coarsewsd_words(root: str | Path) -> list[str]:
    """The words of a CoarseWSD-20 folder (sub-folders holding ``classes_map.txt``), sorted.

    Raises: MissingFileError: ``root`` is not a folder or holds no word."""
    root = Path(root)
    if not root.is_dir():
        raise MissingFileError(f"CoarseWSD-20 folder {root} not found")
    words = sorted(p.name for p in root.iterdir() if (p / "classes_map.txt").is_file())
    if not words:
        raise MissingFileError(f"{root} holds no CoarseWSD-20 word folder (<word>/classes_map.txt)")
    return words


def coarsewsd_senses(root: str | Path, word: str) -> list[str]:
    """The word's sense ids by class number (``classes_map.txt``): index 0 is the most frequent sense in train.

    Raises: MissingFileError (no folder/file), DataError (not a JSON object of consecutive class numbers)."""
    path = _coarse_dir(root, word) / "classes_map.txt"
    if not path.is_file():
        raise MissingFileError(f"{path} not found")
    try:
        mapping = json.loads(path.read_text(encoding="utf-8"))
        senses = [mapping[str(i)] for i in range(len(mapping))]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f'{path}: expected a JSON object {{"0": sense, "1": sense, ...}} ({exc})') from None
    return senses


def read_coarsewsd(root: str | Path, word: str, split: str) -> list[SenseExample]:
    """A CoarseWSD-20 split (``"train"`` or ``"test"``) of one word: ``<idx>\\t<sentence>`` lines (tokenised,
    lower-cased, 0-based target index) lined up with class numbers in ``<split>.gold.txt``; labels are the sense ids
    of ``classes_map.txt``; each line is its own group (``"<word>/<split>/<line>"``).

    Raises:
        UsageError: a split other than train/test. MissingFileError: a missing file.
        DataError: files of different lengths, a bad line, an index outside its sentence or an unknown class
            (naming file and line)."""
    if split not in ("train", "test"):
        raise UsageError(f"split must be 'train' or 'test', got {split!r}")
    folder = _coarse_dir(root, word)
    senses = coarsewsd_senses(root, word)
    data, gold = folder / f"{split}.data.txt", folder / f"{split}.gold.txt"
    for p in (data, gold):
        if not p.is_file():
            raise MissingFileError(f"{p} not found")
    lines = data.read_text(encoding="utf-8").splitlines()
    golds = gold.read_text(encoding="utf-8").split()
    if len(lines) != len(golds):
        raise DataError(f"{data} has {len(lines)} lines but {gold} {len(golds)} labels")
    out = []
    for n, (line, g) in enumerate(zip(lines, golds), 1):
        idx, sep, sentence = line.partition("\t")
        tokens = tuple(sentence.split())
        try:
            i, c = int(idx), int(g)
        except ValueError:
            raise DataError(f"{data}:{n}: expected '<index>\\t<sentence>' and an integer class in {gold}") from None
        if not sep or not 0 <= i < len(tokens):
            raise DataError(f"{data}:{n}: target index {idx!r} is not a position of its {len(tokens)}-token sentence")
        if not 0 <= c < len(senses):
            raise DataError(f"{gold}:{n}: class {c} is not in classes_map.txt (0..{len(senses) - 1})")
        out.append(SenseExample(tokens, i, i + 1, senses[c], f"{word}/{split}/{n}"))
    return out


_NUM = r"(\d+(?:\.\d+)?)"


def read_coarsewsd_baselines(source_md: str | Path) -> dict:
    """The authors' figures of SOURCE.md's "Baselines" table: ``{"columns": [...], "rows": {word: {column:
    (accuracy %, macro-F1 %)}}}``; the average row is keyed ``"avg"``.

    Raises: MissingFileError (no file), DataError (no such table)."""
    path = Path(source_md)
    if not path.is_file():
        raise MissingFileError(f"{path} not found")
    text = path.read_text(encoding="utf-8")
    part = text.split("## Baselines", 1)
    if len(part) != 2:
        raise DataError(f"{path}: no '## Baselines' section")
    rows = [ln for ln in part[1].splitlines() if ln.startswith("|")]
    if len(rows) < 3:
        raise DataError(f"{path}: no table in the Baselines section")
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    columns = header[1:]
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for ln in rows[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        name = cells[0].strip("*")
        key = "avg" if name.startswith("avg") else name
        vals = {}
        for col, cell in zip(columns, cells[1:]):
            m = re.fullmatch(rf"{_NUM}\s*/\s*{_NUM}", cell)
            if not m:
                raise DataError(f"{path}: cell {cell!r} of row {name!r} is not 'accuracy / macro-F1'")
            vals[col] = (float(m.group(1)), float(m.group(2)))
        table[key] = vals
    return {"columns": columns, "rows": table}


#: How lower-cased CoarseWSD-20 text is fed to a cased model: ``"lower"`` as it is; ``"first"`` with the first
#: token's first letter capitalised (sentence case); ``"truecase"`` each token as its most frequent spelling in the
#: model's training text (:func:`truecase_table`; the target word gets the same spelling in every sentence, so it
#: reveals nothing about the sense).
CASINGS = ("lower", "first", "truecase")


def truecase_table(counts: Mapping[str, int] | Iterable[tuple[str, int]]) -> dict[str, str]:
    """Token counts (of the model's training text) → ``{lower-cased form: most frequent spelling}`` (ties: the
    spelling that sorts first, so the table does not depend on the counts' order).

    ``counts`` is any mapping of token → count (a ``Counter``, a ``dict``) or an iterable of ``(token, count)``
    pairs."""
    best: dict[str, tuple[int, str]] = {}
    items = counts.items() if isinstance(counts, Mapping) else counts
    for tok, n in items:
        key = tok.lower()
        cur = best.get(key)
        if cur is None or n > cur[0] or (n == cur[0] and tok < cur[1]):
            best[key] = (n, tok)
    return {k: v for k, (_, v) in best.items()}


def recase(tokens: Sequence[str], casing: str, table: dict[str, str] | None = None) -> tuple[str, ...]:
    """Apply a :data:`CASINGS` mode to lower-cased tokens (``table`` from :func:`truecase_table` for
    ``"truecase"``; tokens not in it stay as they are).

    Raises: UsageError: an unknown mode, or ``"truecase"`` without a table."""
    if casing not in CASINGS:
        raise UsageError(f"casing must be one of {CASINGS}, got {casing!r}")
    if casing == "lower":
        return tuple(tokens)
    if casing == "first":
        return tuple((t[:1].upper() + t[1:]) if i == 0 else t for i, t in enumerate(tokens))
    if table is None:
        raise UsageError("casing 'truecase' needs the table of spellings (truecase_table)")
    return tuple(table.get(t, t) for t in tokens)


# ---------------------------------------------------------------------------------------------- 苹果
#: Review category → sense of 苹果 (the other categories are not used).
APPLE_CATEGORIES = {"水果": "fruit", "平板": "Apple", "计算机": "Apple", "手机": "Apple"}


@dataclass
class AppleSet:
    """The 苹果 labelled set: ``examples`` (one per occurrence where 苹果 is a word token; ``group`` = the review's
    CSV row) and ``stats`` (counts of reviews and occurrences, reviews where 苹果 only appears inside another token
    and those tokens)."""

    examples: list[SenseExample]
    stats: dict = field(default_factory=dict)


def build_apple_set(
    csv_path: str | Path,
    tokenize: Callable[[str], list[list[str]]],
    word: str = "苹果",
    categories: dict[str, str] | None = None,
) -> AppleSet:
    """Read ``online_shopping_10_cats.csv`` (``cat,label,review``) and keep, in the categories of
    :data:`APPLE_CATEGORIES`, the reviews holding ``word``; segment each with ``tokenize`` (raw text → sentences of
    words: ``elmokit.data.tokenizers.load_tokenizer('elmokit-zh')``) and take every sentence position where ``word``
    is a whole word token. A review where ``word`` only appears inside longer tokens (苹果手机, 苹果醋) is counted in
    ``stats["reviews_only_inside_other_token"]`` and contributes nothing.

    Raises: MissingFileError (no file), DataError (not the expected CSV header)."""
    path = Path(csv_path)
    if not path.is_file():
        raise MissingFileError(f"{path} not found (expected online_shopping_10_cats.csv)")
    categories = APPLE_CATEGORIES if categories is None else categories
    examples: list[SenseExample] = []
    per_cat: Counter[str] = Counter()
    occ_per_cat: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    inside_tokens: Counter[str] = Counter()
    other: Counter[str] = Counter()
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["cat", "label", "review"]:
            raise DataError(f"{path}: expected the header 'cat,label,review', got {header!r}")
        for row_no, row in enumerate(reader, 2):
            if len(row) < 3:
                continue
            cat, review = row[0], row[2].replace("\ufeff", "")
            if word not in review:
                continue
            if cat not in categories:
                other[cat] += 1
                continue
            found = []
            for tokens in tokenize(review):
                for s, e in find_spans(tokens, word, "token"):
                    found.append(SenseExample(tuple(tokens), s, e, categories[cat], f"row{row_no}"))
                inside_tokens.update(t for t in tokens if word in t and t != word)
            if found:
                per_cat[cat] += 1
                occ_per_cat[cat] += len(found)
                examples.extend(found)
            else:
                inside[cat] += 1
    senses = Counter(e.label for e in examples)
    stats = {
        "reviews_with_word_token": dict(per_cat),
        "occurrences": dict(occ_per_cat),
        "reviews_only_inside_other_token": dict(inside),
        "longer_tokens_holding_word": dict(inside_tokens.most_common(12)),
        "reviews_in_other_categories": dict(other),
        "occurrences_per_sense": dict(senses),
        "reviews_per_sense": {s: len({e.group for e in examples if e.label == s}) for s in senses},
    }
    return AppleSet(examples, stats)


def group_split(
    examples: Sequence[SenseExample], query_fraction: float = 0.5, seed: int = 0
) -> tuple[list[SenseExample], list[SenseExample]]:
    """A fixed, seeded split by group, stratified by sense: for each sense its groups are shuffled
    (``numpy.random.default_rng(seed)``, senses in sorted order) and ``round(query_fraction × n)`` of them (at least
    one, and leaving one for the memory, when there are two or more) go to the queries; a group never contributes to
    both sides. Returns ``(memory, queries)`` in input order.

    Raises: UsageError: ``query_fraction`` outside (0, 1). DataError: a group holding occurrences of two senses."""
    if not 0 < query_fraction < 1:
        raise UsageError(f"query_fraction must be in (0, 1), got {query_fraction!r}")
    label_of: dict[str, str] = {}
    for e in examples:
        if label_of.setdefault(e.group, e.label) != e.label:
            raise DataError(
                f"group {e.group!r} holds two senses ({label_of[e.group]!r}, {e.label!r}): a stratified "
                "split by group needs one sense per group"
            )
    rng = np.random.default_rng(seed)
    query_groups: set[str] = set()
    for sense in sorted(set(label_of.values())):
        groups = sorted(g for g, s in label_of.items() if s == sense)
        order = rng.permutation(len(groups))
        n_q = int(round(query_fraction * len(groups)))
        if len(groups) >= 2:
            n_q = min(max(n_q, 1), len(groups) - 1)
        query_groups.update(groups[i] for i in order[:n_q])
    memory = [e for e in examples if e.group not in query_groups]
    queries = [e for e in examples if e.group in query_groups]
    return memory, queries
