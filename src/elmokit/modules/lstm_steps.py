"""The biLM LSTM's inference step loops (no autograd), compiled with TorchScript where it is available.

:func:`_steps_in_place` advances both directions per step (one batched product each), :func:`_steps_by_direction`
runs direction after direction (each direction's recurrent weights stay in the cores' L2 across its steps; the C++
kernel of :mod:`elmokit.modules.native` runs the same loop), :func:`_direction_steps` is one direction's loop;
:func:`inference_steps` returns the compiled (or eager) loop. The cell equations are :class:`~elmokit.modules.lstm.
BiLSTM`'s (TensorFlow ``LSTMCell`` with ``num_proj`` and clipping; gate columns reordered i, f, o, j by
:meth:`~elmokit.modules.lstm.BiLSTM._inference_weights`). Shapes as :class:`~elmokit.modules.lstm.BiLSTM`: packed
time-major inputs (2, N, ·), ``sizes`` the running rows per step.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

__all__ = ["inference_steps"]

log = logging.getLogger(__name__)


# Splitting this loop would cost the hot path: a helper per step adds a call per time step, one for the re-cut of
# the views when rows end would return nine of them.
# long: the hot per-step loop of one direction, its buffers and gate views kept in locals across the steps
def _direction_steps(
    xw: torch.Tensor,
    sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_hh: torch.Tensor,
    w_proj: torch.Tensor,
    hidden_dim: int,
    cell_clip: float,
    proj_clip: float,
    out: torch.Tensor,
    final_c: torch.Tensor,
    final_h: torch.Tensor,
) -> None:
    """The recurrent loop of one direction of one layer without autograd (see :func:`_steps_by_direction`).

    Args:
        xw: (N, 4H) input contributions x·W_ih + b (forget bias included) of the packed time-major positions, gate
            columns **i, f, o, j**; read only.
        sizes: running rows per step, all > 0, non-increasing (rows sorted by length); they sum to N.
        c, h: (B, H), (B, P) start state; read only.
        w_hh: (P, 4H), gate columns i, f, o, j; w_proj: (H, P).
        cell_clip, proj_clip: ≤ 0 means no clipping.
        out: (N, P), written: h_t of every position (the projection writes straight into it).
        final_c, final_h: (B, H), (B, P), written: each row's state after its last step (its start state if it has
            none).

    Every step writes into buffers made once (``out=`` forms), and the gate views are re-cut only when rows end, so
    a step is ten ops with no allocation: at batch 1 the per-step cost is op overhead.
    """
    hd = hidden_dim
    b = c.shape[0]
    n_prev = sizes[0] if len(sizes) > 0 else 0
    if n_prev < b:  # rows with no step keep their start state
        final_c.narrow(0, n_prev, b - n_prev).copy_(c.narrow(0, n_prev, b - n_prev))
        final_h.narrow(0, n_prev, b - n_prev).copy_(h.narrow(0, n_prev, b - n_prev))
    if n_prev == 0:
        return
    xw_steps = xw.split(sizes, 0)
    out_steps = out.split(sizes, 0)
    z = xw.new_empty(n_prev, 4 * hd)  # the step's gate pre-activations, then (in place) activations
    m = xw.new_empty(n_prev, hd)  # σ(o) · tanh(c)
    c_pair = xw.new_empty(2, n_prev, hd)  # the cell state alternates between these two buffers
    c_now = c.narrow(0, 0, n_prev)
    h_now = h.narrow(0, 0, n_prev)
    c_next = c_pair[0]
    c_spare = c_pair[1]
    sig = z.narrow(1, 0, 3 * hd)  # views of z and the buffers, cut again only when rows end
    g_i = z.narrow(1, 0, hd)
    g_f = z.narrow(1, hd, hd)
    g_o = z.narrow(1, 2 * hd, hd)
    g_j = z.narrow(1, 3 * hd, hd)
    for s in range(len(sizes)):
        n = sizes[s]
        if n < n_prev:  # rows n … n_prev − 1 ended at the previous step
            final_c.narrow(0, n, n_prev - n).copy_(c_now.narrow(0, n, n_prev - n))
            final_h.narrow(0, n, n_prev - n).copy_(h_now.narrow(0, n, n_prev - n))
            c_now = c_now.narrow(0, 0, n)
            h_now = h_now.narrow(0, 0, n)
            c_next = c_next.narrow(0, 0, n)
            c_spare = c_spare.narrow(0, 0, n)
            z = z.narrow(0, 0, n)
            m = m.narrow(0, 0, n)
            sig = z.narrow(1, 0, 3 * hd)
            g_i = z.narrow(1, 0, hd)
            g_f = z.narrow(1, hd, hd)
            g_o = z.narrow(1, 2 * hd, hd)
            g_j = z.narrow(1, 3 * hd, hd)
            n_prev = n
        torch.addmm(xw_steps[s], h_now, w_hh, out=z)  # gates i, f, o, j
        sig.sigmoid_()
        g_j.tanh_()
        g_j.mul_(g_i)  # σ(i) · tanh(j)
        torch.addcmul(g_j, g_f, c_now, out=c_next)  # + σ(f) · c
        if cell_clip > 0:
            c_next.clamp_(-cell_clip, cell_clip)
        torch.tanh(c_next, out=m)
        m.mul_(g_o)  # σ(o) · tanh(c)
        h_next = out_steps[s]
        torch.mm(m, w_proj, out=h_next)
        if proj_clip > 0:
            h_next.clamp_(-proj_clip, proj_clip)
        c_now = c_next
        c_next, c_spare = c_spare, c_next  # the next step writes the other buffer
        h_now = h_next
    final_c.narrow(0, 0, n_prev).copy_(c_now)
    final_h.narrow(0, 0, n_prev).copy_(h_now)


def _steps_by_direction(
    x: torch.Tensor,
    batch_sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_ih: torch.Tensor,
    bias: torch.Tensor,
    w_hh: torch.Tensor,
    w_proj: torch.Tensor,
    hidden_dim: int,
    cell_clip: float,
    proj_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer without autograd, both directions, **one after the other** (for batches of a few rows; see
    :meth:`BiLSTM._run_layer`): the same cell equations as the autograd loop.

    Args:
        x: (2, N, P) the layer's input at the packed time-major positions (step s = the next ``batch_sizes[s]``).
        batch_sizes: running rows per step (non-increasing; rows sorted by length; zeros allowed).
        c, h: (2, B, H), (2, B, P) start state (not modified).
        w_ih: (2, P, 4H), bias: (2, 4H) (forget bias included), w_hh: (2, P, 4H), all with gate columns in the order
            **i, f, o, j** (see :meth:`BiLSTM._inference_weights`); w_proj: (2, H, P).
        cell_clip, proj_clip: ≤ 0 means no clipping.

    Returns:
        (out (2, N, P), final c (2, B, H), final h (2, B, P)).

    Written in the TorchScript subset (:func:`inference_steps`). The directions run one after the other, not as one
    batched product per step (:func:`_steps_in_place`): with 2 threads each core then re-reads its half of one
    direction's W_hh and W_proj (1.25 MB of the small configuration's 2.5 MB) every step, which stays in its 2 MB L2
    cache; both directions' halves (2.5 MB) did not, and every step re-read them from L3 (the LSTMs of a 10-token
    sentence: 3.3 → 2.3 ms, ``bench/latency_breakdown.py``). At batch 64 the batched product is faster (its GEMMs are
    larger and per-step overhead is small beside them), so :meth:`BiLSTM._run_layer` uses this for few rows only.
    """
    sizes: list[int] = []
    for n in batch_sizes:
        if n > 0:
            sizes.append(n)
    out = x.new_empty(2, x.shape[1], w_proj.shape[2])
    final_c = torch.empty_like(c)
    final_h = torch.empty_like(h)
    for d in range(2):
        xw = torch.addmm(bias[d], x[d], w_ih[d])  # (N, 4H), every step's input contribution in one GEMM
        _direction_steps(
            xw, sizes, c[d], h[d], w_hh[d], w_proj[d], hidden_dim, cell_clip, proj_clip, out[d], final_c[d], final_h[d]
        )
    return out, final_c, final_h


def _steps_in_place(
    xw: torch.Tensor,
    batch_sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_hh: torch.Tensor,
    w_proj: torch.Tensor,
    hidden_dim: int,
    cell_clip: float,
    proj_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrent loop of one layer without autograd, both directions at once (one batched product per step; for
    batches of more than a few rows, see :meth:`BiLSTM._run_layer` and :func:`_steps_by_direction`).

    Args:
        xw: (2, N, 4H) input contributions x·W_ih + b (forget bias included) of the packed time-major positions, gate
            columns in the order **i, f, o, j** (see :meth:`BiLSTM._inference_weights`); overwritten (the gate math
            runs in place on each step's slice).
        batch_sizes: running rows per step (non-increasing; rows sorted by length).
        c, h: (2, B, H), (2, B, P) start state (not modified).
        w_hh: (2, P, 4H), gate columns i, f, o, j; w_proj: (2, H, P).
        cell_clip, proj_clip: ≤ 0 means no clipping.

    Returns:
        (out (2, N, P), final c (2, B, H), final h (2, B, P)).

    Written in the TorchScript subset: :func:`inference_steps` runs it compiled, which removes the Python interpreter
    from the per-step loop. With the three sigmoid gates side by side one ``sigmoid_`` covers them, and ``narrow``
    (one op) replaces multi-dimensional slicing (an op per dimension): at batch 1 the per-step cost is op overhead.
    """
    hd = hidden_dim
    steps: list[torch.Tensor] = []
    done_c: list[torch.Tensor] = []  # final states of rows that ended, latest-ending first
    done_h: list[torch.Tensor] = []
    n_prev = c.shape[1]
    offset = 0
    for n in batch_sizes:
        if n < n_prev:
            done_c.insert(0, c.narrow(1, n, n_prev - n))
            done_h.insert(0, h.narrow(1, n, n_prev - n))
            c = c.narrow(1, 0, n)
            h = h.narrow(1, 0, n)
            n_prev = n
        if n == 0:
            break
        z = torch.baddbmm(xw.narrow(1, offset, n), h, w_hh)  # (2, n, 4H): gates i, f, o, j (forget bias included)
        offset += n
        z.narrow(2, 0, 3 * hd).sigmoid_()
        j = z.narrow(2, 3 * hd, hd).tanh_()
        j.mul_(z.narrow(2, 0, hd))  # σ(i) · tanh(j)
        c = torch.addcmul(j, z.narrow(2, hd, hd), c)  # + σ(f) · c
        if cell_clip > 0:
            c.clamp_(-cell_clip, cell_clip)
        m = torch.tanh(c).mul_(z.narrow(2, 2 * hd, hd))  # σ(o) · tanh(c)
        h = torch.bmm(m, w_proj)
        if proj_clip > 0:
            h.clamp_(-proj_clip, proj_clip)
        steps.append(h)
    if n_prev > 0:
        done_c.insert(0, c)
        done_h.insert(0, h)
    final_c = torch.cat(done_c, dim=1) if len(done_c) > 0 else c
    final_h = torch.cat(done_h, dim=1) if len(done_h) > 0 else h
    out = torch.cat(steps, dim=1) if len(steps) > 0 else xw.new_zeros(2, 0, w_proj.shape[2])
    return out, final_c, final_h


_compiled_steps = None  # None = not tried yet; False = TorchScript unavailable here (eager loops used); True = compiled
_compiled: dict = {}  # function name → its ScriptFunction


def inference_steps(by_direction: bool = False):
    """The recurrent loop used without autograd: :func:`_steps_in_place` (or, with ``by_direction``,
    :func:`_steps_by_direction`) compiled with TorchScript on first use, or the same function run eagerly (with one
    logged warning) where ``torch.jit.script`` is missing or fails. Both give the same values
    (``tests/test_fast_paths.py``). ``torch.jit`` is deprecated in PyTorch 2.x but still shipped; the eager fallback
    keeps elmokit working when it goes. ``ELMOKIT_TORCHSCRIPT=0`` forces the eager loops."""
    global _compiled_steps
    fn = _steps_by_direction if by_direction else _steps_in_place
    if _compiled_steps is None:
        if os.environ.get("ELMOKIT_TORCHSCRIPT", "1") == "0":
            _compiled_steps = False
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for f in (_steps_in_place, _steps_by_direction):
                        _compiled[f.__name__] = torch.jit.script(f)
                _compiled_steps = True
            except Exception as exc:  # no TorchScript in this torch build, no source files, …
                log.warning(
                    "TorchScript unavailable (%s: %s): the LSTM runs its eager step loop (slower at small "
                    "batches, same values)",
                    type(exc).__name__,
                    exc,
                )
                _compiled_steps = False
    return _compiled[fn.__name__] if _compiled_steps else fn
