"""The zoo's staged pretraining text: its reader and tokenised-text cache (:mod:`elmokit.recipes.zoo.pretext`) and
the strict n-gram leak filter (:mod:`elmokit.recipes.zoo.ngrams`), on hand-made and on real text."""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_path
from elmokit.errors import DataError
from elmokit.recipes.zoo.ngrams import NgramIndex, chinese_view, english_views
from elmokit.recipes.zoo.pretext import staged_text_reader, text_cache_path
from elmokit.recipes.zoo.sources import RECIPES, resolve_data_dir
from zoo_staged import write_xz_documents

pytest.importorskip("sacremoses")
pytest.importorskip("jieba")


@dataclass
class _Set:
    """A stand-in for a recipe's KeptOut set: its sentences given directly."""

    name: str
    sentences: list[str]
    folder: str = "."
    files: tuple[str, ...] = ()

    def read(self, folder, stats):
        return iter(self.sentences)


# ---------------------------------------------------------------------------------------------------- normalisation
def test_english_views_hand_computed():
    """PRETRAINING-TEXT-FILTER.md's normalisations A and B: raw, PTB and WikiText contractions all meet in B."""
    assert english_views("I don't -LRB- like -RRB- it") == (
        ["i", "do", "nt", "like", "it"],
        ["i", "do", "n", "t", "like", "it"],
    )
    for text in ("don't stop", "do n't stop", "don 't stop", "don’t stop", "DO N'T STOP"):
        assert english_views(text)[1] == ["do", "n", "t", "stop"], text
    assert english_views("3 @.@ 5 km @-@ long")[0] == ["3", "5", "km", "long"]  # WikiText markers drop out
    assert chinese_view("苹果 很\u3000好吃 ！") == "苹果很好吃!"  # NFKC: the full-width ！ becomes !, spaces go


# ---------------------------------------------------------------------------------------------------- the filter
EVAL = "The bank of the river was steep and covered in reeds when we arrived ."


def test_english_filter_drops_a_planted_quote_and_keeps_the_rest():
    index = NgramIndex("en", [_Set("coarsewsd-like", [EVAL, "too short to match"])], Path("."))
    # 14 letter/digit tokens ("." is none) → 7 8-grams; views A and B agree (no contraction); 4 tokens give none
    assert index.size == 14 - 8 + 1
    assert index.info == [
        {"name": "coarsewsd-like", "folder": ".", "files": [], "sentences": 2, "ngrams_added": index.size}
    ]
    doc = [
        "Nothing in this sentence comes from the evaluation text at all .".split(),
        "Yesterday the bank of the river was steep and muddy .".split(),  # 8 tokens of EVAL in a row
        "A third unrelated sentence about bread and butter .".split(),
    ]
    assert index.hits(doc) == {1}
    assert index.hits([doc[0], doc[2]]) == set()
    # a quote cut across two sentences of a document: both are touched
    cut = ["We saw that the bank of the".split(), "river was steep and covered .".split(), doc[2]]
    assert index.hits(cut) == {0, 1}
    # contractions tokenised another way still match (view B), 7 tokens do not
    contracted = "he said they do n't know where the old mill road ends".split()
    index2 = NgramIndex("en", [_Set("ptb-like", ["They don't know where the old mill road ends ."])], Path("."))
    assert index2.hits([contracted]) == {0}
    assert index2.hits(["they do n't know where the".split()]) == set()  # B: 7 tokens (they do n t …)


def test_chinese_filter_uses_13_characters():
    sentence = "当希望工程救助的百万儿童成长起来，科教兴国蔚然成风时。"
    index = NgramIndex("zh", [_Set("msra-like", [sentence])], Path("."))
    assert index.size == len(sentence) - 13 + 1
    assert index.hits([list("记者说希望工程救助的百万儿童成长"), list("今天天气很好。")]) == {0}  # 13 in a row
    assert index.hits([list("记者说希望工程救助的百万儿童成"), list("今天天气很好。")]) == set()  # 12 only


# ---------------------------------------------------------------------------------------------------- reader + cache
def test_reader_tokenises_documents_and_caches_them(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "home-cache"))
    docs = [
        ["Mr. Smith didn't go to Washington. He stayed home!", "A second paragraph."],
        ["Another document, one paragraph."],
    ]
    write_xz_documents(tmp_path / "src" / "text.txt.xz", docs)
    read = staged_text_reader(("text.txt.xz",), "en")
    stats: dict = {}
    first = list(read(tmp_path / "src", stats))
    assert first == [
        [
            ["Mr.", "Smith", "didn", "'t", "go", "to", "Washington", "."],
            ["He", "stayed", "home", "!"],
            ["A", "second", "paragraph", "."],
        ],
        [["Another", "document", ",", "one", "paragraph", "."]],
    ]
    assert stats["lines"] == 5  # 3 paragraphs + 2 blank lines
    cache, info = text_cache_path(tmp_path / "src", ("text.txt.xz",), "en")
    assert cache.parent == tmp_path / "home-cache" / "corpora" and stats["cache"] == {
        "path": str(cache),
        "how": "written",
    }
    assert info["tokeniser"].startswith("sacremoses ") and len(info["files"]["text.txt.xz"]) == 64
    assert json.loads(cache.with_suffix(".json").read_text())["lines"] == 5
    again: dict = {}
    assert list(read(tmp_path / "src", again)) == first and again["cache"]["how"] == "read" and again["lines"] == 5
    # other text, another fingerprint: not read from the old cache
    write_xz_documents(tmp_path / "src" / "text.txt.xz", docs[1:])
    assert text_cache_path(tmp_path / "src", ("text.txt.xz",), "en")[0] != cache
    assert list(read(tmp_path / "src", {})) == first[1:]


def test_a_read_stopped_early_leaves_no_cache_and_bad_files_are_named(tmp_path):
    write_xz_documents(tmp_path / "src" / "text.txt.xz", [["今天天气很好。我们去公园散步。"], ["第二篇文章。"]])
    read = staged_text_reader(("text.txt.xz",), "zh")
    stats = {"text_cache": tmp_path / "tc"}
    it = read(tmp_path / "src", stats)
    assert next(it) == [["今天天气", "很", "好", "。"], ["我们", "去", "公园", "散步", "。"]]  # jieba's words
    it.close()  # build_corpus with a limit stops reading like this
    assert "cache" not in stats and not list((tmp_path / "tc").glob("*"))
    (tmp_path / "bad").mkdir()
    data = lzma.compress("一行。\n".encode() * 1000)
    (tmp_path / "bad" / "text.txt.xz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"text\.txt\.xz: cannot read it as xz-compressed UTF-8 text"):
        list(read(tmp_path / "bad", {"text_cache": tmp_path / "tc"}))


# ---------------------------------------------------------------------------------------------------- real text
def test_real_coarsewsd_sentence_planted_in_real_wikipedia_is_dropped(tmp_path):
    """CoarseWSD-20 is drawn from Wikipedia: one of its test sentences, quoted inside the first real en-wikipedia-2014
    document, is found; the real document's own sentences are not."""
    data = shared_path("data")
    coarse = next(k for k in RECIPES["en"].kept_out if k.name.startswith("coarsewsd"))
    index = NgramIndex("en", [coarse], data)
    assert index.info[0]["sentences"] == 33_905
    target = (data / "coarsewsd-20" / "bank" / "test.data.txt").read_text(encoding="utf-8").splitlines()[0]
    words = target.split("\t")[1].split()
    assert len(words) >= 12
    src = next(s for s in RECIPES["en"].sources if s.name == "en-wikipedia-2014")
    doc = next(iter(src.read(data / src.folder, {"text_cache": tmp_path})))[:30]
    assert " ".join(doc[0]).startswith("Anarchism is a political philosophy")
    assert index.hits(doc) == set()
    planted = ["Critics", "wrote", "that", *words[2:12], "."]
    assert index.hits([*doc[:3], planted, *doc[3:]]) == {3}
    assert np.all(np.diff(index.hashes.astype(np.float64)) >= 0)  # sorted, as the lookup needs


def test_default_data_folder_is_the_shared_folder_beside_the_repository(monkeypatch):
    monkeypatch.delenv("ELMOKIT_DATA", raising=False)
    assert resolve_data_dir() == shared_path("data")


def test_which_sources_the_ngram_filter_reads():
    """Every source but the evaluation sets' own train splits (in the filter's index, they would drop themselves)."""
    en = {s.name for s in RECIPES["en"].sources if not s.ngram_filter}
    assert en == {"conll2003-train", "sst2-train", "sst5-train", "trec-train"}
    zh = [s.name for s in RECIPES["zh"].sources if s.ngram_filter]
    assert zh == ["zh-news-cctv", "zh-wikipedia", "zh-classical-novels"]
    assert all(s.licence for r in RECIPES.values() for s in r.sources)
