"""AllenNLP habits that elmokit supports, checked in elmokit's own words and numbers: a prebuilt biLM as ``module=``,
(B, N, T, C) inputs, the ScalarMix parameter layout, ``tokens_to_add``, ``vocab_to_cache`` + ``word_inputs``,
``Embedder(options_file, weight_file)``, hand-made character ids, and AllenNLP 2.x's ``_ElmoBiLm`` /
``_ElmoCharacterEncoder`` (elmokit.compat.allennlp) against AllenNLP's reference outputs. AllenNLP's own tests run
against elmokit with tools/allennlp_tests.py."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from elmokit import Elmo, Embedder, InputError, TokenVectorCache, UsageError, batch_to_ids
from elmokit.characters import CharVocabulary
from elmokit.compat.allennlp import _ElmoBiLm, _ElmoCharacterEncoder
from elmokit.modules.padding import remove_sentence_boundaries
from helpers import assert_close_to_scale, expected_top, fixture_dir, fixture_model, fixture_sentences, tiny_random_bilm

SENTS = [["The", "sentence", "."], ["ELMo", "helps", "disambiguate", "ELMo", "from", "Elmo", "."]]


@pytest.fixture(scope="module")
def bilm():
    return fixture_model("allennlp-elmo")


def _reps(elmo, *args):
    with torch.no_grad():
        return elmo(*args)


def test_module_argument_is_a_prebuilt_bilm(bilm):
    ids = batch_to_ids(SENTS)
    ref = _reps(Elmo(bilm=bilm, num_output_representations=2, dropout=0.0), ids)
    got = _reps(Elmo(None, None, 2, dropout=0.0, module=bilm), ids)
    assert len(got["elmo_representations"]) == 2 and got["elmo_representations"][0].shape == (2, 7, 32)
    assert torch.equal(got["elmo_representations"][0], ref["elmo_representations"][0])
    d = fixture_dir("allennlp-elmo")
    with pytest.raises(UsageError, match="options_file=None and weight_file=None"):
        Elmo(d / "options.json", d / "lm_weights.hdf5", 1, module=bilm)
    with pytest.raises(UsageError, match="module= .* or bilm=, not both"):
        Elmo(module=bilm, bilm=fixture_model("allennlp-elmo"))
    with pytest.raises(UsageError, match="AllenNLP's biLM contract"):
        Elmo(module=nn.Linear(2, 2))
    with pytest.raises(UsageError, match="options_file and weight_file"):
        Elmo(None, None, 1)


class _AllenNLPStyleBiLM(nn.Module):
    """A module with AllenNLP's contract (num_layers, forward -> {"activations", "mask"}) over an elmokit BiLM."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.num_layers = inner.num_layers

    def get_output_dim(self):
        return self.inner.output_dim

    def forward(self, inputs, word_inputs=None):
        out = self.inner(inputs, keep_sentence_boundaries=True)
        return {"activations": list(out.layers.unbind(1)), "mask": out.mask}


def test_module_with_allennlps_contract(bilm):
    ids = batch_to_ids(SENTS)
    ref = _reps(Elmo(bilm=bilm, dropout=0.0, keep_sentence_boundaries=True), ids)
    elmo = Elmo(None, None, 1, dropout=0.0, keep_sentence_boundaries=True, module=_AllenNLPStyleBiLM(bilm))
    got = _reps(elmo, ids)
    assert got["elmo_representations"][0].shape == (2, 9, 32) and elmo.get_output_dim() == 32
    assert torch.equal(got["elmo_representations"][0], ref["elmo_representations"][0])
    assert torch.equal(got["mask"], ref["mask"])
    with pytest.raises(UsageError, match="not an elmokit BiLM"):
        _ = elmo.bilm
    with pytest.raises(UsageError, match="vocab_to_cache needs an elmokit BiLM"):
        Elmo(module=_AllenNLPStyleBiLM(bilm), vocab_to_cache=["a"])


@pytest.mark.parametrize("keep", [False, True])
def test_higher_dimensional_inputs_are_flattened_and_restored(bilm, keep):
    groups = [SENTS, [["1", "2"], ["1", "2", "3", "4", "5", "6", "7"]], [["a", "b", "c", "d", "e", "f", "g"], ["x"]]]
    per_group = [batch_to_ids(g) for g in groups]  # each (2, 7, 50)
    ids = torch.stack(per_group, dim=1)  # (B=2, N=3, T=7, 50)
    elmo = Elmo(bilm=bilm, dropout=0.0, keep_sentence_boundaries=keep)
    out = _reps(elmo, ids)
    t = 7 + 2 * keep
    assert out["elmo_representations"][0].shape == (2, 3, t, 32) and out["mask"].shape == (2, 3, t)
    for k, g in enumerate(per_group):
        alone = _reps(elmo, g)
        assert torch.equal(out["mask"][:, k], alone["mask"])
        diff = (out["elmo_representations"][0][:, k] - alone["elmo_representations"][0]).abs().max()
        assert diff <= 1e-5
    # five dims: (1, 2, 3, 7, 50)
    out5 = _reps(elmo, ids.unsqueeze(0))
    assert out5["elmo_representations"][0].shape == (1, 2, 3, t, 32) and out5["mask"].shape == (1, 2, 3, t)


def test_hand_made_ids_are_accepted_like_allennlp(bilm):
    # AllenNLP's own tests feed random ids and rows such as [6, 5, 4, 3, 0, ...]; a position is a real token when any
    # id is non-zero (so [0, 5, 0, ...] is real too)
    word1 = [6, 5, 4, 3] + [0] * 46
    word2 = [0, 5] + [0] * 48
    ids = torch.tensor([[word1, word2]])
    out = _reps(Elmo(bilm=bilm, dropout=0.0), ids)
    assert out["mask"].tolist() == [[True, True]]
    assert torch.isfinite(out["elmo_representations"][0]).all()
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 262, (3, 4, 50), generator=g)
    assert _reps(Elmo(bilm=bilm, dropout=0.0), rand)["mask"].all()
    # what stays refused: padding before a real token, and ids that all belong to the other scheme
    with pytest.raises(InputError, match="row 0 has padding .* at position 0 before a real token"):
        bilm(torch.tensor([[[0] * 50, word1]]))
    vocab = CharVocabulary(list("abc"))
    with pytest.raises(InputError, match="other character scheme"):
        bilm(batch_to_ids([["ab", "c"]], char_vocab=vocab))


def test_requires_grad_reaches_every_bilm_parameter(bilm):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 262, (3, 4, 50), generator=g)
    tuned = Elmo(bilm=fixture_model("allennlp-elmo"), requires_grad=True)
    tuned(ids)["elmo_representations"][0].sum().backward()
    assert all(p.grad is not None for p in tuned.bilm.parameters())
    frozen = Elmo(bilm=fixture_model("allennlp-elmo"))
    frozen(ids)["elmo_representations"][0].sum().backward()
    assert all(p.grad is None for p in frozen.bilm.parameters())


def test_scalar_mix_names_and_elmo_aliases(bilm):
    elmo = Elmo(bilm=bilm, num_output_representations=2)
    assert elmo.scalar_mix_0 is elmo.scalar_mixes[0] and elmo.scalar_mix_1 is elmo.scalar_mixes[1]
    assert elmo.scalar_mix_0.scalar_parameters[2].shape == (1,)
    with pytest.raises(AttributeError):
        _ = elmo.scalar_mix_2


WORDS = ["@@PADDING@@", "@@UNKNOWN@@", "one", "This", "is", "a", "sentence", "Here", "'s", "Another"]
CACHE_SENTS = [["This", "is", "a", "sentence"], ["Here", "'s", "one"], ["Another", "one"]]


def _word_ids(sentences):
    t = max(len(s) for s in sentences)
    return torch.tensor([[WORDS.index(w) for w in s] + [0] * (t - len(s)) for s in sentences])


def test_vocab_to_cache_gives_the_character_path_numbers(bilm):
    chars, words = batch_to_ids(CACHE_SENTS), _word_ids(CACHE_SENTS)
    plain = Elmo(bilm=bilm, dropout=0.0)
    cached = Elmo(bilm=bilm, dropout=0.0, vocab_to_cache=WORDS)
    with torch.no_grad():
        cached.scalar_mixes[0].scalar_parameters[2].fill_(1.5)  # a real mix, not equal weights
        plain.scalar_mixes[0].scalar_parameters[2].fill_(1.5)
    ref = _reps(plain, chars)
    for args in ((chars, words), (None, words)):
        got = _reps(cached, *args)
        assert torch.equal(got["mask"], ref["mask"])
        assert_close_to_scale(got["elmo_representations"][0], ref["elmo_representations"][0], 1e-6)
    assert len(cached.word_cache) == 10 and cached.word_cache.vectors.shape == (10, 16)
    # id 0 is padding: masked out, whatever words[0] is
    assert _reps(cached, None, torch.tensor([[3, 4, 0, 0]]))["mask"].tolist() == [[True, True, False, False]]
    # the cache holds the context-free token vectors of the words
    with torch.no_grad():
        direct = bilm.token_encoder(batch_to_ids([WORDS[1:]]))[0]
    assert_close_to_scale(cached.word_cache.vectors[1:], direct, 1e-6)


def test_vocab_to_cache_higher_dims_and_fallback(bilm, caplog):
    chars, words = batch_to_ids(CACHE_SENTS), _word_ids(CACHE_SENTS)
    cached = Elmo(bilm=bilm, dropout=0.0, vocab_to_cache=WORDS)
    single = _reps(cached, chars, words)["elmo_representations"][0]
    stacked = _reps(cached, torch.stack([chars] * 4, 1), torch.stack([words] * 4, 1))
    assert stacked["elmo_representations"][0].shape == (3, 4, 4, 32) and stacked["mask"].shape == (3, 4, 4)
    for k in range(4):
        assert_close_to_scale(stacked["elmo_representations"][0][:, k], single, 1e-6)
    stacked_words_only = _reps(cached, None, torch.stack([words] * 2, 1))
    assert stacked_words_only["elmo_representations"][0].shape == (3, 2, 4, 32)
    # an id outside the cache: AllenNLP falls back to the character ids; without them it is an error
    oov = words.clone()
    oov[0, 0] = 99
    with caplog.at_level(logging.INFO, logger="elmokit.elmo"):
        fallback = _reps(cached, chars, oov)["elmo_representations"][0]
    assert_close_to_scale(fallback, single, 1e-6)
    assert "outside the cached vocabulary" in caplog.text
    with pytest.raises(InputError, match="99, outside the cached vocabulary of 10 words"):
        cached(None, oov)
    with pytest.raises(InputError, match="integer tensor"):
        cached(None, words.float())
    with pytest.raises(InputError, match="do not match"):
        cached(chars, words[:, :2])
    with pytest.raises(InputError, match="needs character ids"):
        Elmo(bilm=bilm)(None)
    # word_inputs without vocab_to_cache: ignored with a warning, as AllenNLP
    plain = Elmo(bilm=bilm, dropout=0.0)
    with caplog.at_level(logging.WARNING, logger="elmokit.elmo"):
        got = _reps(plain, chars, words)["elmo_representations"][0]
    assert "no vocab_to_cache" in caplog.text
    assert_close_to_scale(got, single, 1e-6)
    with pytest.raises(UsageError, match="vocab_to_cache entry 1 is a int"):
        Elmo(bilm=bilm, vocab_to_cache=["a", 3])
    with pytest.raises(UsageError, match="list of words"):
        Elmo(bilm=bilm, vocab_to_cache="words")


def test_vocab_to_cache_when_fine_tuning_is_a_trained_table():
    model = tiny_random_bilm()
    elmo = Elmo(bilm=model, dropout=0.0, requires_grad=True, vocab_to_cache=WORDS)
    assert isinstance(elmo.word_cache.vectors, nn.Parameter)
    elmo(None, _word_ids(CACHE_SENTS))["elmo_representations"][0].sum().backward()
    assert elmo.word_cache.vectors.grad is not None
    assert elmo.word_cache.vectors.grad[0].abs().max() == 0  # padding rows get no gradient
    frozen = Elmo(bilm=tiny_random_bilm(), vocab_to_cache=WORDS)
    assert "word_cache.vectors" not in frozen.state_dict()  # a buffer recomputed from the weights, not saved
    with pytest.raises(UsageError, match="TokenVectorCache needs a BiLM"):
        TokenVectorCache(nn.Linear(1, 1), WORDS)


def test_embedder_takes_allennlps_elmoembedder_arguments(bilm):
    d = fixture_dir("allennlp-elmo")
    a = Embedder(str(d / "options.json"), str(d / "lm_weights.hdf5"), batch_size=2)
    b = Embedder(Elmo(d / "options.json", d / "lm_weights.hdf5", 1))
    expected = Embedder(bilm).embed_sentence(SENTS[1])
    for emb in (a, b):
        np.testing.assert_array_equal(emb.embed_sentence(SENTS[1]), expected)
    assert [x.shape for x in a.embed_sentences(SENTS)] == [(3, 3, 32), (3, 7, 32)]


# ---------------------------------------------------------------------------------------------- AllenNLP 2.x modules
@pytest.fixture(scope="module")
def files():
    d = fixture_dir("allennlp-elmo")
    return str(d / "options.json"), str(d / "lm_weights.hdf5")


def _fixture_vocab() -> tuple[list[str], np.ndarray]:
    """vocab_test.txt's words and AllenNLP's context-free token vectors of them (elmo_token_embeddings.hdf5)."""
    d = fixture_dir("allennlp-elmo")
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as fh:
        return (d / "vocab_test.txt").read_text(encoding="utf-8").split("\n"), fh["embedding"][...]


def test_elmobilm_contract_and_allennlps_reference_outputs(files):
    sentences = fixture_sentences("allennlp-elmo")
    stateful, stateless = _ElmoBiLm(*files, stateful=True), _ElmoBiLm(*files)
    assert stateless.get_num_layers() == stateless.num_layers == 3 and stateless.get_output_dim() == 32
    assert not any(p.requires_grad for p in stateless.parameters())
    assert all(p.requires_grad for p in _ElmoBiLm(*files, requires_grad=True).parameters())
    errors = {"stateful": [], "stateless": []}
    for i in range(10):  # AllenNLP's batches: sentence i of lists 0, 1, 2
        ids = batch_to_ids([sentences[k][i].split() for k in range(3)])
        for name, model in (("stateful", stateful), ("stateless", stateless)):
            with torch.no_grad():
                out = model(ids)
            t = ids.shape[1]
            assert [a.shape for a in out["activations"]] == [(3, t + 2, 32)] * 3 and out["mask"].shape == (3, t + 2)
            top, mask = remove_sentence_boundaries(out["activations"][2].unsqueeze(1), out["mask"])
            for k in range(3):
                n = len(sentences[k][i].split())
                assert out["mask"][k].sum() == n + 2 and mask[k].sum() == n
                errors[name].append(
                    float((top[k, 0, :n] - torch.tensor(expected_top("allennlp-elmo", k, i))).abs().max())
                )
    assert max(errors["stateful"]) <= 1e-5  # AllenNLP's carried state, reproduced
    assert max(errors["stateless"][:3]) <= 1e-5 and min(errors["stateless"][3:]) > 0.01  # the default: zero state
    stateful.reset_states()
    with torch.no_grad():
        again = stateful(batch_to_ids([sentences[k][0].split() for k in range(3)]))["activations"][2]
        fresh = stateless(batch_to_ids([sentences[k][0].split() for k in range(3)]))["activations"][2]
    assert_close_to_scale(again, fresh, 1e-6)


def test_elmobilm_vocab_to_cache_is_allennlps_token_table(files):
    words, table = _fixture_vocab()
    vocab = ["@@PADDING@@", *words]  # id 0 is padding, as in an AllenNLP vocabulary
    cached = _ElmoBiLm(*files, vocab_to_cache=vocab)
    assert_close_to_scale(cached._word_cache.vectors[1:], table, 1e-5)
    sents = [words[5:8], words[21:22]]  # words of vocab_test.txt ("care ; case", "nomad")
    chars = batch_to_ids(sents)
    word_ids = torch.tensor([[vocab.index(w) for w in s] + [0] * (3 - len(s)) for s in sents])
    plain = _ElmoBiLm(*files)
    with torch.no_grad():
        want = plain(chars, chars)  # word_inputs without a cache are ignored, as in AllenNLP
        for got in (cached(chars, word_ids), cached(None, word_ids)):
            assert torch.equal(got["mask"], want["mask"])
            for a, b in zip(got["activations"], want["activations"]):
                assert_close_to_scale(a, b, 1e-5)
        oov = word_ids.clone()
        oov[0, 0] = len(vocab)  # outside the cache: the character ids are used
        assert_close_to_scale(cached(chars, oov)["activations"][2], want["activations"][2], 1e-6)
    with pytest.raises(InputError, match="outside the cached vocabulary"):
        cached(None, oov)
    late = _ElmoBiLm(*files)
    late.create_cached_cnn_embeddings(vocab[:10])
    assert late._word_cache.vectors.shape == (10, 16)


def test_elmo_takes_an_elmobilm_module_and_4d_input(files):
    ids = batch_to_ids(SENTS)
    ref = _reps(Elmo(*files, 2, dropout=0.0), ids)
    elmo = Elmo(None, None, 2, dropout=0.0, module=_ElmoBiLm(*files))
    got = _reps(elmo, ids)
    assert elmo.get_output_dim() == 32 and len(got["elmo_representations"]) == 2
    assert torch.equal(got["mask"], ref["mask"])
    assert_close_to_scale(got["elmo_representations"][0], ref["elmo_representations"][0], 1e-6)
    stacked = _reps(elmo, torch.stack([ids, ids.flip(0)], dim=1))  # (2, 2, 7, 50)
    assert stacked["elmo_representations"][1].shape == (2, 2, 7, 32)
    assert_close_to_scale(stacked["elmo_representations"][1][:, 0], got["elmo_representations"][1], 1e-5)
    assert_close_to_scale(stacked["elmo_representations"][1][:, 1], got["elmo_representations"][1].flip(0), 1e-5)
    # AllenNLP code resets the state with elmo._elmo_lstm._elmo_lstm.reset_states(): a no-op when stateless, a reset
    # of the carried state when stateful
    stateless = Elmo(*files, 1, dropout=0.0)
    assert stateless._elmo_lstm._elmo_lstm is stateless.bilm
    stateless._elmo_lstm._elmo_lstm.reset_states()
    stateful = Elmo(*files, 1, dropout=0.0, stateful=True)
    first = _reps(stateful, ids)["elmo_representations"][0]
    carried = _reps(stateful, ids)["elmo_representations"][0]
    assert (carried - first).abs().max() > 0.01
    stateful._elmo_lstm._elmo_lstm.reset_states()
    assert torch.equal(_reps(stateful, ids)["elmo_representations"][0], first)


def test_elmo_character_encoder_is_allennlps_token_table(files):
    words, table = _fixture_vocab()
    encoder = _ElmoCharacterEncoder(*files)
    assert encoder.get_output_dim() == 16
    chunks = [words[i : i + 50] for i in range(0, len(words), 50)]  # as AllenNLP's test: rows of 50 words
    with torch.no_grad():
        out = encoder(batch_to_ids(chunks, empty_tokens="keep"))
    assert out["token_embedding"].shape == (10, 52, 16) and out["mask"].shape == (10, 52)
    vectors, mask = remove_sentence_boundaries(out["token_embedding"].unsqueeze(1), out["mask"])
    assert_close_to_scale(vectors[:, 0][mask], table, 1e-5)
    boundaries = encoder(batch_to_ids([["<S>", "</S>"]]))["token_embedding"][0]
    assert_close_to_scale(boundaries[1], boundaries[0], 1e-6)  # the word "<S>" is the <S> row, as in AllenNLP
    assert_close_to_scale(boundaries[2], boundaries[3], 1e-6)
