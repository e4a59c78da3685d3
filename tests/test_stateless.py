"""Stateless inference: a sentence's vectors do not depend on its batch, its padding, or earlier calls."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmokit import Elmo, Embedder, batch_to_ids
from elmokit.errors import InputError
from elmokit.modules.bilm import StatefulBiLM
from helpers import assert_close_to_scale, fixture_model

MODEL = None


def _model():
    global MODEL
    if MODEL is None:
        MODEL = fixture_model("allennlp-elmo")
    return MODEL


tokens = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=12)
sentences = st.lists(st.lists(tokens, min_size=0, max_size=9), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=sentences, seed=st.integers(0, 2**16))
def test_sentence_alone_equals_sentence_in_any_padded_batch(batch, seed):
    model = _model()
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [batch[i] for i in order]
    with torch.no_grad():  # arbitrary tokens, blank ones too ("keep": the original's encoding)
        together = model(batch_to_ids(shuffled, empty_tokens="keep"))
        for pos, i in enumerate(order):
            alone = model(batch_to_ids([batch[i]], empty_tokens="keep"))
            n = len(batch[i])
            assert together.mask[pos].sum().item() == n
            diff = (together.layers[pos, :, :n] - alone.layers[0, :, :n]).abs()
            assert diff.numel() == 0 or diff.max().item() <= 1e-5
            assert together.layers[pos, :, n:].abs().max().item() == 0 if together.layers.shape[2] > n else True


def test_no_state_leaks_between_calls():
    model = _model()
    ids = batch_to_ids([["The", "bank", "of", "the", "river"]])
    with torch.no_grad():
        first = model(ids).layers
        model(batch_to_ids([["Something", "else", "entirely", "."] * 5]))
        second = model(ids).layers
    assert torch.equal(first, second)


def test_stateful_mode_carries_state_and_resets():
    model = fixture_model("allennlp-elmo", stateful=True)
    ids = batch_to_ids([["The", "bank"]])
    with torch.no_grad():
        a = model(ids).layers
        b = model(ids).layers
        model.reset_states()
        c = model(ids).layers
    assert (a - b).abs().max() > 1e-3
    assert torch.equal(a, c)


def test_stateful_rows_outside_batch_keep_state():
    model = fixture_model("allennlp-elmo", stateful=True)
    with torch.no_grad():
        model(batch_to_ids([["one", "two"], ["three"]]))
        kept = model._state[1][:, :, 1].clone()
        out = model(batch_to_ids([["four"]]))
        assert torch.equal(model._state[1][:, :, 1], kept)
        assert torch.equal(model._state[1][:, :, :1], out.state[1])


def test_elmo_batch_invariance_with_layer_norm_off():
    elmo = Elmo(bilm=_model(), dropout=0.0)
    with torch.no_grad():
        both = elmo(batch_to_ids([["a", "b", "c"], ["river", "bank"]]))["elmo_representations"][0]
        alone = elmo(batch_to_ids([["river", "bank"]]))["elmo_representations"][0]
    assert_close_to_scale(both[1, :2], alone[0], 1e-5)


def test_embedder_runs_a_stateful_model_statelessly_without_changing_it():
    # Embedder used to switch the model's `stateful` flag off for good; now it runs stateless per call only
    model = fixture_model("allennlp-elmo", stateful=True)
    ids = batch_to_ids([["The", "bank"]])
    with torch.no_grad():
        first = model(ids).layers
    carried = model._state[1].clone()
    embedder = Embedder(model)
    a = embedder.embed_sentence(["The", "bank"])
    b = embedder.embed_sentence(["The", "bank"])
    assert model.stateful is True and torch.equal(model._state[1], carried)
    assert isinstance(model, StatefulBiLM) and model.bilm.stateful is False
    assert (a == b).all()
    model.reset_states()
    assert abs(a - first[0].numpy()).max() <= 1e-6  # the stateless result = a fresh state's


def test_explicit_state_equals_the_stateful_wrapper():
    """forward(ids, state) returns the state reached; feeding it back reproduces the carried-state wrapper."""
    stateless = fixture_model("allennlp-elmo")
    stateful = StatefulBiLM(stateless)
    first = batch_to_ids([["The", "river", "bank"], ["Money"]])
    second = batch_to_ids([["was", "flooded", "."], ["talks", "."]])
    with torch.no_grad():
        a = stateless(first)
        b = stateless(second, a.state)
        fresh = stateless(second)
        wa, wb = stateful(first), stateful(second)
    assert a.state[0].shape == (2, 2, 2, 64) and a.state[1].shape == (2, 2, 2, 16)
    assert torch.equal(a.layers, wa.layers) and torch.equal(b.layers, wb.layers)
    assert (b.layers - fresh.layers).abs().max() > 1e-3  # the state mattered
    with torch.no_grad():
        again = stateless(second)
    assert torch.equal(again.layers, fresh.layers)  # nothing was kept on the module


def test_explicit_state_of_the_wrong_shape_is_refused():
    model = fixture_model("allennlp-elmo")
    ids = batch_to_ids([["a", "b"], ["c"]])
    with torch.no_grad():
        state = model(ids).state
        with pytest.raises(InputError, match=r"state must be \(c, h\).*\(2, 2, 1, 64\)"):
            model(batch_to_ids([["a"]]), state)
        with pytest.raises(InputError, match="state must be"):
            model(ids, state[0])


def test_one_model_is_safe_from_many_threads():
    """Eight threads embedding different sentences with one BiLM and one Embedder get what one thread gets."""
    from concurrent.futures import ThreadPoolExecutor

    model = fixture_model("allennlp-elmo")
    embedder = Embedder(model)
    sentences = [
        [w for w in f"sentence {i} has a river bank number {i % 7} and words".split()][: 3 + i % 8] for i in range(48)
    ]
    expected = [embedder.embed_sentence(s) for s in sentences]
    with torch.no_grad():
        expected_bilm = [model(batch_to_ids([s])).layers[0] for s in sentences]

    def work(i):
        with torch.no_grad():
            direct = model(batch_to_ids([sentences[i]])).layers[0]
        return i, embedder.embed_sentence(sentences[i]), direct

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, [i for _ in range(3) for i in range(len(sentences))]))
    for i, vectors, direct in results:
        assert_close_to_scale(vectors, expected[i], 1e-6)  # layer values reach ~3.4: relative above 1
        assert_close_to_scale(direct, expected_bilm[i], 1e-6)
