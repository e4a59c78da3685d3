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

Sentence boundaries ``<S>``/``</S>`` are added by the model (:class:`elmokit.modules.bilm.BiLM`), not here. A literal
``"<S>"`` or ``"</S>"`` token in the input maps to the same boundary row, as in the original (bilm-tf, AllenNLP): it is
read as a sentence boundary, not as the three characters.

**Blank tokens.** A token that is empty or whitespace only (``""``, ``" "``, ``"\t"``, ``"\u3000"``; precisely: nothing
is left once lone surrogates are dropped, or :meth:`str.isspace` holds) is almost always a tokeniser artefact (padding,
a double space split on ``" "``). The original embeds it anyway (begin-of-word, end-of-word) and it then changes its
neighbours' vectors. Here :func:`batch_to_ids` refuses it by default (:class:`~elmokit.errors.InputError` naming the
sentence and position); ``empty_tokens="keep"`` keeps the original's encoding.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from elmokit.checks import is_int
from elmokit.errors import DataError, InputError, InputTypeError, MissingFileError, UsageError, UsageTypeError
from elmokit.io import atomic_write_text

__all__ = [
    "ByteCharacterMapper",
    "CharVocabulary",
    "batch_to_ids",
    "validate_sentences",
    "boundary_char_ids",
    "is_blank_token",
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

_EMPTY_TOKEN_MODES = ("error", "keep")
_LONG_TOKEN_MODES = ("truncate", "error")
_CACHE_MAX_TOKEN_LEN = 64  # tokens longer than this are not memoised (a huge token must not stay in memory)


def _check_mode(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")


def _check_width(max_characters_per_token: object) -> int:
    if not is_int(max_characters_per_token):
        raise UsageTypeError(
            f"max_characters_per_token must be an int >= 3, got {max_characters_per_token!r} "
            f"({type(max_characters_per_token).__name__})"
        )
    if max_characters_per_token < 3:
        raise UsageError(
            f"max_characters_per_token must be >= 3 (begin-of-word, one character, end-of-word), "
            f"got {max_characters_per_token}"
        )
    return int(max_characters_per_token)


def is_blank_token(token: str) -> bool:
    """Whether ``token`` is empty or whitespace only, after dropping lone surrogates (which no scheme can encode).

    ``""``, ``" "``, ``"\t\n"``, ``"\u3000"`` (ideographic space), ``"\ud800"`` are blank; ``"\u200b"`` (zero-width
    space, not whitespace in Unicode) and ``"\x00"`` are not. Whitespace is :meth:`str.isspace`.
    """
    if not token or token.isspace():
        return True
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: look at what the encoders keep
        visible = token.encode("utf-8", "ignore").decode("utf-8")
        return not visible or visible.isspace()
    return False


class ByteCharacterMapper:
    """The original UTF-8 byte scheme, ids shifted by +1 (0 = padding).

    Args:
        max_characters_per_token: C, positions per token (50 in every released model). Tokens longer than
            ``C - 2`` UTF-8 bytes are truncated, as in the original.
        on_long_token: ``"truncate"`` (original behaviour) or ``"error"`` (raise :class:`InputError`).
        tokens_to_add: ``{token: raw id}`` extra special tokens, as AllenNLP's ``ELMoCharacterMapper(tokens_to_add)``:
            such a token becomes ``[begin-of-word, raw id, end-of-word, pad, …]`` (then shifted by +1, so
            ``{"<first>": 1}`` gives ``[259, 2, 260, 261, …]``); it is looked up before ``<S>``/``</S>``. A raw id
            is an int in 0…260 (a byte value, or one of the specials 256–260), so that it has a row in the character
            table.

    Raises :class:`UsageError` for a bad argument (:class:`UsageTypeError`, also a ``TypeError``, for one of the wrong
    type). This class maps every string, blank ones included, as the original does; :func:`batch_to_ids` is where
    blank tokens are refused.

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

    def __init__(
        self,
        max_characters_per_token: int = 50,
        on_long_token: str = "truncate",
        tokens_to_add: dict[str, int] | None = None,
    ) -> None:
        _check_width(max_characters_per_token)
        _check_mode("on_long_token", on_long_token, _LONG_TOKEN_MODES)
        self.max_characters_per_token = max_characters_per_token
        self.on_long_token = on_long_token
        self._cache: dict[str, list[int]] = {}
        self._bos_row = self._boundary_row(self.bos_char)
        self._eos_row = self._boundary_row(self.eos_char)
        self.tokens_to_add: dict[str, int] = {}
        if tokens_to_add is not None:
            if not isinstance(tokens_to_add, dict):
                raise UsageTypeError(
                    f"tokens_to_add must be a dict {{token: raw id}}, got {type(tokens_to_add).__name__}"
                )
            for token, raw in tokens_to_add.items():
                if not isinstance(token, str):
                    raise UsageTypeError(f"tokens_to_add key {token!r} is a {type(token).__name__}; tokens are str")
                if not is_int(raw) or not 0 <= raw <= _RAW_PAD:
                    error = UsageError if is_int(raw) else UsageTypeError
                    raise error(
                        f"tokens_to_add[{token!r}] = {raw!r}: expected a raw character id, an int in "
                        f"0…{_RAW_PAD} (shifted by +1 like every id)"
                    )
                self.tokens_to_add[token] = raw
        self._added_rows = {tok: self._boundary_row(raw + 1) for tok, raw in self.tokens_to_add.items()}

    def _boundary_row(self, char: int) -> list[int]:
        c = self.max_characters_per_token
        return [self.bow_char, char, self.eow_char] + [self.pad_char] * (c - 3)

    def boundary_ids(self) -> tuple[list[int], list[int]]:
        """The ``<S>`` and ``</S>`` rows, each a list of C shifted ids."""
        return list(self._bos_row), list(self._eos_row)

    def token_to_ids(self, token: str) -> list[int]:
        """One token → C shifted ids. ``"<S>"``/``"</S>"`` map to the boundary rows, as in the original; a
        ``tokens_to_add`` token to its own row (checked first, as AllenNLP).

        Undecodable characters (lone surrogates) are dropped, as the original's ``encode('utf-8', 'ignore')``.
        Raises :class:`InputError` for an over-long token when ``on_long_token="error"``.
        """
        ids = self._cache.get(token)
        if ids is not None:
            return ids
        if token in self._added_rows:
            ids = self._added_rows[token]
        elif token == BOS_TOKEN:
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
        if len(token) <= _CACHE_MAX_TOKEN_LEN and len(self._cache) < 200_000:
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

    Raises:
        DataError: an entry that is not exactly one character, or a duplicate (names the entry; file and line when
            read by :meth:`from_file`).
        UsageError: a bad ``max_characters_per_token`` / ``on_long_token``.
    """

    padding_id = 0
    bos_char = 1
    eos_char = 2
    bow_char = 3
    eow_char = 4
    pad_char = 5
    unk_char = 6
    n_specials = 7

    def __init__(
        self,
        characters: Sequence[str],
        max_characters_per_token: int = 50,
        on_long_token: str = "truncate",
        *,
        _source: str | None = None,
    ) -> None:
        if isinstance(characters, str):
            characters = list(characters)
        where = (lambda i: f"{_source}:{i + 1}") if _source else (lambda i: f"character vocabulary entry {i}")
        seen: dict[str, int] = {}
        for i, ch in enumerate(characters):
            if not isinstance(ch, str) or len(ch) != 1:
                raise DataError(f"{where(i)} is {ch!r}: expected exactly one character")
            if ch in seen:
                raise DataError(f"{where(i)} {ch!r} duplicates {where(seen[ch])}")
            seen[ch] = i
        _check_width(max_characters_per_token)
        _check_mode("on_long_token", on_long_token, _LONG_TOKEN_MODES)
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
    def build(
        cls,
        sentences: Iterable[Sequence[str]],
        min_count: int = 1,
        max_size: int | None = None,
        max_characters_per_token: int = 50,
    ) -> CharVocabulary:
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
    def from_file(cls, path: str | os.PathLike, max_characters_per_token: int = 50) -> CharVocabulary:
        """Read one character per line (UTF-8).

        Raises:
            MissingFileError: no such file (or a folder).
            DataError: not UTF-8, or a bad line (names file and line).
        """
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"character vocabulary {path}: "
                + ("is a folder, expected a file of one character per line" if path.is_dir() else "no such file")
            )
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); a character vocabulary is "
                "one character per line, UTF-8"
            ) from None
        if lines and lines[-1] == "":
            lines.pop()
        return cls(lines, max_characters_per_token=max_characters_per_token, _source=str(path))

    def save(self, path: str | os.PathLike) -> None:
        """Write one character per line, atomically."""
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


def validate_sentences(
    sentences: object, *, empty_tokens: str = "error", start: int = 0, name: str = "sentences"
) -> list[Sequence[str]]:
    """Check that ``sentences`` is a list of sentences, each a list of ``str`` tokens.

    Returns the sentences as a list (an iterable of sentences is read into one). Empty sentences and an empty batch are
    allowed (they give zero-length rows).

    Args:
        empty_tokens: ``"error"`` (default): a blank token (empty or whitespace only, see :func:`is_blank_token`) is
            refused; ``"keep"``: it is kept and encoded as the original does (begin-of-word, its bytes, end-of-word).
        start: the number of the first sentence in messages (its position in a longer stream).
        name: the argument's name in messages (the caller's parameter, e.g. ``"sentences"``).

    Raises:
        InputTypeError: (also a ``TypeError``) a string, a flat list of strings, a sentence that is not a list, a
            non-string token — the message names ``name``, the expected form, and the sentence and token position
            (sentences numbered from ``start``, 0-based).
        InputError: (a ``ValueError``) with ``empty_tokens="error"``, a blank token (names sentence and token).
        UsageError: an unknown ``empty_tokens``.
    """
    _check_mode("empty_tokens", empty_tokens, _EMPTY_TOKEN_MODES)
    expected = f"{name} must be a list of sentences, each a list of token strings"
    if isinstance(sentences, (str, bytes)):
        raise InputTypeError(f"{expected}; got a single string: tokenise it and wrap it: [text.split()]")
    if not isinstance(sentences, Sequence):
        if isinstance(sentences, Iterable) and not isinstance(sentences, dict):
            sentences = list(sentences)
        else:
            raise InputTypeError(f"{expected} (list of lists of str); got a {type(sentences).__name__}")
    check_blank = empty_tokens == "error"
    out = []
    for i, sentence in enumerate(sentences, start):
        _check_sentence(sentence, i, expected)
        if check_blank:
            _check_not_blank(sentence, i)
        out.append(sentence)
    return out


def validate_tokens(tokens: object, *, name: str = "tokens") -> Sequence[str]:
    """Check that ``tokens`` is one sentence: a list (sequence) of ``str`` tokens, not a string. Returns it.

    Raises:
        InputTypeError: (also a ``TypeError``) a string, something that is not a sequence, or a non-string token;
            the message names ``name`` and the expected form."""
    expected = f"{name} must be one sentence, a list of token strings"
    if isinstance(tokens, (str, bytes)):
        raise InputTypeError(f"{expected}; got a single string: tokenise it first (text.split())")
    if not isinstance(tokens, Sequence):
        raise InputTypeError(f"{expected}; got a {type(tokens).__name__}")
    for j, token in enumerate(tokens):
        if not isinstance(token, str):
            raise InputTypeError(f"{expected}; token {j} is a {type(token).__name__} ({_shown(token)})")
    return tokens


def _shown(value: object) -> str:
    """``repr(value)``, cut to 40 characters."""
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _check_sentence(sentence: object, i: int, expected: str) -> None:
    """Raise :class:`InputTypeError` unless sentence ``i`` is a sequence of ``str`` (not itself a string)."""
    if isinstance(sentence, str):
        raise InputTypeError(
            f"{expected}; but element {i} is the string {sentence[:30]!r}: a flat list of tokens is "
            "one sentence — wrap it: [tokens]"
        )
    if isinstance(sentence, bytes) or not isinstance(sentence, Sequence):
        raise InputTypeError(f"{expected}; sentence {i} is a {type(sentence).__name__}")
    for j, token in enumerate(sentence):
        if not isinstance(token, str):
            raise InputTypeError(
                f"sentence {i}, token {j} is a {type(token).__name__} ({_shown(token)}); tokens "
                f"must be str ({expected})"
            )


def _lone_surrogates(token: str) -> list[str]:
    """The lone surrogates (U+D800–U+DFFF, unencodable in UTF-8) of ``token``, in order; [] for most tokens."""
    return [ch for ch in token if "\ud800" <= ch <= "\udfff"]


def _check_not_blank(sentence: Sequence[str], i: int) -> None:
    """Raise :class:`InputError` (a value error) at the first blank token of sentence ``i``."""
    for j, token in enumerate(sentence):
        if is_blank_token(token) and _lone_surrogates(token):
            raise InputError(
                f"sentence {i}, token {j} is {token[:10]!r}: it holds lone surrogates "
                f"({', '.join(f'U+{ord(ch):04X}' for ch in _lone_surrogates(token)[:3])}), which no character scheme "
                "can encode, and nothing else visible; fix the text's decoding (a lone surrogate is half of a UTF-16 "
                "pair, often from decoding with errors='surrogateescape') or drop the token"
            )
        if is_blank_token(token):
            raise InputError(
                f"sentence {i}, token {j} is {token[:10]!r}: empty or whitespace-only tokens are refused (they are "
                "usually tokeniser padding, and would change their neighbours' vectors); drop them, or pass "
                "empty_tokens='keep' to embed them as the original does"
            )


def batch_to_ids(
    sentences: Sequence[Sequence[str]],
    max_characters_per_token: int = 50,
    *,
    char_vocab: CharVocabulary | None = None,
    on_long_token: str = "truncate",
    empty_tokens: str = "error",
    tokens_to_add: dict[str, int] | None = None,
) -> torch.Tensor:
    """Convert tokenised sentences to character ids, as AllenNLP's ``batch_to_ids``.

    Args:
        sentences: B sentences, each a list of token strings (may be empty).
        max_characters_per_token: C (50 for every released model); ignored when ``char_vocab`` is given (its own).
        char_vocab: use the character-vocabulary scheme instead of UTF-8 bytes.
        on_long_token: ``"truncate"`` (original) or ``"error"``.
        empty_tokens: ``"error"`` (default) refuses empty / whitespace-only tokens; ``"keep"`` encodes them as the
            original does (see the module docstring).
        tokens_to_add: extra special tokens ``{token: raw id}`` of the byte scheme (AllenNLP's ``tokens_to_add``, see
            :class:`ByteCharacterMapper`).

    A literal ``"<S>"`` / ``"</S>"`` token gets the boundary row the model adds itself (as the original does).

    Returns:
        LongTensor (B, T, C), T = longest sentence; ids shifted so that 0 = padding (rows past a sentence's end are
        all zero). Boundary tokens are **not** added (the model adds them). An empty batch gives shape (0, 0, C).

    Raises:
        InputTypeError: (also a ``TypeError``) input of the wrong type: a string, a flat list of strings, a sentence
            that is not a list, non-string tokens; the message names ``sentences``, the expected form, sentence and
            token.
        InputError: (a ``ValueError``) a blank token (default), an over-long token with ``on_long_token="error"``;
            the message names sentence and token.
        UsageTypeError: an option of the wrong type (``char_vocab`` not a :class:`CharVocabulary`,
            ``max_characters_per_token`` not an int).
        UsageError: a bad option value.
    """
    sentences = validate_sentences(sentences, empty_tokens=empty_tokens)
    if char_vocab is not None:
        if not isinstance(char_vocab, CharVocabulary):
            raise UsageTypeError(f"char_vocab must be a CharVocabulary, got {type(char_vocab).__name__}")
        if tokens_to_add:
            raise UsageError("tokens_to_add belongs to the UTF-8 byte scheme; it cannot be combined with char_vocab")
        mapper: ByteCharacterMapper | CharVocabulary = char_vocab
        # the id row's width: C, or C + 1 for a vocabulary that also maps words (ELMoForManyLangs')
        max_characters_per_token = getattr(char_vocab, "id_width", char_vocab.max_characters_per_token)
    elif tokens_to_add:
        mapper = ByteCharacterMapper(max_characters_per_token, on_long_token, tokens_to_add=tokens_to_add)
    else:
        _check_width(max_characters_per_token)
        _check_mode("on_long_token", on_long_token, _LONG_TOKEN_MODES)
        mapper = _byte_mapper(max_characters_per_token, on_long_token)
    b = len(sentences)
    t = max((len(s) for s in sentences), default=0)
    out = torch.zeros((b, t, max_characters_per_token), dtype=torch.long)
    if b == 0 or t == 0:
        return out
    rows = []
    for i, sentence in enumerate(sentences):
        for j, tok in enumerate(sentence):
            try:
                rows.append(mapper.token_to_ids(tok))
            except InputError as exc:
                raise InputError(f"sentence {i}, token {j}: {exc}") from None
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
    return (
        [v.bow_char, v.bos_char, v.eow_char] + [v.pad_char] * (c - 3),
        [v.bow_char, v.eos_char, v.eow_char] + [v.pad_char] * (c - 3),
    )
