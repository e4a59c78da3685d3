"""elmokit.compat.simple_elmo: simple_elmo's ElmoModel API, values equal to elmokit's Embedder."""

from __future__ import annotations

import gzip
import zipfile

import numpy as np
import pytest

from elmokit import Embedder, load_pretrained_bilm
from elmokit.compat.simple_elmo import ElmoModel
from elmokit.errors import InputTypeError, MissingFileError, UsageError, WeightsError
from helpers import assert_close_to_scale
from test_weights_archive import VOCAB, make_zip, nlpl_folder

TEXTS = [["the", "cat", "sat", "on", "the", "mat", "."], ["Привет", "мир", "!"], [], ["x"]]


@pytest.fixture(scope="module")
def nlpl_zip(tmp_path_factory):
    root = tmp_path_factory.mktemp("nlpl")
    return make_zip(nlpl_folder(root / "m", n_characters=261), root / "m.zip", top="m")


def _reference(path, layers: str) -> list[np.ndarray]:
    """Embedder's arrays for TEXTS, batched as ElmoModel batches them (max_batch_size 32)."""
    return list(Embedder(load_pretrained_bilm(path), batch_size=32).embed_sentences(TEXTS, layers=layers))


@pytest.mark.parametrize("layers", ["average", "top"])
def test_vectors_equal_the_embedders_padded_with_zeros(nlpl_zip, layers):
    model = ElmoModel().load(nlpl_zip, limit=0)
    got = model.get_elmo_vectors(TEXTS, layers=layers)
    assert got.shape == (4, 7, 16) and got.dtype == np.float32
    for i, want in enumerate(_reference(nlpl_zip, layers)):
        assert np.array_equal(got[i, : len(TEXTS[i])], want)
        assert not got[i, len(TEXTS[i]) :].any()
    assert np.abs(got[0]).max() > 0.05  # real values, not a zero array


def test_all_layers_is_4d_and_consistent_with_top_and_average(nlpl_zip):
    model = ElmoModel().load(nlpl_zip, limit=0)
    every = model.get_elmo_vectors(TEXTS, layers="all")
    assert every.shape == (4, 3, 7, 16)
    for i, want in enumerate(_reference(nlpl_zip, "all")):  # (L+1, n, 2P)
        assert np.array_equal(every[i, :, : len(TEXTS[i])], want)
        assert not every[i, :, len(TEXTS[i]) :].any()
    assert np.array_equal(every[:, -1], model.get_elmo_vectors(TEXTS, layers="top"))
    assert_close_to_scale(every.mean(axis=1), model.get_elmo_vectors(TEXTS), 1e-6)


@pytest.mark.parametrize("layers", ["average", "top", "all"])
def test_vector_average_is_the_unit_length_token_mean(nlpl_zip, layers):
    model = ElmoModel().load(nlpl_zip, limit=0)
    got = model.get_elmo_vector_average(TEXTS, layers=layers)
    assert got.shape == ((4, 3, 16) if layers == "all" else (4, 16)) and got.dtype == np.float32
    for i, arr in enumerate(_reference(nlpl_zip, layers)):
        if not TEXTS[i]:
            assert not got[i].any()  # an empty text: zeros, not NaN
            continue
        mean = arr.mean(axis=-2)
        assert_close_to_scale(got[i], mean / np.linalg.norm(mean, axis=-1, keepdims=True), 1e-6)
        assert_close_to_scale(np.linalg.norm(got[i], axis=-1), np.ones(got[i].shape[:-1]), 1e-6)
    assert model.get_elmo_vector_average([], layers=layers).shape == ((0, 3, 16) if layers == "all" else (0, 16))


def test_limit_caches_the_first_vocabulary_words_and_changes_no_vector(nlpl_zip, tmp_path):
    cached = ElmoModel().load(nlpl_zip, limit=4)
    assert cached.vocab == VOCAB[:4] and len(cached.embedder.token_cache.words) == 4
    assert ElmoModel().load(nlpl_zip).vocab == VOCAB  # default limit 100: the whole (short) vocabulary
    plain = ElmoModel().load(nlpl_zip, limit=0)
    assert plain.vocab is None and plain.embedder.token_cache is None
    assert_close_to_scale(cached.get_elmo_vectors(TEXTS), plain.get_elmo_vectors(TEXTS), 1e-6)
    # a folder: vocab.txt.gz beside options.json + model.hdf5, as simple_elmo reads it
    folder = nlpl_folder(tmp_path / "f", n_characters=262)
    (folder / "vocab.txt").unlink()
    (folder / "vocab.txt.gz").write_bytes(gzip.compress("\n".join(VOCAB).encode()))
    from_folder = ElmoModel().load(folder, max_batch_size=2, limit=3)
    assert from_folder.vocab == VOCAB[:3] and from_folder.embedder.batch_size == 2
    assert_close_to_scale(from_folder.get_elmo_vectors(TEXTS), plain.get_elmo_vectors(TEXTS), 1e-6)


def test_warmup_has_no_effect_and_texts_do_not_depend_on_each_other(nlpl_zip):
    model = ElmoModel().load(nlpl_zip, limit=0, max_batch_size=1)  # one text per pass: bitwise comparable
    first = model.get_elmo_vectors(TEXTS, warmup=True)
    again = model.get_elmo_vectors(TEXTS, warmup=False)
    assert np.array_equal(first, again)
    alone = model.get_elmo_vectors([TEXTS[1]])
    assert np.array_equal(alone[0], first[1, :3])


def test_refusals_are_one_clear_line(nlpl_zip, tmp_path):
    with pytest.raises(UsageError, match="no model loaded"):
        ElmoModel().get_elmo_vectors(TEXTS)
    with pytest.raises(UsageError, match="full=True .*TensorFlow checkpoint"):
        ElmoModel().load(nlpl_zip, full=True)
    with pytest.raises(UsageError, match="max_batch_size"):
        ElmoModel().load(nlpl_zip, max_batch_size=0)
    with pytest.raises(UsageError, match="limit"):
        ElmoModel().load(nlpl_zip, limit=-1)
    model = ElmoModel().load(nlpl_zip)
    with pytest.raises(UsageError, match="layers='mean'; expected one of 'average', 'top', 'all'"):
        model.get_elmo_vectors(TEXTS, layers="mean")
    with pytest.raises(UsageError, match="session is a TensorFlow session"):
        model.get_elmo_vector_average(TEXTS, session=object())
    with pytest.raises(InputTypeError, match=r"text.split\(\) for text in texts"):
        model.get_elmo_vectors(["the cat sat", "a dog"])
    with pytest.raises(InputTypeError, match="single string"):
        model.get_elmo_vectors("the cat sat")
    with pytest.raises(UsageError, match="get_elmo_substitutes needs simple_elmo's full=True"):
        model.get_elmo_substitutes(["the cat"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="not a model folder"):
        ElmoModel().load(tmp_path / "empty")
    with zipfile.ZipFile(tmp_path / "ckpt.zip", "w") as zf:
        for name in ("options.json", "checkpoint", "model.ckpt-1.index", "model.ckpt-1.data-00000-of-00001"):
            zf.writestr(name, "x")
    with pytest.raises(WeightsError, match="TensorFlow checkpoint.*dump_weights"):
        ElmoModel().load(tmp_path / "ckpt.zip")


def test_blank_tokens_are_embedded_as_simple_elmo_embeds_them(nlpl_zip):
    # simple_elmo's bilm-tf batcher encodes "" as <bow><eow>; text.split(" ") on double spaces gives such tokens
    model = ElmoModel().load(nlpl_zip, limit=0)
    texts = [["the", "", "cat"], [" "]]
    got = model.get_elmo_vectors(texts, layers="top")
    want = list(Embedder(load_pretrained_bilm(nlpl_zip), empty_tokens="keep").embed_sentences(texts, layers="top"))
    assert got.shape == (2, 3, 16)
    assert_close_to_scale(got[0], want[0], 1e-6)
    assert_close_to_scale(got[1, :1], want[1], 1e-6)
    assert np.abs(got[0, 1]).max() > 0.01  # the blank token has a real vector
    assert model.get_elmo_vector_average(texts).shape == (2, 16)
