"""Task datasets: :class:`TaskData` (what a task model reads), reading a config's data files, and the character →
word segmentation of character-tagged data (each character gets its word's static vector and ELMo layers)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from elmokit.data.tokenizers import load_tokenizer, word_tokenizer
from elmokit.errors import DataError
from elmokit.tasks import readers
from elmokit.tasks.config import TaskConfig

__all__ = ["TaskData", "read_task_file", "read_task_data", "aligned_segmenter", "segmenter_for", "char_words"]


@dataclass
class TaskData:
    """N sentences ready for a task model.

    Attributes:
        tokens: N token lists.
        targets: N tag lists (tagging) or N labels (classification), or ``None`` (prediction).
        sources: N ``(file, line)`` pairs (for messages), or ``None``.
        static_tokens: N lists of the strings looked up in the static table (default: the tokens).
        features: the cached biLM layers of these sentences (a :class:`~elmokit.tasks.features.LayerFeatures`), or
            ``None`` (live biLM, or none).
    """

    tokens: list[list[str]]
    targets: list | None = None
    sources: list[tuple[str, int]] | None = None
    static_tokens: list[list[str]] | None = None
    features: Any = None

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_sentences(cls, sentences: Sequence) -> TaskData:
        """From the readers' :class:`TaggedSentence` / :class:`LabelledSentence` lists (``.tags`` or ``.label``)."""
        tokens = [list(s.tokens) for s in sentences]
        if sentences and hasattr(sentences[0], "tags"):
            targets: list = [list(s.tags) for s in sentences]
        else:
            targets = [s.label for s in sentences]
        return cls(tokens=tokens, targets=targets, sources=[(s.source, s.line) for s in sentences])

    def where(self, i: int) -> str:
        """``FILE:LINE`` of sentence i (or ``sentence i``)."""
        if self.sources is None:
            return f"sentence {i}"
        source, line = self.sources[i]
        return f"{source}:{line}"

    def head(self, n: int) -> TaskData:
        """The first ``n`` sentences (tokens, targets and sources; nothing computed yet)."""
        return TaskData(
            self.tokens[:n],
            None if self.targets is None else self.targets[:n],
            None if self.sources is None else self.sources[:n],
        )


def read_task_file(config: TaskConfig, path: str | os.PathLike) -> TaskData:
    """Read a data file with the config's reader (``data.reader``, ``scheme``, ``field``, ``format``).

    Raises:
        MissingFileError / DataError: from the readers (naming ``FILE:LINE``).
    """
    d = config.data
    if d.reader == "conll2003":
        sentences = readers.read_conll2003(path, scheme=d.scheme, encoding=d.encoding)
    elif d.reader == "conllu":
        sentences = readers.read_conllu(path, field=d.field, encoding=d.encoding)
    elif d.reader == "char_ner":
        sentences = readers.read_char_ner(path, scheme=d.scheme, encoding=d.encoding)
    else:
        sentences = readers.read_labelled(path, format=d.format, encoding=d.encoding)
    if not sentences:
        raise DataError(f"{path}: no sentences")
    return TaskData.from_sentences(sentences)


def read_task_data(config: TaskConfig) -> dict[str, TaskData]:
    """The config's ``{"train", "dev"[, "test"]}`` files, train cut to ``data.max_train_sentences`` when set.

    Raises:
        MissingFileError / DataError: from the readers (naming ``FILE:LINE``).
    """
    d = config.data
    data = {"train": read_task_file(config, d.train), "dev": read_task_file(config, d.dev)}
    if d.test is not None:
        data["test"] = read_task_file(config, d.test)
    if d.max_train_sentences:
        data["train"] = data["train"].head(d.max_train_sentences)
    return data


def aligned_segmenter(segment: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    """Wrap a segmenter so its words re-join to the input exactly: words that match the text in order are kept,
    characters a segmenter dropped or changed become one-character words (the zoo tokeniser cleans some
    characters, e.g. control characters). ``str → list[str]``."""

    def run(text: str) -> list[str]:
        words = [w for w in segment(text) if w]
        out, pos = [], 0
        for w in words:
            found = text.find(w, pos)
            if found < 0:
                continue
            out.extend(text[pos:found])  # characters skipped by the segmenter, one word each
            out.append(w)
            pos = found + len(w)
        out.extend(text[pos:])
        return out

    return run


def segmenter_for(name: str) -> Callable[[str], list[str]]:
    """``"elmokit-zh"`` (any zoo model / folder with a tokenizer.json) or ``"jieba"`` → aligned ``str → words``
    (:func:`aligned_segmenter`).

    Raises:
        MissingFileError: a zoo model that is not built, or a folder without ``tokenizer.json``.
    """
    if name == "jieba":
        return aligned_segmenter(word_tokenizer("jieba"))
    tokenize = load_tokenizer(name)
    return aligned_segmenter(lambda text: [w for sentence in tokenize(text) for w in sentence])


def char_words(char_sentences: Sequence[Sequence[str]], segment: Callable[[str], list[str]]) -> list[list[str]]:
    """For each character of each sentence, the word (of ``segment`` on the joined characters) it belongs to.

    Raises:
        DataError: the words do not re-join to the characters (use :func:`aligned_segmenter`).
    """
    out = []
    for i, chars in enumerate(char_sentences):
        words = segment("".join(chars))
        per_char = [w for w in words for _ in w]
        if "".join(words) != "".join(chars) or len(per_char) != len("".join(chars)):
            raise DataError(f"sentence {i}: the segmenter's words do not re-join to its characters")
        # a "character" token of the data may itself be longer than one code point: map by position
        out_sentence, pos = [], 0
        for c in chars:
            out_sentence.append(per_char[pos])
            pos += len(c)
        out.append(out_sentence)
    return out
