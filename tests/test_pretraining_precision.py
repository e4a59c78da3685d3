"""Mixed precision (``TrainConfig.precision="bf16"``, ``elmokit train --precision bf16``): which values stay float32,
how far bfloat16 products move the LSTM from float32, and that a bf16 run is deterministic and resumes bit-exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elmokit.cli import main as cli_main
from elmokit.config import LSTMConfig
from elmokit.errors import ConfigError, UsageError
from elmokit.modules.lstm import BiLSTM
from elmokit.modules.precision import autocast, check_precision, low_precision_dtype
from elmokit.pretraining.trainer import TrainConfig, Trainer
from helpers import TINY_TRAIN_OPTIONS, tiny_window_config, write_tiny_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


def _lstm(seed: int = 0) -> BiLSTM:
    torch.manual_seed(seed)
    cfg = LSTMConfig(n_layers=2, dim=48, projection_dim=16, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True)
    m = BiLSTM(cfg)
    with torch.no_grad():  # weights large enough that both clips fire
        for p in m.parameters():
            p.mul_(6.0)
    return m


def _inputs(b: int = 5, t: int = 9, p: int = 16):
    torch.manual_seed(1)
    lengths = torch.tensor([9, 9, 6, 3, 0])[:b]
    return torch.randn(2, b, t, p), lengths


def test_precision_names_are_checked():
    assert check_precision("bf16") == "bf16"
    with pytest.raises(ConfigError, match=r"precision must be 'fp32' or 'bf16', got 'fp16'"):
        check_precision("fp16")
    with pytest.raises(ConfigError, match=r"TrainConfig.precision must be 'fp32' or 'bf16', got 'half'"):
        TrainConfig(train_files=["x"], out_dir="o", model=TINY_TRAIN_OPTIONS, precision="half").validate()
    assert low_precision_dtype("cpu") is None
    with autocast("bf16", "cpu"):
        assert low_precision_dtype("cpu") is torch.bfloat16
    with autocast("fp32", "cpu"):
        assert low_precision_dtype("cpu") is None


@pytest.mark.parametrize("grad", [False, True])
def test_bf16_lstm_keeps_state_float32_and_stays_near_float32(grad):
    m = _lstm()
    x, lengths = _inputs()
    with torch.set_grad_enabled(grad):
        ref, (c32, h32) = m(x, lengths)
        with autocast("bf16", "cpu"):
            out, (c16, h16) = m(x, lengths)
    out, c16, h16, c32 = [o.detach() for o in out], c16.detach(), h16.detach(), c32.detach()
    ref = [r.detach() for r in ref]
    # state, outputs: float32 whatever the products ran in
    assert all(o.dtype == torch.float32 for o in out) and c16.dtype == h16.dtype == torch.float32
    # the clips hold exactly (cell clip on c, projection clip on h) and do fire here
    assert float(c16.abs().max()) <= 3.0 and float(out[0].abs().max()) <= 3.0
    assert float(c32.abs().max()) == pytest.approx(3.0)
    # padding stays exactly zero; the empty row keeps its (zero) start state
    assert float(out[-1][:, 3, 3:].abs().max()) == 0.0 and float(out[-1][:, 4].abs().max()) == 0.0
    assert float(h16[:, :, 4].abs().max()) == 0.0
    # bfloat16 rounds each product's inputs to 2^-9 relative: outputs move by ~1e-2 of their scale, not more
    for a, b in zip(out, ref):
        scale = float(b.abs().max())
        err = float((a - b).abs().max())
        assert 0 < err <= 0.05 * scale, (err, scale)


def test_bf16_lstm_gradients_reach_float32_parameters():
    m = _lstm()
    x, lengths = _inputs()
    with autocast("bf16", "cpu"):
        out, _ = m(x, lengths)
    out[-1].sum().backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    assert all(g is not None and g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads.values())
    m32 = _lstm()
    out32, _ = m32(x, lengths)
    out32[-1].sum().backward()
    for n, p in m32.named_parameters():  # same direction as the float32 gradient
        cos = torch.nn.functional.cosine_similarity(grads[n].flatten(), p.grad.flatten(), dim=0)
        assert float(cos) > 0.98, (n, float(cos))


def test_a_start_state_passes_through_unrounded_for_rows_without_steps():
    m = _lstm()
    x, _ = _inputs()
    lengths = torch.tensor([4, 2, 0, 0, 0])
    c0 = torch.randn(2, 2, 5, 48) * 0.1
    h0 = torch.randn(2, 2, 5, 16) * 0.1 + 1e-3 * torch.rand(2, 2, 5, 16)  # not bfloat16 numbers
    with autocast("bf16", "cpu"):
        _, (c, h) = m(x, lengths, (c0, h0))
    assert torch.equal(c[:, :, 2:], c0[:, :, 2:]) and torch.equal(h[:, :, 2:], h0[:, :, 2:])


# ---------------------------------------------------------------------------------------------- training runs
@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _cfg(corpus: Path, out: Path, **kw) -> TrainConfig:
    return tiny_window_config(corpus, out, **{"max_steps": 8, "precision": "bf16", **kw})


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def bf16_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bf16")
    Trainer(_cfg(corpus, out)).train()
    return out


def test_bf16_run_resumes_bit_exactly_and_repeats(corpus, bf16_run, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=4)).train()
    Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    assert _losses(tmp_path) == _losses(bf16_run)
    got = load_file(str(tmp_path / "model" / "model.safetensors"))
    want = load_file(str(bf16_run / "model" / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(t.dtype == torch.float32 for t in got.values())  # master weights stay float32
    assert json.loads((tmp_path / "train_config.json").read_text())["precision"] == "bf16"


def test_bf16_losses_follow_fp32(corpus, bf16_run, tmp_path):
    Trainer(_cfg(corpus, tmp_path, precision="fp32")).train()
    fp32, bf16 = _losses(tmp_path), _losses(bf16_run)
    assert fp32.keys() == bf16.keys()
    assert fp32 != bf16  # the products did run in bfloat16
    for step in fp32:  # a few hundredths of a nat at a loss near 3 (ln of a tiny vocabulary)
        assert abs(fp32[step] - bf16[step]) <= 0.02 * fp32[step], (step, fp32[step], bf16[step])


def test_precision_is_fixed_for_a_run_and_given_on_the_command_line(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\na boat on the river .\n" * 4)
    out = tmp_path / "run"
    args = ["train", str(corpus), "--out-dir", str(out), "--preset", "tiny", "--batch-size", "4", "--negatives", "0"]
    assert cli_main([*args, "--max-steps", "2", "--no-progress", "--precision", "bf16"]) == 0
    capsys.readouterr()
    assert json.loads((out / "train_config.json").read_text())["precision"] == "bf16"
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--precision", "fp32", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--precision" in err and "differs from the run being resumed" in err
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "3", "--no-progress"]) == 0
    with pytest.raises(UsageError, match="precision"):
        TrainConfig.from_json_file(out / "train_config.json").resumed({"precision": "fp32"})
