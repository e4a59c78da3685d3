"""A word's occurrences in tokenised sentences and their contextual vectors per layer (what
:mod:`elmokit.analysis.polysemy` and :mod:`elmokit.analysis.senses` compare).

**Matching a word in a sentence** (:func:`find_spans`). A match is a run of consecutive tokens ``tokens[i:j]``:

* ``"token"``: one token equal to the word (``j = i + 1``): English, or Chinese text segmented into words (the zoo's
  ``elmokit-zh`` is fed jieba words; 苹果 inside the token 苹果手机 is *not* a match — it is another word);
* ``"span"``: consecutive tokens whose concatenation is the word, e.g. the characters 苹 果 of per-character input;
  a token is never cut, so a span is always aligned with token boundaries;
* ``"auto"`` (default): ``"span"`` for a word holding a CJK character (a one-token match is a span of length 1),
  ``"token"`` otherwise (so ``bank`` never matches ``ba`` + ``nk``).

Matches are taken left to right without overlap. The vector of a span is the **mean of its tokens' vectors**, in each
layer separately (for per-character input: the mean of the word's characters' vectors); for a one-token match it is
that token's vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from elmokit.data.text_checks import is_cjk
from elmokit.errors import UsageError

__all__ = ["MATCH_MODES", "Occurrence", "find_spans", "find_occurrences", "context_window", "occurrence_vectors"]

MATCH_MODES = ("auto", "token", "span")


def _check_word(word: object) -> str:
    if not isinstance(word, str) or not word or word != word.strip() or len(word.split()) != 1:
        raise UsageError(f"the word must be a non-empty string without whitespace, got {word!r}")
    return word


def find_spans(tokens: Sequence[str], word: str, match: str = "auto") -> list[tuple[int, int]]:
    """Where ``word`` occurs in one tokenised sentence: ``[(start, end), ...]`` token positions, ``end`` exclusive,
    left to right, non-overlapping (see the module docstring for the ``match`` modes).

    Raises:
        UsageError: an empty word or one holding whitespace; an unknown ``match``."""
    _check_word(word)
    if match not in MATCH_MODES:
        raise UsageError(f"match must be one of {MATCH_MODES}, got {match!r}")
    if match == "auto":
        match = "span" if is_cjk(word) else "token"
    spans: list[tuple[int, int]] = []
    if match == "token":
        return [(i, i + 1) for i, t in enumerate(tokens) if t == word]
    i, n = 0, len(tokens)
    while i < n:
        if word.startswith(tokens[i]) and tokens[i]:
            text, j = tokens[i], i + 1
            while len(text) < len(word) and j < n and word.startswith(text + tokens[j]):
                text += tokens[j]
                j += 1
            if text == word:
                spans.append((i, j))
                i = j
                continue
        i += 1
    return spans


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of the word: ``sentence`` (0-based index into the sentence list), token span
    ``[start, end)``, and an optional ``label`` (a sense, a category)."""

    sentence: int
    start: int
    end: int
    label: str | None = None


def find_occurrences(
    sentences: Sequence[Sequence[str]], word: str, match: str = "auto", labels: Sequence[str | None] | None = None
) -> list[Occurrence]:
    """Every occurrence of ``word`` in ``sentences`` (lists of tokens), in order; ``labels[i]`` (if given) is the
    label of every occurrence in sentence i.

    Raises:
        UsageError: a bad word or ``match`` (see :func:`find_spans`), or ``labels`` not lined up with ``sentences``."""
    if labels is not None and len(labels) != len(sentences):
        raise UsageError(f"labels holds {len(labels)} entries for {len(sentences)} sentences: give one per sentence")
    out = []
    for i, tokens in enumerate(sentences):
        for s, e in find_spans(tokens, word, match):
            out.append(Occurrence(i, s, e, None if labels is None else labels[i]))
    return out


def context_window(tokens: Sequence[str], start: int, end: int, context: int | None) -> tuple[list[str], int, int]:
    """Cut a sentence to at most ``context`` tokens on each side of the span ``[start, end)``.

    Returns ``(tokens', start', end')`` with the span's new positions; ``context=None`` keeps the whole sentence.

    Raises:
        UsageError: a negative ``context`` or a span outside the sentence."""
    if not 0 <= start < end <= len(tokens):
        raise UsageError(f"span [{start}, {end}) is outside a sentence of {len(tokens)} tokens")
    if context is None:
        return list(tokens), start, end
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise UsageError(f"context must be an int >= 0 or None, got {context!r}")
    a = max(0, start - context)
    b = min(len(tokens), end + context)
    return list(tokens[a:b]), start - a, end - a


def occurrence_vectors(
    embedder,
    sentences: Sequence[Sequence[str]],
    occurrences: Sequence[Occurrence],
    *,
    context: int | None = None,
    batch_size: int | None = None,
) -> np.ndarray:
    """Contextual vectors of each occurrence in every layer.

    Args:
        embedder: an :class:`~elmokit.Embedder`.
        sentences: token lists; ``occurrences`` index into them.
        context: cut each occurrence's sentence to at most this many tokens on each side of it before embedding
            (:func:`context_window`; bounds the cost of long sentences; ``None``: the whole sentence). Identical
            inputs are embedded once.
        batch_size: sentences per forward pass (default: the embedder's).

    Returns:
        (N, L+1, 2P) float32: for occurrence n and layer k the mean of layer k's vectors over the span's tokens.
        Layer 0 is the context-free token layer ([x; x], as the biLM gives it).

    Raises:
        UsageError: an occurrence outside its sentence. InputError: from the embedder (malformed tokens).
    """
    keys: dict[tuple[str, ...], int] = {}
    plan: list[list[tuple[int, int, int]]] = []
    for n, occ in enumerate(occurrences):
        if not 0 <= occ.sentence < len(sentences):
            raise UsageError(f"occurrence {n} names sentence {occ.sentence}; there are {len(sentences)}")
        toks, s, e = context_window(sentences[occ.sentence], occ.start, occ.end, context)
        key = tuple(toks)
        idx = keys.setdefault(key, len(keys))
        if idx == len(plan):
            plan.append([])
        plan[idx].append((n, s, e))
    out = np.zeros((len(occurrences), embedder.num_layers, embedder.output_dim), dtype=np.float32)
    for idx, arr in enumerate(embedder.embed_sentences(list(keys), batch_size)):
        for n, s, e in plan[idx]:
            out[n] = arr[:, s:e].mean(axis=1)
    return out
