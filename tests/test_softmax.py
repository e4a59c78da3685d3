"""LM head: full softmax NLL, TF-style log-uniform sampler and sampled softmax."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from elmokit.errors import ConfigError, InputError, UsageError
from elmokit.modules.softmax import (
    SoftmaxLM,
    log_uniform_candidates,
    log_uniform_draws,
    log_uniform_expected_count,
    log_uniform_probs,
)
from helpers import assert_close_to_scale


def _tiny_head() -> SoftmaxLM:
    m = SoftmaxLM(2, 3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        m.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
    return m


def test_shapes_and_init():
    torch.manual_seed(0)
    m = SoftmaxLM(64, 1000)
    assert m.weight.shape == (1000, 64) and m.bias.shape == (1000,)
    assert torch.all(m.bias == 0)
    assert abs(m.weight.std().item() - 1 / 8) < 0.01  # N(0, 1/sqrt(D)) as bilm-tf
    assert m.logits(torch.zeros(2, 5, 64)).shape == (2, 5, 1000)


def test_full_nll_hand_computed():
    m = _tiny_head()
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    targets = torch.tensor([0, 2])
    # row 0: logits [1, 0, 0 - 1 + 0] = [1, 0, 0]  -> -log(e / (e + 2))
    # row 1: logits [0, 2, 2 - 1]    = [0, 2, 1]  -> -log(e^1 / (1 + e^2 + e))
    expected = torch.tensor([math.log(math.e + 2) - 1, math.log(1 + math.e**2 + math.e) - 1])
    nll = m.full_nll(h, targets)
    assert nll.dtype == torch.float32 and nll.shape == (2,)
    torch.testing.assert_close(nll, expected)


def test_losses_float32_under_autocast():
    m = _tiny_head()
    h, y = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 2])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m.logits(h).dtype == torch.bfloat16
        nll = m.full_nll(h, y)
        snll = m.sampled_nll(h, y, 1, torch.Generator().manual_seed(0))
    assert nll.dtype == snll.dtype == torch.float32
    torch.testing.assert_close(nll, m.full_nll(h, y), atol=0.05, rtol=0.02)  # bf16 matmul, float32 softmax


def test_validation_errors():
    m = _tiny_head()
    h = torch.zeros(2, 2)
    with pytest.raises(InputError, match="target id 3 out of range"):
        m.full_nll(h, torch.tensor([0, 3]))
    with pytest.raises(InputError, match="target id -1 out of range"):
        m.sampled_nll(h, torch.tensor([-1, 0]), 1)
    with pytest.raises(InputError, match=r"targets must have shape \(N=2,\)"):
        m.full_nll(h, torch.tensor([0]))
    with pytest.raises(InputError, match=r"shape \(N, D=2\)"):
        m.full_nll(torch.zeros(1, 2, 2), torch.tensor([0]))
    with pytest.raises(InputError, match="last dim must be D=2"):
        m.full_nll(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(InputError, match="integer tensor"):
        m.full_nll(h, torch.tensor([0.0, 1.0]))
    with pytest.raises(UsageError, match="num_samples"):
        m.sampled_nll(h, torch.tensor([0, 1]), 0)
    with pytest.raises(ConfigError, match="vocab_size"):
        SoftmaxLM(4, 0)


def test_log_uniform_probs_formula_and_sum():
    p = log_uniform_probs(10)
    assert p.dtype == torch.float64
    assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert p[0].item() == pytest.approx(math.log(2) / math.log(11))
    assert p[9].item() == pytest.approx((math.log(11) - math.log(10)) / math.log(11))
    assert torch.all(p[1:] < p[:-1])  # Zipfian: decreasing
    assert log_uniform_probs(793471).sum().item() == pytest.approx(1.0, abs=1e-9)


def test_draw_frequencies_match_formula():
    g = torch.Generator().manual_seed(1234)
    V, n = 1000, 200_000
    draws = log_uniform_draws(V, n, g)
    assert draws.min() >= 0 and draws.max() < V
    p = log_uniform_probs(V)
    for k in (0, 1, 5):
        freq = (draws == k).double().mean().item()
        # 5 standard deviations of a binomial proportion
        assert abs(freq - p[k].item()) < 5 * math.sqrt(p[k].item() * (1 - p[k].item()) / n)
    assert (draws >= 100).double().mean().item() == pytest.approx(p[100:].sum().item(), abs=0.005)


def test_candidates_unique_and_deterministic():
    ids, tries = log_uniform_candidates(500, 50, torch.Generator().manual_seed(7))
    ids2, tries2 = log_uniform_candidates(500, 50, torch.Generator().manual_seed(7))
    assert ids.shape == (50,) and ids.dtype == torch.int64
    assert len(set(ids.tolist())) == 50
    assert tries >= 50
    assert torch.equal(ids, ids2) and tries == tries2
    # all ids: the rejection loop has to find every one
    ids, tries = log_uniform_candidates(20, 20, torch.Generator().manual_seed(0))
    assert sorted(ids.tolist()) == list(range(20))
    with pytest.raises(UsageError, match="num_samples"):
        log_uniform_candidates(20, 21)


def test_candidates_num_tries_counts_draws():
    # Replay: the picked ids are the first distinct values of the raw draw stream, and num_tries the position of the
    # draw that completed the set.
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    ids, tries = log_uniform_candidates(100, 30, g)
    g.set_state(state)
    raw: list[int] = []
    chunk = max(2 * 30, 64)  # the sampler's chunk schedule: 64, 128, 256, ...
    for _ in range(6):
        raw += log_uniform_draws(100, chunk, g).tolist()
        chunk *= 2
    first: list[int] = []
    for i, v in enumerate(raw):
        if v not in first:
            first.append(v)
            if len(first) == 30:
                assert tries == i + 1
                break
    assert ids.tolist() == first


def test_expected_count_formulas():
    V, S = 10, 3
    ids = torch.tensor([0, 4])
    p = [math.log(2) / math.log(11), (math.log(6) - math.log(5)) / math.log(11)]
    q = log_uniform_expected_count(ids, V, S, num_tries=5)
    assert q.tolist() == pytest.approx([1 - (1 - p[0]) ** 5, 1 - (1 - p[1]) ** 5])
    # TF's shortcut when no draw was rejected
    q = log_uniform_expected_count(ids, V, S, num_tries=S)
    assert q.tolist() == pytest.approx([p[0] * S, p[1] * S])


def test_sampled_falls_back_to_full(caplog):
    torch.manual_seed(0)
    m = SoftmaxLM(4, 6)
    h, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 5])
    with caplog.at_level(logging.INFO, logger="elmokit.modules.softmax"):
        a = m.sampled_nll(h, y, 5)
        b = m.sampled_nll(h, y, 100)
    torch.testing.assert_close(a, m.full_nll(h, y))
    torch.testing.assert_close(b, m.full_nll(h, y))
    assert sum("full softmax" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_sampled_nll_matches_hand_computation_with_accidental_hit():
    torch.manual_seed(0)
    V, D, S = 50, 6, 8
    m = SoftmaxLM(D, V)
    with torch.no_grad():
        m.bias.normal_()
    h = torch.randn(3, D)
    g = torch.Generator().manual_seed(11)
    state = g.get_state()
    sampled, tries = log_uniform_candidates(V, S, g)
    hit = int(sampled[2])
    targets = torch.tensor([hit, 49, 7 if 7 not in sampled.tolist() else 48])
    g.set_state(state)
    nll = m.sampled_nll(h, targets, S, g)

    W, b = m.weight.detach().double(), m.bias.detach().double()
    hd = h.double()
    p = log_uniform_probs(V)
    q = (p * S) if tries == S else -torch.expm1(tries * torch.log1p(-p))
    for n in range(3):
        y = int(targets[n])
        true = float(hd[n] @ W[y] + b[y] - torch.log(q[y]))
        terms = [true]
        for s in sampled.tolist():
            if s == y:
                continue  # accidental hit removed
            terms.append(float(hd[n] @ W[s] + b[s] - torch.log(q[s])))
        expected = math.log(sum(math.exp(t) for t in terms)) - true
        assert nll[n].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)
    assert nll.dtype == torch.float32


def test_sampled_nll_importance_estimate_is_sane():
    # exp(nll) - 1 = Q(y) * sum_{s in S, s != y} exp(o_s - o_y) / Q(s); divided by Q(y) it is an importance-sampling
    # estimate of sum_{j != y} exp(o_j - o_y) = exp(full_nll) - 1, whose mean over draws must come close
    # (TF's expected-count approximation leaves a bias of a few percent).
    torch.manual_seed(0)
    V, D, S, R = 200, 8, 20, 400
    m = SoftmaxLM(D, V)
    h, y = torch.randn(4, D), torch.tensor([0, 5, 50, 199])
    full = m.full_nll(h, y).double()
    g = torch.Generator().manual_seed(1)
    acc = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(R):
            state = g.get_state()
            nll = m.sampled_nll(h, y, S, g).double()
            g2 = torch.Generator()
            g2.set_state(state)
            _, tries = log_uniform_candidates(V, S, g2)
            acc += (nll.exp() - 1) / log_uniform_expected_count(y, V, S, tries)
    torch.testing.assert_close(acc / R, full.exp() - 1, rtol=0.15, atol=0)


def test_sampled_nll_gradients_flow():
    torch.manual_seed(0)
    m = SoftmaxLM(4, 100)
    h = torch.randn(6, 4, requires_grad=True)
    loss = m.sampled_nll(h, torch.randint(0, 100, (6,)), 10, torch.Generator().manual_seed(0)).mean()
    loss.backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(m.weight.grad).all()
    assert m.weight.grad.abs().sum() > 0


def test_fused_sampled_logsumexp_equals_composed_ops():
    """The fused sampled path (float32) gives the composed ops' loss and gradients, with accidental hits present."""
    from elmokit.modules.softmax import _accidental_hits, _SampledLogSumExp

    torch.manual_seed(3)
    V, D, N, S = 40, 6, 12, 9
    h = torch.randn(N, D, requires_grad=True)
    w = torch.randn(S, D, requires_grad=True)
    b = torch.randn(S, requires_grad=True)
    sampled = torch.randperm(V)[:S]
    targets = torch.cat([sampled[:4], torch.randint(0, V, (N - 4,))])
    rows, cols = _accidental_hits(targets, sampled, V)
    hits = targets.unsqueeze(1) == sampled.unsqueeze(0)
    assert rows.numel() == int(hits.sum()) >= 4
    assert bool(hits[rows, cols].all())
    weights = torch.randn(N)
    fused = _SampledLogSumExp.apply(h, w, b, rows, cols)
    (fused * weights).sum().backward()
    grads = [t.grad.clone() for t in (h, w, b)]
    for t in (h, w, b):
        t.grad = None
    logits = (h @ w.t() + b).masked_fill(hits, torch.finfo(torch.float32).min)
    composed = torch.logsumexp(logits, dim=1)
    (composed * weights).sum().backward()
    # log-sum-exps near 8 (they grow with log V and the logits' size): 1e-5 absolute up to 1, relative above
    assert_close_to_scale(fused, composed, 1e-5)
    for got, t in zip(grads, (h, w, b)):
        assert_close_to_scale(got, t.grad, 1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_sampled_logsumexp_in_blocks_equals_one_block(monkeypatch, precision):
    """The forward's blocks of rows change nothing: 16-row blocks (hits in several blocks, a last short block) give
    the one-block result bit for bit — loss and gradients — in float32 and under bf16 autocast."""
    from elmokit.modules import softmax
    from elmokit.modules.precision import autocast

    torch.manual_seed(5)
    V, D, N, S = 60, 8, 53, 24
    h, w, b = torch.randn(N, D), torch.randn(S, D), torch.randn(S)
    sampled = torch.randperm(V)[:S]
    targets = torch.cat([sampled[:3], torch.randint(0, V, (N - 3,))])[torch.randperm(N)]
    rows, cols = softmax._accidental_hits(targets, sampled, V)
    assert rows.numel() >= 3 and len(set((rows // 16).tolist())) >= 2  # hits fall in more than one block
    weights = torch.randn(N)

    monkeypatch.setattr(softmax, "_native_rows", lambda h1, w1: None)  # the torch-op blocks, not the native rows

    def run(block_elements):
        monkeypatch.setattr(softmax, "_BLOCK_ELEMENTS", block_elements)
        leaves = [t.clone().requires_grad_() for t in (h, w, b)]
        with autocast(precision, "cpu"):
            out = softmax._SampledLogSumExp.apply(*leaves, rows, cols)
        (out * weights).sum().backward()
        return [out.detach(), *(t.grad for t in leaves)]

    blocked, whole = run(16 * S), run(N * S)  # 16 rows a block (4 blocks, the last of 5 rows) vs one block
    for got, want in zip(blocked, whole):
        assert torch.equal(got, want)


def test_fused_sampled_logsumexp_all_hits_row_has_no_gradient():
    """S = 1 and the only sample is the row's target: the row's loss is a_y alone and no gradient reaches W_s."""
    from elmokit.modules.softmax import _SampledLogSumExp

    h = torch.randn(1, 3, requires_grad=True)
    w = torch.randn(1, 3, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    out = _SampledLogSumExp.apply(h, w, b, torch.tensor([0]), torch.tensor([0]))
    assert out.detach().item() == torch.finfo(torch.float32).min
    out.sum().backward()
    assert float(w.grad.abs().sum()) == 0.0 and float(b.grad.abs().sum()) == 0.0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_native_softmax_rows_equal_the_torch_blocks(monkeypatch, train_kernels, precision):
    """The native one-pass rows (``native_softmax.cpp``) give the torch-op blocks' loss and gradients: float32 within
    float rounding of the values compared, bf16 within the bfloat16 rounding of the saved probabilities; with
    accidental hits in several rows and a row whose every sample is a hit."""
    from elmokit.modules import softmax
    from elmokit.modules.precision import autocast

    assert softmax.native.softmax_ops() is not None  # the native rows run here (train_kernels: the same extension)
    torch.manual_seed(7)
    V, D, N, S = 300, 16, 70, 64
    h, w, b = torch.randn(N, D), torch.randn(S, D) * 0.5, torch.randn(S)
    sampled = torch.randperm(V)[:S]
    targets = torch.cat([sampled[:5], torch.randint(0, V, (N - 5,))])[torch.randperm(N)]
    rows, cols = softmax._accidental_hits(targets, sampled, V)
    assert rows.numel() >= 5
    weights = torch.randn(N)

    def run(native: bool):
        if not native:
            monkeypatch.setattr(softmax, "_native_rows", lambda h1, w1: None)
        leaves = [t.clone().requires_grad_() for t in (h, w, b)]
        with autocast(precision, "cpu"):
            out = softmax._SampledLogSumExp.apply(*leaves, rows, cols)
        (out * weights).sum().backward()
        monkeypatch.undo()
        return [out.detach(), *(t.grad for t in leaves)]

    native, blocks = run(True), run(False)
    tol = 1e-5 if precision == "fp32" else 1e-2
    for got, want in zip(native, blocks):
        assert_close_to_scale(got, want, tol)
    assert not torch.equal(native[1], torch.zeros_like(native[1]))


def test_native_softmax_rows_hand_computed(train_kernels):
    """One 4-column row by hand: logits (1, 2, 3, 4) with column 2 an accidental hit → lse = log(e + e² + e⁴), the
    probabilities e^x / Σ with 0 at the hit; the input buffer is overwritten in place."""
    import math

    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    lse = torch.ops.elmokit_softmax.softmax_rows_(logits, torch.tensor([0]), torch.tensor([2]))
    z = math.e + math.e**2 + math.e**4
    assert lse.tolist() == pytest.approx([math.log(z), math.log(4.0)], rel=1e-6)
    assert logits[0].tolist() == pytest.approx([math.e / z, math.e**2 / z, 0.0, math.e**4 / z], rel=1e-6)
    assert logits[1].tolist() == pytest.approx([0.25] * 4, rel=1e-6)


def test_native_softmax_rows_refuse_huge_logits(monkeypatch, train_kernels):
    """Logits that could overflow (|h|·|w|·D ≥ 1e30) take the torch-op blocks (the kernel assumes finite values)."""
    from elmokit.modules import softmax

    h1, w1 = torch.full((2, 3), 1e16), torch.full((4, 3), 1e16)
    assert softmax._native_rows(h1, w1) is None
    assert softmax._native_rows(h1 * 1e-16, w1 * 1e-16) is not None


def test_sparse_grad_gives_the_dense_gradients():
    """``sparse_grad``: the sampled loss and, once densified, W's and b's gradients equal the dense gathers' (the
    same contributions summed in another order), with a target repeated and targets among the negatives."""
    torch.manual_seed(11)
    m = SoftmaxLM(8, 50)
    h = torch.randn(20, 8)
    targets = torch.cat([torch.tensor([0, 0, 1, 2]), torch.randint(0, 50, (16,))])
    results = []
    for sparse in (False, True):
        m.zero_grad(set_to_none=True)
        m.sparse_grad = sparse
        loss = m.sampled_nll(h, targets, 12, torch.Generator().manual_seed(3))
        loss.sum().backward()
        assert m.weight.grad.is_sparse == sparse
        results.append((loss.detach(), m.weight.grad.to_dense(), m.bias.grad.clone()))
    (l0, w0, b0), (l1, w1, b1) = results
    assert torch.equal(l0, l1)
    assert_close_to_scale(w1, w0, 1e-6)
    assert torch.equal(b1, b0)
    assert int((w0.abs().sum(1) > 0).sum()) >= 12  # the negatives' and targets' rows were reached


def test_sparse_grad_is_off_without_autograd_and_by_default():
    m = SoftmaxLM(4, 30)
    assert m.sparse_grad is False
    m.sparse_grad = True
    with torch.no_grad():
        out = m.sampled_nll(torch.randn(5, 4), torch.randint(0, 30, (5,)), 6, torch.Generator().manual_seed(0))
    assert out.shape == (5,) and torch.isfinite(out).all()


@pytest.mark.parametrize("sparse", [False, True])
def test_full_nll_training_path_equals_cross_entropy(sparse):
    """With autograd (training), ``full_nll`` runs the fused log-sum-exp minus the true logit: the loss and the
    gradients of h, W and b equal ``F.cross_entropy``'s on the float32 logits (a target repeated, every word's row
    reached through the log-sum-exp); without autograd it is ``F.cross_entropy`` itself, bit for bit."""
    import torch.nn.functional as F

    torch.manual_seed(5)
    m = SoftmaxLM(6, 37)
    with torch.no_grad():
        m.bias.normal_()
    m.sparse_grad = sparse
    h = torch.randn(15, 6, requires_grad=True)
    targets = torch.cat([torch.tensor([3, 3, 0, 36]), torch.randint(0, 37, (11,))])
    weights = torch.rand(15)
    got = m.full_nll(h, targets)
    assert got.grad_fn is not None and "SampledLogSumExp" in str(got.grad_fn.next_functions)
    (got * weights).sum().backward()
    grads = [h.grad.clone(), m.weight.grad.to_dense().clone(), m.bias.grad.clone()]
    h.grad = m.weight.grad = m.bias.grad = None
    want = F.cross_entropy(F.linear(h, m.weight, m.bias), targets, reduction="none")
    (want * weights).sum().backward()
    assert_close_to_scale(got, want, 1e-5)
    for g, t in zip(grads, (h, m.weight, m.bias)):
        assert_close_to_scale(g, t.grad, 1e-5)
    with torch.no_grad():
        assert torch.equal(
            m.full_nll(h, targets), F.cross_entropy(F.linear(h, m.weight, m.bias), targets, reduction="none")
        )


def test_full_nll_training_path_under_bf16_autocast():
    """Under bf16 autocast the training path's products are bfloat16 (float32 softmax): the loss and h's gradient
    stay within bfloat16's rounding of the float32 reference (8 bits of mantissa: 2⁻⁸ relative on each logit)."""
    import torch.nn.functional as F

    torch.manual_seed(6)
    m = SoftmaxLM(16, 50)
    h = torch.randn(24, 16, requires_grad=True)
    targets = torch.randint(0, 50, (24,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = m.full_nll(h, targets)
    assert got.dtype == torch.float32
    got.sum().backward()
    gh = h.grad.clone()
    h.grad = None
    want = F.cross_entropy(F.linear(h, m.weight, m.bias), targets, reduction="none")
    want.sum().backward()
    # logits of size ≈ 4 (|h|·|w| over 16 dims): bf16 rounds each by ≈ 4 · 2⁻⁸ ≈ 0.016
    assert_close_to_scale(got, want, 0.03)
    assert_close_to_scale(gh, h.grad, 0.03, dim=1)


def test_gemm_rows_hand_computed():
    """bfloat16 on the CPU: multiples of 16 below 256 rows, then eight sizes an octave; anything else unchanged."""
    from elmokit.modules.precision import gemm_rows

    bf = torch.bfloat16
    assert [gemm_rows(n, bf, "cpu") for n in (0, 1, 16, 17, 255)] == [0, 16, 16, 32, 256]
    # 256 ≤ n < 512: multiples of 32; 8,730 (an octave from 8,192): multiples of 1,024
    assert [gemm_rows(n, bf, "cpu") for n in (256, 257, 511, 8192, 8730, 16383)] == [256, 288, 512, 8192, 9216, 16384]
    assert all(n <= gemm_rows(n, bf, "cpu") <= n * 1.125 for n in range(256, 5000))
    assert gemm_rows(8730, torch.float32, "cpu") == 8730 and gemm_rows(8730, bf, "cuda") == 8730


def test_fused_sampled_logsumexp_bf16_on_padded_rows(monkeypatch):
    """Under bf16 autocast the products run on gemm_rows(N) = 320 rows for N = 300 (20 zero rows): the loss and the
    gradients of h, W and b equal a float64 computation on the same bfloat16-rounded inputs within bfloat16's rounding
    (relative to each tensor's largest value: ∂W sums 300 rows of both signs), and the unpadded products' results
    (the padded rows add nothing; bit for bit where the GEMM's rounding does not depend on its row count)."""
    from elmokit.modules import softmax
    from elmokit.modules.precision import autocast, gemm_rows

    torch.manual_seed(11)
    V, D, N, S = 500, 16, 300, 96
    assert gemm_rows(N, torch.bfloat16, "cpu") == 320
    h = torch.randn(N, D).bfloat16().float()
    w = (torch.randn(S, D) * 0.3).bfloat16().float()
    b = torch.randn(S).bfloat16().float()
    sampled = torch.randperm(V)[:S]
    targets = torch.cat([sampled[:7], torch.randint(0, V, (N - 7,))])[torch.randperm(N)]
    rows, cols = softmax._accidental_hits(targets, sampled, V)
    weights = torch.randn(N)

    def run():
        leaves = [t.clone().requires_grad_() for t in (h, w, b)]
        with autocast("bf16", "cpu"):
            out = softmax._SampledLogSumExp.apply(*leaves, rows, cols)
        (out * weights).sum().backward()
        return [out.detach().double(), *(t.grad.double() for t in leaves)]

    padded = run()
    monkeypatch.setattr(softmax, "gemm_rows", lambda n, dtype, device_type: n)
    unpadded = run()
    ref = [t.double().requires_grad_() for t in (h, w, b)]
    logits = (ref[0] @ ref[1].t() + ref[2]).index_put((rows, cols), torch.tensor(-1e300, dtype=torch.float64))
    want = torch.logsumexp(logits, dim=1)
    (want * weights.double()).sum().backward()
    for got, plain, reference in zip(padded, unpadded, [want.detach(), *(t.grad for t in ref)]):
        scale = float(reference.abs().max())
        assert float((got - reference).abs().max()) <= 2e-2 * scale
        assert float((got - plain).abs().max()) <= 1e-2 * scale
