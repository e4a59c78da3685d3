"""The optional C++ kernels (elmokit/modules/native.py) equal the TorchScript/ATen paths they replace at small batches,
and their absence falls back with one warning.

They run where the extension builds (a C++ compiler and ninja); elsewhere these tests skip, except under
``ELMOKIT_REQUIRE_NATIVE=1`` (set by ``.ci/run``), where a missing extension fails."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

import elmokit.modules.lstm as lstm_module
from elmokit.config import LSTMConfig
from elmokit.modules import native
from elmokit.modules.highway import Highway
from elmokit.modules.lstm import BiLSTM
from helpers import assert_close_to_scale


def _no_native(monkeypatch) -> None:
    monkeypatch.setattr(native, "_module", False)


def test_lstm_layer_equals_the_torchscript_loop(kernels, monkeypatch):
    """Clips firing, rows ending at different steps, a zero-length row, a given start state: outputs and final
    states equal the TorchScript loop's within float rounding, and both equal the cell equations."""
    from helpers import clipping_lstm

    lstm = clipping_lstm(48, 16, 2, cell_clip=0.5, proj_clip=0.3, use_skip_connections=True, seed=0)
    x = torch.randn(2, 5, 7, 16) * 3
    lengths = torch.tensor([7, 6, 3, 3, 0])
    state = (torch.randn(2, 2, 5, 48), torch.randn(2, 2, 5, 16))
    calls = []
    monkeypatch.setattr(native, "lstm_layer", lambda *a: calls.append(1) or native_lstm(*a))
    with torch.no_grad():
        outs, (c, h) = lstm(x, lengths, state)
        assert len(calls) == 2  # both layers took the kernel
        _no_native(monkeypatch)
        ref_outs, (ref_c, ref_h) = lstm(x, lengths, state)
    # outputs with the skip connection and start states reach ~3: 2e-6 absolute up to 1, relative above
    for out, ref in zip(outs, ref_outs):
        assert_close_to_scale(out, ref, 2e-6)
    assert_close_to_scale(c, ref_c, 2e-6)
    assert_close_to_scale(h, ref_h, 2e-6)
    assert float(ref_c[:, :, :4].abs().max()) == 0.5  # the cell clip fired (row 4 keeps its start state)
    assert float(ref_outs[0].abs().max()) == pytest.approx(0.3)  # the projection clip fired (layer 0: no residual)
    assert bool((outs[0][:, 4] == 0).all())  # the zero-length row: no output, its start state kept
    assert torch.equal(c[:, :, 4], state[0][:, :, 4])


native_lstm = native.lstm_layer


@pytest.mark.parametrize("lengths", [[11], [11, 11, 10, 9, 6, 4, 4, 2, 1], [5] * 32])
def test_lstm_layer_small_configuration_shapes(kernels, lengths):
    """The small configuration's widths (H = 1024, P = 128): one row of 11 steps, nine rows ending at different
    steps (the kernel's groups of four, two and one row sharing each weight load) and 32 rows
    (native.MAX_LSTM_ROWS): the kernel against the compiled loop on the same cached weights."""
    torch.manual_seed(len(lengths))
    lstm = BiLSTM(LSTMConfig(dim=1024, projection_dim=128, n_layers=1, cell_clip=3.0, proj_clip=3.0))
    sizes = [sum(n > s for n in lengths) for s in range(lengths[0])]  # running rows per step
    b = len(lengths)
    x = torch.randn(2, sum(lengths), 128)
    c, h = torch.randn(2, b, 1024) * 0.5, torch.randn(2, b, 128) * 0.5
    assert b <= native.MAX_LSTM_ROWS
    with torch.no_grad():
        w_in, w_hh = lstm._inference_weights(0)
        w_ih, bias = w_in[:, :128], w_in[:, 128]
        want = lstm_module.inference_steps(by_direction=True)(
            x, sizes, c, h, w_ih, bias, w_hh, lstm.weight_proj[0], 1024, 3.0, 3.0
        )
        got = native.lstm_layer(
            kernels, x, sizes, c, h, w_ih, bias, native.pack_lstm(w_hh), lstm.weight_proj[0], 3.0, 3.0
        )
    for g, w in zip(got, want):
        assert_close_to_scale(g, w, 2e-6)


def test_pack_lstm_layout_and_errors():
    hd, p = 32, 16
    w = torch.arange(2 * p * 4 * hd, dtype=torch.float32).reshape(2, p, 4 * hd)
    packed = native.pack_lstm(w)
    assert packed.shape == (2, hd // 16, p, 64)
    # direction 1, block 1, input 3: gates i, f, o, j of units 16 … 31
    want = torch.cat([w[1, 3, g * hd + 16 : g * hd + 32] for g in range(4)])
    assert torch.equal(packed[1, 1, 3], want)
    with pytest.raises(ValueError, match="multiples of 16"):
        native.pack_lstm(torch.zeros(2, 5, 48))


@pytest.mark.parametrize("rows", [1, 2, 5, 10, 12])
def test_highway_kernel_equals_the_gemm_path(kernels, monkeypatch, rows):
    """Two highway layers of the small configuration's width (F = 2048) on 1 … 12 rows: the kernel against the fused
    GEMM path and against float64; the kernel's error is no larger than float32 rounding."""
    torch.manual_seed(rows)
    highway = Highway(2048, 2)
    for p in highway.parameters():
        torch.nn.init.normal_(p, std=0.03)
    x = torch.randn(rows, 2048).relu()
    with torch.no_grad():
        got = highway(x)
        assert "packed0" in highway._derived._entries and "packed1" in highway._derived._entries
        _no_native(monkeypatch)
        want = highway(x)
        ref = highway.double()(x.double())
    # sums of 2048 products in other orders: values up to ~3 differed by 2.6e-6 (√2048·2^-24 ≈ 2.7e-6 of the
    # values summed); the bound is relative above 1
    assert_close_to_scale(got, want, 5e-6)
    assert_close_to_scale(got, ref, 5e-6)


def test_highway_kernel_is_not_used_where_it_cannot_be(kernels, monkeypatch):
    """More than 12 rows, a width not a multiple of 16, autograd: the other paths run (and give the same values)."""
    used = []
    monkeypatch.setattr(native, "highway_layer", lambda *a: used.append(1) or native_highway(*a))
    torch.manual_seed(3)
    wide = Highway(64, 1)
    with torch.no_grad():
        wide(torch.randn(13, 64))
        Highway(40, 1)(torch.randn(3, 40))
    wide(torch.randn(3, 64))  # autograd
    assert used == []
    with torch.no_grad():
        wide(torch.randn(12, 64))
    assert used == [1]


native_highway = native.highway_layer


def test_pack_highway_layout_and_errors():
    f = 32
    weight = torch.arange(f * 2 * f, dtype=torch.float32).reshape(f, 2 * f)
    bias = torch.arange(2 * f, dtype=torch.float32)
    packed, packed_bias = native.pack_highway(weight, bias)
    assert packed.shape == (2, f, 32) and packed_bias.shape == (2, 32)
    # block 1, input 5: transform columns of units 16 … 31, then their gate columns (F + 16 … F + 31)
    assert torch.equal(packed[1, 5], torch.cat([weight[5, 16:32], weight[5, f + 16 : f + 32]]))
    assert torch.equal(packed_bias[0], torch.cat([bias[:16], bias[f : f + 16]]))
    with pytest.raises(ValueError, match="multiple of 16"):
        native.pack_highway(torch.zeros(40, 80), torch.zeros(80))


@pytest.mark.parametrize("lstm_dims", [(16, 8), (32, 16)])
def test_bilm_single_sentence_equals_the_fallback(kernels, monkeypatch, lstm_dims):
    """Whole biLM calls at batch 1 and 3 (the highway kernel; the LSTM kernel where H and P are multiples of 16, the
    TorchScript loop for P = 8) equal the same calls with the kernels off."""
    from elmokit import batch_to_ids
    from helpers import tiny_random_bilm

    bilm = tiny_random_bilm(seed=4, lstm_dims=lstm_dims)
    used = []
    monkeypatch.setattr(native, "lstm_layer", lambda *a: used.append(a[7].dim()) or native_lstm(*a))
    batches = [
        batch_to_ids([["the", "bank", "of", "the", "river", "flooded"]]),
        batch_to_ids([["a", "bank"], [], ["money", "in", "the", "bank", "today"]]),
    ]
    with torch.no_grad():
        got = [bilm(ids).layers for ids in batches]
        assert len(used) == (4 if lstm_dims[1] % 16 == 0 else 0)  # 2 layers × 2 batches, or none for P = 8
        _no_native(monkeypatch)
        want = [bilm(ids).layers for ids in batches]
    for g, w in zip(got, want):
        assert_close_to_scale(g, w, 2e-6)


def test_a_failed_build_falls_back_with_one_warning(monkeypatch, caplog, tmp_path):
    """No compiler / no ninja: one warning, kernels() is None from then on, and inference still runs."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no finished build to load instead

    def broken(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.delenv("ELMOKIT_NATIVE", raising=False)
    with caplog.at_level(logging.WARNING, logger="elmokit.modules.native"):
        assert native.kernels() is None
        assert native.kernels() is None
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "Ninja is required" in warnings[0].getMessage()
    assert native.status()["state"] == "unavailable" and "Ninja is required" in native.status()["reason"]
    with torch.no_grad():
        assert Highway(32, 1)(torch.randn(2, 32)).shape == (2, 32)


def test_elmokit_native_0_turns_the_kernels_off(monkeypatch):
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setenv("ELMOKIT_NATIVE", "0")
    assert native.kernels() is None


def test_build_name_changes_with_the_cpu(monkeypatch):
    """A build made for one CPU is never loaded on another (a home directory shared between machines)."""
    first = native.build_name()
    monkeypatch.setattr(native, "_cpu_identity", lambda: "model name: another CPU\nflags: sse2")
    assert native.build_name() != first and native.build_name().startswith("elmokit_native_")


def test_huge_and_non_finite_inputs_give_the_fallback_values(kernels, monkeypatch):
    """The kernels are built with -ffast-math: huge finite pre-activations must still saturate as ATen's do (no
    NaN), and inputs holding inf or NaN go to the ATen path, which propagates them as before (found by a new-user
    pass: 1e6 into the LSTM or 1e30 into the highway gave NaN)."""
    torch.manual_seed(0)
    highway = Highway(64, 2)
    lstm = BiLSTM(
        LSTMConfig(dim=32, projection_dim=16, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=False)
    )
    cases = []
    for value in (1e6, 1e30, float("inf"), float("nan")):
        x = torch.randn(2, 64)
        x[1, 3] = value
        seq = torch.randn(2, 1, 4, 16)
        seq[0, 0, 1, 2] = value
        cases.append((x, seq))
    state = (torch.zeros(2, 2, 1, 32), torch.zeros(2, 2, 1, 16))
    state[0][0, 0, 0, 5] = float("nan")
    lengths = torch.tensor([4])

    def run():
        with torch.no_grad():
            outs = [(highway(x), lstm(seq, lengths)[0][1]) for x, seq in cases]
            outs.append((torch.zeros(1), lstm(cases[0][1] * 0, lengths, state)[0][1]))
        return outs

    got = run()
    _no_native(monkeypatch)
    want = run()
    # the rows fed 1e6 / 1e30 reach 5.3e4 / 5.3e28, where float32 rounding of the kernel's sums in another order
    # than ATen's is far above any absolute bound: 0.0078 and 9.4e21. The second layer sums such values of both
    # signs, so the error is relative to the row's largest value, not to each value (9.4e21 is 2.4e-6 of the value
    # 4.0e27 where it fell, 1.8e-7 of its row): 2e-6 absolute up to 1, relative to each row's largest value above
    # (the differences seen are ~1.5 float32 steps of it, 2^-23 = 1.2e-7)
    for (g_hw, g_lstm), (w_hw, w_lstm) in zip(got, want):
        assert_close_to_scale(g_hw, w_hw, 2e-6, equal_nan=True, dim=-1)
        assert_close_to_scale(g_lstm, w_lstm, 2e-6, equal_nan=True, dim=-1)
    assert not bool(torch.isnan(got[0][0]).any()) and not bool(torch.isnan(got[0][1]).any())  # 1e6: saturated
    assert bool(torch.isnan(got[3][1]).any())  # NaN in: NaN out, as ATen


def test_the_scaled_tolerance_is_absolute_up_to_1_and_relative_above():
    want = torch.tensor([0.5, 1.0, 16442.0, float("nan"), float("inf")])
    assert_close_to_scale(want + torch.tensor([1.9e-6, -1.9e-6, 0.0078, 0, 0]), want, 2e-6, equal_nan=True)
    for bad in ([2.1e-6, 0, 0, 0, 0], [0, 0, 0.04, 0, 0]):  # 2.1e-6 at 0.5; 2.4e-6 relative at 16442
        with pytest.raises(AssertionError, match="1 of 5 values differ"):
            assert_close_to_scale(want + torch.tensor(bad), want, 2e-6, equal_nan=True)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_to_scale(want, want, 2e-6)  # NaN is not NaN unless equal_nan
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_to_scale(-want, want.abs(), 2e-6, equal_nan=True)  # -inf is not inf


@pytest.mark.parametrize("threads", [1, 3])
def test_fused_lstm_loop_with_other_thread_counts(kernels, threads):
    """The fused loop splits the units over torch's threads (one barrier per step): 1 thread, and more threads than
    this machine's cores, give the same values as the default."""
    torch.manual_seed(5)
    lstm = BiLSTM(LSTMConfig(dim=64, projection_dim=16, n_layers=2, cell_clip=1.0, proj_clip=1.0))
    x = torch.randn(2, 3, 6, 16) * 2
    lengths = torch.tensor([6, 4, 1])
    with torch.no_grad():
        want = lstm(x, lengths)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got = lstm(x, lengths)
        finally:
            torch.set_num_threads(before)
    for g, w in zip(got[0], want[0]):
        assert_close_to_scale(g, w, 2e-6)
    assert_close_to_scale(got[1][0], want[1][0], 2e-6)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc/self/task (Linux)")
@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 or os.environ.get("OMP_NUM_THREADS", "") == "1",
    reason="a new thread's OpenMP default is one thread here: nothing to tell apart",
)
def test_lstm_kernel_in_a_new_thread_keeps_torchs_thread_count(kernels):
    """torch.set_num_threads(1), then the kernel called from a thread that is not the main one (as the server's
    inference loops call it) starts no OpenMP team: such a thread's own omp_get_max_threads() is the process default
    (the core count), so the kernel asks torch, which every thread shares."""
    import threading

    torch.manual_seed(2)
    lstm = BiLSTM(LSTMConfig(dim=64, projection_dim=16, n_layers=1))
    w_in, w_hh = lstm._inference_weights(0)
    args = (torch.randn(2, 6, 16), [2, 2, 2], torch.zeros(2, 2, 64), torch.zeros(2, 2, 16), w_in[:, :16], w_in[:, 16])
    packed = native.pack_lstm(w_hh)
    counts = []

    def call():
        before = len(os.listdir("/proc/self/task"))
        with torch.no_grad():
            out = native.lstm_layer(kernels, *args, packed, lstm.weight_proj[0], 0.0, 0.0)
        counts.append((before, len(os.listdir("/proc/self/task")), out is not None))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        worker = threading.Thread(target=call)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(threads)
    assert counts == [(counts[0][0], counts[0][0], True)]  # no thread started (an OpenMP team of 2 would keep one)
