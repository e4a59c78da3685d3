"""The recent-word cache (``Embedder(recent_word_cache=N)``, ``elmokit serve --recent-word-cache``): least recently
used out first, values equal to the uncached ones within the batch-independence bound, emptied when a token-encoder
weight changes, safe from several threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import shared_path
from elmokit import Embedder
from elmokit.config import PRESETS
from elmokit.embedding.recent_words import RecentWordVectors
from elmokit.errors import UsageError, UsageTypeError
from elmokit.modules.bilm import BiLM
from elmokit.tasks.readers import read_conllu

#: the batch-independence bound of ``Embedder``: relative to each layer's largest |value| (absolute below 1)
BOUND = 1e-5


def _within_bound(got: np.ndarray, want: np.ndarray) -> bool:
    assert got.shape == want.shape
    for k in range(want.shape[0]):
        scale = max(1.0, float(np.abs(want[k]).max()))
        if float(np.abs(got[k] - want[k]).max()) > BOUND * scale:
            return False
    return True


@pytest.fixture(scope="module")
def sentences():
    """120 sentences of UD English-EWT dev (their own tokenisation): words repeat across them, as in real text."""
    path = shared_path("data", "ud-english-ewt", "en_ewt-ud-dev.conllu")
    return [list(s.tokens) for s in read_conllu(path, limit=120)]


@pytest.fixture(scope="module")
def bilm(one_thread):
    """The released "small" shape with random weights ×4 (values up to ~100 and firing clips, as a trained model's)."""
    torch.manual_seed(0)
    model = BiLM(PRESETS["small"]())
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model.eval()


# ------------------------------------------------------------------------------------------------ the LRU itself
def test_least_recently_used_word_leaves_first_and_counts_hits_and_misses():
    weight = torch.zeros(2)
    cache = RecentWordVectors(3, 2, (weight,))
    vectors = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    cache.store(["a", "b", "c"], vectors)
    out = torch.zeros(2, 2)
    assert cache.fill(["a", "z"], out, [1, 0]) == [1]  # "a" found (now the most recent), "z" not
    assert out.tolist() == [[0.0, 0.0], [1.0, 10.0]]
    cache.store(["d"], torch.tensor([[4.0, 40.0]]))  # full: "b", the least recently used, leaves
    out = torch.zeros(4, 2)
    assert cache.fill(["a", "b", "c", "d"], out, [0, 1, 2, 3]) == [1]
    assert out.tolist() == [[1.0, 10.0], [0.0, 0.0], [3.0, 30.0], [4.0, 40.0]]
    assert (cache.hits, cache.misses, len(cache)) == (4, 2, 3)
    # a word stored twice keeps its first vector; a call longer than the capacity keeps its last words
    cache.store(["a", "e", "f", "g"], torch.tensor([[9.0, 9.0], [5.0, 50.0], [6.0, 60.0], [7.0, 70.0]]))
    out = torch.zeros(4, 2)
    assert cache.fill(["e", "f", "g", "a"], out, [0, 1, 2, 3]) == [3]
    assert out[:3].tolist() == [[5.0, 50.0], [6.0, 60.0], [7.0, 70.0]]


def test_it_empties_itself_when_a_source_weight_changes():
    weight = torch.zeros(2)
    cache = RecentWordVectors(4, 2, (weight,))
    cache.store(["a"], torch.ones(1, 2))
    assert cache.fill(["a"], torch.zeros(1, 2), [0]) == []
    with torch.no_grad():
        weight.add_(1.0)  # bumps the version counter
    assert cache.fill(["a"], torch.zeros(1, 2), [0]) == [0] and len(cache) == 0


@pytest.mark.parametrize(
    "value, error, message",
    [(-1, UsageError, "recent_word_cache must be an int >= 0, got -1"), ("10", UsageTypeError, "got '10' (str)")],
)
def test_a_bad_capacity_is_one_clear_error(value, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        Embedder(BiLM(PRESETS["small"]()), recent_word_cache=value)


# ------------------------------------------------------------------------------------------------ in the Embedder
def test_cached_words_give_the_uncached_values_within_the_bound(bilm, sentences):
    plain = Embedder(bilm)
    cached = Embedder(bilm, recent_word_cache=50_000)
    assert cached.recent_words is not None and plain.recent_words is None
    distinct = {w for s in sentences for w in s}
    for rounds in range(2):  # the second round reads every word from the cache
        for start in range(0, len(sentences), 15):
            batch = sentences[start : start + 15]
            for got, want in zip(cached.embed_batch(batch), plain.embed_batch(batch)):
                assert _within_bound(got, want)
        if rounds == 0:
            first_hits = cached.recent_words.hits
    recent = cached.recent_words
    assert len(recent) == len(distinct)
    # round 2: each batch's distinct words, all found
    per_batch = sum(len({w for s in sentences[i : i + 15] for w in s}) for i in range(0, len(sentences), 15))
    assert recent.hits - first_hits == per_batch
    assert recent.misses == len(distinct)  # each word encoded from its characters once
    assert max(float(np.abs(a).max()) for a in plain.embed_batch(sentences[:15])) > 20  # the scale is exercised


def test_a_cache_smaller_than_a_batch_and_threads_sharing_it(bilm, sentences):
    plain = Embedder(bilm)
    small = Embedder(bilm, recent_word_cache=25)  # far fewer words than a batch holds: evictions all the time
    batches = [sentences[i : i + 10] for i in range(0, 80, 10)]
    want = [plain.embed_batch(b, layers="average", pool="mean") for b in batches]
    got: list = [None] * len(batches)
    errors: list = []

    def work(i):
        try:
            for _ in range(2):
                got[i] = small.embed_batch(batches[i], layers="average", pool="mean")
        except Exception as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert float(np.abs(a - b).max()) <= BOUND * max(1.0, float(np.abs(b).max()))
    assert len(small.recent_words) == 25 and small.recent_words.hits > 0


def test_a_changed_token_encoder_is_not_served_from_stale_vectors(sentences):
    torch.manual_seed(1)
    model = BiLM(PRESETS["small"]()).eval()
    cached = Embedder(model, recent_word_cache=1000)
    before = cached.embed_batch(sentences[:4])
    with torch.no_grad():
        model.token_encoder.projection.weight.mul_(1.5)
    after = cached.embed_batch(sentences[:4])
    fresh = Embedder(model).embed_batch(sentences[:4])
    for a, f, b in zip(after, fresh, before):
        assert _within_bound(a, f)
        assert not _within_bound(a, b)  # the change is visible: the old vectors were dropped
