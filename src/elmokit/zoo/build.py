"""One-release alias: this module moved to :mod:`elmokit.recipes.zoo.build` (importing it here warns)."""

from elmokit import _moved

_moved(__name__, "elmokit.recipes.zoo.build")
