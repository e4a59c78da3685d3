"""``Embedder``: sentences and files → ELMo layer arrays (NumPy) and HDF5 files."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from .characters import CharVocabulary, batch_to_ids, validate_sentences
from .data.corpus import read_lines
from .io import atomic_path
from .modules.bilm import BiLM

__all__ = ["Embedder"]

logger = logging.getLogger(__name__)

_LAYER_MODES = ("all", "top", "average")


class Embedder:
    """Embed tokenised sentences with a (frozen) :class:`BiLM`, stateless, in length-sorted batches.

    Args:
        bilm: the model (put in eval mode; stateful mode is switched off for embedding).
        batch_size: sentences per forward pass (at most).
        max_batch_tokens: padded token positions per forward pass (at most; a longer sentence goes alone), which
            bounds memory when a file has a few very long lines. Used by :meth:`embed_sentences` / :meth:`embed_file`.
        device: where to run (default: the model's device).
        char_vocab: for models trained in the character-vocabulary mode (default: ``bilm.char_vocab``, set by the
            loaders).

    Source: AllenNLP ``ElmoEmbedder`` (``embed_sentence``, ``embed_sentences``, ``embed_file``); outputs match
    AllenNLP's with its state reset before every batch.
    """

    def __init__(self, bilm: BiLM, batch_size: int = 64, device: str | torch.device | None = None,
                 char_vocab: CharVocabulary | None = None, max_batch_tokens: int = 8192) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.max_batch_tokens = max_batch_tokens
        self.bilm = bilm.eval()
        self.bilm.stateful = False
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else next(bilm.parameters()).device
        self.bilm.to(self.device)
        self.char_vocab = char_vocab if char_vocab is not None else getattr(bilm, "char_vocab", None)
        if bilm.config.char_cnn.char_vocab_size is not None and self.char_vocab is None:
            raise ValueError("this model reads a character vocabulary (config char_vocab_size="
                             f"{bilm.config.char_cnn.char_vocab_size}); pass char_vocab= or load it with load_native, "
                             "which reads chars.txt")

    def _ids(self, batch: Sequence[Sequence[str]]) -> torch.Tensor:
        c = self.bilm.config.char_cnn.max_characters_per_token
        return batch_to_ids(batch, c, char_vocab=self.char_vocab).to(self.device)

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """B sentences → B float32 arrays of shape (L+1, n_i, 2P)."""
        batch = validate_sentences(batch)
        if not batch:
            return []
        with torch.inference_mode():
            out = self.bilm(self._ids(batch))
        layers = out.layers.float().cpu().numpy()
        return [layers[i, :, : len(s)] for i, s in enumerate(batch)]

    def embed_sentence(self, tokens: Sequence[str]) -> np.ndarray:
        """One sentence (list of str) → (L+1, n, 2P) float32. An empty sentence gives (L+1, 0, 2P)."""
        if isinstance(tokens, str):
            raise TypeError("embed_sentence expects a list of tokens, not a string; use text.split()")
        return self.embed_batch([tokens])[0]

    def embed_sentences(self, sentences: Iterable[Sequence[str]], batch_size: int | None = None,
                        ) -> Iterator[np.ndarray]:
        """Yield (L+1, n_i, 2P) arrays in input order. Works on a stream: reads ``batch_size × 32`` sentences at a time
        and sorts them by length internally, so padding is small."""
        batch_size = batch_size or self.batch_size
        chunk: list[Sequence[str]] = []
        for sentence in sentences:
            chunk.append(sentence)
            if len(chunk) == batch_size * 32:
                yield from self._embed_chunk(chunk, batch_size)
                chunk = []
        if chunk:
            yield from self._embed_chunk(chunk, batch_size)

    def _embed_chunk(self, chunk: list[Sequence[str]], batch_size: int) -> Iterator[np.ndarray]:
        validate_sentences(chunk)
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i]))
        results: list[np.ndarray | None] = [None] * len(chunk)
        start = 0
        while start < len(order):
            # at most batch_size sentences and max_batch_tokens padded positions (one very long line is embedded
            # alone instead of padding batch_size others to its length)
            end = start + 1
            while (end < len(order) and end - start < batch_size
                   and (end - start + 1) * len(chunk[order[end]]) <= self.max_batch_tokens):
                end += 1
            idx = order[start:end]
            for i, arr in zip(idx, self.embed_batch([chunk[i] for i in idx])):
                results[i] = arr
            start = end
        yield from results  # type: ignore[misc]

    def embed_file(self, input_path: str | os.PathLike, output_path: str | os.PathLike, *, layers: str = "all",
                   batch_size: int | None = None, progress: bool = True) -> int:
        """Embed a file of whitespace-tokenised sentences (one per line, UTF-8) into HDF5, written atomically.

        Dataset ``"i"`` holds line i's (0-based) vectors: (L+1, n, 2P) for ``layers="all"``, (n, 2P) for ``"top"`` or
        ``"average"``; ``"sentence_to_index"`` is a JSON map from each line's text (stripped) to its dataset name, the
        last one for repeated lines — as AllenNLP's ``elmo`` command. Unlike AllenNLP, which refuses blank lines,
        a blank line gives a zero-length array, so dataset numbers always equal line numbers − 1.
        Returns the number of sentences.

        Raises:
            ValueError: unknown ``layers``; ``output_path`` is ``input_path``; a line that is not UTF-8 (names the file
                and line).
            FileNotFoundError: no input file.
        """
        if layers not in _LAYER_MODES:
            raise ValueError(f"layers must be one of {_LAYER_MODES}, got {layers!r}")
        if Path(output_path).resolve() == Path(input_path).resolve():
            raise ValueError(f"the output {output_path} is the input file: choose another output path")
        import json

        import h5py
        from tqdm.auto import tqdm

        lines = [text for _, text in read_lines(input_path)]
        sentences = [line.split() for line in lines]
        index: dict[str, str] = {}
        with atomic_path(output_path, suffix=".hdf5") as tmp, h5py.File(tmp, "w") as out:
            bar = tqdm(total=len(sentences), unit="sent", disable=not progress, desc="embedding")
            for i, arr in enumerate(self.embed_sentences(sentences, batch_size)):
                if layers == "top":
                    arr = arr[-1]
                elif layers == "average":
                    arr = arr.mean(axis=0)
                out.create_dataset(str(i), data=arr)
                index[lines[i].strip()] = str(i)
                bar.update(1)
            bar.close()
            out.create_dataset("sentence_to_index", data=np.array([json.dumps(index)], dtype=h5py.string_dtype()))
        logger.info("wrote %d sentences to %s", len(sentences), output_path)
        return len(sentences)
