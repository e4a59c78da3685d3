"""One-release alias: this module moved to :mod:`elmokit.analysis.polysemy` (importing it here warns)."""

from elmokit import _moved

_moved(__name__, "elmokit.analysis.polysemy")
