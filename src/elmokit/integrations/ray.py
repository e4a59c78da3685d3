"""Embedding corpora with Ray Data (``pip install 'elmokit[ray]'``): :class:`EmbedBatches`, a callable class for
``Dataset.map_batches`` that loads the model once per actor::

    import ray
    from elmokit.integrations.ray import EmbedBatches

    ds = ray.data.read_parquet("s3://bucket/sentences/")          # a column "tokens": lists of str
    ds = ds.map_batches(
        EmbedBatches,
        fn_constructor_kwargs={"model": "elmokit-en", "tokens_column": "tokens", "output_column": "elmo",
                               "layers": "average", "pool": "mean"},
        concurrency=8, batch_size=256, num_cpus=4,                  # 8 actors of 4 CPUs (num_gpus=1 for a GPU each)
    )
    ds.write_parquet("s3://bucket/elmo/")

Each row's output is float32: with ``pool=None`` the token vectors, (n, D) for one layer or a fixed choice
(``layers`` ``"average"``, ``"top"``, a layer index) and (L+1, n, D) for ``"all"``; with ``pool="mean"`` one
(D,) sentence vector, the mean over the sentence's real tokens (``"max"`` too). These are
:meth:`elmokit.Embedder.embed_sentences`'s arrays for the same options: a row's values do not depend on the other
rows of its batch beyond the bound stated there. The input is a column of token lists (``tokens_column``), or of raw
lines (``text_column``) split with ``tokenizer`` (``"whitespace"``, ``"moses"``, ``"jieba"``: one line, one
sentence, as ``elmokit embed --tokenizer``). Every input column is kept; ``output_column`` is added.

Resources: ``num_cpus`` / ``num_gpus`` given to ``map_batches`` are what each actor gets from Ray, and the actor
uses them — torch runs on as many threads as CPUs were assigned (``threads`` overrides), and on the GPU when one
was assigned (``device`` overrides). The model is loaded in each actor by name, so it must be reachable from every
node: a Hugging Face Hub name (``org/name``: each node fetches it into its Hub cache), a released name, or a folder
on a shared file system.

Source: Ray 2.x ``Dataset.map_batches`` with a callable class (``fn_constructor_kwargs``, ``concurrency``), batches
as dicts of NumPy arrays (https://docs.ray.io/en/latest/data/transforming-data.html).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from elmokit.data.tokenizers import word_tokenizer
from elmokit.embedding import Embedder
from elmokit.errors import InputError, UsageError, import_optional

_ray = import_optional("ray", "ray", "embedding with Ray Data (elmokit.integrations.ray)")

__all__ = ["EmbedBatches"]


def _assigned(resource: str) -> float:
    """The amount of ``resource`` Ray assigned to this worker (0 outside a Ray worker, e.g. in the driver)."""
    if not _ray.is_initialized():
        return 0.0
    try:
        assigned = _ray.get_runtime_context().get_assigned_resources()
    except AssertionError:  # Ray's check that this process is a worker
        return 0.0
    return float(assigned.get(resource, 0.0))


def _as_tokens(value: object, row: int, column: str) -> list[str]:
    """One cell of the tokens column (a list or NumPy array of str) → a list of str."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(
            f"column {column!r}, row {row} of the batch: expected a list of tokens (str), got "
            f"{type(value).__name__} (raw lines go in text_column= with tokenizer=)"
        )
    return list(value)


class EmbedBatches:
    """``map_batches`` callable: a batch (dict of columns) → the batch with ``output_column`` added (see the module
    docstring).

    Args:
        model: anything :class:`~elmokit.Embedder` takes by name (a folder, a released, zoo or Hub name).
        tokens_column: the column of token lists (ignored when ``text_column`` is given).
        output_column: the column to write.
        layers: ``"average"`` (default), ``"top"``, a layer index, ``"all"``, or fixed mix weights.
        pool: ``None`` (per token), ``"mean"`` or ``"max"`` (one vector per sentence).
        text_column, tokenizer: a column of raw lines and how to split them (``"whitespace"``, ``"moses"``,
            ``"jieba"``).
        batch_size: sentences per forward pass inside the actor (Ray's ``batch_size`` is how many rows a call gets).
        threads: torch threads (default: the CPUs Ray assigned the actor, at least 1).
        device: where to run (default: ``"cuda"`` when Ray assigned a GPU, else ``"cpu"``).

    Raises:
        UsageError: a bad option (an unknown tokenizer, layers or pool) — in the constructor, so Ray reports it when the
            actors start; the model's loading errors. InputError: a batch without the column, or a cell that is not
            a list of tokens (naming the row).
    """

    def __init__(
        self,
        model: object,
        *,
        tokens_column: str = "tokens",
        output_column: str = "elmo",
        layers: object = "average",
        pool: str | None = None,
        text_column: str | None = None,
        tokenizer: str = "whitespace",
        batch_size: int = 64,
        threads: int | None = None,
        device: str | None = None,
    ) -> None:
        self.threads = threads if threads is not None else max(1, int(_assigned("CPU")))
        torch.set_num_threads(self.threads)
        device = device or ("cuda" if _assigned("GPU") > 0 else "cpu")
        self.embedder = Embedder(model, batch_size=batch_size, device=device)
        self.pool = "none" if pool is None else pool
        self.layers = layers
        self.embedder.output_spec(layers, self.pool)  # raises UsageError now, not in the first batch
        self.tokens_column, self.output_column, self.text_column = tokens_column, output_column, text_column
        self.split = word_tokenizer(tokenizer) if text_column is not None else None
        if output_column in (tokens_column, text_column):
            raise UsageError(f"output_column {output_column!r} would replace the input column")

    def _sentences(self, batch: dict) -> list[list[str]]:
        column = self.text_column or self.tokens_column
        if column not in batch:
            raise InputError(f"the batch has no column {column!r} (it has {sorted(batch)})")
        cells = batch[column]
        if self.split is not None:
            return [self.split(str(line)) for line in cells]
        return [_as_tokens(cell, i, column) for i, cell in enumerate(cells)]

    def __call__(self, batch: dict) -> dict:
        """``batch`` (dict of NumPy columns) → the same dict with ``output_column``: an array of (B, D) (pooled) or
        an object array of B per-sentence float32 arrays."""
        sentences = self._sentences(batch)
        arrays = list(self.embedder.embed_sentences(sentences, layers=self.layers, pool=self.pool))
        if self.pool != "none":
            out = np.stack(arrays) if arrays else np.zeros((0, self.embedder.output_dim), dtype=np.float32)
        else:
            out = np.empty(len(arrays), dtype=object)
            for i, array in enumerate(arrays):
                out[i] = array
        return {**batch, self.output_column: out}

    def __repr__(self) -> str:
        return f"EmbedBatches(layers={self.layers!r}, pool={self.pool!r}, threads={self.threads}, pid={os.getpid()})"
