"""Word vocabulary for the LM softmax, in the bilm-tf text format.

The file format is the one bilm-tf (``bilm/data.py``, ``Vocabulary``) reads: UTF-8 text, one token per line, the id of a
token is its line number (0-based). The three special tokens ``<S>`` (begin of sentence), ``</S>`` (end of sentence) and
``<UNK>`` (out of vocabulary) must be present; bilm-tf's own files put them first but not always in the same order
(its test vocabulary starts ``</S>``, ``<S>``, ``<UNK>``), so :meth:`Vocabulary.from_file` accepts them anywhere and
keeps the file's order, so that the row ``i`` of an original model's softmax matches the token on line ``i``.

The words after the specials are expected in descending frequency order: the log-uniform (Zipfian) negative sampler of
the sampled softmax (:mod:`elmokit.modules.softmax`) assumes that id ``k`` is the ``k``-th most frequent token.
:meth:`Vocabulary.build` produces that order.
"""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from elmokit import interrupts
from elmokit.checks import check_int, positive_int
from elmokit.errors import DataError, InputError, InputTypeError, MissingFileError

logger = logging.getLogger(__name__)

BOS = "<S>"
EOS = "</S>"
UNK = "<UNK>"
SPECIAL_TOKENS: tuple[str, str, str] = (BOS, EOS, UNK)

# bilm-tf skips this marker line (present in the 1B Word Benchmark vocabulary) without giving it an id.
_MAXTERMID = "!!!MAXTERMID"

PathLike = str | os.PathLike


class Vocabulary:
    """A token ↔ id map for the word-level LM softmax (V entries, ids ``0 … V-1``).

    Construct with :meth:`from_file` (bilm-tf text format), :meth:`build` (count a corpus) or from a token list.
    Unknown tokens map to :attr:`unk_id`, as in bilm-tf.

    Args:
        tokens: the tokens in id order. Must contain ``<S>``, ``</S>`` and ``<UNK>`` exactly once and no duplicates,
            empty strings or tokens containing whitespace (a whitespace-split corpus could never produce them).
        counts: optional corpus counts aligned with ``tokens`` (see :meth:`build` for what the specials' counts mean).

    Raises:
        DataError: a special token is missing, a token is duplicated, empty or contains whitespace, or ``counts`` has
            the wrong length or negative entries.
        InputTypeError: (also a ``TypeError``) ``tokens`` is a single ``str``, or a token is not a ``str``.
    """

    def __init__(self, tokens: Sequence[str], counts: Sequence[int] | None = None) -> None:
        if isinstance(tokens, str):
            raise InputTypeError("Vocabulary(tokens): expected a sequence of token strings, got a single str")
        id_to_token: list[str] = []
        token_to_id: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str):
                raise InputTypeError(f"Vocabulary token at id {i} is {type(tok).__name__}, expected str: {tok!r}")
            _check_token(tok, where=f"id {i}")
            if tok in token_to_id:
                raise DataError(f"duplicate token {tok!r} at ids {token_to_id[tok]} and {i}")
            token_to_id[tok] = i
            id_to_token.append(tok)
        missing = [s for s in SPECIAL_TOKENS if s not in token_to_id]
        if missing:
            raise DataError(f"vocabulary is missing the special token(s) {', '.join(missing)}")
        self._id_to_token = id_to_token
        self._token_to_id = token_to_id
        self._counts: list[int] | None = None
        if counts is not None:
            counts = [int(c) for c in counts]
            if len(counts) != len(id_to_token):
                raise DataError(f"counts has {len(counts)} entries but the vocabulary has {len(id_to_token)} tokens")
            if any(c < 0 for c in counts):
                raise DataError("counts must be non-negative")
            self._counts = counts

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_file(cls, path: PathLike) -> Vocabulary:
        """Read a bilm-tf vocabulary file: UTF-8, one token per line, id = line number.

        Follows bilm-tf's reader: surrounding whitespace of a line is stripped, and a line ``!!!MAXTERMID`` (found in
        the 1B Word Benchmark vocabulary) is skipped without taking an id. Blank lines at the very end of the file are
        ignored; a blank line anywhere else is an error (it would shift every later id). A UTF-8 byte-order mark on the
        first line is removed. The specials may be anywhere; the file's order is kept.

        Raises:
            MissingFileError: ``path`` does not exist or is not a file.
            DataError: naming the file (and line): a special token is missing, a token is duplicated (naming both
                lines), a blank line precedes a non-blank one, a line holds more than one whitespace-separated field,
                or a line is not valid UTF-8 or holds a NUL byte.
        """
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"vocabulary file not found: {path}"
                + (" (it is a folder: give the vocabulary file)" if path.is_dir() else "")
            )
        tokens: list[str] = []
        first_line_of: dict[str, int] = {}
        pending_blank: int | None = None  # line number of the first blank line not yet followed by a token
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{lineno}: invalid UTF-8 in vocabulary file ({e.reason})") from None
                nul = raw.find(b"\0")
                if nul >= 0:  # the line rule of every text input (elmokit.data.corpus.line_problem)
                    raise DataError(
                        f"{path}:{lineno}: a NUL byte in vocabulary file at column {nul + 1} (binary data, "
                        "or UTF-16 text?)"
                    )
                if lineno == 1:
                    text = text.lstrip("\ufeff")
                tok = text.strip()
                if not tok:
                    if pending_blank is None:
                        pending_blank = lineno
                    continue
                if pending_blank is not None:
                    raise DataError(
                        f"{path}:{pending_blank}: blank line in vocabulary file (ids are line numbers; remove it)"
                    )
                if tok == _MAXTERMID:
                    logger.debug("%s:%d: skipping %s line (as bilm-tf does)", path, lineno, _MAXTERMID)
                    continue
                if len(tok.split()) != 1:
                    raise DataError(
                        f"{path}:{lineno}: expected one token per line, got {tok!r} "
                        "(bilm-tf vocabulary files hold no counts or other columns)"
                    )
                if tok in first_line_of:
                    raise DataError(
                        f"{path}:{lineno}: duplicate token {tok!r} (first seen on line {first_line_of[tok]})"
                    )
                first_line_of[tok] = lineno
                tokens.append(tok)
        missing = [s for s in SPECIAL_TOKENS if s not in first_line_of]
        if missing:
            raise DataError(
                f"vocabulary file {path} is missing the special token(s) {', '.join(missing)} "
                f"(required: {', '.join(SPECIAL_TOKENS)})"
            )
        return cls(tokens)

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """Count a tokenised corpus and make a frequency-sorted vocabulary.

        Order: ``<S>`` (id 0), ``</S>`` (id 1), ``<UNK>`` (id 2), then words by descending count; **ties are broken
        alphabetically** (Python ``str`` order, i.e. by code point), so the result does not depend on the order in which
        sentences arrive (e.g. shuffled shards give the same vocabulary). This is bilm-tf's layout (specials first, then
        frequency order) which the log-uniform sampler assumes.

        Args:
            sentences: iterable of token lists (one per sentence, no boundary tokens). Consumed once.
            min_count: words seen fewer times are left out (they become ``<UNK>``). ``>= 1``.
            max_size: maximum total size **including the three specials** (``>= 3``); ``None`` = no limit.

        The resulting :attr:`counts` are: for a word, its number of occurrences; for ``<S>`` and ``</S>``, the number of
        sentences (one boundary of each per sentence, plus any literal ``<S>``/``</S>`` tokens in the text); for
        ``<UNK>``, the number of corpus tokens that map to it (words cut by ``min_count``/``max_size`` plus literal
        ``<UNK>`` tokens). So ``counts`` are the unigram counts of the ids a whole-sentence LM sees.

        Raises:
            InputTypeError: (also a ``TypeError``) a sentence is a ``str`` (pass token lists: ``line.split()``) or
                a token is not a ``str``.
            UsageError: ``min_count < 1`` or ``max_size < 3`` (:class:`~elmokit.errors.UsageTypeError` when not an
                int).
            DataError: a token is empty or contains whitespace.
        """
        counter: Counter[str] = Counter()
        n_sentences = 0
        for i, sent in enumerate(sentences):
            if isinstance(sent, str):
                raise InputTypeError(
                    f"Vocabulary.build: sentence {i} is a str; pass lists of tokens (e.g. line.split())"
                )
            n_sentences += 1
            for tok in sent:
                if not isinstance(tok, str):
                    raise InputTypeError(
                        f"Vocabulary.build: sentence {i} holds a {type(tok).__name__}, expected str tokens"
                    )
                counter[tok] += 1
        return cls.from_counts(counter, n_sentences, min_count=min_count, max_size=max_size)

    @classmethod
    def from_counts(
        cls, counter: Mapping[str, int], n_sentences: int, min_count: int = 1, max_size: int | None = None
    ) -> Vocabulary:
        """The vocabulary :meth:`build` makes, from token counts already taken (e.g. added up over corpus parts).

        Args:
            counter: occurrences of each token in the text (literal ``<S>``/``</S>``/``<UNK>`` tokens included).
            n_sentences: sentences counted (each adds one ``<S>`` and one ``</S>``).
            min_count, max_size: as :meth:`build`.

        Raises:
            UsageError: ``min_count < 1`` or ``max_size < 3`` (:class:`~elmokit.errors.UsageTypeError`, also a
                ``TypeError``, when not an int).
            DataError: a token is empty or contains whitespace.
        """
        positive_int("min_count", min_count)
        if max_size is not None:
            check_int("max_size (None or the vocabulary size, specials included)", max_size, len(SPECIAL_TOKENS))
        counter = Counter(counter)
        special_counts = {s: counter.pop(s, 0) for s in SPECIAL_TOKENS}
        for tok in counter:
            if not tok or len(tok.split()) != 1:
                raise DataError(f"Vocabulary: token {tok!r} is empty or contains whitespace")
        words = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = [(w, c) for w, c in words if c >= min_count]
        if max_size is not None:
            kept = kept[: max_size - len(SPECIAL_TOKENS)]
        n_unk = sum(counter.values()) - sum(c for _, c in kept) + special_counts[UNK]
        tokens = [BOS, EOS, UNK] + [w for w, _ in kept]
        counts = [n_sentences + special_counts[BOS], n_sentences + special_counts[EOS], n_unk] + [c for _, c in kept]
        logger.info(
            "built vocabulary: %d tokens (%d distinct words seen, %d sentences, %d tokens mapped to <UNK>)",
            len(tokens),
            len(counter),
            n_sentences,
            n_unk,
        )
        return cls(tokens, counts)

    # ------------------------------------------------------------------ output
    def save(self, path: PathLike) -> None:
        """Write the bilm-tf format (one token per line, UTF-8, ``\\n`` line ends) atomically.

        The text goes to a temporary file in the same folder, which then replaces ``path`` (``os.replace``): an
        interrupted save leaves the old file or none. Counts are not written (the format has no place for them).
        """
        path = Path(path)
        directory = path.parent if str(path.parent) else Path(".")
        tmp = None
        try:
            with interrupts.shielded():  # created and known together: Ctrl-C in between would leave it behind
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                for tok in self._id_to_token:
                    f.write(tok)
                    f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                if tmp is not None:
                    os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    # ------------------------------------------------------------------ lookup
    def __len__(self) -> int:
        return len(self._id_to_token)

    def __contains__(self, token: object) -> bool:
        return token in self._token_to_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._id_to_token)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocabulary):
            return NotImplemented
        return self._id_to_token == other._id_to_token

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, bos_id={self.bos_id}, eos_id={self.eos_id}, unk_id={self.unk_id})"

    @property
    def tokens(self) -> list[str]:
        """The tokens in id order (a copy)."""
        return list(self._id_to_token)

    @property
    def bos_id(self) -> int:
        """Id of ``<S>``."""
        return self._token_to_id[BOS]

    @property
    def eos_id(self) -> int:
        """Id of ``</S>``."""
        return self._token_to_id[EOS]

    @property
    def unk_id(self) -> int:
        """Id of ``<UNK>`` (returned for every unknown token)."""
        return self._token_to_id[UNK]

    def fingerprint(self) -> dict[str, int | str]:
        """``{"size": V, "sha256": hex}``: the sha256 of the tokens in id order, one per line (UTF-8, ``\\n`` ends),
        i.e. of the file :meth:`save` writes. The trainer stores it with its checkpoints to notice, on resume, a
        vocabulary edited since the run started."""
        h = hashlib.sha256()
        for tok in self._id_to_token:
            h.update(tok.encode("utf-8"))
            h.update(b"\n")
        return {"size": len(self._id_to_token), "sha256": h.hexdigest()}

    @property
    def counts(self) -> list[int] | None:
        """Corpus counts aligned with the ids when built by :meth:`build` (or given), else ``None`` (a copy)."""
        return None if self._counts is None else list(self._counts)

    def token_to_id(self, token: str) -> int:
        """Id of ``token``; :attr:`unk_id` when it is not in the vocabulary (bilm-tf behaviour)."""
        return self._token_to_id.get(token, self._token_to_id[UNK])

    def id_to_token(self, token_id: int) -> str:
        """Token with id ``token_id``.

        Raises:
            InputTypeError: (also a ``TypeError``) ``token_id`` is not an int.
            InputError: ``token_id`` is outside ``[0, len(self))``.
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            try:
                token_id = operator.index(token_id)  # accepts numpy / 0-d torch integers
            except TypeError:
                raise InputTypeError(f"token id must be an int, got {type(token_id).__name__}") from None
        if not 0 <= token_id < len(self._id_to_token):
            raise InputError(f"token id {token_id} out of range [0, {len(self._id_to_token)})")
        return self._id_to_token[token_id]

    def encode(self, tokens: Sequence[str], add_boundaries: bool = False) -> list[int]:
        """Ids of ``tokens`` (unknown → :attr:`unk_id`); with ``add_boundaries`` wrapped as ``<S> … </S>``.

        Raises:
            InputTypeError: (also a ``TypeError``) ``tokens`` is a ``str`` (pass a list of tokens).
        """
        if isinstance(tokens, str):
            raise InputTypeError("encode(tokens): expected a list of tokens, got a str (use str.split())")
        unk = self._token_to_id[UNK]
        ids = [self._token_to_id.get(t, unk) for t in tokens]
        if add_boundaries:
            ids = [self.bos_id, *ids, self.eos_id]
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (see :meth:`id_to_token` for errors)."""
        return [self.id_to_token(i) for i in ids]


def _check_token(tok: str, where: str) -> None:
    if not tok:
        raise DataError(f"empty token at {where}")
    if len(tok.split()) != 1 or tok != tok.strip():
        raise DataError(f"token {tok!r} at {where} contains whitespace")
