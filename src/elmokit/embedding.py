"""``Embedder``: sentences and files → ELMo layer arrays (NumPy) and HDF5 files."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from . import interrupts
from .characters import CharVocabulary, batch_to_ids, validate_sentences
from .errors import InputError, MissingFileError, UsageError
from .io import atomic_path
from .modules.bilm import BiLM, StatefulBiLM

__all__ = ["Embedder"]

logger = logging.getLogger(__name__)

_LAYER_MODES = ("all", "top", "average")
_DECODE_MODES = ("strict", "replace", "ignore", "skip")
_EMPTY_TOKEN_MODES = ("error", "keep")

_MODEL_HELP = ("pass a BiLM, an Elmo, an options.json path with its weight file (Embedder(options_file, "
               "weight_file), as AllenNLP's ElmoEmbedder), a model folder, or a released model name")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be an int >= 1, got {value!r}")
    return value


def resolve_model(model: object, weight_file: str | os.PathLike | None = None) -> BiLM:
    """What :class:`Embedder` accepts as its model → a :class:`BiLM`.

    * a :class:`BiLM`; an :class:`~elmokit.Elmo` (its biLM);
    * an ``options.json`` path and ``weight_file`` the HDF5 (AllenNLP's ``ElmoEmbedder(options_file, weight_file)``);
    * a single path or name: a native model folder, an original-format folder, or a released model name
      (:func:`~elmokit.weights.native.load_pretrained_bilm`).

    Raises:
        UsageError: anything else, ``weight_file`` with a model object, or an options file without its weight file
            (the message says what to pass).
        MissingFileError / ConfigError / WeightsError: from the loaders (naming the file).
    """
    from .elmo import Elmo

    if isinstance(model, (BiLM, StatefulBiLM, Elmo)):
        if weight_file is not None:
            raise UsageError(f"weight_file is only for an options.json path; the {type(model).__name__} given already "
                             "has its weights (did you mean batch_size=...? it is keyword-only)")
        if isinstance(model, StatefulBiLM):
            return model.bilm  # the stateless model inside; the wrapper's carried state is left alone
        return model if isinstance(model, BiLM) else model.bilm
    if isinstance(model, (str, os.PathLike)):
        if weight_file is not None:
            if not isinstance(weight_file, (str, os.PathLike)):
                raise UsageError(f"weight_file must be the path of the HDF5 weight file, got {weight_file!r} "
                                 "(batch_size and the other options are keyword-only: Embedder(model, batch_size=64))")
            from .weights.original import load_original

            return load_original(model, weight_file)
        path = Path(model)
        if path.is_file():
            if path.suffix.lower() == ".json":
                raise UsageError(f"{path} is an options file: pass its HDF5 weight file too, "
                                 "Embedder(options_file, weight_file)")
            raise UsageError(f"{path} is a file; {_MODEL_HELP}")
        from .weights.native import load_pretrained_bilm

        return load_pretrained_bilm(model)
    raise UsageError(f"Embedder got a {type(model).__name__} as its model: {_MODEL_HELP}")


class Embedder:
    """Embed tokenised sentences with a (frozen) :class:`BiLM`, stateless, in length-sorted batches.

    Args:
        model: a :class:`BiLM`, an :class:`~elmokit.Elmo` (its biLM is used), an ``options.json`` path with
            ``weight_file`` the HDF5 path (AllenNLP's ``ElmoEmbedder(options_file, weight_file)`` habit), or a single
            model folder / released model name (see :func:`resolve_model`). The model is put in eval mode; a
            :class:`~elmokit.modules.bilm.StatefulBiLM` is run through its stateless BiLM (its carried state is left
            alone). One Embedder (or one BiLM) may be used from several threads at once: nothing is stored per call.
        weight_file: the HDF5 weight file, with an options path as ``model``.
        batch_size: sentences per forward pass (at most).
        device: where to run — ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``, checked by
            :func:`elmokit.devices.resolve_device` (default ``None``: where the model already is). The model is moved
            there.
        char_vocab: for models trained in the character-vocabulary mode (default: ``bilm.char_vocab``, set by the
            loaders).
        max_batch_tokens: padded token positions per forward pass (at most; a longer sentence goes alone), which
            bounds memory when a file has a few very long lines. Used by :meth:`embed_sentences` / :meth:`embed_file`.
        empty_tokens: ``"error"`` (default): an empty or whitespace-only token raises :class:`InputError` naming
            sentence and position; ``"keep"``: it is embedded as the original does (see :mod:`elmokit.characters`).

    Raises:
        UsageError: a model of the wrong kind, a bad option value, a device this machine lacks.
        ConfigError / WeightsError / MissingFileError: from loading a model given by path.

    Source: AllenNLP ``ElmoEmbedder`` (``embed_sentence``, ``embed_sentences``, ``embed_file``); outputs match
    AllenNLP's with its state reset before every batch.
    """

    def __init__(self, model: BiLM | object, weight_file: str | os.PathLike | None = None, *, batch_size: int = 64,
                 device: str | torch.device | None = None, char_vocab: CharVocabulary | None = None,
                 max_batch_tokens: int = 8192, empty_tokens: str = "error") -> None:
        self.batch_size = _positive_int("batch_size", batch_size)
        self.max_batch_tokens = _positive_int("max_batch_tokens", max_batch_tokens)
        if empty_tokens not in _EMPTY_TOKEN_MODES:
            raise UsageError(f"empty_tokens must be one of {_EMPTY_TOKEN_MODES}, got {empty_tokens!r}")
        self.empty_tokens = empty_tokens
        if device is not None:
            from .devices import resolve_device

            target = resolve_device(device)
        else:
            target = None
        bilm = resolve_model(model, weight_file)
        self.bilm = bilm.eval()
        self.device = target if target is not None else next(bilm.parameters()).device
        self.bilm.to(self.device)
        if char_vocab is not None and not isinstance(char_vocab, CharVocabulary):
            raise UsageError(f"char_vocab must be a CharVocabulary, got {type(char_vocab).__name__}")
        self.char_vocab = char_vocab if char_vocab is not None else getattr(bilm, "char_vocab", None)
        if bilm.config.char_cnn.char_vocab_size is not None and self.char_vocab is None:
            raise UsageError("this model reads a character vocabulary (config char_vocab_size="
                             f"{bilm.config.char_cnn.char_vocab_size}); pass char_vocab= or load it with load_native, "
                             "which reads chars.txt")
        #: line numbers (1-based) that the last :meth:`embed_file` call skipped with ``decode_errors="skip"``
        self.skipped_lines: list[int] = []

    @property
    def output_dim(self) -> int:
        """2P, the width of each layer."""
        return self.bilm.output_dim

    @property
    def num_layers(self) -> int:
        """L + 1."""
        return self.bilm.num_layers

    def _ids(self, batch: Sequence[Sequence[str]]) -> torch.Tensor:
        c = self.bilm.config.char_cnn.max_characters_per_token
        # already validated (with the caller's empty_tokens): "keep" only skips a second blank-token scan
        return batch_to_ids(batch, c, char_vocab=self.char_vocab, empty_tokens="keep").to(self.device)

    def _embed_valid(self, batch: list[Sequence[str]]) -> list[np.ndarray]:
        if not batch:
            return []
        with torch.inference_mode():
            out = self.bilm(self._ids(batch))
        layers = out.layers.float().cpu().numpy()
        return [layers[i, :, : len(s)] for i, s in enumerate(batch)]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """B sentences → B float32 arrays of shape (L+1, n_i, 2P), in one forward pass.

        Raises :class:`InputError` for malformed input (names sentence and token)."""
        return self._embed_valid(validate_sentences(batch, empty_tokens=self.empty_tokens))

    def embed_sentence(self, tokens: Sequence[str]) -> np.ndarray:
        """One sentence (list of str) → (L+1, n, 2P) float32. An empty sentence gives (L+1, 0, 2P).

        Raises :class:`InputError` for a string (tokenise it first) or malformed tokens."""
        if isinstance(tokens, (str, bytes)):
            raise InputError("embed_sentence expects a list of tokens, not a string; use text.split()")
        return self.embed_batch([tokens])[0]

    def embed_sentences(self, sentences: Iterable[Sequence[str]], batch_size: int | None = None,
                        ) -> Iterator[np.ndarray]:
        """Yield (L+1, n_i, 2P) arrays in input order. Works on a stream: reads ``batch_size × 32`` sentences at a time
        and sorts them by length internally, so padding is small. Errors name the sentence by its position in the
        whole stream (0-based)."""
        batch_size = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        if isinstance(sentences, (str, bytes)):
            validate_sentences(sentences)  # raises the "single string" InputError
        chunk: list[Sequence[str]] = []
        start = 0
        for sentence in sentences:
            chunk.append(sentence)
            if len(chunk) == batch_size * 32:
                yield from self._embed_chunk(chunk, batch_size, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._embed_chunk(chunk, batch_size, start)

    def _embed_chunk(self, chunk: list[Sequence[str]], batch_size: int, start: int = 0) -> Iterator[np.ndarray]:
        chunk = validate_sentences(chunk, empty_tokens=self.empty_tokens, start=start)
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i]))
        results: list[np.ndarray | None] = [None] * len(chunk)
        first = 0
        while first < len(order):
            interrupts.check()
            # at most batch_size sentences and max_batch_tokens padded positions (one very long line is embedded
            # alone instead of padding batch_size others to its length)
            end = first + 1
            while (end < len(order) and end - first < batch_size
                   and (end - first + 1) * len(chunk[order[end]]) <= self.max_batch_tokens):
                end += 1
            idx = order[first:end]
            for i, arr in zip(idx, self._embed_valid([chunk[i] for i in idx])):
                results[i] = arr
            first = end
        yield from results  # type: ignore[misc]

    def embed_file(self, input_path: str | os.PathLike, output_path: str | os.PathLike, *, layers: str = "all",
                   batch_size: int | None = None, progress: bool = True, decode_errors: str = "strict") -> int:
        """Embed a file of whitespace-tokenised sentences (one per line, UTF-8) into HDF5, written atomically.

        Dataset ``"i"`` holds line i+1's vectors (datasets are 0-based, lines 1-based): (L+1, n, 2P) float32 for
        ``layers="all"``, (n, 2P) for ``"top"`` or ``"average"``; ``"sentence_to_index"`` is a JSON map from each
        line's text (stripped) to its dataset name, the last one for repeated lines — as AllenNLP's ``elmo`` command.
        Unlike AllenNLP, which refuses blank lines, a blank line gives a zero-length array, so dataset numbers always
        equal line numbers − 1. A byte-order mark at the start of the file is not part of the first token.

        ``decode_errors`` is what to do with a line that is not valid UTF-8 (:func:`elmokit.data.corpus.read_lines`):
        ``"strict"`` (default) raises naming file and line; ``"replace"`` / ``"ignore"`` decode it as Python does;
        ``"skip"`` leaves it out — its dataset is then a zero-length array (numbers still follow lines) and it has no
        ``sentence_to_index`` entry; the skipped line numbers are logged and kept in :attr:`skipped_lines`.

        Returns the number of datasets written (= lines in the file).

        Raises:
            UsageError: unknown ``layers`` / ``decode_errors``, a bad ``batch_size``, ``output_path`` is the input
                file or a folder.
            MissingFileError: no input file (or a folder).
            DataError: a line that is not UTF-8 with ``decode_errors="strict"`` (names the file and line).
            InputError: cannot happen for file input (lines are split on whitespace, so no blank tokens).
        """
        if layers not in _LAYER_MODES:
            raise UsageError(f"layers must be one of {_LAYER_MODES}, got {layers!r}")
        if decode_errors not in _DECODE_MODES:
            raise UsageError(f"decode_errors must be one of {_DECODE_MODES}, got {decode_errors!r}")
        if batch_size is not None:
            _positive_int("batch_size", batch_size)
        input_path, output_path = Path(input_path), Path(output_path)
        if input_path.is_dir():
            raise MissingFileError(f"input {input_path} is a folder; expected a text file, one sentence per line")
        if not input_path.is_file():
            raise MissingFileError(f"input file {input_path}: no such file")
        if output_path.is_dir():
            raise UsageError(f"the output {output_path} is a folder; give the HDF5 file to write")
        if output_path.resolve() == input_path.resolve():
            raise UsageError(f"the output {output_path} is the input file: choose another output path")
        import json

        import h5py
        from tqdm.auto import tqdm

        from .data.corpus import read_lines

        numbered = read_lines(input_path, errors=decode_errors)
        if decode_errors == "skip":
            with open(input_path, "rb") as fh:
                total = sum(1 for _ in fh)  # the same line splitting as read_lines
        else:
            total = len(numbered)
        present = {number for number, _ in numbered}
        self.skipped_lines = [n for n in range(1, total + 1) if n not in present]
        if self.skipped_lines:
            shown = ", ".join(map(str, self.skipped_lines[:10])) + (" ..." if len(self.skipped_lines) > 10 else "")
            logger.warning("%s: skipped %d line(s) that are not valid UTF-8 (line %s); their datasets are empty",
                           input_path, len(self.skipped_lines), shown)
        sentences = [text.split() for _, text in numbered]
        l1, d = self.num_layers, self.output_dim
        empty = np.zeros((l1, 0, d) if layers == "all" else (0, d), dtype=np.float32)
        index: dict[str, str] = {}
        vectors = self.embed_sentences(sentences, batch_size)
        with atomic_path(output_path, suffix=".hdf5") as tmp, h5py.File(tmp, "w") as out:
            with tqdm(total=total, unit="sent", disable=not progress, desc="embedding") as bar:
                self._write_datasets(out, total, present, numbered, vectors, layers, empty, index, bar)
            out.create_dataset("sentence_to_index", data=np.array([json.dumps(index)], dtype=h5py.string_dtype()))
        logger.info("wrote %d sentences to %s", total, output_path)
        return total

    @staticmethod
    def _write_datasets(out, total, present, numbered, vectors, layers, empty, index, bar) -> None:
        texts = iter(numbered)
        for number in range(1, total + 1):
            if number in present:
                _, text = next(texts)
                arr = next(vectors)
                if layers == "top":
                    arr = arr[-1]
                elif layers == "average":
                    arr = arr.mean(axis=0)
                index[text.strip()] = str(number - 1)
            else:
                arr = empty
            out.create_dataset(str(number - 1), data=arr)
            bar.update(1)
