"""``elmokit.compat.allennlp.ElmoEmbedder``: AllenNLP 0.9's ``ElmoEmbedder`` called as SeqVec, bio_embeddings and
``allennlp elmo`` call it, checked against elmokit's Embedder and against AllenNLP's own reference outputs
(../shared/fixtures/allennlp-elmo: made statefully, 10 batches of 3 sentences; to 1e-5 as tests/test_fixtures.py)."""

from __future__ import annotations

import io
import json
import types

import h5py
import numpy as np
import pytest
import torch

from elmokit import ConfigError, Embedder, InputError, UsageError, WeightsError, save_pretrained
from elmokit.compat import allennlp as compat
from elmokit.compat.allennlp import DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, ElmoEmbedder
from elmokit.errors import UsageTypeError
from helpers import assert_close_to_scale, expected_top, fixture_dir, fixture_sentences

PROTEIN = "MKTAYIAKQRQISFVKSHFSRQ"  # SeqVec embeds list(sequence): one token per residue


@pytest.fixture(scope="module")
def files():
    d = fixture_dir("allennlp-elmo")
    return d / "options.json", d / "lm_weights.hdf5"


@pytest.fixture(scope="module")
def embedder(files):
    return ElmoEmbedder(*files, cuda_device=-1)  # SeqVec passes pathlib paths


@pytest.fixture(scope="module")
def reference(files):
    return Embedder(str(files[0]), str(files[1]))


def _interleaved() -> list[list[str]]:
    """The fixture's sentences in the order AllenNLP embedded them: batch i = sentence i of lists 0, 1, 2."""
    s = fixture_sentences("allennlp-elmo")
    return [s[k][i].split() for i in range(10) for k in range(3)]


def test_seqvec_style_calls_equal_the_embedder(embedder, reference):
    layers = embedder.embed_sentence(list(PROTEIN))
    assert layers.shape == (3, len(PROTEIN), 32) and layers.dtype == np.float32
    np.testing.assert_array_equal(layers, reference.embed_sentence(list(PROTEIN)))
    # SeqVec's per-residue vector: the sum (or mean) over the three layers
    assert_close_to_scale(torch.tensor(layers).sum(dim=0), torch.tensor(layers[0] + layers[1] + layers[2]), 1e-6)
    sentences = _interleaved()[:7]
    stream = embedder.embed_sentences(iter(sentences), batch_size=2)
    assert isinstance(stream, types.GeneratorType)
    for got, sentence in zip(stream, sentences):
        assert got.shape == (3, len(sentence), 32)
        assert_close_to_scale(got, reference.embed_sentence(sentence), 1e-5)
    batch = embedder.embed_batch(sentences[:3])
    assert [b.shape[1] for b in batch] == [len(s) for s in sentences[:3]]
    empty = embedder.embed_sentence([])  # 0.9: zeros((3, 0, 1024)) float64 whatever the model
    assert empty.shape == (3, 0, 32) and empty.dtype == np.float32
    # a blank token: 0.9 embedded it (<bow><eow>), so code that passes one keeps running
    blank = embedder.embed_sentence(["The", "", "bank"])
    assert blank.shape == (3, 3, 32)
    want = Embedder(reference.bilm, empty_tokens="keep").embed_sentence(["The", "", "bank"])
    assert_close_to_scale(blank, want, 1e-6)
    activations, mask = embedder.batch_to_embeddings([["The", " "]])
    assert activations.shape == (1, 3, 2, 32) and mask.tolist() == [[1, 1]]


def test_bio_embeddings_style_calls(files, reference):
    # bio_embeddings' SeqVecEmbedder: keyword arguments, embed_batch of residue lists, per-protein sum(0).mean(0)
    embedder = ElmoEmbedder(weight_file=str(files[1]), options_file=str(files[0]), cuda_device=-1)
    proteins = [PROTEIN, PROTEIN[:5], "MA"]
    got = embedder.embed_batch([list(p) for p in proteins])
    assert [g.shape for g in got] == [(3, len(p), 32) for p in proteins]
    for g, p in zip(got, proteins):
        want = reference.embed_sentence(list(p))
        assert_close_to_scale(g, want, 1e-5)
        assert_close_to_scale(g.sum(0).mean(0), want.sum(0).mean(0), 1e-5)
    assert embedder.embed_batch([]) == []


def test_batch_to_embeddings_shapes_mask_and_padding(embedder, reference):
    batch = [["The", "cat", "sat", "."], ["Hi"], []]
    activations, mask = embedder.batch_to_embeddings(batch)
    assert activations.shape == (3, 3, 4, 32) and activations.dtype == torch.float32
    assert mask.dtype == torch.int64 and mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert activations[1, :, 1:].abs().max() == 0 and activations[2].abs().max() == 0
    for i, sentence in enumerate(batch[:2]):
        assert_close_to_scale(activations[i, :, : len(sentence)], reference.embed_sentence(sentence), 1e-5)


def test_layer_zero_is_the_token_vector_twice_as_allennlp_computed_it(embedder):
    d = fixture_dir("allennlp-elmo")
    words = (d / "vocab_test.txt").read_text().split("\n")
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as fh:
        table = fh["embedding"][...]  # AllenNLP's context-free token vectors of these words
    picked = [w for w in words[3:40] if w not in ("<S>", "</S>", "<UNK>")][:20]
    layer0 = embedder.embed_sentence(picked)[0]
    np.testing.assert_array_equal(layer0[:, :16], layer0[:, 16:])
    want = table[[words.index(w) for w in picked]]
    assert np.abs(layer0[:, :16] - want).max() <= 1e-5


def _max_error_against_reference(arrays: list[np.ndarray]) -> list[float]:
    return [float(np.abs(a[-1] - expected_top("allennlp-elmo", j % 3, j // 3)).max()) for j, a in enumerate(arrays)]


def test_stateful_reproduces_allennlp_09_exactly_and_stateless_differs(files):
    sentences = _interleaved()
    stateful = ElmoEmbedder(*files, stateful=True)
    by_batch = [a for i in range(10) for a in stateful.embed_batch(sentences[3 * i : 3 * i + 3])]
    assert max(_max_error_against_reference(by_batch)) <= 1e-5
    stateful.reset_states()  # a fresh state: embed_sentences forms 0.9's batches (input order, 3 at a time)
    streamed = list(stateful.embed_sentences(sentences, batch_size=3))
    assert max(_max_error_against_reference(streamed)) <= 1e-5
    again = stateful.embed_batch(sentences[:3])  # the state carried on: the same sentences now give other vectors
    assert max(float(np.abs(a[-1] - b[-1]).max()) for a, b in zip(again, streamed[:3])) > 0.1
    stateless = ElmoEmbedder(*files)
    errors = _max_error_against_reference(list(stateless.embed_sentences(sentences, batch_size=3)))
    assert max(errors[:3]) <= 1e-5  # the first batch starts from zeros in both
    assert min(max(errors[3 * i : 3 * i + 3]) for i in range(1, 10)) > 0.1


def _read(path):
    with h5py.File(path, "r") as h5:
        return {k: h5[k][()] for k in h5}


def test_embed_file_writes_allennlps_layout(tmp_path, embedder, reference):
    lines = ["The cat sat .", "  A dog ran  ", "The cat sat .", "x / y 100%"]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "all.hdf5"
    embedder.embed_file(src, out, batch_size=2)
    data = _read(out)
    assert sorted(data) == ["0", "1", "2", "3", "sentence_to_index"]
    assert json.loads(data["sentence_to_index"][0]) == {"The cat sat .": "2", "A dog ran": "1", "x / y 100%": "3"}
    for i, line in enumerate(lines):
        assert_close_to_scale(data[str(i)], reference.embed_sentence(line.split()), 1e-5)
    with open(src, encoding="utf-8") as handle:  # 0.9 took an open file (and closed it)
        embedder.embed_file(handle, tmp_path / "top.hdf5", "top", forget_sentences=True)
    assert handle.closed
    top = _read(tmp_path / "top.hdf5")
    assert sorted(top) == ["0", "1", "2", "3"] and top["1"].shape == (3, 32)
    assert_close_to_scale(top["1"], data["1"][-1], 1e-6)
    text = io.StringIO("\n".join(lines[:2]) + "\n")
    embedder.embed_file(text, tmp_path / "avg.hdf5", output_format="average", use_sentence_keys=True)
    avg = _read(tmp_path / "avg.hdf5")
    assert sorted(avg) == ["A dog ran", "The cat sat ."] and text.closed
    assert_close_to_scale(avg["The cat sat ."], data["0"].mean(axis=0), 1e-6)
    embedder.embed_file(src, out, "top")  # an earlier output is replaced, as 0.9 did
    assert _read(out)["0"].shape == (4, 32)


def test_embed_file_stateful_reproduces_the_reference(tmp_path, files):
    src = tmp_path / "in.txt"
    src.write_text("".join(" ".join(s) + "\n" for s in _interleaved()), encoding="utf-8")
    ElmoEmbedder(*files, stateful=True).embed_file(src, tmp_path / "out.hdf5", "top", batch_size=3)
    data = _read(tmp_path / "out.hdf5")
    assert max(_max_error_against_reference([data[str(j)][None] for j in range(30)])) <= 1e-5


def test_embed_file_refusals_are_one_line_and_write_nothing(tmp_path, embedder):
    src = tmp_path / "in.txt"
    src.write_text("a b\n\nc\n   \n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    with pytest.raises(InputError, match=r"in\.txt: blank line\(s\) 2, 4: .*AllenNLP 0\.9") as info:
        embedder.embed_file(src, out)
    src.write_text("a b\nc\n a b \n", encoding="utf-8")
    embedder.embed_file(src, out)  # repeated lines are fine when keyed by line number
    with pytest.raises(InputError, match="line 3 repeats line 1, and use_sentence_keys=True") as info2:
        embedder.embed_file(src, tmp_path / "keys.hdf5", use_sentence_keys=True)
    with pytest.raises(UsageError, match="output_format must be one of"):
        embedder.embed_file(src, tmp_path / "x.hdf5", "mean")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine", encoding="utf-8")
    with pytest.raises(UsageError, match="exists and is not an HDF5 file") as info3:
        embedder.embed_file(src, notes)
    assert notes.read_text(encoding="utf-8") == "mine"
    assert not (tmp_path / "keys.hdf5").exists() and not (tmp_path / "x.hdf5").exists()
    for i in (info, info2, info3):
        assert "\n" not in str(i.value)


def test_devices_and_models_of_the_wrong_kind_are_one_line(tmp_path, files, reference):
    options, weights = files
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match=r"cuda_device=0 asked for, but CUDA is not available") as info:
            ElmoEmbedder(options, weights, cuda_device=0)
        assert "\n" not in str(info.value)
    with pytest.raises(UsageTypeError, match="cuda_device must be an int"):
        ElmoEmbedder(options, weights, cuda_device="cpu")
    d = fixture_dir("allennlp-elmo")
    native = tmp_path / "native"
    save_pretrained(reference.bilm, native)
    cases = [
        ((d / "sentences.json", weights), ConfigError, "options must be a JSON object"),
        ((weights, options), ConfigError, "is an HDF5 file, not a JSON options file"),
        ((options, options), WeightsError, "is a JSON file, not an HDF5 weight file"),
        ((options, d / "SOURCE.md"), WeightsError, "not a readable HDF5 weight file"),
        ((native, weights), UsageError, "is a model folder: pass it alone"),
        ((options, None), UsageError, "pass its HDF5 weight file too"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message) as info:
            ElmoEmbedder(*args)
        assert "\n" not in str(info.value)
    # a model folder alone (weight_file None, or the default left in place)
    for alone in (ElmoEmbedder(native, None), ElmoEmbedder(str(native))):
        np.testing.assert_array_equal(alone.embed_sentence(["a", "b"]), reference.embed_sentence(["a", "b"]))


def test_defaults_and_urls_load_through_elmokits_loaders(tmp_path, monkeypatch, files, reference):
    asked = []
    monkeypatch.setattr(compat, "load_pretrained_bilm", lambda name: asked.append(name) or reference.bilm)
    ElmoEmbedder()  # 0.9's default URLs: the released "original" model
    ElmoEmbedder(DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, -1)
    assert asked == ["original", "original"]
    # another URL pair: downloaded once into the cache (urlopen replaced by a local read)
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path))
    local = {"https://example.org/m/options.json": files[0], "https://example.org/m/weights.hdf5": files[1]}
    monkeypatch.setattr("elmokit.weights.native._urlopen", lambda url: open(local[url], "rb"))
    by_url = ElmoEmbedder(*local)
    np.testing.assert_array_equal(by_url.embed_sentence(["a"]), reference.embed_sentence(["a"]))
    assert sorted(p.name for p in (tmp_path / "urls").rglob("*.*")) == ["options.json", "weights.hdf5"]
    with pytest.raises(UsageError, match="s3:// addresses are not fetched"):
        ElmoEmbedder("s3://bucket/options.json", "s3://bucket/weights.hdf5")
