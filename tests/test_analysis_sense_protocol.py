"""The fair sense protocol (elmokit.analysis.sense_protocol): the choice reads train only, grouped folds, the probe's
grid, the concatenation, hand-computed scores, window pooling; a few real CoarseWSD-20 lines end to end."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_path
from elmokit import Embedder
from elmokit.analysis.sense_protocol import (
    PROBE_DEFAULT,
    PROBE_GRID,
    choose,
    concat_vectors,
    cv_macro_f1,
    elmo_candidates,
    fair_protocol,
    predict,
    probe_predict,
    score_choices,
    select_settings,
    static_candidates,
    static_setting_name,
    window_vectors,
)
from elmokit.analysis.senses import SenseExample, choose_static_settings, cv_folds, example_vectors, read_coarsewsd
from elmokit.errors import InputError, UsageError
from helpers import tiny_random_bilm


class RecordingMapping(dict):
    """A dict that records which keys were read (test arrays the protocol touches)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list = []

    def __getitem__(self, key):
        self.read.append(key)
        return super().__getitem__(key)


def _synthetic(n_per_sense=24, seed=0, dim=6):
    """Two senses; family "elmo": 'signal' separates them (sense shifts dim 0), 'noise' does not; family "word2vec":
    'weak' separates them a little, 'none' is noise. Groups of 2 occurrences."""
    rng = np.random.default_rng(seed)
    y = np.array(["a"] * n_per_sense + ["b"] * n_per_sense, dtype=object)
    groups = [f"{lab}{i // 2}" for i, lab in enumerate(y)]
    shift = np.where(y == "a", 2.0, -2.0)[:, None] * np.eye(dim)[0]
    fam = {
        "elmo": {"noise": rng.normal(size=(len(y), dim)), "signal": rng.normal(size=(len(y), dim)) + shift},
        "word2vec": {"none": rng.normal(size=(len(y), 4)), "weak": rng.normal(size=(len(y), 4)) + shift[:, :4] / 3},
    }
    return fam, y, groups


# ---------------------------------------------------------------------------------------------- the choice
def test_choice_reads_train_only_and_test_labels_or_vectors_do_not_change_it():
    train, y_tr, g_tr = _synthetic(seed=0)
    test, y_te, _ = _synthetic(n_per_sense=10, seed=1)
    rec = {f: RecordingMapping(c) for f, c in test.items()}
    res = fair_protocol(train, rec, y_tr, g_tr, y_te, ["a", "b"])
    choices = res["choices"]
    assert {choices["elmo"][c]["setting"] for c in ("1nn", "centroid", "probe")} == {"signal"}
    # only the chosen setting's test array is read, once per classifier (the concat reads both parts' choices)
    assert set(rec["elmo"].read) == {"signal"} and set(rec["word2vec"].read) <= {"weak", "none"}
    assert len(rec["elmo"].read) == 6  # 3 classifiers on their own + 3 as the concat's first part
    # select_settings takes no test data; shuffled test labels and perturbed test vectors change no choice
    assert select_settings(train, y_tr, g_tr, ["a", "b"]) == choices
    rng = np.random.default_rng(5)
    shuffled = fair_protocol(train, test, y_tr, g_tr, rng.permutation(y_te), ["a", "b"])
    noisy = {f: {k: v + rng.normal(size=v.shape) * 10 for k, v in c.items()} for f, c in test.items()}
    perturbed = fair_protocol(train, noisy, y_tr, g_tr, y_te, ["a", "b"])
    assert shuffled["choices"] == choices and perturbed["choices"] == choices
    assert shuffled["families"]["elmo"]["1nn"]["macro_f1"] != res["families"]["elmo"]["1nn"]["macro_f1"]
    # ...whereas changing the train labels does change what is measured
    flipped = select_settings(train, rng.permutation(y_tr), g_tr, ["a", "b"])
    assert flipped["elmo"]["1nn"]["cv"] != choices["elmo"]["1nn"]["cv"]


def test_grouped_folds_keep_groups_apart_so_a_group_memorising_setting_loses():
    # 'leaky' gives both occurrences of a group the same random vector and carries no sense signal: with folds that
    # split a group, 1-NN would find the twin and score 1.0; with grouped folds it is at chance and loses to 'honest'
    rng = np.random.default_rng(0)
    n_groups = 40
    y = np.repeat(np.array(["a", "b"] * (n_groups // 2), dtype=object), 2)
    groups = [f"g{i // 2}" for i in range(len(y))]
    per_group = rng.normal(size=(n_groups, 8))
    leaky = np.repeat(per_group, 2, axis=0)
    honest = rng.normal(size=(len(y), 8)) + np.where(y == "a", 1.0, -1.0)[:, None] * np.eye(8)[0]
    folds = cv_folds(y, groups, 5, 0)
    for tr, te in folds:
        assert not {groups[i] for i in tr} & {groups[i] for i in te}
    got = choose({"leaky": leaky, "honest": honest}, y, ["a", "b"], folds, "1nn")
    assert got["setting"] == "honest" and got["cv"]["leaky"] < 0.75
    idx = np.arange(len(y))  # folds by position mod 5 put a group's two (adjacent) occurrences in different folds
    ungrouped = [(idx[idx % 5 != k], idx[idx % 5 == k]) for k in range(5)]
    assert cv_macro_f1(leaky, y, ["a", "b"], ungrouped, "1nn") == 1.0  # what grouping prevents
    train = {"elmo": {"leaky": leaky, "honest": honest}}
    assert select_settings(train, y, groups, ["a", "b"], concat=None)["elmo"]["1nn"]["cv"] == got["cv"]


def test_word2vec_choice_is_the_old_choose_static_settings(kv_small):
    # the old protocol's word2vec row is read off the fair protocol's word2vec choice: same grid, folds, tie rule
    rng = np.random.default_rng(0)
    words = ["money", "loan", "water", "River", "x", "y"]
    mem = []
    for g in range(24):  # noisy contexts: the settings score differently (chosen: ±10 target in, ±5 target out)
        sense = "fin" if g % 2 else "riv"
        pool = words[:2] if sense == "fin" else words[2:4]
        toks = [str(rng.choice(pool if rng.random() < 0.3 else words)) for _ in range(12)]
        mem.append(SenseExample(tuple(toks[:6] + ["bank"] + toks[6:]), 6, 7, sense, f"g{g}"))
    old = choose_static_settings(kv_small, mem, ["fin", "riv"], folds=4)
    assert {old[c]["settings"]["window"] for c in old} == {10, 5} and old["1nn"]["cv_macro_f1"] < 1
    folds = cv_folds([e.label for e in mem], [e.group for e in mem], 4, 0)
    cands = static_candidates(kv_small, mem)
    for clf in ("1nn", "centroid"):
        new = choose(cands, [e.label for e in mem], ["fin", "riv"], folds, clf)
        assert new["setting"] == static_setting_name(old[clf]["settings"])
        assert new["cv_macro_f1"] == old[clf]["cv_macro_f1"]


@pytest.fixture(scope="module")
def kv_small():
    from gensim.models import KeyedVectors

    kv = KeyedVectors(vector_size=3)
    vecs = np.array([[1, 0, 0], [2, 0.5, 0], [0, 1, 0], [0, 2, 0.5], [0, 0, 1], [0.3, 0.3, 1]], dtype=np.float32)
    kv.add_vectors(["money", "loan", "water", "River", "bank", "x"], vecs)
    return kv


def test_probe_params_are_the_grid_argmax_on_train():
    train, y, groups = _synthetic(seed=3)
    folds = cv_folds(y, groups, 5, 0)
    got = choose(train["word2vec"], y, ["a", "b"], folds, "probe")
    stage1 = {k: cv_macro_f1(v, y, ["a", "b"], folds, "probe", PROBE_DEFAULT) for k, v in train["word2vec"].items()}
    assert got["setting"] == max(stage1, key=stage1.get) == "weak"
    manual = [cv_macro_f1(train["word2vec"]["weak"], y, ["a", "b"], folds, "probe", p) for p in PROBE_GRID]
    assert got["params"] == PROBE_GRID[int(np.argmax(manual))]
    assert got["cv_macro_f1"] == max(manual) and [s for _, s in got["cv_params"]] == manual
    one = [{"C": 0.5, "class_weight": None}]
    assert choose(train["word2vec"], y, ["a", "b"], folds, "probe", one)["params"] == one[0]
    assert choose(train["word2vec"], y, ["a", "b"], folds, "1nn")["params"] == {}  # no grid for 1-NN


def test_probe_predicts_a_separable_case_and_checks_input():
    x = np.array([[-3.0], [-2.0], [-1.0], [1.0], [2.0], [3.0]])
    y = ["n", "n", "n", "p", "p", "p"]
    assert list(probe_predict(x, y, np.array([[-5.0], [0.5], [4.0]]), C=10.0)) == ["n", "p", "p"]
    assert list(probe_predict(x, ["n"] * 6, np.array([[9.0]]))) == ["n"]  # one sense: nothing to fit
    assert probe_predict(x, y, np.zeros((0, 1))).shape == (0,)
    with pytest.raises(UsageError):
        probe_predict(x, y, x, C=0.0)
    with pytest.raises(InputError):
        probe_predict(x, y[:5], x)
    with pytest.raises(UsageError):
        predict("svm", x, y, x)


def test_macro_f1_hand_case_through_score_choices():
    mem = {"elmo": {"s": np.array([[1.0, 0.0], [0.0, 1.0]])}}
    q = {"elmo": {"s": np.array([[1.0, 0.1], [0.1, 1.0], [0.0, 1.0], [0.2, 1.0]])}}
    choices = {"elmo": {"1nn": {"setting": "s", "params": {}, "cv_macro_f1": 0.0}}}
    got = score_choices(choices, mem, q, ["a", "b"], ["a", "a", "b", "b"], ["a", "b"], concat=None)["elmo"]["1nn"]
    # predictions a, b, b, b: F1(a) = 2·1·½/(1 + ½) = 2/3; F1(b): P = 2/3, R = 1 → 0.8; macro = (2/3 + 0.8) / 2
    assert got["macro_f1"] == pytest.approx((2 / 3 + 0.8) / 2) and got["accuracy"] == 0.75
    # a sense of the word that is never predicted nor true still counts, as 0
    got3 = score_choices(choices, mem, q, ["a", "b"], ["a", "a", "b", "b"], ["a", "b", "c"], None)["elmo"]["1nn"]
    assert got3["macro_f1"] == pytest.approx((2 / 3 + 0.8) / 3)


# ---------------------------------------------------------------------------------------------- representations
def test_concat_width_unit_parts_and_cosine_is_the_mean_of_the_parts():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 7)) * 30, rng.normal(size=(5, 3)) * 0.01
    b[2] = 0.0
    c = concat_vectors(a, b)
    assert c.shape == (5, 10) and c.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(c[:, :7], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(c[:, 7:], axis=1), [1, 1, 0, 1, 1], rtol=1e-6)

    def cos(u, v):
        return u @ v / np.linalg.norm(u) / np.linalg.norm(v)

    assert cos(c[0], c[1]) == pytest.approx((cos(a[0], a[1]) + cos(b[0], b[1])) / 2, rel=1e-5)
    with pytest.raises(InputError):
        concat_vectors(a, b[:4])


def test_elmo_candidates_layers_and_mixes():
    arr = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    got = elmo_candidates({0: arr, 2: arr + 1})
    assert list(got)[:5] == ["layer 0, ±0", "layer 1, ±0", "layer 2, ±0", "average 0-2, ±0", "average 1-2, ±0"]
    assert len(got) == 10
    np.testing.assert_array_equal(got["layer 1, ±2"], arr[:, 1] + 1)
    np.testing.assert_allclose(got["average 1-2, ±0"], (arr[:, 1] + arr[:, 2]) / 2)
    np.testing.assert_allclose(got["average 0-2, ±0"], arr.mean(axis=1))
    with pytest.raises(InputError):
        elmo_candidates({0: arr, 1: arr[:, :2]})


def test_window_vectors_pool_neighbours_and_cache(tmp_path, one_thread):
    emb = Embedder(tiny_random_bilm(0), batch_size=4)
    ex = [
        SenseExample(("the", "bank", "is", "open", "now"), 1, 2, "m", "g0"),
        SenseExample(("a", "bank"), 1, 2, "r", "g1"),
    ]
    got = window_vectors(emb, ex, (0, 1), context=2, cache_dir=tmp_path, model_key="k")
    np.testing.assert_allclose(got[0], example_vectors(emb, ex, context=2), atol=1e-6)
    full = emb.embed_sentence(["the", "bank", "is", "open"])  # context 2 cuts "now"
    np.testing.assert_allclose(got[1][0], full[:, 0:3].mean(axis=1), atol=1e-5)
    np.testing.assert_allclose(got[1][1], emb.embed_sentence(["a", "bank"]).mean(axis=1), atol=1e-5)
    files = list(tmp_path.glob("*.npy"))
    assert len(files) == 1
    np.save(files[0], np.full((2, 2, 3, 16), 7.0, dtype=np.float32))
    assert (window_vectors(emb, ex, (0, 1), context=2, cache_dir=tmp_path, model_key="k")[1] == 7.0).all()
    with pytest.raises(UsageError):
        window_vectors(emb, ex, (0, -1))


# ---------------------------------------------------------------------------------------------- real lines
def test_real_coarsewsd_lines_end_to_end(one_thread):
    from gensim.models import Word2Vec

    root = shared_path("data", "coarsewsd-20")
    train, test = read_coarsewsd(root, "digit", "train"), read_coarsewsd(root, "digit", "test")[:20]
    senses = sorted({e.label for e in train})
    w2v = Word2Vec([list(e.tokens) for e in train], vector_size=8, min_count=1, seed=0, workers=1, epochs=2).wv
    emb = Embedder(tiny_random_bilm(0), batch_size=32)
    grid = [{"window": 2, "include_target": False}, {"window": None, "include_target": True}]
    fam_tr = {"elmo": elmo_candidates(window_vectors(emb, train, (0, 2), context=8)),
              "word2vec": static_candidates(w2v, train, grid)}  # fmt: skip
    fam_te = {"elmo": elmo_candidates(window_vectors(emb, test, (0, 2), context=8)),
              "word2vec": static_candidates(w2v, test, grid)}  # fmt: skip
    y_tr, g_tr, y_te = [e.label for e in train], [e.group for e in train], [e.label for e in test]
    grid_p = PROBE_GRID[:2]
    res = fair_protocol(fam_tr, fam_te, y_tr, g_tr, y_te, senses, probe_grid=grid_p)
    again = fair_protocol(fam_tr, fam_te, y_tr, g_tr, list(np.random.default_rng(0).permutation(y_te)), senses,
                          probe_grid=grid_p)  # fmt: skip
    assert again["choices"] == res["choices"]
    for clf in ("1nn", "centroid", "probe"):
        assert res["families"]["elmo"][clf]["setting"] in fam_tr["elmo"]
        assert res["families"]["word2vec"][clf]["setting"] in {"±2, target out", "sentence, target in"}
        e, s = res["families"]["elmo"][clf]["setting"], res["families"]["word2vec"][clf]["setting"]
        assert res["families"]["concat"][clf]["setting"] == f"{e} + {s}"
        assert 0.0 <= res["families"]["concat"][clf]["macro_f1"] <= 1.0
    assert res["choices"]["elmo"]["probe"]["params"] in grid_p
    assert res["mfs"]["accuracy"] == pytest.approx(np.mean([y == senses_mfs(y_tr) for y in y_te]))


def senses_mfs(labels):
    return max(sorted(set(labels)), key=list(labels).count)
