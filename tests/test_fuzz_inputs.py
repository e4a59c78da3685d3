"""Fuzzing the input side: arbitrary Unicode tokens and arbitrarily nested (wrong) structures into ``batch_to_ids`` and
``Embedder``. Only the documented errors (InputError / UsageError) may come out, and outputs have the documented shapes.
Bounded example counts keep this to seconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmokit import Embedder, InputError, UsageError, batch_to_ids
from elmokit.characters import is_blank_token
from helpers import tiny_random_bilm

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# every code point: surrogates, control characters, combining marks, private use, unassigned
any_char = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
odd_char = st.one_of(
    st.characters(categories=["Cs"]),  # lone surrogates
    st.characters(categories=["Cc", "Cf"]),  # control / format (\x00, \u200b, bidi marks)
    st.characters(categories=["Mn", "Me"]),  # combining marks
    st.characters(categories=["Zs", "Zl", "Zp"]),  # spaces and separators
    st.sampled_from(["\t", "\n", "\u3000", "\ufeff", "\U0001f642"]),
)
token = st.one_of(
    st.sampled_from(["<S>", "</S>", "", " "]),
    st.text(alphabet=any_char, max_size=12),
    st.text(alphabet=odd_char, max_size=6),
    st.text(alphabet=any_char, min_size=60, max_size=400),  # longer than C - 2 bytes: truncated
)
sentence = st.lists(token, max_size=8)
# wrong types anywhere in the nesting
leaf = st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.binary(max_size=5), token, st.booleans())
nested = st.recursive(
    leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=2), children, max_size=2),
    ),
    max_leaves=12,
)

MODEL = tiny_random_bilm(seed=3)
EMBEDDER = Embedder(MODEL, empty_tokens="keep", batch_size=3)
STRICT = Embedder(MODEL, batch_size=3)


def _check_ids(ids: torch.Tensor, sentences) -> None:
    b = len(sentences)
    t = max((len(s) for s in sentences), default=0)
    assert ids.shape == (b, t, 50) and ids.dtype == torch.long
    assert ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < 262)
    for i, s in enumerate(sentences):
        if len(s):
            # every real token: begin-of-word first, end-of-word somewhere, never an all-zero row
            assert bool((ids[i, : len(s), 0] == 259).all())
            assert bool((ids[i, : len(s)] == 260).any(dim=1).all())
        assert bool((ids[i, len(s) :] == 0).all())


@FAST
@given(obj=nested, keep=st.booleans())
def test_batch_to_ids_on_anything_raises_only_documented_errors(obj, keep):
    try:
        ids = batch_to_ids(obj, empty_tokens="keep" if keep else "error")
    except (InputError, UsageError):
        return
    sentences = list(obj)
    assert all(isinstance(s, (list, tuple)) and all(isinstance(t, str) for t in s) for s in sentences)
    _check_ids(ids, sentences)


@FAST
@given(batch=st.lists(sentence, max_size=5))
def test_batch_to_ids_on_unicode_sentences(batch):
    blank = [(i, j) for i, s in enumerate(batch) for j, tok in enumerate(s) if is_blank_token(tok)]
    if blank:
        i, j = blank[0]
        with pytest.raises(InputError, match=rf"sentence {i}, token {j} is"):
            batch_to_ids(batch)
    else:
        _check_ids(batch_to_ids(batch), batch)
    _check_ids(batch_to_ids(batch, empty_tokens="keep"), batch)


@FAST
@given(batch=st.one_of(st.lists(sentence, max_size=5), nested))
def test_embedder_on_anything_gives_documented_shapes_or_errors(batch):
    for embedder in (EMBEDDER, STRICT):
        try:
            arrays = embedder.embed_batch(batch)
        except (InputError, UsageError):
            continue
        sentences = list(batch)
        assert len(arrays) == len(sentences)
        for arr, s in zip(arrays, sentences):
            assert arr.shape == (3, len(s), 16) and arr.dtype == np.float32 and np.isfinite(arr).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(sentence, min_size=1, max_size=5), pick=st.integers(0, 4))
def test_sentence_alone_equals_sentence_in_padded_batch(batch, pick):
    target = batch[pick % len(batch)]
    together = EMBEDDER.embed_batch(batch)[pick % len(batch)]
    alone = EMBEDDER.embed_sentence(target)
    assert together.shape == alone.shape == (3, len(target), 16)
    assert together.size == 0 or np.abs(together - alone).max() <= 1e-5
    streamed = list(EMBEDDER.embed_sentences(batch, batch_size=2))[pick % len(batch)]
    assert streamed.size == 0 or np.abs(streamed - alone).max() <= 1e-5
