"""Weight formats: the original options.json + HDF5 (:mod:`.original`) and the native safetensors folder (:mod:`.native`).

Both loaders end in :func:`load_state_checked`, so a mismatch reads the same whatever the file format.
"""
from __future__ import annotations

import torch

from ..errors import WeightsError
from ..modules.bilm import BiLM

__all__ = ["load_state_checked"]


def load_state_checked(model: BiLM, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` (parameter name → tensor) into ``model`` after checking names and shapes.

    Raises:
        WeightsError: naming ``source`` and the tensor: one with no place in the model, one whose shape differs from
            what the model's config implies (both shapes given), or model tensors with no value.
    """
    own = model.state_dict()
    for name, tensor in state.items():
        if name not in own:
            raise WeightsError(f"{source}: tensor {name!r} has no place in the model")
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise WeightsError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, the model's config "
                               f"implies {tuple(own[name].shape)}")
    missing = sorted(set(own) - set(state))
    if missing:
        raise WeightsError(f"{source}: no values for {missing[:5]}" + (" ..." if len(missing) > 5 else ""))
    model.load_state_dict(state, strict=True)
