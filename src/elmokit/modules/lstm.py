"""The biLM's LSTM stacks: LSTM cells with projection and clipping, forward and backward run together.

Both directions have their own parameters; they are stored with a leading direction axis (0 = forward,
1 = backward) so that one batched matrix multiply advances both directions at each time step.

How it runs (each exact up to float rounding; ``tests/test_fast_paths.py`` checks them against the cell equations
written out one gate at a time):

* **padding-free**: rows are sorted by length, so the real (row, step) positions are packed time-major into
  (2, N, P) (N = real positions, not B·T); the input projection of every layer is one GEMM over those N positions and
  each step advances only the rows still running. On the first 1,000 UD English-EWT dev sentences in file-order
  batches of 64 (small configuration, 1 thread) this halved the LSTM time (4.0 s → 1.9 s): a batch padded to its
  longest sentence is mostly padding.
* the forget bias is folded into the input projection's bias; without autograd the gate non-linearities run in place
  on the step's (2, n, 4H) pre-activations, in a loop compiled by TorchScript (:func:`inference_steps`, eager
  fallback) over cached weight copies whose gate columns are reordered i, f, o, j (one ``sigmoid_`` per step);
  at batch 1 this took the LSTMs of the small configuration from ≈ 4.2 to ≈ 3.4 ms for 12 tokens (2 threads).
* all rows of one length (always so for a single sentence) skip the gather into and the scatter out of the packed
  layout: time-major is then a transpose.
* without autograd, for a few rows (:func:`~elmokit.modules.native.lstm_rows_limit`: 32 in the C++ kernel of
  :mod:`elmokit.modules.native` built for AVX-512, 8 otherwise) the loop runs **direction after direction** (each
  direction's recurrent weights stay in the cores' L2 caches across its steps; see
  :func:`elmokit.modules.lstm_steps._steps_by_direction`), in that kernel where it could be built and H and P are
  multiples of 16 (the same loop as one OpenMP team per direction, each thread owning a range of units): at batch 1
  the LSTMs of the small configuration went from ≈ 3.3 ms (both directions per step) to ≈ 2.3 (direction after
  direction) and ≈ 1.6 ms (the kernel) for a 10-token sentence (``bench/latency_breakdown.py``).
* with autograd (training), each layer is one :class:`~elmokit.modules.lstm_train.FusedLSTMLayer` (fp32 or bf16
  products): the step loop with the gate math fused into one pass per step and its backward, the weight gradients
  once per layer as large products (C++ kernels where built; its torch-op path elsewhere, on CUDA and with
  ``ELMOKIT_NATIVE=0``). ``ELMOKIT_FUSED_LSTM=0`` runs the step-by-step autograd loops instead
  (:meth:`BiLSTM._run_layer_autograd`, :meth:`BiLSTM._run_layer_low_precision`), the reference it is tested against
  (``tests/test_lstm_fused.py``).
"""

from __future__ import annotations

import logging
import math
import os

import torch
from torch import nn

from elmokit.config import LSTMConfig
from elmokit.errors import InputError
from elmokit.modules import invariant, native, precision
from elmokit.modules.derived import DerivedWeights
from elmokit.modules.dropout import dropout
from elmokit.modules.lstm_steps import inference_steps
from elmokit.modules.lstm_train import fused_lstm_layer

__all__ = ["BiLSTM", "LSTMState", "inference_steps"]

log = logging.getLogger(__name__)

#: (c, h): c (2, L, B, H), h (2, L, B, P); index 0 = forward direction, 1 = backward.
LSTMState = tuple[torch.Tensor, torch.Tensor]


def fused_training() -> bool:
    """Whether training (autograd) runs the fused layer of :mod:`elmokit.modules.lstm_train` (the default) rather
    than the step-by-step autograd loops; ``ELMOKIT_FUSED_LSTM=0`` selects those (the reference the fused layer is
    tested against)."""
    return os.environ.get("ELMOKIT_FUSED_LSTM", "1") != "0"


class BiLSTM(nn.Module):
    """L layers of LSTM-with-projection per direction, run over inputs already in each direction's own time order.

    Each layer and direction computes (TensorFlow ``LSTMCell`` with ``num_proj``, no peepholes)::

        z = x_t · W_ih + h_{t-1} · W_hh + b            split into i, j, f, o (this order)
        c_t = σ(f + 1) · c_{t-1} + σ(i) · tanh(j)      forget bias 1.0 added at run time (not stored in the weights)
        c_t = clip(c_t, ±cell_clip)
        h_t = clip((σ(o) · tanh(c_t)) · W_P, ±proj_clip)

    With ``use_skip_connections`` a layer ≥ 1 outputs ``h_t + x_t`` (the recurrent h stays pre-residual).

    Parameters per layer ``k`` (x·W layout, as the original HDF5): ``weight_ih[k]`` (2, I, 4H), ``weight_hh[k]``
    (2, P, 4H), ``bias[k]`` (2, 4H), ``weight_proj[k]`` (2, H, P), where I = P (every layer's input is P wide).

    Source: bilm-tf ``_build_lstms`` (TF ``LSTMCell(num_proj, cell_clip, proj_clip)``, forget_bias=1.0).
    """

    def __init__(self, config: LSTMConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.config = config
        self.hidden_dim = h = config.dim
        self.projection_dim = p = config.projection_dim
        self.n_layers = config.n_layers
        self.dropout = dropout
        self.weight_ih = nn.ParameterList(nn.Parameter(torch.empty(2, p, 4 * h)) for _ in range(config.n_layers))
        self.weight_hh = nn.ParameterList(nn.Parameter(torch.empty(2, p, 4 * h)) for _ in range(config.n_layers))
        self.bias = nn.ParameterList(nn.Parameter(torch.empty(2, 4 * h)) for _ in range(config.n_layers))
        self.weight_proj = nn.ParameterList(nn.Parameter(torch.empty(2, h, p)) for _ in range(config.n_layers))
        self._derived = DerivedWeights()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform ±1/√H initialisation (PyTorch's LSTM default), zero biases."""
        bound = 1.0 / math.sqrt(self.hidden_dim)
        for k in range(self.n_layers):
            for w in (self.weight_ih[k], self.weight_hh[k], self.weight_proj[k]):
                nn.init.uniform_(w, -bound, bound)
            nn.init.zeros_(self.bias[k])

    def zero_state(self, batch_size: int, device=None, dtype=None) -> LSTMState:
        """All-zero (c, h): c (2, L, B, H), h (2, L, B, P)."""
        dtype = dtype or self.bias[0].dtype
        device = device or self.bias[0].device
        c = torch.zeros(2, self.n_layers, batch_size, self.hidden_dim, device=device, dtype=dtype)
        h = torch.zeros(2, self.n_layers, batch_size, self.projection_dim, device=device, dtype=dtype)
        return c, h

    def forward(
        self, inputs: torch.Tensor, lengths: torch.Tensor, initial_state: LSTMState | None = None
    ) -> tuple[list[torch.Tensor], LSTMState]:
        """Run both stacks.

        Args:
            inputs: (2, B, T, P) — [0] the forward direction's input, [1] the backward direction's input, each in
                its own time order and left-aligned (real steps first, padding after).
            lengths: (B,) long, real steps per row (0 allowed); **must be sorted in descending order**.
            initial_state: (c, h) as :meth:`zero_state`, or ``None`` for zeros.

        Returns:
            outputs: L tensors (2, B, T, P), each layer's output (residual added where configured); zero at padding.
            final_state: (c, h) reached at each row's last real step (its initial state if it has none).
        """
        if inputs.dim() != 4 or inputs.shape[0] != 2:
            raise InputError(f"inputs must be (2, B, T, P), got {tuple(inputs.shape)}")
        _, b, t, p = inputs.shape
        lengths = lengths.to("cpu")
        if b > 1 and bool((lengths[1:] > lengths[:-1]).any()):
            raise InputError("lengths must be sorted in descending order")
        if initial_state is None:  # float32 under autocast too: the state is never kept in low precision
            state_dtype = torch.float32 if inputs.dtype in (torch.bfloat16, torch.float16) else inputs.dtype
            initial_state = self.zero_state(b, inputs.device, state_dtype)
        c0, h0 = initial_state
        # Padding-free: the real (row, step) positions in time-major order — rows are sorted by length, so at step s
        # the first batch_sizes[s] rows are running. Every layer runs on this packed (2, N, P) layout (N = real
        # positions), so nothing is computed for padding; each layer's output is scattered back to (2, B, T, P).
        # all rows of one length l (always so for one sentence): time-major is a transpose of the first l steps (a
        # view for one row), no gather and no scatter
        full_rows = b == 0 or int(lengths[0]) == int(lengths[-1])
        run = int(lengths[0]) if b else 0
        if full_rows:
            batch_sizes = [b] * run
            x = inputs[:, :, :run].transpose(1, 2).reshape(2, run * b, p)
        else:
            running = torch.arange(t).unsqueeze(1) < lengths.unsqueeze(0)  # (T, B)
            batch_sizes = running.sum(1).tolist()
            steps, rows = running.nonzero(as_tuple=True)
            flat = (rows * t + steps).to(inputs.device)
            x = inputs.reshape(2, b * t, p).index_select(1, flat)  # (2, N, P)
        outputs: list[torch.Tensor] = []
        final_c: list[torch.Tensor] = []
        final_h: list[torch.Tensor] = []
        for k in range(self.n_layers):
            layer_in = x
            if self.dropout > 0 and self.training:
                layer_in = dropout(layer_in, self.dropout)  # elmokit.modules.dropout: a hashed mask
            out, (ck, hk) = self._run_layer(k, layer_in, batch_sizes, c0[:, k], h0[:, k])
            if self.config.use_skip_connections and k > 0:
                out = out + x
            if full_rows:
                full = out.view(2, run, b, self.projection_dim).transpose(1, 2)
                if run < t:
                    full = nn.functional.pad(full, (0, 0, 0, t - run))
                outputs.append(full)
            else:
                full = out.new_zeros(2, b * t, self.projection_dim).index_copy(1, flat, out)
                outputs.append(full.view(2, b, t, self.projection_dim))
            final_c.append(ck)
            final_h.append(hk)
            x = out
        return outputs, (torch.stack(final_c, 1), torch.stack(final_h, 1))

    @staticmethod
    def _forget_bias(hidden_dim: int, like: torch.Tensor) -> torch.Tensor:
        """(4H,) vector with 1.0 on the forget-gate slice (TF ``LSTMCell(forget_bias=1.0)``), zeros elsewhere."""
        vec = torch.zeros(4 * hidden_dim, dtype=like.dtype, device=like.device)
        vec[2 * hidden_dim : 3 * hidden_dim] = 1.0
        return vec

    def _run_layer(
        self, k: int, x: torch.Tensor, batch_sizes: list[int], c: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One layer, both directions, on packed time-major input ``x`` (2, N, P) (step s = the next
        ``batch_sizes[s]`` positions); returns the packed output (2, N, P) and the final (c, h) per row."""
        low = precision.low_precision_dtype(x.device.type)
        # without autograd the gate math runs in place on the step's buffers (fewer passes, no allocation per step)
        in_place = not (
            torch.is_grad_enabled()
            and any(
                v.requires_grad
                for v in (x, c, h, self.weight_hh[k], self.weight_proj[k], self.weight_ih[k], self.bias[k])
            )
        )
        if not in_place and fused_training():  # training: the fused layer (lstm_train.py), fp32 or bf16 products
            return self._run_layer_fused(k, x, batch_sizes, c, h, low)
        if low is not None:  # under bf16 autocast (training or inference): its own loop, state and gates in float32
            return self._run_layer_low_precision(k, x, batch_sizes, c, h, low)
        if in_place:
            return self._run_layer_inference(k, x, batch_sizes, c, h)
        return self._run_layer_autograd(k, x, batch_sizes, c, h)

    def _run_layer_inference(
        self, k: int, x: torch.Tensor, batch_sizes: list[int], c: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_run_layer` without autograd: a compiled loop over cached weight copies (both directions per step
        for many rows; for a few, direction after direction in the C++ kernel or in TorchScript: see
        :func:`elmokit.modules.lstm_steps._steps_by_direction`)."""
        hd = self.hidden_dim
        cell_clip = self.config.cell_clip
        proj_clip = self.config.proj_clip
        w_hh = self.weight_hh[k]
        w_proj = self.weight_proj[k]
        w_in, w_hh_ifoj = self._derived.get(
            f"inference{k}", (self.weight_ih[k], self.bias[k], w_hh), lambda: self._inference_weights(k)
        )
        p = self.projection_dim
        w_ih, bias = w_in[:, :p], w_in[:, p]  # views: (2, P, 4H) and (2, 4H)
        clips = float(cell_clip or 0.0), float(proj_clip or 0.0)
        rows = c.shape[1]
        exact = invariant.kernels_for(x, c, h, w_proj) if hd % 16 == 0 and p % 16 == 0 else None
        if exact is not None:  # every row in one fixed order, whatever shares the call (modules/invariant.py)
            exact_result = invariant.lstm_layer(exact, self, k, x, batch_sizes, c, h, w_in, w_hh_ifoj, clips)
            if exact_result is not None:
                return exact_result[0], exact_result[1:]
        module = None
        if rows <= native.MAX_LSTM_ROWS and hd % 16 == 0 and p % 16 == 0 and native.usable(x, c, h, w_proj):
            module = native.kernels()
        if rows > native.lstm_rows_limit(module):  # both directions per step, one batched product each
            # the bias as one more input column ((x | 1) · (W_ih ; b)): no pass broadcasting it over xw
            xw = torch.bmm(torch.cat([x, x.new_ones(x.shape[0], x.shape[1], 1)], dim=2), w_in)
            out, final_c, final_h = inference_steps()(xw, batch_sizes, c, h, w_hh_ifoj, w_proj, hd, *clips)
            return out, (final_c, final_h)
        result = None
        # (None: untracked weights)
        packed = (
            None
            if module is None
            else self._derived.cached(
                f"native{k}", (self.weight_ih[k], self.bias[k], w_hh), lambda: native.pack_lstm(w_hh_ifoj)
            )
        )
        if packed is not None:  # a few rows: the C++ step loop (native.py; None for inf/NaN inputs)
            result = native.lstm_layer(
                module, x, [n for n in batch_sizes if n > 0], c, h, w_ih, bias, packed, w_proj, *clips
            )
        if result is None:  # a few rows: direction after direction
            result = inference_steps(by_direction=True)(x, batch_sizes, c, h, w_ih, bias, w_hh_ifoj, w_proj, hd, *clips)
        out, final_c, final_h = result
        return out, (final_c, final_h)

    def _run_layer_fused(
        self, k: int, x: torch.Tensor, batch_sizes: list[int], c: torch.Tensor, h: torch.Tensor, low: torch.dtype | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_run_layer` with autograd through :class:`~elmokit.modules.lstm_train.FusedLSTMLayer`: the same cell
        equations as :meth:`_run_layer_autograd` (float32) and :meth:`_run_layer_low_precision` (``low`` = bfloat16
        products), the step loop and its backward fused (C++ kernels where built, its torch-op path elsewhere)."""
        bias = self.bias[k] + self._forget_bias(self.hidden_dim, self.bias[k])
        out, final_c, final_h = fused_lstm_layer(
            x,
            batch_sizes,
            c,
            h,
            self.weight_ih[k],
            bias,
            self.weight_hh[k],
            self.weight_proj[k],
            self.config.cell_clip,
            self.config.proj_clip,
            low,
        )
        return out, (final_c, final_h)

    def _run_layer_autograd(
        self, k: int, x: torch.Tensor, batch_sizes: list[int], c: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_run_layer` with autograd: the cell equations step by step, each op recorded for the backward
        pass."""
        cell_clip = self.config.cell_clip
        proj_clip = self.config.proj_clip
        w_hh = self.weight_hh[k]
        w_proj = self.weight_proj[k]
        # Input contribution for all real positions at once, with the forget bias 1.0 folded in: (2, N, 4H)
        # The bias enters as one more input column ((x | 1) · (W_ih ; b)): no separate pass broadcasting it over xw.
        x1 = torch.cat([x, x.new_ones(x.shape[0], x.shape[1], 1)], dim=2)  # (2, N, P + 1)
        xw = torch.bmm(x1, self._input_weight(k))
        # one split (its backward is one concatenation) rather than a slice per step (each slice's backward would
        # zero-fill a gradient the size of the whole of xw)
        xw_steps = xw.split([n for n in batch_sizes if n > 0], dim=1)
        steps: list[torch.Tensor] = []
        done_c: list[torch.Tensor] = []  # final states of rows that ended, latest-ending first
        done_h: list[torch.Tensor] = []
        n_prev, step = c.shape[1], 0
        for n in batch_sizes:
            if n < n_prev:
                done_c.append(c[:, n:n_prev])
                done_h.append(h[:, n:n_prev])
                c, h = c[:, :n], h[:, :n]
                n_prev = n
            if n == 0:
                break
            z = torch.baddbmm(xw_steps[step], h, w_hh)  # gates i, j, f, o (forget bias included)
            step += 1
            # chunk, not slices: one backward concatenation instead of four zero-filled gradients of z's size
            zi, zj, zf, zo = z.chunk(4, dim=-1)
            c = torch.addcmul(torch.sigmoid(zi) * torch.tanh(zj), torch.sigmoid(zf), c)
            if cell_clip and cell_clip > 0:  # as the inference loop: ≤ 0 or None = no clipping
                c = c.clamp(-cell_clip, cell_clip)
            h = torch.bmm(torch.sigmoid(zo) * torch.tanh(c), w_proj)
            if proj_clip and proj_clip > 0:
                h = h.clamp(-proj_clip, proj_clip)
            steps.append(h)
        if n_prev > 0:
            done_c.append(c)
            done_h.append(h)
        final_c = torch.cat(done_c[::-1], dim=1) if done_c else c
        final_h = torch.cat(done_h[::-1], dim=1) if done_h else h
        out = torch.cat(steps, dim=1) if steps else x.new_zeros(2, 0, w_proj.shape[-1])
        return out, (final_c, final_h)

    # long: the per-step loop of the mixed-precision path, kept in one piece as its float32 twin above
    def _run_layer_low_precision(
        self, k: int, x: torch.Tensor, batch_sizes: list[int], c: torch.Tensor, h: torch.Tensor, low: torch.dtype
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`_run_layer` under bfloat16 autocast (:mod:`elmokit.modules.precision`), with or without autograd.

        The three matrix products (input, recurrent, projection) take ``low``-precision (bfloat16) copies of their
        inputs and weights and accumulate in float32; the input contribution x·W_ih, the bias (forget bias 1.0
        included), the gate pre-activations z = x·W_ih + b + h·W_hh, the gates, the cell state c and its clip are
        float32; h_t = clip(o ⊙ tanh(c) · W_proj) is rounded to ``low`` as the next product's input and returned in
        float32, as are the final states. Same cell equations as :meth:`_run_layer_autograd`.

        Args: as :meth:`_run_layer`; ``c`` (2, B, H) and ``h`` (2, B, P) float32 (a low-precision state is widened).
        Returns: out (2, N, P) float32, (final c (2, B, H), final h (2, B, P)) float32.
        """
        cell_clip = self.config.cell_clip
        proj_clip = self.config.proj_clip
        with torch.autocast(device_type=x.device.type, enabled=False):  # every cast below is explicit
            bias = self.bias[k] + self._forget_bias(self.hidden_dim, self.bias[k])  # (2, 4H) float32
            xw = torch.bmm(x.to(low), self.weight_ih[k].to(low)).float() + bias.unsqueeze(1)  # (2, N, 4H)
            w_hh = self.weight_hh[k].to(low)
            w_proj = self.weight_proj[k].to(low)
            xw_steps = xw.split([n for n in batch_sizes if n > 0], dim=1)
            c, h = c.float(), h.float()  # h: the float32 start state, until the first step replaces it
            h_low = h.to(low)
            steps: list[torch.Tensor] = []  # each step's h_t in low precision, widened once at the end
            done_c: list[torch.Tensor] = []  # final states of rows that ended, latest-ending first
            done_h: list[torch.Tensor] = []
            n_prev, step = c.shape[1], 0
            for n in batch_sizes:
                if n < n_prev:
                    done_c.append(c[:, n:n_prev])
                    done_h.append((h_low if step else h)[:, n:n_prev].float())
                    c, h, h_low = c[:, :n], h[:, :n], h_low[:, :n]
                    n_prev = n
                if n == 0:
                    break
                z = xw_steps[step] + torch.bmm(h_low, w_hh)  # float32 + bfloat16 → float32; gates i, j, f, o
                step += 1
                zi, zj, zf, zo = z.chunk(4, dim=-1)
                c = torch.addcmul(torch.sigmoid(zi) * torch.tanh(zj), torch.sigmoid(zf), c)
                if cell_clip and cell_clip > 0:
                    c = c.clamp(-cell_clip, cell_clip)
                h_low = torch.bmm((torch.sigmoid(zo) * torch.tanh(c)).to(low), w_proj)
                if proj_clip and proj_clip > 0:  # in bfloat16: exact for the released clip 3 (a bfloat16 number)
                    h_low = h_low.clamp(-proj_clip, proj_clip)
                steps.append(h_low)
            if n_prev > 0:
                done_c.append(c)
                done_h.append((h_low if step else h).float())
            final_c = torch.cat(done_c[::-1], dim=1) if done_c else c
            final_h = torch.cat(done_h[::-1], dim=1) if done_h else h
            p = self.projection_dim
            out = torch.cat(steps, dim=1).float() if steps else x.new_zeros(2, 0, p, dtype=torch.float32)
        return out, (final_c, final_h)

    def _input_weight(self, k: int) -> torch.Tensor:
        """Layer k's (2, P + 1, 4H) input weight with the bias (forget bias 1.0 folded in) as its last row."""
        bias = self.bias[k] + self._forget_bias(self.hidden_dim, self.bias[k])
        return torch.cat([self.weight_ih[k], bias.unsqueeze(1)], dim=1)

    def _inference_weights(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer k's (W_ih ; b) as :meth:`_input_weight` (2, P + 1, 4H) and W_hh (2, P, 4H), both with their gate
        columns reordered from the stored i, j, f, o to i, f, o, j (the three sigmoid gates side by side, for the
        inference loops); contiguous copies, cached by :meth:`_run_layer_inference`. Reordering columns changes no
        value."""
        hd = self.hidden_dim
        order = torch.cat([torch.arange(0, hd), torch.arange(2 * hd, 4 * hd), torch.arange(hd, 2 * hd)])
        order = order.to(self.weight_hh[k].device)
        return (
            self._input_weight(k).index_select(2, order).contiguous(),
            self.weight_hh[k].index_select(2, order).contiguous(),
        )
