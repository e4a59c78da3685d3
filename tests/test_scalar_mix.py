"""ScalarMix against an independent NumPy computation (bilm-tf's weight_layers test cases)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from elmokit import Elmo, ScalarMix, batch_to_ids
from helpers import fixture_model

BATCH = [["The", "first", "sentence", "."], ["The", "second"], ["Third"]]


def _numpy_mix(layers: np.ndarray, mask: np.ndarray, w, gamma, layer_norm: bool) -> np.ndarray:
    """layers (B, K, T, D), mask (B, T): written from the paper's eq. 1 and bilm-tf's definition."""
    s = np.exp(np.asarray(w, dtype=np.float64))
    s = s / s.sum()
    out = np.zeros(layers[:, 0].shape, dtype=np.float64)
    for j in range(layers.shape[1]):
        h = layers[:, j].astype(np.float64)
        if layer_norm:
            values = h[mask]  # (n_real, D): every unmasked position, every dim
            h = (h - values.mean()) / np.sqrt(values.var() + 1e-12)
        out += s[j] * h
    return gamma * out


@pytest.fixture(scope="module")
def bilm_tf_layers():
    model = fixture_model("bilm-tf")
    with torch.no_grad():
        out = model(batch_to_ids(BATCH))
    return out.layers, out.mask


@pytest.mark.parametrize("w,gamma", [([0.1, 0.3, 0.5], 1.1), ([0.2, 0.4, 0.6], 0.88)])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_matches_numpy(bilm_tf_layers, w, gamma, layer_norm):
    layers, mask = bilm_tf_layers
    mix = ScalarMix(3, do_layer_norm=layer_norm, initial_scalar_parameters=w, initial_gamma=gamma)
    with torch.no_grad():
        got = mix(layers, mask).numpy()
    expected = _numpy_mix(layers.numpy(), mask.numpy(), w, gamma, layer_norm)
    m = mask.numpy()
    assert np.abs(got[m] - expected[m]).max() <= 1e-5
    # the mix is a real mixture: it differs from each single layer
    assert np.abs(got[m] - gamma * layers[:, 2].numpy()[m]).max() > 1e-3


@pytest.mark.parametrize("gamma", [1.1, 0.88])
def test_top_only(bilm_tf_layers, gamma):
    layers, mask = bilm_tf_layers
    mix = ScalarMix(3, initial_scalar_parameters=[0.1, 0.3, 0.5], initial_gamma=gamma, top_only=True)
    with torch.no_grad():
        got = mix(layers, mask)
    np.testing.assert_allclose(got.numpy(), gamma * layers[:, 2].numpy(), rtol=0, atol=1e-7)


def test_elmo_layer_norm_masks():
    """Elmo(layer_norm_mask="tokens") equals bilm-tf's computation (boundaries excluded from the statistics);
    the AllenNLP default (boundaries included) gives different numbers."""
    model = fixture_model("bilm-tf")
    w = [0.1, 0.3, 0.5]
    ids = batch_to_ids(BATCH)
    with torch.no_grad():
        out = model(ids)
        expected = _numpy_mix(out.layers.numpy(), out.mask.numpy(), w, 1.0, True)
        elmo_tf = Elmo(bilm=model, scalar_mix_parameters=w, do_layer_norm=True, dropout=0.0,
                       layer_norm_mask="tokens")
        elmo_nlp = Elmo(bilm=model, scalar_mix_parameters=w, do_layer_norm=True, dropout=0.0)
        got_tf = elmo_tf(ids)
        got_nlp = elmo_nlp(ids)["elmo_representations"][0].numpy()
    m = out.mask.numpy()
    rep = got_tf["elmo_representations"][0].numpy()
    assert torch.equal(got_tf["mask"], out.mask)
    assert np.abs(rep[m] - expected[m]).max() <= 1e-5
    assert np.abs(got_nlp[m] - expected[m]).max() > 1e-4
    assert np.all(rep[~m] == 0)


def test_scalar_mix_trainable_and_penalty():
    mix = ScalarMix(3, initial_scalar_parameters=[1.0, 2.0, 3.0])
    assert float(mix.l2_penalty(0.5).detach()) == pytest.approx(0.5 * 14.0)
    x = torch.randn(2, 3, 4, 5)
    mix(x).sum().backward()
    assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None
    fixed = ScalarMix(3, initial_scalar_parameters=[0.0, 0.0, 0.0], trainable=False)
    assert not fixed.scalar_parameters.requires_grad
    np.testing.assert_allclose(fixed(x).numpy(), x.mean(1).numpy(), atol=1e-6)


def test_scalar_mix_errors():
    with pytest.raises(ValueError, match="3 layers"):
        ScalarMix(2)(torch.zeros(1, 3, 2, 4))
    with pytest.raises(ValueError, match="mask"):
        ScalarMix(3, do_layer_norm=True)(torch.zeros(1, 3, 2, 4))
    with pytest.raises(ValueError, match="initial_scalar_parameters"):
        ScalarMix(3, initial_scalar_parameters=[0.1])


def test_multiple_mixes_one_pass_and_requires_grad():
    model = fixture_model("allennlp-elmo")
    elmo = Elmo(bilm=model, num_output_representations=2, dropout=0.0)
    assert all(not p.requires_grad for p in elmo.bilm.parameters())
    with torch.no_grad():
        elmo.scalar_mixes[1].scalar_parameters.copy_(torch.tensor([5.0, 0.0, -5.0]))
    out = elmo(batch_to_ids(BATCH))
    r0, r1 = out["elmo_representations"]
    assert r0.shape == r1.shape == (3, 4, 32)
    assert (r0 - r1).abs().max() > 1e-3
    r0.sum().backward()
    assert elmo.scalar_mixes[0].gamma.grad is not None
    assert all(p.grad is None for p in elmo.bilm.parameters())
    tuned = Elmo(bilm=fixture_model("allennlp-elmo"), requires_grad=True, dropout=0.0)
    tuned(batch_to_ids(BATCH))["elmo_representations"][0].sum().backward()
    assert tuned.bilm.token_encoder.projection.weight.grad is not None
