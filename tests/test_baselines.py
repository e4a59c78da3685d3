"""The classical baselines: interpolated Kneser-Ney (checked against nltk.lm and by hand) and word2vec."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elmokit.baselines import KneserNeyLM, kneser_ney_perplexity, load_word2vec, train_word2vec
from elmokit.errors import DataError, InputError, MissingFileError, UsageError
from elmokit.vocabulary import BOS, EOS, UNK, Vocabulary

WORDS = "the a cat dog sat ran on mat big red".split()


def _corpus(n: int, seed: int, words=WORDS, max_len: int = 7) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    # a Zipf-ish choice so that some words are frequent and some rare (rare ones become <UNK> at min_count 2)
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    return [list(rng.choice(words, size=int(rng.integers(0, max_len)), p=weights)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------- against nltk
def _nltk_model(train, vocab: Vocabulary, order: int, discount: float):
    """nltk's KneserNeyInterpolated fitted on exactly the events our model counts: each sentence padded as
    <S>^(n-1) w1 … wm </S> and cut into nltk's everygrams, minus the n-grams made of padding alone (nltk's own
    pad_both_ends would add n-1 end symbols and count <S>, <S> <S>, … too; see test_nltk_padding_overcounts)."""
    from nltk.lm import KneserNeyInterpolated
    from nltk.lm import Vocabulary as NltkVocabulary
    from nltk.util import everygrams

    nltk_vocab = NltkVocabulary(vocab.tokens, unk_cutoff=1, unk_label=UNK)
    lm = KneserNeyInterpolated(order, discount=discount, vocabulary=nltk_vocab)
    text = []
    for s in train:
        padded = [BOS] * (order - 1) + list(s) + [EOS]
        text.append([g for g in everygrams(padded, max_len=order) if set(g) != {BOS}])
    lm.fit(text)
    return lm


@pytest.mark.parametrize("order,discount", [(2, 0.75), (3, 0.75), (3, 0.1), (4, 0.5)])
def test_probabilities_equal_nltk_kneser_ney_interpolated(order, discount):
    pytest.importorskip("nltk")
    train = _corpus(40, seed=1) + [["the", "cat", "sat", "on", "the", "mat"], ["the", "zebra", "ran"], ["quokka"]]
    test = _corpus(12, seed=2, words=WORDS + ["unseen", "words"])  # unknown words → <UNK>
    vocab = Vocabulary.build(train, min_count=2)
    assert "zebra" not in vocab and "cat" in vocab  # words seen once were cut: <UNK> is a training event
    ours = KneserNeyLM(vocab, order=order, discount=discount).fit(train)
    lm = _nltk_model(train, vocab, order, discount)

    # every left context of the test events (all orders: the full n-1 context and its shorter suffixes), plus
    # contexts never seen in training; each scored for every word of the vocabulary
    contexts = set()
    for s in test:
        padded = [BOS] * (order - 1) + [t if t in vocab else UNK for t in s] + [EOS]
        for j in range(order - 1, len(padded)):
            full = tuple(padded[j - order + 1 : j])
            for k in range(len(full) + 1):
                contexts.add(full[k:])
    contexts |= {("mat", "mat", "mat")[: order - 1], ("red",), ()}
    n_checked = 0
    for ctx in sorted(contexts):
        for w in vocab.tokens:
            assert ours.prob(w, ctx) == pytest.approx(lm.score(w, ctx), abs=1e-9, rel=0), (w, ctx)
            n_checked += 1
    assert n_checked > 100

    # the protocol's events: each target from its full left context, as nltk scores it
    p, sent = ours.target_probs(test)
    expected = []
    for s in test:
        padded = [BOS] * (order - 1) + list(s) + [EOS]
        expected += [lm.score(padded[j], tuple(padded[j - order + 1 : j])) for j in range(order - 1, len(padded))]
    np.testing.assert_allclose(p, expected, rtol=0, atol=1e-9)
    assert list(np.bincount(sent)) == [len(s) + 1 for s in test]


def test_nltk_padding_overcounts_start_context():
    """Why our padding differs from nltk's pad_both_ends: counting the padding-only n-grams (<S>, <S> <S>) makes the
    distribution after the sentence start sum to more than 1 in nltk; ours sums to 1."""
    pytest.importorskip("nltk")
    from nltk.lm import KneserNeyInterpolated
    from nltk.lm import Vocabulary as NltkVocabulary
    from nltk.lm.preprocessing import padded_everygram_pipeline

    train = _corpus(30, seed=3)
    vocab = Vocabulary.build(train, min_count=1)
    text, _ = padded_everygram_pipeline(3, train)
    lm = KneserNeyInterpolated(
        3, discount=0.75, vocabulary=NltkVocabulary(list(vocab) + ["<s>", "</s>"], unk_cutoff=1, unk_label=UNK)
    )
    lm.fit(text)
    nltk_total = sum(lm.score(w, ("<s>", "<s>")) for w in [*vocab.tokens, "<s>", "</s>"])
    assert nltk_total > 1 + 1e-6
    ours = KneserNeyLM(vocab, order=3, discount=0.75).fit(train)
    assert ours.distribution([BOS, BOS]).sum() == pytest.approx(1.0, abs=1e-12)


# ---------------------------------------------------------------------------------------------------- by hand
def test_hand_computed_bigram():
    """Order 2, D = 0.5, train "a b" and "b a b" (see the comments for the counts)."""
    train = [["a", "b"], ["b", "a", "b"]]
    vocab = Vocabulary.build(train)  # <S> </S> <UNK> b a
    lm = KneserNeyLM(vocab, order=2, discount=0.5).fit(train)
    # bigram types: <S>a <S>b ab b</S> ba → continuation unigram a 2/5, b 2/5, </S> 1/5, <S> 0, <UNK> 0
    assert lm.prob("a") == pytest.approx(2 / 5) and lm.prob("b") == pytest.approx(2 / 5)
    assert lm.prob(EOS) == pytest.approx(1 / 5) and lm.prob(BOS) == 0 and lm.prob(UNK) == 0
    # after b: c(b </S>) = 2, c(b a) = 1, c(b •) = 3, N1+(b •) = 2 → gamma = 0.5 · 2 / 3 = 1/3
    assert lm.prob(EOS, ["b"]) == pytest.approx(1.5 / 3 + 1 / 3 * 1 / 5)  # 17/30
    assert lm.prob("a", ["b"]) == pytest.approx(0.5 / 3 + 1 / 3 * 2 / 5)  # 9/30
    assert lm.prob("b", ["b"]) == pytest.approx(1 / 3 * 2 / 5)  # 4/30
    # after a: c(a b) = 2, N1+(a •) = 1 → gamma = 1/4
    assert lm.prob("b", ["a"]) == pytest.approx(1.5 / 2 + 1 / 4 * 2 / 5)  # 0.85
    # after <S>: c = 2, N1+ = 2 → gamma = 1/2: p(a | <S>) = 0.5/2 + 0.5 · 2/5 = 0.45
    assert lm.prob("a", [BOS]) == pytest.approx(0.45)
    # a context never seen before a word falls back to the unigram
    assert lm.prob("a", [EOS]) == pytest.approx(2 / 5)

    # the protocol on test sentence "a a": forward p(a|<S>) p(a|a) p(</S>|a) = 0.45 · 0.1 · 0.05; backward (the
    # model of the reversed training text "</S> b a <S>", "</S> b a b <S>") p(a|</S>) p(a|a) p(<S>|a) =
    # 0.05 · 0.1 · 0.45, the same product
    r = kneser_ney_perplexity(train, [["a", "a"]], vocab, order=2, discount=0.5)
    expected = (0.45 * 0.1 * 0.05) ** (-1 / 3)
    assert r["forward"] == pytest.approx(expected) and r["backward"] == pytest.approx(expected)
    assert r["average"] == pytest.approx(expected) and r["tokens"] == 3 and r["sentences"] == 1
    bwd = KneserNeyLM(vocab, order=2, discount=0.5, start=EOS, end=BOS).fit([s[::-1] for s in train])
    assert [bwd.prob("a", [EOS]), bwd.prob("a", ["a"]), bwd.prob(BOS, ["a"])] == pytest.approx([0.05, 0.1, 0.45])


def test_estimated_discount_is_n1_over_n1_plus_2n2():
    train = [["a", "b"], ["b", "a", "b"]]
    lm = KneserNeyLM(Vocabulary.build(train), order=2, discount="estimate").fit(train)
    # bigram counts <S>a 1, <S>b 1, ab 2, b</S> 2, ba 1: n1 = 3, n2 = 2
    assert lm.discounts == [pytest.approx(3 / 7)]
    assert lm.prob("a", [BOS]) == pytest.approx((1 - 3 / 7) / 2 + 3 / 7 * 2 / 2 * 2 / 5)


def test_hand_computed_modified_bigram():
    """Modified Kneser-Ney, order 2, (D1, D2, D3+) = (0.5, 1.0, 1.5), train "a b", "a b", "a a", "b"."""
    train = [["a", "b"], ["a", "b"], ["a", "a"], ["b"]]
    lm = KneserNeyLM(Vocabulary.build(train), order=2, discount=(0.5, 1.0, 1.5)).fit(train)
    # bigram types <S>a <S>b ab aa a</S> b</S> → continuation unigram a 2/6, b 2/6, </S> 2/6
    assert [lm.prob("a"), lm.prob("b"), lm.prob(EOS)] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    # after a: c(a b) = 2 (D2 = 1), c(a a) = 1, c(a </S>) = 1 (D1 = 0.5), c(a •) = 4; N1(a •) = 2, N2(a •) = 1
    # → gamma = (0.5 · 2 + 1.0 · 1) / 4 = 1/2
    assert lm.prob("b", ["a"]) == pytest.approx((2 - 1.0) / 4 + 0.5 / 3)
    assert lm.prob("a", ["a"]) == pytest.approx((1 - 0.5) / 4 + 0.5 / 3)
    assert lm.prob(EOS, ["a"]) == pytest.approx((1 - 0.5) / 4 + 0.5 / 3)
    # after <S>: c(<S> a) = 3 (D3+ = 1.5), c(<S> b) = 1; N1 = 1, N3+ = 1 → gamma = (0.5 + 1.5) / 4
    assert lm.prob("a", [BOS]) == pytest.approx((3 - 1.5) / 4 + 0.5 / 3)
    assert lm.prob("b", [BOS]) == pytest.approx((1 - 0.5) / 4 + 0.5 / 3)
    assert lm.discounts == [[0.5, 1.0, 1.5]]


def test_modified_discounts_are_chen_goodmans_estimates():
    """D1, D2, D3+ from the top order's counts of counts (counted here with a Counter), eq. 26 of Chen & Goodman."""
    from collections import Counter  # lazy: only this test counts by hand

    train = _corpus(400, seed=11)
    lm = KneserNeyLM(Vocabulary.build(train), order=2, discount="modified").fit(train)
    counts = Counter(g for s in train for g in zip([BOS, *s], [*s, EOS], strict=True))
    n1, n2, n3, n4 = (sum(1 for c in counts.values() if c == r) for r in (1, 2, 3, 4))
    y = n1 / (n1 + 2 * n2)
    assert lm.discounts == [pytest.approx([1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3])]


def test_modified_with_one_discount_is_plain_kneser_ney():
    """(D, D, D) discounts every count by D and frees D · N1+(h •): the plain model (checked against nltk above)."""
    train, test = _corpus(80, seed=6), _corpus(20, seed=7)
    vocab = Vocabulary.build(train, min_count=2)
    plain = kneser_ney_perplexity(train, test, vocab, order=3, discount=0.6)
    modified = kneser_ney_perplexity(train, test, vocab, order=3, discount=(0.6, 0.6, 0.6))
    assert modified["average"] == pytest.approx(plain["average"], rel=1e-12)
    words = [f"w{i}" for i in range(60)]
    big, big_test = _corpus(3000, seed=8, words=words, max_len=12), _corpus(50, seed=9, words=words, max_len=12)
    big_vocab = Vocabulary.build(big, min_count=2)
    estimated = kneser_ney_perplexity(big, big_test, big_vocab, order=3, discount="modified")
    assert len(estimated["discount"]) == 2 and all(len(d) == 3 for d in estimated["discount"])
    one = kneser_ney_perplexity(big, big_test, big_vocab, order=3, discount=(0.75, 0.75, 0.75))
    assert estimated["average"] != pytest.approx(one["average"], rel=1e-3)


def test_perplexity_averages_like_the_bilm():
    """average = exp(mean of the two directions' mean NLL), as bilm-tf/evaluate_perplexity average."""
    train, test = _corpus(60, seed=4), _corpus(15, seed=5)
    vocab = Vocabulary.build(train, min_count=2)
    r = kneser_ney_perplexity(train, test, vocab, order=3)
    assert r["tokens"] == sum(len(s) + 1 for s in test)
    assert r["average"] == pytest.approx(math.exp(0.5 * (math.log(r["forward"]) + math.log(r["backward"]))))
    assert r["forward"] != pytest.approx(r["backward"])  # the directions are different models
    assert 1 < r["average"] < len(vocab)


# ---------------------------------------------------------------------------------------------------- properties
@settings(max_examples=25, deadline=None)
@given(
    sentences=st.lists(st.lists(st.sampled_from("abcdef"), max_size=6), min_size=1, max_size=12),
    order=st.integers(2, 4),
    discount=st.sampled_from([0.1, 0.5, 0.75, 1.0, (0.5, 1.0, 1.5), (0.9, 1.9, 0.2)]),
)
def test_every_context_sums_to_one(sentences, order, discount):
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *"abcdef"])
    fwd = KneserNeyLM(vocab, order=order, discount=discount).fit(sentences)
    contexts = [[]]
    for s in sentences:
        padded = [BOS] * (order - 1) + s + [EOS]
        contexts += [padded[max(0, j - order + 1) : j] for j in range(1, len(padded) + 1)]
    contexts += [["a", "a", "a"], ["f", EOS], [UNK]]
    for ctx in contexts:
        dist = fwd.distribution(ctx)
        assert dist.shape == (len(vocab),) and (dist >= 0).all()
        assert dist.sum() == pytest.approx(1.0, abs=1e-12), ctx
        assert dist[vocab.bos_id] == 0  # the start symbol is never a forward target


def test_zero_probability_target_is_a_data_error():
    train = [["a", "b"], ["b", "a", "b"]]
    vocab = Vocabulary.build(train)  # min_count 1: no training token is <UNK>
    with pytest.raises(DataError, match=r"'c'.*<UNK>.*test sentence 0"):
        kneser_ney_perplexity(train, [["a", "c"]], vocab, order=2)


def test_bad_arguments():
    vocab = Vocabulary.build([["a"]])
    with pytest.raises(UsageError, match="order"):
        KneserNeyLM(vocab, order=1)
    with pytest.raises(UsageError, match="discount"):
        KneserNeyLM(vocab, discount=1.5)
    with pytest.raises(UsageError, match=r"\(D1, D2, D3\+\) with 0 < Dr <= r"):
        KneserNeyLM(vocab, discount=(0.5, 2.5, 1.0))
    with pytest.raises(UsageError, match="modified discounts"):
        KneserNeyLM(vocab, discount=(0.5, 1.0))
    with pytest.raises(DataError, match=r"counts of counts n1..n4 = \[2, 0, 0, 0\].*give fixed discounts"):
        KneserNeyLM(vocab, order=2, discount="modified").fit([["a"]])
    with pytest.raises(DataError, match=r"^the forward Kneser-Ney LM: cannot estimate the modified"):
        kneser_ney_perplexity([["a"]], [["a"]], vocab, order=2, discount="modified")
    # numpy numbers and arrays are numbers
    assert KneserNeyLM(vocab, discount=np.float32(0.5)).discount == 0.5
    assert KneserNeyLM(vocab, discount=np.array([0.5, 1.0, 1.5])).discount == (0.5, 1.0, 1.5)
    assert KneserNeyLM(vocab, discount=(np.int64(1), np.int64(2), np.float32(3))).discount == (1.0, 2.0, 3.0)
    with pytest.raises(UsageError, match="start token"):
        KneserNeyLM(vocab, start="<s>")
    with pytest.raises(UsageError, match="fit"):
        KneserNeyLM(vocab).prob("a")
    with pytest.raises(InputError, match="sentence 0 is a str"):
        KneserNeyLM(vocab).fit(["a b"])
    with pytest.raises(DataError, match="no training sentences"):
        KneserNeyLM(vocab).fit([])
    with pytest.raises(DataError, match="no test sentences"):
        kneser_ney_perplexity([["a"]], [], vocab)


# ---------------------------------------------------------------------------------------------------- word2vec
TINY_W2V = {"vector_size": 8, "epochs": 3, "min_count": 2}


def _w2v_corpus():
    return _corpus(200, seed=6) + [["zebra"]]  # "zebra" is seen once → <UNK>


def test_word2vec_is_bit_exact_and_round_trips(tmp_path):
    pytest.importorskip("gensim")
    a = train_word2vec(_w2v_corpus(), tmp_path / "a", **TINY_W2V)
    b = train_word2vec(_w2v_corpus(), tmp_path / "b", **TINY_W2V)
    assert a.read_bytes() == b.read_bytes()
    kv_a, kv_b = load_word2vec(a), load_word2vec(tmp_path / "b")  # the file or its folder
    assert kv_a.index_to_key == kv_b.index_to_key and UNK in kv_a.index_to_key and "zebra" not in kv_a
    assert kv_a.vectors.dtype == np.float32 and kv_a.vectors.shape == (len(kv_a.index_to_key), 8)
    np.testing.assert_array_equal(kv_a.vectors, kv_b.vectors)
    meta = json.loads((tmp_path / "a" / "word2vec.json").read_text())
    assert meta["settings"]["sg"] == 1 and meta["settings"]["workers"] == 1 and meta["settings"]["vector_size"] == 8
    assert meta["gensim_version"] and meta["vocabulary"] == len(kv_a.index_to_key)
    assert meta["tokens"] == sum(len(s) for s in _w2v_corpus())
    # saved vectors are the trained ones: retrain in memory with the same settings and compare
    from gensim.models import Word2Vec

    from elmokit.baselines.word2vec import WORD2VEC_SETTINGS

    cfg = {**WORD2VEC_SETTINGS, **TINY_W2V}
    del cfg["min_count"]
    counts = {}
    for s in _w2v_corpus():
        for t in s:
            counts[t] = counts.get(t, 0) + 1
    mapped = [[t if counts[t] >= 2 else UNK for t in s] for s in _w2v_corpus()]
    model = Word2Vec(sentences=mapped, min_count=1, **cfg)
    for w in kv_a.index_to_key:
        np.testing.assert_array_equal(kv_a[w], model.wv[w])


def test_word2vec_does_not_depend_on_the_hash_seed(tmp_path):
    """A rebuild in another process (another PYTHONHASHSEED, so another str hash and set order) gives the same bytes."""
    pytest.importorskip("gensim")
    here = train_word2vec(_w2v_corpus(), tmp_path / "here", **TINY_W2V)
    script = (
        "import sys; sys.path.insert(0, sys.argv[2]); from test_baselines import _w2v_corpus, TINY_W2V; "
        "from elmokit.baselines import train_word2vec; train_word2vec(_w2v_corpus(), sys.argv[1], **TINY_W2V)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "there"), os.path.dirname(__file__)],
        check=True,
        env=env,
        timeout=120,
    )
    assert (tmp_path / "there" / "vectors.bin").read_bytes() == here.read_bytes()


def test_word2vec_errors(tmp_path):
    with pytest.raises(UsageError, match="workers must be 1"):
        train_word2vec([["a"]], tmp_path, workers=2)
    with pytest.raises(UsageError, match="unknown setting"):
        train_word2vec([["a"]], tmp_path, dimension=3)
    with pytest.raises(InputError, match="sentence 0 is a str"):
        train_word2vec(["a b"], tmp_path)
    with pytest.raises(MissingFileError, match="vectors.bin"):
        load_word2vec(tmp_path / "nothing")


def test_import_elmokit_baselines_and_zoo_is_light():
    code = (
        "import sys, elmokit.baselines, elmokit.recipes.zoo; "
        "print(any(m in sys.modules for m in ('gensim', 'nltk', 'jieba', 'sacremoses')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def test_orders_agree_on_unigram_fallback():
    """A context whose every suffix is unseen gives the continuation unigram at any order."""
    train = _corpus(30, seed=7)
    vocab = Vocabulary.build(train)
    for order, ctx in product((2, 3, 4), ([EOS], [EOS, EOS, EOS])):
        lm = KneserNeyLM(vocab, order=order).fit(train)
        np.testing.assert_allclose(lm.distribution(ctx), lm.distribution([]), rtol=0, atol=1e-15)
