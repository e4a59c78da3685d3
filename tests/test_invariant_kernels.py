"""The batch-invariant kernels (elmokit/modules/invariant.py, native_kernels.cpp): each row's result is the same bits
whatever number of rows shares the call (1 … 70), their order and torch's thread count (1, 2, 3), and equals the ATen
path within float rounding. Skipped where the native kernels cannot be built (failed under
``ELMOKIT_REQUIRE_NATIVE=1``, as tests/test_native.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from conftest import shared_path
from elmokit.cli import main as cli_main
from elmokit.config import LSTMConfig
from elmokit.embedding.reader import open_embeddings
from elmokit.modules import invariant
from elmokit.modules.highway import Highway
from elmokit.modules.lstm import BiLSTM
from helpers import assert_close_to_scale
from test_batch_invariance import _long_sentences, _sentences


@contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_pack_linear_layout():
    """Block b holds columns 32b … 32b + 31 for every input, zero columns after N; the bias likewise."""
    w = torch.arange(3 * 40, dtype=torch.float32).view(3, 40)
    b = torch.arange(40, dtype=torch.float32) + 1000
    packed, bias = invariant.pack_linear(w, b)
    assert packed.shape == (2, 3, 32) and bias.shape == (2, 32)
    assert torch.equal(packed[0], w[:, :32]) and torch.equal(packed[1, :, :8], w[:, 32:])
    assert bool((packed[1, :, 8:] == 0).all()) and torch.equal(bias[1, :8], b[32:]) and float(bias[1, 8:].sum()) == 0


@pytest.mark.parametrize("k,n", [(300, 80), (112, 64), (2048, 32)])
def test_linear_rows_is_row_and_thread_invariant(kernels, k, n):
    """K above, below and at multiples of the kernel's 128-input chunks, N not a multiple of 32: every row count
    1 … 70 gives the 70-row call's rows bit for bit, so do rows in reverse order and 1, 2 or 3 threads; values equal
    x·W + b within float rounding."""
    torch.manual_seed(k)
    w, b, x = torch.randn(k, n) / k**0.5, torch.randn(n), torch.randn(70, k)
    packed = invariant.pack_linear(w, b)
    with threads(2):
        full = invariant.linear(kernels, x, packed, n)
    assert full.shape == (70, n)
    assert_close_to_scale(full, torch.addmm(b, x, w), 2e-6)
    for rows in range(1, 71):
        assert torch.equal(invariant.linear(kernels, x[:rows], packed, n), full[:rows]), rows
    assert torch.equal(invariant.linear(kernels, x.flip(0), packed, n), full.flip(0))
    for t in (1, 3):
        with threads(t):
            assert torch.equal(invariant.linear(kernels, x, packed, n), full), t


def test_highway_kernel_is_row_and_thread_invariant(kernels):
    """The highway layer for any rows: each row alone, in any count, on 1–3 threads gives the same bits; values as
    the GEMM path (the layer without the option) within float rounding."""
    torch.manual_seed(3)
    hw = Highway(64, 2)
    x = torch.randn(70, 64) * 2
    with torch.no_grad():
        want = hw(x)
        with invariant.batch_invariant(True):
            full = hw(x)
            assert_close_to_scale(full, want, 2e-6)
            for rows in range(1, 71):
                assert torch.equal(hw(x[:rows]), full[:rows]), rows
            for t in (1, 3):
                with threads(t):
                    assert torch.equal(hw(x), full), t


def _lstm_case(b: int, seed: int):
    torch.manual_seed(seed)
    lstm = BiLSTM(LSTMConfig(dim=64, projection_dim=32, n_layers=2, cell_clip=1.0, proj_clip=1.0))
    t = 9
    lengths = torch.sort(torch.randint(1, t + 1, (b,)), descending=True).values
    lengths[0] = t
    x = torch.randn(2, b, t, 32) * 2
    return lstm, x, lengths


def test_lstm_rows_alone_equal_them_in_a_batch_of_any_size(kernels):
    """70 rows of mixed lengths (rows ending at different steps: the step loop's last row group is short): every
    row run alone, and the first r rows for r = 1 … 70, give the full batch's outputs and final states bit for bit
    (both layers, both directions); the values equal the TorchScript loop's within float rounding."""
    lstm, x, lengths = _lstm_case(70, 0)
    with torch.no_grad():
        want, _ = lstm(x, lengths)
        with invariant.batch_invariant(True):
            full, (c, h) = lstm(x, lengths)
            for out, ref in zip(full, want):
                assert_close_to_scale(out, ref, 2e-6)
            for r in range(1, 71):
                part, (pc, ph) = lstm(x[:, :r], lengths[:r])
                for a, f in zip(part, full):
                    assert torch.equal(a[:, :, : int(lengths[0])], f[:, :r, : int(lengths[0])]), r
                assert torch.equal(pc, c[:, :, :r]) and torch.equal(ph, h[:, :, :r]), r
            for i in (1, 33, 69):
                alone, _ = lstm(x[:, i : i + 1], lengths[i : i + 1])
                n = int(lengths[i])
                for a, f in zip(alone, full):
                    assert torch.equal(a[:, 0, :n], f[:, i, :n]), i


@pytest.mark.parametrize("path", ["invariant", "default"])
def test_lstm_step_loop_is_thread_count_invariant(kernels, path):
    """The fused step loop's projection partial sums are kept per fixed slice of units, not per thread: 1, 2 and 3
    threads give the same bits, on the batch-invariant path (any rows) and on the default one (few rows)."""
    lstm, x, lengths = _lstm_case(6, 1)
    results = []
    with torch.no_grad(), invariant.batch_invariant(path == "invariant"):
        for t in (1, 2, 3):
            with threads(t):
                results.append(lstm(x, lengths))
    for outs, (c, h) in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs, results[0][0]))
        assert torch.equal(c, results[0][1][0]) and torch.equal(h, results[0][1][1])


def test_the_option_is_off_by_default_and_scoped():
    assert not invariant.default() or os.environ.get("ELMOKIT_BATCH_INVARIANT") == "1"
    with invariant.batch_invariant(True):
        assert invariant.enabled()
        with invariant.batch_invariant(False):
            assert not invariant.enabled()
        assert invariant.enabled()
    assert invariant.enabled() == invariant.default()


def test_highway_width_not_a_multiple_of_16_is_row_invariant(kernels):
    """F = 124 (the AllenNLP fixture's filters) runs zero-padded to 128: rows alone equal rows in a batch, and the
    values equal the GEMM path's."""
    torch.manual_seed(4)
    hw = Highway(124, 2)
    x = torch.randn(30, 124)
    with torch.no_grad():
        want = hw(x)
        with invariant.batch_invariant(True):
            full = hw(x)
            assert full.shape == (30, 124)
            assert_close_to_scale(full, want, 2e-6)
            assert all(torch.equal(hw(x[i : i + 1])[0], full[i]) for i in range(30))


def test_embed_batch_invariant_is_the_same_bits_at_any_batch_size_and_workers(kernels, tmp_path):
    """``elmokit embed --batch-invariant`` of one file (real sentences of 1 to 200 tokens, the AllenNLP fixture's
    model) at --batch-size 1, 7 and 64 and with --workers 2: every dataset the same bits (without the option the
    batch sizes differ in the last bits)."""
    model = shared_path("fixtures", "allennlp-elmo")
    lines = [" ".join(s) for s in _sentences() + _long_sentences()]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def embed(name: str, *flags: str) -> dict:
        out = tmp_path / f"{name}.h5"
        assert cli_main(["embed", str(model), str(src), str(out), "--no-progress", *flags]) == 0
        with open_embeddings(out) as reader:
            return {k: reader[k] for k in reader}

    want = embed("b1", "--batch-invariant", "--batch-size", "1")
    assert len(want) >= len(lines)
    for name, flags in (("b7", ["--batch-size", "7"]), ("b64", []), ("w2", ["--workers", "2", "--part-size", "5"])):
        got = embed(name, "--batch-invariant", *flags)
        assert sorted(got) == sorted(want)
        assert all(np.array_equal(got[k], want[k]) for k in want), name
    default = embed("d64", "--batch-size", "64")
    assert any(not np.array_equal(default[k], want[k]) for k in want)  # the option is what makes them equal


def test_serve_settings_and_cli_flag_reach_the_embedder():
    """``elmokit serve --batch-invariant`` → ServeSettings(batch_invariant=True) → the server's Embedder (which every
    dynamic batch goes through), also in worker processes (the settings travel as JSON)."""
    from elmokit.cli import serve as serve_cli
    from elmokit.serving.app import load_embedder
    from elmokit.serving.settings import ServeSettings

    model = shared_path("fixtures", "allennlp-elmo")
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers(), [])
    args = parser.parse_args(["serve", str(model), "--batch-invariant"])
    settings = serve_cli._settings(args)
    assert settings.batch_invariant is True
    assert ServeSettings(**json.loads(json.dumps(dataclasses.asdict(settings)))).batch_invariant is True
    assert load_embedder(ServeSettings(model=str(model), batch_invariant=True)).batch_invariant is True
    assert load_embedder(ServeSettings(model=str(model))).batch_invariant is False
