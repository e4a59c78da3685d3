"""Left-aligned padded batches (each row's real tokens first, then all-zero padding): the token mask, the sentence
boundaries ``<S>``/``</S>`` added around and removed from each row, and reversal within each row's length.

:mod:`elmokit.modules.bilm` re-exports the public names (``from elmokit.modules.bilm import token_mask`` keeps
working)."""

from __future__ import annotations

import torch

from elmokit.errors import InputError

__all__ = [
    "add_sentence_boundaries",
    "check_left_aligned",
    "remove_sentence_boundaries",
    "reverse_padded",
    "token_mask",
]


def token_mask(char_ids: torch.Tensor) -> torch.Tensor:
    """(…, T, C) character ids → (…, T) bool: a position is a real token when any of its ids is non-zero (padding
    positions are all zero). The same rule as AllenNLP's ``_ElmoCharacterEncoder`` (``(inputs > 0).sum(-1) > 0``)."""
    return (char_ids != 0).any(dim=-1)


def add_sentence_boundaries(
    char_ids: torch.Tensor, bos: list[int], eos: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrap every row in ``<S> … </S>``.

    Args:
        char_ids: (B, T, C) long, 0 = padding; a row's real tokens come first.
        bos, eos: the C ids of the ``<S>`` / ``</S>`` rows.
    Returns:
        (B, T + 2, C) ids and the new (B, T + 2) bool mask. An empty sentence becomes ``<S> </S>``.
    Source: AllenNLP ``add_sentence_boundary_token_ids``.
    """
    b, t, c = char_ids.shape
    mask = token_mask(char_ids)
    lengths = mask.sum(1)
    out = char_ids.new_zeros((b, t + 2, c))
    out[:, 1 : t + 1] = char_ids
    out[:, 0] = torch.tensor(bos, dtype=char_ids.dtype, device=char_ids.device)
    rows = torch.arange(b, device=char_ids.device)
    out[rows, lengths + 1] = torch.tensor(eos, dtype=char_ids.dtype, device=char_ids.device)
    new_mask = torch.arange(t + 2, device=char_ids.device).unsqueeze(0) < (lengths + 2).unsqueeze(1)
    return out, new_mask


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the first and last real position of each row.

    Args:
        tensor: (B, ..., T, D) with time on dim -2; mask: (B, T) bool including the boundaries.
    Returns:
        (B, ..., T - 2, D) with zeros at padding, and the (B, T - 2) mask.

    Source: AllenNLP ``remove_sentence_boundaries``.
    """
    lengths = mask.sum(1)
    t = mask.shape[1]
    new_mask = torch.arange(t - 2, device=mask.device).unsqueeze(0) < (lengths - 2).clamp(min=0).unsqueeze(1)
    out = tensor[..., 1 : t - 1, :]
    shape = [mask.shape[0]] + [1] * (tensor.dim() - 3) + [t - 2, 1]
    out = out * new_mask.view(shape).to(out.dtype)
    return out, new_mask


def check_left_aligned(mask: torch.Tensor, name: str) -> None:
    """Raise :class:`InputError` when a row of the (B, T) mask has padding before a real position."""
    if mask.numel() == 0:
        return
    lengths = mask.sum(1, keepdim=True)
    expected = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0) < lengths
    bad = (mask != expected).any(1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        gap = int((~mask[row]).nonzero()[0, 0])
        raise InputError(
            f"{name} row {row} has padding (an all-zero token) at position {gap} before a real token: "
            "each row's real tokens must come first, then padding (as batch_to_ids makes them)"
        )


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor, time_dim: int = 1) -> torch.Tensor:
    """Reverse each row within its own length along ``time_dim`` (padding stays in place). An involution.

    ``x`` has batch on dim 0; ``lengths`` (B,) long.
    """
    t = x.shape[time_dim]
    steps = torch.arange(t, device=x.device).unsqueeze(0)  # (1, T)
    lengths = lengths.to(x.device).unsqueeze(1)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)  # (B, T)
    shape = [1] * x.dim()
    shape[0], shape[time_dim] = x.shape[0], t
    index = index.view(shape).expand_as(x)
    return x.gather(time_dim, index)
