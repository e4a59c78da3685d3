"""Model configuration: the biLM architecture, ``options.json`` reading/writing, and the released presets.

The configuration mirrors the original ``options.json`` of bilm-tf / AllenNLP (``lstm`` and ``char_cnn`` sections),
so that a file written by :meth:`ElmoConfig.to_options` is read by the original code and vice versa.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elmokit.checks import is_int
from elmokit.errors import ConfigError, MissingFileError
from elmokit.io import atomic_write_text

__all__ = [
    "CharCNNConfig",
    "LSTMConfig",
    "ElmoConfig",
    "elmo_small",
    "elmo_medium",
    "elmo_original",
    "elmo_original_5b",
    "elmo_tiny",
    "PRESETS",
    "read_options_json",
]

#: Filters of every released English ELMo model: (width, number of filters).
RELEASED_FILTERS: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))

_ACTIVATIONS = ("relu", "tanh")


@dataclass
class CharCNNConfig:
    """The character CNN token encoder (layer 0).

    Attributes:
        filters: ``(width, count)`` per convolution, in output-concatenation order.
        n_highway: number of highway layers after the convolutions.
        embedding_dim: character embedding size (16 in released models).
        n_characters: 262 (inference files: zero padding row + 261 stored rows) or 261 (training files); both
            describe the same 261 stored character rows.
        max_characters_per_token: C, the characters-per-token width of the id tensor (50 in the original).
        activation: ``"relu"`` or ``"tanh"``, applied after each convolution's max-pool.
        char_vocab_size: ``None`` for the original UTF-8 byte scheme; the size of a character vocabulary (including
            its specials) for the character-vocabulary mode (see :mod:`elmokit.characters`).
        word_embedding_dim, n_words: ``None`` (every model but ELMoForManyLangs'); for an ELMoForManyLangs model
            (:mod:`elmokit.weights.efml`), a learned word embedding of ``n_words`` rows × ``word_embedding_dim``,
            concatenated before the highway output as the projection's input. Its ids then carry the word id in one
            more column: (B, T, C + 1) (:attr:`id_width`). Written as ``"word_embedding": {"dim": D, "n_words": V}``.
    """

    filters: list[tuple[int, int]] = field(default_factory=lambda: [tuple(f) for f in RELEASED_FILTERS])
    n_highway: int = 2
    embedding_dim: int = 16
    n_characters: int = 262
    max_characters_per_token: int = 50
    activation: str = "relu"
    char_vocab_size: int | None = None
    word_embedding_dim: int | None = None
    n_words: int | None = None

    @property
    def id_width(self) -> int:
        """Width of a token's id row: C, or C + 1 (the word id last) with a word embedding."""
        return self.max_characters_per_token + (1 if self.word_embedding_dim is not None else 0)

    @property
    def n_filters(self) -> int:
        """Total number of convolution filters = width of the concatenated CNN output."""
        return sum(n for _, n in self.filters)

    @property
    def n_char_rows(self) -> int:
        """Number of *stored* (learned) character embedding rows, excluding the zero padding row."""
        if self.char_vocab_size is not None:
            return self.char_vocab_size - 1
        return 261

    def validate(self, source: str = "config") -> None:
        """Raise :class:`ConfigError` naming ``source``, the first inconsistent field, its value and what is
        expected."""
        filters = self.filters
        if not isinstance(filters, (list, tuple)) or not filters:
            raise ConfigError(
                f"{source}: char_cnn.filters={filters!r}; expected a non-empty list [[width, n_filters], ...]"
            )
        for i, f in enumerate(filters):
            if not isinstance(f, (list, tuple)) or len(f) != 2 or not all(is_int(v) and v >= 1 for v in f):
                raise ConfigError(
                    f"{source}: char_cnn.filters entry {i} is {_show(f)}; expected [width, n_filters] "
                    "with two integers >= 1, the whole list being [[width, n_filters], ...]"
                )
        _check_int(source, "char_cnn.n_highway", self.n_highway, 0)
        _check_int(source, "char_cnn.embedding.dim", self.embedding_dim, 1)
        _check_int(source, "char_cnn.n_characters", self.n_characters, 1)
        _check_int(source, "char_cnn.max_characters_per_token", self.max_characters_per_token, 3)
        widest = max(int(w) for w, _ in filters)
        if self.max_characters_per_token < widest:
            raise ConfigError(
                f"{source}: char_cnn.max_characters_per_token={self.max_characters_per_token} is smaller than the "
                f"widest filter ({widest}): every filter must fit in a token's character positions"
            )
        if self.activation not in _ACTIVATIONS:
            raise ConfigError(f"{source}: char_cnn.activation={self.activation!r}; expected one of {_ACTIVATIONS}")
        if self.char_vocab_size is None:
            if self.n_characters not in (261, 262):
                raise ConfigError(
                    f"{source}: char_cnn.n_characters={self.n_characters}; the UTF-8 byte scheme has 261 stored rows "
                    "(262 with the padding row): expected 261 or 262"
                )
        else:
            # 7 specials (padding, <S>, </S>, begin/end of word, in-word pad, unknown) + at least one character
            _check_int(source, "char_cnn.char_vocab_size", self.char_vocab_size, 8)
        if (self.word_embedding_dim is None) != (self.n_words is None):
            raise ConfigError(
                f"{source}: char_cnn.word_embedding needs both dim and n_words, got "
                f"dim={_show(self.word_embedding_dim)}, n_words={_show(self.n_words)}"
            )
        if self.word_embedding_dim is not None:
            _check_int(source, "char_cnn.word_embedding.dim", self.word_embedding_dim, 1)
            _check_int(source, "char_cnn.word_embedding.n_words", self.n_words, 1)
            if self.char_vocab_size is None:
                raise ConfigError(
                    f"{source}: char_cnn.word_embedding is set without char_cnn.char_vocab_size: a word embedding "
                    "belongs to ELMoForManyLangs models, whose characters come from a vocabulary (char.dic)"
                )


@dataclass
class LSTMConfig:
    """The biLSTM stacks (one forward, one backward, separate parameters).

    Attributes:
        dim: H, the LSTM cell size.
        projection_dim: P, the projected hidden size (= token vector size; output width is 2P).
        n_layers: L, layers per direction.
        cell_clip: clip the cell to ``±cell_clip`` (``None``/0 = off).
        proj_clip: clip the projected hidden state to ``±proj_clip`` (``None``/0 = off).
        use_skip_connections: residual connections for layers >= 1 (never the first).
    """

    dim: int = 4096
    projection_dim: int = 512
    n_layers: int = 2
    cell_clip: float | None = 3.0
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True

    def validate(self, source: str = "config") -> None:
        """Raise :class:`ConfigError` naming ``source``, the first inconsistent field, its value and what is
        expected."""
        for name in ("dim", "projection_dim", "n_layers"):
            _check_int(source, f"lstm.{name}", getattr(self, name), 1)
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or not value >= 0 or value == float("inf")):
                raise ConfigError(
                    f"{source}: lstm.{name}={_show(value)}; expected null (no clipping) or a finite number >= 0"
                )
        if not isinstance(self.use_skip_connections, bool):
            raise ConfigError(
                f"{source}: lstm.use_skip_connections={_show(self.use_skip_connections)}; expected a "
                'JSON boolean, true or false (a string such as "false" would read as true)'
            )


@dataclass
class ElmoConfig:
    """Full biLM configuration: ``char_cnn`` + ``lstm`` (+ free-form ``extra`` keys from options.json).

    ``extra`` keeps the training keys of bilm-tf options files (``n_tokens_vocab``, ``unroll_steps``, ...) so that a
    read-then-write round trip preserves them.
    """

    char_cnn: CharCNNConfig = field(default_factory=CharCNNConfig)
    lstm: LSTMConfig = field(default_factory=LSTMConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def output_dim(self) -> int:
        """Width of every layer representation: 2P."""
        return 2 * self.lstm.projection_dim

    @property
    def num_layers(self) -> int:
        """Number of layer representations: L + 1 (layer 0 = token vector duplicated)."""
        return self.lstm.n_layers + 1

    def validate(self, source: str = "config") -> ElmoConfig:
        """Check every field; return ``self``. Raises :class:`ConfigError` naming ``source`` (a file name, or
        ``"config"``), the field and the value."""
        self.char_cnn.validate(source)
        self.lstm.validate(source)
        return self

    # ------------------------------------------------------------------ options.json
    @classmethod
    def from_options(cls, options: dict[str, Any], source: str = "options") -> ElmoConfig:
        """Build from a parsed original ``options.json`` dict.

        Types are checked as JSON gives them, before anything is converted: counts must be JSON integers, clips
        numbers or null, ``use_skip_connections`` a JSON boolean (the string ``"false"`` is refused rather than read
        as true), ``filters`` a list ``[[width, n_filters], ...]``.

        Raises:
            ConfigError: a required key is missing or a value has the wrong type or range (the message names
                ``source`` — the file —, the key, the value and the expected form).
        """
        if not isinstance(options, dict):
            raise ConfigError(
                f"{source}: options must be a JSON object with 'char_cnn' and 'lstm' sections, got "
                f"{type(options).__name__}"
            )
        for section in ("char_cnn", "lstm"):
            if section not in options:
                raise ConfigError(
                    f"{source}: no {section!r} section: only character-input models (char_cnn + lstm) are supported"
                )
            if not isinstance(options[section], dict):
                raise ConfigError(f"{source}: {section!r} is {_show(options[section])}; expected a JSON object")
        cc, ls = options["char_cnn"], options["lstm"]

        def req(section: dict, prefix: str, key: str) -> Any:
            if key not in section:
                raise ConfigError(f"{source}: missing required key {prefix}.{key}")
            return section[key]

        embedding = req(cc, "char_cnn", "embedding")
        if not isinstance(embedding, dict) or "dim" not in embedding:
            raise ConfigError(f'{source}: char_cnn.embedding is {_show(embedding)}; expected an object {{"dim": N}}')
        filters = req(cc, "char_cnn", "filters")
        words = cc.get("word_embedding", {})
        if not isinstance(words, dict):
            raise ConfigError(
                f'{source}: char_cnn.word_embedding is {_show(words)}; expected an object {{"dim": D, "n_words": V}}'
            )
        char_cnn = CharCNNConfig(
            filters=filters,
            n_highway=req(cc, "char_cnn", "n_highway"),
            embedding_dim=embedding["dim"],
            n_characters=cc.get("n_characters", 262),
            max_characters_per_token=cc.get("max_characters_per_token", 50),
            activation=cc.get("activation", "relu"),
            char_vocab_size=cc.get("char_vocab_size"),
            word_embedding_dim=words.get("dim"),
            n_words=words.get("n_words"),
        )
        lstm = LSTMConfig(
            dim=req(ls, "lstm", "dim"),
            projection_dim=ls.get("projection_dim", ls.get("dim")),
            n_layers=req(ls, "lstm", "n_layers"),
            cell_clip=ls.get("cell_clip"),
            proj_clip=ls.get("proj_clip"),
            use_skip_connections=ls.get("use_skip_connections", False),
        )
        config = cls(
            char_cnn=char_cnn, lstm=lstm, extra={k: v for k, v in options.items() if k not in ("char_cnn", "lstm")}
        )
        config.validate(source)
        # normalise the checked JSON values to the dataclasses' types
        char_cnn.filters = [(int(w), int(n)) for w, n in filters]
        for name in ("cell_clip", "proj_clip"):
            value = getattr(lstm, name)
            setattr(lstm, name, None if value is None else float(value))
        return config

    def to_options(self) -> dict[str, Any]:
        """The original ``options.json`` dict (readable by bilm-tf and AllenNLP)."""
        cc = self.char_cnn
        char_cnn: dict[str, Any] = {
            "embedding": {"dim": cc.embedding_dim},
            "filters": [[int(w), int(n)] for w, n in cc.filters],
            "n_highway": cc.n_highway,
            "n_characters": cc.n_characters,
            "max_characters_per_token": cc.max_characters_per_token,
            "activation": cc.activation,
        }
        if cc.char_vocab_size is not None:
            char_cnn["char_vocab_size"] = cc.char_vocab_size
        if cc.word_embedding_dim is not None:
            char_cnn["word_embedding"] = {"dim": cc.word_embedding_dim, "n_words": cc.n_words}
        ls = self.lstm
        lstm = {
            "dim": ls.dim,
            "projection_dim": ls.projection_dim,
            "n_layers": ls.n_layers,
            "cell_clip": ls.cell_clip,
            "proj_clip": ls.proj_clip,
            "use_skip_connections": ls.use_skip_connections,
        }
        return {"lstm": lstm, "char_cnn": char_cnn, **self.extra}

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> ElmoConfig:
        """Read an ``options.json`` (or elmokit ``config.json``, same schema).

        Raises:
            MissingFileError: no such file, or a folder.
            ConfigError: not UTF-8 JSON (e.g. an HDF5 weight file passed as the options), or an invalid value (the
                message names the file and key, see :meth:`from_options`).
        """
        path = Path(path)
        if path.is_dir():
            raise MissingFileError(
                f"options file {path} is a folder; expected an options.json file (a model folder "
                "is read by load_pretrained_bilm / Elmo.from_pretrained)"
            )
        if not path.is_file():
            raise MissingFileError(f"options file not found: {path}")
        options = read_options_json(path)
        return cls.from_options(options, source=str(path))

    def to_json_file(self, path: str | os.PathLike) -> None:
        """Write ``to_options()`` as JSON atomically."""
        atomic_write_text(path, json.dumps(self.to_options(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (dataclass fields)."""
        return asdict(self)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, bool, type(None), list, dict, int, float)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_int(source: str, key: str, value: Any, minimum: int) -> None:
    if not is_int(value):
        raise ConfigError(f"{source}: {key}={_show(value)}; expected a JSON integer >= {minimum}")
    if value < minimum:
        raise ConfigError(f"{source}: {key}={value}; expected an integer >= {minimum}")


def _released(dim: int, projection_dim: int, n_highway: int) -> ElmoConfig:
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[tuple(f) for f in RELEASED_FILTERS],
            n_highway=n_highway,
            embedding_dim=16,
            n_characters=262,
            max_characters_per_token=50,
            activation="relu",
        ),
        lstm=LSTMConfig(
            dim=dim, projection_dim=projection_dim, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True
        ),
    )


def elmo_small() -> ElmoConfig:
    """Released "small" model: LSTM 1024 / projection 128, 1 highway, output 256 (13,593,296 parameters)."""
    return _released(1024, 128, 1)


def elmo_medium() -> ElmoConfig:
    """Released "medium" model: LSTM 2048 / projection 256, 1 highway, output 512 (28,027,728 parameters)."""
    return _released(2048, 256, 1)


def elmo_original() -> ElmoConfig:
    """Released "original" model: LSTM 4096 / projection 512, 2 highway, output 1024 (93,600,848 parameters)."""
    return _released(4096, 512, 2)


def elmo_original_5b() -> ElmoConfig:
    """Released "original (5.5B)" model: same architecture as :func:`elmo_original`, trained on 5.5B tokens."""
    return _released(4096, 512, 2)


def elmo_tiny(use_skip_connections: bool = True) -> ElmoConfig:
    """The tiny architecture of the reference fixtures: filters (1,4)…(5,64), char dim 4, 2 highway, cell 64,
    proj 16."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 4), (2, 8), (3, 16), (4, 32), (5, 64)],
            n_highway=2,
            embedding_dim=4,
            n_characters=262,
            max_characters_per_token=50,
            activation="relu",
        ),
        lstm=LSTMConfig(
            dim=64,
            projection_dim=16,
            n_layers=2,
            cell_clip=3.0,
            proj_clip=3.0,
            use_skip_connections=use_skip_connections,
        ),
    )


#: Preset name → configuration function.
PRESETS = {
    "small": elmo_small,
    "medium": elmo_medium,
    "original": elmo_original,
    "original-5.5b": elmo_original_5b,
    "tiny": elmo_tiny,
}


def read_options_json(
    path: str | os.PathLike, what: str = "an options.json (the architecture, as the original ELMo releases ship it)"
) -> dict[str, Any]:
    """Parse a JSON options file into a dict, naming ``path`` in every error (``what`` says what was expected).

    Raises:
        ConfigError: not UTF-8 text (an HDF5 weight file is recognised and named as such), not JSON, or not a JSON
            object. (Existence is the caller's check.)
    """
    path = Path(path)
    data = path.read_bytes()
    if data.startswith(b"\x89HDF"):
        raise ConfigError(
            f"{path} is an HDF5 file, not a JSON options file (weights?): expected {what}; pass the "
            "HDF5 as the weight file"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not a UTF-8 JSON options file (byte {exc.start}: {exc.reason}); expected {what}"
        ) from None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); expected {what}") from None
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: options must be a JSON object, not a {type(options).__name__}; expected {what}")
    return options
