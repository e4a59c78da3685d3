"""Tag schemes of the tagging tasks: conversion between them (through entity spans) and checking.

Tag schemes (``PREFIX-TYPE`` or ``O``; the type may hold dots or hyphens, e.g. ``B-PER.NAM``):

* ``IOB1`` (CoNLL-2003 as released): ``I-X`` inside an entity; ``B-X`` only where an entity follows another of the
  same type directly.
* ``BIO`` (= IOB2): every entity starts with ``B-X``, continues with ``I-X``.
* ``BIOES``: ``B-X I-X … E-X`` for entities of two or more tokens, ``S-X`` for one token.
* ``BMES``: BIOES with ``M-`` for ``I-`` (Resume NER, Zhang & Yang 2018).

**Invalid sequences** (decided here): an IOB1 file is valid by definition (an ``I-X`` after ``O`` or another type
starts an entity: that is what IOB1 means). In BIO/BIOES/BMES an ``I-X`` (``M-X``/``E-X``) that does not continue an
open ``X`` entity, or an entity left open (``B-X`` not closed by ``E-X`` in BIOES/BMES), is invalid. The readers
*repair* it by default, the way conlleval and seqeval's default mode read it — the stray ``I-X`` starts a new entity,
an open entity ends at the last token before the next entity or ``O`` — and log one warning per file naming the first
such line and the count (the released Weibo NER train and test files hold 10 and 4 such transitions, MSRA 17, Resume
train 4, so refusing them would make the standard data unreadable). ``strict=True`` refuses them instead: a
:class:`TagSequenceError` naming the file and line. :func:`check_tags` is the strict check on a plain tag list.

Source: the IOB1/IOB2/IOBES definitions of Tjong Kim Sang & Veenstra (1999) and Ratinov & Roth (2009); chunk
boundaries as in the conlleval script.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from elmokit.errors import DataError, UsageError

__all__ = [
    "SCHEMES",
    "TagSequenceError",
    "convert_tags",
    "check_tags",
    "tag_spans",
    "spans_to_tags",
    "detect_scheme",
    "check_scheme",
    "decode_tags",
]

#: The tag schemes :func:`convert_tags` reads and writes.
SCHEMES = ("IOB1", "BIO", "BIOES", "BMES")
_PREFIXES = {"IOB1": "BI", "BIO": "BI", "BIOES": "BIES", "BMES": "BMES"}


class TagSequenceError(DataError):
    """A tag that is not of the scheme, or an invalid transition (with ``strict``). ``position`` is the 0-based index
    of the offending tag in its sentence (the readers turn it into a file line)."""

    def __init__(self, detail: str, position: int, prefix: str | None = None) -> None:
        super().__init__(f"{prefix}: {detail}" if prefix is not None else f"position {position}: {detail}")
        self.detail = detail
        self.position = position


def check_scheme(name: str, scheme: str) -> str:
    """``scheme`` if it is one of :data:`SCHEMES`; else :class:`UsageError` naming the option ``name``."""
    if scheme not in SCHEMES:
        raise UsageError(f"{name} must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    return scheme


def _split_tag(tag: str, scheme: str, position: int) -> tuple[str, str | None]:
    """``'B-PER'`` → ``('B', 'PER')``; ``'O'`` → ``('O', None)``. Raises :class:`TagSequenceError` for a tag that is
    not of ``scheme``."""
    if tag == "O":
        return "O", None
    if not isinstance(tag, str) or len(tag) < 3 or tag[1] != "-" or tag[0] not in _PREFIXES[scheme]:
        allowed = ", ".join(f"{p}-TYPE" for p in _PREFIXES[scheme])
        raise TagSequenceError(f"tag {tag!r} is not a {scheme} tag (expected O, {allowed})", position)
    return tag[0], tag[2:]


def decode_tags(tags: Sequence[str], scheme: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """Tags → entity spans ``(start, end exclusive, type)`` and the invalid transitions ``(position, reason)`` found
    (repaired in the spans as conlleval reads them; see the module docstring)."""
    spans: list[tuple[int, int, str]] = []
    problems: list[tuple[int, str]] = []
    open_start, open_type = -1, None
    prev = "O"

    def close(end: int) -> None:
        nonlocal open_start, open_type
        if open_type is not None:
            spans.append((open_start, end, open_type))
        open_start, open_type = -1, None

    single_inner = "I" if scheme != "BMES" else "M"
    for i, tag in enumerate(tags):
        p, t = _split_tag(tag, scheme, i)
        if scheme in ("IOB1", "BIO"):
            if p == "O":
                close(i)
            elif p == "B":
                close(i)
                open_start, open_type = i, t
            elif open_type == t:  # I-X continuing an X entity
                pass
            else:
                if scheme == "BIO":
                    problems.append((i, f"{tag} after {prev} (an I- tag must continue an entity of its type)"))
                close(i)
                open_start, open_type = i, t
        else:  # BIOES / BMES
            if open_type is not None and p in ("O", "B", "S"):
                problems.append(
                    (
                        i,
                        f"{tag} after {prev} (the {open_type} entity begun at position {open_start} is "
                        f"not closed with E-{open_type})",
                    )
                )
                close(i)
            if p == "O":
                pass
            elif p == "B":
                open_start, open_type = i, t
            elif p == "S":
                spans.append((i, i + 1, t))
            elif p == single_inner:
                if open_type != t:
                    problems.append((i, f"{tag} after {prev} (an {p}- tag must continue an entity of its type)"))
                    close(i)
                    open_start, open_type = i, t
            else:  # E
                if open_type != t:
                    problems.append((i, f"{tag} after {prev} (an E- tag must close an entity of its type)"))
                    close(i)
                    open_start, open_type = i, t
                close(i + 1)
        prev = tag
    if open_type is not None and scheme in ("BIOES", "BMES"):
        problems.append(
            (
                len(tags) - 1,
                f"the sentence ends inside the {open_type} entity begun at position "
                f"{open_start} (not closed with E-{open_type})",
            )
        )
    close(len(tags))
    return spans, problems


def tag_spans(tags: Sequence[str], scheme: str = "BIO", *, strict: bool = False) -> list[tuple[int, int, str]]:
    """The entities of a tag sequence as ``(start, end exclusive, type)``, in order.

    Invalid transitions are read as conlleval reads them (``strict=False``) or raise :class:`TagSequenceError`
    (``strict=True``). Raises :class:`TagSequenceError` for a tag not of ``scheme``, :class:`UsageError` for an
    unknown scheme."""
    check_scheme("scheme", scheme)
    spans, problems = decode_tags(list(tags), scheme)
    if strict and problems:
        pos, reason = problems[0]
        raise TagSequenceError(f"invalid {scheme} sequence: {reason}", pos)
    return spans


def spans_to_tags(spans: Iterable[tuple[int, int, str]], length: int, scheme: str = "BIO") -> list[str]:
    """Entity spans (``(start, end exclusive, type)``, not overlapping) → ``length`` tags in ``scheme``. In IOB1 an
    entity starts with ``B-`` only when it directly follows an entity of the same type."""
    check_scheme("scheme", scheme)
    out = ["O"] * length
    last_end, last_type = -1, None
    for start, end, t in sorted(spans):
        if not (0 <= start < end <= length) or start < last_end:
            raise UsageError(f"entity span ({start}, {end}, {t!r}) is outside 0..{length} or overlaps the previous one")
        n = end - start
        if scheme == "IOB1":
            first = "B" if (start == last_end and t == last_type) else "I"
            out[start:end] = [f"{first}-{t}"] + [f"I-{t}"] * (n - 1)
        elif scheme == "BIO":
            out[start:end] = [f"B-{t}"] + [f"I-{t}"] * (n - 1)
        else:
            inner = "I" if scheme == "BIOES" else "M"
            out[start:end] = [f"S-{t}"] if n == 1 else [f"B-{t}"] + [f"{inner}-{t}"] * (n - 2) + [f"E-{t}"]
        last_end, last_type = end, t
    return out


def convert_tags(tags: Sequence[str], source_scheme: str, target_scheme: str, *, strict: bool = False) -> list[str]:
    """Re-tag a sequence from one scheme to another (IOB1, BIO, BIOES, BMES) through its entity spans, so the
    entities are unchanged: e.g. IOB1 ``I-PER I-PER B-PER O`` → BIO ``B-PER I-PER B-PER O`` → BIOES
    ``B-PER E-PER S-PER O``.

    Invalid transitions in the source (see the module docstring) are repaired as conlleval reads them, or raise
    :class:`TagSequenceError` with ``strict=True``. Raises :class:`TagSequenceError` for a tag not of
    ``source_scheme``, :class:`UsageError` for an unknown scheme.

    Source: the IOB1/IOB2/IOBES definitions of Tjong Kim Sang & Veenstra (1999) and Ratinov & Roth (2009); chunk
    boundaries as in the conlleval script."""
    check_scheme("source_scheme", source_scheme)
    check_scheme("target_scheme", target_scheme)
    tags = list(tags)
    return spans_to_tags(tag_spans(tags, source_scheme, strict=strict), len(tags), target_scheme)


def check_tags(tags: Sequence[str], scheme: str = "BIO") -> None:
    """Raise :class:`TagSequenceError` (a :class:`DataError`) when ``tags`` is not a valid ``scheme`` sequence: a tag
    of another scheme, or (BIO/BIOES/BMES) an ``I-``/``M-``/``E-`` tag that does not continue an entity of its type, or
    (BIOES/BMES) an entity not closed by ``E-``. IOB1 sequences are valid whenever their tags are IOB1 tags. The
    message gives the 0-based position (``.position``)."""
    tag_spans(tags, scheme, strict=True)


def detect_scheme(tags: Iterable[str]) -> str:
    """The scheme of a file's tags from the prefixes that occur: only B/I → ``BIO``; M without I → ``BMES``; I with
    E or S → ``BIOES``; only B/E/S → ``BIOES``. Raises :class:`DataError` for a mix (I and M) or another prefix."""
    prefixes = {t[0] for t in tags if t != "O"}
    if prefixes <= {"B", "I"}:
        return "BIO"
    if prefixes <= set("BMES"):
        return "BMES" if "M" in prefixes else "BIOES"
    if prefixes <= set("BIES"):
        return "BIOES"
    raise DataError(f"the tags use the prefixes {', '.join(sorted(prefixes))}: not one of BIO, BIOES, BMES")
