"""ELMoForManyLangs' vocabularies: ``char.dic`` and ``word.dic`` read as its code reads them, and its token → id rows.

A ``.dic`` file is one ``token<TAB>id`` entry a line (UTF-8). ELMoForManyLangs (``Embedder.get_model``) strips each line
of surrounding whitespace and splits it at tabs; a line left with one field is a whitespace token, which its code then
stores as ``"\u3000"`` (the ideographic space). Later lines win over earlier ones for the same token, as in its dict.

A token becomes (``frontend.create_one_batch``, after ``read_list`` cut it to ``max_characters_per_token − 2``
characters):

* a word id: ``word.dic[token]``, else the id of ``<oov>``;
* C character ids: ``[id(<eow>), chars…, id(<bow>), id(<pad>), …]`` — the begin- and end-of-word ids are **crossed**
  (its code reads the ``<eow>`` entry into the variable it writes first), each character ``char.dic[ch]`` else the id
  of ``<oov>``; the sentence boundaries ``<bos>``/``<eos>`` are ``[id(<eow>), id(<bos>), id(<bow>), id(<pad>), …]``.

Here every character id is shifted by +1, so that 0 means "no token" (padding positions stay all zero and masked, as
everywhere in elmokit), and the word id is appended unshifted as column C: one token is C + 1 ids
(:attr:`EfmlVocabulary.id_width`), which :class:`~elmokit.modules.token_encoder.TokenEncoder` splits again.
"""

from __future__ import annotations

import os
from pathlib import Path

from elmokit.characters import CharVocabulary
from elmokit.errors import InputError, MissingFileError, WeightsError
from elmokit.io import atomic_write_text

__all__ = ["EfmlVocabulary", "read_dic", "CHAR_DIC", "WORD_DIC"]

CHAR_DIC = "char.dic"
WORD_DIC = "word.dic"
#: the special entries ELMoForManyLangs' code looks up in each file
CHAR_SPECIALS = ("<bos>", "<eos>", "<bow>", "<eow>", "<oov>", "<pad>")
WORD_SPECIALS = ("<oov>", "<pad>")


def read_dic(path: str | os.PathLike) -> dict[str, int]:
    """Read one ``.dic`` file as ELMoForManyLangs does (see the module docstring) → ``{token: id}``.

    Raises:
        MissingFileError: no such file (names it).
        WeightsError: not UTF-8, or a line that is not ``token<TAB>id`` with an integer id >= 0 (names file and
            line).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path} not found: an ELMoForManyLangs model folder holds {CHAR_DIC} and {WORD_DIC}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WeightsError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}): expected token<TAB>id lines"
        ) from None
    lexicon: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        if len(fields) != 2 or not fields[1].isdigit():
            raise WeightsError(f"{path}:{number}: {line[:40]!r} is not a token<TAB>id entry with an integer id >= 0")
        lexicon[fields[0]] = int(fields[1])
    return lexicon


def _in_id_order(lexicon: dict[str, int], rows: int, path: Path, tensor: str) -> list[str]:
    """The tokens of ``lexicon`` by id, after checking that its ids are exactly 0 … rows − 1.

    Raises:
        WeightsError: a size or id that does not fit the ``rows`` of ``tensor`` (names both files)."""
    if len(lexicon) != rows:
        raise WeightsError(f"{path} holds {len(lexicon)} entries but {tensor} has {rows} rows: they must be equal")
    tokens: list[str | None] = [None] * rows
    for token, i in lexicon.items():
        if i >= rows or tokens[i] is not None:
            raise WeightsError(
                f"{path}: entry {token!r} has id {i}, "
                + (f"outside the {rows} rows of {tensor}" if i >= rows else f"also held by {tokens[i]!r}")
            )
        tokens[i] = token
    return tokens  # type: ignore[return-value]


class EfmlVocabulary(CharVocabulary):
    """ELMoForManyLangs' character and word vocabularies (``char.dic`` + ``word.dic``) as one token mapper.

    Args:
        chars: the characters (and specials) in id order (the rows of its char embedding).
        words: the words (and specials) in id order (the rows of its word embedding).
        max_characters_per_token: C, its ``max_characters_per_token`` (tokens are cut to C − 2 characters).
        on_long_token: ``"truncate"`` (its behaviour) or ``"error"``.

    :meth:`token_to_ids` gives C + 1 ids (see the module docstring): C shifted character ids, then the word id.
    ``batch_to_ids(sentences, char_vocab=vocab)`` gives (B, T, C + 1) LongTensors, 0 at padding positions.

    Raises:
        WeightsError: a special entry its code needs is missing from ``chars`` (``<bos>``, ``<eos>``, ``<bow>``,
            ``<eow>``, ``<oov>``, ``<pad>``) or ``words`` (``<oov>``, ``<pad>``).
    """

    #: the model's sentence-boundary rows come from this vocabulary (see :attr:`BiLM.char_vocab`)
    defines_boundaries = True

    def __init__(
        self,
        chars: list[str],
        words: list[str],
        max_characters_per_token: int = 50,
        on_long_token: str = "truncate",
        *,
        source: str = "the vocabulary",
    ) -> None:
        super().__init__([], max_characters_per_token, on_long_token)
        self.chars, self.words = list(chars), list(words)
        self.characters = self.chars  # the entries in id order (the biLM fingerprint hashes them, with the words)
        self._char_index = {ch: i + 1 for i, ch in enumerate(self.chars)}  # shifted: 0 = no token
        self._word_index = {w: i for i, w in enumerate(self.words)}
        checks = ((CHAR_SPECIALS, self._char_index, CHAR_DIC), (WORD_SPECIALS, self._word_index, WORD_DIC))
        for names, index, what in checks:
            missing = [n for n in names if n not in index]
            if missing:
                raise WeightsError(f"{source}: {what} has no {', '.join(missing)} entry, which ELMoForManyLangs needs")
        ci = self._char_index
        # crossed, as its code places them: <eow>'s id first, <bow>'s after the characters
        self.first_char, self.last_char = ci["<eow>"], ci["<bow>"]
        self.pad_char, self.unk_char = ci["<pad>"], ci["<oov>"]
        self.unk_word = self._word_index["<oov>"]
        self._memo: dict[str, list[int]] = {}  # token → ids, as the byte scheme's mapper keeps them
        self._bos_row = self.token_to_ids("<bos>")
        self._eos_row = self.token_to_ids("<eos>")

    @property
    def vocab_size(self) -> int:
        """Character embedding rows including the zero padding row: ``len(chars) + 1``."""
        return len(self.chars) + 1

    @property
    def id_width(self) -> int:
        """C + 1: the C character ids, then the word id."""
        return self.max_characters_per_token + 1

    @classmethod
    def from_folder(
        cls, folder: str | os.PathLike, n_chars: int, n_words: int, max_characters_per_token: int, tensors: str
    ) -> EfmlVocabulary:
        """Read ``char.dic`` and ``word.dic`` of ``folder``, checking their sizes against the embedding rows
        (``n_chars``, ``n_words``) of ``tensors`` (the file named in messages).

        Raises:
            MissingFileError: a ``.dic`` file missing. WeightsError: see :func:`read_dic`, a size that disagrees
                with the tensors (both named), an id out of range or held twice, a special entry missing.
        """
        folder = Path(folder)
        chars = _in_id_order(
            read_dic(folder / CHAR_DIC), n_chars, folder / CHAR_DIC, f"{tensors} char_emb_layer.embedding.weight"
        )
        words = _in_id_order(
            read_dic(folder / WORD_DIC), n_words, folder / WORD_DIC, f"{tensors} word_emb_layer.embedding.weight"
        )
        return cls(chars, words, max_characters_per_token, source=str(folder))

    def save(self, path: str | os.PathLike) -> None:
        """Write ``char.dic`` and ``word.dic`` (``token<TAB>id``, id order, atomically) into the folder holding
        ``path`` (the native format's ``chars.txt`` path; this vocabulary keeps its own two files)."""
        folder = Path(path).parent
        atomic_write_text(folder / CHAR_DIC, "".join(f"{t}\t{i}\n" for i, t in enumerate(self.chars)))
        atomic_write_text(folder / WORD_DIC, "".join(f"{t}\t{i}\n" for i, t in enumerate(self.words)))

    def boundary_ids(self) -> tuple[list[int], list[int]]:
        """The ``<bos>`` and ``<eos>`` rows, each C + 1 ids."""
        return list(self._bos_row), list(self._eos_row)

    def token_to_ids(self, token: str) -> list[int]:
        """One token → C + 1 ids: C shifted character ids and the word id (see the module docstring).

        Raises:
            InputError: a token longer than C − 2 characters with ``on_long_token="error"``."""
        ids = self._memo.get(token)
        if ids is not None:
            return ids
        original, c = token, self.max_characters_per_token
        if len(token) > c - 2:
            if self.on_long_token == "error":
                raise InputError(f"token {token[:20]!r}… has {len(token)} characters; at most {c - 2} fit")
            token = token[: c - 2]
        if token in ("<bos>", "<eos>"):
            middle = [self._char_index[token]]
        else:
            middle = [self._char_index.get(ch, self.unk_char) for ch in token]
        ids = [self.first_char, *middle, self.last_char]
        ids += [self.pad_char] * (c - len(ids))
        ids.append(self._word_index.get(token, self.unk_word))
        if len(original) <= 64 and len(self._memo) < 200_000:  # (a huge token is not kept in memory)
            self._memo[original] = ids
        return ids
