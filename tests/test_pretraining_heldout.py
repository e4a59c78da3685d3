"""The held-out curve: full-softmax perplexity of --valid-files at the asked interval (steps or minutes), logged as its
own records in metrics.jsonl, drawn beside the training curve, the best model kept in best/, and resume still exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elmokit.cli import main as cli_main
from elmokit.data.corpus import TextCorpus
from elmokit.pretraining import trainer as trainer_module
from elmokit.pretraining.perplexity import evaluate_perplexity
from elmokit.pretraining.run_folder import plot_learning_curve
from elmokit.pretraining.trainer import TrainConfig, Trainer, load_lm
from helpers import TINY_TRAIN_OPTIONS, TINY_WORDS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("heldout")
    train = [" ".join(TINY_WORDS[(7 * i + 3 * j) % len(TINY_WORDS)] for j in range(3 + i % 5)) for i in range(40)]
    held = [" ".join(TINY_WORDS[(5 * i + 2 * j + 1) % len(TINY_WORDS)] for j in range(2 + i % 4)) for i in range(9)]
    (d / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (d / "held.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    return d / "train.txt", d / "held.txt"


def _cfg(texts, out: Path, **kw) -> TrainConfig:
    train, held = texts
    base = dict(
        train_files=[str(train)],
        out_dir=str(out),
        model=TINY_TRAIN_OPTIONS,
        batch_size=4,
        n_epochs=50,
        max_steps=8,
        n_negative_samples=6,
        dropout=0.1,
        clip_norm=1.0,
        seed=0,
        checkpoint_every=3,
        keep_checkpoints=10,
        log_every=1,
        progress=False,
        valid_files=[str(held)],
        valid_every=3,
        optimizer="adam",
        lr=0.01,
    )
    base.update(kw)
    return TrainConfig(**base)


def _records(out: Path, kind: str) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_heldout_perplexity_at_the_interval_is_the_checkpointed_models(texts, tmp_path):
    summary = Trainer(_cfg(texts, tmp_path)).train()
    valid = _records(tmp_path, "valid")
    assert [r["step"] for r in valid] == [0, 3, 6, 8]  # step 0 (the start), every 3 steps, and the end
    assert [r["step"] for r in _records(tmp_path, "train")] == list(range(1, 9))  # its own records, beside these
    held = list(TextCorpus(texts[1]).sentences(0))
    lm = load_lm(tmp_path / "model")
    for r in valid[1:]:
        # each figure is the full-softmax perplexity of the model of that step, as `elmokit perplexity` gives it
        tensors = load_file(str(tmp_path / f"ckpt-{r['step']}.safetensors"))
        lm.load_state_dict(tensors)
        expected = evaluate_perplexity(lm, held)
        assert r["valid_ppl"] == pytest.approx(expected["average"], rel=1e-5)
        assert r["valid_ppl_fwd"] == pytest.approx(expected["forward"], rel=1e-5)
        assert r["valid_ppl_bwd"] == pytest.approx(expected["backward"], rel=1e-5)
        assert r["valid_tokens"] == expected["tokens"] == sum(len(s) + 1 for s in held)
    assert valid[-1]["valid_ppl"] < valid[0]["valid_ppl"]  # it learns
    best = min(valid, key=lambda r: r["valid_ppl"])
    assert summary["best"]["step"] == best["step"] and summary["valid"]["step"] == 8
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == best["step"]


def test_the_kept_best_is_the_lowest_not_the_last(texts, tmp_path, monkeypatch):
    figures = iter([90.0, 40.0, 55.0, 60.0])  # steps 0, 3, 6, 8: the best is step 3

    def fake(self):
        v = next(figures)
        return {"forward": v * 1.1, "backward": v / 1.1, "average": v, "tokens": 10, "sentences": 2}

    monkeypatch.setattr(Trainer, "evaluate_heldout", fake)
    Trainer(_cfg(texts, tmp_path)).train()
    valid = _records(tmp_path, "valid")
    assert [(r["step"], r["valid_ppl"], r["best"]) for r in valid] == [
        (0, 90.0, True),
        (3, 40.0, True),
        (6, 55.0, False),
        (8, 60.0, False),
    ]
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert record["step"] == 3 and record["valid_ppl"] == 40.0
    # best/ holds the model of step 3 (its checkpoint's tensors), a complete model folder
    best = load_file(str(tmp_path / "best" / "model.safetensors"))
    ckpt3 = {k.removeprefix("bilm."): v for k, v in load_file(str(tmp_path / "ckpt-3.safetensors")).items()}
    assert best.keys() == ckpt3.keys() and all(torch.equal(best[k], ckpt3[k]) for k in best)
    assert not torch.equal(
        best["softmax.weight"], load_file(str(tmp_path / "model" / "model.safetensors"))["softmax.weight"]
    )
    assert load_lm(tmp_path / "best").vocab == load_lm(tmp_path / "model").vocab
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".best")]  # no temporary folder left


def test_heldout_every_few_minutes(texts, tmp_path, monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(trainer_module, "_clock", lambda: clock["t"])
    real = Trainer.train_step

    def step_of_40_seconds(self, batch):
        clock["t"] += 40.0
        return real(self, batch)

    monkeypatch.setattr(Trainer, "train_step", step_of_40_seconds)
    Trainer(_cfg(texts, tmp_path, valid_every=None, valid_minutes=1.0, max_steps=7)).train()
    # a minute passed after steps 2 (80 s), 4, 6; and the start and the end
    assert [r["step"] for r in _records(tmp_path, "valid")] == [0, 2, 4, 6, 7]


def test_resume_with_heldout_text_is_still_exact(texts, tmp_path):
    Trainer(_cfg(texts, tmp_path / "full")).train()
    Trainer(_cfg(texts, tmp_path / "cut", max_steps=4)).train()
    Trainer(_cfg(texts, tmp_path / "cut")).train(resume=True)
    full, cut = (_records(tmp_path / x, "train") for x in ("full", "cut"))
    assert full == [{**r, "tokens_per_s": f["tokens_per_s"]} for r, f in zip(cut, full)]
    strip = ("step", "valid_ppl_fwd", "valid_ppl_bwd", "valid_ppl", "best")
    got = [{k: r[k] for k in strip} for r in _records(tmp_path / "cut", "valid")]
    want = [{k: r[k] for k in strip} for r in _records(tmp_path / "full", "valid")]
    # the cut run also evaluated at its end, step 4; otherwise both evaluate at the same steps, to the same figures
    assert [r["step"] for r in got] == [0, 3, 4, 6, 8] and [r for r in got if r["step"] != 4] == want
    a, b = (load_file(str(tmp_path / x / "model" / "model.safetensors")) for x in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (
        json.loads((tmp_path / "full" / "best" / "best.json").read_text())["step"]
        == json.loads((tmp_path / "cut" / "best" / "best.json").read_text())["step"]
    )


def test_learning_curve_draws_both_curves(texts, tmp_path, monkeypatch):
    Trainer(_cfg(texts, tmp_path, max_steps=6)).train()
    import matplotlib.axes

    labels = []
    real = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    png = plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("forward", "backward", "average"):
        assert f"training, {name}" in labels and f"held-out, {name}" in labels
    assert any(label and label.startswith("best held-out") for label in labels)


def test_cli_valid_flags_and_resume(texts, tmp_path, capsys):
    train, held = texts
    out = tmp_path / "run"
    args = [
        "train",
        str(train),
        "--out-dir",
        str(out),
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--negatives",
        "0",
        "--no-progress",
        "--valid-files",
        str(held),
        "--valid-every",
        "2",
        "--max-steps",
        "4",
    ]
    assert cli_main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["valid"]["step"] == 4 and summary["best"]["model_dir"] == str(out / "best")
    assert [r["step"] for r in _records(out, "valid")] == [0, 2, 4]
    # how often to evaluate may change on resume, the held-out text too
    assert (
        cli_main(
            ["train", "--out-dir", str(out), "--resume", "--max-steps", "6", "--valid-every", "1", "--no-progress"]
        )
        == 0
    )
    assert [r["step"] for r in _records(out, "valid")] == [0, 2, 4, 5, 6]
    capsys.readouterr()
    assert (
        cli_main(["train", str(train), "--out-dir", str(tmp_path / "x"), "--preset", "tiny", "--valid-every", "2"]) == 2
    )
    assert "--valid-every" in capsys.readouterr().err


def test_resuming_a_finished_run_adds_no_heldout_record(texts, tmp_path):
    """A finished run resumed with the same --max-steps trains nothing and must not log its last evaluation again."""
    Trainer(_cfg(texts, tmp_path)).train()
    before = (tmp_path / "metrics.jsonl").read_text()
    for _ in range(2):
        summary = Trainer(_cfg(texts, tmp_path)).train(resume=True)
        assert summary["tokens"] == 0
    assert (tmp_path / "metrics.jsonl").read_text() == before
    # other held-out text at the same step is evaluated (it is a new measurement)
    other = tmp_path.parent / "other_held.txt"
    other.write_text(texts[1].read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    Trainer(_cfg(texts, tmp_path, valid_files=[str(other)])).train(resume=True)
    assert (
        len(_records(tmp_path, "valid"))
        == len([json.loads(x) for x in before.splitlines() if json.loads(x)["kind"] == "valid"]) + 1
    )


def test_freeze_without_init_from_and_a_folder_as_valid_files_are_refused(texts, tmp_path):
    from elmokit.errors import ConfigError, MissingFileError

    with pytest.raises(ConfigError, match=r"--freeze-bilm-steps\) needs a model to start from \(--init-from\)"):
        _cfg(texts, tmp_path, freeze_bilm_steps=5).validate()
    with pytest.raises(MissingFileError, match=r"is a folder: give its files"):
        Trainer(_cfg(texts, tmp_path / "run", valid_files=[str(texts[1].parent)])).train()
