"""Bad or unusual input gives defined output or a clear error, never a crash deep inside torch."""
from __future__ import annotations

import pytest
import torch

from elmokit import Elmo, InputError, batch_to_ids
from helpers import fixture_model


@pytest.fixture(scope="module")
def elmo():
    return Elmo(bilm=fixture_model("allennlp-elmo"), num_output_representations=1, dropout=0.0)


def test_empty_batch(elmo):
    out = elmo(batch_to_ids([]))
    assert out["elmo_representations"][0].shape == (0, 0, 32)
    assert out["mask"].shape == (0, 0)


def test_empty_sentence_alone_and_in_batch(elmo):
    out = elmo(batch_to_ids([[]]))
    assert out["elmo_representations"][0].shape == (1, 0, 32)
    out = elmo(batch_to_ids([["a", "b"], []]))
    rep = out["elmo_representations"][0]
    assert out["mask"].tolist() == [[True, True], [False, False]]
    assert rep[1].abs().max() == 0
    alone = elmo(batch_to_ids([["a", "b"]]))["elmo_representations"][0]
    assert (rep[0] - alone[0]).abs().max() <= 1e-5


def test_odd_tokens_give_finite_vectors(elmo):
    sentence = ["", " ", "x" * 1000, "🙂🙃", "苹果公司", "\x00\x1b[31m", "\u200b", "bank"]
    rep = elmo(batch_to_ids([sentence]))["elmo_representations"][0]
    assert rep.shape == (1, 8, 32) and torch.isfinite(rep).all()
    assert (rep[0, 0] - rep[0, 1]).abs().max() > 1e-4  # empty string and a space are different tokens


def test_wrong_shapes_and_types(elmo):
    with pytest.raises(InputError, match=r"\(B, T, 50\)"):
        elmo(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(InputError, match=r"\(B, T, 50\)"):
        elmo(batch_to_ids([["a"]], max_characters_per_token=20))
    with pytest.raises(InputError, match="integer ids"):
        elmo(torch.zeros(1, 2, 50))
    with pytest.raises(InputError, match="outside the character table"):
        elmo(torch.full((1, 2, 50), 999, dtype=torch.long))
    with pytest.raises(InputError, match="LongTensor"):
        elmo([["a", "b"]])


def test_flat_list_of_strings_is_a_type_error():
    with pytest.raises(TypeError, match="flat list"):
        batch_to_ids(["The", "bank"])
