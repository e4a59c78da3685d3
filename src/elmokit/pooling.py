"""One-release alias: this module moved to :mod:`elmokit.embedding.pooling` (importing it here warns)."""

from elmokit import _moved

_moved(__name__, "elmokit.embedding.pooling")
