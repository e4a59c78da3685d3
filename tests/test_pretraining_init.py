"""Continued pretraining (--init-from): the released biLM weights start the run, a softmax over the user's vocabulary is
created (or kept), --freeze-bilm-steps leaves the biLM alone, the held-out perplexity falls, and models that cannot fit
are refused clearly."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest
import torch

from conftest import shared_path
from elmokit import load_original
from elmokit.cli import main as cli_main
from elmokit.config import ElmoConfig
from elmokit.errors import MissingFileError, UsageError, WeightsError
from elmokit.pretraining.init_from import load_init_model
from elmokit.pretraining.trainer import TrainConfig, Trainer, build_trainer, load_lm
from helpers import TINY_TRAIN_OPTIONS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    return shared_path("fixtures", "allennlp-elmo")


@pytest.fixture(scope="module")
def ptb(tmp_path_factory) -> tuple[Path, Path]:
    """A small corpus (the first 160 lines of PTB valid) and held-out text (the first 40 of PTB test)."""
    d = tmp_path_factory.mktemp("ptb")
    src = shared_path("data", "ptb-mikolov")
    for name, source, n in (("train.txt", "ptb.valid.txt", 160), ("held.txt", "ptb.test.txt", 40)):
        with open(src / source, encoding="utf-8") as fh:
            (d / name).write_text("".join(islice(fh, n)), encoding="utf-8")
    return d / "train.txt", d / "held.txt"


def _cfg(ptb, out: Path, init_from, **kw) -> TrainConfig:
    train, held = ptb
    base = dict(
        train_files=[str(train)],
        out_dir=str(out),
        init_from=str(init_from),
        batch_size=16,
        n_epochs=50,
        max_steps=24,
        n_negative_samples=0,
        dropout=0.1,
        seed=0,
        optimizer="adam",
        lr=3e-3,
        checkpoint_every=100,
        log_every=4,
        progress=False,
        valid_files=[str(held)],
        valid_every=8,
        min_count=2,
    )
    base.update(kw)
    return TrainConfig(**base)


def _valid(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "valid"]


def test_continued_pretraining_from_the_released_fixture(ptb, fixture_dir, tmp_path):
    released = load_original(fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5").state_dict()
    trainer = build_trainer(_cfg(ptb, tmp_path, fixture_dir, freeze_bilm_steps=6, max_steps=6))
    # the biLM starts as the released weights, exactly; the architecture is the init model's
    assert all(torch.equal(trainer.lm.bilm.state_dict()[k], v) for k, v in released.items())
    assert (
        trainer.config.model.to_options()["lstm"]
        == ElmoConfig.from_json_file(fixture_dir / "options.json").to_options()["lstm"]
    )
    assert trainer.init_softmax_kept is False and len(trainer.vocab) < 1000  # a new softmax over the PTB words
    softmax_before = trainer.lm.softmax.weight.detach().clone()
    trainer.train()
    # frozen for the first 6 steps: only the softmax learned
    assert all(torch.equal(trainer.lm.bilm.state_dict()[k], v) for k, v in released.items())
    assert not torch.equal(trainer.lm.softmax.weight.detach(), softmax_before)
    saved = json.loads((tmp_path / "train_config.json").read_text())
    assert saved["init_from"] == str(fixture_dir) and saved["model"]["lstm"]["dim"] == 64
    # then the whole model trains on (the run resumes from its checkpoint, not from the init weights)
    summary = Trainer(_cfg(ptb, tmp_path, fixture_dir, freeze_bilm_steps=6)).train(resume=True)
    lm = load_lm(tmp_path / "model")
    assert any(not torch.equal(lm.bilm.state_dict()[k], v) for k, v in released.items())
    valid = _valid(tmp_path)
    assert [r["step"] for r in valid] == [0, 6, 8, 16, 24]
    ppl = [r["valid_ppl"] for r in valid]
    assert ppl[-1] < ppl[1] < ppl[0] and all(b < a for a, b in zip(ppl[1:], ppl[2:]))  # held-out perplexity falls
    assert summary["best"]["step"] == 24


def test_native_model_with_the_same_vocabulary_keeps_its_softmax(ptb, fixture_dir, tmp_path):
    Trainer(_cfg(ptb, tmp_path / "first", fixture_dir, max_steps=2, valid_files=None, valid_every=None)).train()
    first = load_lm(tmp_path / "first" / "model")
    same = build_trainer(_cfg(ptb, tmp_path / "same", tmp_path / "first" / "model", valid_files=None, valid_every=None))
    assert same.init_softmax_kept and same.vocab == first.vocab
    assert torch.equal(same.lm.softmax.weight.detach(), first.softmax.weight)
    assert all(torch.equal(same.lm.bilm.state_dict()[k], v) for k, v in first.bilm.state_dict().items())
    # another vocabulary (min count 1: more words) gets a new softmax; the biLM is still the init model's
    other = build_trainer(
        _cfg(ptb, tmp_path / "other", tmp_path / "first" / "model", valid_files=None, valid_every=None, min_count=1)
    )
    assert not other.init_softmax_kept and len(other.vocab) > len(first.vocab)
    assert all(torch.equal(other.lm.bilm.state_dict()[k], v) for k, v in first.bilm.state_dict().items())


def test_models_that_cannot_fit_are_refused(ptb, fixture_dir, tmp_path, capsys):
    with pytest.raises(UsageError, match=r"--char-vocab .* reads UTF-8 bytes .* drop --char-vocab"):
        build_trainer(_cfg(ptb, tmp_path, fixture_dir, char_vocab=True))
    with pytest.raises(UsageError) as e:
        build_trainer(_cfg(ptb, tmp_path, fixture_dir, model=TINY_TRAIN_OPTIONS))
    assert "conflict with --init-from" in str(e.value) and "LSTM 16/8" in str(e.value) and "LSTM 64/16" in str(e.value)
    # the same architecture repeated is fine (262 and 261 character rows are the same rows)
    same = json.loads((fixture_dir / "options.json").read_text())
    same["char_cnn"]["n_characters"] = 261
    build_trainer(_cfg(ptb, tmp_path, fixture_dir, model=same, max_steps=1))
    with pytest.raises(MissingFileError):
        build_trainer(_cfg(ptb, tmp_path, tmp_path / "no-such-model"))
    # a native folder whose softmax does not fit its vocab.txt (edited after training)
    Trainer(_cfg(ptb, tmp_path / "run", fixture_dir, max_steps=1, valid_files=None, valid_every=None)).train()
    with open(tmp_path / "run" / "model" / "vocab.txt", "a", encoding="utf-8") as fh:
        fh.write("zebra\n")
    with pytest.raises(WeightsError, match=r"softmax.weight has shape \(\d+, 16\) but vocab.txt"):
        load_init_model(str(tmp_path / "run" / "model"))
    # on the command line: conflicting model options are named, a folder that is no model too
    train, held = ptb
    assert (
        cli_main(
            [
                "train",
                str(train),
                "--out-dir",
                str(tmp_path / "c"),
                "--init-from",
                str(fixture_dir),
                "--preset",
                "small",
            ]
        )
        == 2
    )
    assert "--preset/--options" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert (
        cli_main(["train", str(train), "--out-dir", str(tmp_path / "c"), "--init-from", str(tmp_path / "empty")]) == 2
    )
    assert "is a folder but not a model" in capsys.readouterr().err


def test_a_character_vocabulary_model_keeps_its_characters(tmp_path):
    (tmp_path / "a.txt").write_text("苹果 公司 发布 新 手机 。\n我 吃 了 一个 苹果 。\n" * 4, encoding="utf-8")
    (tmp_path / "b.txt").write_text("我 买 了 新 手机 。\n公司 发布 了 。\n" * 4, encoding="utf-8")
    base = dict(model=TINY_TRAIN_OPTIONS, batch_size=4, max_steps=2, n_negative_samples=0, progress=False)
    Trainer(TrainConfig([str(tmp_path / "a.txt")], str(tmp_path / "a"), char_vocab=True, **base)).train()
    init = load_lm(tmp_path / "a" / "model")
    base.pop("model")
    cont = build_trainer(
        TrainConfig([str(tmp_path / "b.txt")], str(tmp_path / "b"), init_from=str(tmp_path / "a" / "model"), **base)
    )
    assert cont.config.char_vocab is True  # taken from the init model
    assert cont.char_vocab.characters == init.char_vocab.characters  # "买" has no id of its own: unknown character
    assert all(torch.equal(cont.lm.bilm.state_dict()[k], v) for k, v in init.bilm.state_dict().items())
    assert cont.train()["steps"] == 2


def test_cli_init_from(ptb, fixture_dir, tmp_path, capsys):
    train, held = ptb
    out = tmp_path / "run"
    assert (
        cli_main(
            [
                "train",
                str(train),
                "--out-dir",
                str(out),
                "--init-from",
                str(fixture_dir),
                "--batch-size",
                "16",
                "--negatives",
                "0",
                "--max-steps",
                "3",
                "--freeze-bilm-steps",
                "2",
                "--valid-files",
                str(held),
                "--no-progress",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 3 and summary["valid"]["step"] == 3
    # resume repeats the run's own --init-from; another one is refused
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--init-from", "small"]) == 2
    assert "--init-from" in capsys.readouterr().err
