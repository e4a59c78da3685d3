"""``Elmo``: a frozen biLM + K ScalarMixes, with AllenNLP's ``Elmo`` signature."""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from .config import ElmoConfig
from .modules.bilm import BiLM, remove_sentence_boundaries
from .modules.scalar_mix import ScalarMix

__all__ = ["Elmo"]


class Elmo(nn.Module):
    """ELMo representations for downstream models: one biLM pass, K independent learned mixes of its L+1 layers.

    Args (as AllenNLP's ``allennlp.modules.elmo.Elmo``):
        options_file, weight_file: the original ``options.json`` + HDF5 (or pass ``bilm=``, or use
            :meth:`from_pretrained`).
        num_output_representations: K, the number of independent ScalarMixes (e.g. one for a tagger's input and one
            for its output layer).
        requires_grad: fine-tune the biLM too (default ``False``: the biLM is frozen, only the mixes learn).
        do_layer_norm: layer-normalise each layer inside the mixes (one global masked mean/variance per layer).
        dropout: dropout on each mixed representation (training only).
        keep_sentence_boundaries: keep ``<S>``/``</S>`` positions in the outputs and mask.
        scalar_mix_parameters: fixed (non-trainable) mix weights w (before softmax) — AllenNLP's option.
        stateful: carry LSTM state between calls like the original (default ``False``; see :class:`BiLM`).
        layer_norm_mask: which positions the layer-norm statistics use: ``"with_boundaries"`` (AllenNLP, default) or
            ``"tokens"`` (bilm-tf, boundaries excluded).
        bilm: an already-built :class:`BiLM` instead of the two files.

    ``forward(char_ids (B, T, C))`` returns ``{"elmo_representations": [K × (B, T, 2P)], "mask": (B, T) bool}``
    (T without the boundaries unless kept). Raises :class:`elmokit.errors.InputError` on malformed ids.
    Source: Peters et al. (2018) eq. (1); AllenNLP ``Elmo.forward``.
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
        *,
        stateful: bool = False,
        layer_norm_mask: str = "with_boundaries",
        bilm: BiLM | None = None,
    ) -> None:
        super().__init__()
        if vocab_to_cache is not None:
            raise NotImplementedError(
                "vocab_to_cache (word-id input) is not supported: pass character ids; elmokit's token encoder "
                "already encodes each distinct token of a batch only once"
            )
        if bilm is None:
            if options_file is None or weight_file is None:
                raise ValueError("Elmo needs options_file and weight_file (or bilm=..., or Elmo.from_pretrained)")
            from .weights.original import load_original

            bilm = load_original(options_file, weight_file, stateful=stateful)
        else:
            bilm.stateful = stateful or bilm.stateful
        if num_output_representations < 1:
            raise ValueError(f"num_output_representations must be >= 1, got {num_output_representations}")
        if layer_norm_mask not in ("with_boundaries", "tokens"):
            raise ValueError(f"layer_norm_mask must be 'with_boundaries' or 'tokens', got {layer_norm_mask!r}")
        self._elmo_lstm = bilm
        for p in bilm.parameters():
            p.requires_grad_(requires_grad)
        self.requires_grad = requires_grad
        self._keep_sentence_boundaries = keep_sentence_boundaries
        self._layer_norm_mask = layer_norm_mask
        self._dropout = nn.Dropout(p=dropout)
        k = bilm.num_layers
        self.scalar_mixes = nn.ModuleList(
            ScalarMix(k, do_layer_norm=do_layer_norm, initial_scalar_parameters=scalar_mix_parameters,
                      trainable=scalar_mix_parameters is None)
            for _ in range(num_output_representations)
        )

    @property
    def bilm(self) -> BiLM:
        """The underlying :class:`BiLM`."""
        return self._elmo_lstm

    @property
    def config(self) -> ElmoConfig:
        """The biLM's configuration."""
        return self._elmo_lstm.config

    def get_output_dim(self) -> int:
        """2P, the width of each representation."""
        return self._elmo_lstm.output_dim

    def reset_states(self) -> None:
        """Forget carried LSTM state (stateful mode only)."""
        self._elmo_lstm.reset_states()

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, num_output_representations: int = 1,
                        **kwargs) -> "Elmo":
        """Load a released model by name (``small``, ``medium``, ``original``, ``original-5.5b``: downloaded once
        into the cache) or a local directory (elmokit native format, or ``options.json`` + one ``*.hdf5``)."""
        from .weights.native import load_pretrained_bilm

        stateful = kwargs.pop("stateful", False)
        bilm = load_pretrained_bilm(name_or_path, stateful=stateful)
        return cls(num_output_representations=num_output_representations, bilm=bilm, stateful=stateful, **kwargs)

    def forward(self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None) -> dict:
        if word_inputs is not None:
            raise NotImplementedError("word_inputs (vocab_to_cache) is not supported; pass character ids only")
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            out = self._elmo_lstm(inputs, keep_sentence_boundaries=True)
        layers, mask_bounded = out.layers, out.mask
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
        return {"elmo_representations": representations, "mask": mask}
