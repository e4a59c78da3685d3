"""The fast paths equal their plain references: im2col char CNN vs Conv1d, the fused/in-place LSTM step vs the cell
equations written out one gate at a time (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from elmokit.modules.char_cnn import CharCNN
from elmokit.modules.lstm import BiLSTM
from helpers import assert_close_to_scale


def _char_cnn() -> CharCNN:
    torch.manual_seed(0)
    return CharCNN(261, 8, [(1, 4), (2, 8), (3, 16), (5, 32), (7, 64)], activation="tanh")


def _assert_equals_conv1d(cnn: CharCNN, ids: torch.Tensor) -> None:
    """The fast char CNN equals its Conv1d reference: values with and without autograd, and parameter gradients."""
    fast, ref = cnn(ids), cnn.forward_conv1d(ids)
    assert_close_to_scale(fast, ref, 1e-6)
    with torch.no_grad():  # the inference path (amax, cached weights)
        assert_close_to_scale(cnn(ids), ref, 1e-6)
    weights = torch.randn_like(ref)
    grads = []
    for forward in (cnn.forward, cnn.forward_conv1d):
        cnn.zero_grad()
        (forward(ids) * weights).sum().backward()
        grads.append([p.grad.clone() for p in cnn.parameters()])
    for g_fast, g_ref in zip(*grads):
        assert torch.allclose(g_fast, g_ref, atol=1e-5 * float(g_ref.abs().max()) + 1e-7)


def test_im2col_char_cnn_equals_conv1d_values_and_gradients():
    cnn = _char_cnn()
    cnn.chunk_size = 7  # several chunks, the last one partial
    ids = torch.randint(1, 262, (30, 50))
    ids[:5, 10:] = 261  # in-word padding: repeated windows, ties in the max
    assert cnn(ids).shape == (30, 4 + 8 + 16 + 32 + 64)
    _assert_equals_conv1d(cnn, ids)


def test_char_cnn_tail_starts_hand_cases():
    ids = torch.tensor(
        [
            [259, 5, 6, 260, 261, 261, 261],  # run of 261 from position 4
            [259, 5, 6, 7, 8, 9, 260],  # last id appears once: run starts at 6
            [7, 7, 7, 7, 7, 7, 7],  # one id throughout: 0
            [259, 261, 261, 261, 261, 261, 261],
        ]
    )  # run from 1
    assert CharCNN.tail_starts(ids).tolist() == [4, 6, 0, 1]


@pytest.mark.parametrize("width", [50, 10])
def test_char_cnn_skipping_repeated_pad_windows_is_exact_on_real_words(width):
    """Real words of every length 1 … C bytes (the ELMo byte ids: <bow> bytes <eow> then the pad id), in shuffled
    order and several chunks: only the windows that can differ are computed (one GEMM for all widths in chunks of
    short words, one per width in chunks holding a long one), yet values and gradients equal Conv1d with a max over
    all C − w + 1 windows. C = 10 as the character-vocabulary mode's tokens."""
    from elmokit.characters import batch_to_ids

    cnn = _char_cnn()
    cnn.chunk_size = 9
    g = torch.Generator().manual_seed(3)
    letters = "abcdefghijklmnopqrstuvwxyzé"
    words = [
        "".join(letters[int(i)] for i in torch.randint(0, len(letters), (n,), generator=g))
        for n in [1, 2, 3, 5, 8, 13, 21, 34, 47, 48, 49, 60] * 3
    ]
    ids = batch_to_ids([words], width, on_long_token="truncate")[0]  # (N, C)
    ids = ids[torch.randperm(ids.shape[0], generator=g)]
    tails = CharCNN.tail_starts(ids)
    assert int(tails.min()) <= 4 and int(tails.max()) >= width - 1  # short words skip most windows, long ones none
    _assert_equals_conv1d(cnn, ids)


def _reference_layer(
    lstm: BiLSTM, k: int, x: torch.Tensor, lengths: torch.Tensor, clipped: list | None = None
) -> torch.Tensor:
    """The cell equations of BiLSTM's docstring, one row and one step at a time (no batching tricks); appends
    ``"cell"``/``"proj"`` to ``clipped`` whenever a clip changes a value."""
    _, b, t, _ = x.shape
    h_dim, cfg = lstm.hidden_dim, lstm.config
    out = torch.zeros(2, b, t, lstm.projection_dim)
    for d in range(2):
        for r in range(b):
            c = torch.zeros(h_dim)
            h = torch.zeros(lstm.projection_dim)
            for s in range(int(lengths[r])):
                z = x[d, r, s] @ lstm.weight_ih[k][d] + h @ lstm.weight_hh[k][d] + lstm.bias[k][d]
                i, j, f, o = z.split(h_dim)
                c = torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(j)
                if clipped is not None and bool((c.abs() > cfg.cell_clip).any()):
                    clipped.append("cell")
                c = c.clamp(-cfg.cell_clip, cfg.cell_clip)
                h = (torch.sigmoid(o) * torch.tanh(c)) @ lstm.weight_proj[k][d]
                if clipped is not None and bool((h.abs() > cfg.proj_clip).any()):
                    clipped.append("proj")
                h = h.clamp(-cfg.proj_clip, cfg.proj_clip)
                out[d, r, s] = h
    return out


def _lstm() -> BiLSTM:
    from helpers import clipping_lstm

    lstm = clipping_lstm(12, 5, 1, cell_clip=0.8, proj_clip=0.6, use_skip_connections=False, seed=1)
    with torch.no_grad():
        lstm.bias[0].uniform_(-1, 1)
    return lstm


def test_lstm_step_equals_cell_equations_in_place_and_with_autograd():
    lstm = _lstm()
    x = torch.randn(2, 4, 6, 5) * 2
    lengths = torch.tensor([6, 5, 3, 0])
    clipped: list[str] = []
    with torch.no_grad():
        expected = _reference_layer(lstm, 0, x, lengths, clipped)
        reached = lstm(x, lengths)[0][0]
    assert {"cell", "proj"} <= set(clipped)  # both clips fire, so the test covers them
    assert torch.allclose(reached, expected, atol=1e-6)
    xg = x.clone().requires_grad_(True)
    out = lstm(xg, lengths)[0][0]
    assert torch.allclose(out.detach(), expected, atol=1e-6)
    out.sum().backward()  # the autograd path must not have modified saved tensors in place
    xr = x.clone().requires_grad_(True)
    _reference_layer(lstm, 0, xr, lengths).sum().backward()
    assert torch.allclose(xg.grad, xr.grad, atol=1e-5)


def _highway_by_hand(hw, x: torch.Tensor) -> torch.Tensor:
    """bilm-tf's highway written out: t = σ(x·W_gᵀ + b_g), x ← t·relu(x·W_hᵀ + b_h) + (1 − t)·x, layer by layer."""
    for transform, gate in zip(hw.transforms, hw.gates):
        t = torch.sigmoid(x @ gate.weight.t() + gate.bias)
        x = t * torch.relu(x @ transform.weight.t() + transform.bias) + (1.0 - t) * x
    return x


def _highway_grads(hw, x: torch.Tensor, forward, weights: torch.Tensor, precision: str = "fp32") -> list[torch.Tensor]:
    """[y, dx, every parameter's gradient] of Σ forward(x)·weights, in float64 for comparison."""
    hw.zero_grad()
    leaf = x.detach().clone().requires_grad_()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    with ctx:
        y = forward(leaf)
    (y.to(weights.dtype) * weights).sum().backward()
    return [y.detach().double(), leaf.grad.double()] + [p.grad.double() for p in hw.parameters()]


def test_highway_training_layer_equals_the_formula_values_and_gradients():
    """With autograd (training), float32: the fused layer (one GEMM into [transform | gate], the native passes) gives
    the formula's values and gradients (x and all four parameters of both layers) to float32 rounding."""
    from elmokit.modules import native
    from elmokit.modules.highway import Highway

    torch.manual_seed(0)
    hw = Highway(48, 2)
    x, weights = torch.randn(37, 48), torch.randn(37, 48)
    ops, dtype = hw._train_ops(x)
    assert dtype == torch.float32 and (ops is not None) == (native.train_ops() is not None)
    fused = _highway_grads(hw, x, hw, weights)
    by_hand = _highway_grads(hw, x, lambda v: _highway_by_hand(hw, v), weights)
    assert_close_to_scale(fused[0], by_hand[0], 1e-6)
    for got, expected in zip(fused[1:], by_hand[1:]):  # gradients: sums over rows
        assert_close_to_scale(got, expected, 1e-5)


def test_highway_training_layer_gradcheck_float64():
    """The layer's backward formulas (the torch-op form of the native passes) pass a float64 gradcheck."""
    from elmokit.modules.highway import _HighwayTrainLayer

    torch.manual_seed(1)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    params = [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((5, 5), (5,), (5, 5), (5,))]
    with torch.no_grad():
        params[1].abs_().add_(0.1)  # most relu inputs away from the kink at 0
    assert torch.autograd.gradcheck(lambda *a: _HighwayTrainLayer.apply(*a, torch.float64, None), (x, *params))


def test_highway_training_under_bf16_is_closer_to_float64_than_the_bf16_linears(monkeypatch):
    """bf16 autocast: the fused layer's gates and carry are float32 (only the products bfloat16), so its values and
    gradients are at least as close to a float64 run as the two autocast ``nn.Linear`` calls with bfloat16 gates."""
    from elmokit.modules.highway import Highway

    torch.manual_seed(0)
    hw = Highway(64, 2)
    x, weights = torch.randn(97, 64), torch.randn(97, 64)
    fused = _highway_grads(hw, x, hw, weights, "bf16")
    exact = _highway_grads(hw.double(), x.double(), lambda v: _highway_by_hand(hw, v), weights.double())
    hw.float()
    monkeypatch.setattr(hw, "_train_ops", lambda x: (None, torch.float32))
    linears = _highway_grads(hw, x, hw, weights, "bf16")
    for got, old, expected in zip(fused, linears, exact):
        scale = float(expected.abs().max())
        assert float((got - expected).abs().max()) <= max(float((old - expected).abs().max()), 1e-2 * scale)
    assert_close_to_scale(fused[0], exact[0], 1e-2)


def test_highway_training_fallbacks_give_the_formula(monkeypatch):
    """Without the kernels (``ELMOKIT_NATIVE=0``): the nn.Linear calls; with a NaN in x (the kernel assumes finite
    values): the layer's torch-op form. Both give the formula's values (NaN in that row only) and gradients."""
    from elmokit.modules import highway as highway_module

    torch.manual_seed(2)
    hw = highway_module.Highway(32, 1)
    x, weights = torch.randn(9, 32), torch.randn(9, 32)
    x[4, 7] = float("nan")
    fused = _highway_grads(hw, x, hw, weights)
    by_hand = _highway_grads(hw, x, lambda v: _highway_by_hand(hw, v), weights)
    assert bool(torch.isnan(fused[0][4]).all()) and not bool(torch.isnan(fused[0][torch.arange(9) != 4]).any())
    for got, expected in zip(fused[:2], by_hand[:2]):
        finite = ~torch.isnan(expected)
        assert torch.equal(finite, ~torch.isnan(got))
        assert_close_to_scale(got[finite], expected[finite], 1e-5)
    monkeypatch.setattr(highway_module.native, "train_ops", lambda: None)
    assert hw._train_ops(x) == (None, torch.float32)
    x[4, 7] = 0.5
    plain = _highway_grads(hw, x, hw, weights)
    for got, expected in zip(plain, _highway_grads(hw, x, lambda v: _highway_by_hand(hw, v), weights)):
        assert_close_to_scale(got, expected, 1e-5)


def test_fused_highway_equals_two_linears_and_follows_weight_changes():
    """Inference runs each highway layer as one cached (F, 2F) GEMM; it equals the autograd path and is remade when a
    weight changes in place (load_state_dict, an optimiser step)."""
    from elmokit.modules.highway import Highway

    torch.manual_seed(0)
    hw = Highway(16, 2)
    x = torch.randn(5, 16)
    with torch.no_grad():
        fused = hw(x)
    reference = _highway_by_hand(hw, x).detach()
    assert_close_to_scale(fused, reference, 1e-6)
    with torch.no_grad():
        hw.gates[1].weight.mul_(-2.0)
        changed = hw(x)
    assert not torch.allclose(changed, fused, atol=1e-3)
    assert_close_to_scale(changed, _highway_by_hand(hw, x).detach(), 1e-6)
    with torch.no_grad():  # 3-D input keeps its shape
        assert_close_to_scale(hw(x.detach().view(5, 1, 16)).view(5, 16), changed, 1e-6)


def test_token_encoder_inference_chunks_equal_one_piece(monkeypatch):
    """Without autograd, more distinct tokens than ``inference_chunk`` are encoded in chunks: same vectors, padding
    still zero; under autograd the encoder runs as one piece (gradients flow)."""
    from elmokit import batch_to_ids
    from elmokit.modules.token_encoder import TokenEncoder
    from helpers import tiny_random_bilm

    encoder = tiny_random_bilm(seed=3).token_encoder
    words = [[f"w{i}" for i in range(37)], [f"x{i}" for i in range(20)]]
    ids = batch_to_ids(words)
    with torch.no_grad():
        whole = encoder(ids)
        monkeypatch.setattr(TokenEncoder, "inference_chunk", 8)
        chunked = encoder(ids)
    assert_close_to_scale(chunked, whole, 1e-6)
    assert bool((chunked[1, 20:] == 0).all()) and bool((chunked[1, :20] != 0).any())
    out = encoder(ids)  # grad enabled: one piece even above the threshold
    out.sum().backward()
    assert encoder.projection.weight.grad is not None


def test_token_encoder_under_bf16_training_pads_rows_and_drops_them(monkeypatch):
    """In training under bf16 autocast the encoder runs on gemm_rows(U) rows (57 distinct tokens → 64: the first
    token repeated): the vectors and the parameters' gradients equal the unpadded run's (``gemm_rows`` made the
    identity) within bfloat16 rounding, and the encoder saw 64 rows."""
    from elmokit import batch_to_ids
    from elmokit.modules import token_encoder as module
    from elmokit.modules.precision import autocast
    from helpers import tiny_random_bilm

    encoder = tiny_random_bilm(seed=3).token_encoder
    ids = batch_to_ids([[f"w{i}" for i in range(37)], [f"x{i}" for i in range(20)]])
    seen = []
    encode = module.TokenEncoder.encode_unique
    monkeypatch.setattr(
        module.TokenEncoder, "encode_unique", lambda self, c: seen.append(c.shape[0]) or encode(self, c)
    )

    def run():
        encoder.zero_grad()
        with autocast("bf16", "cpu"):
            out = encoder(ids)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return [out.detach(), *(p.grad.clone() for p in encoder.parameters())]

    padded = run()
    monkeypatch.setattr(module, "gemm_rows", lambda n, dtype, device_type: n)
    plain = run()
    assert seen == [64, 57]
    assert bool((padded[0][1, 20:] == 0).all())
    for got, want in zip(padded, plain):
        assert float((got - want).abs().max()) <= 2e-2 * float(want.abs().max())


@pytest.mark.parametrize(
    "lengths", [[6, 5, 3, 0], [6, 6, 5, 5, 5, 4, 3, 3, 2, 1, 0], [6] * 12 + [5] * 12 + [3] * 8 + [2, 1, 0]]
)
def test_torchscript_step_loop_equals_the_eager_loop(monkeypatch, lengths):
    """Without autograd the recurrent loop runs compiled by TorchScript (direction after direction for a few rows,
    both directions per step for more than native.MAX_DIRECTION_ROWS without the kernel); it gives the eager loop's
    values (clips firing,
    rows ending at different steps, a zero-length row) and the same final state."""
    import elmokit.modules.lstm as lstm_module
    import elmokit.modules.lstm_steps as lstm_steps
    from elmokit.modules import native

    monkeypatch.setattr(native, "_module", False)  # not the C++ kernel (tests/test_native.py compares it to this loop)
    lstm = _lstm()
    b = len(lengths)
    x = torch.randn(2, b, 6, 5) * 2
    lengths = torch.tensor(lengths)
    state = (torch.randn(2, 1, b, 12) * 0.1, torch.randn(2, 1, b, 5) * 0.1)
    assert native.lstm_rows_limit(None) == native.MAX_DIRECTION_ROWS  # no kernel: 8 rows at most by direction
    by_direction = b <= native.MAX_DIRECTION_ROWS
    compiled = lstm_module.inference_steps(by_direction)
    assert isinstance(compiled, torch.jit.ScriptFunction)  # this torch has TorchScript: the compiled loop is used
    called = []
    monkeypatch.setattr(
        lstm_module,
        "inference_steps",
        lambda by_direction=False: (
            called.append(by_direction) or (compiled if len(called) <= 1 else eager(by_direction))
        ),
    )
    eager = lambda by_direction: (
        lstm_steps._steps_by_direction
        if by_direction  # noqa: E731
        else lstm_steps._steps_in_place
    )
    with torch.no_grad():
        outs, (c, h) = lstm(x, lengths, state)  # compiled
        ref_outs, (ref_c, ref_h) = lstm(x, lengths, state)  # eager
    assert called == [by_direction, by_direction]
    assert torch.equal(outs[0], ref_outs[0])
    assert torch.equal(c, ref_c) and torch.equal(h, ref_h)
    with torch.no_grad():  # and from zeros, the cell equations
        assert torch.allclose(lstm(x, lengths)[0][0], _reference_layer(lstm, 0, x, lengths), atol=1e-6)


def test_skipping_the_boundary_steps_is_exact_for_every_kept_position():
    """boundary_steps=False (Elmo, Embedder) skips the forward stack's </S> step and the backward stack's <S> step:
    every position between the boundaries is unchanged, the state is not returned, the tops are zero at the
    skipped positions."""
    from elmokit import batch_to_ids
    from helpers import tiny_random_bilm

    bilm = tiny_random_bilm(seed=5)
    ids = batch_to_ids([["a", "bank", "of", "the", "river"], ["x"], [], ["two", "words"]])
    with torch.no_grad():
        full = bilm(ids, keep_sentence_boundaries=True)
        fast = bilm(ids, keep_sentence_boundaries=True, boundary_steps=False)
        stripped = bilm(ids, boundary_steps=False)
    assert fast.state is None and full.state is not None
    lengths = full.mask.sum(1)
    for row, n in enumerate(lengths.tolist()):
        inner = slice(1, n - 1)
        assert_close_to_scale(fast.layers[row, :, inner], full.layers[row, :, inner], 1e-6)
        assert_close_to_scale(fast.layers[row, 0, :n], full.layers[row, 0, :n], 1e-6)  # layer 0
        assert float(fast.forward_top[row, n - 1].abs().max()) == 0.0  # the forward stack never read </S>
        assert float(fast.backward_top[row, 0].abs().max()) == 0.0  # the backward stack never read <S>
    plain = bilm(ids)
    assert_close_to_scale(stripped.layers, plain.layers, 1e-6)
    assert torch.equal(stripped.mask, plain.mask)


def test_elmo_skips_the_boundary_steps_only_when_nothing_reads_them(monkeypatch):
    from elmokit import Elmo, batch_to_ids
    from elmokit.modules.bilm import BiLM
    from helpers import tiny_random_bilm

    seen = []
    forward = BiLM.forward
    monkeypatch.setattr(
        BiLM, "forward", lambda self, *a, **k: (seen.append(k.get("boundary_steps", True)), forward(self, *a, **k))[1]
    )
    ids = batch_to_ids([["a", "bank"], ["x"]])
    outputs = []
    for options in (
        {},
        {"do_layer_norm": True},
        {"do_layer_norm": True, "layer_norm_mask": "tokens"},
        {"keep_sentence_boundaries": True},
    ):
        elmo = Elmo(num_output_representations=1, dropout=0.0, bilm=tiny_random_bilm(seed=2), **options).eval()
        with torch.no_grad():
            outputs.append(elmo(ids)["elmo_representations"][0])
    assert seen == [False, True, False, True]
    monkeypatch.setattr(BiLM, "forward", forward)
    with torch.no_grad():  # the skipped steps change nothing the caller sees
        plain = Elmo(num_output_representations=1, dropout=0.0, bilm=tiny_random_bilm(seed=2)).eval()
        assert torch.allclose(plain(ids)["elmo_representations"][0], outputs[0], atol=1e-6)


def test_derived_weights_follow_in_place_changes_and_are_not_copied():
    import copy
    import pickle

    from elmokit.modules.derived import DerivedWeights

    w = torch.ones(3)
    cache = DerivedWeights()
    builds = []
    get = lambda: cache.get("twice", (w,), lambda: (builds.append(1), w * 2)[1])  # noqa: E731
    assert torch.equal(get(), torch.full((3,), 2.0)) and torch.equal(get(), torch.full((3,), 2.0))
    assert len(builds) == 1
    with torch.no_grad():
        w.add_(1)  # bumps the version counter
    assert torch.equal(get(), torch.full((3,), 4.0)) and len(builds) == 2
    assert pickle.loads(pickle.dumps(cache))._entries == {} and copy.deepcopy(cache)._entries == {}


def test_writes_through_data_are_seen_after_eval_or_clear_derived_weights():
    """``w.data.mul_`` does not bump the version counter, so the inference copies cannot see it by themselves: a
    train/eval switch and clear_derived_weights() drop them; eval() on a model already in eval mode keeps them."""
    from elmokit import batch_to_ids
    from helpers import tiny_random_bilm

    bilm = tiny_random_bilm(seed=4)
    ids = batch_to_ids([["a", "bank", "of", "the", "river"]])
    with torch.no_grad():
        before = bilm(ids).layers
        for w in (bilm.token_encoder.highway.gates[0].weight, bilm.bilstm.weight_hh[0]):
            w.data.mul_(3.0)  # invisible to the version counter
        stale = bilm(ids).layers
        assert torch.equal(stale, before)  # the copies are stale here: the documented limitation
        bilm.eval()  # already in eval mode: no switch, the copies are kept
        assert torch.equal(bilm(ids).layers, before)
        bilm.train()
        bilm.eval()  # a switch: the copies are dropped
        fresh = bilm(ids).layers
        reference = bilm(ids.clone()).layers
    assert not torch.allclose(fresh, before, atol=1e-4)
    with torch.enable_grad():  # the autograd path reads the parameters themselves
        assert torch.allclose(bilm.train()(ids).layers.detach(), fresh, atol=1e-5)
    bilm.eval()
    with torch.no_grad():
        assert torch.allclose(bilm(ids).layers, reference, atol=1e-6)  # the copies are made again here
        bilm.bilstm.weight_hh[1].data.mul_(0.5)  # a cached (reordered) copy
        assert torch.equal(bilm(ids).layers, reference)  # stale until cleared
        bilm.clear_derived_weights()
        assert not torch.allclose(bilm(ids).layers, reference, atol=1e-4)


def test_inference_copies_follow_fused_optimizer_steps_and_fresh_tensors():
    """Fused optimiser steps do not bump version counters, and torch.func.functional_call hands in fresh tensors that
    may reuse a freed tensor's address: neither may ever read a stale inference copy."""
    from elmokit import batch_to_ids
    from helpers import tiny_random_bilm

    bilm = tiny_random_bilm(seed=6)
    ids = batch_to_ids([["a", "bank", "of", "the", "river"], ["x"]])

    def plain() -> torch.Tensor:  # the autograd path reads the parameters themselves
        with torch.enable_grad():
            return bilm(ids).layers.detach()

    with torch.no_grad():
        bilm(ids)  # fill the copies
    optimizer = torch.optim.Adam(bilm.parameters(), lr=0.05, fused=True)
    before = [p.detach().clone() for p in bilm.parameters()]
    for _ in range(3):
        optimizer.zero_grad()
        bilm(ids).layers.sum().backward()
        optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, bilm.parameters()))
    with torch.no_grad():
        assert torch.allclose(bilm(ids).layers, plain(), atol=1e-5)
    # functional_call with interpolated weights: fresh tensors every call
    from torch.func import functional_call

    start = {k: v.detach().clone() for k, v in bilm.named_parameters()}
    for alpha in (0.0, 0.5, 1.0):
        params = {k: v * alpha for k, v in start.items()}
        with torch.no_grad():
            fast = functional_call(bilm, params, (ids,)).layers
        with torch.enable_grad():
            reference = functional_call(
                bilm, {k: v.requires_grad_(True) for k, v in params.items()}, (ids,)
            ).layers.detach()
        assert torch.allclose(fast, reference, atol=1e-5), alpha


def test_a_model_made_under_inference_mode_embeds():
    """Tensors made under torch.inference_mode have no version counter: nothing is cached for them, and the values
    equal a model made outside it."""
    from elmokit import batch_to_ids
    from helpers import tiny_random_bilm

    ids = batch_to_ids([["a", "bank"], ["the", "river", "bank"]])
    outside = tiny_random_bilm(seed=7)
    with torch.inference_mode():
        inside = tiny_random_bilm(seed=7)
        assert torch.allclose(inside(ids).layers, outside(ids).layers, atol=1e-6)
        assert inside.token_encoder.highway._derived._entries == {}


def test_boundary_steps_needs_the_boundaries_this_call_adds():
    import pytest

    from elmokit import batch_to_ids
    from elmokit.errors import UsageError
    from helpers import tiny_random_bilm

    with pytest.raises(UsageError, match="add_boundaries"):
        tiny_random_bilm(seed=1)(batch_to_ids([["a"]]), add_boundaries=False, boundary_steps=False)


def test_derived_weights_never_match_another_tensor_at_the_same_address():
    """Another tensor object with the cached source's address and version counter (here a second view of one
    buffer; a freed block handed out again gives the same, as torch.func.functional_call's fresh tensors can) is not
    the cached source: the copy is rebuilt."""
    from elmokit.modules.derived import DerivedWeights

    buffer = torch.zeros(8)
    cache = DerivedWeights()
    first = buffer[:]
    assert float(cache.get("w", (first,), lambda: first + 1.0)[0]) == 1.0
    second = buffer[:]
    assert second is not first and second.data_ptr() == first.data_ptr() and second._version == first._version
    assert float(cache.get("w", (second,), lambda: second + 2.0)[0]) == 2.0
    assert float(cache.get("w", (second,), lambda: second + 3.0)[0]) == 2.0  # and then cached for it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_max_hand_case_ties_send_the_gradient_to_the_first_position(dtype):
    """(1, 3, 2) by hand: filter 0's maximum 3 is at positions 1 and 2 (the first, 1, takes the gradient), filter 1's 5
    at positions 0 and 1 (0 takes it). Native kernels where built, torch.max elsewhere: the same numbers."""
    from elmokit.modules.char_cnn import window_max

    y = torch.tensor([[[1.0, 5.0], [3.0, 5.0], [3.0, 2.0]]], dtype=dtype, requires_grad=True)
    out = window_max(y)
    assert out.dtype == dtype and out.tolist() == [[3.0, 5.0]]
    out.backward(torch.tensor([[10.0, 20.0]], dtype=dtype))
    assert y.grad.dtype == dtype
    assert y.grad.tolist() == [[[0.0, 20.0], [10.0, 0.0], [0.0, 0.0]]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("positions", [1, 7, 50])
def test_window_max_equals_torch_max_values_and_gradients(dtype, positions):
    """Random (N, S, F) with many bfloat16 ties (values drawn from 9 levels): the same maximum bits as torch.max and
    the gradient at the same position (torch.max on the CPU returns the first)."""
    from elmokit.modules.char_cnn import window_max

    g = torch.Generator().manual_seed(positions)
    y = (torch.randint(-4, 5, (33, positions, 70), generator=g).to(dtype) / 4).requires_grad_()
    ref = y.detach().clone().requires_grad_()
    grad = torch.randn(33, 70, generator=g).to(dtype)
    out = window_max(y)
    expected = ref.max(dim=1).values
    assert torch.equal(out, expected)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(y.grad, ref.grad)
    assert int((y.grad != 0).sum(dim=1).max()) == 1  # one position per (token, filter), ties or not


def test_window_max_inf_and_nan_take_torch_max_and_the_fallback_is_the_same(monkeypatch):
    """A y holding inf or NaN (the kernel assumes finite values) gives torch.max's values and gradient; without the
    kernels (``ELMOKIT_NATIVE=0``, no compiler) torch.max runs: the same numbers as the native path."""
    from elmokit.modules import char_cnn

    y = torch.randn(6, 5, 9)
    y[1, 3, 2] = float("inf")
    y[2, 0, 4] = float("nan")
    y[3, 2, 1] = float("-inf")
    grad = torch.randn(6, 9)
    results = []
    for native_ops in (True, False):
        if not native_ops:
            monkeypatch.setattr(char_cnn.native, "train_ops", lambda: None)
        for values in (y, torch.randn(6, 5, 9, generator=torch.Generator().manual_seed(1))):
            leaf = values.clone().requires_grad_()
            out = char_cnn.window_max(leaf)
            out.backward(grad)
            results.append((out.detach(), leaf.grad))
    ref = y.clone().requires_grad_()
    expected = ref.max(dim=1).values
    expected.backward(grad)
    assert torch.allclose(results[0][0], expected, equal_nan=True) and torch.equal(results[0][1], ref.grad)
    assert float(results[0][0][1, 2]) == float("inf") and torch.isnan(results[0][0][2, 4])
    for (v_native, g_native), (v_torch, g_torch) in zip(results[:2], results[2:]):
        assert torch.allclose(v_native, v_torch, equal_nan=True) and torch.equal(g_native, g_torch)
