"""Cached biLM layer features for the frozen-ELMo task models, and the random-weight biLM control.

With the biLM frozen, its L+1 layer outputs h_{t,j} for a dataset do not change during task training; only the
ScalarMix ELMo(w_t) = γ Σ_j softmax(s)_j h_{t,j} (Peters et al. 2018, eq. 1) and the task model learn. So the layers
are computed once per dataset (:func:`compute_layer_features`), kept as one flat float16 array, and each training
batch is cut from it (:meth:`LayerFeatures.batch`); the learned mix applies to these exactly as to a live biLM.

**Memory**: (L+1) · D · 2 bytes per token (float16), D = 2P. For ``elmokit-en`` (L+1 = 3, D = 256) that is 1,536
bytes a token: CoNLL-2003 train (203,621 tokens) takes 313 MB (dev 79 MB, test 71 MB), EWT train (204,577) 314 MB;
a saved cache file is the same size plus a few hundred bytes.

**Exactness**: the layers are computed by :class:`elmokit.Embedder` in length-sorted batches; it guarantees a
sentence's vectors do not depend on its batch beyond float rounding (≤ 1e-4 max abs, tested on small models), and
float16 storage adds a relative rounding error of at most 2^-11 (≈ 4.9e-4 relative; |x| < 4 for clipped LSTM
outputs → ≤ 2e-3 absolute). Values beyond float16's range (65,504) are refused rather than stored as inf.

**Cache files** (safetensors, written atomically): tensors ``layers`` (total_tokens, L+1, D) float16 and ``offsets``
(N+1,) int64, metadata the biLM's name and sha256 (:func:`bilm_sha256`: the package's one biLM fingerprint,
:func:`elmokit.weights.fingerprint.bilm_fingerprint`, over its configuration, character vocabulary and weights) and
the sha256 of the sentences (:func:`sentences_sha256`). A cache made by another biLM or for other sentences is refused
by :meth:`LayerFeatures.load` and recomputed by :func:`compute_layer_features`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from tqdm.auto import tqdm

from elmokit.data.tokenizers import load_tokenizer
from elmokit.embedding import Embedder, resolve_model
from elmokit.errors import DataError, InputError, MissingFileError, UsageError
from elmokit.io import atomic_path
from elmokit.modules.bilm import BiLM
from elmokit.weights.fingerprint import bilm_fingerprint

__all__ = [
    "LayerFeatures",
    "compute_layer_features",
    "char_features_from_words",
    "segment_characters",
    "zoo_segmenter",
    "random_bilm_like",
    "bilm_sha256",
    "sentences_sha256",
    "FORMAT",
]

logger = logging.getLogger(__name__)

#: ``format`` metadata value of a cache file.
FORMAT = "elmokit-layer-features-1"
_FLOAT16_MAX = float(np.finfo(np.float16).max)


# ============================================================================================ fingerprints
def bilm_sha256(bilm) -> str:
    """The biLM fingerprint (:func:`elmokit.weights.fingerprint.bilm_fingerprint`: hex sha256 of its configuration,
    character vocabulary and weights): equal for two models exactly when their features are. ``bilm``: a
    :class:`~elmokit.BiLM`, an :class:`~elmokit.Elmo` or anything :func:`elmokit.embedding.resolve_model` accepts.

    Raises:
        UsageError / MissingFileError / WeightsError: ``bilm`` cannot be resolved to a model."""
    return bilm_fingerprint(resolve_model(bilm))


def _token_lists(sentences: Iterable) -> list[list[str]]:
    """Token lists, or reader records (their ``tokens``), → list of lists of str."""
    out = []
    for i, s in enumerate(sentences):
        tokens = getattr(s, "tokens", s)
        if isinstance(tokens, (str, bytes)):
            raise InputError(f"sentence {i} is a string: expected a list of tokens (tokenise it first)")
        out.append(list(tokens))
    return out


def sentences_sha256(sentences: Iterable[Sequence[str]]) -> str:
    """Hex sha256 of token lists (each sentence as its JSON array, one a line): the cache key of a dataset."""
    h = hashlib.sha256()
    for s in _token_lists(sentences):
        h.update(json.dumps(s, ensure_ascii=False).encode("utf-8") + b"\n")
    return h.hexdigest()


# ============================================================================================ the container
class LayerFeatures:
    """The L+1 biLM layers of N sentences, stored flat: ``data`` (total_tokens, L+1, D) float16, sentence i's tokens
    are rows ``offsets[i]:offsets[i+1]``.

    Args:
        data: (total_tokens, L+1, D) array (stored as float16). offsets: (N+1,) int, ``offsets[0] == 0``,
            non-decreasing, ``offsets[-1] == total_tokens``. meta: string metadata (biLM name/sha256, sentences
            sha256, kind), kept in saved files.

    ``len()`` = N, :attr:`num_layers` = L+1, :attr:`dim` = D, :attr:`nbytes` = bytes held.

    Raises:
        UsageError: ``data`` not 3-d, or ``offsets`` inconsistent with it.
        DataError: a finite value beyond float16's range (it would become inf).
    """

    def __init__(self, data: np.ndarray, offsets: np.ndarray, meta: dict[str, str] | None = None) -> None:
        data = np.asarray(data)
        offsets = np.asarray(offsets, dtype=np.int64)
        if data.ndim != 3:
            raise UsageError(f"LayerFeatures data must be (total_tokens, L+1, D), got shape {tuple(data.shape)}")
        if (
            offsets.ndim != 1
            or len(offsets) < 1
            or offsets[0] != 0
            or offsets[-1] != data.shape[0]
            or np.any(np.diff(offsets) < 0)
        ):
            raise UsageError(
                f"LayerFeatures offsets must run from 0 to {data.shape[0]} without decreasing "
                f"(one more than the sentences), got {offsets[:5].tolist()}…{offsets[-2:].tolist()}"
            )
        if data.dtype != np.float16:
            converted = data.astype(np.float16)
            if data.size and not np.isfinite(converted).all() and np.isfinite(data).all():
                raise DataError(
                    f"a value of {float(np.abs(data).max()):.3g} does not fit float16 (max "
                    f"{_FLOAT16_MAX:g}); these features cannot be stored in float16"
                )
            data = converted
        self.data = data
        self.offsets = offsets
        self.meta: dict[str, str] = dict(meta or {})

    @property
    def num_layers(self) -> int:
        """L + 1."""
        return int(self.data.shape[1])

    @property
    def dim(self) -> int:
        """D = 2P, the width of each layer."""
        return int(self.data.shape[2])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """(N,) int64 tokens per sentence."""
        return np.diff(self.offsets)

    @property
    def total_tokens(self) -> int:
        return int(self.data.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays: total_tokens · (L+1) · D · 2 + 8 · (N+1)."""
        return int(self.data.nbytes + self.offsets.nbytes)

    def sentence(self, i: int) -> np.ndarray:
        """Sentence i's layers as (L+1, n_i, D) float32 (the :meth:`Embedder.embed_sentence` layout)."""
        if not -len(self) <= i < len(self):
            raise UsageError(f"sentence index {i} out of range for {len(self)} sentences")
        i %= len(self)
        return self.data[self.offsets[i] : self.offsets[i + 1]].astype(np.float32).transpose(1, 0, 2)

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The sentences ``indices`` as a padded batch: layers (B, L+1, T, D) float32, zero at padding, and mask
        (B, T) bool (True = real token), T = the longest of them — the shapes of ``BiLMOutput.layers`` / ``mask``.

        Raises :class:`UsageError` for an index out of range."""
        idx = np.asarray(list(indices), dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise UsageError(f"batch indices must lie in 0..{n - 1}, got {idx.min()}..{idx.max()}")
        idx %= max(n, 1)
        starts, lengths = self.offsets[idx], self.lengths[idx]
        b, t = len(idx), int(lengths.max()) if len(idx) else 0
        out = np.zeros((b, t, self.num_layers, self.dim), dtype=np.float32)
        mask = np.arange(t)[None, :] < lengths[:, None]
        if b and t:
            # one gather: row (i, k) of the batch is flat token starts[i] + k (clamped at padding, then masked)
            rows = np.minimum(starts[:, None] + np.arange(t)[None, :], max(self.total_tokens - 1, 0))
            out[mask] = self.data[rows[mask]]
        return torch.from_numpy(out).permute(0, 2, 1, 3).contiguous(), torch.from_numpy(mask)

    # ------------------------------------------------------------------------------------------ files
    def matches(self, bilm_sha: str | None = None, sentences_sha: str | None = None) -> bool:
        """Whether this cache was made by the biLM with sha256 ``bilm_sha`` for the sentences with sha256
        ``sentences_sha`` (``None`` = not checked)."""
        return (bilm_sha is None or self.meta.get("bilm_sha256") == bilm_sha) and (
            sentences_sha is None or self.meta.get("sentences_sha256") == sentences_sha
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write a safetensors file atomically (``layers`` float16, ``offsets`` int64, :attr:`meta` + ``format``).
        Returns ``path``."""
        path = Path(path)
        meta = {**{k: str(v) for k, v in self.meta.items()}, "format": FORMAT}
        with atomic_path(path, suffix=".safetensors") as tmp:
            save_file({"layers": np.ascontiguousarray(self.data), "offsets": self.offsets}, str(tmp), metadata=meta)
        return path

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, bilm_sha256: str | None = None, sentences_sha256: str | None = None
    ) -> LayerFeatures:
        """Read a file written by :meth:`save`. With ``bilm_sha256`` / ``sentences_sha256`` given, a cache made by
        another biLM or for other sentences is refused.

        Raises:
            MissingFileError: no such file.
            DataError: not a layer-features file (or damaged), or stale (the message names the file and what
                differs)."""
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"{path}: " + ("is a folder, not a features file" if path.is_dir() else "no such features file")
            )
        try:
            with safe_open(str(path), framework="numpy") as fh:
                meta = dict(fh.metadata() or {})
                if meta.get("format") != FORMAT:
                    raise DataError(
                        f"{path}: not an elmokit layer-features file (format {meta.get('format')!r}, "
                        f"expected {FORMAT!r})"
                    )
                data, offsets = fh.get_tensor("layers"), fh.get_tensor("offsets")
        except DataError:
            raise
        except Exception as exc:  # safetensors' own error types for a truncated or foreign file
            raise DataError(f"{path}: not a readable layer-features file ({type(exc).__name__}: {exc})") from None
        meta.pop("format", None)
        for key, want in (("bilm_sha256", bilm_sha256), ("sentences_sha256", sentences_sha256)):
            if want is not None and meta.get(key) != want:
                what = "another biLM" if key == "bilm_sha256" else "other sentences"
                raise DataError(
                    f"{path}: stale features cache, made for {what} ({key} {meta.get(key, 'missing')[:12]}"
                    f"… ≠ {want[:12]}…): delete it or let compute_layer_features recompute it"
                )
        try:
            return cls(data, offsets, meta)
        except UsageError as exc:
            raise DataError(f"{path}: inconsistent layer-features file ({exc})") from None

    def __repr__(self) -> str:
        return (
            f"LayerFeatures({len(self)} sentences, {self.total_tokens} tokens, {self.num_layers} layers × "
            f"{self.dim}, {self.nbytes / 2**20:.1f} MiB)"
        )


# ============================================================================================ computing
def _model_name(model: object, model_name: str | None) -> str:
    if model_name is not None:
        return str(model_name)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    return type(model).__name__


def _check_threads(n: object) -> int | None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise UsageError(f"num_threads must be None or an int >= 1, got {n!r}")
    return n


@contextlib.contextmanager
def _threads(n: int | None):
    """torch's intra-op threads set to ``n`` for the block (``None``: unchanged)."""
    if _check_threads(n) is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _try_cache(cache_path: str | os.PathLike | None, bilm_sha: str, sent_sha: str) -> LayerFeatures | None:
    if cache_path is None or not Path(cache_path).exists():
        return None
    try:
        cached = LayerFeatures.load(cache_path, bilm_sha256=bilm_sha, sentences_sha256=sent_sha)
    except DataError as exc:
        logger.warning("%s; recomputing it", exc)
        return None
    logger.info("layer features: loaded %s (%s)", cache_path, cached)
    return cached


def _embed_flat(
    embedder, sentences: list[list[str]], batch_size: int, progress: bool | str
) -> tuple[np.ndarray, np.ndarray]:
    """(total_tokens, L+1, D) float16 and (N+1,) offsets of ``sentences`` through ``embedder``."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = np.empty((int(offsets[-1]), embedder.num_layers, embedder.output_dim), dtype=np.float16)
    stream = embedder.embed_sentences(sentences, batch_size=batch_size)
    for i, arr in enumerate(
        tqdm(
            stream,
            total=len(sentences),
            disable=not progress,
            unit="sent",
            desc=progress if isinstance(progress, str) else "biLM layers",
        )
    ):
        if arr.size and float(np.abs(arr).max()) > _FLOAT16_MAX:
            raise DataError(
                f"sentence {i}: a biLM value of {float(np.abs(arr).max()):.3g} does not fit float16 "
                f"(max {_FLOAT16_MAX:g}); these features cannot be cached in float16"
            )
        data[offsets[i] : offsets[i + 1]] = arr.transpose(1, 0, 2)
    return data, offsets


def compute_layer_features(
    model: object,
    sentences: Sequence,
    *,
    batch_size: int = 64,
    cache_path: str | os.PathLike | None = None,
    progress: bool | str = False,
    model_name: str | None = None,
    num_threads: int | None = None,
) -> LayerFeatures:
    """The frozen biLM's L+1 layers for every sentence, computed once (see the module docstring for memory and
    exactness).

    Args:
        model: anything :class:`elmokit.Embedder` accepts — a zoo or released name, a model folder, a
            :class:`~elmokit.BiLM`, an :class:`~elmokit.Elmo` (its biLM; its mixes are not applied).
        sentences: token lists, or reader records (their ``tokens``). Empty sentences are allowed (0 rows).
        batch_size: sentences per biLM pass (length-sorted batches).
        cache_path: a ``.safetensors`` file: loaded when it was made by this biLM for these sentences, else
            (missing, stale or damaged) computed and written there atomically.
        progress: a tqdm bar over sentences (a string: the bar's label). model_name: the name recorded (default:
            ``model`` when it is a name/path, else its type).
        num_threads: torch threads for the computation (restored after; ``None``: unchanged). On a 2-core machine
            shared with other jobs, 1 thread was 12× faster than 2 (3,814 vs 311 tokens/s for ``elmokit-en``,
            load average 5.5): oversubscribed cores make torch's threads wait on each other.

    Returns: :class:`LayerFeatures`, ``meta`` holding ``bilm_name``, ``bilm_sha256``, ``sentences_sha256``, ``kind``
    = ``"words"``.

    Raises:
        InputError: a malformed sentence or token (from the Embedder, naming it). UsageError / MissingFileError /
        WeightsError: the model cannot be loaded. DataError: a value beyond float16's range.
    """
    _check_threads(num_threads)
    sents = _token_lists(sentences)
    embedder = Embedder(model, batch_size=batch_size)
    bilm_sha, sent_sha = bilm_sha256(embedder.bilm), sentences_sha256(sents)
    cached = _try_cache(cache_path, bilm_sha, sent_sha)
    if cached is not None:
        return cached
    with _threads(num_threads):
        data, offsets = _embed_flat(embedder, sents, batch_size, progress)
    features = LayerFeatures(
        data,
        offsets,
        {
            "bilm_name": _model_name(model, model_name),
            "bilm_sha256": bilm_sha,
            "sentences_sha256": sent_sha,
            "kind": "words",
        },
    )
    if cache_path is not None:
        features.save(cache_path)
        logger.info("layer features: wrote %s (%s)", cache_path, features)
    return features


# ============================================================================================ characters → words
def zoo_segmenter(name_or_dir: str | os.PathLike = "elmokit-zh") -> Callable[[str], list[str]]:
    """The zoo model's tokeniser (:func:`elmokit.data.tokenizers.load_tokenizer`: text → sentences of words) as
    ``text → words`` (the sentences concatenated), for :func:`char_features_from_words`."""
    tokenize = load_tokenizer(name_or_dir)
    return lambda text: [w for sentence in tokenize(text) for w in sentence]


def segment_characters(char_sentences: Sequence, segment: Callable[[str], object]) -> list[tuple[list[str], list[int]]]:
    """Segment character-tokenised sentences into words: for each sentence, ``(words, owner)`` where ``owner[i]`` is
    the index of the word holding token i. The tokens are joined (no separator) and given to ``segment`` (``str →
    list of words``, or → list of sentences of words, as :func:`elmokit.data.tokenizers.load_tokenizer` returns; empty
    words are dropped).

    Raises:
        DataError: the words do not re-join to the sentence's text exactly, or a token straddles two words (names the
            sentence — with its file and line for reader records — and the first differing position).
        UsageError: ``segment`` is not callable or returns something other than words."""
    if not callable(segment):
        raise UsageError(f"segment must be a callable str -> list of words, got {type(segment).__name__}")
    out = []
    for n, record in enumerate(char_sentences):
        tokens = list(getattr(record, "tokens", record))
        where = (
            f"{record.source}:{record.line}"
            if hasattr(record, "source") and hasattr(record, "line")
            else f"sentence {n}"
        )
        text = "".join(tokens)
        result = segment(text) if text else []
        if not isinstance(result, (list, tuple)):
            raise UsageError(f"segment returned a {type(result).__name__}; expected a list of words")
        words: list[str] = []
        for item in result:
            if isinstance(item, str):
                words.append(item)
            elif isinstance(item, (list, tuple)) and all(isinstance(w, str) for w in item):
                words.extend(item)
            else:
                raise UsageError(f"segment returned {item!r} among its words; expected strings (or lists of them)")
        words = [w for w in words if w]
        joined = "".join(words)
        if joined != text:
            k = next((i for i, (a, b) in enumerate(zip(joined, text)) if a != b), min(len(joined), len(text)))
            raise DataError(
                f"{where}: the segmenter's words do not re-join to the sentence: they differ at character "
                f"{k} ({text[k : k + 8]!r} vs {joined[k : k + 8]!r}); a segmenter must keep every character"
            )
        # owner of each character position, then of each token (the word holding its first character)
        char_owner = np.repeat(np.arange(len(words)), [len(w) for w in words]) if words else np.zeros(0, np.int64)
        owner, pos = [], 0
        for tok in tokens:
            if len(tok) == 0:
                raise InputError(f"{where}: an empty token at position {len(owner)}")
            first, last = int(char_owner[pos]), int(char_owner[pos + len(tok) - 1])
            if first != last:
                raise DataError(
                    f"{where}: token {len(owner)} {tok!r} straddles the words {words[first]!r} and {words[last]!r}"
                )
            owner.append(first)
            pos += len(tok)
        out.append((words, owner))
    return out


def char_features_from_words(
    model: object,
    char_sentences: Sequence,
    segment: Callable[[str], object],
    *,
    batch_size: int = 64,
    cache_path: str | os.PathLike | None = None,
    progress: bool | str = False,
    model_name: str | None = None,
    num_threads: int | None = None,
) -> LayerFeatures:
    """Layer features for character-tagged Chinese tasks from a word-level biLM: each sentence's characters are
    joined, segmented into words with ``segment`` (see :func:`segment_characters`; for the zoo model use
    ``zoo_segmenter("elmokit-zh")``, the jieba segmentation its corpus was made with), the words are embedded, and
    every character gets the L+1 vectors of the word it belongs to (issue 9: the Chinese biLM is word-level).

    Returns :class:`LayerFeatures` over the characters (``len`` = number of sentences, each sentence as many rows as
    characters); ``meta["kind"] = "chars-from-words"``, ``sentences_sha256`` over the characters *and* their words, so
    another segmentation does not reuse a cache. ``cache_path`` etc. as :func:`compute_layer_features`.

    Raises: DataError / UsageError from :func:`segment_characters`; the errors of :func:`compute_layer_features`.
    """
    _check_threads(num_threads)
    chars = _token_lists(char_sentences)
    segmented = segment_characters(char_sentences, segment)
    word_sentences = [words for words, _ in segmented]
    embedder = Embedder(model, batch_size=batch_size)
    bilm_sha = bilm_sha256(embedder.bilm)
    h = hashlib.sha256(b"chars-from-words\n")
    for c, w in zip(chars, word_sentences):
        h.update(json.dumps([c, w], ensure_ascii=False).encode("utf-8") + b"\n")
    sent_sha = h.hexdigest()
    cached = _try_cache(cache_path, bilm_sha, sent_sha)
    if cached is not None:
        return cached
    with _threads(num_threads):
        word_data, word_offsets = _embed_flat(embedder, word_sentences, batch_size, progress)
    rows = (
        np.concatenate([word_offsets[i] + np.asarray(owner, dtype=np.int64) for i, (_, owner) in enumerate(segmented)])
        if segmented
        else np.zeros(0, np.int64)
    )
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in chars])]).astype(np.int64)
    features = LayerFeatures(
        word_data[rows],
        offsets,
        {
            "bilm_name": _model_name(model, model_name),
            "bilm_sha256": bilm_sha,
            "sentences_sha256": sent_sha,
            "kind": "chars-from-words",
        },
    )
    if cache_path is not None:
        features.save(cache_path)
        logger.info("layer features: wrote %s (%s)", cache_path, features)
    return features


# ============================================================================================ random control
def random_bilm_like(name_or_model: object, seed: int):
    """The random-weight control: a :class:`~elmokit.BiLM` of the same configuration (and the same character
    vocabulary, in the character-vocabulary mode) as ``name_or_model``, freshly initialised by the project's own
    initialisation (``BiLM(config)``: the modules' ``reset_parameters``) from ``torch.manual_seed(seed)`` — the
    way the pretraining trainer initialises its model, so it is the pretrained biLM's starting point for that seed.
    The global RNG state is left as it was. Same seed → the same weights. In eval mode, on the source's device
    and dtype.

    ``name_or_model``: anything :class:`elmokit.Embedder` accepts. Raises the loaders' errors for a bad model."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"seed must be an int, got {seed!r}")
    source = resolve_model(name_or_model)
    config = copy.deepcopy(source.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BiLM(config)
    model.char_vocab = getattr(source, "char_vocab", None)
    p = next(source.parameters())
    return model.to(device=p.device, dtype=p.dtype).eval()
