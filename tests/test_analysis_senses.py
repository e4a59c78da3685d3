"""Sense separation (elmokit.analysis.senses): classifiers and scores on hand cases, the readers, the split, the static
baseline, the embedding cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import shared_path
from elmokit import Embedder
from elmokit.analysis.senses import (
    SenseExample,
    build_apple_set,
    centroid_predict,
    choose_static_settings,
    coarsewsd_senses,
    coarsewsd_words,
    cv_folds,
    example_vectors,
    group_split,
    layer_scores,
    macro_f1,
    mfs_scores,
    nn1_predict,
    read_coarsewsd,
    read_coarsewsd_baselines,
    recase,
    scores,
    static_context_vectors,
    truecase_table,
)
from elmokit.errors import DataError, InputError, MissingFileError, UsageError
from helpers import tiny_random_bilm


# ---------------------------------------------------------------------------------------------- classifiers
def test_1nn_and_centroid_differ_on_a_hand_2d_case():
    # sense a: two points near +x and one far out at (-1, 0.2) (an outlier); sense b: one point at (-1, -0.2)
    memory = np.array([[1.0, 0.0], [1.0, 0.1], [-1.0, 0.2], [-1.0, -0.2]])
    labels = ["a", "a", "a", "b"]
    queries = np.array([[-1.0, 0.3], [-1.0, -0.3], [2.0, 0.0]])
    # 1-NN: nearest by angle → the outlier a, b, a
    assert nn1_predict(memory, labels, queries).tolist() == ["a", "b", "a"]
    # centroid a = (1/3, 0.1/3) points right; centroid b = (-1, -0.2): both left queries go to b
    assert centroid_predict(memory, labels, queries).tolist() == ["b", "b", "a"]


def test_cosine_not_euclidean():
    memory = np.array([[10.0, 0.0], [0.0, 0.1]])
    assert nn1_predict(memory, ["far", "near"], np.array([[0.0, 5.0]])).tolist() == ["near"]  # angle, not length


def test_ties_go_to_the_most_frequent_sense():
    same = np.ones((5, 3))
    labels = ["rare", "common", "common", "common", "rare"]
    q = np.ones((2, 3))
    assert nn1_predict(same, labels, q).tolist() == ["common", "common"]
    assert centroid_predict(same, labels, q).tolist() == ["common", "common"]


def test_classifier_input_errors():
    with pytest.raises(InputError):
        nn1_predict(np.zeros((0, 2)), [], np.zeros((1, 2)))
    with pytest.raises(InputError):
        nn1_predict(np.zeros((2, 2)), ["a"], np.zeros((1, 2)))
    with pytest.raises(InputError):
        centroid_predict(np.zeros((2, 2)), ["a", "b"], np.zeros((1, 3)))


def test_macro_f1_hand_case():
    t = ["a", "a", "a", "b"]
    p = ["a", "a", "b", "b"]
    f_a, f_b = 2 * 1 * (2 / 3) / (1 + 2 / 3), 2 * 0.5 * 1 / 1.5  # 0.8 and 2/3
    assert macro_f1(t, p) == pytest.approx((f_a + f_b) / 2)
    assert macro_f1(t, p, ["a", "b", "c"]) == pytest.approx((f_a + f_b + 0) / 3)  # a sense never seen counts 0
    s = scores(t, p)
    assert s["accuracy"] == 0.75
    with pytest.raises(InputError):
        macro_f1(["a"], [])


def test_mfs_scores():
    s = mfs_scores(["x", "x", "y"], ["x", "y", "y", "y"], ["x", "y"])
    assert s["accuracy"] == 0.25
    assert s["macro_f1"] == pytest.approx((2 * 0.25 * 1 / 1.25 + 0) / 2)


def test_layer_scores_keys_and_values():
    mem = np.zeros((4, 2, 2))
    mem[:, 0] = 1.0  # layer 0: all the same vector → MFS
    mem[:, 1] = [[1, 0], [1, 0.1], [0, 1], [0.1, 1]]
    q = np.zeros((2, 2, 2))
    q[:, 0] = 1.0
    q[:, 1] = [[1, 0.05], [0.05, 1]]
    r = layer_scores(mem, ["a", "a", "b", "b"], q, ["a", "b"], ["a", "b"])
    assert set(r) == {"0", "1", "average"}
    assert r["1"]["1nn"]["accuracy"] == 1.0 and r["1"]["centroid"]["macro_f1"] == 1.0
    assert r["0"]["1nn"]["accuracy"] == 0.5  # equally frequent senses tie: the first memory entry's for all
    with pytest.raises(InputError):
        layer_scores(mem, ["a"] * 4, q[:, :1], ["a", "b"])


# ---------------------------------------------------------------------------------------------- split
def _examples(n_a=10, n_b=4, per_group=2):
    out = []
    for sense, n in (("a", n_a), ("b", n_b)):
        for g in range(n):
            for k in range(per_group):
                out.append(SenseExample(("w", str(k)), 0, 1, sense, f"{sense}{g}"))
    return out


def test_group_split_never_shares_a_group_and_is_stratified_and_seeded():
    ex = _examples()
    mem, q = group_split(ex, 0.5, seed=3)
    assert not {e.group for e in mem} & {e.group for e in q}
    assert len(mem) + len(q) == len(ex)
    for sense, n in (("a", 10), ("b", 4)):
        assert len({e.group for e in q if e.label == sense}) == n // 2
    assert group_split(ex, 0.5, seed=3) == (mem, q)
    assert group_split(ex, 0.5, seed=4) != (mem, q)
    # two groups of a sense: one each side, even with a small fraction
    mem, q = group_split(_examples(2, 2), 0.1, seed=0)
    assert {e.label for e in mem} == {e.label for e in q} == {"a", "b"}


def test_group_split_errors():
    with pytest.raises(UsageError):
        group_split(_examples(), 1.0)
    bad = [SenseExample(("w",), 0, 1, "a", "g"), SenseExample(("w",), 0, 1, "b", "g")]
    with pytest.raises(DataError, match="two senses"):
        group_split(bad)


def test_cv_folds_keep_groups_apart():
    ex = _examples(6, 6, 3)
    folds = cv_folds([e.label for e in ex], [e.group for e in ex], 3, 0)
    assert len(folds) == 3
    for tr, te in folds:
        assert not {ex[i].group for i in tr} & {ex[i].group for i in te}
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(len(ex)))
    with pytest.raises(DataError, match="at least 2 groups"):
        cv_folds(["a"], ["g"], 5)
    with pytest.raises(UsageError, match="folds >= 2"):
        cv_folds([e.label for e in ex], [e.group for e in ex], 1)


def _labelled(counts):
    """labels, groups: ``counts[label]`` examples of each label, each example its own group."""
    labels = [label for label, n in counts.items() for _ in range(n)]
    return labels, [f"g{i}" for i in range(len(labels))]


def test_cv_folds_lowered_to_the_rarest_sense():
    # every sense has fewer examples than folds=5: scikit-learn raised "n_splits=5 cannot be greater than the number
    # of members in each class"; now 3 folds (the rarest sense's 3 groups), each test fold holding both senses
    labels, groups = _labelled({"a": 4, "b": 3})
    folds = cv_folds(labels, groups, 5, 0)
    assert len(folds) == 3
    for _, te in folds:
        assert {labels[i] for i in te} == {"a", "b"}
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(7))
    # a rare sense beside a common one: 3 folds, not 5 with two test folds lacking the rare sense
    labels, groups = _labelled({"a": 10, "b": 3})
    folds = cv_folds(labels, groups, 5, 0)
    assert len(folds) == 3 and all("b" in {labels[i] for i in te} for _, te in folds)
    # groups, not examples, count: sense b has 4 examples but only 2 groups → 2 folds
    labels = ["a"] * 6 + ["b"] * 4
    groups = [f"a{i}" for i in range(6)] + ["b0", "b0", "b1", "b1"]
    assert len(cv_folds(labels, groups, 5, 0)) == 2
    # never below 2: a sense with a single group
    labels, groups = _labelled({"a": 6, "b": 1})
    assert len(cv_folds(labels, groups, 5, 0)) == 2
    # impossible: no sense with 2 examples
    with pytest.raises(DataError, match="at least 2 examples"):
        cv_folds(*_labelled({"a": 1, "b": 1}), 5, 0)
    with pytest.raises(UsageError):
        cv_folds(["a", "b"], ["g"], 2)


# ---------------------------------------------------------------------------------------------- casing
def test_truecase_and_recase():
    counts = {"Java": 5, "java": 2, "the": 9, "The": 3, "Bank": 1, "bank": 1}
    table = truecase_table(counts.items())
    assert table == {"java": "Java", "the": "the", "bank": "Bank"}  # a tie: the spelling that sorts first
    # any mapping of counts, not only a Counter (a dict raised "too many values to unpack")
    assert truecase_table(counts) == table
    assert truecase_table({"London": 5, "london": 1}) == {"london": "London"}
    from types import MappingProxyType

    assert truecase_table(MappingProxyType({"London": 1, "london": 3})) == {"london": "london"}
    toks = ("the", "java", "island")
    assert recase(toks, "lower") == toks
    assert recase(toks, "first") == ("The", "java", "island")
    assert recase(toks, "truecase", table) == ("the", "Java", "island")
    with pytest.raises(UsageError):
        recase(toks, "truecase")
    with pytest.raises(UsageError):
        recase(toks, "upper")


# ---------------------------------------------------------------------------------------------- static baseline
@pytest.fixture(scope="module")
def kv():
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=2)
    kv.add_vectors(
        ["money", "River", "bank", "loan", "water"],
        np.array([[1, 0], [0, 1], [1, 1], [2, 0], [0, 3]], dtype=np.float32),
    )
    return kv


def test_static_context_vectors_hand_values(kv):
    ex = [
        SenseExample(("money", "x", "bank", "loan", "water"), 2, 3, "m", "g0"),
        SenseExample(("river", "bank"), 1, 2, "r", "g1"),  # "river" → "River" (capitalised fallback)
        SenseExample(("zzz", "bank"), 1, 2, "r", "g2"),
    ]  # nothing known in the window → zeros
    v = static_context_vectors(kv, ex, window=1, include_target=False)
    np.testing.assert_allclose(v[0], [2, 0])  # only "loan" (x unknown)
    np.testing.assert_allclose(v[1], [0, 1])
    np.testing.assert_allclose(v[2], [0, 0])
    v = static_context_vectors(kv, ex, window=None, include_target=True)
    np.testing.assert_allclose(v[0], np.mean([[1, 0], [1, 1], [2, 0], [0, 3]], axis=0))
    with pytest.raises(UsageError):
        static_context_vectors(kv, ex, window=-1)


def test_choose_static_settings_uses_the_memory_only_and_picks_the_window_that_separates(kv):
    # the sense shows only 2+ tokens away from the target: window 1 sees nothing useful, window 2 does
    mem = []
    for g in range(6):
        mem.append(SenseExample(("money", "x", "bank", "x", "loan"), 2, 3, "fin", f"f{g}"))
        mem.append(SenseExample(("water", "x", "bank", "x", "River"), 2, 3, "riv", f"r{g}"))
    grid = [{"window": 1, "include_target": False}, {"window": 2, "include_target": False}]
    best = choose_static_settings(kv, mem, ["fin", "riv"], grid=grid, folds=3)
    assert best["1nn"]["settings"] == {"window": 2, "include_target": False}
    assert best["centroid"]["cv_macro_f1"] == 1.0


def test_choose_static_settings_with_a_rare_sense(kv):
    # 4 + 3 examples, folds=5: scikit-learn's "n_splits=5 cannot be greater than the number of members in each
    # class" crashed this; the folds are now lowered to 3 (the rare sense's groups)
    mem = [SenseExample(("money", "x", "bank", "x", "loan"), 2, 3, "fin", f"f{g}") for g in range(4)]
    mem += [SenseExample(("water", "x", "bank", "x", "River"), 2, 3, "riv", f"r{g}") for g in range(3)]
    grid = [{"window": 1, "include_target": False}, {"window": 2, "include_target": False}]
    best = choose_static_settings(kv, mem, ["fin", "riv"], grid=grid, folds=5)
    assert best["1nn"] == {"settings": {"window": 2, "include_target": False}, "cv_macro_f1": 1.0}


# ---------------------------------------------------------------------------------------------- readers
def _coarse(tmp_path, data="1\ta bank b\n0\tbank c\n", gold="0\n1\n"):
    d = tmp_path / "cw" / "bank"
    d.mkdir(parents=True)
    (d / "classes_map.txt").write_text(json.dumps({"0": "bank_bank", "1": "bank_bank_(geography)"}))
    (d / "train.data.txt").write_text(data)
    (d / "train.gold.txt").write_text(gold)
    return tmp_path / "cw"


def test_read_coarsewsd_small_folder(tmp_path):
    root = _coarse(tmp_path)
    assert coarsewsd_words(root) == ["bank"]
    assert coarsewsd_senses(root, "bank") == ["bank_bank", "bank_bank_(geography)"]
    ex = read_coarsewsd(root, "bank", "train")
    assert ex == [
        SenseExample(("a", "bank", "b"), 1, 2, "bank_bank", "bank/train/1"),
        SenseExample(("bank", "c"), 0, 1, "bank_bank_(geography)", "bank/train/2"),
    ]


@pytest.mark.parametrize(
    "data, gold, message",
    [
        ("5\ta bank\n", "0\n", r"train.data.txt:1: target index '5'"),
        ("0\ta\n", "0\n1\n", "has 1 lines but"),
        ("0\ta\n", "7\n", r"train.gold.txt:1: class 7"),
        ("x\ta\n", "0\n", r"train.data.txt:1: expected"),
    ],
)
def test_read_coarsewsd_errors_name_file_and_line(tmp_path, data, gold, message):
    root = _coarse(tmp_path, data, gold)
    with pytest.raises(DataError, match=message):
        read_coarsewsd(root, "bank", "train")


def test_read_coarsewsd_missing(tmp_path):
    with pytest.raises(MissingFileError):
        read_coarsewsd(tmp_path, "bank", "train")
    with pytest.raises(UsageError):
        read_coarsewsd(_coarse(tmp_path), "bank", "dev")


def test_read_coarsewsd_shared_bank_and_baselines():
    root = shared_path("data", "coarsewsd-20")
    assert len(coarsewsd_words(root)) == 20
    train, test = read_coarsewsd(root, "bank", "train"), read_coarsewsd(root, "bank", "test")
    assert (len(train), len(test)) == (1107, 455)
    assert sum(e.label == "bank_bank_(geography)" for e in test) == 22
    assert all(e.tokens[e.start].startswith("bank") for e in train)
    base = read_coarsewsd_baselines(root / "SOURCE.md")
    assert base["rows"]["avg"]["1NN BERT-base"] == (94.0, 91.0)
    assert base["rows"]["bank"]["MFS (train)"] == (95.2, 48.8)
    assert len(base["rows"]) == 21


def test_build_apple_set_small_csv(tmp_path):
    csv = tmp_path / "shop.csv"
    csv.write_text(
        "cat,label,review\n"
        "水果,1,\ufeff苹果 很 甜。苹果 好\n"
        "平板,0,比 苹果 差\n"
        "平板,1,苹果手机 好\n"
        "酒店,1,苹果 免费\n"
        "衣服,1,没有 水果\n",
        encoding="utf-8",
    )

    def tokenize(text):
        return [s.split() for s in text.split("。") if s.split()]

    data = build_apple_set(csv, tokenize)
    assert [(e.tokens, e.start, e.label, e.group) for e in data.examples] == [
        (("苹果", "很", "甜"), 0, "fruit", "row2"),
        (("苹果", "好"), 0, "fruit", "row2"),
        (("比", "苹果", "差"), 1, "Apple", "row3"),
    ]
    st = data.stats
    assert st["reviews_with_word_token"] == {"水果": 1, "平板": 1}
    assert st["reviews_only_inside_other_token"] == {"平板": 1}
    assert st["longer_tokens_holding_word"] == {"苹果手机": 1}
    assert st["reviews_in_other_categories"] == {"酒店": 1}
    assert st["occurrences_per_sense"] == {"fruit": 2, "Apple": 1}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(DataError, match="header"):
        build_apple_set(bad, tokenize)


# ---------------------------------------------------------------------------------------------- embedding cache
def test_example_vectors_cache_reuses_and_keys_on_input(tmp_path):
    emb = Embedder(tiny_random_bilm(0), batch_size=4)
    ex = [SenseExample(("the", "bank", "is", "open"), 1, 2, "m", "g0"), SenseExample(("a", "bank"), 1, 2, "r", "g1")]
    first = example_vectors(emb, ex, context=1, cache_dir=tmp_path, model_key="k")
    np.testing.assert_allclose(first[0], emb.embed_sentence(["the", "bank", "is"])[:, 1], atol=1e-5)
    files = list(tmp_path.glob("*.npy"))
    assert len(files) == 1
    np.save(files[0], np.full_like(first, 7.0))  # the cache is what is read back the second time
    assert (example_vectors(emb, ex, context=1, cache_dir=tmp_path, model_key="k") == 7.0).all()
    again = example_vectors(emb, ex, context=2, cache_dir=tmp_path, model_key="k")  # another key: recomputed
    assert not (again == 7.0).any() and len(list(tmp_path.glob("*.npy"))) == 2
    example_vectors(emb, ex, context=1, cache_dir=tmp_path, model_key="other")
    assert len(list(tmp_path.glob("*.npy"))) == 3
