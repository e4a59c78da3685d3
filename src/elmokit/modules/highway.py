"""Highway layers (Srivastava et al., 2015) as used by ELMo's token encoder."""
from __future__ import annotations

import torch
from torch import nn

from .derived import DerivedWeights

__all__ = ["Highway"]


def _mkl_packed_available() -> bool:
    """Whether this torch build has MKL's packed GEMM (``torch.ops.mkl._mkl_linear``, used by Inductor's CPU
    freezing pass)."""
    try:
        return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")
    except Exception:  # a build without the mkl namespace
        return False


class Highway(nn.Module):
    """A stack of highway layers: ``t = σ(x W_g + b_g)``, ``y = t · relu(x W_h + b_h) + (1 − t) · x``.

    Source: bilm-tf ``high()``. In the original weight files the gate matrix is named ``W_carry`` (it computes the
    gate that multiplies the *transformed* value) and the transform ``W_transform``; here they are ``gates[k]`` and
    ``transforms[k]``. The transform is always relu.

    Shapes: ``forward(x: (N, F)) -> (N, F)``.

    Without autograd (inference) each layer runs as **one** GEMM into ``[transform | gate]`` with the weights held as a
    contiguous (F, 2F) copy: for the few tokens of a single sentence the two ``nn.Linear`` calls (weights (out, in))
    ran at ≈ 85 GFLOP/s on 2 cores of this project's machine, the (in, out) layout at ≈ 150 (the small configuration,
    12 tokens: 2.4 ms → 1.4 ms); from a few hundred tokens up both layouts reach the same rate. The copy (F × 2F
    floats per layer, 32 MB for the small configuration) is made on first use and remade whenever a weight changes
    (:class:`~elmokit.modules.derived.DerivedWeights`); it is not part of the state dict.

    **Single sentences** (2 … :attr:`packed_rows` distinct tokens) use MKL's packed GEMM where this torch has it
    (``torch.ops.mkl._mkl_linear``, rows zero-padded to :attr:`packed_rows`, as that op requires a fixed row count):
    measured on 2 cores of this project's machine, small configuration, 12 tokens: 1.47 ms → 1.08 ms. The packed copy
    (≈ 1.4 × the layer's weights: 48 MB for the small configuration) is made on the first such call. Layers wider
    than :attr:`packed_max_dim` keep the plain GEMM (F = 4096: no gain measured below 16 tokens). Same values up to
    float rounding (``tests/test_fast_paths.py``).
    """

    #: rows of the packed GEMM: inputs of 2 … packed_rows tokens are zero-padded to this many
    packed_rows = 16
    #: the packed path is used for F ≤ this (measured: F = 2048 gains ≈ 27 %, F = 4096 nothing at 12 tokens)
    packed_max_dim = 2048
    _packed_ok = _mkl_packed_available()

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.transforms = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.gates = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self._derived = DerivedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            return self._forward_fused(x)
        for transform, gate in zip(self.transforms, self.gates):
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(transform(x)) + (1.0 - t) * x
        return x

    def _params(self, k: int) -> tuple[torch.Tensor, ...]:
        return (self.transforms[k].weight, self.transforms[k].bias, self.gates[k].weight, self.gates[k].bias)

    def _fused_weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer k's (F, 2F) weight [W_hᵀ | W_gᵀ] and (2F,) bias [b_h | b_g], cached (see the class docstring)."""
        params = self._params(k)
        return self._derived.get(f"fused{k}", params, lambda: (
            torch.cat([params[0].t(), params[2].t()], dim=1).contiguous(), torch.cat([params[1], params[3]])))

    def _packed_weight(self, k: int) -> torch.Tensor:
        """Layer k's [W_h ; W_g] ((2F, F), the op's (out, in) layout) MKL-packed for :attr:`packed_rows` rows."""
        params = self._params(k)
        return self._derived.get(f"packed{k}", params, lambda: torch.ops.mkl._mkl_reorder_linear_weight(
            torch.cat([params[0], params[2]], dim=0), self.packed_rows))

    def _use_packed(self, x: torch.Tensor) -> bool:
        return (Highway._packed_ok and 2 <= x.shape[0] <= self.packed_rows and self.dim <= self.packed_max_dim
                and x.dtype == torch.float32 and x.device.type == "cpu")

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self._forward_fused(x.reshape(-1, x.shape[-1])).view(x.shape)
        n = x.shape[0]
        packed = self._use_packed(x)
        if packed:
            x = torch.cat([x, x.new_zeros(self.packed_rows - n, self.dim)]) if n < self.packed_rows else x
        for k in range(len(self.transforms)):
            weight, bias = self._fused_weights(k)
            if packed:
                try:
                    # the plain (out, in) weight is only the op's fallback for other row counts (never taken here)
                    both = torch.ops.mkl._mkl_linear(x, self._packed_weight(k), weight.t(), bias, self.packed_rows)
                except RuntimeError:  # the op exists but refuses here: plain GEMMs from now on
                    Highway._packed_ok = False
                    self._derived.clear()
                    return self._forward_fused(x[:n])
            else:
                both = torch.addmm(bias, x, weight)  # (N, 2F): [transform | gate] pre-activations
            h, t = both[:, : self.dim].relu_(), both[:, self.dim:].sigmoid_()
            x = torch.addcmul(x, t, h - x)  # t·h + (1 − t)·x
        return x[:n] if packed else x
