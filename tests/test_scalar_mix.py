"""ScalarMix against an independent NumPy computation (bilm-tf's weight_layers test cases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmokit import Elmo, InputError, ScalarMix, UsageError, batch_to_ids
from helpers import assert_close_to_scale, fixture_model

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
    assert_close_to_scale(got[m], expected[m], 1e-5)
    # the mix is a real mixture: it differs from each single layer
    assert np.abs(got[m] - gamma * layers[:, 2].numpy()[m]).max() > 1e-3


@pytest.mark.parametrize("gamma", [1.1, 0.88])
def test_top_only(bilm_tf_layers, gamma):
    layers, mask = bilm_tf_layers
    mix = ScalarMix(3, initial_scalar_parameters=[0.1, 0.3, 0.5], initial_gamma=gamma, top_only=True)
    with torch.no_grad():
        got = mix(layers, mask)
    assert_close_to_scale(got, gamma * layers[:, 2], 1e-7)  # one float32 product: ~1 ulp, values up to ~1.6


def test_elmo_layer_norm_masks():
    """Elmo(layer_norm_mask="tokens") equals bilm-tf's computation (boundaries excluded from the statistics);
    the AllenNLP default (boundaries included) gives different numbers."""
    model = fixture_model("bilm-tf")
    w = [0.1, 0.3, 0.5]
    ids = batch_to_ids(BATCH)
    with torch.no_grad():
        out = model(ids)
        expected = _numpy_mix(out.layers.numpy(), out.mask.numpy(), w, 1.0, True)
        elmo_tf = Elmo(bilm=model, scalar_mix_parameters=w, do_layer_norm=True, dropout=0.0, layer_norm_mask="tokens")
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
    assert all(p.grad is not None for p in mix.scalar_parameters) and mix.gamma.grad is not None
    fixed = ScalarMix(3, initial_scalar_parameters=[0.0, 0.0, 0.0], trainable=False)
    assert not any(p.requires_grad for p in fixed.scalar_parameters)
    assert_close_to_scale(fixed(x), x.mean(1), 1e-6)


def test_scalar_mix_errors():
    with pytest.raises(InputError, match="3 layers"):
        ScalarMix(2)(torch.zeros(1, 3, 2, 4))
    with pytest.raises(InputError, match="mask"):
        ScalarMix(3, do_layer_norm=True)(torch.zeros(1, 3, 2, 4))
    with pytest.raises(InputError, match=r"\(B, K, T, D\)"):
        ScalarMix(3)(torch.zeros(3, 2, 4))
    with pytest.raises(UsageError, match="initial_scalar_parameters"):
        ScalarMix(3, initial_scalar_parameters=[0.1])
    with pytest.raises(UsageError, match="mixture_size"):
        ScalarMix(0)


def test_scalar_parameters_layout_is_allennlps():
    # K one-element parameters: mix.scalar_parameters[k] is layer k's w; state-dict keys scalar_parameters.k
    mix = ScalarMix(3, initial_scalar_parameters=[0.0, 1.0, 2.0], initial_gamma=2.0)
    assert len(mix.scalar_parameters) == 3 and all(p.shape == (1,) for p in mix.scalar_parameters)
    assert sorted(mix.state_dict()) == ["gamma", "scalar_parameters.0", "scalar_parameters.1", "scalar_parameters.2"]
    mix.scalar_parameters[1].data[0] = 0.0
    layers = [torch.full((1, 1, 1), v) for v in (1.0, 2.0, 6.0)]
    # w = (0, 0, 2): softmax = (1, 1, e²) / (2 + e²); out = 2 · (1 + 2 + 6e²) / (2 + e²)
    e2 = float(np.exp(2.0))
    assert mix(layers).item() == pytest.approx(2.0 * (3.0 + 6.0 * e2) / (2.0 + e2), rel=1e-6)


def test_old_single_tensor_state_dict_still_loads(tmp_path):
    # a state dict saved by earlier elmokit, whose ScalarMix held w as one (K,) tensor
    old = {"scalar_parameters": torch.tensor([0.5, -1.0, 2.0]), "gamma": torch.tensor([1.5])}
    torch.save(old, tmp_path / "mix.pt")
    mix = ScalarMix(3)
    mix.load_state_dict(torch.load(tmp_path / "mix.pt", weights_only=True))
    assert [p.item() for p in mix.scalar_parameters] == [0.5, -1.0, 2.0] and mix.gamma.item() == 1.5
    w = np.exp([0.5, -1.0, 2.0])
    np.testing.assert_allclose(mix.weights().detach().numpy(), w / w.sum(), rtol=1e-6)
    # inside an Elmo (the usual case: a downstream model's saved state)
    elmo = Elmo(bilm=fixture_model("allennlp-elmo"), num_output_representations=2, dropout=0.0)
    state = {k: v for k, v in elmo.state_dict().items() if "scalar_parameters" not in k}
    state["scalar_mixes.1.scalar_parameters"] = torch.tensor([3.0, 0.0, -3.0])
    state["scalar_mixes.0.scalar_parameters"] = torch.tensor([0.0, 0.0, 0.0])
    torch.save(state, tmp_path / "elmo.pt")
    elmo.load_state_dict(torch.load(tmp_path / "elmo.pt", weights_only=True))
    assert [p.item() for p in elmo.scalar_mixes[1].scalar_parameters] == [3.0, 0.0, -3.0]
    with pytest.raises(RuntimeError, match="size mismatch|scalar_parameters"):  # a wrong K is not papered over
        ScalarMix(2).load_state_dict(old)


def test_multiple_mixes_one_pass_and_requires_grad():
    model = fixture_model("allennlp-elmo")
    elmo = Elmo(bilm=model, num_output_representations=2, dropout=0.0)
    assert all(not p.requires_grad for p in elmo.bilm.parameters())
    with torch.no_grad():
        for p, v in zip(elmo.scalar_mixes[1].scalar_parameters, [5.0, 0.0, -5.0]):
            p.fill_(v)
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
