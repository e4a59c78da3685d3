"""Highway layers (Srivastava et al., 2015) as used by ELMo's token encoder."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["Highway"]


class Highway(nn.Module):
    """A stack of highway layers: ``t = σ(x W_g + b_g)``, ``y = t · relu(x W_h + b_h) + (1 − t) · x``.

    Source: bilm-tf ``high()``. In the original weight files the gate matrix is named ``W_carry`` (it computes the
    gate that multiplies the *transformed* value) and the transform ``W_transform``; here they are ``gates[k]`` and
    ``transforms[k]``. The transform is always relu.

    Shapes: ``forward(x: (N, F)) -> (N, F)``.
    """

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.transforms = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.gates = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for transform, gate in zip(self.transforms, self.gates):
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(transform(x)) + (1.0 - t) * x
        return x
