"""``Embedder``: sentences and files → ELMo layer arrays (NumPy), sentence vectors and HDF5 files.

File output (streamed, in parts, resumable, several workers) is :mod:`elmokit.embedding.writer`; pooling and layer
selection are :mod:`elmokit.embedding.pooling`.

**Embedding a file** (:meth:`Embedder.embed_file`). The work is written in parts of ``part_size`` lines, each finalised
atomically; an interrupted call (Ctrl-C, SIGTERM, kill -9) called again with ``resume=True`` continues from the
finished parts and gives the same keys and values as an uninterrupted one. ``format``:

* ``"allennlp"`` (the default of ``embed_file``, as AllenNLP's ``ElmoEmbedder.embed_file``): one file; dataset
  ``"i"`` holds line i+1's array; ``"sentence_to_index"`` a JSON map from each stripped line to its dataset, the last
  one for repeated lines (built in memory at the end: for small and medium files).
* ``"hdf5"``: the same datasets, and a ``"sentences"`` string dataset (entry i = line i+1, stripped) instead of the
  JSON map: constant memory (the default of ``elmokit embed``).
* ``"parts"``: ``output_path`` is a folder of part files and an ``index.json``, nothing merged (no second copy on
  disk); read it with :func:`elmokit.embedding.writer.open_embeddings`.

Datasets are 0-based, lines 1-based; a blank line gives a zero-length array (a zero vector when pooled), so dataset
numbers follow line numbers. A byte-order mark at the start is not part of the first token. ``use_sentence_keys``:
each dataset is named by its stripped line (AllenNLP's ``use_sentence_keys``; ``/``, ``%``, NUL and a lone ``.`` are
%-escaped, see :func:`elmokit.embedding.writer.sentence_key`), a repeated line is written once, blank lines are left
out, and there is no sentence map. ``forget_sentences``: no sentence map.

``decode_errors`` is what to do with a line that is not text (invalid UTF-8, or a NUL byte:
:func:`elmokit.data.corpus.line_problem`): ``"strict"`` (default) raises naming file, line and column, before any
work; ``"replace"`` / ``"ignore"`` turn the bad bytes and NULs into U+FFFD or drop them; ``"skip"`` leaves the line
out — its dataset is then a zero-length array and it has no sentence entry; the skipped line numbers are logged and
kept in :attr:`Embedder.skipped_lines`. Other control characters are kept. The first 2,000 lines are checked against
the model (:func:`elmokit.data.text_checks.check_tokenisation`): lines that look untokenised (raw Chinese without
``tokenizer="jieba"``) log a warning naming the fix.

An existing output (an HDF5 file this method wrote, :func:`elmokit.embedding.reader.is_elmokit_embeddings`, or a
``"parts"`` folder holding finished embeddings) is replaced only with ``overwrite=True``; any other file (a text
file, another program's HDF5) is refused also then, and the output is never the input file (after symlinks and hard
links: :func:`elmokit.io.check_output_path`). An interrupted run's parts are continued with ``resume=True`` or
discarded with ``overwrite=True``. One writer at a time: the parts folder is locked while the call runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from elmokit import interrupts
from elmokit.characters import CharVocabulary, batch_to_ids, validate_sentences, validate_tokens
from elmokit.checks import check_int, positive_int
from elmokit.devices import resolve_device
from elmokit.elmo import Elmo, TokenVectorCache
from elmokit.embedding.pooling import OutputSpec
from elmokit.embedding.recent_words import RecentWordVectors
from elmokit.embedding.writer import EmbedJob
from elmokit.errors import ConfigError, UsageError, UsageTypeError
from elmokit.modules import invariant, native
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.modules.precision import autocast, check_precision
from elmokit.weights.archive import is_model_archive
from elmokit.weights.native import load_pretrained_bilm

__all__ = ["Embedder"]

logger = logging.getLogger(__name__)

_EMPTY_TOKEN_MODES = ("error", "keep")

_MODEL_HELP = (
    "pass a BiLM, an Elmo, an options.json path with its weight file (Embedder(options_file, "
    "weight_file), as AllenNLP's ElmoEmbedder), a model folder, or a released model name"
)


def resolve_model(model: object, weight_file: str | os.PathLike | None = None) -> BiLM:
    """What :class:`Embedder` accepts as its model → a :class:`BiLM`.

    * a :class:`BiLM`; an :class:`~elmokit.Elmo` (its biLM);
    * an ``options.json`` path and ``weight_file`` the HDF5 (AllenNLP's ``ElmoEmbedder(options_file, weight_file)``);
    * a single path or name: a native model folder, an original-format folder, a zip of one (the NLPL repository's),
      or a released model name (:func:`~elmokit.weights.native.load_pretrained_bilm`).

    Raises:
        UsageTypeError: (also a ``TypeError``) a model of another type, or ``weight_file`` with a model object or not
            a path (the message says what to pass).
        UsageError: an options file without its weight file, or another file (the message says what to pass).
        MissingFileError / ConfigError / WeightsError: from the loaders (naming the file).
    """
    if isinstance(model, (BiLM, StatefulBiLM, Elmo)):
        if weight_file is not None:
            raise UsageTypeError(
                f"weight_file is only for an options.json path; the {type(model).__name__} given "
                "already has its weights (did you mean batch_size=...? it is keyword-only)"
            )
        if isinstance(model, StatefulBiLM):
            return model.bilm  # the stateless model inside; the wrapper's carried state is left alone
        return model if isinstance(model, BiLM) else model.bilm
    if isinstance(model, (str, os.PathLike)):
        if weight_file is not None:
            if not isinstance(weight_file, (str, os.PathLike)):
                raise UsageTypeError(
                    f"weight_file must be the path of the HDF5 weight file, got {weight_file!r} "
                    "(batch_size and the other options are keyword-only: Embedder(model, batch_size=64))"
                )
            from elmokit.weights.original import load_original  # lazy: CLI start-up (it imports h5py)

            return load_original(model, weight_file)
        path = Path(model)
        if path.is_file() and not is_model_archive(path):
            if path.suffix.lower() == ".json":
                raise UsageError(
                    f"{path} is an options file: pass its HDF5 weight file too, Embedder(options_file, weight_file)"
                )
            raise UsageError(f"{path} is a file; {_MODEL_HELP}")
        return load_pretrained_bilm(model)
    raise UsageTypeError(f"Embedder got a {type(model).__name__} as its model: {_MODEL_HELP}")


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
        vocab_to_cache: a word list whose layer-0 token vectors are computed once and reused (AllenNLP's
            ``vocab_to_cache``; every entry is a word, there is no padding entry here), or a ready
            :class:`~elmokit.TokenVectorCache` built from this model. Words outside it are encoded from their
            characters, per word, so a batch may mix both; results equal the uncached ones to float rounding (the
            token encoder is context-free).
        precision: ``"fp32"`` (default) or ``"bf16"``: the matrix products in bfloat16 under autocast, the LSTM cell
            state, clips and the outputs in float32 (:mod:`elmokit.modules.precision`). Opt-in: bf16 moves the
            vectors by about 1e-2 of their scale (docs/how-to/bf16.md gives the measured errors);
            the native batch-1 kernels and the TorchScript loop are float32-only, so bf16 runs the plain loop.
        recent_word_cache: keep the layer-0 vectors of up to this many recently seen words
            (:class:`~elmokit.embedding.recent_words.RecentWordVectors`, least recently used out first; ``capacity ×
            P`` float32 values allocated now), so a word met again skips the character CNN. Default 0: off. For
            long-running embedders (``elmokit serve`` keeps 50,000 by default). Values equal the uncached ones to
            float rounding, within the batch-independence bound below (a kept vector was computed in another batch);
            with it, ``batch_size=1`` results are no longer bitwise independent of the order.
        batch_invariant: ``True``: float32 CPU passes run the batch-invariant kernels
            (:mod:`elmokit.modules.invariant`), so a sentence's vectors are the same bits alone, in any batch, in any
            order, at any ``batch_size``, thread count or number of workers (and the recent-word cache's and the token
            cache's vectors equal freshly computed ones bit for bit); it needs the native kernels (elsewhere, and under
            bf16, the default paths run). 0.72× the default's tokens/s at batch 64 (docs/explanation/numerics.md).
            ``False``: the default paths, batch-independent up to float rounding (see :meth:`embed_sentences`).
            ``None`` (default): the process default, off unless ``ELMOKIT_BATCH_INVARIANT=1``.

    The token layer is computed per distinct word of a batch, at most 256 words at a time through the character
    CNN, so one very long sentence does not run the CNN on all its tokens at once; the biLSTMs then run on the token
    vectors (:meth:`BiLM.forward_token_vectors`).

    Raises:
        UsageTypeError: (also a ``TypeError``) a model or option of the wrong type (``Embedder(42)``,
            ``batch_size="8"``, ``char_vocab`` not a :class:`CharVocabulary`).
        UsageError: a bad option value (``batch_size=0``), a device this machine lacks.
        ConfigError / WeightsError / MissingFileError: from loading a model given by path.

    Source: AllenNLP ``ElmoEmbedder`` (``embed_sentence``, ``embed_sentences``, ``embed_file``); outputs match
    AllenNLP's with its state reset before every batch.
    """

    #: distinct words sent through the character CNN at once (bounds its activations: ~0.4 MB a word for the
    #: released models' 2048 filters × 50 characters)
    char_chunk = 256

    def __init__(
        self,
        model: BiLM | object,
        weight_file: str | os.PathLike | None = None,
        *,
        batch_size: int = 64,
        device: str | torch.device | None = None,
        char_vocab: CharVocabulary | None = None,
        max_batch_tokens: int = 8192,
        empty_tokens: str = "error",
        vocab_to_cache: Sequence[str] | TokenVectorCache | None = None,
        precision: str = "fp32",
        recent_word_cache: int = 0,
        batch_invariant: bool | None = None,
    ) -> None:
        self.batch_size = positive_int("batch_size", batch_size)
        if batch_invariant is not None and not isinstance(batch_invariant, bool):
            raise UsageTypeError(f"batch_invariant must be True, False or None, got {batch_invariant!r}")
        #: the batch-invariant kernels on (True), off (False) or as the process default (None; see
        #: :mod:`elmokit.modules.invariant`)
        self.batch_invariant = batch_invariant
        try:
            self.precision = check_precision(precision, "Embedder precision")
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        self.max_batch_tokens = positive_int("max_batch_tokens", max_batch_tokens)
        if empty_tokens not in _EMPTY_TOKEN_MODES:
            raise UsageError(f"empty_tokens must be one of {_EMPTY_TOKEN_MODES}, got {empty_tokens!r}")
        self.empty_tokens = empty_tokens
        target = resolve_device(device) if device is not None else None
        bilm = resolve_model(model, weight_file)
        self.bilm = bilm.eval()
        self.device = target if target is not None else next(bilm.parameters()).device
        self.bilm.to(self.device)
        if char_vocab is not None and not isinstance(char_vocab, CharVocabulary):
            raise UsageTypeError(f"char_vocab must be a CharVocabulary, got {type(char_vocab).__name__}")
        self.char_vocab = char_vocab if char_vocab is not None else getattr(bilm, "char_vocab", None)
        if bilm.config.char_cnn.char_vocab_size is not None and self.char_vocab is None:
            raise UsageError(
                "this model reads a character vocabulary (config char_vocab_size="
                f"{bilm.config.char_cnn.char_vocab_size}); pass char_vocab= or load it with load_native, "
                "which reads chars.txt"
            )
        self.token_cache: TokenVectorCache | None = None
        self._cache_index: dict[str, int] = {}
        if vocab_to_cache is not None:
            self.set_token_cache(vocab_to_cache)
        check_int("recent_word_cache", recent_word_cache, 0)
        #: the recently seen words' layer-0 vectors (``None`` when ``recent_word_cache=0``)
        self.recent_words: RecentWordVectors | None = None
        #: line numbers (1-based) that the last :meth:`embed_file` call skipped with ``decode_errors="skip"``
        self.skipped_lines: list[int] = []
        self._warm_up()
        if recent_word_cache:  # after the warm-up, whose synthetic words it need not keep
            self.recent_words = RecentWordVectors(
                recent_word_cache,
                self.bilm.config.lstm.projection_dim,
                tuple(self.bilm.token_encoder.parameters()),
                self.device,
            )

    def _warm_up(self) -> None:
        """Build the inference weights the model makes lazily, for both paths, now: for one sentence the native
        kernels' packed copies, for more tokens and rows the fused highway and the reordered LSTM copies. The first
        call to take a path otherwise paid for them: 40 ms of a 15 ms call at batch 3 on the small shape, 4× its
        steady time (``bench/cold_start.py``). Two passes over a few synthetic words; nothing is kept but the
        model's caches: the stateless pass runs even in a subclass whose own passes carry a state."""
        few = [["a", "b"]]
        many = [[f"w{i}", f"v{i}"] for i in range(native.MAX_LSTM_ROWS + 1)]  # > 12 tokens, > MAX_LSTM_ROWS rows
        spec = self.output_spec()
        for batch in (few, many):
            Embedder._forward(self, batch, spec)

    def set_token_cache(self, vocab_to_cache: Sequence[str] | TokenVectorCache | None) -> None:
        """Use (or, with ``None``, stop using) a token-vector cache; see the ``vocab_to_cache`` argument.

        Raises:
            UsageError: not a word list / :class:`TokenVectorCache`, or a cache whose vector width is not this
                model's projection size P."""
        if vocab_to_cache is None:
            self.token_cache, self._cache_index = None, {}
            return
        if isinstance(vocab_to_cache, TokenVectorCache):
            cache = vocab_to_cache
        else:
            if self.char_vocab is not None and getattr(self.bilm, "char_vocab", None) is not self.char_vocab:
                raise UsageError(
                    "vocab_to_cache with a char_vocab= different from the model's: build the "
                    "TokenVectorCache yourself and pass it"
                )
            with invariant.batch_invariant(getattr(self, "batch_invariant", None)):  # the passes' own kernels
                cache = TokenVectorCache(self.bilm, vocab_to_cache)
        p = self.bilm.config.lstm.projection_dim
        if cache.vectors.dim() != 2 or cache.vectors.shape[1] != p or cache.vectors.shape[0] != len(cache.words):
            raise UsageError(
                f"the TokenVectorCache holds vectors of shape {tuple(cache.vectors.shape)}; this model "
                f"needs ({len(cache.words)}, {p}): build it from this model"
            )
        self.token_cache = cache.to(self.device)
        self._cache_index = {w: i for i, w in enumerate(cache.words)}

    @property
    def output_dim(self) -> int:
        """2P, the width of each layer."""
        return self.bilm.output_dim

    @property
    def num_layers(self) -> int:
        """L + 1."""
        return self.bilm.num_layers

    def output_spec(
        self, layers: object = "all", pool: str = "none", keep_sentence_boundaries: bool = False, dtype: str = "float32"
    ) -> OutputSpec:
        """An :class:`~elmokit.embedding.pooling.OutputSpec` checked against this model (raises :class:`UsageError`)."""
        return OutputSpec.make(layers, pool, keep_sentence_boundaries, dtype, num_layers=self.num_layers)

    # ------------------------------------------------------------------------------------------ one forward pass
    def token_vectors(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """B validated sentences → layer-0 token vectors (B, T, P) float and mask (B, T) bool, computed once per
        distinct word: from the cache where the word is in it, else from its characters, ``char_chunk`` words at a
        time. Equal to :meth:`TokenEncoder.forward` of the batch's character ids to float rounding."""
        p = self.bilm.config.lstm.projection_dim
        b, t = len(batch), max((len(s) for s in batch), default=0)
        slot: dict[str, int] = {}
        index = torch.zeros((b, t), dtype=torch.long)
        for i, sentence in enumerate(batch):
            row = [slot.setdefault(w, len(slot)) for w in sentence]
            if row:
                index[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        lengths = torch.tensor([len(s) for s in batch], dtype=torch.long)
        mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
        words = list(slot)
        weight = self.bilm.token_encoder.projection.weight
        unique = torch.zeros((len(words), p), dtype=weight.dtype, device=self.device)
        cached = [(k, self._cache_index[w]) for k, w in enumerate(words) if w in self._cache_index]
        if cached:
            rows = torch.tensor([k for k, _ in cached], dtype=torch.long, device=self.device)
            ids = torch.tensor([j for _, j in cached], dtype=torch.long, device=self.device)
            unique[rows] = self.token_cache.vectors[ids].to(unique.dtype)
        todo = [k for k, w in enumerate(words) if w not in self._cache_index] if cached else list(range(len(words)))
        recent = self.recent_words
        if recent is not None and todo:
            todo = [todo[i] for i in recent.fill([words[k] for k in todo], unique, todo)]
        c = self.bilm.config.char_cnn.max_characters_per_token
        for start in range(0, len(todo), self.char_chunk):
            part = todo[start : start + self.char_chunk]
            # already validated (with the caller's empty_tokens): "keep" only skips a second blank-token scan
            ids = batch_to_ids([[words[k]] for k in part], c, char_vocab=self.char_vocab, empty_tokens="keep")
            encoded = self.bilm.token_encoder.encode_unique(ids[:, 0].to(self.device)).to(unique.dtype)
            unique[torch.tensor(part, dtype=torch.long, device=self.device)] = encoded
            if recent is not None:
                recent.store([words[k] for k in part], encoded)
        vectors = unique[index.to(self.device)] if len(words) else unique.new_zeros((b, t, p))
        return vectors, mask.to(self.device)

    def _forward(self, batch: Sequence[Sequence[str]], spec: OutputSpec) -> list[np.ndarray]:
        """Validated sentences → their arrays under ``spec`` (one biLM pass)."""
        if not batch:
            return []
        exact = getattr(self, "batch_invariant", None)
        with invariant.batch_invariant(exact), torch.inference_mode(), autocast(self.precision, self.device):
            vectors, mask = self.token_vectors(batch)
            # without the boundary positions in the output, each direction's last step is skipped (exact)
            out = self.bilm.forward_token_vectors(
                vectors,
                mask,
                keep_sentence_boundaries=spec.keep_sentence_boundaries,
                boundary_steps=spec.keep_sentence_boundaries,
            )
            return spec.apply(out.layers, out.mask)

    def _batches(self, lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
        """Indices into ``lengths`` grouped into length-sorted batches: at most ``batch_size`` sentences and
        ``max_batch_tokens`` padded positions (a longer sentence goes alone)."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        first = 0
        while first < len(order):
            end = first + 1
            while (
                end < len(order)
                and end - first < batch_size
                and (end - first + 1) * lengths[order[end]] <= self.max_batch_tokens
            ):
                end += 1
            yield order[first:end]
            first = end

    # ------------------------------------------------------------------------------------------ public API
    def embed_batch(
        self,
        batch: Sequence[Sequence[str]],
        *,
        layers: object = "all",
        pool: str = "none",
        keep_sentence_boundaries: bool = False,
        dtype: str = "float32",
    ) -> list[np.ndarray]:
        """B sentences → B arrays, in one forward pass: (L+1, n_i, 2P) float32 by default.

        ``layers`` / ``pool`` / ``keep_sentence_boundaries`` / ``dtype`` as in
        :class:`~elmokit.embedding.pooling.OutputSpec`: e.g. ``layers="top", pool="mean"`` gives one (2P,) sentence
        vector each, the mean over real tokens only.

        Raises :class:`~elmokit.errors.InputTypeError` (also a ``TypeError``) for input of the wrong type (``batch``
        not a list of lists of str), :class:`~elmokit.errors.InputError` for a blank token (both name sentence and
        token), :class:`UsageError` for a bad option."""
        spec = self.output_spec(layers, pool, keep_sentence_boundaries, dtype)
        return self._forward(validate_sentences(batch, empty_tokens=self.empty_tokens, name="batch"), spec)

    def embed_sentence(self, tokens: Sequence[str], **options) -> np.ndarray:
        """One sentence (list of str) → (L+1, n, 2P) float32 (or as ``options``, see :meth:`embed_batch`). An empty
        sentence gives (L+1, 0, 2P).

        Raises :class:`~elmokit.errors.InputTypeError` (also a ``TypeError``) for ``tokens`` of the wrong type: a
        string (tokenise it first), a list of sentences, non-string tokens; :class:`~elmokit.errors.InputError` for
        a blank token."""
        return self.embed_batch([validate_tokens(tokens, name="embed_sentence(tokens)")], **options)[0]

    def embed_sentences(
        self,
        sentences: Iterable[Sequence[str]],
        batch_size: int | None = None,
        *,
        layers: object = "all",
        pool: str = "none",
        keep_sentence_boundaries: bool = False,
        dtype: str = "float32",
    ) -> Iterator[np.ndarray]:
        """Yield one array per sentence, in input order (shapes as :meth:`embed_batch`). Works on a stream: reads
        ``batch_size × 32`` sentences at a time and sorts them by length internally, so padding is small. Errors
        name the sentence by its position in the whole stream (0-based).

        A sentence's vectors do not depend on its neighbours, its batch or the order of the stream beyond float
        rounding, and with ``batch_invariant=True`` not at all (the same bits; ``tests/test_batch_invariance.py``).
        By default the rounding of products blocked by batch shape moves them a little, by how much depends on the
        model: ``bench/batch_invariance.py`` measured at most 1e-6 of each layer's largest |value| on random models of
        the small, medium and original shapes with sentences up to 200 tokens (the property test checks 1e-5 there),
        but a trained small-shape model moved a 160-token sentence by 3e-4 of its layer's scale (issue 39): the LSTMs
        amplify the differences along a long sentence. With ``batch_size=1`` they are bitwise the same whatever the
        order (each sentence runs alone).

        Raises :class:`~elmokit.errors.InputTypeError` (also a ``TypeError``) for ``sentences`` of the wrong type (a
        string, a flat list of tokens, not iterable, non-string tokens), :class:`~elmokit.errors.InputError` for a
        blank token, :class:`UsageError` for a bad option (:class:`~elmokit.errors.UsageTypeError` for one of the
        wrong type)."""
        batch_size = self.batch_size if batch_size is None else positive_int("batch_size", batch_size)
        spec = self.output_spec(layers, pool, keep_sentence_boundaries, dtype)
        if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Iterable):
            validate_sentences(sentences)  # raises the InputTypeError naming the expected form
        chunk: list[Sequence[str]] = []
        start = 0
        for sentence in sentences:
            chunk.append(sentence)
            if len(chunk) == batch_size * 32:
                yield from self._embed_chunk(chunk, batch_size, spec, start)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from self._embed_chunk(chunk, batch_size, spec, start)

    def _embed_chunk(
        self, chunk: list[Sequence[str]], batch_size: int, spec: OutputSpec, start: int = 0
    ) -> Iterator[np.ndarray]:
        chunk = validate_sentences(chunk, empty_tokens=self.empty_tokens, start=start)
        results: list[np.ndarray | None] = [None] * len(chunk)
        for idx in self._batches([len(s) for s in chunk], batch_size):
            interrupts.check()
            for i, arr in zip(idx, self._forward([chunk[i] for i in idx], spec)):
                results[i] = arr
        yield from results  # type: ignore[misc]

    def embed_file(
        self,
        input_path: str | os.PathLike,
        output_path: str | os.PathLike,
        *,
        layers: object = "all",
        batch_size: int | None = None,
        progress: bool = True,
        decode_errors: str = "strict",
        format: str = "allennlp",
        pool: str = "none",
        keep_sentence_boundaries: bool = False,
        dtype: str = "float32",
        use_sentence_keys: bool = False,
        forget_sentences: bool = False,
        tokenizer: str = "whitespace",
        resume: bool = False,
        workers: int = 1,
        worker_threads: int = 1,
        part_size: int = 10000,
        model_name: str | None = None,
        overwrite: bool = False,
    ) -> int:
        """Embed a text file, one sentence per line (UTF-8 whatever the locale), into HDF5, in constant memory,
        resumably (``resume=True`` continues an interrupted call). The output ``format`` (``"allennlp"``, ``"hdf5"``,
        ``"parts"``), the datasets and keys (``use_sentence_keys``, ``forget_sentences``), ``decode_errors``
        (``"strict"``, ``"replace"``, ``"ignore"``, ``"skip"``), and when an output is replaced (``overwrite``) are
        described in the module docstring (:mod:`elmokit.embedding.embedder`, "Embedding a file").

        ``layers`` / ``pool`` / ``keep_sentence_boundaries`` / ``dtype`` as :meth:`embed_batch`; ``tokenizer``:
        ``"whitespace"`` (``str.split``), ``"moses"`` (sacremoses, English) or ``"jieba"`` (Chinese word
        segmentation). ``part_size``: lines per part. ``workers`` > 1: that many processes (spawned; each
        ``worker_threads`` torch threads), each writing its own parts — a script calling this must guard its top level
        with ``if __name__ == "__main__"``; in a script whose top level is not guarded, the workers stop at once and a
        :class:`~elmokit.errors.UsageError` names the missing guard.

        Returns the number of lines in the file.

        Raises:
            UsageError: a bad option, ``output_path`` is the input file (also through a link) or the wrong kind of
                path, its folder cannot be written, it exists and ``overwrite`` is off or it is not a file elmokit
                wrote, an interrupted run's parts are there and neither ``resume`` nor ``overwrite`` is
                on, or ``resume`` with changed settings or input; ``workers`` > 1 called from the unguarded top level
                of a script.
            FolderInUseError: another process is writing the same output (names its pid and start time).
            MissingFileError: no input file (or a folder).
            DataError: a line that is not text (invalid UTF-8, a NUL byte) with ``decode_errors="strict"`` (names the
                file and line). A failure before any part is finished leaves no parts folder behind.
            EmbedWorkerError: a worker process died (the finished parts are kept for ``resume``).
        """
        job = EmbedJob(
            self,
            input_path,
            output_path,
            layers=layers,
            batch_size=batch_size,
            progress=progress,
            decode_errors=decode_errors,
            format=format,
            pool=pool,
            keep_sentence_boundaries=keep_sentence_boundaries,
            dtype=dtype,
            use_sentence_keys=use_sentence_keys,
            forget_sentences=forget_sentences,
            tokenizer=tokenizer,
            resume=resume,
            workers=workers,
            worker_threads=worker_threads,
            part_size=part_size,
            model_name=model_name,
            overwrite=overwrite,
        )
        total = job.run()
        self.skipped_lines = job.skipped_lines
        return total
