"""Device names → ``torch.device``, with one clear error for a device this machine lacks."""

from __future__ import annotations

import torch

from elmokit.errors import UsageError

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` (or ``None``) → ``cuda`` when available, else ``cpu``; anything else as ``torch.device``.

    Raises:
        UsageError: an unknown device name, or a CUDA device asked for where CUDA is not available (or a CUDA index
            beyond the visible devices).
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"device {str(device)!r} asked for, but CUDA is not available on this machine "
                "(use --device cpu or auto)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(
                f"device {str(device)!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UsageError(
                f"device {str(device)!r} asked for, but Apple MPS is not available on this machine "
                "(use --device cpu or auto)"
            )
    elif dev.type != "cpu":
        raise UsageError(f"unsupported device {device!r}: use auto, cpu, cuda or cuda:N")
    return dev
