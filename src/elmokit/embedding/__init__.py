"""Embedding text with a frozen biLM: :class:`Embedder` (sentences → arrays, files → HDF5;
:mod:`.embedder`), the file job (:mod:`.writer`: streamed, atomic parts, resumable, workers, torchrun), reading the
outputs (:mod:`.reader`: :func:`open_embeddings`), and layer selection and pooling (:mod:`.pooling`)."""

from elmokit.embedding.embedder import Embedder, resolve_model
from elmokit.embedding.reader import EmbeddingReader, open_embeddings, sentence_key

__all__ = ["Embedder", "resolve_model", "EmbeddingReader", "open_embeddings", "sentence_key"]
