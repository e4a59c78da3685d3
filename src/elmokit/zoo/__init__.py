"""One-release alias package: the model zoo moved to :mod:`elmokit.recipes.zoo` (importing it here warns);
``elmokit.zoo.build`` and ``elmokit.zoo.corpora`` are the modules of their new home."""

import warnings

from elmokit.recipes.zoo import *  # noqa: F403 (the alias re-exports the package's names)
from elmokit.recipes.zoo import __all__  # noqa: F401

warnings.warn(
    "elmokit.zoo moved to elmokit.recipes.zoo: import it from there (elmokit.zoo is an alias for one release)",
    FutureWarning,
    stacklevel=2,
)
