"""The batch-independence bound ``Embedder`` states: a sentence embedded in any batch equals it embedded alone within
1e-5 of the largest value of each of its layers (absolute below 1). Property test over batch compositions
(hypothesis), on random models of the three released shapes (small, medium, original) with weights ×4 (values up to
~100 and firing clips, as a trained model's), on real text of mixed lengths (UD English-EWT dev).

``python bench/batch_invariance.py`` measured at most 1e-6 of the scale on these models, with sentences up to 200
tokens (docs/explanation/numerics.md); a trained model moves more (issue 39), which is why the page states
no general bound for the default path.

With ``Embedder(batch_invariant=True)`` (second half) the vectors are the same bits in any batch: a property test over
random batches of real sentences of 1 to 200 tokens on the three shapes."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import shared_path
from elmokit import Embedder
from elmokit.config import PRESETS
from elmokit.modules.bilm import BiLM
from elmokit.tasks.readers import read_conllu

#: the stated bound, relative to each layer's largest |value| (absolute below 1)
BOUND = 1e-5
#: hypothesis examples per preset: the original shape's random model costs about a second a batch
EXAMPLES = {"small": 12, "medium": 8, "original": 4}


def _sentences() -> list[list[str]]:
    """12 sentences of UD English-EWT dev of mixed lengths (1 to ~40 tokens), their own tokenisation."""
    path = shared_path("data", "ud-english-ewt", "en_ewt-ud-dev.conllu")
    by_length = sorted((list(s.tokens) for s in read_conllu(path, limit=300)), key=len)
    picks = np.linspace(0, len(by_length) - 1, 12).round().astype(int)
    return [by_length[i] for i in picks if len(by_length[i]) <= 45]


@pytest.fixture(scope="module", params=list(EXAMPLES))
def case(request):
    torch.manual_seed(0)
    bilm = BiLM(PRESETS[request.param]())
    with torch.no_grad():
        for p in bilm.parameters():
            p.mul_(4.0)
    embedder = Embedder(bilm, batch_size=64)
    sentences = _sentences()
    alone = [embedder.embed_sentence(s) for s in sentences]
    return request.param, embedder, sentences, alone


def test_a_sentence_in_any_batch_equals_it_alone_within_the_bound(case):
    preset, embedder, sentences, alone = case
    assert max(float(np.abs(a).max()) for a in alone) > 20  # the scale the bound is relative to is exercised

    @settings(max_examples=EXAMPLES[preset], deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.integers(0, len(sentences) - 1), min_size=2, max_size=len(sentences)))
    def check(picked):
        for i, got in zip(picked, embedder.embed_batch([sentences[j] for j in picked])):
            want = alone[i]
            for k in range(want.shape[0]):
                scale = max(1.0, float(np.abs(want[k]).max()))
                err = float(np.abs(got[k] - want[k]).max())
                assert err <= BOUND * scale, (preset, i, k, err, scale)

    check()


# ------------------------------------------------------------------------------------- exact, with the option on
#: hypothesis examples per preset for the bitwise test (each is one batch of up to 6 sentences)
EXACT_EXAMPLES = {"small": 6, "medium": 4, "original": 3}


@functools.cache
def _long_sentences() -> list[list[str]]:
    """Real text up to 200 tokens: UD English-EWT train's longest sentence (159 tokens) and its first 200 tokens of
    consecutive sentences joined (a run-on paragraph, as a user's unsplit line)."""
    path = shared_path("data", "ud-english-ewt", "en_ewt-ud-train.conllu")
    train = [list(s.tokens) for s in read_conllu(path)]
    joined: list[str] = []
    for s in train:
        joined += s
        if len(joined) >= 200:
            break
    return [max(train, key=len), joined[:200]]


@pytest.fixture(scope="module", params=list(EXACT_EXAMPLES))
def exact_case(request):
    from elmokit.modules import native

    if native.kernels() is None:
        pytest.skip("the batch-invariant path needs the native kernels")
    torch.manual_seed(1)
    bilm = BiLM(PRESETS[request.param]())
    with torch.no_grad():
        for p in bilm.parameters():
            p.mul_(4.0)
    embedder = Embedder(bilm, batch_size=64, batch_invariant=True)
    sentences = _sentences()[::2] + _long_sentences()
    alone = [embedder.embed_sentence(s) for s in sentences]
    return request.param, embedder, sentences, alone


def test_with_batch_invariant_a_sentence_in_any_batch_is_the_same_bits_as_alone(exact_case):
    """Random batches (any order, repeats allowed, 2 to 6 sentences of 1 to 200 tokens, padded to the longest) of
    real text on random models of the small, medium and original shapes: every sentence's vectors, every layer,
    equal it embedded alone bit for bit."""
    preset, embedder, sentences, alone = exact_case
    assert max(len(s) for s in sentences) == 200

    @settings(
        max_examples=EXACT_EXAMPLES[preset], deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(st.lists(st.integers(0, len(sentences) - 1), min_size=2, max_size=6))
    def check(picked):
        for i, got in zip(picked, embedder.embed_batch([sentences[j] for j in picked])):
            assert np.array_equal(got, alone[i]), (preset, i, len(sentences[i]), float(np.abs(got - alone[i]).max()))

    check()


def test_with_batch_invariant_thread_counts_and_batch_sizes_give_the_same_bits():
    """One stream of sentences through embed_sentences at batch sizes 1, 3 and 64 and on 1, 2 and 3 threads (what
    ``elmokit embed --batch-size … --workers …`` varies): the same bits every time."""
    from elmokit.modules import native

    if native.kernels() is None:
        pytest.skip("the batch-invariant path needs the native kernels")
    torch.manual_seed(2)
    embedder = Embedder(BiLM(PRESETS["small"]()), batch_invariant=True)
    sentences = _sentences()
    want = list(embedder.embed_sentences(sentences, batch_size=64))
    before = torch.get_num_threads()
    try:
        for threads, batch_size in ((1, 1), (2, 3), (3, 64)):
            torch.set_num_threads(threads)
            got = list(embedder.embed_sentences(sentences, batch_size=batch_size))
            assert all(np.array_equal(g, w) for g, w in zip(got, want)), (threads, batch_size)
    finally:
        torch.set_num_threads(before)
