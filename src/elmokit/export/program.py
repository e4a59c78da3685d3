"""The biLM's inference path written for ``torch.export``: no data-dependent Python control flow, the recurrence a
masked :func:`torch._higher_order_ops.scan` over time (lowered to a ``while`` loop by AOTInductor and to ONNX ``Scan``
by the dynamo ONNX exporter), so one exported program takes any batch size and sentence length.

Same equations as :class:`elmokit.modules.bilm.BiLM` (``forward(char_ids, state)``, boundaries added and stripped):
the token encoder runs on the real positions (``nonzero``; not de-duplicated, and over all C − w + 1 windows: the
eager encoder's data-dependent trimming of windows did not export on torch 2.13) with plain convolutions, and every
LSTM step runs on every row, a row past its end keeping its state (``torch.where`` on the mask) and writing a zero
output.
"""

from __future__ import annotations

import torch
from torch import nn
from torch._higher_order_ops.scan import scan
from torch.nn import functional as F

from elmokit.modules.bilm import BiLM
from elmokit.modules.padding import remove_sentence_boundaries, reverse_padded

__all__ = ["InferenceProgram"]


class InferenceProgram(nn.Module):
    """A :class:`BiLM`'s inference path as one traceable function of tensors (shares the model's parameters).

    ``forward(char_ids, c0, h0) -> (layers, mask, c, h)``:

    * ``char_ids``: (B, T, C) int64 from :func:`elmokit.batch_to_ids` (0 = padding, real tokens first in each row).
    * ``c0`` (2, L, B, H), ``h0`` (2, L, B, P) float32: the state each row starts from (index 0 of dim 0 = forward
      stack), as ``BiLM.forward``'s ``state``; zeros, or the model's stored start state repeated, for a stateless call.
    * ``layers`` (B, L+1, T, 2P) float32, zero at padding; ``mask`` (B, T) bool; ``c``, ``h`` the state reached at each
      row's last step, shaped as ``c0``, ``h0`` (backward stack: after reading ``<S>``), as ``BiLMOutput.state``.

    Args:
        bilm: a stateless byte-scheme or character-vocabulary model (no word embedding), eval mode.
        bind_batch: reshape each step's output to the batch size read outside the loop (AOTInductor's lowering of
            ``scan`` to ``while_loop`` in torch 2.13 resolves the output buffer's shape only from sizes the loop body
            takes as inputs: without this it fails with ``KeyError: s…``). Not needed for ONNX.

    Source: :meth:`BiLM.forward` with ``keep_sentence_boundaries=False`` (``tests/test_export.py`` checks equality).
    """

    def __init__(self, bilm: BiLM, *, bind_batch: bool = False) -> None:
        super().__init__()
        self.bilm = bilm
        self.bind_batch = bind_batch
        cfg = bilm.config.lstm
        self.n_layers, self.hidden_dim, self.projection_dim = cfg.n_layers, cfg.dim, cfg.projection_dim
        self.cell_clip = float(cfg.cell_clip) if cfg.cell_clip and cfg.cell_clip > 0 else 0.0
        self.proj_clip = float(cfg.proj_clip) if cfg.proj_clip and cfg.proj_clip > 0 else 0.0
        self.skip = bool(cfg.use_skip_connections)
        self.register_buffer("bos", torch.tensor(bilm._bos, dtype=torch.long), persistent=False)
        self.register_buffer("eos", torch.tensor(bilm._eos, dtype=torch.long), persistent=False)
        forget = torch.zeros(4 * self.hidden_dim)
        forget[2 * self.hidden_dim : 3 * self.hidden_dim] = 1.0  # TF's forget bias, gate order i, j, f, o
        self.register_buffer("forget_bias", forget, persistent=False)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, C) ids → (N, P) token vectors: char embedding → valid convolutions → max → activation → highway →
        projection (the semantics of :meth:`TokenEncoder.encode_unique`, with ``F.conv1d``)."""
        encoder = self.bilm.token_encoder
        cnn = encoder.char_cnn
        x = F.embedding(ids, cnn.embedding_table()).transpose(1, 2)  # (N, D, C)
        x = torch.cat([F.conv1d(x, conv.weight, conv.bias).amax(dim=-1) for conv in cnn.convolutions], dim=-1)
        x = torch.relu(x) if cnn.activation == "relu" else torch.tanh(x)
        for transform, gate in zip(encoder.highway.transforms, encoder.highway.gates):
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(transform(x)) + (1.0 - t) * x
        return encoder.projection(x)

    def forward(
        self, char_ids: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, c = char_ids.shape
        lengths = (char_ids != 0).any(dim=-1).sum(dim=1)  # (B,)
        steps = torch.arange(t + 2, device=char_ids.device).unsqueeze(0)  # (1, T + 2)
        # <S> first, </S> after each row's last token
        ids = torch.cat([self.bos.expand(b, 1, c), char_ids, char_ids.new_zeros(b, 1, c)], dim=1)
        ids = torch.where((steps == (lengths + 1).unsqueeze(1)).unsqueeze(-1), self.eos, ids)
        mask = steps < (lengths + 2).unsqueeze(1)  # (B, T + 2)
        # the token encoder runs on the real positions only (a batch of mixed lengths is mostly padding)
        real = mask.reshape(-1).nonzero().squeeze(1)  # (N,)
        encoded = self.encode(ids.reshape(b * (t + 2), c).index_select(0, real))  # (N, P)
        tokens = encoded.new_zeros(b * (t + 2), self.projection_dim).index_copy(0, real, encoded)
        tokens = tokens.reshape(b, t + 2, self.projection_dim)
        lengths2 = lengths + 2
        x = torch.stack([tokens, reverse_padded(tokens, lengths2)], dim=0)  # (2, B, T + 2, P), each reading order
        step_mask = mask.t().reshape(t + 2, 1, b, 1).contiguous()  # (T + 2, 1, B, 1)
        layers = [torch.cat([tokens, tokens], dim=-1)]
        final_c, final_h = [], []
        for k in range(self.n_layers):
            out, ck, hk = self._layer(k, x, step_mask, c0[:, k].contiguous(), h0[:, k].contiguous())
            if self.skip and k > 0:
                out = out + x
            layers.append(torch.cat([out[0], reverse_padded(out[1], lengths2)], dim=-1))
            final_c.append(ck)
            final_h.append(hk)
            x = out
        stacked = torch.stack(layers, dim=1) * mask.view(b, 1, t + 2, 1).to(torch.float32)  # (B, L+1, T+2, 2P)
        out_layers, out_mask = remove_sentence_boundaries(stacked, mask)
        return out_layers, out_mask, torch.stack(final_c, dim=1), torch.stack(final_h, dim=1)

    def _layer(
        self, k: int, x: torch.Tensor, step_mask: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer k, both directions: x (2, B, T', P) → out (2, B, T', P) (zero past each row's end), final c (2, B, H),
        final h (2, B, P)."""
        lstm = self.bilm.bilstm
        b = x.shape[1]
        bias = (lstm.bias[k] + self.forget_bias).unsqueeze(1).unsqueeze(1)  # (2, 1, 1, 4H)
        xw = (torch.matmul(x, lstm.weight_ih[k].unsqueeze(1)) + bias).permute(2, 0, 1, 3).contiguous()  # (T', 2, B, 4H)
        w_hh, w_proj = lstm.weight_hh[k], lstm.weight_proj[k]
        cell_clip, proj_clip, p, bind = self.cell_clip, self.proj_clip, self.projection_dim, self.bind_batch

        def step(carry, inputs):
            c, h = carry
            z, m = inputs  # (2, B, 4H), (1, B, 1)
            z = z + torch.bmm(h, w_hh)
            zi, zj, zf, zo = z.chunk(4, dim=-1)
            c_new = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zj)
            if cell_clip > 0:
                c_new = c_new.clamp(-cell_clip, cell_clip)
            h_new = torch.bmm(torch.sigmoid(zo) * torch.tanh(c_new), w_proj)
            if proj_clip > 0:
                h_new = h_new.clamp(-proj_clip, proj_clip)
            y = h_new * m.to(h_new.dtype)
            if bind:
                y = y.reshape(2, b, p)
            return (torch.where(m, c_new, c), torch.where(m, h_new, h)), y

        # The first step (<S> / </S>, real in every row) and the last (real only in the longest rows) run outside the
        # scan, which then covers exactly T steps: AOTInductor's scan lowering (torch 2.13) sizes its output buffer
        # from the scan length only when that length is a plain input size (T), not an expression of one (T + 2).
        t = xw.shape[0] - 2
        carry, first = step((c0, h0), (xw[0], step_mask[0]))
        carry, ys = scan(step, carry, (xw[1 : t + 1], step_mask[1 : t + 1]))
        (c, h), last = step(carry, (xw[t + 1], step_mask[t + 1]))
        ys = torch.cat([first.unsqueeze(0), ys, last.unsqueeze(0)], dim=0)  # (T', 2, B, P)
        return ys.permute(1, 2, 0, 3), c, h
