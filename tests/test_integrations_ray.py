"""Ray Data's ``EmbedBatches`` (``elmokit.integrations.ray``, the ``ray`` extra, in ``test``) on one local Ray
instance (``ray.init(num_cpus=2)``, started once for the module): the vectors equal ``Embedder``'s on the same real
sentences (UD English-EWT dev), per token and pooled, from token lists and from raw lines; the actor runs torch on
the CPUs Ray assigned it. The model is the AllenNLP test fixture (../shared/fixtures/allennlp-elmo), native format."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import Embedder
from elmokit.errors import InputError, UsageError
from elmokit.tasks.readers import read_conllu
from elmokit.weights.native import save_pretrained
from helpers import assert_close_to_scale, docs_example, fixture_model

pytest.importorskip("ray.data", reason="pip install 'elmokit[ray]'")
import ray  # noqa: E402  (ray.data imported above)

from conftest import shared_path  # noqa: E402
from elmokit.integrations.ray import EmbedBatches  # noqa: E402

#: the stated batch bound of Embedder.embed_sentences (relative to each layer's largest |value|, absolute below 1)
BATCH_BOUND = 1e-5


@pytest.fixture(scope="module")
def local_ray():
    # the workers import this module (its probe class) and elmokit as the driver does
    path = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    folder = tmp_path_factory.mktemp("native") / "model"
    save_pretrained(fixture_model("allennlp-elmo"), folder)
    return str(folder)


@pytest.fixture(scope="module")
def sentences() -> list[list[str]]:
    path = shared_path("data", "ud-english-ewt", "en_ewt-ud-dev.conllu")
    return [list(s.tokens) for s in read_conllu(path, limit=40)]


class _ThreadProbe(EmbedBatches):
    """EmbedBatches that also writes the torch thread count of the actor it runs in."""

    def __call__(self, batch: dict) -> dict:
        out = super().__call__(batch)
        return {**out, "threads": np.full(len(out["elmo"]), torch.get_num_threads())}


def test_token_vectors_on_local_ray_equal_the_embedders(local_ray, native, sentences):
    ds = ray.data.from_items([{"id": i, "tokens": s} for i, s in enumerate(sentences)])
    rows = ds.map_batches(
        _ThreadProbe,
        fn_constructor_kwargs={"model": native, "tokens_column": "tokens", "output_column": "elmo"},
        compute=ray.data.ActorPoolStrategy(size=1),
        batch_size=16,
        num_cpus=2,
    ).take_all()
    rows.sort(key=lambda r: r["id"])
    want = list(Embedder(native).embed_sentences(sentences, layers="average"))
    assert [list(r["tokens"]) for r in rows] == sentences
    for row, expected in zip(rows, want):
        assert row["elmo"].dtype == np.float32 and row["elmo"].shape == (len(row["tokens"]), 32)
        assert_close_to_scale(row["elmo"], expected, BATCH_BOUND, dim=0)
    assert {int(r["threads"]) for r in rows} == {2}  # num_cpus=2 → two torch threads in the actor


def test_pooled_sentence_vectors_from_raw_lines_equal_the_embedders(native, sentences):
    """The call a Ray actor makes, here in this process (the documented example runs pooled vectors on Ray)."""
    lines = [" ".join(s) for s in sentences]
    embed = EmbedBatches(
        native, text_column="line", tokenizer="whitespace", output_column="vector", layers="top", pool="mean", threads=1
    )
    out = embed({"line": np.array(lines, dtype=object)})
    want = np.stack(list(Embedder(native).embed_sentences([line.split() for line in lines], layers="top", pool="mean")))
    assert out["vector"].shape == (len(lines), 32) and out["vector"].dtype == np.float32
    assert_close_to_scale(out["vector"], want, BATCH_BOUND, dim=1)


def test_a_call_without_ray_adds_the_column_and_keeps_the_others(native):
    embed = EmbedBatches(native, layers="all", threads=1)
    batch = {"tokens": np.array([np.array(["a", "b"]), np.array(["c"])], dtype=object), "n": np.array([2, 1])}
    out = embed(batch)
    assert set(out) == {"tokens", "n", "elmo"}
    np.testing.assert_array_equal(out["n"], [2, 1])
    assert [a.shape for a in out["elmo"]] == [(3, 2, 32), (3, 1, 32)]
    assert_close_to_scale(out["elmo"][1], Embedder(native).embed_sentence(["c"]), BATCH_BOUND, dim=1)


def test_bad_options_fail_in_the_constructor_and_bad_batches_name_the_row(native):
    with pytest.raises(UsageError):
        EmbedBatches(native, layers="middle")
    with pytest.raises(UsageError):
        EmbedBatches(native, pool="median")
    with pytest.raises(UsageError, match="tokenizer"):
        EmbedBatches(native, text_column="line", tokenizer="spaces")
    with pytest.raises(UsageError, match="replace the input column"):
        EmbedBatches(native, output_column="tokens")
    embed = EmbedBatches(native, threads=1)
    with pytest.raises(InputError, match="no column 'tokens'"):
        embed({"text": np.array(["a b"])})
    with pytest.raises(InputError, match="row 1"):
        embed({"tokens": np.array([["a"], "a b"], dtype=object)})


def test_the_documented_example(local_ray, native, sentences, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"tokens": sentences[:12]}), tmp_path / "sentences.parquet")
    code = (
        docs_example("how-to/integrations.md", "## Ray Data")
        .replace('"elmokit-en"', repr(native))
        .replace('"/data/', f'"{tmp_path}/')
    )
    exec(compile(code, "docs/how-to/integrations.md (Ray Data)", "exec"), {})
    table = pq.read_table(tmp_path / "vectors")
    by_sentence = {
        tuple(t): np.asarray(v, dtype=np.float32)
        for t, v in zip(table["tokens"].to_pylist(), table["elmo"].to_numpy(zero_copy_only=False))
    }
    want = list(Embedder(native).embed_sentences(sentences[:12], layers="average", pool="mean"))
    assert len(by_sentence) == len({tuple(s) for s in sentences[:12]})
    for tokens, expected in zip(sentences[:12], want):
        assert_close_to_scale(by_sentence[tuple(tokens)], expected, BATCH_BOUND)
