"""One-release alias: this module was split into :mod:`elmokit.embedding.writer` (``embed_file``'s job) and
:mod:`elmokit.embedding.reader` (:func:`open_embeddings`, :func:`sentence_key`); importing it here warns."""

import warnings

from elmokit.embedding.reader import *  # noqa: F403 (the alias re-exports both modules' names)
from elmokit.embedding.writer import *  # noqa: F403

warnings.warn(
    "elmokit.embed_output moved to elmokit.embedding.reader (open_embeddings, sentence_key) and "
    "elmokit.embedding.writer: import from there (elmokit.embed_output is an alias for one release)",
    FutureWarning,
    stacklevel=2,
)
