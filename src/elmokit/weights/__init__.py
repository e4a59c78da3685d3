"""Weight formats: the original options.json + HDF5 (:mod:`.original`) and the native safetensors folder
(:mod:`.native`).

Both loaders end in :func:`load_state_checked`, so a mismatch reads the same whatever the file format.
"""

from __future__ import annotations

import torch

from elmokit.errors import WeightsError
from elmokit.modules.bilm import BiLM

__all__ = ["check_state_fits", "load_state_checked"]


def check_state_fits(
    expected: dict[str, torch.Tensor],
    state: dict[str, torch.Tensor],
    source: str,
    *,
    error: type[Exception] = WeightsError,
    advice: str = "",
) -> None:
    """Check that ``state`` holds exactly the tensors of ``expected`` (a model's ``state_dict()``), same names and
    shapes; raise ``error`` naming ``source`` and the first tensor that differs (``load_state_dict`` would raise a long
    torch error listing them all), followed by ``advice`` when given.

    Raises:
        error (default WeightsError): a tensor with no place in the model, one whose shape differs (both shapes
            given), or model tensors with no value.
    """
    tail = f": {advice}" if advice else ""
    for name, tensor in expected.items():  # in the model's order, so the first layer that differs is named
        if name in state and tuple(state[name].shape) != tuple(tensor.shape):
            raise error(
                f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, the model's config implies "
                f"{tuple(tensor.shape)}{tail}"
            )
    extra = [name for name in state if name not in expected]
    if extra:
        raise error(f"{source}: tensor {extra[0]!r} has no place in the model{tail}")
    missing = sorted(set(expected) - set(state))
    if missing:
        raise error(f"{source}: no values for {missing[:5]}" + (" ..." if len(missing) > 5 else "") + tail)


def load_state_checked(model: BiLM, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` (parameter name → tensor) into ``model`` after :func:`check_state_fits`.

    Raises:
        WeightsError: naming ``source`` and the tensor (see :func:`check_state_fits`).
    """
    check_state_fits(model.state_dict(), state, source)
    model.load_state_dict(state, strict=True)
