"""The fused LSTM-with-projection layer for training: one :class:`torch.autograd.Function` per layer.

The autograd loop of :meth:`elmokit.modules.lstm.BiLSTM._run_layer_autograd` records a dozen ops per step and
direction (products, gate slices, non-linearities, clips, concatenations), and its backward replays them one small
product at a time, weight gradients included. :class:`FusedLSTMLayer` runs the same cell equations (TensorFlow
``LSTMCell`` with ``num_proj`` and clipping, gate order i, j, f, o, forget bias folded into the bias) as:

* **forward**: per step, the recurrent product h_{t-1}·W_hh of both directions, ONE fused pass for the gates, the cell
  update, the cell clip and m = σ(o)·tanh(c) (float32 gate math), the projection m·W_proj and its clip; it saves the
  activated gates (2, N, 4H), the unclipped cell state c_raw (2, N, H), m (2, N, H) and the unclipped projection
  h_raw (2, N, P), nothing else;
* **backward**: the reverse time loop, per step the projection clip's mask, dm = dh·W_projᵀ, ONE fused pass to the
  gate gradients dz and dc_{t-1}, dh_{t-1} = dz·W_hhᵀ; then the weight gradients **once per layer** as large
  products over all steps: dW_hh = Σ_t h_{t-1}ᵀ·dz_t (the h_{t-1} of every position stacked), dW_proj = Σ_t mᵀ·dh_raw,
  and the bias's gradient the sum of dz (float32, before dz is rounded to the product dtype). The input product
  x·W_ih (hoisted out of the loop, the caller's, with autograd) receives dz as its gradient. A clip passes the
  gradient where |x| ≤ clip, as ``torch.clamp``'s backward.

Two implementations of the same Function, selected per call:

* the C++ kernels of ``native_train.cpp`` (:func:`elmokit.modules.native.train_ops`): CPU, float32 or bfloat16
  products (ATen GEMMs: MKL/oneDNN, AMX where the CPU has it, AVX-512-BF16 or AVX2 otherwise — nothing here assumes
  AMX), the fused passes vectorised by the compiler;
* the torch-op path (:func:`_forward_torch`, :func:`_backward_torch`): any device and dtype (float64 for
  ``torch.autograd.gradcheck``), used on CUDA, with ``ELMOKIT_NATIVE=0``, where the extension could not be built, and
  where the C++ forward met a non-finite pre-activation (its ``-ffast-math`` build assumes finite values).

With a ``low`` dtype (bfloat16, under ``--precision bf16``) the three products read bfloat16 copies — of the weights
cast once per call (one forward per optimiser step), of h_t kept in bfloat16 from the projection on (the dtype the next
product reads), of m and of the gradients dh_raw and dz — and accumulate in float32 (their results rounded to
bfloat16); the gates, the cell state, the clips, the bias and the carried gradients of c are float32, as
:meth:`~elmokit.modules.lstm.BiLSTM._run_layer_low_precision` documents.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elmokit.modules import native
from elmokit.modules.precision import gemm_rows

__all__ = ["FusedLSTMLayer", "fused_lstm_layer"]


def _clip(x: torch.Tensor, clip: float) -> torch.Tensor:
    return x.clamp(-clip, clip) if clip > 0 else x


def _pass_mask(x: torch.Tensor, clip: float) -> torch.Tensor | None:
    """Where a clip at ±``clip`` passes the gradient (``torch.clamp``'s backward: min ≤ x ≤ max); ``None``: no clip."""
    return (x.abs() <= clip) if clip > 0 else None


def _forward_torch(xw, bias, c0, h0, w_hh, w_proj, sizes, cell_clip, proj_clip):
    """The torch-op forward: arguments and result as ``native_train.cpp``'s ``lstm_train_forward`` (acc dtype = c0's:
    float32, or float64 under gradcheck)."""
    acc = c0.dtype
    n_all, g4 = xw.shape[1], xw.shape[2]
    hd, p = g4 // 4, w_proj.shape[2]
    gates = xw.new_empty(2, n_all, g4, dtype=acc)
    craw = xw.new_empty(2, n_all, hd, dtype=acc)
    m = xw.new_empty(2, n_all, hd, dtype=w_hh.dtype)
    hraw = xw.new_empty(2, n_all, p, dtype=w_hh.dtype)
    out = xw.new_empty(2, n_all, p, dtype=w_hh.dtype) if proj_clip > 0 else hraw
    final_c, final_h = c0.clone(), h0.clone()
    h_prev, c_prev = h0.to(w_hh.dtype), c0
    off = 0
    for n in sizes:
        z = xw[:, off : off + n].to(acc) + bias.unsqueeze(1) + torch.bmm(h_prev[:, :n], w_hh).to(acc)
        zi, zj, zf, zo = z.chunk(4, dim=-1)
        i, j, f, o = torch.sigmoid(zi), torch.tanh(zj), torch.sigmoid(zf), torch.sigmoid(zo)
        gates[:, off : off + n] = torch.cat([i, j, f, o], dim=-1)
        c_raw = f * c_prev[:, :n] + i * j
        craw[:, off : off + n] = c_raw
        c = _clip(c_raw, cell_clip)
        m[:, off : off + n] = o * torch.tanh(c)
        hraw[:, off : off + n] = torch.bmm(m[:, off : off + n], w_proj)
        if proj_clip > 0:
            out[:, off : off + n] = _clip(hraw[:, off : off + n], proj_clip)
        h_prev, c_prev = out[:, off : off + n], c
        final_c[:, :n] = c  # the last write to a row is its last step's
        final_h[:, :n] = h_prev.to(acc)
        off += n
    return [out, final_c, final_h, gates, craw, m, hraw]


def _backward_torch(dout, dfc, dfh, gates, craw, m, hraw, out, c0, h0, w_hh, w_proj, sizes, cell_clip, proj_clip):
    """The torch-op backward: arguments and result as ``native_train.cpp``'s ``lstm_train_backward`` (dxw, dbias = Σ dz,
    dc0, dh0, dW_hh, dW_proj)."""
    acc = gates.dtype
    offs = [0]
    for n in sizes:
        offs.append(offs[-1] + n)
    dz = torch.empty_like(gates)
    dhraw = torch.empty_like(hraw)
    dc = dfc.clone()
    dh_rec = None  # the next step's recurrent gradient dh_{t-1}: rows still running there
    for s in range(len(sizes) - 1, -1, -1):
        n, off = sizes[s], offs[s]
        carry = dfh[:, :n].clone()
        if dh_rec is not None:
            carry[:, : dh_rec.shape[1]] = dh_rec.to(acc)
        dh = dout[:, off : off + n] + carry
        mask = _pass_mask(hraw[:, off : off + n], proj_clip)
        dhraw[:, off : off + n] = dh if mask is None else dh * mask
        dm = torch.bmm(dhraw[:, off : off + n], w_proj.transpose(1, 2)).to(acc)
        i, j, f, o = gates[:, off : off + n].chunk(4, dim=-1)
        c_raw = craw[:, off : off + n]
        tc = torch.tanh(_clip(c_raw, cell_clip))
        dct = dc[:, :n] + dm * o * (1 - tc * tc)
        mask = _pass_mask(c_raw, cell_clip)
        dcr = dct if mask is None else dct * mask
        c_prev = c0[:, :n] if s == 0 else _clip(craw[:, offs[s - 1] : offs[s - 1] + n], cell_clip)
        dz_s = torch.cat(
            [dcr * j * i * (1 - i), dcr * i * (1 - j * j), dcr * c_prev * f * (1 - f), dm * tc * o * (1 - o)], -1
        )
        dz[:, off : off + n] = dz_s
        dc[:, :n] = dcr * f
        dh_rec = torch.bmm(dz_s.to(w_hh.dtype), w_hh.transpose(1, 2))
    dh0 = dfh.clone()
    if dh_rec is not None:
        dh0[:, : dh_rec.shape[1]] = dh_rec.to(acc)
    dzg = dz.to(w_hh.dtype)
    h0g = h0.to(w_hh.dtype)
    hprev = (
        torch.cat(
            [h0g[:, : sizes[0]]] + [out[:, offs[s - 1] : offs[s - 1] + sizes[s]] for s in range(1, len(sizes))], dim=1
        )
        if sizes
        else hraw[:, :0]
    )
    dw_hh = per_direction_bmm(hprev.transpose(1, 2), dzg)
    dw_proj = torch.bmm(m.transpose(1, 2), dhraw)
    return [dzg, dz.sum(1), dc, dh0, dw_hh, dw_proj]


def per_direction_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)`` for the two directions' (2, M, K)·(2, K, N) weight gradients: one ``mm`` per direction in
    float32 on the CPU (oneMKL's batched path ran (2, 128, N)·(2, N, 2048) at 0.6× the rate of two ``mm`` calls,
    quickstart and zoo shapes, 2 threads), ``bmm`` otherwise (bfloat16 through oneDNN: as fast as two ``mm``; CUDA).

    Args:
        a: (2, M, K), b: (2, K, N), one dtype and device; a may be a transposed view.

    Returns:
        (2, M, N) contiguous, in their dtype: the same values as ``torch.bmm`` up to the GEMM's summation order.
    """
    if a.device.type != "cpu" or a.dtype != torch.float32:
        return torch.bmm(a, b)
    out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=a.dtype)
    for d in range(a.shape[0]):
        torch.mm(a[d], b[d], out=out[d])
    return out


class _InputProduct(torch.autograd.Function):
    """xw = x·W_ih for both directions, (2, N, P)·(2, P, 4H) → (2, N, 4H), one ``bmm``; its backward dx = dxw·W_ihᵀ
    (``bmm``) and dW_ih = xᵀ·dxw (:func:`per_direction_bmm`: the gradient over all N positions, the shape that ran
    slowest through the batched path)."""

    @staticmethod
    def forward(ctx, x, w_ih):
        ctx.save_for_backward(x, w_ih)
        return torch.bmm(x, w_ih)

    @staticmethod
    def backward(ctx, dxw):
        x, w_ih = ctx.saved_tensors
        dx = torch.bmm(dxw, w_ih.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        dw = per_direction_bmm(x.transpose(1, 2), dxw) if ctx.needs_input_grad[1] else None
        return dx, dw


class FusedLSTMLayer(torch.autograd.Function):
    """One layer, both directions (see the module docstring).

    ``forward(xw, bias, c0, h0, w_hh, w_proj, sizes, cell_clip, proj_clip, low, use_native)``:

    Args:
        xw: (2, R, 4H) the input product x·W_ih **without** the bias, at the packed time-major positions (step s = the
            next ``sizes[s]``), in ``low`` where given (its product dtype), else in the weights' dtype. R ≥ N = the
            sum of ``sizes``: rows past N (:func:`~elmokit.modules.precision.gemm_rows` padding) are ignored, and
            their gradient is zero.
        bias: (2, 4H) the bias with the forget bias 1.0 folded in (gate columns i, j, f, o).
        c0, h0: (2, B, H), (2, B, P) start state (float32, or float64 under gradcheck).
        w_hh: (2, P, 4H), w_proj: (2, H, P) the master weights.
        sizes: tuple of running rows per step, all > 0, non-increasing (rows sorted by length); they sum to N.
        cell_clip, proj_clip: ≤ 0 means no clipping.
        low: ``torch.bfloat16`` for bfloat16 products, or ``None``.
        use_native: try the C++ kernels (CPU, float32/bfloat16).

    Returns:
        out (2, N, P) in the state's dtype (each position's h_t), final c (2, B, H), final h (2, B, P).
    """

    @staticmethod
    def forward(ctx, xw, bias, c0, h0, w_hh, w_proj, sizes, cell_clip, proj_clip, low, use_native):
        n, rows = sum(sizes), xw.shape[1]  # rows > n: xw padded to gemm_rows(n) (see fused_lstm_layer)
        wdt = low if low is not None else w_hh.dtype
        if low is not None and proj_clip > 0:  # h_raw is clipped and masked in bfloat16: at the clip's bfloat16 value,
            proj_clip = float(torch.tensor(proj_clip).to(low))  # as torch.clamp on a bfloat16 tensor
        w_hh_g = w_hh.detach().to(wdt).contiguous()  # once per call: one forward per optimiser step
        w_proj_g = w_proj.detach().to(wdt).contiguous()
        xw = xw.contiguous()
        bias = bias.contiguous()
        ops = native.train_ops() if use_native and xw.device.type == "cpu" and c0.dtype == torch.float32 else None
        args = (xw, bias, c0.contiguous(), h0.contiguous(), w_hh_g, w_proj_g, list(sizes), cell_clip, proj_clip)
        with torch.autocast(xw.device.type, enabled=False):
            result = list(ops.lstm_train_forward(*args)) if ops is not None else []
            if not result:  # no kernels here, another device or dtype, or a non-finite pre-activation
                ops = None
                result = _forward_torch(xw[:, :n].contiguous(), *args[1:])  # on the n positions only
        out, final_c, final_h, gates, craw, m, hraw = result
        ctx.save_for_backward(gates, craw, m, hraw, out, args[2], args[3], w_hh_g, w_proj_g)
        ctx.meta = (list(sizes), cell_clip, proj_clip, ops, xw.dtype, w_hh.dtype, n, rows)
        return (out[:, :n] if out.shape[1] > n else out).to(c0.dtype), final_c, final_h

    @staticmethod
    def backward(ctx, dout, dfc, dfh):
        gates, craw, m, hraw, out, c0, h0, w_hh_g, w_proj_g = ctx.saved_tensors
        sizes, cell_clip, proj_clip, ops, xw_dtype, w_dtype, n, rows = ctx.meta
        if out.shape[1] > n:  # the native kernels' buffers have xw's rows: dout padded with zero rows to match
            dout = F.pad(dout, (0, 0, 0, out.shape[1] - n))
        grads = (dout.contiguous(), dfc.contiguous(), dfh.contiguous())
        args = (*grads, gates, craw, m, hraw, out, c0, h0, w_hh_g, w_proj_g, sizes, cell_clip, proj_clip)
        with torch.autocast(dout.device.type, enabled=False):
            if ops is not None:
                dxw, dbias, dc0, dh0, dw_hh, dw_proj = ops.lstm_train_backward(*args)
            else:
                dxw, dbias, dc0, dh0, dw_hh, dw_proj = _backward_torch(*args)
        dbias = dbias if ctx.needs_input_grad[1] else None
        if dxw.shape[1] < rows:  # the torch-op path ran on the n positions: zeros for xw's padding rows
            dxw = F.pad(dxw, (0, 0, 0, rows - dxw.shape[1]))
        return (dxw.to(xw_dtype), dbias, dc0, dh0, dw_hh.to(w_dtype), dw_proj.to(w_dtype), None, None, None, None, None)


def fused_lstm_layer(
    x: torch.Tensor,
    sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_ih: torch.Tensor,
    bias: torch.Tensor,
    w_hh: torch.Tensor,
    w_proj: torch.Tensor,
    cell_clip: float,
    proj_clip: float,
    low: torch.dtype | None = None,
    use_native: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer with autograd through :class:`FusedLSTMLayer`: the hoisted input product x·W_ih (one batched GEMM
    over all N positions, in ``low`` where given), then the Function.

    Args:
        x: (2, N, P) packed time-major input; sizes: running rows per step (zeros dropped here).
        c, h: (2, B, H), (2, B, P) start state; w_ih (2, P, 4H), bias (2, 4H) with the forget bias folded in,
            w_hh (2, P, 4H), w_proj (2, H, P): the layer's parameters (gate columns i, j, f, o).
        cell_clip, proj_clip: ≤ 0 or ``None`` = no clipping. low: ``torch.bfloat16`` for bfloat16 products.
        use_native: try the C++ kernels (``False``: the torch-op path).

    Returns:
        (out (2, N, P), final c (2, B, H), final h (2, B, P)) in the state's dtype (float32 under bf16 too).
    """
    with torch.autocast(x.device.type, enabled=False):
        if low is not None:
            # the products over all N positions (x·W_ih, its backward's two, dW_hh and dW_proj in the kernels) on
            # gemm_rows(N) rows: x padded with zero rows, so that oneDNN compiles their kernels for a few row counts
            # rather than once a batch (the Function ignores the rows past N and sums them into the gradients as zeros)
            xl = x.to(low)
            rows = gemm_rows(x.shape[1], low, x.device.type)
            xw = _InputProduct.apply(F.pad(xl, (0, 0, 0, rows - x.shape[1])) if rows > x.shape[1] else xl, w_ih.to(low))
        else:
            xw = _InputProduct.apply(x, w_ih)
        state_dtype = c.dtype if c.dtype not in (torch.bfloat16, torch.float16) else torch.float32
        return FusedLSTMLayer.apply(
            xw,
            bias.to(state_dtype),
            c.to(state_dtype),
            h.to(state_dtype),
            w_hh,
            w_proj,
            tuple(n for n in sizes if n > 0),
            float(cell_clip or 0.0),
            float(proj_clip or 0.0),
            low,
            use_native,
        )
