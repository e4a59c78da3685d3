"""Polysemy tools (elmokit.analysis.polysemy) and `elmokit similar`: matching, vectors, cosines, neighbours, plots,
the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from elmokit import Embedder
from elmokit.analysis.polysemy import (
    Occurrence,
    context_window,
    cosine_matrix,
    find_occurrences,
    find_spans,
    is_cjk,
    label_similarity,
    layer_similarities,
    nearest_neighbours,
    occurrence_vectors,
    pca_2d,
    plot_occurrences,
)
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.errors import InputError, UsageError
from elmokit.modules.bilm import BiLM
from elmokit.weights.native import RELEASED, save_pretrained
from helpers import tiny_random_bilm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def embedder():
    return Embedder(tiny_random_bilm(0), batch_size=4)


# ---------------------------------------------------------------------------------------------- matching
def test_token_match_is_whole_tokens_only():
    assert find_spans("the bank of the bank".split(), "bank") == [(1, 2), (4, 5)]
    assert find_spans("the banks ba nk".split(), "bank") == []  # no prefix, no span for a non-CJK word by default
    assert find_spans("ba nk".split(), "bank", "span") == [(0, 2)]


def test_cjk_span_matches_characters_not_inside_longer_tokens():
    assert is_cjk("苹果") and not is_cjk("bank")
    assert find_spans(list("我爱吃苹果和苹果派"), "苹果") == [(3, 5), (6, 8)]  # per-character input
    assert find_spans(["我", "爱", "苹果", "手机"], "苹果") == [(2, 3)]  # segmented: one token
    assert find_spans(["苹果手机", "很", "好"], "苹果") == []  # inside another word: not a match
    assert find_spans(["苹", "果汁"], "苹果") == []  # a span never cuts a token
    assert find_spans(["苹果", "苹果"], "苹果", "token") == [(0, 1), (1, 2)]


def test_spans_do_not_overlap():
    assert find_spans(list("aaa"), "aa", "span") == [(0, 2)]


@pytest.mark.parametrize("word", ["", "two words", " bank", None])
def test_bad_word_raises_usage_error(word):
    with pytest.raises(UsageError, match="word"):
        find_spans(["a"], word)


def test_unknown_match_mode_and_unaligned_labels():
    with pytest.raises(UsageError, match="match must be one of"):
        find_spans(["a"], "a", "prefix")
    with pytest.raises(UsageError, match="2 entries for 1 sentences"):
        find_occurrences([["a"]], "a", labels=["x", "y"])


def test_find_occurrences_carries_sentence_and_label():
    occ = find_occurrences([["a", "bank"], ["no"], ["bank", "bank"]], "bank", labels=["m", "n", "r"])
    assert occ == [Occurrence(0, 1, 2, "m"), Occurrence(2, 0, 1, "r"), Occurrence(2, 1, 2, "r")]


def test_context_window_cuts_around_the_span():
    toks = list("abcdefghij")
    assert context_window(toks, 5, 6, 2) == (list("defgh"), 2, 3)
    assert context_window(toks, 0, 2, 1) == (list("abc"), 0, 2)
    assert context_window(toks, 3, 4, None) == (toks, 3, 4)
    with pytest.raises(UsageError, match="outside"):
        context_window(toks, 9, 11, 1)
    with pytest.raises(UsageError, match="context"):
        context_window(toks, 1, 2, -1)


# ---------------------------------------------------------------------------------------------- similarities
def test_cosine_matrix_hand_values():
    sim = cosine_matrix(np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [-2.0, 0.0]]))
    assert sim[0, 1] == pytest.approx(1 / math.sqrt(2))
    assert sim[0, 3] == pytest.approx(-1.0)
    assert sim[1, 1] == pytest.approx(1.0)
    assert np.all(sim[2] == 0) and np.all(sim[:, 2] == 0)  # a zero vector: cosine 0 with all
    with pytest.raises(InputError):
        cosine_matrix(np.zeros(3))


def test_label_similarity_hand_case():
    sim = np.array([[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.3, 0.4], [0.1, 0.3, 1.0, 0.7], [0.2, 0.4, 0.7, 1.0]])
    s = label_similarity(sim, ["a", "a", "b", "b"])
    assert s["pairs"] == 6
    assert s["mean"] == pytest.approx((0.9 + 0.1 + 0.2 + 0.3 + 0.4 + 0.7) / 6)
    assert s["within"] == pytest.approx((0.9 + 0.7) / 2)
    assert s["across"] == pytest.approx((0.1 + 0.2 + 0.3 + 0.4) / 4)
    assert s["gap"] == pytest.approx(0.8 - 0.25)
    assert (s["min"], s["max"]) == (0.1, 0.9)
    one = label_similarity(sim, ["a", "a", "a", "a"])
    assert one["across"] is None and one["gap"] is None
    with pytest.raises(InputError):
        label_similarity(sim, ["a"])


def test_label_similarity_leaves_unlabelled_entries_out():
    # the one pair has an unlabelled entry: neither within nor across (it counted as "across" before)
    s = label_similarity(np.ones((2, 2)), ["a", None])
    assert (s["pairs"], s["mean"]) == (1, 1.0)
    assert s["within"] is None and s["across"] is None and s["gap"] is None
    sim = np.array([[1.0, 0.2, 0.6], [0.2, 1.0, 0.4], [0.6, 0.4, 1.0]])
    s = label_similarity(sim, ["a", None, "a"])
    assert s["within"] == pytest.approx(0.6) and s["across"] is None and s["mean"] == pytest.approx(0.4)
    # an empty-string label is a label, not "unlabelled" (numpy turned the old "\0" sentinel into "")
    s = label_similarity(sim, ["", "x", ""])
    assert s["within"] == pytest.approx(0.6) and s["across"] == pytest.approx(0.3)


def test_occurrence_vectors_are_span_means_of_embed_sentence(embedder):
    sentences = [["the", "bank", "of", "the", "river"], ["a", "bank", "loan"], list("xy苹果z")]
    occ = find_occurrences(sentences, "bank") + find_occurrences(sentences, "苹果")
    vec = occurrence_vectors(embedder, sentences, occ)
    assert vec.shape == (3, 3, 16) and vec.dtype == np.float32
    ref0 = embedder.embed_sentence(sentences[0])
    np.testing.assert_allclose(vec[0], ref0[:, 1], atol=1e-5)
    ref2 = embedder.embed_sentence(sentences[2])
    np.testing.assert_allclose(vec[2], ref2[:, 2:4].mean(axis=1), atol=1e-5)  # 苹 果: mean of the 2 characters
    sims = layer_similarities(vec[:2])
    assert sims.shape == (4, 2, 2)
    assert sims[0, 0, 1] == pytest.approx(1.0, abs=1e-6)  # layer 0 is context-free: the same word, cosine 1
    assert sims[1, 0, 1] < 0.999 and sims[2, 0, 1] < 0.999  # the biLSTM layers depend on the context
    # a context window: the vector of the occurrence in its cut sentence
    cut = occurrence_vectors(embedder, sentences, occ[:1], context=1)
    np.testing.assert_allclose(cut[0], embedder.embed_sentence(["the", "bank", "of"])[:, 1], atol=1e-5)


def test_nearest_neighbours_match_brute_force_and_exclude(embedder):
    corpus = [["the", "bank", "of", "the", "river"], ["a", "bank", "loan"], ["river", "bank", "fish"]]
    top = [embedder.embed_sentence(s, layers="top") for s in corpus]
    all_vecs = np.concatenate(top)
    refs = [(i, p) for i, s in enumerate(corpus) for p in range(len(s))]
    q = top[1][1:2]  # "bank" in sentence 1
    got = nearest_neighbours(embedder, q, corpus, k=4, chunk=2)[0]
    sims = cosine_matrix(np.concatenate([q, all_vecs]))[0, 1:]
    order = np.argsort(-sims, kind="stable")[:4]
    assert [(n.sentence, n.position) for n in got] == [refs[i] for i in order]
    assert [n.score for n in got] == pytest.approx(sims[order].tolist(), abs=1e-6)
    assert (got[0].sentence, got[0].position, got[0].token) == (1, 1, "bank")
    assert got[0].score == pytest.approx(1.0, abs=1e-6)
    excluded = nearest_neighbours(embedder, q, corpus, k=4, exclude=[{(tuple(corpus[1]), 1)}])[0]
    assert (1, 1) not in [(n.sentence, n.position) for n in excluded]
    assert [(n.sentence, n.position) for n in excluded] == [refs[i] for i in order[1:]] + [
        refs[np.argsort(-sims, kind="stable")[4]]
    ]
    with pytest.raises(UsageError, match="k"):
        nearest_neighbours(embedder, q, corpus, k=0)
    with pytest.raises(UsageError, match="queries"):
        nearest_neighbours(embedder, np.zeros((1, 3)), corpus)


# ---------------------------------------------------------------------------------------------- projection, plot
def test_pca_2d_on_a_line_and_sign_is_fixed():
    t = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    direction = np.array([3.0, 4.0, 0.0]) / 5
    x = t[:, None] * direction + np.array([1.0, 1.0, 1.0])
    xy = pca_2d(x)
    np.testing.assert_allclose(np.abs(xy[:, 0]), np.abs(t), atol=1e-9)
    np.testing.assert_allclose(xy[:, 1], 0, atol=1e-9)
    np.testing.assert_allclose(pca_2d(-x + 7), pca_2d(-x), atol=1e-9)  # a shift does not move it
    np.testing.assert_allclose(xy[:, 0], t, atol=1e-9)  # largest loading (4/5, on axis 1) positive → +t
    assert pca_2d(x[:1]).tolist() == [[0.0, 0.0]]


def test_plot_occurrences_writes_a_png_atomically(tmp_path):
    rng = np.random.default_rng(0)
    out = plot_occurrences(rng.normal(size=(6, 3, 8)), tmp_path / "p.png", ["a", "b"] * 3, title="苹果 bank")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png"]
    with pytest.raises(UsageError, match="plot layer 5"):
        plot_occurrences(np.zeros((2, 3, 4)), tmp_path / "q.png", layers=[5])
    with pytest.raises(InputError):
        plot_occurrences(np.zeros((2, 4)), tmp_path / "q.png")


# ---------------------------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    return save_pretrained(BiLM(elmo_tiny()), tmp_path_factory.mktemp("similar") / "model")


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_cli_similar_end_to_end_json(tiny_model, tmp_path, capsys):
    sents = _write(
        tmp_path / "s.txt",
        "money\tthe bank lends money\nriver\tthe bank of the river\n\n"
        "money\ta bank loan\nriver\twe sat on the river bank\n",
    )
    corpus = _write(tmp_path / "c.txt", "the river is wide\nthe bank is open\n")
    png = tmp_path / "bank.png"
    assert (
        cli_main(
            [
                "similar",
                str(tiny_model),
                str(sents),
                "--word",
                "bank",
                "--labels",
                "--corpus",
                str(corpus),
                "--neighbours",
                "2",
                "--png",
                str(png),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [o["line"] for o in out["occurrences"]] == [1, 2, 4, 5]  # blank line 3 skipped, numbering kept
    assert [o["label"] for o in out["occurrences"]] == ["money", "river", "money", "river"]
    layer0 = np.array(out["layers"]["0 (static)"]["cosine"])
    np.testing.assert_allclose(layer0, 1.0, atol=1e-5)
    top = np.array(out["layers"]["2"]["cosine"])
    s = out["layers"]["2"]["summary"]
    assert s["within"] == pytest.approx((top[0, 2] + top[1, 3]) / 2, abs=1e-5)
    assert s["across"] == pytest.approx((top[0, 1] + top[0, 3] + top[1, 2] + top[2, 3]) / 4, abs=1e-5)
    assert set(out["layers"]) == {"0 (static)", "1", "2", "average"}
    lists = out["neighbours"]["lists"]
    assert len(lists) == 4 and all(len(x) == 2 for x in lists)
    assert all(x[0]["score"] >= x[1]["score"] for x in lists)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_similar_text_output_and_cjk_characters(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "zh.txt", "我 爱 吃 苹 果\n苹 果 手 机 很 贵\n苹果 很 甜\n")
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "苹果", "--layers", "0,average"]) == 0
    text = capsys.readouterr().out
    assert "3 occurrence(s) in 3 of 3 sentences" in text and "run of whole tokens" in text
    assert "layer 0 (static): cosine similarity" in text and "layer average" in text and "layer 1:" not in text
    assert "[苹果]" in text  # the span shown joined, without spaces


def test_cli_similar_summary_only_above_max_matrix(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "s.txt", "a x b\nc x d\ne x f\n")
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "x", "--max-matrix", "2"]) == 0
    text = capsys.readouterr().out
    assert "matrices left out" in text and "cosine similarity" not in text
    assert "0 (static)" in text


@pytest.mark.parametrize(
    "extra, status, message",
    [
        (["--word", "bank"], 2, "the word 'bank' occurs in none of the 2 sentences of"),
        (["--word", "a", "--neighbours", "3"], 2, "--neighbours needs --corpus"),
        (["--word", "a", "--layers", "7"], 2, "--layers 7 is not a layer"),
        (["--word", "a", "--labels"], 1, ":1: with --labels each line is 'label<TAB>sentence'"),
        (["--word", "a", "--corpus", "/nonexistent/c.txt"], 2, "no such file"),
        (["--word", "two words"], 2, "--word must be one word"),
    ],
)
def test_cli_similar_errors(tiny_model, tmp_path, capsys, extra, status, message):
    sents = _write(tmp_path / "s.txt", "a b c\nd a\n")
    assert cli_main(["similar", str(tiny_model), str(sents), *extra]) == status
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err
    if "occurs in none" in message:
        assert str(sents) in err


def test_cli_similar_missing_sentences_file(tiny_model, tmp_path, capsys):
    assert cli_main(["similar", str(tiny_model), str(tmp_path / "nope.txt"), "--word", "a"]) == 2
    assert "nope.txt" in capsys.readouterr().err


def test_cli_similar_png_inside_the_model_folder_is_refused(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "s.txt", "a b\nc a\n")
    for name in ("model.safetensors", "config.json", "new.png", "."):
        target = tiny_model / name
        before = target.read_bytes() if target.is_file() else None
        assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--png", str(target)]) == 2
        err = capsys.readouterr().err
        assert "inside the model folder" in err and "internal error" not in err
        assert (target.read_bytes() if target.is_file() else None) == before  # the weights were overwritten before
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--png", str(sents)]) == 2
    assert "is the sentences file" in capsys.readouterr().err
    assert sents.read_text() == "a b\nc a\n"
    # a folder: a PNG example path, not the embed default ".hdf5"
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--png", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"e.g. {tmp_path / 'similar.png'}" in err and ".hdf5" not in err


def test_cli_similar_png_inside_a_zoo_or_released_model_folder_is_refused(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    zoo = save_pretrained(tiny_random_bilm(0), cache / "zoo" / "elmokit-en")
    (zoo / "card.json").write_text("{}")
    (zoo / "word2vec").mkdir()
    vectors = zoo / "word2vec" / "vectors.bin"
    vectors.write_bytes(b"keep me")
    released = cache / sorted(RELEASED)[0]
    released.mkdir()
    monkeypatch.setenv("ELMOKIT_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    sents = _write(tmp_path / "s.txt", "a b\n")
    # the zoo name resolves to its folder; a file in a subfolder of it is refused too
    assert cli_main(["similar", "elmokit-en", str(sents), "--word", "a", "--png", str(vectors)]) == 2
    assert "inside the model folder" in capsys.readouterr().err
    assert vectors.read_bytes() == b"keep me"
    # a released name: its download folder in the cache (refused before anything is downloaded)
    assert cli_main(["similar", released.name, str(sents), "--word", "a", "--png", str(released / "w.hdf5")]) == 2
    assert "inside the model folder" in capsys.readouterr().err
    assert not (released / "w.hdf5").exists()


def test_cli_similar_decode_errors_option(tiny_model, tmp_path, capsys):
    sents = tmp_path / "bad.txt"
    sents.write_bytes(b"a b\n\xff a\nc a\n")
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a"]) == 1
    assert "--decode-errors" in capsys.readouterr().err  # the option the message names now exists
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--decode-errors", "skip", "--json"]) == 0
    assert [o["line"] for o in json.loads(capsys.readouterr().out)["occurrences"]] == [1, 3]
    assert (
        cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--decode-errors", "replace", "--json"]) == 0
    )
    assert [o["line"] for o in json.loads(capsys.readouterr().out)["occurrences"]] == [1, 2, 3]


def test_cli_similar_repeated_layers_refused(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "s.txt", "a b\nc a\n")
    for layers in ("0,0,1", "average,1,average"):
        assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--layers", layers]) == 2
        err = capsys.readouterr().err
        assert "more than once" in err and "internal error" not in err


def test_cli_similar_warns_once_about_tabs_without_labels(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "s.txt", "x\ta b\ny\tc a\n")
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a"]) == 0
    err = capsys.readouterr().err
    assert err.count("lines contain a TAB: pass --labels if the first field is a label") == 1
    assert f"{sents}:1" in err
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a", "--labels"]) == 0
    assert "TAB" not in capsys.readouterr().err


def test_cli_similar_jieba_wording_and_raw_cjk_hint(tiny_model, tmp_path, capsys):
    sents = _write(tmp_path / "zh.txt", "我爱吃苹果\n苹果手机很贵\n")
    # raw Chinese split on whitespace: no token is 苹果; the error says to segment it
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "苹果"]) == 2
    err = capsys.readouterr().err
    assert "occurs in none" in err and "--tokenize jieba" in err
    # --tokenizer (embed's spelling) is the same option; jieba words match as one token each
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "苹果", "--tokenizer", "jieba"]) == 0
    out = capsys.readouterr().out
    assert "2 occurrence(s) in 2 of 2 sentences" in out
    assert "(matched as one whole jieba word)" in out and "e.g. characters" not in out


def test_cli_similar_empty_sentences_file_is_a_data_error(tiny_model, tmp_path, capsys):
    # exit 1, as perplexity, train and the task readers give for a file that holds nothing to read (issue 19)
    sents = _write(tmp_path / "empty.txt", "\n  \n")
    assert cli_main(["similar", str(tiny_model), str(sents), "--word", "a"]) == 1
    err = capsys.readouterr().err
    assert "holds no sentences" in err and str(sents) in err
