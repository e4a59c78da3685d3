"""Stateless inference: a sentence's vectors do not depend on its batch, its padding, or earlier calls."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmokit import Elmo, Embedder, batch_to_ids
from helpers import fixture_model

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
        model(batch_to_ids([["four"]]))
        assert torch.equal(model._state[1][:, :, 1], kept)


def test_elmo_batch_invariance_with_layer_norm_off():
    elmo = Elmo(bilm=_model(), dropout=0.0)
    with torch.no_grad():
        both = elmo(batch_to_ids([["a", "b", "c"], ["river", "bank"]]))["elmo_representations"][0]
        alone = elmo(batch_to_ids([["river", "bank"]]))["elmo_representations"][0]
    assert (both[1, :2] - alone[0]).abs().max() <= 1e-5


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
    assert (a == b).all()
    model.reset_states()
    assert abs(a - first[0].numpy()).max() <= 1e-6  # the stateless result = a fresh state's
