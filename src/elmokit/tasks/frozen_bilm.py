"""The biLM of a task model: loading a config's ``bilm.model``, the record a saved model keeps of it, the check that
a loaded model gets the same biLM back, and its layers computed once per data file (the feature cache).

The biLM's identity is :func:`elmokit.weights.fingerprint.bilm_fingerprint` (configuration, character vocabulary and
weights), the one fingerprint of the package.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from elmokit.errors import CheckpointError
from elmokit.io import file_sha256
from elmokit.modules.bilm import BiLM
from elmokit.tasks.features import (
    LayerFeatures,
    char_features_from_words,
    compute_layer_features,
    random_bilm_like,
    sentences_sha256,
)
from elmokit.weights.fingerprint import FINGERPRINT_VERSION, bilm_fingerprint, legacy_weights_sha256
from elmokit.weights.native import cache_dir, load_pretrained_bilm, resolve_model_name

__all__ = ["resolve_bilm", "describe_bilm", "check_recorded_bilm", "compute_features", "features_cache_path"]


def resolve_bilm(spec: str, *, random_like: str | None = None, random_seed: int = 0) -> BiLM:
    """A config's ``bilm.model`` → the BiLM (eval mode): a zoo name / model folder, or ``"random"`` (the untrained
    control with ``random_like``'s architecture, :func:`elmokit.tasks.features.random_bilm_like`).

    Raises:
        UsageError / MissingFileError / ConfigError / WeightsError: from the loaders.
    """
    if spec == "random":
        return random_bilm_like(random_like, random_seed).eval()
    return load_pretrained_bilm(spec).eval()


def describe_bilm(spec: str, bilm: BiLM, *, random_like: str | None = None, random_seed: int | None = None) -> dict:
    """The record a task model keeps of its biLM: ``{"model": spec, "name", "file_sha256" (of the folder's
    model.safetensors, as the zoo card lists it; ``None`` for a random or in-memory biLM), "weights_sha256"
    (:func:`~elmokit.weights.fingerprint.bilm_fingerprint`), "fingerprint"
    (:data:`~elmokit.weights.fingerprint.FINGERPRINT_VERSION`), "random_like", "random_seed"}``."""
    record: dict[str, Any] = {
        "model": spec,
        "name": spec,
        "file_sha256": None,
        "weights_sha256": bilm_fingerprint(bilm),
        "fingerprint": FINGERPRINT_VERSION,
    }
    if spec == "random":
        record.update(
            name=f"random({random_like}, seed {random_seed})", random_like=random_like, random_seed=random_seed
        )
    else:
        folder = Path(resolve_model_name(spec))
        weights = folder / "model.safetensors"
        if weights.is_file():
            record["file_sha256"] = file_sha256(weights)
            record["name"] = folder.name if folder.name.startswith("elmokit-") else spec
    return record


def check_recorded_bilm(record: dict, bilm: BiLM, *, given: bool, where: str | os.PathLike) -> None:
    """Refuse a biLM other than the one ``record`` (:func:`describe_bilm`) was made from. A record without
    ``"fingerprint"`` (a task model saved by an elmokit before the one fingerprint) holds the weights-only sha256
    (:func:`~elmokit.weights.fingerprint.legacy_weights_sha256`) and is checked by it.

    Raises:
        CheckpointError: the fingerprints differ (the message names ``where``, the recorded biLM and what was found;
            ``given``: whether the caller passed the biLM, for the wording).
    """
    if record.get("fingerprint") == FINGERPRINT_VERSION:
        fingerprint = bilm_fingerprint(bilm)
    else:
        fingerprint = legacy_weights_sha256(bilm)
    if fingerprint != record["weights_sha256"]:
        what = "the biLM given" if given else f"the biLM {record['model']!r} found now"
        raise CheckpointError(
            f"{where}: this task model was trained with the biLM {record['name']!r} (weights sha256 "
            f"{record['weights_sha256'][:16]}…), but {what} has weights sha256 {fingerprint[:16]}…: a task model's "
            "layer mix only fits its own biLM; use that biLM (or retrain)"
        )


def features_cache_path(bilm: BiLM, tokens: Sequence[Sequence[str]], segmenter_name: str | None = None) -> Path:
    """``$ELMOKIT_CACHE/features/<biLM fingerprint[:16]>/<kind>-<sentences sha256[:24]>.safetensors``: ``kind`` is
    ``words``, or ``chars-<segmenter>`` for character data given their words' vectors. Keys that change with the biLM
    or the text, so a stale file is never found (and :meth:`LayerFeatures.load` checks both again)."""
    kind = "words" if segmenter_name is None else f"chars-{segmenter_name}".replace("/", "_")
    name = f"{kind}-{sentences_sha256(tokens)[:24]}.safetensors"
    return cache_dir() / "features" / bilm_fingerprint(bilm)[:16] / name


def compute_features(
    bilm: BiLM,
    tokens: Sequence[Sequence[str]],
    *,
    segmenter: Callable[[str], list[str]] | None = None,
    segmenter_name: str | None = None,
    use_disk: bool = True,
    batch_size: int = 64,
    progress: bool | str = False,
) -> LayerFeatures:
    """The frozen biLM's layers for ``tokens`` (:class:`~elmokit.tasks.features.LayerFeatures`), from or into the
    disk cache (:func:`features_cache_path`) when ``use_disk``; with ``segmenter`` each character gets its word's
    vectors (:func:`~elmokit.tasks.features.char_features_from_words`). ``progress``: a tqdm bar over the sentences
    while they are computed (a string labels it).

    Raises:
        InputError: a malformed sentence; DataError: a segmentation that does not re-join, a value beyond float16.
    """
    tokens = [list(t) for t in tokens]
    path = features_cache_path(bilm, tokens, None if segmenter is None else segmenter_name) if use_disk else None
    if segmenter is None:
        return compute_layer_features(bilm, tokens, batch_size=batch_size, cache_path=path, progress=progress)
    return char_features_from_words(bilm, tokens, segmenter, batch_size=batch_size, cache_path=path, progress=progress)
