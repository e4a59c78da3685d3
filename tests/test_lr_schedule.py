"""The learning-rate schedule (``TrainConfig.lr_warmup_steps`` / ``lr_schedule`` / ``lr_decay_steps`` /
``lr_final``): hand-computed rates, what the optimiser receives, the rates logged, and an exact resume."""

from __future__ import annotations

import json
import math

import pytest

from elmokit.errors import ConfigError
from elmokit.pretraining.config import learning_rate_at
from elmokit.pretraining.trainer import Trainer
from test_pretraining_trainer import _losses, _tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(tmp_path, **kw):
    return _tiny_config(tmp_path, optimizer="adam", lr=0.01, **kw).validate()


def test_rates_by_hand(tmp_path):
    c = _config(tmp_path, lr_warmup_steps=4, lr_schedule="linear", lr_decay_steps=14, lr_final=0.2)
    # warm-up: 0.01 * s / 4; then from 0.01 down to 0.002 over steps 5..14 (p = (s - 4) / 10); floor afterwards
    expected = {1: 0.0025, 2: 0.005, 4: 0.01, 5: 0.01 * (1 - 0.8 * 0.1), 9: 0.01 * (1 - 0.8 * 0.5), 14: 0.002}
    expected[40] = 0.002
    for step, rate in expected.items():
        assert learning_rate_at(c, step) == pytest.approx(rate, rel=1e-12), step
    c = _config(tmp_path, lr_schedule="cosine", lr_decay_steps=10, lr_final=0.0)
    assert learning_rate_at(c, 5) == pytest.approx(0.01 * 0.5 * (1 + math.cos(math.pi * 0.5)), rel=1e-12)
    assert learning_rate_at(c, 10) == 0.0 and learning_rate_at(c, 1) == pytest.approx(
        0.01 * 0.5 * (1 + math.cos(0.1 * math.pi))
    )
    assert all(learning_rate_at(_config(tmp_path), s) == 0.01 for s in (1, 7, 1000))  # the default: constant


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"lr_schedule": "cosine"}, r"needs --lr-decay-steps M .* > --lr-warmup-steps \(0\): none was given"),
        ({"lr_schedule": "linear", "lr_warmup_steps": 10, "lr_decay_steps": 10}, r"> --lr-warmup-steps \(10\): got 10"),
        ({"lr_decay_steps": 8}, "need --lr-schedule linear or cosine"),
        ({"lr_final": 0.3}, "need --lr-schedule linear or cosine"),
        ({"lr_warmup_steps": -1}, "lr_warmup_steps"),
        ({"lr_final": 1.5}, "lr_final must be a fraction"),
        ({"lr_schedule": "step"}, "lr_schedule must be"),
    ],
)
def test_bad_schedules_are_named(tmp_path, kw, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, **kw)


def test_scheduled_run_logs_its_rates_trains_differently_and_resumes_exactly(tmp_path):
    kw = dict(
        max_steps=16, log_every=1, batching="sentences", lr_warmup_steps=3, lr_schedule="cosine", lr_decay_steps=12
    )
    Trainer(_config(tmp_path / "full", **kw)).train()
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["lr"] for r in rows if r.get("kind") == "train"}
    reference = _config(tmp_path, **kw)
    assert rates == {s: learning_rate_at(reference, s) for s in range(1, 17)}
    Trainer(_config(tmp_path / "cut", **{**kw, "max_steps": 7})).train()
    Trainer(_config(tmp_path / "cut", **kw)).train(resume=True)
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")
    # the optimiser receives the scheduled rate: a constant-rate run of the same seed logs other losses from step 2
    Trainer(_config(tmp_path / "constant", max_steps=4, log_every=1, batching="sentences")).train()
    constant, scheduled = _losses(tmp_path / "constant"), _losses(tmp_path / "full")
    assert constant[1] == scheduled[1] and constant[2] != scheduled[2]


def test_cli_schedule_flags_are_saved_checked_and_fixed_on_resume(tmp_path, capsys):
    from elmokit.cli import main as cli_main
    from test_cli import _err, _tiny_train_args

    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank .\nthe money bank .\na boat on the river .\n" * 4)
    out = tmp_path / "run"
    schedule = ["--optimizer", "adam", "--lr", "0.01", "--lr-warmup-steps", "2", "--lr-schedule", "linear"]
    # a decay needs its end step: one line naming both options
    assert cli_main(_tiny_train_args(corpus, out, *schedule, "--max-steps", "4")) == 2
    assert "--lr-decay-steps" in _err(capsys)
    assert cli_main(_tiny_train_args(corpus, out, "--lr-final", "1.5")) == 2
    assert "--lr-final" in _err(capsys)
    schedule += ["--lr-decay-steps", "6", "--lr-final", "0.5"]
    assert cli_main(_tiny_train_args(corpus, out, *schedule, "--max-steps", "4")) == 0
    capsys.readouterr()
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["lr_warmup_steps"], saved["lr_schedule"], saved["lr_decay_steps"], saved["lr_final"]) == (
        2,
        "linear",
        6,
        0.5,
    )
    # the schedule fixes what the run computes: changing it on resume is refused, naming the option
    assert cli_main(_tiny_train_args(corpus, out, *schedule[:-4], "--lr-decay-steps", "9", "--resume")) == 2
    assert "--lr-decay-steps" in _err(capsys)
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "8"]) == 0
    capsys.readouterr()
    rates = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    # warm-up 0.005, 0.01; then p = (step - 2) / 4: 0.01 · (1 - 0.5 p) down to 0.005 at step 6, where it stays
    assert rates == pytest.approx([0.005, 0.01, 0.00875, 0.0075, 0.00625, 0.005, 0.005, 0.005], rel=1e-12)
