"""ScalarMix: ELMo's task-specific weighting of the biLM layers (Peters et al. 2018, eq. 1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from elmokit.checks import positive_int
from elmokit.errors import InputError, UsageError, UsageTypeError

__all__ = ["ScalarMix"]


class ScalarMix(nn.Module):
    """``ELMo_t = γ · Σ_j softmax(w)_j · h_{t,j}`` over the L+1 layers, optionally layer-normalised first.

    Args:
        mixture_size: number of layers mixed (L + 1).
        do_layer_norm: normalise each layer by **one** mean and variance over all unmasked positions and all
            dimensions of the batch (not per token), eps 1e-12 — the original's behaviour (bilm-tf ``weight_layers``,
            AllenNLP ``ScalarMix._do_layer_norm``). Which positions count is the caller's mask.
        initial_scalar_parameters: initial w (default zeros = equal weights).
        trainable: learn w and γ (``False`` fixes them, e.g. for AllenNLP's ``scalar_mix_parameters``).
        initial_gamma: initial γ (default 1.0).
        top_only: return γ · (last layer) and ignore w (bilm-tf ``use_top_only``).

    ``forward(layers, mask=None)``: ``layers`` is a (B, K, T, D) tensor or a sequence of K tensors (B, T, D);
    ``mask`` (B, T) bool is required with layer norm. Returns (B, T, D).

    Parameters: ``scalar_parameters`` is an ``nn.ParameterList`` of K one-element tensors (AllenNLP's layout, so
    ``mix.scalar_parameters[k]`` is layer k's w and state-dict keys are ``scalar_parameters.0`` …); ``gamma`` is (1,).
    A state dict saved by earlier elmokit versions, with one (K,) ``scalar_parameters`` tensor, still loads (it is
    split on the way in).

    Raises:
        UsageTypeError: (also a ``TypeError``) ``mixture_size`` not an int, ``initial_scalar_parameters`` not
            numbers.
        UsageError: ``mixture_size`` < 1, or ``initial_scalar_parameters`` of the wrong length.
        InputError: a wrong number of layers, a missing mask with layer norm, a layers tensor of the wrong rank.
    """

    def __init__(
        self,
        mixture_size: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
        initial_gamma: float = 1.0,
        top_only: bool = False,
    ) -> None:
        super().__init__()
        positive_int("mixture_size (the number of layers mixed)", mixture_size)
        if initial_scalar_parameters is None:
            initial_scalar_parameters = [0.0] * mixture_size
        try:
            values = [float(v) for v in initial_scalar_parameters]
        except (TypeError, ValueError):
            raise UsageTypeError(
                f"initial_scalar_parameters must be {mixture_size} numbers, got {initial_scalar_parameters!r}"
            ) from None
        if len(values) != mixture_size:
            raise UsageError(
                f"initial_scalar_parameters has {len(values)} values for a mixture of {mixture_size} layers"
            )
        self.mixture_size = mixture_size
        self.do_layer_norm = do_layer_norm
        self.top_only = top_only
        self.scalar_parameters = nn.ParameterList(
            nn.Parameter(torch.tensor([v]), requires_grad=trainable) for v in values
        )
        self.gamma = nn.Parameter(torch.tensor([float(initial_gamma)]), requires_grad=trainable)
        self.register_load_state_dict_pre_hook(ScalarMix._split_old_scalar_parameters)

    def _split_old_scalar_parameters(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # earlier elmokit versions stored w as one (K,) tensor under "scalar_parameters"; now K (1,) tensors
        key = prefix + "scalar_parameters"
        old = state_dict.get(key)
        if isinstance(old, torch.Tensor) and old.dim() == 1 and old.shape[0] == self.mixture_size:
            del state_dict[key]
            for k in range(self.mixture_size):
                state_dict.setdefault(f"{key}.{k}", old[k : k + 1].clone())

    @property
    def scalar_vector(self) -> torch.Tensor:
        """w as one (K,) tensor (differentiable)."""
        return torch.cat(list(self.scalar_parameters))

    def weights(self) -> torch.Tensor:
        """softmax(w), shape (K,)."""
        return torch.softmax(self.scalar_vector, dim=0)

    def l2_penalty(self, coefficient: float = 0.001) -> torch.Tensor:
        """λ · Σ w² (bilm-tf's regulariser on the layer weights; 0.001 is its ``l2_coef`` default)."""
        return coefficient * (self.scalar_vector**2).sum()

    def forward(self, layers: torch.Tensor | Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(layers, torch.Tensor):
            if layers.dim() != 4:
                raise InputError(f"layers must be (B, K, T, D), got shape {tuple(layers.shape)}")
            tensors = layers.unbind(1)
        else:
            tensors = list(layers)
        if len(tensors) != self.mixture_size:
            raise InputError(f"{len(tensors)} layers were passed to a ScalarMix of {self.mixture_size}")
        if self.top_only:
            return self.gamma * tensors[-1]
        weights = self.weights().to(tensors[0].dtype)
        if self.do_layer_norm:
            if mask is None:
                raise InputError("ScalarMix with do_layer_norm needs the (B, T) mask")
            m = mask.unsqueeze(-1).to(tensors[0].dtype)
            count = (m.sum() * tensors[0].shape[-1]).clamp(min=1.0)
            tensors = [self._layer_norm(t, m, count) for t in tensors]
        out = weights[0] * tensors[0]
        for w, t in zip(weights[1:], tensors[1:]):
            out = out + w * t
        return self.gamma * out

    @staticmethod
    def _layer_norm(tensor: torch.Tensor, m: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        masked = tensor * m
        mean = masked.sum() / count
        variance = (((masked - mean) * m) ** 2).sum() / count
        return (tensor - mean) / torch.sqrt(variance + 1e-12)
