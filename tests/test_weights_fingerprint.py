"""The one biLM fingerprint (elmokit.weights.fingerprint): it changes with a weight, the configuration or the
character vocabulary and with nothing else, and its three users (embed parts, task feature cache, task models) agree."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import pytest
import torch

from elmokit import BiLM, Elmo, Embedder, save_pretrained
from elmokit.characters import CharVocabulary
from elmokit.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmokit.embedding.writer import model_fingerprint
from elmokit.errors import InputError, UsageError
from elmokit.modules.bilm import StatefulBiLM
from elmokit.tasks.features import bilm_sha256
from elmokit.tasks.training import bilm_fingerprint as tasks_bilm_fingerprint
from elmokit.weights.fingerprint import bilm_fingerprint, legacy_weights_sha256
from elmokit.weights.native import load_pretrained_bilm
from helpers import tiny_random_bilm


def char_vocab_bilm(chars: str = "abcdefgh", seed: int = 0) -> BiLM:
    """A tiny character-vocabulary BiLM (8 characters + 7 specials, C = 10)."""
    vocab = CharVocabulary(list(chars), max_characters_per_token=10)
    config = ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 4), (2, 4)],
            n_highway=1,
            embedding_dim=4,
            max_characters_per_token=10,
            char_vocab_size=vocab.vocab_size,
        ),
        lstm=LSTMConfig(dim=8, projection_dim=4, n_layers=1),
    )
    torch.manual_seed(seed)
    model = BiLM(config).eval()
    model.char_vocab = vocab
    return model


def same_weights(a: BiLM, b: BiLM) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_stable_for_the_same_model_however_it_is_held(tmp_path):
    bilm = tiny_random_bilm(0)
    fp = bilm_fingerprint(bilm)
    assert len(fp) == 64 and int(fp, 16) >= 0  # hex sha256
    assert bilm_fingerprint(tiny_random_bilm(0)) == fp  # rebuilt from the same seed
    assert bilm_fingerprint(copy.deepcopy(bilm)) == fp
    assert bilm_fingerprint(StatefulBiLM(bilm)) == fp  # the wrapper is hashed as the model inside
    with torch.no_grad():
        bilm(torch.randint(1, 200, (2, 3, 50)))  # running it changes nothing
    assert bilm_fingerprint(bilm) == fp
    save_pretrained(bilm, tmp_path / "m")  # written and read back
    assert bilm_fingerprint(load_pretrained_bilm(tmp_path / "m")) == fp
    chars = char_vocab_bilm()
    save_pretrained(chars, tmp_path / "c")  # with chars.txt
    assert bilm_fingerprint(load_pretrained_bilm(tmp_path / "c")) == bilm_fingerprint(chars)


def test_changes_with_any_weight():
    bilm = tiny_random_bilm(0)
    fp = bilm_fingerprint(bilm)
    assert bilm_fingerprint(tiny_random_bilm(1)) != fp
    params = list(bilm.named_parameters())
    for name, tensor in (params[0], params[len(params) // 2], params[-1]):
        with torch.no_grad():
            old = tensor.view(-1)[0].clone()
            tensor.view(-1)[0] = torch.nextafter(old, old + 1)  # the smallest possible change of one value
            assert bilm_fingerprint(bilm) != fp, name
            tensor.view(-1)[0] = old
        assert bilm_fingerprint(bilm) == fp  # restored: the same again
    assert bilm_fingerprint(copy.deepcopy(bilm).double()) != fp  # same values, another dtype


def test_changes_with_the_config_alone():
    bilm = tiny_random_bilm(0)
    config = dataclasses.replace(bilm.config, lstm=dataclasses.replace(bilm.config.lstm, cell_clip=2.0))
    other = BiLM(config).eval()
    other.load_state_dict(bilm.state_dict())
    assert same_weights(bilm, other)  # only the configuration differs (and so the outputs)
    assert bilm_fingerprint(other) != bilm_fingerprint(bilm)


def test_changes_with_the_character_vocabulary_alone():
    bilm = char_vocab_bilm("abcdefgh")
    fp = bilm_fingerprint(bilm)
    same = copy.deepcopy(bilm)
    same.char_vocab = CharVocabulary(list("abcdefgh"), max_characters_per_token=10)  # an equal vocabulary
    assert bilm_fingerprint(same) == fp
    swapped = copy.deepcopy(bilm)
    swapped.char_vocab = CharVocabulary(list("bacdefgh"), max_characters_per_token=10)  # two ids exchanged
    assert same_weights(bilm, swapped) and bilm_fingerprint(swapped) != fp
    none = copy.deepcopy(bilm)
    none.char_vocab = None
    assert bilm_fingerprint(none) != fp


def test_changes_with_a_stored_start_state():
    bilm = tiny_random_bilm(0)
    fp = bilm_fingerprint(bilm)
    c = torch.full((2, 2, 1, 16), 0.25)
    h = torch.full((2, 2, 1, 8), -0.5)
    bilm.set_start_state((c, h))
    assert bilm_fingerprint(bilm) != fp
    bilm.set_start_state(None)
    assert bilm_fingerprint(bilm) == fp


def test_one_fingerprint_for_embed_parts_feature_caches_and_task_models():
    bilm = tiny_random_bilm(3)
    fp = bilm_fingerprint(bilm)
    assert model_fingerprint(bilm) == fp  # embed --format parts / --resume
    assert bilm_sha256(bilm) == bilm_sha256(Elmo(bilm=bilm, num_output_representations=1)) == fp  # feature cache
    assert tasks_bilm_fingerprint(bilm) == fp  # task models
    with pytest.raises(InputError, match="needs an elmokit BiLM, got Elmo"):
        bilm_fingerprint(Elmo(bilm=bilm, num_output_representations=1))


def test_legacy_weights_sha256_is_the_old_task_model_digest():
    """The digest task models saved before the one fingerprint recorded, computed by hand here."""
    bilm = tiny_random_bilm(0)
    h = hashlib.sha256()
    for name, tensor in sorted(bilm.state_dict().items()):
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    assert legacy_weights_sha256(bilm) == h.hexdigest() != bilm_fingerprint(bilm)
    assert legacy_weights_sha256(tiny_random_bilm(1)) != h.hexdigest()


def test_embed_parts_record_it_and_resume_only_with_the_same_model(tmp_path):
    """The parts index records the fingerprint; --resume continues with the same weights (loaded anew) and refuses
    other weights — and a folder whose index holds an older fingerprint (BLAKE2b, 40 hex digits: parts written by an
    elmokit before the one fingerprint) is refused the same way: embed it again."""
    (tmp_path / "in.txt").write_text("the cat sat\na dog\nred car\n", encoding="utf-8")
    out = tmp_path / "out"

    def embed(bilm, **kwargs):
        return Embedder(bilm).embed_file(
            tmp_path / "in.txt", out, format="parts", progress=False, part_size=2, **kwargs
        )

    assert embed(tiny_random_bilm(0)) == 3
    index = json.loads((out / "index.json").read_text(encoding="utf-8"))
    assert index["model"]["fingerprint"] == bilm_fingerprint(tiny_random_bilm(0))
    (out / "part-000001.hdf5").unlink()  # as if interrupted before the last part
    with pytest.raises(UsageError, match="written with another model"):
        embed(tiny_random_bilm(1), resume=True)
    assert embed(tiny_random_bilm(0), resume=True) == 3 and (out / "part-000001.hdf5").is_file()
    (out / "part-000001.hdf5").unlink()
    index["model"]["fingerprint"] = "0" * 40
    (out / "index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(UsageError, match="written with another model"):
        embed(tiny_random_bilm(0), resume=True)
