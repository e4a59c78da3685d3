"""Model configuration: the biLM architecture, ``options.json`` reading/writing, and the released presets.

The configuration mirrors the original ``options.json`` of bilm-tf / AllenNLP (``lstm`` and ``char_cnn`` sections),
so that a file written by :meth:`ElmoConfig.to_options` is read by the original code and vice versa.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

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
    """

    filters: list[tuple[int, int]] = field(default_factory=lambda: [tuple(f) for f in RELEASED_FILTERS])
    n_highway: int = 2
    embedding_dim: int = 16
    n_characters: int = 262
    max_characters_per_token: int = 50
    activation: str = "relu"
    char_vocab_size: int | None = None

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

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first inconsistent field."""
        if not self.filters:
            raise ConfigError("char_cnn.filters is empty: at least one (width, count) filter is needed")
        for f in self.filters:
            if len(f) != 2 or int(f[0]) < 1 or int(f[1]) < 1:
                raise ConfigError(f"char_cnn.filters entry {list(f)!r} must be [width >= 1, count >= 1]")
        widest = max(int(w) for w, _ in self.filters)
        if self.max_characters_per_token < max(widest, 3):
            raise ConfigError(
                f"char_cnn.max_characters_per_token={self.max_characters_per_token} is smaller than the widest "
                f"filter ({widest}) or 3 (begin-of-word, one character, end-of-word)"
            )
        if self.activation not in _ACTIVATIONS:
            raise ConfigError(f"char_cnn.activation={self.activation!r}; expected one of {_ACTIVATIONS}")
        if self.char_vocab_size is None and self.n_characters not in (261, 262):
            raise ConfigError(
                f"char_cnn.n_characters={self.n_characters}; the UTF-8 byte scheme has 261 stored rows "
                "(262 with the padding row): expected 261 or 262"
            )
        if self.n_highway < 0 or self.embedding_dim < 1:
            raise ConfigError("char_cnn.n_highway must be >= 0 and char_cnn.embedding.dim >= 1")


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

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first inconsistent field."""
        for name in ("dim", "projection_dim", "n_layers"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"lstm.{name}={getattr(self, name)} must be >= 1")


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

    def validate(self) -> "ElmoConfig":
        """Check every field; return ``self``. Raises :class:`ConfigError`."""
        self.char_cnn.validate()
        self.lstm.validate()
        return self

    # ------------------------------------------------------------------ options.json
    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "ElmoConfig":
        """Build from a parsed original ``options.json`` dict.

        Raises:
            ConfigError: a required key is missing or a value is invalid (the message names the key).
        """
        if not isinstance(options, dict):
            raise ConfigError(f"options must be a JSON object, got {type(options).__name__}")
        try:
            cc = options["char_cnn"]
            ls = options["lstm"]
        except KeyError as exc:
            raise ConfigError(
                f"options has no {exc.args[0]!r} section: only character-input models (char_cnn + lstm) are supported"
            ) from None
        try:
            char_cnn = CharCNNConfig(
                filters=[(int(w), int(n)) for w, n in cc["filters"]],
                n_highway=int(cc["n_highway"]),
                embedding_dim=int(cc["embedding"]["dim"]),
                n_characters=int(cc.get("n_characters", 262)),
                max_characters_per_token=int(cc.get("max_characters_per_token", 50)),
                activation=str(cc.get("activation", "relu")),
                char_vocab_size=cc.get("char_vocab_size"),
            )
            lstm = LSTMConfig(
                dim=int(ls["dim"]),
                projection_dim=int(ls.get("projection_dim", ls["dim"])),
                n_layers=int(ls["n_layers"]),
                cell_clip=_opt_float(ls.get("cell_clip")),
                proj_clip=_opt_float(ls.get("proj_clip")),
                use_skip_connections=bool(ls.get("use_skip_connections", False)),
            )
        except KeyError as exc:
            raise ConfigError(f"options is missing required key {exc.args[0]!r}") from None
        extra = {k: v for k, v in options.items() if k not in ("char_cnn", "lstm")}
        return cls(char_cnn=char_cnn, lstm=lstm, extra=extra).validate()

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
    def from_json_file(cls, path: str | os.PathLike) -> "ElmoConfig":
        """Read an ``options.json`` (or elmokit ``config.json``, same schema). Raises ConfigError / FileNotFoundError."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"options file not found: {path}")
        try:
            options = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_options(options)

    def to_json_file(self, path: str | os.PathLike) -> None:
        """Write ``to_options()`` as JSON atomically."""
        from .io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_options(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (dataclass fields)."""
        return asdict(self)


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)


def _released(dim: int, projection_dim: int, n_highway: int) -> ElmoConfig:
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[tuple(f) for f in RELEASED_FILTERS], n_highway=n_highway, embedding_dim=16, n_characters=262,
            max_characters_per_token=50, activation="relu",
        ),
        lstm=LSTMConfig(dim=dim, projection_dim=projection_dim, n_layers=2, cell_clip=3.0, proj_clip=3.0,
                        use_skip_connections=True),
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
    """The tiny architecture of the reference fixtures: filters (1,4)…(5,64), char dim 4, 2 highway, cell 64, proj 16."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 4), (2, 8), (3, 16), (4, 32), (5, 64)], n_highway=2, embedding_dim=4, n_characters=262,
            max_characters_per_token=50, activation="relu",
        ),
        lstm=LSTMConfig(dim=64, projection_dim=16, n_layers=2, cell_clip=3.0, proj_clip=3.0,
                        use_skip_connections=use_skip_connections),
    )


#: Preset name → configuration function.
PRESETS = {
    "small": elmo_small,
    "medium": elmo_medium,
    "original": elmo_original,
    "original-5.5b": elmo_original_5b,
    "tiny": elmo_tiny,
}
