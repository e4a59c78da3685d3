"""Hugging Face Hub model names: ``org/name`` or ``org/name@revision`` → the model's folder in the Hub cache
(``pip install 'elmokit[hub]'``, huggingface_hub).

Every place that takes a model name resolves it through :func:`elmokit.weights.native.resolve_model_name`, which
asks here when the name is not a local path: an existing folder or file of that name always wins. The repository's
files (a native folder: ``config.json`` + ``model.safetensors`` [+ ``vocab.txt``, ``chars.txt``]; or an original
``*options*.json`` + ``*.hdf5``) are fetched with ``huggingface_hub.snapshot_download`` into the Hub cache, so the
Hub's own settings apply: ``HF_HOME`` / ``HF_HUB_CACHE`` (where the cache is), ``HF_HUB_OFFLINE=1`` (no network: the
cached snapshot of the revision is used, laid out as ``models--org--name/refs/<revision>`` holding a commit and
``snapshots/<commit>/<files>``), ``HF_TOKEN`` or ``huggingface-cli login`` (private and gated repositories). The
Hub library reads these when it is imported: set them before the process starts. A name resolved once is not asked
for again in the same process (the CLI checks a model before it loads it).

A name that is neither a local path nor fetchable (no network and not cached, no such repository or revision, no
access) is one :class:`~elmokit.errors.MissingFileError` line naming the repository, the revision and the reason.

Source: huggingface_hub 0.36 ``snapshot_download`` and its cache layout
(https://huggingface.co/docs/huggingface_hub/guides/manage-cache).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from elmokit.errors import MissingExtraError, MissingFileError, UsageError, import_optional

__all__ = ["parse_hub_name", "hub_model_dir", "HUB_EXTRA_HINT"]

logger = logging.getLogger(__name__)

HUB_EXTRA_HINT = "pip install 'elmokit[hub]'"
#: A Hub repository id part (the Hub's rule: letters, digits, ``.``, ``_``, ``-``; not starting with ``.`` or
#: ``-``; no ``--`` or ``..``; at most 96 characters), then an optional ``@revision`` (branch, tag or commit).
_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,95}"
_HUB_NAME = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?")
#: Resolved names of this process: (repo id, revision) → snapshot folder.
_RESOLVED: dict[tuple[str, str | None], Path] = {}


def parse_hub_name(name: object) -> tuple[str, str | None] | None:
    """``"org/name"`` → ``("org/name", None)``, ``"org/name@v1"`` → ``("org/name", "v1")``; ``None`` for anything
    that is not spelled as a Hub repository id (a path with more or fewer parts, an absolute or ``./`` path, a
    released name, a non-string). Whether a local path of that name exists is the caller's check."""
    if not isinstance(name, str):
        return None
    match = _HUB_NAME.fullmatch(name)
    if match is None or "--" in match["repo"] or ".." in match["repo"]:
        return None
    return match["repo"], match["revision"]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def hub_model_dir(name: str) -> Path:
    """The local snapshot folder of the Hub model ``name`` (``org/name[@revision]``), fetched into the Hub cache if
    needed (see the module docstring).

    Raises:
        UsageError: ``name`` is not spelled as a Hub repository id.
        MissingFileError: huggingface_hub is not installed (names the ``pip install``), or the repository cannot be
            fetched and is not cached (offline, unreachable, no such repository or revision, no access): one line.
    """
    parsed = parse_hub_name(name)
    if parsed is None:
        raise UsageError(f"{name!r} is not a Hugging Face Hub model name (org/name or org/name@revision)")
    if parsed in _RESOLVED and _RESOLVED[parsed].is_dir():
        return _RESOLVED[parsed]
    repo_id, revision = parsed
    try:
        hub = import_optional("huggingface_hub", "hub", "loading a model from the Hugging Face Hub")  # optional: hub
        constants = import_optional("huggingface_hub.constants", "hub", "loading a model from the Hub")  # optional
    except MissingExtraError as exc:
        raise MissingFileError(
            f"model {name!r}: no such folder here, and as a Hugging Face Hub name it needs huggingface_hub: {exc.hint}"
        ) from None
    where = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    try:
        folder = Path(hub.snapshot_download(repo_id, revision=revision, library_name="elmokit"))
    except Exception as exc:  # noqa: BLE001 — every failure of the Hub library becomes the one line below
        offline = constants.HF_HUB_OFFLINE
        state = (
            "HF_HUB_OFFLINE is set and it is not in the Hub cache"
            if offline
            else "it could not be fetched and is not in the Hub cache"
        )
        raise MissingFileError(
            f"model {name!r}: no such folder here, and the Hugging Face Hub model {where}: {state} "
            f"({constants.HF_HUB_CACHE}) — {_one_line(exc)}"
        ) from None
    logger.info("Hub model %s → %s", where, folder)
    _RESOLVED[parsed] = folder
    return folder
