"""Vocabulary: bilm-tf text format, building from counts, lookups."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from conftest import shared_path
from elmokit.errors import DataError, InputError, MissingFileError, UsageError
from elmokit.vocabulary import Vocabulary


def _write(tmp_path, name: str, content: str | bytes):
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def test_fixture_specials_in_original_order():
    path = shared_path("fixtures", "bilm-tf", "data", "vocab_test.txt")
    vocab = Vocabulary.from_file(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:3] == ["</S>", "<S>", "<UNK>"]
    assert len(vocab) == len(lines) == 100
    assert (vocab.eos_id, vocab.bos_id, vocab.unk_id) == (0, 1, 2)
    assert [vocab.token_to_id(t) for t in lines] == list(range(100))  # id = line number
    assert vocab.id_to_token(3) == "the"
    assert vocab.token_to_id("definitely-not-in-vocab") == 2
    assert vocab.counts is None


def test_fixture_train_vocab():
    vocab = Vocabulary.from_file(shared_path("fixtures", "bilm-tf", "train", "vocab.txt"))
    assert len(vocab) == 32
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.token_to_id("of") == 3 and vocab.token_to_id("larger") == 31
    assert vocab.encode(["of", "the", "zzz"]) == [3, 4, 2]
    assert vocab.encode(["of"], add_boundaries=True) == [0, 3, 1]


def test_build_from_fixture_matches_original_word_set():
    sentences = [line.split() for line in shared_path("fixtures", "bilm-tf", "train", "data.txt").open()]
    original = Vocabulary.from_file(shared_path("fixtures", "bilm-tf", "train", "vocab.txt"))
    built = Vocabulary.build(sentences, min_count=2)
    counts = Counter(t for s in sentences for t in s)
    assert len(built) == len(original) == 32
    assert set(built.tokens[3:]) == set(original.tokens[3:])
    # same frequency profile (the original's tie order is arbitrary; ours is alphabetical)
    assert [counts[t] for t in built.tokens[3:]] == [counts[t] for t in original.tokens[3:]]
    assert built.tokens[3:7] == ["of", "the", ".", "neural"]  # 9, 8, then the tie 5/5 alphabetically
    assert built.counts[:3] == [5, 5, 134 - sum(built.counts[3:])]


def test_build_hand_computed():
    sents = [["b", "a", "c", "a"], ["c", "a", "d"]]
    v = Vocabulary.build(sents)
    assert v.tokens == ["<S>", "</S>", "<UNK>", "a", "c", "b", "d"]  # a:3, c:2, then b/d tied -> alphabetical
    assert v.counts == [2, 2, 0, 3, 2, 1, 1]
    # tie order does not depend on input order
    assert Vocabulary.build(list(reversed(sents))).tokens == v.tokens
    v2 = Vocabulary.build(sents, min_count=2)
    assert v2.tokens == ["<S>", "</S>", "<UNK>", "a", "c"] and v2.counts == [2, 2, 2, 3, 2]
    v3 = Vocabulary.build(sents, max_size=4)
    assert v3.tokens == ["<S>", "</S>", "<UNK>", "a"] and v3.counts == [2, 2, 4, 3]
    assert v3.encode(["a", "c", "x"]) == [3, 2, 2]


def test_build_literal_specials_counted_not_duplicated():
    v = Vocabulary.build([["<S>", "x", "<UNK>"], ["x"]])
    assert v.tokens == ["<S>", "</S>", "<UNK>", "x"]
    assert v.counts == [3, 2, 1, 2]


def test_build_errors():
    with pytest.raises(InputError, match="sentence 0 is a str"):
        Vocabulary.build(["a b c"])
    with pytest.raises(UsageError, match="min_count"):
        Vocabulary.build([["a"]], min_count=0)
    with pytest.raises(UsageError, match="max_size"):
        Vocabulary.build([["a"]], max_size=2)


def test_missing_special_names_file_and_token(tmp_path):
    path = _write(tmp_path, "v.txt", "<S>\n<UNK>\nthe\n")
    with pytest.raises(DataError, match=r"v\.txt.*</S>"):
        Vocabulary.from_file(path)
    path = _write(tmp_path, "w.txt", "the\n")
    with pytest.raises(DataError) as e:
        Vocabulary.from_file(path)
    assert "w.txt" in str(e.value) and "<S>" in str(e.value) and "<UNK>" in str(e.value)


def test_duplicate_names_line(tmp_path):
    path = _write(tmp_path, "v.txt", "<S>\n</S>\n<UNK>\nthe\nthe\n")
    with pytest.raises(DataError, match=r"v\.txt:5: duplicate token 'the' \(first seen on line 4\)"):
        Vocabulary.from_file(path)


def test_blank_lines_and_whitespace(tmp_path):
    # trailing blank lines are ignored, like a missing final newline
    v = Vocabulary.from_file(_write(tmp_path, "a.txt", "<S>\n</S>\n<UNK>\nthe\n\n\n"))
    assert len(v) == 4
    v = Vocabulary.from_file(_write(tmp_path, "b.txt", "<S>\r\n</S>\r\n<UNK>\r\n the \r\nof"))
    assert v.tokens == ["<S>", "</S>", "<UNK>", "the", "of"]
    with pytest.raises(DataError, match=r"c\.txt:4: blank line"):
        Vocabulary.from_file(_write(tmp_path, "c.txt", "<S>\n</S>\n<UNK>\n\nthe\n"))
    with pytest.raises(DataError, match=r"d\.txt:4: expected one token per line"):
        Vocabulary.from_file(_write(tmp_path, "d.txt", "<S>\n</S>\n<UNK>\nthe 12\n"))


def test_maxtermid_skipped_and_bom(tmp_path):
    v = Vocabulary.from_file(_write(tmp_path, "v.txt", "\ufeff<S>\n</S>\n<UNK>\n!!!MAXTERMID\nthe\n"))
    assert v.tokens == ["<S>", "</S>", "<UNK>", "the"]


def test_invalid_utf8_names_line(tmp_path):
    path = _write(tmp_path, "v.txt", b"<S>\n</S>\n<UNK>\nca\xfft\n")
    with pytest.raises(DataError, match=r"v\.txt:4: invalid UTF-8"):
        Vocabulary.from_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(MissingFileError, match="nope.txt"):
        Vocabulary.from_file(tmp_path / "nope.txt")


def test_save_roundtrip_and_atomic(tmp_path, monkeypatch):
    v = Vocabulary.build([["é", "b", "é"], ["b", "c"]])
    path = tmp_path / "vocab.txt"
    v.save(path)
    assert path.read_text(encoding="utf-8") == "<S>\n</S>\n<UNK>\nb\né\nc\n"
    assert Vocabulary.from_file(path) == v
    assert os.listdir(tmp_path) == ["vocab.txt"]  # no temporary left behind

    # a failing replace leaves the old file intact and no temporary
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        Vocabulary.build([["z"]]).save(path)
    assert Vocabulary.from_file(path) == v
    assert os.listdir(tmp_path) == ["vocab.txt"]


def test_lookup_errors():
    v = Vocabulary(["<S>", "</S>", "<UNK>", "a"])
    assert v.decode([3, 0]) == ["a", "<S>"]
    with pytest.raises(InputError, match=r"token id 4 out of range \[0, 4\)"):
        v.id_to_token(4)
    with pytest.raises(InputError, match="token id -1"):
        v.id_to_token(-1)
    with pytest.raises(InputError, match="token id must be an int"):
        v.id_to_token("a")
    with pytest.raises(InputError, match="got a str"):
        v.encode("a b")
    with pytest.raises(DataError, match="duplicate token 'a' at ids 3 and 4"):
        Vocabulary(["<S>", "</S>", "<UNK>", "a", "a"])
    with pytest.raises(DataError, match="missing the special token"):
        Vocabulary(["<S>", "</S>", "a"])
    with pytest.raises(DataError, match="contains whitespace"):
        Vocabulary(["<S>", "</S>", "<UNK>", "a b"])
