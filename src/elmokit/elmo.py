"""``Elmo``: a frozen biLM + K ScalarMixes, with AllenNLP's ``Elmo`` signature; :class:`TokenVectorCache` for
AllenNLP's ``vocab_to_cache`` (word-id input)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from elmokit.characters import batch_to_ids
from elmokit.checks import positive_int
from elmokit.config import ElmoConfig
from elmokit.errors import InputError, InputTypeError, UsageError, UsageTypeError
from elmokit.modules import invariant
from elmokit.modules.bilm import BiLM, BiLMOutput, StatefulBiLM, remove_sentence_boundaries
from elmokit.modules.scalar_mix import ScalarMix
from elmokit.weights.native import load_pretrained_bilm

__all__ = ["Elmo", "TokenVectorCache"]

logger = logging.getLogger(__name__)


class _OutsideCache(InputError):
    """A word id outside the cached word list (the caller may fall back to character ids)."""


class TokenVectorCache(nn.Module):
    """The layer-0 token vectors of a fixed word list, computed once (AllenNLP's ``vocab_to_cache``).

    Args:
        bilm: the model whose token encoder (char CNN → highway → projection) makes the vectors.
        words: V words; word id i means ``words[i]``. **Id 0 is padding** (masked out), as in AllenNLP, whose
            vocabularies put ``@@PADDING@@`` first, so ``words[0]`` should be a padding entry. Any string is
            allowed (blank ones too: they are encoded as the original does).
        trainable: store the vectors as a trainable parameter (AllenNLP does so when fine-tuning,
            ``requires_grad=True``); otherwise a non-persistent buffer (recomputed from the weights, not saved).

    ``lookup(word_ids (…, T) long)`` → token vectors (…, T, P) and mask (…, T) bool (``word_ids > 0``).
    :meth:`run` runs a biLM on them, falling back to character ids for words outside the cache, as AllenNLP does.
    Since elmokit's token encoder is context-free and its inference stateless, cached and character input give the
    same layers (to float rounding).

    Raises:
        UsageTypeError: (also a ``TypeError``) ``bilm`` is not a :class:`BiLM`, or ``words`` is not a list of str.

    Source: AllenNLP ``_ElmoBiLm.create_cached_cnn_embeddings`` and its ``forward(inputs, word_inputs)``.
    """

    def __init__(self, bilm: BiLM, words: Sequence[str], *, trainable: bool = False, batch_size: int = 4096) -> None:
        super().__init__()
        if isinstance(bilm, StatefulBiLM):
            bilm = bilm.bilm  # the token encoder is context-free
        if not isinstance(bilm, BiLM):
            raise UsageTypeError(f"TokenVectorCache needs a BiLM, got {type(bilm).__name__}")
        if isinstance(words, str) or not isinstance(words, Sequence):
            raise UsageTypeError(f"vocab_to_cache must be a list of words (str), got {type(words).__name__}")
        for i, w in enumerate(words):
            if not isinstance(w, str):
                raise UsageTypeError(f"vocab_to_cache entry {i} is a {type(w).__name__} ({w!r}); words must be str")
        self.words = list(words)
        c = bilm.config.char_cnn.max_characters_per_token
        device = bilm.token_encoder.projection.weight.device
        chunks = []
        with torch.no_grad():
            for start in range(0, len(self.words), batch_size):
                part = [[w] for w in self.words[start : start + batch_size]]
                ids = batch_to_ids(part, c, char_vocab=bilm.char_vocab, empty_tokens="keep")[:, 0].to(device)
                chunks.append(bilm.token_encoder.encode_unique(ids))
        p = bilm.config.lstm.projection_dim
        vectors = torch.cat(chunks) if chunks else torch.zeros(0, p, device=device)
        if trainable:
            self.vectors = nn.Parameter(vectors)
        else:
            self.register_buffer("vectors", vectors, persistent=False)

    def __len__(self) -> int:
        return len(self.words)

    def lookup(self, word_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(…, T) word ids → ((…, T, P) token vectors, (…, T) mask = ``word_ids > 0``).

        Raises:
            InputTypeError: (also a ``TypeError``) not an integer tensor.
            InputError: an id outside ``[0, V)`` (the message gives it and V).
        """
        if (
            not isinstance(word_ids, torch.Tensor)
            or word_ids.is_floating_point()
            or word_ids.is_complex()
            or word_ids.dtype == torch.bool
        ):
            what = word_ids.dtype if isinstance(word_ids, torch.Tensor) else type(word_ids).__name__
            raise InputTypeError(f"word_inputs must be an integer tensor (B, T) of ids into vocab_to_cache, got {what}")
        if word_ids.numel():
            lo, hi = int(word_ids.min()), int(word_ids.max())
            if lo < 0 or hi >= len(self.words):
                raise _OutsideCache(
                    f"word_inputs contain {lo if lo < 0 else hi}, outside the cached vocabulary of "
                    f"{len(self.words)} words (ids 0…{len(self.words) - 1}, 0 = padding)"
                )
        return F.embedding(word_ids.long(), self.vectors), word_ids > 0

    def run(
        self,
        bilm: BiLM | StatefulBiLM,
        char_ids: torch.Tensor | None,
        word_ids: torch.Tensor,
        *,
        keep_sentence_boundaries: bool = False,
        **options,
    ) -> BiLMOutput:
        """Run ``bilm`` (a :class:`BiLM`, or a :class:`StatefulBiLM` carrying its state) on the cached vectors of
        (B, T) ``word_ids``. When an id is outside the cache and ``char_ids`` (B, T, C) are given, they are used
        instead (AllenNLP's fallback); without them the :class:`InputError` stands."""
        try:
            vectors, mask = self.lookup(word_ids)
        except _OutsideCache as exc:
            if char_ids is None:
                raise
            logger.info("%s: using the character ids instead", exc)
            return bilm(char_ids, keep_sentence_boundaries=keep_sentence_boundaries, **options)
        if vectors.dim() != 3:
            raise InputError(f"word_inputs must have shape (B, T), got {tuple(word_ids.shape)}")
        return bilm.forward_token_vectors(vectors, mask, keep_sentence_boundaries=keep_sentence_boundaries, **options)


def _check_arguments(
    module: nn.Module | None, bilm: BiLM | None, num_output_representations: int, dropout: float, layer_norm_mask: str
) -> nn.Module | None:
    """:class:`Elmo`'s argument checks (in this order, each naming the argument); returns the prebuilt biLM given as
    ``module=`` or ``bilm=``, or ``None``.

    Raises:
        UsageError: both ``module=`` and ``bilm=`` (different objects); a bad value.
        UsageTypeError: ``num_output_representations`` or ``dropout`` of the wrong type.
    """
    if module is not None and bilm is not None and module is not bilm:
        raise UsageError("pass the prebuilt biLM once: module= (AllenNLP's name) or bilm=, not both")
    positive_int("num_output_representations", num_output_representations)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise UsageTypeError(f"dropout must be a number in [0, 1], got {dropout!r} ({type(dropout).__name__})")
    if not 0.0 <= dropout <= 1.0:
        raise UsageError(f"dropout must be a number in [0, 1], got {dropout!r}")
    if layer_norm_mask not in ("with_boundaries", "tokens"):
        raise UsageError(f"layer_norm_mask must be 'with_boundaries' or 'tokens', got {layer_norm_mask!r}")
    return module if module is not None else bilm


def _load_bilm(
    options_file: str | os.PathLike | None,
    weight_file: str | os.PathLike | None,
    given: nn.Module | None,
    *,
    stateful: bool,
    vocab_to_cache: Sequence[str] | None,
) -> nn.Module:
    """The biLM :class:`Elmo` runs: loaded from the original files, or the prebuilt one ``given`` (a :class:`BiLM`
    wrapped in a :class:`StatefulBiLM` with ``stateful``; a :class:`StatefulBiLM` or a module with AllenNLP's biLM
    contract as it is).

    Raises:
        UsageError: files missing without a prebuilt biLM, or given with one; ``stateful`` or ``vocab_to_cache`` with
            a custom module.
        UsageTypeError: ``given`` is not a biLM.
    """
    if given is None:
        if options_file is None or weight_file is None:
            raise UsageError(
                "Elmo needs options_file and weight_file (the original options.json and HDF5), or "
                "a prebuilt biLM as module=..., or Elmo.from_pretrained(name_or_folder)"
            )
        from elmokit.weights.original import load_original  # lazy: CLI start-up (it imports h5py)

        return load_original(options_file, weight_file, stateful=stateful)
    if options_file is not None or weight_file is not None:
        raise UsageError(
            "give options_file=None and weight_file=None with a prebuilt module= / bilm= "
            "(its weights are already loaded)"
        )
    if isinstance(given, BiLM):
        return StatefulBiLM(given) if stateful else given
    if isinstance(given, StatefulBiLM):
        return given
    if isinstance(given, nn.Module) and hasattr(given, "num_layers"):
        if stateful:
            raise UsageError("stateful=True applies to an elmokit BiLM; a custom module keeps its own state")
        if vocab_to_cache is not None:
            raise UsageError(
                f"vocab_to_cache needs an elmokit BiLM (it calls its token encoder); got a {type(given).__name__}"
            )
        return given
    raise UsageTypeError(
        f"module must be an elmokit BiLM or an nn.Module with AllenNLP's biLM contract "
        f"(num_layers, forward -> {{'activations', 'mask'}}), got {type(given).__name__}"
    )


def _word_cache(bilm: nn.Module, vocab_to_cache: Sequence[str] | None, requires_grad: bool) -> TokenVectorCache | None:
    """The :class:`TokenVectorCache` of ``vocab_to_cache`` (trainable when fine-tuning), or ``None`` without it."""
    if vocab_to_cache is None:
        return None
    if requires_grad:
        logger.warning(
            "fine-tuning ELMo (requires_grad=True) with vocab_to_cache: the cached word vectors "
            "are trained as their own table, apart from the character CNN (as in AllenNLP)"
        )
    return TokenVectorCache(bilm, vocab_to_cache, trainable=requires_grad)


def _scalar_mixes(
    num_layers: int, count: int, do_layer_norm: bool, scalar_mix_parameters: Sequence[float] | None
) -> nn.ModuleList:
    """``count`` independent :class:`ScalarMix` of ``num_layers`` layers (fixed weights when
    ``scalar_mix_parameters`` are given)."""
    return nn.ModuleList(
        ScalarMix(
            num_layers,
            do_layer_norm=do_layer_norm,
            initial_scalar_parameters=scalar_mix_parameters,
            trainable=scalar_mix_parameters is None,
        )
        for _ in range(count)
    )


class Elmo(nn.Module):
    """ELMo representations for downstream models: one biLM pass, K independent learned mixes of its L+1 layers.

    Args (as AllenNLP's ``allennlp.modules.elmo.Elmo``, same order):
        options_file, weight_file: the original ``options.json`` + HDF5 (or pass ``module=``/``bilm=``, or use
            :meth:`from_pretrained`).
        num_output_representations: K, the number of independent ScalarMixes (e.g. one for a tagger's input and one
            for its output layer).
        requires_grad: fine-tune the biLM too (default ``False``: the biLM is frozen, only the mixes learn). Applied
            to a ``module`` too (AllenNLP leaves a given module's parameters as they are).
        do_layer_norm: layer-normalise each layer inside the mixes (one global masked mean/variance per layer).
        dropout: dropout on each mixed representation (training only), in [0, 1].
        vocab_to_cache: a word list whose token vectors are computed once (:class:`TokenVectorCache`); ``forward``
            then also takes ``word_inputs`` (ids into this list, 0 = padding). Needs a :class:`BiLM`.
        keep_sentence_boundaries: keep ``<S>``/``</S>`` positions in the outputs and mask.
        scalar_mix_parameters: fixed (non-trainable) mix weights w (before softmax) — AllenNLP's option.
        module: a prebuilt biLM (AllenNLP's name; ``bilm=`` is the same): a :class:`BiLM`, or any module following
            AllenNLP's contract (a ``num_layers`` attribute, ``get_output_dim()``, and ``forward(inputs,
            word_inputs=None)`` returning ``{"activations": [L+1 × (B, T+2, D)], "mask": (B, T+2)}`` with boundaries).
            Give ``options_file=None, weight_file=None`` with it.
        stateful: carry LSTM state between calls like the original (default ``False``): the biLM is wrapped in a
            :class:`~elmokit.modules.bilm.StatefulBiLM` (a BiLM itself keeps no state; see :class:`BiLM`).
        layer_norm_mask: which positions the layer-norm statistics use: ``"with_boundaries"`` (AllenNLP, default) or
            ``"tokens"`` (bilm-tf, boundaries excluded).
        batch_invariant: ``True``: float32 CPU inference by the batch-invariant kernels, a sentence's vectors the
            same bits in any batch (:mod:`elmokit.modules.invariant`; ``do_layer_norm`` normalises over the whole
            batch by definition, so it stays batch-dependent); ``None`` (default): the process default.

    ``forward(inputs, word_inputs=None)``:

    * ``inputs``: character ids (B, T, C), or (B, N, …, T, C) — any leading dims are flattened for the biLM and
      restored in the outputs (AllenNLP's higher-dimensional ``ElmoTokenEmbedder`` input).
    * ``word_inputs``: with ``vocab_to_cache``, ids (B, T) (or (B, N, …, T)) into that list; ``inputs`` may then be
      ``None``, or character ids used for words outside the cache. Without ``vocab_to_cache`` they are ignored
      with a warning (AllenNLP's behaviour).

    Returns ``{"elmo_representations": [K × (…, T, 2P)], "mask": (…, T) bool}`` (T without the boundaries unless
    kept; … the leading dims of the input).

    Raises:
        UsageTypeError: (also a ``TypeError``) an argument of the wrong type (``num_output_representations=1.0``,
            ``module`` not a biLM); the message names it and what is expected.
        UsageError: a bad argument value (which, and what is expected).
        InputTypeError: (from ``forward``; also a ``TypeError``) ``inputs`` that are not a LongTensor, e.g. token
            lists not yet through :func:`~elmokit.characters.batch_to_ids`.
        InputError: malformed ids (see :meth:`BiLM.check_char_ids`, :meth:`TokenVectorCache.lookup`).

    Source: Peters et al. (2018) eq. (1); AllenNLP ``Elmo.__init__`` / ``Elmo.forward``.
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        num_output_representations: int = 1,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: Sequence[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        module: nn.Module | None = None,
        *,
        stateful: bool = False,
        layer_norm_mask: str = "with_boundaries",
        bilm: BiLM | None = None,
        batch_invariant: bool | None = None,
    ) -> None:
        super().__init__()
        if batch_invariant is not None and not isinstance(batch_invariant, bool):
            raise UsageTypeError(f"batch_invariant must be True, False or None, got {batch_invariant!r}")
        #: the batch-invariant kernels on, off or as the process default (``None``), as ``Embedder``'s option
        self.batch_invariant = batch_invariant
        given = _check_arguments(module, bilm, num_output_representations, dropout, layer_norm_mask)
        given = _load_bilm(options_file, weight_file, given, stateful=stateful, vocab_to_cache=vocab_to_cache)
        self._elmo_lstm = given
        for p in given.parameters():
            p.requires_grad_(requires_grad)
        self.requires_grad = requires_grad
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._layer_norm_mask = layer_norm_mask
        self._dropout = nn.Dropout(p=float(dropout))
        self._warned_word_inputs = False
        self._word_cache = _word_cache(given, vocab_to_cache, requires_grad)
        self.scalar_mixes = _scalar_mixes(
            int(given.num_layers), num_output_representations, do_layer_norm, scalar_mix_parameters
        )

    def __getattr__(self, name: str):
        # AllenNLP names its mixes scalar_mix_0, scalar_mix_1, ...
        if name.startswith("scalar_mix_") and name[len("scalar_mix_") :].isdigit():
            mixes = self._modules.get("scalar_mixes")
            i = int(name[len("scalar_mix_") :])
            if mixes is not None and i < len(mixes):
                return mixes[i]
        return super().__getattr__(name)

    @property
    def bilm(self) -> BiLM:
        """The underlying :class:`BiLM`. Raises :class:`UsageError` when a custom (AllenNLP-style) module was given."""
        if isinstance(self._elmo_lstm, StatefulBiLM):
            return self._elmo_lstm.bilm
        if not isinstance(self._elmo_lstm, BiLM):
            raise UsageError(f"this Elmo wraps a {type(self._elmo_lstm).__name__}, not an elmokit BiLM")
        return self._elmo_lstm

    @property
    def config(self) -> ElmoConfig:
        """The biLM's configuration."""
        return self.bilm.config

    @property
    def word_cache(self) -> TokenVectorCache | None:
        """The :class:`TokenVectorCache` of ``vocab_to_cache`` (``None`` without it)."""
        return self._word_cache

    def get_output_dim(self) -> int:
        """2P, the width of each representation."""
        if isinstance(self._elmo_lstm, (BiLM, StatefulBiLM)):
            return self._elmo_lstm.output_dim
        return int(self._elmo_lstm.get_output_dim())

    def reset_states(self) -> None:
        """Forget carried LSTM state (stateful mode only)."""
        if hasattr(self._elmo_lstm, "reset_states"):
            self._elmo_lstm.reset_states()

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, num_output_representations: int = 1, **kwargs) -> Elmo:
        """Load a released model by name (``small``, ``medium``, ``original``, ``original-5.5b``: downloaded once
        into the cache) or a local directory (elmokit native format, or ``options.json`` + one ``*.hdf5``)."""
        stateful = kwargs.pop("stateful", False)
        bilm = load_pretrained_bilm(name_or_path, stateful=stateful)
        return cls(num_output_representations=num_output_representations, bilm=bilm, stateful=stateful, **kwargs)

    def _run_bilm(
        self, inputs: torch.Tensor | None, word_inputs: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """→ layers (B, L+1, T+2, D) and mask (B, T+2), boundaries included."""
        module = self._elmo_lstm
        if not isinstance(module, (BiLM, StatefulBiLM)):
            out = module(inputs, word_inputs) if word_inputs is not None else module(inputs)
            try:
                layers, mask = torch.stack(list(out["activations"]), dim=1), out["mask"].bool()
            except (KeyError, TypeError, RuntimeError) as exc:
                raise UsageError(
                    f"module {type(module).__name__} did not return AllenNLP's "
                    f"{{'activations': [tensors], 'mask': tensor}} ({exc})"
                ) from None
            return layers, mask
        # A stateless BiLM whose boundary positions are dropped after mixing (and not in any layer norm's statistics)
        # skips each direction's last step (exact for every kept position; BiLM.forward's boundary_steps).
        options = {}
        if (
            isinstance(module, BiLM)
            and not self._keep_sentence_boundaries
            and (self._layer_norm_mask == "tokens" or not any(mix.do_layer_norm for mix in self.scalar_mixes))
        ):
            options["boundary_steps"] = False
        if word_inputs is not None:
            out = self._word_cache.run(module, inputs, word_inputs, keep_sentence_boundaries=True, **options)
        else:
            out = module(inputs, keep_sentence_boundaries=True, **options)
        return out.layers, out.mask

    def forward(self, inputs: torch.Tensor | None, word_inputs: torch.Tensor | None = None) -> dict:
        """See the class docstring. Raises :class:`~elmokit.errors.InputTypeError` (also a ``TypeError``) for
        ``inputs`` / ``word_inputs`` that are not integer tensors, :class:`InputError` for malformed ids or shapes."""
        lead: tuple[int, ...] | None = None  # leading dims to restore
        if inputs is not None and not isinstance(inputs, torch.Tensor):
            raise InputTypeError(
                f"inputs must be a LongTensor (B, T, C) from batch_to_ids (token lists go through "
                f"batch_to_ids first), got {type(inputs).__name__}"
            )
        if word_inputs is not None:
            if self._word_cache is None and isinstance(self._elmo_lstm, (BiLM, StatefulBiLM)):
                if not self._warned_word_inputs:
                    logger.warning("word_inputs were passed to Elmo, which has no vocab_to_cache: they are ignored")
                    self._warned_word_inputs = True
                word_inputs = None
            elif isinstance(word_inputs, torch.Tensor):
                if inputs is not None and tuple(inputs.shape[:-1]) != tuple(word_inputs.shape):
                    raise InputError(
                        f"word_inputs {tuple(word_inputs.shape)} and inputs {tuple(inputs.shape)} do not "
                        "match: word_inputs must be inputs' shape without the last (character) dim"
                    )
                if word_inputs.dim() > 2:
                    lead = tuple(word_inputs.shape[:-1])
                    word_inputs = word_inputs.reshape(-1, word_inputs.shape[-1])
        if inputs is not None and inputs.dim() > 3:
            lead = tuple(inputs.shape[:-2])
            inputs = inputs.reshape(-1, *inputs.shape[-2:])
        if inputs is None and word_inputs is None:
            raise InputError("Elmo needs character ids (inputs), or word_inputs with vocab_to_cache")
        exact = getattr(self, "batch_invariant", None)
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()), invariant.batch_invariant(exact):
            layers, mask_bounded = self._run_bilm(inputs, word_inputs)
        if self._layer_norm_mask == "tokens":
            norm_mask = mask_bounded.clone()
            lengths = mask_bounded.sum(1)
            norm_mask[:, 0] = False
            norm_mask[torch.arange(len(lengths)), (lengths - 1).clamp(min=0)] = False
        else:
            norm_mask = mask_bounded
        representations = []
        for mix in self.scalar_mixes:
            mixed = mix(layers, norm_mask)
            if self._keep_sentence_boundaries:
                rep, mask = mixed, mask_bounded
            else:
                rep, mask = remove_sentence_boundaries(mixed.unsqueeze(1), mask_bounded)
                rep = rep.squeeze(1)
            representations.append(self._dropout(rep))
        if lead is not None:
            mask = mask.reshape(*lead, mask.shape[-1])
            representations = [r.reshape(*lead, *r.shape[-2:]) for r in representations]
        return {"elmo_representations": representations, "mask": mask}
