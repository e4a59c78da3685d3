"""Character ids: the original byte scheme, hand-computed, and the character-vocabulary scheme."""
from __future__ import annotations

import pytest
import torch

from elmokit import CharVocabulary, InputError, batch_to_ids
from elmokit.characters import boundary_char_ids


def test_byte_ids_hand_computed():
    ids = batch_to_ids([["hi", "é"]])
    assert ids.shape == (1, 2, 50)
    # begin-of-word 258+1, 'h'=104+1, 'i'=105+1, end-of-word 259+1, then in-word pad 260+1
    assert ids[0, 0, :5].tolist() == [259, 105, 106, 260, 261]
    assert ids[0, 0, 5:].eq(261).all()
    # 'é' is two UTF-8 bytes c3 a9
    assert ids[0, 1, :4].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260]


def test_literal_boundary_tokens_and_unk():
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


@pytest.mark.parametrize("bad,match", [
    ("a sentence", "single string"),
    (["flat", "list"], "flat list"),
    ([["ok"], [1, 2]], "sentence 1, token 0"),
    (42, "list of sentences"),
])
def test_malformed_input_type_errors(bad, match):
    with pytest.raises(TypeError, match=match):
        batch_to_ids(bad)


def test_odd_tokens_have_defined_ids():
    tokens = ["", " ", "\t\n", "🙂", "\x00\x07", "苹果", "\ud800x"]
    ids = batch_to_ids([tokens])
    assert ids.shape == (1, 7, 50)
    assert ids[0, 0, :3].tolist() == [259, 260, 261]  # empty string: begin/end of word only
    assert ids[0, 1, :3].tolist() == [259, 33, 260]
    assert ids[0, 3, :6].tolist() == [259] + [b + 1 for b in "🙂".encode()] + [260]
    assert ids[0, 4, :4].tolist() == [259, 1, 8, 260]
    assert ids[0, 6, :3].tolist() == [259, ord("x") + 1, 260]  # lone surrogate dropped, as the original
