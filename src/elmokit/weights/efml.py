"""ELMoForManyLangs (EFML, HIT-SCIR) model folders → :class:`~elmokit.modules.bilm.BiLM`.

A released EFML folder holds:

* ``config.json``: the trainer's options; only ``config_path`` is read (the architecture file). It is an absolute path
  on the author's machine in the released models, so, as EFML's loader (``Embedder.get_model``) does, the path is
  tried, then a file of that base name in the model folder, then the configuration EFML ships under that name
  (:data:`SHIPPED_ARCHITECTURES`); which one was used is logged (a warning for a fallback) and recorded in the
  model's ``config.extra["efml"]`` (``elmokit info`` shows it).
* the architecture JSON (``encoder``: ``elmo``, ``projection_dim``, ``dim``, ``n_layers``, ``cell_clip``,
  ``proj_clip``; ``token_embedder``: ``cnn``, ``filters``, ``n_highway``, ``word_dim``, ``char_dim``,
  ``max_characters_per_token``, ``activation``): sizes are cross-checked against the tensors; the clips, the
  activation and ``max_characters_per_token`` come from it;
* ``char.dic``, ``word.dic``: :mod:`elmokit.weights.efml_vocab`;
* ``token_embedder.pkl``, ``encoder.pkl``: ``torch.save``'d state dicts, read **only** with
  ``torch.load(path, map_location="cpu", weights_only=True)``: a file that needs more (a pickle with code or globals)
  is refused, never run. Sizes come from these tensors' shapes.

The mapping (:func:`efml_state`), every tensor named:

* ``word_emb_layer.embedding.weight`` (V, Dw) → ``token_encoder.word_embedding.weight``; the token vector is the
  projection of [word embedding; highway output] (``ConvTokenEmbedder``);
* ``char_emb_layer.embedding.weight`` (Nc, Dc) → ``token_encoder.char_cnn.char_embedding`` (id k + 1 = EFML id k; its
  ``<pad>`` row is a learned, non-zero row, and the CNN runs over in-word padding as EFML's does);
* ``convolutions.i.{weight,bias}`` → ``char_cnn.convolutions.i`` (both ``Conv1d``, same layout);
* ``highways._layers.k.{weight,bias}`` (2F, F): rows 0…F−1 the transform A, rows F…2F−1 the gate B, with
  ``y = σ(Bx)·x + (1 − σ(Bx))·relu(Ax)`` (AllenNLP's highway). elmokit's highway is ``y = t·relu(Ax) + (1 − t)·x`` with
  ``t = σ(G x)``, and 1 − σ(z) = σ(−z): ``transforms.k`` = A, ``gates.k`` = −B (weight and bias negated);
* ``projection.{weight,bias}`` (P, Dw + F) → ``token_encoder.projection``;
* ``{forward,backward}_layer_k``: ``input_linearity.weight`` (4H, I), ``state_linearity.{weight (4H, P), bias}``,
  ``state_projection.weight`` (P, H), gates in the order i, f, g, o and no forget bias added at run time
  (``LstmCellWithProjection``). elmokit's cell stores x·W layouts with gates i, j(= g), f, o and adds 1.0 to the forget
  gate at run time: ``bilstm.weight_ih.k[d]`` = reordered Wᵀ, ``weight_hh.k[d]`` likewise, ``bias.k[d]`` = reordered
  bias with 1.0 taken off the forget slice, ``weight_proj.k[d]`` = Wᵀ; d = 0 forward, 1 backward. Skip connections
  from layer 1 on (``ElmobiLm``), cell and projection clips from the architecture (0 = off, as its ``if clip:``).

Layer 0 is the token vector written twice, [t; t], as elmokit's BiLM gives it (``frontend.Model.forward``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from pathlib import Path

import torch

from elmokit.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmokit.errors import ConfigError, MissingFileError, UsageError, WeightsError
from elmokit.modules.bilm import BiLM, StatefulBiLM
from elmokit.weights import load_state_checked
from elmokit.weights.efml_vocab import CHAR_DIC, WORD_DIC, EfmlVocabulary

__all__ = [
    "load_efml",
    "is_efml_folder",
    "check_has_lm_head",
    "read_architecture",
    "efml_state",
    "SHIPPED_ARCHITECTURES",
    "FORMAT_NAME",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "ELMoForManyLangs"
TOKEN_EMBEDDER, ENCODER, OPTIONS = "token_embedder.pkl", "encoder.pkl", "config.json"
#: the files that mark a folder as EFML's (any one of them sends it to :func:`load_efml`)
MARKERS = (CHAR_DIC, WORD_DIC, ENCODER, TOKEN_EMBEDDER)

_RELEASED_ARCHITECTURE = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
}
#: The architecture files EFML 0.0.4.post2 ships in ``elmoformanylangs/configs`` (both names hold the same values),
#: used when a folder's ``config_path`` is found neither as given nor in the folder (e.g. the released English model).
SHIPPED_ARCHITECTURES = {
    "cnn_50_100_512_4096_sample.json": _RELEASED_ARCHITECTURE,
    "cnn_0_100_512_4096_sample.json": _RELEASED_ARCHITECTURE,
}


def is_efml_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding any of EFML's files (``char.dic``, ``word.dic``, ``encoder.pkl``,
    ``token_embedder.pkl``) and no ``model.safetensors`` (a native folder converted from EFML keeps the two ``.dic``
    files beside its weights)."""
    path = Path(path)
    if not path.is_dir() or (path / "model.safetensors").is_file():
        return False
    return any((path / name).is_file() for name in MARKERS)


def check_has_lm_head(path: str | os.PathLike) -> None:
    """Raise :class:`UsageError` (one line) when ``path`` is an EFML folder: its released models carry no softmax (no
    LM head: EFML's trainer saves ``classifier.pkl`` only on request, and no release has one), so they give no
    perplexity or scores."""
    if is_efml_folder(path):
        raise UsageError(
            f"{path} is an {FORMAT_NAME} model: the released EFML models carry no softmax (no LM head), so they give "
            "no perplexity or scores; they embed (`elmokit embed`, Embedder, elmokit.compat.efml)"
        )


def read_architecture(folder: str | os.PathLike) -> tuple[dict, str]:
    """The architecture of an EFML folder and a line saying which file gave it (see the module docstring).

    Raises:
        MissingFileError: no ``config.json``, or its ``config_path`` found nowhere (names what was tried).
        ConfigError: ``config.json`` or the architecture file is not a JSON object, or has no ``config_path``.
    """
    folder = Path(folder)
    options = _read_json(folder / OPTIONS)
    given = options.get("config_path")
    if not isinstance(given, str) or not given:
        what = "no config_path" if given is None else f"config_path is {given!r}, not a path"
        raise ConfigError(f"{folder / OPTIONS}: {what} (the architecture file's path, as EFML's trainer writes)")
    as_given = folder / given  # an absolute path stays itself
    base = re.split(r"[\\/]", given)[-1]
    if as_given.is_file():
        return _read_json(as_given), f"{as_given} (config.json's config_path)"
    local = folder / base
    if local.is_file():
        logger.warning("%s: config_path %s is not there; using %s (as EFML does)", folder / OPTIONS, given, local)
        return _read_json(local), f"{local} (config.json's config_path {given} is not there)"
    if base in SHIPPED_ARCHITECTURES:
        logger.warning("%s: config_path %s is not there; using EFML's shipped %s", folder / OPTIONS, given, base)
        return json.loads(json.dumps(SHIPPED_ARCHITECTURES[base])), f"EFML's shipped {base} (config_path {given})"
    raise MissingFileError(
        f"{folder / OPTIONS}: its config_path {given} was found neither there nor as {local}, and EFML ships no "
        f"configuration of that name ({', '.join(sorted(SHIPPED_ARCHITECTURES))}): put the architecture file there"
    )


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise MissingFileError(f"{path} not found: an ELMoForManyLangs model folder holds {OPTIONS}")
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not UTF-8 JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_pkl(path: Path) -> dict[str, torch.Tensor]:
    """A ``torch.save``'d state dict, read with ``weights_only=True`` only.

    Raises:
        MissingFileError: no such file. WeightsError: a pickle that needs more than tensors (refused, not run), a
            truncated or foreign file, or not a {name: tensor} dict.
    """
    if not path.is_file():
        raise MissingFileError(
            f"{path} not found: an ELMoForManyLangs model folder holds {TOKEN_EMBEDDER} and {ENCODER}"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise WeightsError(
            f"{path} needs more than tensors to load (a pickle with code or globals: {reason[:160]}); refused: "
            "only plain state dicts are read (torch.load weights_only=True)"
        ) from None
    except Exception as exc:  # torch raises RuntimeError / EOFError / zipfile errors for truncated or foreign files
        raise WeightsError(
            f"{path} is not a readable torch file (truncated or damaged? {type(exc).__name__})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path} holds a {type(state).__name__}, not a state dict of tensors")
    return {str(k): v.float() for k, v in state.items()}


def _count(state: dict[str, torch.Tensor], pattern: str) -> int:
    regex = re.compile(pattern)
    return len({m.group(1) for k in state if (m := regex.fullmatch(k))})


def _shape(state: dict[str, torch.Tensor], name: str, path: Path) -> tuple[int, ...]:
    if name not in state:
        raise WeightsError(f"{path}: no tensor {name!r}; an ELMoForManyLangs cnn + elmo model has it")
    return tuple(state[name].shape)


# long: one size check per architecture key, in one place
def _config_from_tensors(arch: dict, arch_source: str, tok: dict, enc: dict, folder: Path) -> ElmoConfig:
    """The elmokit config: sizes from the tensors, checked against the architecture; clips, activation and
    ``max_characters_per_token`` from it.

    Raises:
        ConfigError: an architecture elmokit cannot read (not cnn + elmo, no word or no char part).
        WeightsError: a size of the architecture that disagrees with a tensor (names both)."""
    te, en = arch.get("token_embedder"), arch.get("encoder")
    if not isinstance(te, dict) or not isinstance(en, dict):
        raise ConfigError(f"{arch_source}: expected 'token_embedder' and 'encoder' sections")
    if str(te.get("name", "")).lower() != "cnn" or str(en.get("name", "")).lower() != "elmo":
        raise ConfigError(
            f"{arch_source}: token_embedder {te.get('name')!r} + encoder {en.get('name')!r}; elmokit reads the "
            "released kind, cnn + elmo"
        )
    tpath, epath = folder / TOKEN_EMBEDDER, folder / ENCODER
    n_words, word_dim = _shape(tok, "word_emb_layer.embedding.weight", tpath)
    n_chars, char_dim = _shape(tok, "char_emb_layer.embedding.weight", tpath)
    filters = []
    for i in range(_count(tok, r"convolutions\.(\d+)\.weight")):
        n, _, w = _shape(tok, f"convolutions.{i}.weight", tpath)
        filters.append((w, n))
    n_highway = _count(tok, r"highways\._layers\.(\d+)\.weight")
    p, _ = _shape(tok, "projection.weight", tpath)
    four_h, _ = _shape(enc, "forward_layer_0.input_linearity.weight", epath)
    n_layers = _count(enc, r"forward_layer_(\d+)\.input_linearity\.weight")
    found = {
        ("token_embedder", "word_dim"): (word_dim, "word_emb_layer.embedding.weight", tpath),
        ("token_embedder", "char_dim"): (char_dim, "char_emb_layer.embedding.weight", tpath),
        ("token_embedder", "filters"): ([list(f) for f in filters], "convolutions.*.weight", tpath),
        ("token_embedder", "n_highway"): (n_highway, "highways._layers.*", tpath),
        ("encoder", "projection_dim"): (p, "projection.weight", tpath),
        ("encoder", "dim"): (four_h // 4, "forward_layer_0.input_linearity.weight", epath),
        ("encoder", "n_layers"): (n_layers, "forward_layer_*", epath),
    }
    for (section, key), (value, tensor, path) in found.items():
        given = arch[section].get(key)
        if given is not None and given != value:
            raise WeightsError(
                f"{arch_source}: {section}.{key} is {given}, but {path.name} {tensor} gives {value}: the architecture "
                "file does not describe these weights"
            )
    max_chars = te.get("max_characters_per_token", 50)
    clips = {k: (float(en[k]) if en.get(k) else None) for k in ("cell_clip", "proj_clip")}
    config = ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=filters,
            n_highway=n_highway,
            embedding_dim=char_dim,
            n_characters=n_chars + 1,
            max_characters_per_token=max_chars,
            activation=str(te.get("activation", "relu")),
            char_vocab_size=n_chars + 1,
            word_embedding_dim=word_dim,
            n_words=n_words,
        ),
        lstm=LSTMConfig(dim=four_h // 4, projection_dim=p, n_layers=n_layers, use_skip_connections=True, **clips),
        extra={"efml": {"format": FORMAT_NAME, "architecture": arch_source}},
    )
    return config.validate(arch_source)


def _gates_ijfo(w: torch.Tensor, h: int) -> torch.Tensor:
    """EFML's gate blocks i, f, g, o (dim 0, H each) → elmokit's i, j(= g), f, o."""
    i, f, g, o = w.split(h, dim=0)
    return torch.cat([i, g, f, o], dim=0)


def efml_state(tok: dict[str, torch.Tensor], enc: dict[str, torch.Tensor], config: ElmoConfig) -> dict:
    """EFML's two state dicts → an elmokit :class:`BiLM` state dict (the mapping of the module docstring)."""
    f, h = config.char_cnn.n_filters, config.lstm.dim
    state = {
        "token_encoder.word_embedding.weight": tok["word_emb_layer.embedding.weight"],
        "token_encoder.char_cnn.char_embedding": tok["char_emb_layer.embedding.weight"],
        "token_encoder.projection.weight": tok["projection.weight"],
        "token_encoder.projection.bias": tok["projection.bias"],
    }
    for i in range(len(config.char_cnn.filters)):
        for part in ("weight", "bias"):
            state[f"token_encoder.char_cnn.convolutions.{i}.{part}"] = tok[f"convolutions.{i}.{part}"]
    for k in range(config.char_cnn.n_highway):
        w, b = tok[f"highways._layers.{k}.weight"], tok[f"highways._layers.{k}.bias"]
        state[f"token_encoder.highway.transforms.{k}.weight"], state[f"token_encoder.highway.transforms.{k}.bias"] = (
            w[:f],
            b[:f],
        )
        # 1 − σ(Bx + b) = σ(−Bx − b): EFML's carry gate, negated, is elmokit's transform gate
        state[f"token_encoder.highway.gates.{k}.weight"], state[f"token_encoder.highway.gates.{k}.bias"] = (
            -w[f:],
            -b[f:],
        )
    forget = torch.zeros(4 * h)
    forget[2 * h : 3 * h] = 1.0  # elmokit adds 1.0 to the forget gate (slice 2 of i, j, f, o) at run time
    for k in range(config.lstm.n_layers):
        per_dir: dict[str, list[torch.Tensor]] = {"weight_ih": [], "weight_hh": [], "bias": [], "weight_proj": []}
        for direction in ("forward", "backward"):
            pre = f"{direction}_layer_{k}."
            per_dir["weight_ih"].append(_gates_ijfo(enc[pre + "input_linearity.weight"], h).t())
            per_dir["weight_hh"].append(_gates_ijfo(enc[pre + "state_linearity.weight"], h).t())
            per_dir["bias"].append(_gates_ijfo(enc[pre + "state_linearity.bias"], h) - forget)
            per_dir["weight_proj"].append(enc[pre + "state_projection.weight"].t())
        for name, pair in per_dir.items():
            state[f"bilstm.{name}.{k}"] = torch.stack(pair).contiguous()
    return {k: v.contiguous() for k, v in state.items()}


def load_efml(folder: str | os.PathLike, *, stateful: bool = False, **bilm_kwargs) -> BiLM:
    """Load an ELMoForManyLangs model folder as a :class:`BiLM` (``stateful=True``: wrapped in
    :class:`~elmokit.modules.bilm.StatefulBiLM`, EFML's carried state); its :class:`EfmlVocabulary` is attached as
    ``bilm.char_vocab`` (``batch_to_ids(sentences, char_vocab=bilm.char_vocab)``; ``Embedder``/``Elmo`` use it).

    Raises:
        MissingFileError: ``config.json``, the architecture file, a ``.dic`` or a ``.pkl`` missing (named).
        ConfigError: an unreadable ``config.json`` / architecture, or one elmokit does not read (not cnn + elmo).
        WeightsError: a ``.pkl`` that is not a plain state dict (refused unread if it needs code), a tensor missing or
            of a shape that disagrees with another file, a ``.dic`` whose size disagrees with its tensor (both
            named), a bad ``.dic`` line. Every message is one line naming the file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(f"model folder {folder}: no such folder")
    for name in (OPTIONS, CHAR_DIC, WORD_DIC, TOKEN_EMBEDDER, ENCODER):  # a missing file is named before any reading
        if not (folder / name).is_file():
            raise MissingFileError(
                f"{folder / name} not found: an ELMoForManyLangs model folder holds {OPTIONS}, {CHAR_DIC}, "
                f"{WORD_DIC}, {TOKEN_EMBEDDER} and {ENCODER}"
            )
    arch, arch_source = read_architecture(folder)
    logger.info("%s: ELMoForManyLangs architecture from %s", folder, arch_source)
    tok, enc = _load_pkl(folder / TOKEN_EMBEDDER), _load_pkl(folder / ENCODER)
    config = _config_from_tensors(arch, arch_source, tok, enc, folder)
    vocab = EfmlVocabulary.from_folder(
        folder,
        config.char_cnn.char_vocab_size - 1,
        config.char_cnn.n_words,
        config.char_cnn.max_characters_per_token,
        str(folder / TOKEN_EMBEDDER),
    )
    model = BiLM(config, **bilm_kwargs)
    expected = set(model.state_dict())
    try:
        state = efml_state(tok, enc, config)
    except (KeyError, RuntimeError) as exc:
        raise WeightsError(f"{folder}: {TOKEN_EMBEDDER} / {ENCODER} lack or misshape a tensor ({exc})") from None
    load_state_checked(model, {k: v for k, v in state.items() if k in expected}, f"{folder} ({ENCODER})")
    _check_no_extra(tok, enc, config, folder)
    model.char_vocab = vocab
    return StatefulBiLM(model) if stateful else model


def _check_no_extra(tok: dict, enc: dict, config: ElmoConfig, folder: Path) -> None:
    """Refuse tensors the mapping did not use (a file of another architecture), naming the first."""
    used_tok = {"word_emb_layer.embedding.weight", "char_emb_layer.embedding.weight", "projection.weight"}
    used_tok |= {"projection.bias"}
    used_tok |= {f"convolutions.{i}.{p}" for i in range(len(config.char_cnn.filters)) for p in ("weight", "bias")}
    used_tok |= {f"highways._layers.{k}.{p}" for k in range(config.char_cnn.n_highway) for p in ("weight", "bias")}
    parts = ("input_linearity.weight", "state_linearity.weight", "state_linearity.bias", "state_projection.weight")
    used_enc = {
        f"{d}_layer_{k}.{p}" for d in ("forward", "backward") for k in range(config.lstm.n_layers) for p in parts
    }
    for names, used, path in ((tok, used_tok, TOKEN_EMBEDDER), (enc, used_enc, ENCODER)):
        extra = sorted(set(names) - used)
        if extra:
            raise WeightsError(
                f"{folder / path}: tensor {extra[0]!r} has no place in an ELMoForManyLangs cnn + elmo model"
            )
