"""Highway layers (Srivastava et al., 2015) as used by ELMo's token encoder."""

from __future__ import annotations

import torch
from torch import nn

from elmokit.modules import invariant, native
from elmokit.modules.derived import DerivedWeights
from elmokit.modules.precision import low_precision_dtype

__all__ = ["Highway"]


class Highway(nn.Module):
    """A stack of highway layers: ``t = σ(x W_g + b_g)``, ``y = t · relu(x W_h + b_h) + (1 − t) · x``.

    Source: bilm-tf ``high()``. In the original weight files the gate matrix is named ``W_carry`` (it computes the
    gate that multiplies the *transformed* value) and the transform ``W_transform``; here they are ``gates[k]`` and
    ``transforms[k]``. The transform is always relu.

    Shapes: ``forward(x: (N, F)) -> (N, F)``.

    With autograd (training) on the CPU, each layer is :class:`_HighwayTrainLayer`: **one** product
    x·[W_h | W_g]ᵀ (float32, or bfloat16 under bf16 autocast with float32 gates and carry), the relu, the sigmoid and
    the carry in one native pass (``native_train.cpp``'s ``highway_train_forward``), and in the backward one pass to
    the pre-activations' gradient, then dx, d[W_h | W_g] and the biases' sums. It replaces two ``nn.Linear`` calls
    and the casts and element-wise ops around them, which were ≈ 7 % of the self CPU time of a bf16 training step at
    bilm-tf's settings (one thread, ``torch.profiler``; the products not counted). Where the kernels are unavailable
    (``ELMOKIT_NATIVE=0``, no compiler), on other devices and dtypes: the two ``nn.Linear`` calls with autograd.

    Without autograd (inference) each layer runs as **one** GEMM into ``[transform | gate]`` with the weights held as a
    contiguous (F, 2F) copy: for the few tokens of a single sentence the two ``nn.Linear`` calls (weights (out, in))
    ran at ≈ 85 GFLOP/s on 2 cores of this project's machine, the (in, out) layout at ≈ 150 (the small configuration,
    12 tokens: 2.4 ms → 1.4 ms); from a few hundred tokens up both layouts reach the same rate. The copy (F × 2F
    floats per layer, 32 MB for the small configuration) is made on first use and remade whenever a weight changes
    (:class:`~elmokit.modules.derived.DerivedWeights`); it is not part of the state dict.

    MKL's packed GEMM (``torch.ops.mkl._mkl_linear``) was tried for single sentences: 1.47 → 1.08 ms for 12 tokens
    when the call is repeated alone, but no faster inside a whole biLM call (6.2 vs 6.0–6.3 ms), where the 48 MB packed
    copy no longer stays in this machine's share of the cache; not used.

    For at most :data:`~elmokit.modules.native.MAX_HIGHWAY_ROWS` tokens (one sentence), float32 on CPU, each layer is
    one call of the native kernel (:func:`elmokit.modules.native.highway_layer`, on a copy packed in blocks of 16
    units, also cached) where that extension could be built; it reads the weight once at close to the streaming rate
    (10 tokens: 1.37 → 0.89 ms repeated alone, 1.45 → ≈ 1.0–1.2 ms inside whole calls, ``bench/latency_breakdown.py``).
    Same values up to float rounding.
    """

    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.transforms = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.gates = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self._derived = DerivedWeights()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not (x.requires_grad or any(p.requires_grad for p in self.parameters())):
            return self._forward_fused(x)
        ops, dtype = self._train_ops(x)
        for transform, gate in zip(self.transforms, self.gates):
            if ops is not None:
                x = _HighwayTrainLayer.apply(x, transform.weight, transform.bias, gate.weight, gate.bias, dtype, ops)
                continue
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(transform(x)) + (1.0 - t) * x
        return x

    def _train_ops(self, x: torch.Tensor) -> tuple[object | None, torch.dtype]:
        """The native training kernels and the product dtype (bfloat16 under bf16 autocast, else float32) where the
        fused training layer (:class:`_HighwayTrainLayer`) runs: (N, F) float32 on the CPU, float32 weights, the
        kernels built; else ``(None, float32)`` (the two ``nn.Linear`` calls with autograd)."""
        dtype = low_precision_dtype(x.device.type) or torch.float32
        if (
            x.device.type != "cpu"
            or x.dim() != 2
            or x.shape[0] == 0
            or x.dtype != torch.float32
            or dtype not in (torch.float32, torch.bfloat16)
            or any(p.dtype != torch.float32 for p in self.parameters())
        ):
            return None, torch.float32
        ops = native.train_ops()
        return (ops, dtype) if ops is not None and hasattr(ops, "highway_train_forward") else (None, torch.float32)

    def _params(self, k: int) -> tuple[torch.Tensor, ...]:
        return (self.transforms[k].weight, self.transforms[k].bias, self.gates[k].weight, self.gates[k].bias)

    def _fuse(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer k's (F, 2F) weight [W_hᵀ | W_gᵀ] and (2F,) bias [b_h | b_g], built now (not cached)."""
        w_h, b_h, w_g, b_g = self._params(k)
        return torch.cat([w_h.t(), w_g.t()], dim=1).contiguous(), torch.cat([b_h, b_g])

    def _fused_weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_fuse`, cached (see the class docstring); ``None`` for weights that cannot be tracked (made under
        inference_mode, vmap's batched tensors)."""
        return self._derived.cached(f"fused{k}", self._params(k), lambda: self._fuse(k))

    def _packed_weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_fuse` in the native kernel's layout (:func:`~elmokit.modules.native.pack_highway`), cached as
        :meth:`_fused_weights` (``None`` for untracked weights)."""
        return self._derived.cached(f"packed{k}", self._params(k), lambda: native.pack_highway(*self._fuse(k)))

    def _forward_invariant(self, module, x: torch.Tensor) -> torch.Tensor | None:
        """Every layer by the batch-invariant kernel (:func:`elmokit.modules.invariant.highway`), or ``None`` when x
        holds inf or NaN (the caller's paths then run). A width F that is not a multiple of 16 runs zero-padded to
        one (padded units stay 0: relu(0) = 0 and 0.5·0 + 0.5·0 = 0; padded inputs add 0·0 to every sum)."""
        f = self.dim
        fp = -(-f // 16) * 16
        if fp != f:
            x = torch.nn.functional.pad(x, (0, fp - f))
        for k in range(len(self.transforms)):
            packed = self._derived.get(
                f"invariant{k}", self._params(k), lambda k=k: native.pack_highway(*self._padded(k))
            )
            x = invariant.highway(module, x, packed)
            if x is None:
                return None
        return x if fp == f else x[:, :f].contiguous()

    def _padded(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_fuse` with F zero-padded to a multiple of 16: (F', 2F') and (2F',), transform columns then gate
        columns."""
        weight, bias = self._fuse(k)
        f = self.dim
        fp = -(-f // 16) * 16
        if fp == f:
            return weight, bias
        w = weight.new_zeros(fp, 2 * fp)
        w[:f, :f], w[:f, fp : fp + f] = weight[:, :f], weight[:, f:]
        b = bias.new_zeros(2 * fp)
        b[:f], b[fp : fp + f] = bias[:f], bias[f:]
        return w, b

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self._forward_fused(x.reshape(-1, x.shape[-1])).view(x.shape)
        if x.shape[0] > 0:
            exact = invariant.kernels_for(x)
            if exact is not None:  # every row in one fixed order, whatever shares the call (modules/invariant.py)
                y = self._forward_invariant(exact, x)
                if y is not None:
                    return y
        module = None
        if x.shape[0] <= native.MAX_HIGHWAY_ROWS and x.shape[0] > 0 and self.dim % 16 == 0 and native.usable(x):
            module = native.kernels()
        for k in range(len(self.transforms)):
            if module is not None:
                packed = self._packed_weights(k)
                y = native.highway_layer(module, x, *packed) if packed is not None else None
                if y is not None:  # (None: untracked weights, or inf/NaN in x: the GEMM path below)
                    x = y
                    continue
            fused = self._fused_weights(k)
            if fused is None:
                # untracked weights: rather than a copy remade every call, the two linear maps as they are
                t = torch.sigmoid(self.gates[k](x))
                x = torch.addcmul(x, t, torch.relu(self.transforms[k](x)) - x)
                continue
            weight, bias = fused
            both = torch.addmm(bias, x, weight)  # (N, 2F): [transform | gate] pre-activations
            h, t = both[:, : self.dim].relu_(), both[:, self.dim :].sigmoid_()
            x = torch.addcmul(x, t, h - x)  # t·h + (1 − t)·x
        return x


def _highway_forward_torch(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The torch-op form of the native ``highway_train_forward``: x (N, F) float32, a (N, 2F) → y (N, F) float32."""
    f = x.shape[1]
    h, t = torch.relu(a[:, :f].to(x.dtype)), torch.sigmoid(a[:, f:].to(x.dtype))
    return x + t * (h - x)


def _highway_backward_torch(dy: torch.Tensor, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch-op form of the native ``highway_train_backward``: (da (N, 2F) in a's dtype, dx_carry (N, F))."""
    f = x.shape[1]
    ah = a[:, :f].to(x.dtype)
    h, t = torch.relu(ah), torch.sigmoid(a[:, f:].to(x.dtype))
    da = torch.cat([torch.where(ah > 0, dy * t, 0.0), dy * (h - x) * t * (1.0 - t)], dim=1)
    return da.to(a.dtype), dy * (1.0 - t)


class _HighwayTrainLayer(torch.autograd.Function):
    """One highway layer for training: ONE product x·[W_h | W_g]ᵀ (in ``dtype``: float32, or bfloat16 under
    autocast), the gates and the carry in one native pass (float32); the backward's da in one pass, then
    dx = da·[W_h | W_g] + dy·(1 − t), d[W_h | W_g] = daᵀ·x and the biases' Σ da (float32)."""

    @staticmethod
    def forward(ctx, x, w_h, b_h, w_g, b_g, dtype, ops):
        f = x.shape[1]
        with torch.autocast(x.device.type, enabled=False):
            w = torch.empty(2 * f, f, dtype=dtype, device=x.device)  # [W_h; W_g], cast once a call
            w[:f].copy_(w_h.detach())
            w[f:].copy_(w_g.detach())
            xl = x.detach().to(dtype)
            a = torch.addmm(torch.cat([b_h.detach(), b_g.detach()]).to(dtype), xl, w.t())  # (N, 2F)
            found = ops.highway_train_forward(x.detach(), a) if ops is not None else []
            y = found[0] if found else _highway_forward_torch(x.detach(), a)
        ctx.save_for_backward(x, xl, a, w)
        ctx.native = ops if found else None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, xl, a, w = ctx.saved_tensors
        f = x.shape[1]
        with torch.autocast(dy.device.type, enabled=False):
            dy = dy.contiguous().to(x.dtype)
            ops = ctx.native
            da, dx = ops.highway_train_backward(dy, x, a) if ops is not None else _highway_backward_torch(dy, x, a)
            dx.add_(torch.mm(da, w))
            # daᵀ made contiguous first: oneDNN ran (2F, N)·(N, F) from the transposed view at ≈ 0.6× the rate of the
            # copy and the product together (bilm-tf's settings, bfloat16, one thread)
            dw = torch.mm(da.t().contiguous(), xl).to(x.dtype)
            db = da.sum(0, dtype=x.dtype)
        return dx, dw[:f], db[:f], dw[f:], db[f:], None, None
