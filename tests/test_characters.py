"""Character ids: the original byte scheme, hand-computed, and the character-vocabulary scheme."""

from __future__ import annotations

import pytest

from elmokit import CharVocabulary, DataError, InputError, MissingFileError, UsageError, batch_to_ids
from elmokit.characters import ByteCharacterMapper, boundary_char_ids, is_blank_token, validate_sentences


def test_byte_ids_hand_computed():
    ids = batch_to_ids([["hi", "é"]])
    assert ids.shape == (1, 2, 50)
    # begin-of-word 258+1, 'h'=104+1, 'i'=105+1, end-of-word 259+1, then in-word pad 260+1
    assert ids[0, 0, :5].tolist() == [259, 105, 106, 260, 261]
    assert ids[0, 0, 5:].eq(261).all()
    # 'é' is two UTF-8 bytes c3 a9
    assert ids[0, 1, :4].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260]


def test_literal_boundary_tokens_and_unk():
    # documented: a literal "<S>" / "</S>" token gets the boundary row, as in the original
    ids = batch_to_ids([["<S>", "</S>", "<UNK>"]])
    bos, eos = boundary_char_ids(50)
    assert ids[0, 0].tolist() == bos == [259, 257, 260] + [261] * 47
    assert ids[0, 1].tolist() == eos == [259, 258, 260] + [261] * 47
    assert ids[0, 2, :7].tolist() == [259] + [b + 1 for b in b"<UNK>"] + [260]


def test_padding_is_zero_and_shape():
    ids = batch_to_ids([["a", "b", "c"], ["d"], []])
    assert ids.shape == (3, 3, 50)
    assert ids[1, 1:].eq(0).all() and ids[2].eq(0).all()
    assert batch_to_ids([]).shape == (0, 0, 50)
    assert batch_to_ids([[], []]).shape == (2, 0, 50)


def test_long_tokens_truncate_or_error():
    ids = batch_to_ids([["x" * 1000]])
    assert ids[0, 0, 0] == 259 and ids[0, 0, 49] == 260 and ids[0, 0, 1:49].eq(ord("x") + 1).all()
    with pytest.raises(InputError, match="1000 UTF-8 bytes"):
        batch_to_ids([["x" * 1000]], on_long_token="error")
    ids = batch_to_ids([["abcdefgh"]], max_characters_per_token=6)
    assert ids.shape == (1, 1, 6) and ids[0, 0].tolist() == [259, 98, 99, 100, 101, 260]


def test_cjk_byte_scheme_keeps_16_characters_char_vocab_keeps_all():
    token = "中华人民共和国国务院总理李克强今天在北京"  # 20 characters, 60 bytes
    ids = batch_to_ids([[token]])
    assert (ids[0, 0] == 260).nonzero().item() == 49  # 48 bytes = 16 characters, then end-of-word
    vocab = CharVocabulary.build([[token]], max_characters_per_token=30)
    cids = batch_to_ids([[token, "中?"]], char_vocab=vocab)
    assert cids.shape == (1, 2, 30)
    row = cids[0, 0].tolist()
    assert row[0] == CharVocabulary.bow_char and row[21] == CharVocabulary.eow_char
    assert len(set(row[1:21])) == len(set(token))
    assert cids[0, 1, 2].item() == CharVocabulary.unk_char
    assert vocab.vocab_size == 7 + len(set(token))


def test_char_vocab_file_round_trip(tmp_path):
    vocab = CharVocabulary(["苹", "果", "a"])
    vocab.save(tmp_path / "chars.txt")
    again = CharVocabulary.from_file(tmp_path / "chars.txt")
    assert again.characters == ["苹", "果", "a"]
    with pytest.raises(ValueError, match="duplicates"):
        CharVocabulary(["a", "a"])


@pytest.mark.parametrize(
    "bad,match",
    [
        ("a sentence", "single string"),
        (["flat", "list"], "flat list"),
        ([["ok"], [1, 2]], "sentence 1, token 0 is a int"),
        ([["ok"], 7], "sentence 1 is a int"),
        ([[["nested"]]], "sentence 0, token 0 is a list"),
        ([b"bytes"], "sentence 0 is a bytes"),
        (42, "list of sentences"),
        ({"a": ["b"]}, "list of sentences"),
    ],
)
def test_malformed_input_errors(bad, match):
    # these were TypeErrors; now InputError (a ValueError), which the CLI reports as a usage error, not a crash
    with pytest.raises(InputError, match=match):
        batch_to_ids(bad)


@pytest.mark.parametrize("token", ["", " ", "\t", "\n", "\u3000", "\u00a0 ", "\ud800", " \udfff "])
def test_blank_tokens_refused_naming_sentence_and_position(token):
    # reproduction: these were silently embedded ([begin-of-word, end-of-word] or spaces) and moved their neighbours
    assert is_blank_token(token)
    surrogate = any("\ud800" <= ch <= "\udfff" for ch in token)
    # a token blank only once its lone surrogates are dropped is named as such (issue 39 item 4: it was called
    # "empty or whitespace-only")
    expected = r"holds lone surrogates \(U\+D[89A-F][0-9A-F]{2}\)" if surrogate else "empty_tokens='keep'"
    with pytest.raises(InputError, match=r"sentence 1, token 2 is .*" + expected):
        batch_to_ids([["fine"], ["a", "b", token, "c"]])
    with pytest.raises(InputError, match=r"sentence 5, token 0"):
        validate_sentences([[token]], start=5)
    kept = batch_to_ids([["a", token]], empty_tokens="keep")
    assert kept.shape == (1, 2, 50) and kept[0, 1, 0] == 259  # the original's encoding: a real token


def test_non_blank_odd_tokens_pass():
    for token in ["\u200b", "\x00", "a b", "\u0301", "<S>", "x\ud800"]:
        assert not is_blank_token(token), token
    assert batch_to_ids([["\u200b", "\x00", "a b", "\u0301"]]).shape == (1, 4, 50)


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="empty_tokens"):
        batch_to_ids([["a"]], empty_tokens="drop")
    with pytest.raises(UsageError, match="on_long_token"):
        batch_to_ids([["a"]], on_long_token="cut")
    with pytest.raises(UsageError, match=">= 3"):
        batch_to_ids([["a"]], max_characters_per_token=2)
    with pytest.raises(UsageError, match="int >= 3"):
        ByteCharacterMapper(50.0)


def test_tokens_to_add_follow_allennlp_layout():
    # AllenNLP ELMoCharacterMapper(tokens_to_add={token: id}): [begin-of-word, id, end-of-word, pad...], then +1;
    # looked up before <S>/</S>
    mapper = ByteCharacterMapper(tokens_to_add={"<first>": 1, "<S>": 7, "@@MASK@@": 260})
    assert mapper.token_to_ids("<first>") == [259, 2, 260] + [261] * 47
    assert mapper.token_to_ids("<S>") == [259, 8, 260] + [261] * 47
    assert mapper.token_to_ids("@@MASK@@")[:3] == [259, 261, 260]
    assert mapper.token_to_ids("first")[:7] == [259] + [b + 1 for b in b"first"] + [260]
    ids = batch_to_ids([["x", "<first>"]], tokens_to_add={"<first>": 1})
    assert ids[0, 1].tolist() == [259, 2, 260] + [261] * 47
    for bad in (-1, 261, 1.0, True, "1"):
        with pytest.raises(UsageError, match="tokens_to_add"):
            ByteCharacterMapper(tokens_to_add={"<x>": bad})
    with pytest.raises(UsageError, match="char_vocab"):
        batch_to_ids([["a"]], char_vocab=CharVocabulary(["a"]), tokens_to_add={"<x>": 1})


def test_char_vocab_file_errors_name_file_and_line(tmp_path):
    (tmp_path / "chars.txt").write_text("a\nbc\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"chars.txt:2 is 'bc'"):
        CharVocabulary.from_file(tmp_path / "chars.txt")
    (tmp_path / "chars.txt").write_text("a\nb\na\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"chars.txt:3 'a' duplicates .*chars.txt:1"):
        CharVocabulary.from_file(tmp_path / "chars.txt")
    (tmp_path / "chars.txt").write_bytes(b"\xff\n")
    with pytest.raises(DataError, match="not UTF-8"):
        CharVocabulary.from_file(tmp_path / "chars.txt")
    with pytest.raises(MissingFileError, match="no such file"):
        CharVocabulary.from_file(tmp_path / "nope.txt")


def test_odd_tokens_have_defined_ids():
    tokens = ["", " ", "\t\n", "🙂", "\x00\x07", "苹果", "\ud800x"]
    ids = batch_to_ids([tokens], empty_tokens="keep")
    assert ids.shape == (1, 7, 50)
    assert ids[0, 0, :3].tolist() == [259, 260, 261]  # empty string: begin/end of word only
    assert ids[0, 1, :3].tolist() == [259, 33, 260]
    assert ids[0, 3, :6].tolist() == [259] + [b + 1 for b in "🙂".encode()] + [260]
    assert ids[0, 4, :4].tolist() == [259, 1, 8, 260]
    assert ids[0, 6, :3].tolist() == [259, ord("x") + 1, 260]  # lone surrogate dropped, as the original
