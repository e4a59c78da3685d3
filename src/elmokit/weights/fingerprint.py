"""The biLM fingerprint: one hex digest that is equal for two biLMs exactly when they compute the same layers.

It is the one home of this check (the embed parts index compares it on ``--resume``, the task feature cache files
are keyed and checked by it, a saved task model records it and refuses another biLM): sha256 over

1. a version tag (:data:`FINGERPRINT_VERSION`), so a future change of the recipe cannot collide with this one;
2. the configuration (:class:`~elmokit.config.ElmoConfig` as sorted JSON);
3. the character vocabulary of a character-vocabulary model (its characters in id order, its width and long-token
   mode), or a marker saying there is none (the UTF-8 byte scheme);
4. every state-dict tensor in name order — its name, dtype, shape and raw bytes — and the stored start state
   (``start_c`` / ``start_h``, non-persistent buffers that change the outputs) when there is one.

The digest does not depend on how the model was loaded (file, zoo name, seed), on its device or on a
:class:`~elmokit.modules.bilm.StatefulBiLM` wrapper (the wrapped model's digest). sha256 runs at ≈ 1.2 GB/s on this
project's 2-core machine (SHA-NI; BLAKE2b ≈ 0.6 GB/s): 0.03 s for ``elmo_small()``'s 54 MB of weights, 0.22 s for
``elmo_original()``'s 374 MB (the embed writer's former BLAKE2b digest took 0.06 s and 0.42 s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch

from elmokit.errors import InputError
from elmokit.modules.bilm import BiLM, StatefulBiLM

__all__ = ["bilm_fingerprint", "legacy_weights_sha256", "FINGERPRINT_VERSION"]

#: Recorded beside a fingerprint (task models) and hashed into it: a new recipe gets a new tag.
FINGERPRINT_VERSION = "elmokit-bilm-fingerprint-1"


def _unwrap(bilm: object) -> BiLM:
    if isinstance(bilm, StatefulBiLM):
        bilm = bilm.bilm
    if not isinstance(bilm, BiLM):
        raise InputError(
            f"a biLM fingerprint needs an elmokit BiLM, got {type(bilm).__name__} (for an Elmo module pass elmo.bilm)"
        )
    return bilm


def _update_tensor(h, name: str, tensor: torch.Tensor) -> None:
    t = tensor.detach().cpu().contiguous()
    h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
    if t.numel():
        h.update(t.view(-1).view(torch.uint8).numpy())


def bilm_fingerprint(bilm: BiLM) -> str:
    """The biLM's fingerprint (see the module docstring): hex sha256 (64 characters) of its configuration, character
    vocabulary and weights.

    Args:
        bilm: a :class:`~elmokit.modules.bilm.BiLM` (or a :class:`~elmokit.modules.bilm.StatefulBiLM`, hashed as the
            model it wraps), on any device.

    Raises:
        InputError: ``bilm`` is not a BiLM (an :class:`~elmokit.Elmo`: pass ``elmo.bilm``).
    """
    bilm = _unwrap(bilm)
    h = hashlib.sha256(FINGERPRINT_VERSION.encode() + b"\n")
    config = dataclasses.asdict(bilm.config)
    for key in ("word_embedding_dim", "n_words"):  # unset (all but ELMoForManyLangs models): digests stay as before
        if config["char_cnn"].get(key) is None:
            config["char_cnn"].pop(key, None)
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    vocab = getattr(bilm, "char_vocab", None)
    if vocab is None:
        h.update(b"\0chars\0none\0")
    else:
        described = [vocab.characters, vocab.max_characters_per_token, vocab.on_long_token]
        words = getattr(vocab, "words", None)  # an ELMoForManyLangs vocabulary also maps words
        h.update(
            b"\0chars\0"
            + json.dumps(described + ([words] if words is not None else []), ensure_ascii=False).encode(
                "utf-8", "surrogatepass"
            )
        )
    for name, tensor in sorted(bilm.state_dict().items()):
        _update_tensor(h, name, tensor)
    for name in ("start_c", "start_h"):
        start = getattr(bilm, name, None)
        if start is not None:
            _update_tensor(h, f"start_state.{name}", start)
    return h.hexdigest()


def legacy_weights_sha256(bilm: BiLM) -> str:
    """The weights-only sha256 that task models saved before :data:`FINGERPRINT_VERSION` recorded (every state-dict
    tensor's name, dtype, shape and bytes in name order; no configuration or character vocabulary): read only to check
    such a model's biLM, never written. ``bilm`` and errors as :func:`bilm_fingerprint`."""
    bilm = _unwrap(bilm)
    h = hashlib.sha256()
    for name, tensor in sorted(bilm.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
