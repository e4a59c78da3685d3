"""elmokit's native format (``config.json`` + ``model.safetensors`` [+ ``vocab.txt``]) and the download cache.

``from_pretrained(name_or_path)`` accepts:

* a released model name (:data:`RELEASED`): its original options + HDF5 are downloaded once into the cache
  (``$ELMOKIT_CACHE``, default ``~/.cache/elmokit``) with a progress bar, to a temporary name renamed into place
  only when complete, and reused offline afterwards;
* a model trained here (:data:`ZOO_MODELS`: ``elmokit-en``, ``elmokit-zh``): the native folder
  ``$ELMOKIT_CACHE/zoo/<name>`` that ``elmokit zoo build`` writes (:func:`resolve_model_name`);
* a directory in the native format (``config.json`` + ``model.safetensors``);
* a directory holding an original ``options.json`` (or ``*options*.json``) and one ``*.hdf5`` weight file;
* an ELMoForManyLangs folder (``char.dic``, ``word.dic``, ``encoder.pkl``, ``token_embedder.pkl``, ``config.json``):
  :mod:`elmokit.weights.efml`;
* a zip archive of such a directory (the NLPL repository's ELMo zips): :mod:`elmokit.weights.archive`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import urllib.request
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from elmokit.characters import CharVocabulary
from elmokit.config import ElmoConfig
from elmokit.errors import ConfigError, InputError, MissingFileError, UsageError, UsageTypeError, WeightsError
from elmokit.io import LOCK_NAME, atomic_path, atomic_write_text
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.weights import load_state_checked
from elmokit.weights.archive import is_model_archive, load_model_archive
from elmokit.weights.efml import is_efml_folder, load_efml
from elmokit.weights.efml_vocab import EfmlVocabulary
from elmokit.weights.hub import hub_model_dir, parse_hub_name

__all__ = [
    "save_pretrained",
    "load_native",
    "load_pretrained_bilm",
    "cache_dir",
    "download",
    "RELEASED",
    "ZOO_MODELS",
    "zoo_model_dir",
    "resolve_model_name",
    "known_model_names",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
]

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CHARS_NAME = "chars.txt"
#: The tensors of a stored start state (:attr:`BiLM.start_state`) in ``model.safetensors``.
START_C, START_H = "start_state.c", "start_state.h"
FORMAT_VERSION = 1

_BASE = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
#: Released English models (AllenNLP's download addresses): name → (options URL, weights URL).
RELEASED: dict[str, tuple[str, str]] = {
    "small": (
        _BASE + "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_options.json",
        _BASE + "2x1024_128_2048cnn_1xhighway/elmo_2x1024_128_2048cnn_1xhighway_weights.hdf5",
    ),
    "medium": (
        _BASE + "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_options.json",
        _BASE + "2x2048_256_2048cnn_1xhighway/elmo_2x2048_256_2048cnn_1xhighway_weights.hdf5",
    ),
    "original": (
        _BASE + "2x4096_512_2048cnn_2xhighway/elmo_2x4096_512_2048cnn_2xhighway_options.json",
        _BASE + "2x4096_512_2048cnn_2xhighway/elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5",
    ),
    "original-5.5b": (
        _BASE + "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json",
        _BASE + "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_weights.hdf5",
    ),
}


#: The models trained by this project (``elmokit zoo build LANG``): name → LANG. Their folders are
#: :func:`zoo_model_dir`; the card (``card.json``) is written last, so a folder without it is an unfinished build.
ZOO_MODELS: dict[str, str] = {"elmokit-en": "en", "elmokit-zh": "zh"}


def cache_dir() -> Path:
    """The download cache: ``$ELMOKIT_CACHE`` or ``~/.cache/elmokit``."""
    return Path(os.environ.get("ELMOKIT_CACHE", Path.home() / ".cache" / "elmokit"))


def zoo_model_name(lang_or_name: str) -> str:
    """The zoo model name of a zoo language or name (``"en"`` or ``"elmokit-en"`` → ``"elmokit-en"``; any case).

    Raises:
        UsageError: neither a zoo language nor a zoo name (the message lists both)."""
    key = lang_or_name.lower() if isinstance(lang_or_name, str) else lang_or_name
    for name, lang in ZOO_MODELS.items():
        if key in (name, lang):
            return name
    raise UsageError(
        f"not a zoo model: {lang_or_name!r}; expected one of {', '.join(sorted([*ZOO_MODELS.values(), *ZOO_MODELS]))}"
    )


def zoo_model_dir(lang_or_name: str, cache: str | os.PathLike | None = None) -> Path:
    """The folder of a zoo model (:data:`ZOO_MODELS`; a language or a name): ``<cache>/zoo/<name>``, ``cache``
    default :func:`cache_dir` (``$ELMOKIT_CACHE``, else ``~/.cache/elmokit``). The one home of the zoo's folders:
    ``elmokit zoo build`` writes there, every loader reads there.

    Raises:
        UsageError: not a zoo language or name."""
    return Path(cache if cache is not None else cache_dir()) / "zoo" / zoo_model_name(lang_or_name)


def known_model_names() -> list[str]:
    """The released names and the zoo names, sorted (for messages)."""
    return sorted([*RELEASED, *ZOO_MODELS])


def resolve_model_name(name_or_path: str | os.PathLike) -> str | os.PathLike | Path:
    """A zoo model name (``elmokit-en``, ``elmokit-zh``; any case) → its folder in the cache; a Hugging Face Hub name
    (``org/name`` or ``org/name@revision``, :mod:`elmokit.weights.hub`) → its snapshot folder in the Hub cache,
    fetched if needed; anything else (a folder, a released name, a path that is not there) is returned unchanged. A
    local path of that name wins over the zoo or Hub name, as folders win over released names.

    Raises:
        MissingFileError: the zoo model is not built (no folder, or no ``card.json``, which its build writes last):
            the message names the folder and the command that builds it (``elmokit zoo build en``); a Hub name that
            cannot be fetched and is not cached, or without huggingface_hub installed (one line naming the reason).
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        return name_or_path
    text = os.fspath(name_or_path)
    key = text.lower() if isinstance(text, str) else ""
    if Path(text).exists():
        return name_or_path
    if key not in ZOO_MODELS:
        return hub_model_dir(text) if parse_hub_name(text) is not None else name_or_path
    folder = zoo_model_dir(key)
    command = f"elmokit zoo build {ZOO_MODELS[key]}"
    if not (folder / "card.json").is_file() or not (folder / CONFIG_NAME).is_file():
        started = folder.is_dir() and any(p.name != LOCK_NAME for p in folder.iterdir())  # not a lone writer lock
        state = (
            "its build is unfinished (no card.json): continue it with `" + command + " --resume`"
            if started
            else f"run `{command}` (about 25 minutes on 2 cores)"
        )
        raise MissingFileError(
            f"zoo model {key!r} is not built: no {folder / 'card.json'} (the cache is "
            f"$ELMOKIT_CACHE, default ~/.cache/elmokit): {state}"
        )
    return folder


def _urlopen(url: str):  # indirection so tests can replace the network
    return urllib.request.urlopen(url, timeout=60)


def download(url: str, dest: str | os.PathLike, *, opener: Callable | None = None, progress: bool = True) -> Path:
    """Fetch ``url`` to ``dest`` unless it is already there. Never leaves a partial file at ``dest``: data goes to a
    temporary name in the same folder, renamed when complete (a length mismatch is an error).

    Raises:
        OSError: the download failed (the message names the URL); ``dest`` is left absent.
    """
    dest = Path(dest)
    if dest.is_file():
        return dest
    opener = opener or _urlopen
    logger.info("downloading %s → %s", url, dest)
    try:
        with opener(url) as response, atomic_path(dest) as tmp:
            total = int(response.headers.get("Content-Length", 0) or 0) if hasattr(response, "headers") else 0
            written = 0
            with (
                open(tmp, "wb") as fh,
                tqdm(total=total or None, unit="B", unit_scale=True, desc=dest.name, disable=not progress) as bar,
            ):
                while True:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    fh.write(chunk)
                    written += len(chunk)
                    bar.update(len(chunk))
            if total and written != total:
                raise OSError(f"download of {url} stopped at {written} of {total} bytes")
    except OSError as exc:
        raise OSError(
            f"could not download {url}: {exc} (no network? fetch it elsewhere and put it at {dest}, "
            "or pass local model files)"
        ) from exc
    return dest


def save_pretrained(
    model: BiLM,
    out_dir: str | os.PathLike,
    *,
    vocab_lines: list[str] | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ ``vocab.txt``) into ``out_dir``, each atomically.

    ``extra_tensors`` (e.g. an LM softmax under ``softmax.*``) are stored beside the biLM tensors. A stored start state
    (:attr:`BiLM.start_state`, non-zero) is written as ``start_state.c`` (2, L, 1, H) and ``start_state.h``
    (2, L, 1, P), with its description under the metadata key ``start_state``; without one the file holds neither and
    the model starts from zeros when loaded.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if getattr(model, "char_vocab", None) is not None:
        model.char_vocab.save(out_dir / CHARS_NAME)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for k, v in (extra_tensors or {}).items():
        tensors[k] = v.detach().cpu().contiguous()
    metadata = {"format": "elmokit", "version": str(FORMAT_VERSION)}
    start = getattr(model, "start_state", None)
    if start is not None:
        tensors[START_C], tensors[START_H] = (t.detach().cpu().float().contiguous() for t in start)
        metadata["start_state"] = getattr(model, "start_state_source", None) or "stored"
    with atomic_path(out_dir / WEIGHTS_NAME, suffix=".safetensors") as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
        _sort_metadata(tmp)
    if vocab_lines is not None:
        atomic_write_text(out_dir / "vocab.txt", "".join(line + "\n" for line in vocab_lines))
    model.config.to_json_file(out_dir / CONFIG_NAME)
    return out_dir


_METADATA = re.compile(rb'"__metadata__":\{[^{}]*\}')


def _sort_metadata(path: Path) -> None:
    """Rewrite a safetensors file's ``__metadata__`` with its keys sorted, in place (same bytes otherwise).

    safetensors writes the metadata map in a random order per call (a Rust ``HashMap``), so two saves of the same
    tensors differed in their header bytes and their sha256 (seen in two identical zoo builds); sorted, a model file
    is a pure function of its tensors, and a rebuild's checksum repeats."""
    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = fh.read(n)
        match = _METADATA.search(header)
        if match is None:
            return
        meta = json.loads(match.group()[len(b'"__metadata__":') :])
        sorted_bytes = b'"__metadata__":' + json.dumps(
            dict(sorted(meta.items())), separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
        if len(sorted_bytes) != len(match.group()) or sorted_bytes == match.group():
            return  # another layout than safetensors' compact one: leave the file as written
        fh.seek(8 + match.start())
        fh.write(sorted_bytes)


def load_native(path: str | os.PathLike, *, stateful: bool = False, **bilm_kwargs) -> BiLM:
    """Load a native-format directory. Extra tensors (``softmax.*``) are ignored here. A character-vocabulary model's
    ``chars.txt`` (one converted from ELMoForManyLangs: its ``char.dic`` + ``word.dic``) is attached as
    ``model.char_vocab``. A stored start state (``start_state.c`` / ``.h``, see
    :func:`save_pretrained`) becomes :attr:`BiLM.start_state`; files without one (every file written before it
    existed) give a model that starts from zeros.

    Raises:
        MissingFileError: ``config.json`` or ``model.safetensors`` missing (or ``chars.txt`` for a
            character-vocabulary model), naming the file.
        ConfigError: an invalid ``config.json``.
        WeightsError: an unreadable safetensors file, a tensor missing or of the wrong shape (named, with both shapes).
    """
    path = Path(path)
    if not path.is_dir():
        raise MissingFileError(
            f"model folder {path}: " + ("is a file, not a folder" if path.exists() else "no such folder")
        )
    if not (path / CONFIG_NAME).is_file():
        raise MissingFileError(
            f"{path / CONFIG_NAME} not found: a native model folder holds {CONFIG_NAME} and {WEIGHTS_NAME}"
        )
    config = ElmoConfig.from_json_file(path / CONFIG_NAME)
    weights = path / WEIGHTS_NAME
    if not weights.is_file():
        raise MissingFileError(f"{weights} not found: a native model folder holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        tensors = load_file(str(weights))
    except Exception as exc:  # safetensors raises its own error type for truncated or foreign files
        raise WeightsError(f"{weights} is not a readable safetensors file ({exc}): re-save or re-download it") from None
    model = BiLM(config, **bilm_kwargs)
    load_state_checked(
        model, {k: v for k, v in tensors.items() if not k.startswith(("softmax.", "start_state."))}, str(weights)
    )
    if START_C in tensors or START_H in tensors:
        if not (START_C in tensors and START_H in tensors):
            raise WeightsError(f"{weights} holds only one of {START_C} and {START_H}: a start state needs both")
        with safe_open(str(weights), framework="pt") as fh:
            source = (fh.metadata() or {}).get("start_state")
        try:
            model.set_start_state((tensors[START_C], tensors[START_H]), source=source)
        except InputError as exc:
            raise WeightsError(f"{weights}: its start state does not fit the model ({exc})") from None
    if config.char_cnn.word_embedding_dim is not None:  # converted from ELMoForManyLangs: its two .dic files
        cc = config.char_cnn
        model.char_vocab = EfmlVocabulary.from_folder(
            path, cc.char_vocab_size - 1, cc.n_words, cc.max_characters_per_token, str(weights)
        )
    elif config.char_cnn.char_vocab_size is not None:
        chars = path / CHARS_NAME
        if not chars.is_file():
            raise MissingFileError(
                f"{chars} not found: the config says this model reads a character vocabulary of "
                f"{config.char_cnn.char_vocab_size} ids, and its ids come from that file"
            )
        model.char_vocab = CharVocabulary.from_file(chars, config.char_cnn.max_characters_per_token)
        if model.char_vocab.vocab_size != config.char_cnn.char_vocab_size:
            raise WeightsError(
                f"{chars} gives {model.char_vocab.vocab_size} character ids but config.json says "
                f"char_vocab_size={config.char_cnn.char_vocab_size}"
            )
    return StatefulBiLM(model) if stateful else model


def _original_pair(directory: Path) -> tuple[Path, Path]:
    """The one ``*options*.json`` and the one weight HDF5 of an original-format folder. When several ``*.hdf5``
    lie there, ``model.hdf5`` is taken (the NLPL repository's name, simple_elmo's first choice), else the one named
    ``*weights*`` (AllenNLP folders also hold embedding dumps).

    Raises:
        MissingFileError: no unique pair, naming the folder, what a model folder holds and what was found.
    """
    options = sorted(directory.glob("*options*.json"))
    weights = sorted(directory.glob("*.hdf5"))
    if len(weights) > 1:
        named = [w for w in weights if w.name == "model.hdf5"]
        weights = named or [w for w in weights if "weights" in w.name]
    if len(options) == 1 and len(weights) == 1:
        return options[0], weights[0]
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir())
    found = (
        (", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else ""))
        if names
        else "nothing (an empty folder)"
    )
    raise MissingFileError(
        f"{directory} is not a model folder: a model folder holds {CONFIG_NAME} + {WEIGHTS_NAME} (native) or exactly "
        f"one *options*.json and one weight *.hdf5 (original); found {found}. Pass the files explicitly, e.g. "
        "`elmokit convert OPTIONS WEIGHTS OUT_DIR`, then use OUT_DIR"
    )


def load_pretrained_bilm(name_or_path: str | os.PathLike, *, opener: Callable | None = None, **bilm_kwargs) -> BiLM:
    """Resolve a released name, a zoo name (:data:`ZOO_MODELS`), a Hugging Face Hub name (``org/name[@revision]``,
    :mod:`elmokit.weights.hub`), a native directory, an original-format directory, or a zip archive of one (the NLPL
    repository's, :mod:`elmokit.weights.archive`) to a :class:`BiLM`.

    Raises:
        WeightsError: a damaged, unsafe or model-less zip, or a TensorFlow-checkpoint zip (one line naming it).
        UsageError: a path that is a file other than a zip (says what to pass instead: the options + weights pair goes
            to ``load_original`` / ``Embedder(options_file, weight_file)``), or a name that is neither a folder nor a
            released or zoo model (lists the known names).
        UsageTypeError: (also a ``TypeError``) not a str / path.
        MissingFileError: a folder that is not a model (names it, says what a model folder holds and what was
            found), a path-like name that does not exist, or a zoo model that is not built yet (says to run
            ``elmokit zoo build LANG``).
        ConfigError / WeightsError: as the loaders.
    """
    from elmokit.weights.original import load_original  # lazy: CLI start-up (it imports h5py)

    if not isinstance(name_or_path, (str, os.PathLike)):
        raise UsageTypeError(
            f"model must be a folder path, a released model name or a zoo model name "
            f"{known_model_names()}, got {type(name_or_path).__name__}"
        )
    resolved = resolve_model_name(name_or_path)
    if resolved is not name_or_path:  # a zoo model (its native folder) or a Hub model (its snapshot, any format)
        return load_pretrained_bilm(resolved, opener=opener, **bilm_kwargs)
    path = Path(name_or_path)
    if is_efml_folder(path):  # before the native check: EFML folders hold a config.json too
        return load_efml(path, **bilm_kwargs)
    if path.is_dir():
        if (path / CONFIG_NAME).is_file():
            return load_native(path, **bilm_kwargs)
        return load_original(*_original_pair(path), **bilm_kwargs)
    if path.is_file() and is_model_archive(path):  # a zip (NLPL's): its folder, by the same dispatch
        return load_model_archive(path, lambda folder: load_pretrained_bilm(folder, **bilm_kwargs))
    if path.is_file():
        if path.suffix.lower() in (".hdf5", ".h5"):
            hint = "pass its options.json too: load_original(options_file, weight_file) (or its folder)"
        elif path.suffix.lower() == ".json":
            hint = "pass its HDF5 weight file too: load_original(options_file, weight_file) (or its folder)"
        elif path.name == WEIGHTS_NAME:
            hint = f"pass the folder that holds it (with {CONFIG_NAME})"
        else:
            hint = f"pass a model folder ({CONFIG_NAME} + {WEIGHTS_NAME}, or *options*.json + *.hdf5) or a zip of one"
        raise UsageError(f"model {path} is a file, but a model is a folder, a zip or a released name: {hint}")
    key = str(name_or_path).lower()
    if key not in RELEASED:
        text = os.fspath(name_or_path)
        if os.sep in text or (os.altsep and os.altsep in text) or text.startswith((".", "~")):
            raise MissingFileError(
                f"model folder {text}: no such folder (and not a released or zoo model name: "
                f"{', '.join(known_model_names())})"
            )
        raise UsageError(
            f"unknown model {text!r}: not a folder here, and not a released or zoo model name "
            f"({', '.join(known_model_names())})"
        )
    options_url, weights_url = RELEASED[key]
    folder = cache_dir() / key
    options = download(options_url, folder / "options.json", opener=opener)
    weights = download(weights_url, folder / "weights.hdf5", opener=opener)
    return load_original(options, weights, **bilm_kwargs)


def read_config_json(path: str | os.PathLike) -> dict:
    """Parse a JSON file (helper for the CLI). Raises :class:`MissingFileError` / :class:`ConfigError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not UTF-8 JSON: {exc}") from None
