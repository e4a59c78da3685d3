"""One-release alias: this module moved to :mod:`elmokit.recipes.zoo.corpora` (importing it here warns)."""

from elmokit import _moved

_moved(__name__, "elmokit.recipes.zoo.corpora")
