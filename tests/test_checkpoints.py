"""Training runs lose nothing: a folder holding a run is not clobbered, the last checkpoints are kept and verified, a
damaged one is skipped, Ctrl-C leaves a checkpoint at the interrupt, and a changed vocabulary or model is named."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from elmokit import interrupts
from elmokit.errors import CheckpointError, ConfigError, UsageError
from elmokit.pretraining import checkpoint as ckpt
from elmokit.pretraining import trainer as trainer_module
from elmokit.pretraining.hooks import TrainHooks
from elmokit.pretraining.trainer import TrainConfig, Trainer, latest_checkpoint_step
from helpers import TINY_TRAIN_OPTIONS, TINY_WORDS, tiny_window_config, write_tiny_corpus

# a small character model (the original tests' variant, 1 highway layer, 10 characters a token): ~5 ms a step
TINY, WORDS = TINY_TRAIN_OPTIONS, TINY_WORDS


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _forget_signals():
    yield
    interrupts.clear()  # a test that sent itself SIGINT must not leave it pending for the next one


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))


def _cfg(corpus: Path, out: Path, **kw) -> TrainConfig:
    return tiny_window_config(corpus, out, **kw)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _final_tensors(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "model.safetensors"))


def _assert_same_run(out: Path, reference: Path) -> None:
    assert _losses(out) == _losses(reference)
    got, want = _final_tensors(out), _final_tensors(reference)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def _manifest(out: Path) -> dict:
    return json.loads((out / "checkpoint.json").read_text())


def _ckpt_files(out: Path) -> set[str]:
    return {p.name for p in out.glob("ckpt-*")}


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """A straight 12-step run (checkpoints at 4, 8, 12)."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(_cfg(corpus, out)).train()
    return out


# ---------------------------------------------------------------------------------------------- the output folder
def test_new_run_refuses_a_folder_holding_a_run(corpus, reference, tmp_path):
    # before: a plain train() into a finished run's folder deleted its checkpoint.json and metrics and started over
    before = {p.name: p.read_bytes() for p in reference.iterdir() if p.is_file()}
    with pytest.raises(UsageError) as e:
        Trainer(_cfg(corpus, reference)).train()
    msg = str(e.value)
    assert str(reference) in msg and "checkpoint.json" in msg and "latest checkpoint: step 12" in msg
    assert "finished" in msg and "--overwrite" in msg and "--resume" in msg
    assert {p.name: p.read_bytes() for p in reference.iterdir() if p.is_file()} == before


def test_refusal_offers_resume_only_when_there_is_a_checkpoint(corpus, tmp_path):
    # a new user's run that stopped at step 2 (non-finite loss) before any checkpoint was told to --resume, which
    # could only repeat the failure or refuse the changed --lr
    Trainer(_cfg(corpus, tmp_path, max_steps=2, checkpoint_every=100)).train()
    for p in tmp_path.glob("ckpt-*"):
        p.unlink()
    (tmp_path / "checkpoint.json").unlink()
    import shutil

    shutil.rmtree(tmp_path / "model")
    with pytest.raises(UsageError) as e:
        Trainer(_cfg(corpus, tmp_path)).train()
    assert "--overwrite" in str(e.value) and "no checkpoint to --resume from" in str(e.value)
    assert "overwrite=True" not in str(e.value)


def test_checkpoint_files_without_their_manifest_are_not_silently_restarted(corpus, tmp_path):
    # before: with checkpoint.json lost, --resume warned "no checkpoint yet", trained from step 0 and replaced them
    Trainer(_cfg(corpus, tmp_path, max_steps=8)).train()
    (tmp_path / "checkpoint.json").unlink()
    before = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    with pytest.raises(CheckpointError, match=r"ckpt-4.safetensors.*no checkpoint.json"):
        Trainer(_cfg(corpus, tmp_path, max_steps=12)).train(resume=True)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == before


@pytest.mark.parametrize("lr", [1e38, 1e39, float("inf"), 1e300])
def test_absurd_learning_rate_is_a_config_error(corpus, tmp_path, lr):
    # before: Adam with lr 1e38 ended in "internal error: RuntimeError: value cannot be converted to type float"
    with pytest.raises(ConfigError, match=r"lr must be > 0 \(--lr\) and at most 10000"):
        Trainer(_cfg(corpus, tmp_path, lr=lr, optimizer="adam"))


def test_new_run_refuses_an_unfinished_run_too(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=6)).train()
    import shutil

    shutil.rmtree(tmp_path / "model")  # as if the run was still going
    with pytest.raises(UsageError, match=r"latest checkpoint: step 6; not finished"):
        Trainer(_cfg(corpus, tmp_path)).train()


def test_overwrite_removes_the_runs_own_files_and_nothing_else(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=12, keep_checkpoints=3)).train()
    assert _ckpt_files(tmp_path) == {f"ckpt-{s}.{x}" for s in (4, 8, 12) for x in ("safetensors", "state.pt")}
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "ckpt-notes.md").write_text("mine too")  # not a checkpoint name
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    (tmp_path / ".metrics.jsonl.k2j3.tmp").write_text("")  # left by a write that a kill cut: the run's own
    Trainer(_cfg(corpus, tmp_path, max_steps=6, checkpoint_every=5)).train(overwrite=True)
    assert not (tmp_path / ".metrics.jsonl.k2j3.tmp").exists()
    assert _ckpt_files(tmp_path) == {"ckpt-notes.md"} | {
        f"ckpt-{s}.{x}" for s in (5, 6) for x in ("safetensors", "state.pt")
    }
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "data" / "x.txt").read_text() == "x"
    assert sorted(_losses(tmp_path)) == list(range(1, 7))  # the old run's metrics are gone, not appended to
    assert [c["step"] for c in _manifest(tmp_path)["checkpoints"]] == [5, 6]


@pytest.mark.parametrize("setup", ["missing", "empty", "unrelated"])
def test_missing_empty_or_unrelated_folder_is_fine(corpus, tmp_path, setup):
    out = tmp_path / "run"
    if setup != "missing":
        out.mkdir()
    if setup == "unrelated":
        (out / "README.txt").write_text("keep me")
    summary = Trainer(_cfg(corpus, out, max_steps=3)).train()
    assert summary["steps"] == 3
    if setup == "unrelated":
        assert (out / "README.txt").read_text() == "keep me"


def test_save_checkpoint_does_not_replace_another_runs_checkpoints(corpus, reference):
    before = {p.name: p.read_bytes() for p in reference.iterdir() if p.is_file()}
    with pytest.raises(UsageError, match="holds the checkpoints of another run"):
        Trainer(_cfg(corpus, reference)).save_checkpoint()
    assert {p.name: p.read_bytes() for p in reference.iterdir() if p.is_file()} == before


def test_resume_and_overwrite_together_are_refused(corpus, tmp_path):
    with pytest.raises(UsageError, match="exclude each other"):
        Trainer(_cfg(corpus, tmp_path)).train(resume=True, overwrite=True)


def test_out_dir_that_is_a_file_is_refused(corpus, tmp_path):
    (tmp_path / "f").write_text("")
    for kw in ({}, {"resume": True}):
        with pytest.raises(UsageError, match="is a file"):
            Trainer(_cfg(corpus, tmp_path / "f")).train(**kw)


# ---------------------------------------------------------------------------------------------- kept, verified
def test_keeps_the_last_n_checkpoints_with_sizes_and_hashes(corpus, tmp_path):
    leftover = tmp_path / ".ckpt-1.safetensors.x7q.safetensors.tmp"  # a tensor file a kill cut while being written
    leftover.write_bytes(b"partial")
    Trainer(_cfg(corpus, tmp_path, max_steps=9, checkpoint_every=2, keep_checkpoints=3)).train()
    m = _manifest(tmp_path)
    assert m["step"] == 9 and [c["step"] for c in m["checkpoints"]] == [6, 8, 9]
    names = set()
    for entry in m["checkpoints"]:
        for name, info in entry["files"].items():
            data = (tmp_path / name).read_bytes()
            assert info == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            names.add(name)
    assert names == {f"ckpt-{s}.{x}" for s in (6, 8, 9) for x in ("safetensors", "state.pt")} == _ckpt_files(tmp_path)
    vocab_txt = (tmp_path / "model" / "vocab.txt").read_bytes()
    assert m["vocab"]["size"] == len(vocab_txt.splitlines())
    assert m["vocab"]["sha256"] == hashlib.sha256(vocab_txt).hexdigest()
    assert latest_checkpoint_step(tmp_path) == 9
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # one byte changed in the middle, size kept
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])


@pytest.mark.parametrize(
    "suffix,how", [("safetensors", "truncated"), ("state.pt", "truncated"), ("safetensors", "flipped")]
)
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(corpus, reference, tmp_path, caplog, suffix, how):
    Trainer(_cfg(corpus, tmp_path, max_steps=8)).train()  # checkpoints 4 and 8
    damaged = tmp_path / f"ckpt-8.{suffix}"
    _damage(damaged, how)
    if how == "truncated" and suffix == "safetensors":  # what a resume used to end in: a raw library traceback
        with pytest.raises(SafetensorError):
            load_file(str(damaged))
    assert latest_checkpoint_step(tmp_path) == 4
    with caplog.at_level(logging.WARNING):
        Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and str(damaged) in warnings[0]
    assert ("bytes" if how == "truncated" else "sha256") in warnings[0]
    assert "falling back to the checkpoint of step 4" in warnings[0]
    _assert_same_run(tmp_path, reference)  # resumed from step 4, the same steps as one run
    assert [c["step"] for c in _manifest(tmp_path)["checkpoints"]] == [8, 12]  # the damaged 8 was rewritten
    assert latest_checkpoint_step(tmp_path) == 12


def test_no_checkpoint_verifies_is_an_error_naming_the_files(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=8)).train()
    _damage(tmp_path / "ckpt-8.state.pt", "truncated")
    (tmp_path / "ckpt-4.safetensors").unlink()
    assert latest_checkpoint_step(tmp_path) is None
    with pytest.raises(CheckpointError) as e:
        Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    assert "ckpt-8.state.pt" in str(e.value) and "ckpt-4.safetensors is missing" in str(e.value)
    assert "overwrite=True" in str(e.value)  # the Python wording; the command line says --overwrite


def test_unreadable_manifest_is_named(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=4)).train()
    (tmp_path / "checkpoint.json").write_text('{"step": 4, "checkp')
    assert latest_checkpoint_step(tmp_path) is None
    with pytest.raises(CheckpointError, match=r"checkpoint\.json is not a readable checkpoint manifest"):
        Trainer(_cfg(corpus, tmp_path)).train(resume=True)


def test_old_style_manifest_still_resumes(corpus, reference, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=8, keep_checkpoints=1)).train()
    (tmp_path / "checkpoint.json").write_text('{"step": 8}\n')  # what the landed code wrote
    assert latest_checkpoint_step(tmp_path) == 8
    Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    _assert_same_run(tmp_path, reference)
    assert _manifest(tmp_path)["format"] == 2


def test_old_style_manifest_with_a_truncated_file(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=8, keep_checkpoints=1)).train()
    (tmp_path / "checkpoint.json").write_text('{"step": 8}\n')
    _damage(tmp_path / "ckpt-8.state.pt", "truncated")
    assert latest_checkpoint_step(tmp_path) is None
    with pytest.raises(CheckpointError, match=r"ckpt-8\.state\.pt cannot be read"):
        Trainer(_cfg(corpus, tmp_path)).train(resume=True)


def test_latest_checkpoint_step_without_a_run(tmp_path):
    assert latest_checkpoint_step(tmp_path / "nope") is None
    assert latest_checkpoint_step(tmp_path) is None


def test_a_metrics_line_cut_by_a_kill_is_dropped_on_resume(corpus, reference, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=8)).train()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 9, "loss": 3.1')
    Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    _assert_same_run(tmp_path, reference)


# ---------------------------------------------------------------------------------------------- the run's identity
def test_vocabulary_edited_before_resume_is_named(corpus, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\n" + "".join(w + "\n" for w in WORDS), encoding="utf-8")
    out = tmp_path / "run"
    Trainer(_cfg(corpus, out, vocab_file=str(vocab), max_steps=4)).train()
    with open(vocab, "a", encoding="utf-8") as fh:
        fh.write("zebra\n")  # same path, one word more
    with pytest.raises(CheckpointError) as e:
        Trainer(_cfg(corpus, out, vocab_file=str(vocab))).train(resume=True)
    n = 3 + len(WORDS)
    assert str(vocab) in str(e.value) and f"has {n + 1} entries now, the run was trained with {n}" in str(e.value)
    assert "put back" in str(e.value) and "--overwrite" in str(e.value)
    # same size, other order: still refused
    vocab.write_text("<S>\n</S>\n<UNK>\n" + "".join(w + "\n" for w in reversed(WORDS)), encoding="utf-8")
    with pytest.raises(CheckpointError, match="same size"):
        Trainer(_cfg(corpus, out, vocab_file=str(vocab))).train(resume=True)


def test_vocabulary_edited_with_an_old_style_manifest_names_the_tensor(corpus, tmp_path):
    # before: a raw torch "size mismatch for softmax.weight" traceback; an old manifest records no vocabulary
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\n" + "".join(w + "\n" for w in WORDS), encoding="utf-8")
    out = tmp_path / "run"
    Trainer(_cfg(corpus, out, vocab_file=str(vocab), max_steps=4)).train()
    (out / "checkpoint.json").write_text('{"step": 4}\n')
    with open(vocab, "a", encoding="utf-8") as fh:
        fh.write("zebra\n")
    n = 3 + len(WORDS)
    with pytest.raises(CheckpointError) as e:
        Trainer(_cfg(corpus, out, vocab_file=str(vocab))).train(resume=True)
    assert str(out / "ckpt-4.safetensors") in str(e.value)
    assert f"'softmax.weight' has shape ({n}, 8), the model's config implies ({n + 1}, 8)" in str(e.value)


def test_model_options_changed_before_resume_names_the_first_mismatching_tensor(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=4)).train()
    other = json.loads(json.dumps(TINY))
    other["lstm"]["dim"] = 12
    trainer = Trainer(_cfg(corpus, tmp_path, model=other))
    saved = load_file(str(tmp_path / "ckpt-4.safetensors"))
    first = next(k for k, v in trainer.lm.state_dict().items() if tuple(saved[k].shape) != tuple(v.shape))
    with pytest.raises(CheckpointError) as e:
        trainer.train(resume=True)
    assert str(tmp_path / "ckpt-4.safetensors") in str(e.value) and f"tensor {first!r} has shape" in str(e.value)
    assert "train_config.json" in str(e.value)


def test_optimizer_changed_before_resume_is_named(corpus, tmp_path):
    Trainer(_cfg(corpus, tmp_path, max_steps=4)).train()
    with pytest.raises(
        CheckpointError,
        match=r"ckpt-4\.state\.pt holds the state of the optimizer 'adagrad', "
        r"this run uses 'adam'",
    ):
        Trainer(_cfg(corpus, tmp_path, optimizer="adam")).train(resume=True)


# ---------------------------------------------------------------------------------------------- interrupts
@pytest.mark.parametrize("every", [1000, 4])
def test_ctrl_c_between_steps_leaves_a_checkpoint_at_the_interrupt(
    corpus, reference, tmp_path, monkeypatch, caplog, every
):
    # before: interrupted before its first periodic checkpoint, a run resumed from step 0
    real = Trainer.train_step

    def step_then_ctrl_c(self, batch):
        out = real(self, batch)
        if self.step == 7:
            os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of step 7, which is deferred
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_ctrl_c)
    with interrupts.handling_signals(), caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        Trainer(_cfg(corpus, tmp_path, checkpoint_every=every)).train()
    assert _manifest(tmp_path)["step"] == 7 and latest_checkpoint_step(tmp_path) == 7
    assert sorted(_losses(tmp_path)) == list(range(1, 8))
    assert any("SIGINT: stopped after step 7, checkpoint written" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "model").exists()
    assert (tmp_path / "learning_curve.png").is_file()  # the curve so far is drawn at the interrupt
    interrupts.clear()
    monkeypatch.setattr(Trainer, "train_step", real)
    Trainer(_cfg(corpus, tmp_path, checkpoint_every=every)).train(resume=True)
    _assert_same_run(tmp_path, reference)


def test_ctrl_c_during_a_periodic_checkpoint_write_lands_after_it(corpus, tmp_path, monkeypatch):
    from elmokit.pretraining import checkpoint as ckpt

    real = ckpt.write_checkpoint

    def write_then_signal(out_dir, step, *a, **kw):
        if step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # during the write: it must complete first
        return real(out_dir, step, *a, **kw)

    monkeypatch.setattr(ckpt, "write_checkpoint", write_then_signal)
    with interrupts.handling_signals(), pytest.raises(KeyboardInterrupt):
        Trainer(_cfg(corpus, tmp_path)).train()
    assert latest_checkpoint_step(tmp_path) == 4 and sorted(_losses(tmp_path)) == [1, 2, 3, 4]


def test_interrupt_in_the_middle_of_a_step_saves_nothing(corpus, reference, tmp_path, monkeypatch, caplog):
    # without interrupts.handling_signals() a KeyboardInterrupt lands anywhere: a cut step is never checkpointed
    real = Trainer.train_step

    def cut(self, batch):
        if self.step == 6:  # during step 7, before its update
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(Trainer, "train_step", cut)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        Trainer(_cfg(corpus, tmp_path)).train()
    assert _manifest(tmp_path)["step"] == 4
    assert any(
        "in the middle of a step: nothing saved" in r.getMessage() and "step 4" in r.getMessage()
        for r in caplog.records
    )
    monkeypatch.setattr(Trainer, "train_step", real)
    Trainer(_cfg(corpus, tmp_path)).train(resume=True)
    _assert_same_run(tmp_path, reference)


def test_checkpoint_minutes_writes_by_time_too(corpus, tmp_path, monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(trainer_module, "_clock", lambda: clock["t"])
    real = Trainer.train_step

    def step_of_40_seconds(self, batch):
        clock["t"] += 40.0
        return real(self, batch)

    monkeypatch.setattr(Trainer, "train_step", step_of_40_seconds)
    Trainer(
        _cfg(corpus, tmp_path, max_steps=7, checkpoint_every=1000, checkpoint_minutes=1.0, keep_checkpoints=10)
    ).train()
    # 60 s passed after steps 2 (80 s), 4 (80 s since the last), 6; and the final one at 7
    assert [c["step"] for c in _manifest(tmp_path)["checkpoints"]] == [2, 4, 6, 7]


# ---------------------------------------------------------------------------------------------- config values
@pytest.mark.parametrize(
    "field,value",
    [
        ("keep_checkpoints", 0),
        ("keep_checkpoints", -1),
        ("keep_checkpoints", 1.5),
        ("keep_checkpoints", True),
        ("checkpoint_minutes", 0),
        ("checkpoint_minutes", -2.0),
        ("checkpoint_minutes", math.nan),
        ("checkpoint_minutes", math.inf),
        ("checkpoint_minutes", "5"),
        ("batch_size", 0),
        ("checkpoint_every", 0),
        ("n_negative_samples", -1),
        ("max_steps", 0),
        ("dropout", 1.0),
        ("lr", 0.0),
        ("clip_norm", -1.0),
        ("batching", "docs"),
        ("optimizer", "sgd"),
        ("decode_errors", "lenient"),
    ],
)
def test_bad_config_values_are_config_errors_naming_the_field(corpus, tmp_path, field, value):
    with pytest.raises(ConfigError, match=rf"TrainConfig\.{field} must be"):
        _cfg(corpus, tmp_path, **{field: value}).validate()


def test_good_new_config_values(corpus, tmp_path):
    cfg = _cfg(corpus, tmp_path, keep_checkpoints=1, checkpoint_minutes=0.5).validate()
    assert cfg.keep_checkpoints == 1 and cfg.checkpoint_minutes == 0.5
    assert TrainConfig(train_files=[], out_dir="x", model=TINY).keep_checkpoints == 2


# ---------------------------------------------------------------------------------------------- test hooks
def test_hooks_see_every_step_and_every_point_of_each_checkpoint_write(corpus, tmp_path, monkeypatch):
    """TrainHooks: ``after_step`` after each optimiser step (before its checkpoint), ``checkpoint_point`` at each point
    of each checkpoint write, in order, with the files of that point on disk; ``Trainer.default_hooks`` when a trainer
    is built without ``hooks=``."""
    out = tmp_path / "run"
    seen = []

    class Record(TrainHooks):
        def after_step(self, trainer):
            seen.append(("step", trainer.step, trainer._saved_step))

        def checkpoint_point(self, point, step):
            seen.append((point, step, sorted(p.name for p in out.glob("ckpt-*"))))

    Trainer(_cfg(corpus, out, max_steps=5, checkpoint_every=4), hooks=Record()).train()
    assert [x for x in seen if x[0] == "step"] == [
        ("step", 1, None),
        ("step", 2, None),
        ("step", 3, None),
        ("step", 4, None),
        ("step", 5, 4),
    ]
    assert [(p, s) for p, s, _ in seen if p != "step"] == [(p, s) for s in (4, 5) for p in ckpt.KILL_POINTS]
    t4, s4 = ckpt.tensor_file_name(4), ckpt.state_file_name(4)
    files_at_4 = {p: files for p, s, files in seen if s == 4 and p != "step"}
    assert files_at_4 == {
        "before_write": [],
        "between_files": [t4],
        "before_manifest": sorted([t4, s4]),
        "after_manifest": sorted([t4, s4]),
    }
    seen.clear()
    monkeypatch.setattr(Trainer, "default_hooks", Record())
    Trainer(_cfg(corpus, tmp_path / "again", max_steps=1)).train()
    assert seen[0] == ("step", 1, None) and [p for p, s, _ in seen[1:]] == list(ckpt.KILL_POINTS)


def test_training_is_deterministic_without_nan_fill_and_gives_back_the_settings(corpus, tmp_path, monkeypatch):
    """``deterministic=True`` trains with deterministic algorithms but without PyTorch's NaN fill of new tensors (a
    third of a bf16 zoo step in a profile), and afterwards the caller's three settings are back as they were."""
    seen = []
    real_step = Trainer.train_step

    def watching_step(self, batch):
        seen.append((torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory))
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", watching_step)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    assert before == (False, False, True)  # PyTorch's defaults: the test would not see a change otherwise
    Trainer(_cfg(corpus, tmp_path / "run", max_steps=3)).train()
    assert seen == [(True, False)] * 3
    after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    assert after == before
