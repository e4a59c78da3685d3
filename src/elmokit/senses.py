"""One-release alias: this module moved to :mod:`elmokit.analysis.senses` (importing it here warns)."""

from elmokit import _moved

_moved(__name__, "elmokit.analysis.senses")
