"""The fused training layer (``elmokit.modules.lstm_train``): its torch-op path passes a float64 gradcheck, its C++
kernels equal the float64 reference and the autograd loop it replaces (losses and every gradient, ragged batches,
both clips firing), it is deterministic, a trainer run on it resumes bit-exactly in fp32 and bf16, and without the
native kernels (``ELMOKIT_NATIVE=0``) the same Function runs its torch-op path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elmokit.config import LSTMConfig
from elmokit.modules import lstm_train, native
from elmokit.modules.lstm import BiLSTM
from elmokit.modules.lstm_train import FusedLSTMLayer, fused_lstm_layer
from elmokit.modules.precision import autocast
from elmokit.pretraining.trainer import Trainer
from helpers import TINY_TRAIN_OPTIONS, assert_close_to_scale, tiny_window_config, write_tiny_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

#: the tests of the C++ kernels: skipped where they cannot be built, failed instead under ELMOKIT_REQUIRE_NATIVE=1
needs_native = pytest.mark.usefixtures("train_kernels")


def _layer_args(h: int, p: int, sizes: tuple[int, ...], b: int, dtype=torch.float64, scale: float = 3.0, seed=0):
    """Random arguments of :class:`FusedLSTMLayer` (weights scaled so that both clips fire at clip 1)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype).requires_grad_()

    bound = scale / h**0.5
    return dict(
        xw=rnd(2, n, 4 * h),
        bias=rnd(2, 4 * h, s=0.5),
        c0=rnd(2, b, h),
        h0=rnd(2, b, p),
        w_hh=rnd(2, p, 4 * h, s=bound),
        w_proj=rnd(2, h, p, s=bound),
    )


def _apply(a: dict, sizes, clips=(1.0, 0.3), low=None, use_native=False):
    return FusedLSTMLayer.apply(
        a["xw"], a["bias"], a["c0"], a["h0"], a["w_hh"], a["w_proj"], sizes, *clips, low, use_native
    )


def _loss(outputs) -> torch.Tensor:
    """A loss reading every output with position-dependent weights (so that no gradient is uniform)."""
    total = 0
    for k, o in enumerate(outputs):
        total = total + (o * torch.linspace(-1, 1 + k, o.numel(), dtype=o.dtype).view_as(o)).sum()
    return total


def test_torch_path_passes_float64_gradcheck_with_ragged_rows_and_clips():
    sizes = (4, 4, 3, 1)  # 5 rows: row 4 has no step (its final state is its start state)
    a = _layer_args(h=3, p=2, sizes=sizes, b=5)
    out, final_c, _ = _apply(a, sizes)
    assert (out.detach().abs() == 0.3).any()  # the projection clip fired somewhere
    assert (final_c.detach().abs() == 1.0).any()  # and the cell clip
    assert torch.autograd.gradcheck(lambda *t: _apply(dict(zip(a, t)), sizes), tuple(a.values()), eps=1e-6, atol=1e-7)


def test_torch_path_without_clips_passes_gradcheck():
    sizes = (3, 2, 2)
    a = _layer_args(h=2, p=3, sizes=sizes, b=3, seed=1)
    fn = lambda *t: _apply(dict(zip(a, t)), sizes, clips=(0.0, 0.0))  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(a.values()), eps=1e-6, atol=1e-7)


def _grads(a: dict, sizes, **kw):
    for t in a.values():
        t.grad = None
    outs = _apply(a, sizes, **kw)
    _loss(outs).backward()
    return [o.detach() for o in outs] + [t.grad.clone() for t in a.values()]


def _close(got: torch.Tensor, want: torch.Tensor, rel: float) -> bool:
    """Within ``rel`` of the reference's magnitude (the largest absolute value)."""
    return bool((got.double() - want.double()).abs().max() <= rel * want.double().abs().max().clamp_min(1e-30))


@needs_native
def test_native_float32_equals_the_float64_reference():
    sizes = (16, 16, 13, 9, 9, 4, 1)
    a64 = _layer_args(h=48, p=16, sizes=sizes, b=17)
    a32 = {k: v.detach().float().requires_grad_() for k, v in a64.items()}
    want = _grads(a64, sizes)
    got = _grads(a32, sizes, use_native=True)
    assert (got[0].abs() == 0.3).any() and (got[0].abs() < 0.3).any()  # the projection clip fired, not everywhere
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        assert _close(g, w, 1e-5)


@needs_native
@pytest.mark.parametrize(
    "sizes, b, clips, h",
    [
        ((8, 8, 6, 2), 8, (1.0, 0.3), 32),
        # bfloat16's per-step products run on row counts rounded up to 16: rows past n read the next step's rows
        # (written again there) or unwritten ones, with the projection's output aliasing h_raw when it is not clipped
        ((37, 37, 30, 17, 17, 5, 1), 40, (1.0, 0.3), 32),
        ((37, 37, 30, 17, 17, 5, 1), 40, (1.0, 0.0), 32),
        ((33, 16, 15), 33, (0.0, 0.0), 32),
        # H = 1,024: m (H wide) and dz (4H) take step_product's two per-direction products instead of one batched
        ((37, 37, 30, 17, 17, 5, 1), 40, (1.0, 0.3), 1024),
        ((37, 37, 30, 17, 17, 5, 1), 40, (1.0, 0.0), 1024),
    ],
)
def test_native_and_torch_paths_agree_in_bf16(sizes, b, clips, h):
    a = _layer_args(h=h, p=16, sizes=sizes, b=b, dtype=torch.float32)
    a["xw"] = a["xw"].detach().bfloat16().requires_grad_()
    got = _grads(a, sizes, clips=clips, low=torch.bfloat16, use_native=True)
    want = _grads(a, sizes, clips=clips, low=torch.bfloat16, use_native=False)
    assert got[3].dtype == torch.bfloat16  # the input product's gradient in its own dtype
    for g, w in zip(got, want):  # the same roundings but exp/tanh and sum orders: a few bfloat16 ulps
        assert _close(g, w, 2e-2)


# ------------------------------------------------------------------------------------------ the whole stack
def _stack(h: int, p: int, clips=(1.0, 0.5), seed: int = 0) -> BiLSTM:
    torch.manual_seed(seed)
    m = BiLSTM(
        LSTMConfig(
            n_layers=2, dim=h, projection_dim=p, cell_clip=clips[0], proj_clip=clips[1], use_skip_connections=True
        )
    )
    with torch.no_grad():
        for w in m.parameters():
            w.mul_(3.0)
    return m


def _stack_grads(m: BiLSTM, x: torch.Tensor, lengths: torch.Tensor, fused: bool, precision="fp32", state=None):
    os.environ["ELMOKIT_FUSED_LSTM"] = "1" if fused else "0"
    try:
        m.zero_grad()
        xi = x.clone().requires_grad_()
        st = None if state is None else tuple(s.clone().requires_grad_() for s in state)
        with autocast(precision, "cpu"):
            outs, (c, h) = m(xi, lengths, st)
        loss = _loss([*outs, c, h])
        loss.backward()
        extra = [] if st is None else [s.grad for s in st]
        return [loss.detach(), xi.grad, *extra] + [w.grad.clone() for w in m.parameters()]
    finally:
        os.environ.pop("ELMOKIT_FUSED_LSTM", None)


def _ragged(b: int, t: int, p: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g).sort(descending=True).values
    lengths[0], lengths[-1] = t, 0  # the longest fills T; one row has no step
    return torch.randn(2, b, t, p, generator=g), lengths


@needs_native
def test_fused_equals_the_autograd_loop_at_the_zoo_widths():
    """LSTM 512 → 128 (the zoo recipes), 2 layers with skips, 12 ragged rows, both clips firing; a start state."""
    m = _stack(512, 128)
    x, lengths = _ragged(12, 14, 128)
    g = torch.Generator().manual_seed(2)
    state = (torch.randn(2, 2, 12, 512, generator=g), torch.randn(2, 2, 12, 128, generator=g))
    want = _stack_grads(m, x, lengths, fused=False, state=state)
    got = _stack_grads(m, x, lengths, fused=True, state=state)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and _close(a, b, 1e-5), k


def test_torch_path_equals_the_autograd_loop(monkeypatch):
    """ELMOKIT_NATIVE=0: the same Function's torch-op path (what CUDA runs) gives the loop's values."""
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setenv("ELMOKIT_NATIVE", "0")
    assert native.train_ops() is None
    m = _stack(24, 8)
    x, lengths = _ragged(6, 9, 8)
    want = _stack_grads(m, x, lengths, fused=False)
    calls = []
    monkeypatch.setattr(lstm_train, "_forward_torch", _spy(lstm_train._forward_torch, calls))
    got = _stack_grads(m, x, lengths, fused=True)
    assert len(calls) == 2  # one per layer: the fused Function ran, on its torch-op path
    for a, b in zip(got, want):
        assert _close(a, b, 1e-5)


def _spy(fn, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return wrapped


@needs_native
def test_fused_bf16_stays_near_the_bf16_loop_and_fp32():
    m = _stack(64, 16)
    x, lengths = _ragged(8, 12, 16)
    fp32 = _stack_grads(m, x, lengths, fused=False)
    old = _stack_grads(m, x, lengths, fused=False, precision="bf16")
    new = _stack_grads(m, x, lengths, fused=True, precision="bf16")
    assert not torch.equal(new[0], fp32[0])  # the products did run in bfloat16
    for a, b, f in zip(new, old, fp32):
        assert torch.isfinite(a).all()
        # bfloat16 rounding moves either path by a few percent of the gradients' magnitude; the fused path no further
        # from float32 than the loop it replaces, with a margin
        err_new = (a.double() - f.double()).abs().max()
        err_old = (b.double() - f.double()).abs().max()
        assert err_new <= max(2 * err_old, 1e-3 * f.abs().max()), (err_new, err_old)


@needs_native
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_is_deterministic(precision):
    m = _stack(64, 16)
    x, lengths = _ragged(8, 12, 16)
    a = _stack_grads(m, x, lengths, fused=True, precision=precision)
    b = _stack_grads(m, x, lengths, fused=True, precision=precision)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_a_nonfinite_input_takes_the_torch_path_and_propagates():
    sizes = (2, 2)
    a = _layer_args(h=16, p=16, sizes=sizes, b=2, dtype=torch.float32)
    with torch.no_grad():
        a["xw"][0, 1, 3] = float("nan")
    out, fc, fh = _apply(a, sizes, use_native=True)
    assert torch.isnan(out[0, 1]).any() and torch.isfinite(out[1]).all()  # the other direction is untouched


def test_fused_layer_helper_folds_the_input_product():
    """fused_lstm_layer: x·W_ih hoisted (one product), zeros in sizes dropped, float32 out under bf16."""
    a = _layer_args(h=8, p=4, sizes=(3, 2), b=3, dtype=torch.float32)
    x = torch.randn(2, 5, 4)
    w_ih = torch.randn(2, 4, 32)
    out, fc, fh = fused_lstm_layer(x, [3, 2, 0], a["c0"], a["h0"], w_ih, a["bias"], a["w_hh"], a["w_proj"], 1.0, 0.3)
    ref = _apply({**a, "xw": torch.bmm(x, w_ih)}, (3, 2))
    assert torch.allclose(out, ref[0], atol=1e-6) and torch.allclose(fc, ref[1], atol=1e-6)
    out16, _, _ = fused_lstm_layer(
        x, [3, 2], a["c0"], a["h0"], w_ih, a["bias"], a["w_hh"], a["w_proj"], 1.0, 0.3, low=torch.bfloat16
    )
    assert out16.dtype == torch.float32 and (out16 - out).abs().max() < 0.05


@needs_native
@pytest.mark.parametrize("clips", [(1.0, 0.3), (1.0, 0.0)])
def test_fused_layer_on_padded_rows_in_bf16(monkeypatch, clips):
    """Under bf16 the layer's products over all N positions run on gemm_rows(N) rows (N = 145 → 160: x padded with
    zero rows, the kernels' buffers 160 rows): the outputs and the gradients of x, W_ih, the bias, the start state,
    W_hh and W_proj equal the torch-op path's (which runs on the 145 positions) within bfloat16 rounding, and the
    unpadded run's (``gemm_rows`` made the identity)."""
    from elmokit.modules.precision import gemm_rows

    sizes = (37, 37, 30, 17, 17, 5, 2)
    n = sum(sizes)
    assert gemm_rows(n, torch.bfloat16, "cpu") == 160
    a = _layer_args(h=32, p=16, sizes=sizes, b=40, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, n, 24, generator=g)
    w_ih = torch.randn(2, 24, 128, generator=g) / 24**0.5

    def run(use_native: bool):
        leaves = [
            t.detach().clone().requires_grad_() for t in (x, w_ih, a["bias"], a["c0"], a["h0"], a["w_hh"], a["w_proj"])
        ]
        outs = fused_lstm_layer(
            leaves[0],
            list(sizes),
            leaves[3],
            leaves[4],
            leaves[1],
            leaves[2],
            leaves[5],
            leaves[6],
            *clips,
            low=torch.bfloat16,
            use_native=use_native,
        )
        _loss(outs).backward()
        assert outs[0].shape == (2, n, 16)
        return [o.detach() for o in outs] + [t.grad for t in leaves]

    padded_native, padded_torch = run(True), run(False)
    monkeypatch.setattr(lstm_train, "gemm_rows", lambda rows, dtype, device_type: rows)
    plain_native = run(True)
    for got, torch_path, plain in zip(padded_native, padded_torch, plain_native):
        assert _close(got, torch_path, 2e-2)
        assert _close(got, plain, 2e-2)


# ---------------------------------------------------------------------------------------------- trainer runs
CLIPPED = {**TINY_TRAIN_OPTIONS, "lstm": {**TINY_TRAIN_OPTIONS["lstm"], "cell_clip": 0.5, "proj_clip": 0.25}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batching", ["windows", "sentences"])
def test_a_fused_run_resumes_bit_exactly(corpus, tmp_path, precision, batching):
    def cfg(out, **kw):
        return tiny_window_config(
            corpus, out, model=CLIPPED, precision=precision, batching=batching, **{"max_steps": 8, **kw}
        )

    Trainer(cfg(tmp_path / "whole")).train()
    Trainer(cfg(tmp_path / "split", max_steps=4)).train()
    Trainer(cfg(tmp_path / "split")).train(resume=True)
    assert _losses(tmp_path / "split") == _losses(tmp_path / "whole")
    got = load_file(str(tmp_path / "split" / "model" / "model.safetensors"))
    want = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_fused_run_follows_the_loop_run(corpus, tmp_path, monkeypatch):
    """fp32 training on the fused layer and on the autograd loop: the same losses up to float rounding."""
    Trainer(tiny_window_config(corpus, tmp_path / "fused", model=CLIPPED, max_steps=6)).train()
    monkeypatch.setenv("ELMOKIT_FUSED_LSTM", "0")
    Trainer(tiny_window_config(corpus, tmp_path / "loop", model=CLIPPED, max_steps=6)).train()
    fused, loop = _losses(tmp_path / "fused"), _losses(tmp_path / "loop")
    assert fused.keys() == loop.keys()
    for step in fused:
        assert abs(fused[step] - loop[step]) <= 1e-5 * abs(loop[step]), (step, fused[step], loop[step])


def test_per_direction_bmm_equals_bmm():
    """The weight gradients' product: one ``mm`` per direction in float32 (a transposed first operand included), the
    ``bmm`` itself otherwise; the same values up to the GEMM's summation order."""
    torch.manual_seed(4)
    a = torch.randn(2, 300, 7).transpose(1, 2)  # (2, 7, 300), a transposed view, as xᵀ and h_{t-1}ᵀ
    b = torch.randn(2, 300, 40)
    got = lstm_train.per_direction_bmm(a, b)
    assert got.shape == (2, 7, 40) and got.is_contiguous()
    assert_close_to_scale(got, torch.bmm(a, b), 1e-5, dim=2)
    a64, b64 = a.double(), b.double()
    assert torch.equal(lstm_train.per_direction_bmm(a64, b64), torch.bmm(a64, b64))
