"""The original implementations' reference outputs, reproduced (see ../shared/docs/original-format.md)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from conftest import shared_path
from elmokit import batch_to_ids
from helpers import expected_top, fixture_model, fixture_sentences


def _run_stateful(name: str, *, reset_each_batch: bool = False) -> list[float]:
    model = fixture_model(name, stateful=True)
    sentences = fixture_sentences(name)
    errors = []
    for i in range(10):
        batch = [sentences[k][i].split() for k in range(3)]
        if reset_each_batch:
            model.reset_states()
        with torch.no_grad():
            out = model(batch_to_ids(batch))
        for k in range(3):
            n = len(batch[k])
            got = out.layers[k, -1, :n].numpy()
            errors.append(float(np.abs(got - expected_top(name, k, i)).max()))
            assert bool(out.mask[k, :n].all()) and not bool(out.mask[k, n:].any())
    return errors


@pytest.mark.parametrize("name", ["allennlp-elmo", "bilm-tf"])
def test_stateful_reproduces_reference_top_layer(name):
    errors = _run_stateful(name)
    assert len(errors) == 30
    assert max(errors) <= 1e-5, f"max abs diff {max(errors):.3g}"


def test_resetting_state_breaks_reproduction():
    # The reference was made statefully: resetting per batch must differ from batch 1 on (batch 0 matches).
    errors = _run_stateful("allennlp-elmo", reset_each_batch=True)
    assert max(errors[:3]) <= 1e-5
    assert min(max(errors[3 * i : 3 * i + 3]) for i in range(1, 10)) > 0.1


def test_options_alone_decide_skip_connections():
    # Same dataset names: loading the allennlp weights without skips must give clearly different outputs.
    from elmokit import BiLM, ElmoConfig
    from elmokit.weights.original import load_original_state

    d = shared_path("fixtures", "allennlp-elmo")
    config = ElmoConfig.from_json_file(d / "options.json")
    config.lstm.use_skip_connections = False
    model = BiLM(config).eval()
    model.load_state_dict(load_original_state(config, d / "lm_weights.hdf5"))
    batch = [fixture_sentences("allennlp-elmo")[k][0].split() for k in range(3)]
    with torch.no_grad():
        got = model(batch_to_ids(batch)).layers[0, -1, : len(batch[0])].numpy()
    assert np.abs(got - expected_top("allennlp-elmo", 0, 0)).max() > 0.5


def test_token_embeddings_reproduced_and_boundaries_match_literal_tokens():
    d = shared_path("fixtures", "allennlp-elmo")
    words = (d / "vocab_test.txt").read_text().split("\n")
    assert len(words) == 458
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as fh:
        expected = fh["embedding"][...]
    model = fixture_model("allennlp-elmo")
    with torch.no_grad():
        got = model.token_encoder(batch_to_ids([[w] for w in words]))[:, 0].numpy()
        # the same words in one long sentence (token cache path: each distinct token encoded once)
        got_batched = model.token_encoder(batch_to_ids([words]))[0].numpy()
        out = model(batch_to_ids([["a", "b"]]), keep_sentence_boundaries=True)
    assert np.abs(got - expected).max() <= 1e-5
    assert np.abs(got_batched - expected).max() <= 1e-5
    bos, eos = out.token_vectors[0, 0].numpy(), out.token_vectors[0, 3].numpy()
    assert np.abs(bos - expected[words.index("<S>")]).max() <= 1e-6
    assert np.abs(eos - expected[words.index("</S>")]).max() <= 1e-6
    # and layer 0 is the token vector duplicated
    np.testing.assert_array_equal(out.layers[0, 0, 1, :16].numpy(), out.layers[0, 0, 1, 16:].numpy())
