"""AllenNLP 0.9's ``ElmoEmbedder`` (``allennlp.commands.elmo``) on elmokit: code written for it runs by changing one
import::

    # from allennlp.commands.elmo import ElmoEmbedder
    from elmokit.compat.allennlp import ElmoEmbedder

    embedder = ElmoEmbedder(options_file, weight_file, cuda_device=-1)
    layers = embedder.embed_sentence(["The", "cat", "sat"])  # (3, 3, 1024) float32 for the released models

The same constructor (``options_file``, ``weight_file``, ``cuda_device`` an int, -1 = CPU) and methods
(``batch_to_embeddings``, ``embed_sentence``, ``embed_batch``, ``embed_sentences``, ``embed_file``), the same shapes
(L+1 = 3 layers for the released models; layer 0 is the context-free token vector written twice, ``[t; t]``, as in
AllenNLP) and the same HDF5 layout from ``embed_file``. Work is done by an :class:`elmokit.Embedder`
(``ElmoEmbedder.embedder``).

**Where results differ from 0.9.** AllenNLP 0.9's biLM was *stateful*: each batch row started from the LSTM state the
same row reached in the previous batch, so a sentence's vectors depended on what was embedded before it (and the same
sentence embedded twice gave two results). elmokit is stateless by default: every sentence starts from the zero state,
so the vectors are a function of the sentence alone (equal to 0.9's for the first batch of a fresh embedder, and to
0.9's with its state reset before every batch). ``ElmoEmbedder(..., stateful=True)`` reproduces 0.9 exactly: batches
are formed in input order (``batch_size`` sentences at a time, as 0.9's ``lazy_groups_of``; ``embed_file`` too, in one
process) and run through a :class:`~elmokit.modules.bilm.StatefulBiLM`; :meth:`ElmoEmbedder.reset_states` forgets the
state. Tested against AllenNLP's own reference outputs (``../shared/fixtures/allennlp-elmo``, to 1e-5).

Other differences, all where 0.9 failed or wrote something unusable:

* an empty sentence gives a ``(L+1, 0, D)`` float32 array (0.9: ``zeros((3, 0, 1024))`` float64 whatever the model);
* ``embed_file`` with ``use_sentence_keys=True`` escapes ``/``, ``%``, NUL and a lone ``.`` in keys
  (:func:`elmokit.embedding.reader.sentence_key`; 0.9 made nested HDF5 groups of sentences holding ``/``), and a
  repeated line is refused before any work (0.9 raised half-way, leaving a partial file);
* ``embed_file`` writes the output atomically, replaces an existing output only when it is an HDF5 file (0.9 wrote
  over any file), and drops a byte-order mark at the start of the input;
* blank tokens (``""``, ``" "``) are embedded as 0.9 embedded them (elmokit's own :class:`~elmokit.Embedder` refuses
  them by default), and a blank *line* in ``embed_file`` is refused, as 0.9 refused it;
* ``cuda_device`` ≥ 0 without CUDA, and a model file of the wrong kind, raise one clear line
  (:class:`~elmokit.errors.UsageError` / :class:`~elmokit.errors.WeightsError` / :class:`~elmokit.errors.ConfigError`).

**Models.** ``options_file`` + ``weight_file``: an original ``options.json`` and its HDF5 (paths or ``http(s)`` URLs,
downloaded once into the elmokit cache; the released models' URLs, the defaults included, load the released model
of that name). Any model elmokit loads may be given alone as ``options_file`` with ``weight_file=None`` (or the
default left as is): a native or original-format model folder, a released or zoo name, a model zip where the loader
reads zips (:func:`elmokit.weights.native.load_pretrained_bilm`), or a loaded :class:`~elmokit.BiLM` /
:class:`~elmokit.Elmo`.

**AllenNLP 2.x's low-level modules.** :class:`_ElmoBiLm` and :class:`_ElmoCharacterEncoder` take the constructor
arguments of ``allennlp.modules.elmo``'s and return its dicts (``_ElmoBiLm`` is what ``Elmo(None, None, k,
module=...)`` takes; stateless unless ``stateful=True``). ``tools/allennlp_tests.py`` runs AllenNLP v2.10.1's ELMo
tests on them.

Source: AllenNLP v0.9.0 ``allennlp/commands/elmo.py`` (``ElmoEmbedder``) and ``allennlp/modules/elmo.py``
(``_ElmoBiLm``, stateful); AllenNLP v2.10.1 ``allennlp/modules/elmo.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import operator
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from elmokit.characters import boundary_char_ids, validate_sentences
from elmokit.devices import resolve_device
from elmokit.elmo import Elmo, TokenVectorCache
from elmokit.embedding import Embedder, resolve_model
from elmokit.errors import InputError, UsageError, UsageTypeError
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.modules.padding import add_sentence_boundaries
from elmokit.weights.native import RELEASED, cache_dir, download, load_pretrained_bilm

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_OPTIONS_FILE",
    "DEFAULT_WEIGHT_FILE",
    "ElmoEmbedder",
    "_ElmoBiLm",
    "_ElmoCharacterEncoder",
    "load_model",
]

logger = logging.getLogger(__name__)

#: AllenNLP 0.9's default options file: the "original" English model's (2x4096_512_2048cnn_2xhighway).
DEFAULT_OPTIONS_FILE = RELEASED["original"][0]
#: AllenNLP 0.9's default weight file: the "original" English model's.
DEFAULT_WEIGHT_FILE = RELEASED["original"][1]
DEFAULT_BATCH_SIZE = 64
OUTPUT_FORMATS = ("all", "top", "average")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------- the model
def _is_url(value: object) -> bool:
    return isinstance(value, str) and value.lower().startswith(("http://", "https://", "s3://"))


def _local(value: str | os.PathLike) -> str | os.PathLike:
    """A path, or an ``http(s)`` URL downloaded once to ``<cache>/urls/<digest>/<file name>`` (as 0.9's
    ``cached_path``). Raises :class:`UsageError` for an ``s3://`` address (download it first)."""
    if not _is_url(value):
        return value
    if value.lower().startswith("s3://"):
        raise UsageError(f"{value}: s3:// addresses are not fetched here; download the file and pass its path")
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]
    name = value.rstrip("/").rsplit("/", 1)[-1] or "file"
    return download(value, cache_dir() / "urls" / digest / name)


def load_model(
    options_file: object = DEFAULT_OPTIONS_FILE, weight_file: str | os.PathLike | None = DEFAULT_WEIGHT_FILE
) -> BiLM:
    """What :class:`ElmoEmbedder` accepts as its model → a :class:`~elmokit.BiLM` (see the module docstring).

    Raises:
        UsageError: a model folder or name given with a weight file of its own, an options file without one, an
            ``s3://`` address. UsageTypeError: a model of another type.
        ConfigError: ``options_file`` is not an options JSON (another JSON, an HDF5 file, ...).
        WeightsError: ``weight_file`` is not an HDF5 weight file of these options.
        MissingFileError: a path that does not exist. OSError: a download failed (naming the URL).
    """
    if isinstance(options_file, (BiLM, StatefulBiLM, Elmo)):
        return resolve_model(options_file, None if weight_file == DEFAULT_WEIGHT_FILE else weight_file)
    for name, pair in RELEASED.items():
        if (options_file, weight_file) == pair:
            return load_pretrained_bilm(name)
    if not isinstance(options_file, (str, os.PathLike)):
        raise UsageTypeError(
            f"options_file must be a path, URL or model name, got {type(options_file).__name__}: pass an "
            "options.json with its weight file, or a model folder, zip or name with weight_file=None"
        )
    alone = weight_file is None or weight_file == DEFAULT_WEIGHT_FILE
    path = None if _is_url(options_file) else Path(options_file)
    if path is not None and not (path.is_file() and path.suffix.lower() != ".zip"):
        if alone:  # a folder, a zip, a released or zoo name
            return load_pretrained_bilm(options_file)
        if path.is_dir():
            raise UsageError(
                f"options_file {path} is a model folder: pass it alone, ElmoEmbedder({str(path)!r}, None), "
                "or pass its options.json with weight_file"
            )
    if weight_file is None:
        raise UsageError(f"options_file {options_file} is an options file: pass its HDF5 weight file too")
    from elmokit.weights.original import load_original  # lazy: as the embedder's loader (h5py)

    return load_original(_local(options_file), _local(weight_file))


def _device(cuda_device: object) -> torch.device:
    """0.9's ``cuda_device`` (an int: -1 = CPU, N ≥ 0 = GPU N) → a device.

    Raises:
        UsageTypeError: not an int. UsageError: a GPU asked for where CUDA is not available (or N is not visible)."""
    if isinstance(cuda_device, bool):
        raise UsageTypeError(f"cuda_device must be an int (-1 for the CPU, N for GPU N), got {cuda_device!r}")
    try:
        index = operator.index(cuda_device)
    except TypeError:
        raise UsageTypeError(f"cuda_device must be an int (-1 for the CPU, N for GPU N), got {cuda_device!r}") from None
    if index < 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"cuda_device={index} asked for, but CUDA is not available here: pass cuda_device=-1 (CPU)")
    return resolve_device(f"cuda:{index}")


# ---------------------------------------------------------------------------------------------- stateful runs
class _StatefulEmbedder(Embedder):
    """An :class:`Embedder` whose forward passes carry the LSTM state (AllenNLP 0.9's ``_ElmoBiLm``): batches of
    ``batch_size`` sentences in input order (no length sorting, no token budget), each run through
    :attr:`stateful_bilm`. Everything else (validation, the token layer, the file writer) is the Embedder's."""

    def __init__(self, model: BiLM, **options) -> None:
        super().__init__(model, **options)
        self.stateful_bilm = StatefulBiLM(self.bilm)

    def _batches(self, lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
        for start in range(0, len(lengths), batch_size):
            yield list(range(start, min(start + batch_size, len(lengths))))

    def _forward(self, batch, spec) -> list[np.ndarray]:
        if not batch:
            return []
        with torch.no_grad():  # not inference mode: the carried state is kept for the next call
            vectors, mask = self.token_vectors(batch)
            out = self.stateful_bilm.forward_token_vectors(
                vectors, mask, keep_sentence_boundaries=spec.keep_sentence_boundaries
            )
            return spec.apply(out.layers, out.mask)


# ---------------------------------------------------------------------------------------------- the embedder
class ElmoEmbedder:
    """AllenNLP 0.9's ``ElmoEmbedder`` (``allennlp.commands.elmo``), on an :class:`elmokit.Embedder`.

    Args:
        options_file: the ``options.json`` path or URL (default: the released "original" model's), or any model
            elmokit loads, given alone with ``weight_file=None`` (see the module docstring).
        weight_file: the HDF5 weight file path or URL (default: the "original" model's).
        cuda_device: -1 (CPU, the default) or the GPU index.
        stateful: carry the LSTM state from batch to batch as 0.9 did (default ``False``: every sentence starts
            from the zero state; see the module docstring).

    Attributes:
        embedder: the :class:`elmokit.Embedder` doing the work (its methods take more options: pooling, layer
            selection, resumable files, workers).
        elmo_bilm: the model (a :class:`~elmokit.modules.bilm.StatefulBiLM` with ``stateful=True``).
        cuda_device: as given.

    Raises:
        UsageTypeError: ``cuda_device`` not an int, a model of another type.
        UsageError: ``cuda_device`` ≥ 0 where CUDA is not available; a model folder with a weight file.
        ConfigError / WeightsError / MissingFileError: a model file of the wrong kind or missing (one line naming it).
    """

    def __init__(
        self,
        options_file: object = DEFAULT_OPTIONS_FILE,
        weight_file: str | os.PathLike | None = DEFAULT_WEIGHT_FILE,
        cuda_device: int = -1,
        *,
        stateful: bool = False,
    ) -> None:
        if not isinstance(stateful, bool):
            raise UsageTypeError(f"stateful must be True or False, got {stateful!r}")
        device = _device(cuda_device)
        model = load_model(options_file, weight_file)
        self.embedder: Embedder = (_StatefulEmbedder if stateful else Embedder)(
            model, device=device, batch_size=DEFAULT_BATCH_SIZE, empty_tokens="keep"
        )
        self.cuda_device = cuda_device
        self.stateful = stateful

    @property
    def elmo_bilm(self) -> BiLM | StatefulBiLM:
        return self.embedder.stateful_bilm if self.stateful else self.embedder.bilm

    def reset_states(self) -> None:
        """Forget the carried LSTM state (``stateful=True``): the next batch starts from zeros. No-op otherwise."""
        if self.stateful:
            self.embedder.stateful_bilm.reset_states()

    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """B tokenised sentences → ``(activations, mask)``: activations (B, L+1, T, D) float32 on the model's device
        (layer 0 = ``[t; t]``, zero at padding), mask (B, T) int64 (1 = token), T the longest sentence, without the
        sentence boundaries — as 0.9.

        A blank token is embedded as 0.9 embedded it (begin-of-word, end-of-word). Raises
        :class:`~elmokit.errors.InputTypeError` for input of the wrong type (not a list of lists of str)."""
        batch = validate_sentences(batch, empty_tokens=self.embedder.empty_tokens, name="batch")
        with torch.no_grad():
            vectors, mask = self.embedder.token_vectors(batch)
            out = self.elmo_bilm.forward_token_vectors(vectors, mask)
        return out.layers, out.mask.long()

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """One tokenised sentence → (L+1, n, D) float32 (``(L+1, 0, D)`` for an empty one). A string is refused
        (:class:`~elmokit.errors.InputTypeError`): pass ``list(text)`` for one token per character, ``text.split()``
        for words."""
        return self.embedder.embed_sentence(sentence)

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """B tokenised sentences → B arrays (L+1, n_i, D) float32, in one forward pass."""
        return self.embedder.embed_batch(batch)

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[np.ndarray]:
        """Yield one (L+1, n, D) float32 array per sentence, in input order (a generator, as 0.9). Stateless, the
        sentences are length-sorted internally (values independent of the batching to float rounding); stateful,
        they go in input order, ``batch_size`` at a time, as 0.9."""
        return self.embedder.embed_sentences(sentences, batch_size)

    def embed_file(
        self,
        input_file: str | os.PathLike | io.IOBase,
        output_file_path: str | os.PathLike,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """Embed a file of whitespace-tokenised sentences, one a line, into HDF5 as 0.9's ``embed_file`` /
        ``allennlp elmo``: dataset ``"i"`` (line i+1, 0-based) or, with ``use_sentence_keys``, the stripped line
        (escaped, see the module docstring) holds an (L+1, n, D) (``"all"``), (n, D) (``"top"``: the top layer) or
        (n, D) (``"average"``: the mean of the L+1 layers) float32 array; unless ``forget_sentences`` or
        ``use_sentence_keys``, ``"sentence_to_index"`` is a one-element string dataset holding a JSON map from each
        stripped line to its key (the last one for a repeated line).

        ``input_file``: a path or an open file (text or bytes; read whole, then closed, as 0.9 closed it).

        Raises:
            UsageError: ``output_format`` not all/top/average; the output exists and is not an HDF5 file.
            InputError: a blank line (0.9 refused them too; :meth:`elmokit.Embedder.embed_file` accepts them), or,
                with ``use_sentence_keys``, a repeated line; before any work, naming the file and lines.
            DataError: a line that is not UTF-8 (naming the file and line). MissingFileError: no input file.
        """
        if output_format not in OUTPUT_FORMATS:
            raise UsageError(f"output_format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
        out = Path(output_file_path)
        if out.is_file() and not _is_hdf5(out):
            raise UsageError(f"the output {out} exists and is not an HDF5 file: not replaced; choose another path")
        with _input_path(input_file) as (path, label):
            _check_lines(path, label, use_sentence_keys)
            self.embedder.embed_file(
                path,
                out,
                layers=output_format,
                batch_size=batch_size,
                format="allennlp",
                use_sentence_keys=use_sentence_keys,
                forget_sentences=forget_sentences,
                overwrite=True,
            )


# ---------------------------------------------------------------------------------------------- embed_file helpers
def _is_hdf5(path: Path) -> bool:
    """Whether ``path`` starts with the HDF5 signature (an earlier output; the only kind of file replaced)."""
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        return fh.read(8) == _HDF5_SIGNATURE
    return False


@contextlib.contextmanager
def _input_path(input_file: object) -> Iterator[tuple[Path, str]]:
    """``(path, name for messages)`` of ``embed_file``'s input: a path as it is; an open file of a real file at its
    start by that file's path; another open file (``io.StringIO``, a pipe, part-read) copied whole to a temporary
    file. An open file is closed afterwards (as 0.9 did)."""
    if isinstance(input_file, (str, os.PathLike)):
        yield Path(input_file), str(input_file)
        return
    if not hasattr(input_file, "read"):
        raise UsageTypeError(f"input_file must be a path or an open file, got {type(input_file).__name__}")
    name = getattr(input_file, "name", None)
    try:
        at_start = input_file.seekable() and input_file.tell() == 0
    except (AttributeError, OSError, ValueError):
        at_start = False
    try:
        if isinstance(name, (str, os.PathLike)) and at_start and Path(name).is_file():
            yield Path(name), str(name)
            return
        data = input_file.read()
        label = str(name) if name is not None else f"<{type(input_file).__name__}>"
        with tempfile.TemporaryDirectory(prefix="elmokit-input-") as tmp:
            copy = Path(tmp) / "input.txt"
            copy.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
            yield copy, label
    finally:
        input_file.close()


def _check_lines(path: Path, label: str, use_sentence_keys: bool) -> None:
    """0.9's refusals, before any work: a blank line; with sentence keys, a repeated line. Raises
    :class:`InputError` naming the file and the lines (1-based; 0.9 gave 0-based indexes)."""
    if not path.is_file():
        return  # the embedder names the missing input
    blank: list[int] = []
    first_seen: dict[str, int] = {}
    repeated: tuple[int, int] | None = None
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            text = line.strip()
            if not text:
                blank.append(number)
            elif use_sentence_keys and repeated is None:
                if text in first_seen:
                    repeated = (first_seen[text], number)
                first_seen.setdefault(text, number)
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (f" and {len(blank) - 10} more" if len(blank) > 10 else "")
        raise InputError(
            f"{label}: blank line(s) {shown}: ElmoEmbedder.embed_file refuses them as AllenNLP 0.9 did; remove "
            "them, or use elmokit.Embedder.embed_file, which gives a blank line an empty array"
        )
    if repeated is not None:
        raise InputError(
            f"{label}: line {repeated[1]} repeats line {repeated[0]}, and use_sentence_keys=True names datasets by "
            "sentence: remove the repeat, or key by line number (use_sentence_keys=False)"
        )


# ---------------------------------------------------------------------------------------------- AllenNLP 2.x modules
def _frozen_model(options_file: object, weight_file: object, requires_grad: bool) -> BiLM:
    """:func:`load_model` with every parameter's ``requires_grad`` set as AllenNLP sets it (no default files)."""
    model = load_model(options_file, weight_file)
    model.requires_grad_(requires_grad)
    return model


class _ElmoCharacterEncoder(nn.Module):
    """AllenNLP 2.x's ``_ElmoCharacterEncoder`` (``allennlp.modules.elmo``): the context-free token vectors, with
    ``<S>`` and ``</S>`` added, of a model :func:`load_model` loads (``options_file`` + ``weight_file``).

    ``forward(inputs (B, T, C) long)`` → ``{"mask": (B, T + 2) bool, "token_embedding": (B, T + 2, P) float}``
    (zero at padding, where AllenNLP leaves the vector of an all-padding row); ``get_output_dim()`` → P. Raises as
    :meth:`elmokit.BiLM.check_char_ids` for malformed ids, and as :func:`load_model`.

    Source: AllenNLP v2.10.1 ``allennlp/modules/elmo.py``.
    """

    def __init__(self, options_file: object, weight_file: object, requires_grad: bool = False) -> None:
        super().__init__()
        self.bilm = _frozen_model(options_file, weight_file, requires_grad)

    def get_output_dim(self) -> int:
        return self.bilm.config.lstm.projection_dim

    def forward(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        self.bilm.check_char_ids(inputs)
        c = self.bilm.config.char_cnn
        bos, eos = boundary_char_ids(c.max_characters_per_token, c.char_vocab_size)
        ids, mask = add_sentence_boundaries(inputs.long(), bos, eos)
        vectors = self.bilm.token_encoder(ids) * mask.unsqueeze(-1)
        return {"mask": mask, "token_embedding": vectors}


class _ElmoBiLm(nn.Module):
    """AllenNLP 2.x's ``_ElmoBiLm`` (``allennlp.modules.elmo``) on an elmokit :class:`~elmokit.BiLM`: the module
    ``Elmo(None, None, k, module=...)`` takes, with the same constructor and output.

    Args:
        options_file, weight_file: as :func:`load_model` (an original ``options.json`` + HDF5, URLs too).
        requires_grad: fine-tune the biLM (sets every parameter's ``requires_grad``).
        vocab_to_cache: words whose token vectors are computed once (:class:`~elmokit.TokenVectorCache`); word id i
            means ``vocab_to_cache[i]``, 0 is padding. :meth:`create_cached_cnn_embeddings` sets it later.
        stateful: carry each batch row's LSTM state into the next call, as AllenNLP does
            (:class:`~elmokit.modules.bilm.StatefulBiLM`; :meth:`reset_states` forgets it). Default ``False``: every
            sentence starts from the zero state, so its vectors do not depend on earlier batches.

    ``forward(inputs (B, T, C) long, word_inputs (B, T) long = None)`` → ``{"activations": [L + 1 tensors
    (B, T + 2, 2P)], "mask": (B, T + 2) bool}``, boundaries included; layer 0 is ``[t; t]``. With a cache and
    ``word_inputs`` the character ids are used only for ids outside the cache (``inputs`` may then be ``None``);
    without a cache ``word_inputs`` are ignored, as in AllenNLP. ``num_layers`` / ``get_num_layers()`` → L + 1,
    ``get_output_dim()`` → 2P.

    Raises:
        InputError / InputTypeError: malformed ids (as :meth:`elmokit.BiLM.forward`); a word id outside the cache
            without ``inputs``. Loading errors as :func:`load_model`.

    Source: AllenNLP v2.10.1 ``allennlp/modules/elmo.py`` (``_ElmoBiLm``). Unlike it, an id outside the cache falls
    back to ``inputs`` only when the id is out of range (AllenNLP: on any ``RuntimeError`` / ``IndexError``).
    """

    def __init__(
        self,
        options_file: object,
        weight_file: object,
        requires_grad: bool = False,
        vocab_to_cache: Sequence[str] | None = None,
        *,
        stateful: bool = False,
    ) -> None:
        super().__init__()
        model = _frozen_model(options_file, weight_file, requires_grad)
        self._requires_grad = requires_grad
        self._elmo_lstm = StatefulBiLM(model) if stateful else model
        self.num_layers = model.num_layers
        self._word_cache: TokenVectorCache | None = None
        if vocab_to_cache:
            self.create_cached_cnn_embeddings(vocab_to_cache)

    def get_output_dim(self) -> int:
        return self._elmo_lstm.output_dim

    def get_num_layers(self) -> int:
        return self.num_layers

    def reset_states(self) -> None:
        """Forget the carried LSTM state (``stateful=True``; a no-op otherwise)."""
        self._elmo_lstm.reset_states()

    def create_cached_cnn_embeddings(self, tokens: Sequence[str]) -> None:
        """Compute and keep the token vectors of ``tokens`` (id i = ``tokens[i]``; trainable when fine-tuning)."""
        self._word_cache = TokenVectorCache(self._elmo_lstm, tokens, trainable=self._requires_grad)

    def forward(self, inputs: torch.Tensor | None, word_inputs: torch.Tensor | None = None) -> dict:
        if self._word_cache is not None and word_inputs is not None:
            out = self._word_cache.run(self._elmo_lstm, inputs, word_inputs, keep_sentence_boundaries=True)
        else:
            out = self._elmo_lstm(inputs, keep_sentence_boundaries=True)
        return {"activations": list(out.layers.unbind(1)), "mask": out.mask}
