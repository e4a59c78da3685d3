"""Cached biLM layer features (batch independence after float16 rounding, padding, cache round trip, stale caches
refused and recomputed), character features from words, the random-weight biLM control, and static word vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmokit import Embedder
from elmokit.characters import CharVocabulary
from elmokit.errors import DataError, InputError, MissingFileError, UsageError
from elmokit.tasks import features as features_module
from elmokit.tasks.features import (
    LayerFeatures,
    bilm_sha256,
    char_features_from_words,
    compute_layer_features,
    random_bilm_like,
    segment_characters,
    sentences_sha256,
)
from elmokit.tasks.readers import TaggedSentence
from elmokit.tasks.static import StaticVectors, build_vocab
from helpers import tiny_random_bilm

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [
    ["the", "cat", "sat", "on", "the", "mat"],
    ["a"],
    ["dogs", "ran", "far", "away", "from", "the", "big", "red", "tree", "today"],
    [],
    ["the", "cat"],
    ["x", "y", "z"],
]


@pytest.fixture(scope="module")
def bilm():
    return tiny_random_bilm(5)


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _close_f16(a: np.ndarray, b: np.ndarray) -> None:
    """Two float16-rounded arrays of values that differ by ≤ 1e-4 before rounding: at most 1e-4 plus one float16
    step (2^-10 relative) apart."""
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=2**-10, atol=1e-4)


def test_alone_equals_in_a_batch_and_the_embedder(bilm):
    feats = compute_layer_features(bilm, SENTENCES, batch_size=4)
    assert (len(feats), feats.num_layers, feats.dim, feats.total_tokens) == (6, 3, 16, 22)
    assert feats.nbytes == 22 * 3 * 16 * 2 + 7 * 8  # (L+1)·D·2 bytes a token + the offsets
    embedder = Embedder(bilm)
    for i, s in enumerate(SENTENCES):
        direct = _f16(embedder.embed_sentence(s))  # (L+1, n, D)
        alone = compute_layer_features(bilm, [s]).sentence(0)
        assert direct.shape == (3, len(s), 16)
        _close_f16(feats.sentence(i), direct)
        _close_f16(alone, direct)
        assert feats.data.dtype == np.float16


def test_batch_pads_with_zeros_and_masks(bilm):
    feats = compute_layer_features(bilm, SENTENCES)
    layers, mask = feats.batch([1, 2, 3, 0])
    assert layers.shape == (4, 3, 10, 16) and layers.dtype == torch.float32
    assert mask.tolist() == [[True] + [False] * 9, [True] * 10, [False] * 10, [True] * 6 + [False] * 4]
    for b, i in enumerate([1, 2, 3, 0]):
        n = len(SENTENCES[i])
        assert np.array_equal(layers[b, :, :n].numpy(), feats.sentence(i))
        assert not layers[b, :, n:].any()
    assert feats.batch([])[0].shape == (0, 3, 0, 16)
    with pytest.raises(UsageError, match="batch indices must lie in 0..5"):
        feats.batch([6])


def test_cache_round_trip_and_stale_caches(bilm, tmp_path, monkeypatch):
    path = tmp_path / "cache" / "train.safetensors"
    first = compute_layer_features(bilm, SENTENCES, cache_path=path, model_name="tiny")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["train.safetensors"]
    assert first.meta["bilm_name"] == "tiny" and first.meta["bilm_sha256"] == bilm_sha256(bilm)
    assert first.meta["sentences_sha256"] == sentences_sha256(SENTENCES)

    def no_compute(*args, **kwargs):
        raise AssertionError("recomputed although the cache matches")

    with monkeypatch.context() as m:
        m.setattr(features_module, "_embed_flat", no_compute)
        again = compute_layer_features(bilm, SENTENCES, cache_path=path)
    assert np.array_equal(again.data, first.data) and np.array_equal(again.offsets, first.offsets)
    assert again.meta == first.meta

    # another biLM: refused by load, recomputed (and rewritten) by compute
    other = tiny_random_bilm(6)
    with pytest.raises(DataError, match=f"{path}: stale features cache, made for another biLM"):
        LayerFeatures.load(path, bilm_sha256=bilm_sha256(other))
    redone = compute_layer_features(other, SENTENCES, cache_path=path)
    assert not np.array_equal(redone.data, first.data)
    assert LayerFeatures.load(path).meta["bilm_sha256"] == bilm_sha256(other)
    # other sentences
    with pytest.raises(DataError, match="made for other sentences"):
        LayerFeatures.load(path, sentences_sha256=sentences_sha256(SENTENCES[:2]))
    assert len(compute_layer_features(other, SENTENCES[:2], cache_path=path)) == 2
    # a damaged file: refused by load, recomputed by compute
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(DataError, match="not a readable layer-features file"):
        LayerFeatures.load(path)
    assert len(compute_layer_features(other, SENTENCES, cache_path=path)) == 6
    with pytest.raises(MissingFileError):
        LayerFeatures.load(tmp_path / "none.safetensors")


def test_sentences_and_bilm_digests():
    assert sentences_sha256([["a", "b"]]) != sentences_sha256([["a b"]]) != sentences_sha256([["ab"]])
    assert sentences_sha256([TaggedSentence(("a",), ("O",), "f", 1)]) == sentences_sha256([["a"]])
    assert bilm_sha256(tiny_random_bilm(1)) == bilm_sha256(tiny_random_bilm(1)) != bilm_sha256(tiny_random_bilm(2))
    with pytest.raises(InputError, match="sentence 0 is a string"):
        sentences_sha256(["a b"])


# ============================================================================================ characters → words
def _segment(text: str) -> list[str]:
    """A fixed toy segmenter: 'ab' and 'cde' are words, any other character is a word alone."""
    out, i = [], 0
    while i < len(text):
        for w in ("cde", "ab"):
            if text.startswith(w, i):
                out.append(w)
                i += len(w)
                break
        else:
            out.append(text[i])
            i += 1
    return out


def test_char_features_give_each_character_its_words_vectors(bilm):
    chars = [list("xabcdey"), list("ab"), list("q")]
    feats = char_features_from_words(bilm, chars, _segment)
    assert feats.meta["kind"] == "chars-from-words" and list(feats.lengths) == [7, 2, 1]
    words = Embedder(bilm).embed_sentence(["x", "ab", "cde", "y"])  # (L+1, 4, D)
    s0 = feats.sentence(0)
    for char_pos, word_pos in enumerate([0, 1, 1, 2, 2, 2, 3]):
        _close_f16(s0[:, char_pos], _f16(words[:, word_pos]))
    assert np.array_equal(s0[:, 1], s0[:, 2]) and np.array_equal(s0[:, 3], s0[:, 5])
    assert not np.array_equal(s0[:, 2], s0[:, 3])
    # a segmenter returning sentences of words (as load_tokenizer does) works the same
    nested = char_features_from_words(bilm, chars, lambda t: [_segment(t)[:2], _segment(t)[2:]])
    assert np.array_equal(nested.data, feats.data)


def test_segmenter_that_changes_the_text_is_refused():
    record = TaggedSentence(tuple("abc"), ("O", "O", "O"), "weibo.train", 12)
    with pytest.raises(DataError, match=r"weibo.train:12: the segmenter's words do not re-join .* character 1"):
        segment_characters([record], lambda t: ["a", "B", "c"])
    with pytest.raises(DataError, match="sentence 0: token 1 'bc' straddles the words 'ab' and 'cde'"):
        segment_characters([["a", "bc", "de"]], _segment)
    with pytest.raises(UsageError, match="segment must be a callable"):
        segment_characters([["a"]], "jieba")
    assert segment_characters([list("xab")], _segment) == [(["x", "ab"], [0, 1, 1])]


# ============================================================================================ random control
def test_random_bilm_like(bilm):
    bilm.char_vocab = CharVocabulary(list("abc"))  # carried over as it is (a zh model's chars.txt)
    try:
        state = torch.random.get_rng_state()
        r1, r2, r3 = random_bilm_like(bilm, 0), random_bilm_like(bilm, 0), random_bilm_like(bilm, 1)
        assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
        assert r1.config == bilm.config and r1.char_vocab is bilm.char_vocab and not r1.training
        ref = dict(bilm.state_dict())
        for name, t in r1.state_dict().items():
            assert t.shape == ref[name].shape
            assert torch.equal(t, r2.state_dict()[name])
        assert any(not torch.equal(t, ref[n]) for n, t in r1.state_dict().items() if t.numel() > 1)
        assert any(not torch.equal(t, r3.state_dict()[n]) for n, t in r1.state_dict().items() if t.numel() > 1)
    finally:
        bilm.char_vocab = None
    a = compute_layer_features(r1, SENTENCES[:2])
    pretrained = compute_layer_features(bilm, SENTENCES[:2])
    assert a.num_layers == 3 and a.dim == 16 and not np.array_equal(a.data, pretrained.data)


# ============================================================================================ static vectors
@pytest.fixture(scope="module")
def w2v_file(tmp_path_factory):
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=4)
    words = ["the", "Paris", "<UNK>", "cat"]
    kv.add_vectors(words, np.arange(16, dtype=np.float32).reshape(4, 4))
    path = tmp_path_factory.mktemp("w2v") / "vectors.bin"
    kv.save_word2vec_format(str(path), binary=True)
    return path


def test_static_vectors_lookup_order(w2v_file):
    sv = StaticVectors.load(w2v_file)
    assert (sv.dim, len(sv), sv.unk) == (4, 4, "<UNK>")
    vocab = ["<pad>", "<unk>", "the", "THE", "paris", "Paris", "dog"]
    m = sv.matrix_for(vocab)
    assert m.shape == (7, 4) and m.dtype == torch.float32
    row = {w: np.arange(16, dtype=np.float32).reshape(4, 4)[i] for i, w in enumerate(["the", "Paris", "<UNK>", "cat"])}
    assert not m[0].any()  # padding: zeros
    assert m[1].tolist() == row["<UNK>"].tolist()  # <unk>: not in the table → its <UNK>
    assert m[2].tolist() == m[3].tolist() == row["the"].tolist()  # exact, then lower-cased
    assert m[4].tolist() == row["<UNK>"].tolist()  # "paris" is not "Paris": no upper-casing
    assert m[5].tolist() == row["Paris"].tolist() and m[6].tolist() == row["<UNK>"].tolist()
    assert sv.coverage(vocab) == pytest.approx(3 / 5)  # the, THE, Paris of the, THE, paris, Paris, dog
    assert StaticVectors.load(w2v_file.parent).dim == 4  # a word2vec folder


def test_static_vectors_without_unk_random_and_missing(tmp_path, monkeypatch):
    sv = StaticVectors(["a"], np.ones((1, 3)), unk="<UNK>")
    assert sv.unk is None and not sv.matrix_for(["b"]).any()  # no <UNK> in the table: zeros
    r1 = StaticVectors.random(["<pad>", "<unk>", "a", "b"], 300, seed=3)
    r2 = StaticVectors.random(["<pad>", "<unk>", "a", "b"], 300, seed=3)
    m = r1.matrix_for(["<pad>", "<unk>", "a", "b"])
    assert torch.equal(m, r2.matrix_for(["<pad>", "<unk>", "a", "b"])) and not m[0].any()
    assert not torch.equal(
        m, StaticVectors.random(["<pad>", "<unk>", "a", "b"], 300, seed=4).matrix_for(["<pad>", "<unk>", "a", "b"])
    )
    assert float(m[1:].norm(dim=1).mean()) == pytest.approx(1.0, abs=0.1)  # std 1/√dim: norm ≈ 1
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path))
    with pytest.raises(MissingFileError, match="zoo model 'elmokit-en' is not built.*elmokit zoo build en"):
        StaticVectors.load("elmokit-en")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"3 4\nnot really\n")
    with pytest.raises(DataError, match="not a readable word2vec binary"):
        StaticVectors.load(bad)


def test_build_vocab_is_deterministic():
    sents = [["b", "a", "c"], ["a", "b"], ["a", "<pad>"]]
    assert build_vocab(sents) == ["<pad>", "<unk>", "a", "b", "c"]
    assert build_vocab(list(reversed(sents))) == build_vocab(sents)
    assert build_vocab(sents, min_count=2) == ["<pad>", "<unk>", "a", "b"]
    assert build_vocab([TaggedSentence(("x",), ("O",), "f", 1)], specials=()) == ["x"]
    with pytest.raises(UsageError, match="min_count"):
        build_vocab(sents, min_count=0)


def test_num_threads_is_set_for_the_computation_and_restored(bilm, monkeypatch):
    seen = []
    real = features_module._embed_flat

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(features_module, "_embed_flat", spy)
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    compute_layer_features(bilm, SENTENCES[:2], num_threads=target)
    assert seen == [target] and torch.get_num_threads() == before
    with pytest.raises(UsageError, match="num_threads must be None or an int >= 1"):
        compute_layer_features(bilm, SENTENCES[:2], num_threads=0)
