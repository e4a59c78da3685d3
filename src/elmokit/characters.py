"""Tokens → character ids.

Two schemes share one id layout, where **0 is padding** ("no token here", a zero embedding row that is not a
parameter) and every other id has a learned embedding row:

* the original **UTF-8 byte scheme** (bilm-tf ``UnicodeCharsVocabulary`` / AllenNLP ``ELMoCharacterMapper``):
  a token is its UTF-8 bytes, truncated to ``max_characters_per_token - 2`` bytes, laid out as
  ``[begin-of-word, bytes…, end-of-word, pad, pad, …]``. The original's raw ids are bytes 0–255, ``<S>`` 256,
  ``</S>`` 257, begin-of-word 258, end-of-word 259, in-word pad 260; at inference every id is shifted by +1 so
  that 0 can mean padding, exactly as AllenNLP's ``batch_to_ids`` does. Ids here are the shifted ones (1…261).
* a **character-vocabulary scheme** (:class:`CharVocabulary`) for scripts where a character is several bytes
  (a Chinese character is 3 UTF-8 bytes, so the byte scheme keeps only 16 of them): one id per character from a
  vocabulary built on a corpus, with the same specials.

Sentence boundaries ``<S>``/``</S>`` are added by the model (:class:`elmokit.modules.bilm.BiLM`), not here.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from .errors import InputError

__all__ = [
    "ByteCharacterMapper",
    "CharVocabulary",
    "batch_to_ids",
    "validate_sentences",
    "boundary_char_ids",
    "BOS_TOKEN",
    "EOS_TOKEN",
]

logger = logging.getLogger(__name__)

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"

# Raw (unshifted) ids of the original byte scheme.
_RAW_BOS_CHAR = 256
_RAW_EOS_CHAR = 257
_RAW_BOW = 258
_RAW_EOW = 259
_RAW_PAD = 260


class ByteCharacterMapper:
    """The original UTF-8 byte scheme, ids shifted by +1 (0 = padding).

    Args:
        max_characters_per_token: C, positions per token (50 in every released model). Tokens longer than
            ``C - 2`` UTF-8 bytes are truncated, as in the original.
        on_long_token: ``"truncate"`` (original behaviour) or ``"error"`` (raise :class:`InputError`).

    Source: bilm-tf ``UnicodeCharsVocabulary._convert_word_to_char_ids``; AllenNLP ``ELMoCharacterMapper``.
    """

    #: Number of embedding rows including the zero padding row (261 learned + 1).
    vocab_size = 262
    padding_id = 0
    bos_char = _RAW_BOS_CHAR + 1
    eos_char = _RAW_EOS_CHAR + 1
    bow_char = _RAW_BOW + 1
    eow_char = _RAW_EOW + 1
    pad_char = _RAW_PAD + 1

    def __init__(self, max_characters_per_token: int = 50, on_long_token: str = "truncate") -> None:
        if max_characters_per_token < 3:
            raise ValueError(f"max_characters_per_token must be >= 3, got {max_characters_per_token}")
        if on_long_token not in ("truncate", "error"):
            raise ValueError(f"on_long_token must be 'truncate' or 'error', got {on_long_token!r}")
        self.max_characters_per_token = max_characters_per_token
        self.on_long_token = on_long_token
        self._cache: dict[str, list[int]] = {}
        c = max_characters_per_token
        self._bos_row = self._boundary_row(self.bos_char)
        self._eos_row = self._boundary_row(self.eos_char)
        assert len(self._bos_row) == c

    def _boundary_row(self, char: int) -> list[int]:
        c = self.max_characters_per_token
        return [self.bow_char, char, self.eow_char] + [self.pad_char] * (c - 3)

    def boundary_ids(self) -> tuple[list[int], list[int]]:
        """The ``<S>`` and ``</S>`` rows, each a list of C shifted ids."""
        return list(self._bos_row), list(self._eos_row)

    def token_to_ids(self, token: str) -> list[int]:
        """One token → C shifted ids. ``"<S>"``/``"</S>"`` map to the boundary rows, as in the original.

        Undecodable characters (lone surrogates) are dropped, as the original's ``encode('utf-8', 'ignore')``.
        Raises :class:`InputError` for an over-long token when ``on_long_token="error"``.
        """
        ids = self._cache.get(token)
        if ids is not None:
            return ids
        if token == BOS_TOKEN:
            ids = self._bos_row
        elif token == EOS_TOKEN:
            ids = self._eos_row
        else:
            c = self.max_characters_per_token
            data = token.encode("utf-8", "ignore")
            if len(data) > c - 2:
                if self.on_long_token == "error":
                    raise InputError(
                        f"token {token[:20]!r}… is {len(data)} UTF-8 bytes; at most {c - 2} fit in "
                        f"max_characters_per_token={c}"
                    )
                data = data[: c - 2]
            ids = [self.bow_char] + [b + 1 for b in data] + [self.eow_char]
            ids += [self.pad_char] * (c - len(ids))
        if len(self._cache) < 200_000:
            self._cache[token] = ids
        return ids


class CharVocabulary:
    """A character vocabulary (one id per Unicode character), for CJK and other multi-byte scripts.

    Ids: 0 padding (not a parameter), 1 ``<S>``-char, 2 ``</S>``-char, 3 begin-of-word, 4 end-of-word,
    5 in-word pad, 6 unknown character, then the characters in file order. A token is
    ``[begin-of-word, chars…, end-of-word, pad…]`` like the byte scheme, truncated to ``C - 2`` characters
    (not bytes), so a 20-character Chinese token keeps all 20 when C ≥ 22.

    The file format is one character per line (UTF-8), the specials implicit. ``vocab_size`` (rows including the
    padding row) is what ``CharCNNConfig.char_vocab_size`` must hold.
    """

    padding_id = 0
    bos_char = 1
    eos_char = 2
    bow_char = 3
    eow_char = 4
    pad_char = 5
    unk_char = 6
    n_specials = 7

    def __init__(self, characters: Sequence[str], max_characters_per_token: int = 50,
                 on_long_token: str = "truncate") -> None:
        seen: dict[str, int] = {}
        for i, ch in enumerate(characters):
            if len(ch) != 1:
                raise ValueError(f"character vocabulary entry {i} is {ch!r}: expected exactly one character")
            if ch in seen:
                raise ValueError(f"character vocabulary entry {i} {ch!r} duplicates entry {seen[ch]}")
            seen[ch] = i
        if max_characters_per_token < 3:
            raise ValueError(f"max_characters_per_token must be >= 3, got {max_characters_per_token}")
        if on_long_token not in ("truncate", "error"):
            raise ValueError(f"on_long_token must be 'truncate' or 'error', got {on_long_token!r}")
        self.characters = list(characters)
        self._index = {ch: i + self.n_specials for i, ch in enumerate(self.characters)}
        self.max_characters_per_token = max_characters_per_token
        self.on_long_token = on_long_token
        c = max_characters_per_token
        self._bos_row = [self.bow_char, self.bos_char, self.eow_char] + [self.pad_char] * (c - 3)
        self._eos_row = [self.bow_char, self.eos_char, self.eow_char] + [self.pad_char] * (c - 3)

    @property
    def vocab_size(self) -> int:
        """Embedding rows including the zero padding row."""
        return self.n_specials + len(self.characters)

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None,
              max_characters_per_token: int = 50) -> "CharVocabulary":
        """Count characters over tokenised sentences; keep those seen ``min_count`` times, most frequent first
        (ties by first occurrence), at most ``max_size``."""
        counts: Counter[str] = Counter()
        for sentence in sentences:
            for token in sentence:
                counts.update(token)
        chars = [ch for ch, n in counts.most_common() if n >= min_count]
        if max_size is not None:
            chars = chars[:max_size]
        return cls(chars, max_characters_per_token=max_characters_per_token)

    @classmethod
    def from_file(cls, path: str | os.PathLike, max_characters_per_token: int = 50) -> "CharVocabulary":
        """Read one character per line (UTF-8). Raises FileNotFoundError / ValueError naming the line."""
        lines = Path(path).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls(lines, max_characters_per_token=max_characters_per_token)

    def save(self, path: str | os.PathLike) -> None:
        """Write one character per line, atomically."""
        from .io import atomic_write_text

        atomic_write_text(path, "".join(ch + "\n" for ch in self.characters))

    def boundary_ids(self) -> tuple[list[int], list[int]]:
        """The ``<S>`` and ``</S>`` rows, each a list of C ids."""
        return list(self._bos_row), list(self._eos_row)

    def token_to_ids(self, token: str) -> list[int]:
        """One token → C ids; unknown characters map to :attr:`unk_char`."""
        if token == BOS_TOKEN:
            return self._bos_row
        if token == EOS_TOKEN:
            return self._eos_row
        c = self.max_characters_per_token
        if len(token) > c - 2:
            if self.on_long_token == "error":
                raise InputError(f"token {token[:20]!r}… has {len(token)} characters; at most {c - 2} fit")
            token = token[: c - 2]
        ids = [self.bow_char] + [self._index.get(ch, self.unk_char) for ch in token] + [self.eow_char]
        return ids + [self.pad_char] * (c - len(ids))


def validate_sentences(sentences: object) -> list[Sequence[str]]:
    """Check that ``sentences`` is a list of sentences, each a list of ``str`` tokens.

    Returns the sentences as a list. Empty sentences and an empty batch are allowed (they give zero-length rows).

    Raises:
        TypeError: a string, a flat list of strings, or a non-string token (the message says where).
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            "expected a list of sentences (each a list of token strings), got a single string; "
            "tokenise it and wrap it: [text.split()]"
        )
    if not isinstance(sentences, Sequence):
        if isinstance(sentences, Iterable):
            sentences = list(sentences)
        else:
            raise TypeError(f"expected a list of sentences (list of lists of str), got {type(sentences).__name__}")
    out = []
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            raise TypeError(
                f"expected a list of sentences (list of lists of str), but element {i} is the string {sentence[:30]!r}: "
                "a flat list of tokens is one sentence — wrap it: [tokens]"
            )
        if not isinstance(sentence, Sequence):
            raise TypeError(f"sentence {i} is a {type(sentence).__name__}; expected a list of str tokens")
        for j, token in enumerate(sentence):
            if not isinstance(token, str):
                raise TypeError(f"sentence {i}, token {j} is a {type(token).__name__} ({token!r}); tokens must be str")
        out.append(sentence)
    return out


def batch_to_ids(
    sentences: Sequence[Sequence[str]],
    max_characters_per_token: int = 50,
    *,
    char_vocab: CharVocabulary | None = None,
    on_long_token: str = "truncate",
) -> torch.Tensor:
    """Convert tokenised sentences to character ids, as AllenNLP's ``batch_to_ids``.

    Args:
        sentences: B sentences, each a list of token strings (may be empty).
        max_characters_per_token: C (50 for every released model); ignored when ``char_vocab`` is given (its own).
        char_vocab: use the character-vocabulary scheme instead of UTF-8 bytes.
        on_long_token: ``"truncate"`` (original) or ``"error"``.

    Returns:
        LongTensor (B, T, C), T = longest sentence; ids shifted so that 0 = padding (rows past a sentence's end are
        all zero). Boundary tokens are **not** added (the model adds them). An empty batch gives shape (0, 0, C).

    Raises:
        TypeError: malformed input (a string, a flat list of strings, non-string tokens).
        InputError: an over-long token with ``on_long_token="error"``.
    """
    sentences = validate_sentences(sentences)
    if char_vocab is not None:
        mapper: ByteCharacterMapper | CharVocabulary = char_vocab
        max_characters_per_token = char_vocab.max_characters_per_token
    else:
        mapper = _byte_mapper(max_characters_per_token, on_long_token)
    b = len(sentences)
    t = max((len(s) for s in sentences), default=0)
    out = torch.zeros((b, t, max_characters_per_token), dtype=torch.long)
    if b == 0 or t == 0:
        return out
    rows = []
    for sentence in sentences:
        rows.extend(mapper.token_to_ids(tok) for tok in sentence)
    flat = torch.tensor(rows, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.bool)
    for i, sentence in enumerate(sentences):
        mask[i, : len(sentence)] = True
    out[mask] = flat
    return out


_MAPPERS: dict[tuple[int, str], ByteCharacterMapper] = {}


def _byte_mapper(max_characters_per_token: int, on_long_token: str) -> ByteCharacterMapper:
    key = (max_characters_per_token, on_long_token)
    mapper = _MAPPERS.get(key)
    if mapper is None:
        mapper = _MAPPERS[key] = ByteCharacterMapper(max_characters_per_token, on_long_token)
    return mapper


def boundary_char_ids(max_characters_per_token: int, char_vocab_size: int | None = None) -> tuple[list[int], list[int]]:
    """The ``<S>`` and ``</S>`` character-id rows (C ids each) of the byte scheme, or of the character-vocabulary
    scheme when ``char_vocab_size`` is set. Used by the model to add sentence boundaries."""
    if char_vocab_size is None:
        return _byte_mapper(max_characters_per_token, "truncate").boundary_ids()
    c = max_characters_per_token
    v = CharVocabulary
    return ([v.bow_char, v.bos_char, v.eow_char] + [v.pad_char] * (c - 3),
            [v.bow_char, v.eos_char, v.eow_char] + [v.pad_char] * (c - 3))
