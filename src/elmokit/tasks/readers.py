"""Readers for the downstream task files: CoNLL-2003 NER, CoNLL-U (UPOS/XPOS), the Chinese character NER files, and
sentence-classification files (tag-scheme conversion and checking: :mod:`elmokit.tasks.tag_schemes`).

Every reader returns frozen records that name their file and the 1-based line where the example starts, and every
error it raises on purpose is one line ``FILE:LINE: what is wrong; what is expected``
(:class:`~elmokit.errors.DataError` for unusable contents, :class:`~elmokit.errors.MissingFileError` for a missing
file, :class:`~elmokit.errors.UsageError` for a bad option).

Tag schemes (IOB1 / BIO / BIOES / BMES), their conversion and the reading of invalid sequences are in
:mod:`elmokit.tasks.tag_schemes` (its names are importable from here too): the readers *repair* an invalid sequence
by default, the way conlleval and seqeval's default mode read it, and log one warning per file naming the first such
line and the count; ``strict=True`` refuses it (a :class:`TagSequenceError` naming the file and line).

Sizes of the shared files as read here (equal to their SOURCE.md): CoNLL-2003 ``eng.train`` 14,041 sentences /
203,621 tokens (``-DOCSTART-`` lines skipped; checked by the tests), UD English-EWT train 12,544 sentences / 204,577
words (multiword-token ranges and empty nodes skipped; the tests check dev, 2,001 / 25,147, to stay fast).
"""

from __future__ import annotations

import logging
import os
import re
import zipfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elmokit.errors import DataError, MissingFileError, UsageError, import_optional
from elmokit.tasks.tag_schemes import (
    SCHEMES,
    TagSequenceError,
    check_scheme,
    check_tags,
    convert_tags,
    decode_tags,
    detect_scheme,
    spans_to_tags,
    tag_spans,
)

__all__ = [
    "TaggedSentence",
    "LabelledSentence",
    "TagSequenceError",
    "SCHEMES",
    "read_conll2003",
    "read_conllu",
    "read_char_ner",
    "read_labelled",
    "convert_tags",
    "check_tags",
    "tag_spans",
    "spans_to_tags",
    "label_set",
    "detect_scheme",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaggedSentence:
    """One tagged sentence: ``tokens[i]`` has tag ``tags[i]`` (same length, at least one token). ``source`` is the
    file it was read from and ``line`` the 1-based line of its first token."""

    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    source: str
    line: int


@dataclass(frozen=True)
class LabelledSentence:
    """One labelled sentence (whitespace tokens, at least one) with its class label, its file and 1-based line."""

    tokens: tuple[str, ...]
    label: str
    source: str
    line: int


# ============================================================================================ reading lines
def _display(path: Path, member: str | None = None) -> str:
    return f"{path}:{member}" if member else str(path)


def _read_lines(path: str | os.PathLike, encoding: str = "utf-8") -> tuple[str, list[str]]:
    """``(source name, lines without their line ends)`` of a text file (or the one text member of a ``.zip``).
    A byte-order mark at the start is dropped. Raises :class:`MissingFileError` (no file / a folder) and
    :class:`DataError` (``FILE:LINE`` of the first undecodable line, or an unreadable zip)."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: " + ("is a folder, not a data file" if path.is_dir() else "no such file"))
    member = None
    if path.suffix.lower() == ".zip":
        try:
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if not n.endswith("/")]
                if len(names) != 1:
                    raise DataError(f"{path}: a zip data file must hold exactly one file, it holds {len(names)}")
                member = names[0]
                raw = z.read(member)
        except zipfile.BadZipFile as exc:
            raise DataError(f"{path}: not a readable zip file ({exc})") from None
    else:
        raw = path.read_bytes()
    source = _display(path, member)
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        try:
            text = line.decode(encoding)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{source}:{number}: not valid {encoding} (byte 0x{line[exc.start]:02x} at column "
                f"{exc.start + 1}); pass the file's encoding, e.g. encoding='latin-1'"
            ) from None
        except LookupError:
            raise UsageError(f"unknown encoding {encoding!r}") from None
        if number == 1 and text.startswith("\ufeff"):
            text = text[1:]
        out.append(text.rstrip("\r"))
    return source, out


def _blocks(lines: list[str]) -> Iterable[list[tuple[int, str]]]:
    """Groups of consecutive non-blank lines as ``[(line number, text), ...]``."""
    block: list[tuple[int, str]] = []
    for number, text in enumerate(lines, 1):
        if text.strip():
            block.append((number, text))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _retag(
    source: str,
    lines: list[int],
    tags: list[str],
    source_scheme: str,
    target: str,
    strict: bool,
    repaired: list[tuple[int, str]],
) -> list[str]:
    """Convert one sentence's tags, turning positions into ``FILE:LINE`` and collecting the repairs."""
    try:
        spans, problems = decode_tags(tags, source_scheme)
    except TagSequenceError as exc:
        raise TagSequenceError(exc.detail, exc.position, f"{source}:{lines[exc.position]}") from None
    if problems:
        if strict:
            pos, reason = problems[0]
            raise TagSequenceError(
                f"invalid {source_scheme} sequence: {reason}; fix the file or read it with "
                "strict=False (conlleval's reading)",
                pos,
                f"{source}:{lines[pos]}",
            )
        repaired.extend((lines[pos], reason) for pos, reason in problems)
    return spans_to_tags(spans, len(tags), target)


def _report_repairs(source: str, scheme: str, repaired: list[tuple[int, str]]) -> None:
    if repaired:
        line, reason = repaired[0]
        logger.warning(
            "%s: %d invalid %s transition%s read as conlleval reads them (first at line %d: %s); "
            "strict=True refuses them",
            source,
            len(repaired),
            scheme,
            "" if len(repaired) == 1 else "s",
            line,
            reason,
        )


def _check_limit(limit: object) -> int | None:
    """``limit`` (the most sentences to read; ``None`` = all) checked."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"limit must be None or an int >= 1 (the most sentences to read), got {limit!r}")
    return limit


def _looks_like_conllu(text: str) -> bool:
    return text.startswith("#") or len(text.split("\t")) == 10


# ============================================================================================ CoNLL-2003
def read_conll2003(
    path: str | os.PathLike,
    scheme: str = "BIO",
    *,
    strict: bool = False,
    encoding: str = "utf-8",
    limit: int | None = None,
) -> list[TaggedSentence]:
    """Read a CoNLL-2003 NER file: ``token POS chunk NER`` (whitespace-separated) a line, a blank line between
    sentences, ``-DOCSTART-`` lines skipped. The NER column is IOB1 as released; it is converted to ``scheme``
    (``"BIO"`` = IOB2, ``"BIOES"``, ``"BMES"`` or ``"IOB1"`` unchanged). The other columns are not kept.

    Raises:
        MissingFileError: no such file.
        DataError: ``FILE:LINE`` for a line that is not 4 columns (a token with no tag; a CoNLL-U file, which is named
            as such), a NER tag that is not IOB1, undecodable text.
        UsageError: an unknown ``scheme``, a bad ``limit``.

    ``limit``: read at most that many sentences (the readers all take it: a small slice for tests and trials).

    Source: the CoNLL-2003 shared task format (Tjong Kim Sang & De Meulder 2003)."""
    check_scheme("scheme", scheme)
    limit = _check_limit(limit)
    source, lines = _read_lines(path, encoding)
    out: list[TaggedSentence] = []
    repaired: list[tuple[int, str]] = []
    for block in _blocks(lines):
        if len(out) == limit:
            break
        tokens: list[str] = []
        tags: list[str] = []
        numbers: list[int] = []
        for number, text in block:
            cols = text.split()
            if cols[0] == "-DOCSTART-":
                continue
            if len(cols) != 4 or (cols[0] == "#" and cols[2] == "="):  # "# sent_id = 1": 4 columns, CoNLL-U
                if _looks_like_conllu(text):
                    raise DataError(
                        f"{source}:{number}: this looks like a CoNLL-U file (comment line or 10 tab-"
                        "separated columns): read it with read_conllu"
                    )
                what = f"token {cols[0]!r} has no tag" if len(cols) == 1 else f"{len(cols)} columns"
                raise DataError(
                    f"{source}:{number}: {what}; a CoNLL-2003 line is 4 whitespace-separated columns "
                    "(token POS chunk NER)"
                )
            tokens.append(cols[0])
            tags.append(cols[3])
            numbers.append(number)
        if tokens:
            tags = _retag(source, numbers, tags, "IOB1", scheme, strict, repaired)
            out.append(TaggedSentence(tuple(tokens), tuple(tags), source, numbers[0]))
    _report_repairs(source, "IOB1", repaired)
    if not out:
        raise DataError(f"{source}: no sentences (an empty file, or only -DOCSTART- lines)")
    return out


# ============================================================================================ CoNLL-U
def _raw_column(line: list[str], i: int) -> str:
    return line[i]


_CONLLU_FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")


def read_conllu(
    path: str | os.PathLike, field: str = "upos", *, encoding: str = "utf-8", limit: int | None = None
) -> list[TaggedSentence]:
    """Read a CoNLL-U file (Universal Dependencies) with the ``conllu`` package: tokens are the syntactic words'
    FORM, tags the column ``field`` (``"upos"``, ``"xpos"``, ``"deprel"``, …). Multiword-token ranges (``3-4``) and
    empty nodes (``5.1``) are skipped, so the tokens are the words UD tags.

    Raises:
        MissingFileError: no such file.
        DataError: ``FILE:LINE`` for a line that is not 10 tab-separated columns (a CoNLL-2003 file is named as
            such), a word whose ``field`` is empty or ``_`` (a token with no tag), a sentence of comments only,
            undecodable text.
        UsageError: ``field`` is not a CoNLL-U column name.

    Source: the CoNLL-U format, https://universaldependencies.org/format.html."""
    conllu = import_optional("conllu", "tasks", "reading CoNLL-U files")  # optional: conllu

    if field not in _CONLLU_FIELDS[1:]:
        raise UsageError(f"field must be a CoNLL-U column ({', '.join(_CONLLU_FIELDS[1:])}), got {field!r}")
    limit = _check_limit(limit)
    source, lines = _read_lines(path, encoding)
    # columns other than ID and the one asked for stay raw strings: parsing FEATS/DEPS/MISC was 35 % of the time
    raw_parsers = {name: _raw_column for name in ("lemma", "feats", "head", "deprel", "deps", "misc") if name != field}
    out: list[TaggedSentence] = []
    for block in _blocks(lines):
        if len(out) == limit:
            break
        words = [(n, t) for n, t in block if not t.startswith("#")]
        if not words:
            raise DataError(f"{source}:{block[0][0]}: a sentence of comment lines only (no word lines)")
        for number, text in words:
            cols = text.split("\t")
            if len(cols) != 10:
                hint = (
                    " — this looks like a CoNLL-2003 file: read it with read_conll2003"
                    if len(text.split()) == 4
                    else ""
                )
                raise DataError(
                    f"{source}:{number}: {len(cols)} tab-separated columns; a CoNLL-U word line has 10{hint}"
                )
        try:
            (sentence,) = conllu.parse("\n".join(t for _, t in block) + "\n\n", field_parsers=raw_parsers)
        except Exception as exc:  # conllu raises its own ParseException (and ValueError) for malformed fields
            raise DataError(
                f"{source}:{block[0][0]}: the sentence starting here is not valid CoNLL-U ({exc})"
            ) from None
        tokens: list[str] = []
        tags: list[str] = []
        first = None
        for (number, _), token in zip(words, sentence):
            if not isinstance(token["id"], int):  # (3, '-', 4) multiword range, (5, '.', 1) empty node
                continue
            tag = token[field]
            if tag is None or tag == "_" or (isinstance(tag, str) and not tag.strip()):
                raise DataError(f"{source}:{number}: word {token['form']!r} has no {field} (token with no tag)")
            tokens.append(token["form"])
            tags.append(str(tag))
            first = number if first is None else first
        if tokens:
            out.append(TaggedSentence(tuple(tokens), tuple(tags), source, first))
    if not out:
        raise DataError(f"{source}: no sentences")
    return out


# ============================================================================================ Chinese NER
_POSITION = re.compile(r"^(.+?)(\d+)$")


def _weibo_char(token: str) -> str | None:
    """A Weibo NER ``weiboNER_2nd_conll`` token ``CHAR<position in its gold word>`` → CHAR, or ``None`` when it is
    not of that form. The position may have several digits (``p10``) and CHAR may be a digit (``310`` is ``3`` at
    position 10); an emoji the file's maker could not encode is two U+FFFD, read as one U+FFFD."""
    if len(token) >= 2 and token[1:].isdigit():
        return token[0]
    m = _POSITION.match(token)
    if m and set(m.group(1)) == {"\ufffd"}:
        return "\ufffd"
    return None


def _char_ner_columns(source: str, number: int, text: str) -> tuple[str, str]:
    """A character NER line's ``(token, tag)``; :class:`DataError` (``FILE:LINE``) for any other number of columns."""
    cols = text.split()
    if len(cols) != 2:
        what = f"token {cols[0]!r} has no tag" if len(cols) == 1 else f"{len(cols)} columns"
        raise DataError(
            f"{source}:{number}: {what}; a character NER line is CHAR and TAG separated by a tab or a space"
        )
    return cols[0], cols[1]


def _char_of(source: str, number: int, token: str, positions: bool) -> str:
    """The character of a token: ``科0`` → ``科`` when the file's tokens carry positions (weiboNER_2nd_conll), the
    token itself otherwise; :class:`DataError` (``FILE:LINE``) for a token of another form."""
    if positions:
        char = _weibo_char(token)
        if char is None:
            raise DataError(
                f"{source}:{number}: token {token!r} is not CHARACTER+position digits as the "
                "file's first token is (weiboNER_2nd_conll format)"
            )
        return char
    if len(token) != 1:
        raise DataError(
            f"{source}:{number}: token {token!r} is {len(token)} characters; a character NER file "
            "has one character a line"
        )
    return token


def _char_ner_blocks(source: str, lines: list[str], limit: int | None) -> list[tuple[list[int], list[str], list[str]]]:
    """The file's sentences (at most ``limit``) as ``(line numbers, characters, tags)``; whether tokens carry
    positions is decided by the file's first token."""
    raw: list[tuple[list[int], list[str], list[str]]] = []
    positions: bool | None = None
    for block in _blocks(lines):
        if len(raw) == limit:
            break
        numbers, chars, tags = [], [], []
        for number, text in block:
            token, tag = _char_ner_columns(source, number, text)
            if positions is None:
                positions = len(token) > 1 and _weibo_char(token) is not None
            numbers.append(number)
            chars.append(_char_of(source, number, token, positions))
            tags.append(tag)
        raw.append((numbers, chars, tags))
    return raw


def _detect_char_ner_scheme(source: str, raw: list[tuple[list[int], list[str], list[str]]]) -> str:
    """The source scheme from the tags (:func:`detect_scheme`), after checking each is ``O`` or ``X-TYPE``."""
    for numbers, _, tags in raw:
        for number, tag in zip(numbers, tags):
            if tag != "O" and not (len(tag) > 2 and tag[0] in "BIMES" and tag[1] == "-"):
                raise DataError(
                    f"{source}:{number}: tag {tag!r} is not a BIO, BIOES or BMES tag (expected O or B-/I-/M-/E-/S-TYPE)"
                )
    try:
        return detect_scheme(t for _, _, tags in raw for t in tags)
    except DataError as exc:
        raise DataError(f"{source}: {exc}; pass source_scheme=") from None


def read_char_ner(
    path: str | os.PathLike,
    scheme: str = "BIO",
    *,
    source_scheme: str = "auto",
    strict: bool = False,
    encoding: str = "utf-8",
    limit: int | None = None,
) -> list[TaggedSentence]:
    """Read a Chinese character-level NER file: ``CHAR<TAB or space>TAG`` a line, a blank line between sentences —
    Weibo NER (``weiboNER_2nd_conll.*`` and ``weiboNER.conll.*``, BIO), Resume NER (``*.char.bmes``, BMES), MSRA
    (``dh_msra.zip``: a ``.zip`` holding one file is read directly, BIO). One token per character.

    In ``weiboNER_2nd_conll`` each character carries its position inside its gold word (``科0 技1``): when the
    file's first token has that form, the trailing digits are stripped from every token (then each must have the
    form). The source scheme is detected from the file's tag prefixes (``source_scheme="auto"``, see
    :func:`detect_scheme`) or given; tags are converted to ``scheme``. Invalid transitions: see :mod:`.tag_schemes`.

    Raises:
        MissingFileError: no such file.
        DataError: ``FILE:LINE`` for a line that is not two columns (a token with no tag), a token of more than one
            character, a tag not of the scheme, undecodable text.
        UsageError: an unknown scheme."""
    check_scheme("scheme", scheme)
    if source_scheme != "auto":
        check_scheme("source_scheme", source_scheme)
    limit = _check_limit(limit)
    source, lines = _read_lines(path, encoding)
    raw = _char_ner_blocks(source, lines, limit)
    if not raw:
        raise DataError(f"{source}: no sentences")
    if source_scheme == "auto":
        source_scheme = _detect_char_ner_scheme(source, raw)
    out: list[TaggedSentence] = []
    repaired: list[tuple[int, str]] = []
    for numbers, chars, tags in raw:
        tags = _retag(source, numbers, tags, source_scheme, scheme, strict, repaired)
        out.append(TaggedSentence(tuple(chars), tuple(tags), source, numbers[0]))
    _report_repairs(source, source_scheme, repaired)
    return out


# ============================================================================================ classification
_FORMATS = ("auto", "tsv", "space", "trec")
_TREC = re.compile(r"^([A-Z]+):(\S+)$")


def read_labelled(
    path: str | os.PathLike,
    format: str = "auto",
    *,
    encoding: str = "utf-8",
    empty: str = "error",
    trec_fine: bool = False,
    limit: int | None = None,
) -> list[LabelledSentence]:
    """Read a sentence-classification file, one example a line; tokens are split on whitespace. ``format``:

    * ``"tsv"``: ``label<TAB>sentence``;
    * ``"space"``: ``label sentence`` — the label is the first whitespace token: SST (``stsa.binary.*``,
      ``stsa.fine.*``) and the ``*.all`` files of ``sentence-classification`` (MR ``rt-polarity.all``, ``subj.all``,
      ``custrev.all``, ``mpqa.all``, and ``TREC.*.all``, whose labels there are the numbers 0–5);
    * ``"trec"``: the original TREC ``COARSE:fine question`` — the label is COARSE (``trec_fine=True``:
      ``COARSE:fine``);
    * ``"auto"`` (default): from the first non-blank line — a tab → ``tsv``; a first token ``COARSE:fine`` →
      ``trec``; else ``space``.

    Blank lines are skipped. A label with no sentence (``custrev.all`` has 4 such lines, ``mpqa.all`` 3) raises with
    ``empty="error"`` (default); ``empty="skip"`` leaves them out and logs their lines. ``rt-polarity.all``,
    ``subj.all`` and ``TREC.train.all`` are not UTF-8: pass ``encoding="latin-1"``.

    Raises:
        MissingFileError: no such file.
        DataError: ``FILE:LINE`` for an empty sentence, a tsv line without a tab, a trec line whose first token is
            not ``COARSE:fine``, undecodable text, a file with no examples.
        UsageError: an unknown ``format`` / ``empty``."""
    if format not in _FORMATS:
        raise UsageError(f"format must be one of {', '.join(_FORMATS)}, got {format!r}")
    if empty not in ("error", "skip"):
        raise UsageError(f"empty must be 'error' or 'skip', got {empty!r}")
    limit = _check_limit(limit)
    source, lines = _read_lines(path, encoding)
    out: list[LabelledSentence] = []
    skipped: list[int] = []
    for number, text in enumerate(lines, 1):
        if len(out) == limit:
            break
        if not text.strip():
            continue
        if format == "auto":
            first = text.split(None, 1)[0]
            format = "tsv" if "\t" in text.strip() else ("trec" if _TREC.match(first) else "space")
        if format == "tsv":
            if "\t" not in text:
                raise DataError(f"{source}:{number}: no tab; a tsv classification line is label<TAB>sentence")
            label, sentence = text.split("\t", 1)
            label = label.strip()
            if not label:
                raise DataError(f"{source}:{number}: empty label before the tab")
        else:
            parts = text.split(None, 1)
            label, sentence = parts[0], (parts[1] if len(parts) == 2 else "")
            if format == "trec":
                m = _TREC.match(label)
                if not m:
                    raise DataError(f"{source}:{number}: first token {label!r} is not a TREC COARSE:fine label")
                label = label if trec_fine else m.group(1)
        tokens = tuple(sentence.split())
        if not tokens:
            if empty == "skip":
                skipped.append(number)
                continue
            raise DataError(
                f"{source}:{number}: label {label!r} with an empty sentence; remove the line or read with empty='skip'"
            )
        out.append(LabelledSentence(tokens, label, source, number))
    if skipped:
        logger.warning(
            "%s: skipped %d line%s with a label and no sentence: %s",
            source,
            len(skipped),
            "" if len(skipped) == 1 else "s",
            ", ".join(map(str, skipped)),
        )
    if not out:
        raise DataError(f"{source}: no examples")
    return out


# ============================================================================================ label sets
def label_set(sentences: Iterable[TaggedSentence | LabelledSentence]) -> list[str]:
    """The labels (of :class:`LabelledSentence`) or tags (of :class:`TaggedSentence`) that occur, sorted (Python
    string order: deterministic whatever the input order)."""
    seen: Counter[str] = Counter()
    for s in sentences:
        if isinstance(s, LabelledSentence):
            seen[s.label] += 1
        elif isinstance(s, TaggedSentence):
            seen.update(s.tags)
        else:
            raise UsageError(f"label_set expects TaggedSentence or LabelledSentence items, got {type(s).__name__}")
    return sorted(seen)
