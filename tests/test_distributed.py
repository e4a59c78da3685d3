"""Several training processes with torchrun (gloo on CPU): identical weights on every process after every step, the
same losses as one process computing the same global batch, time-based checkpoints decided by process 0, an interrupt
of one process stopping all with a checkpoint that resumes in one process, and clear errors instead of hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from elmokit.embedding import writer
from elmokit.errors import CorpusDecodeError, DataError, EmbedWorkerError, TrainingError, UsageError
from elmokit.pretraining.distributed import DistContext, _describe_error, _remote_error, init_from_env, torchrun_rank
from elmokit.pretraining.trainer import TrainConfig, Trainer, build_trainer
from helpers import TINY_TRAIN_OPTIONS, TINY_WORDS

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ddp")
    lines = [" ".join(TINY_WORDS[(7 * i + 3 * j) % len(TINY_WORDS)] for j in range(3 + i % 5)) for i in range(60)]
    (d / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (d / "held.txt").write_text("\n".join(lines[:7]) + "\n", encoding="utf-8")
    (d / "options.json").write_text(json.dumps(TINY_TRAIN_OPTIONS), encoding="utf-8")
    return d


def _torchrun(files: Path, out: Path, *extra: str, hooks: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``elmokit train`` on two processes; with ``hooks`` (options of tests/run_hooks.py), through that test entry."""
    program = [str(Path(__file__).parent / "run_hooks.py"), *hooks, "--"] if hooks else ["-m", "elmokit"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *program,
        "train",
        str(files / "train.txt"),
        "--out-dir",
        str(out),
        "--options",
        str(files / "options.json"),
        "--batch-size",
        "4",
        "--negatives",
        "6",
        "--max-steps",
        str(STEPS),
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        "cpu",
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)


def _config(files: Path, out: Path, **kw) -> TrainConfig:
    """The same run as _torchrun's, for one process computing both data parts."""
    base = dict(
        train_files=[str(files / "train.txt")],
        out_dir=str(out),
        model=TINY_TRAIN_OPTIONS,
        batch_size=4,
        n_negative_samples=6,
        max_steps=STEPS,
        log_every=1,
        progress=False,
        device="cpu",
        data_parts=2,
    )
    base.update(kw)
    return TrainConfig(**base)


def _records(out: Path, kind: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r["kind"] == kind}


@pytest.fixture(scope="module")
def one_process(files, tmp_path_factory) -> Path:
    """One process, both data parts: the reference for the two-process runs."""
    out = tmp_path_factory.mktemp("one") / "run"
    Trainer(_config(files, out, valid_files=[str(files / "held.txt")], valid_every=4)).train()
    return out


def test_two_processes_hold_identical_weights_and_compute_what_one_does(files, one_process, tmp_path):
    out = tmp_path / "run"
    res = _torchrun(
        files,
        out,
        "--valid-files",
        str(files / "held.txt"),
        "--valid-every",
        "4",
        "--checkpoint-minutes",
        "1e-6",
        hooks=("--digests", str(tmp_path / "digest")),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout[res.stdout.index("{") :])  # only process 0 prints it
    assert summary["processes"] == 2 and summary["steps"] == STEPS
    # both processes hold the same weights after every step
    digests = [[json.loads(x) for x in (tmp_path / f"digest.rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert [d["step"] for d in digests[0]] == list(range(1, STEPS + 1))
    assert digests[0] == digests[1]
    assert len({d["sha256"] for d in digests[0]}) == STEPS  # and they change at every step
    # the two processes computed what one process computes on the same global batch
    two, one = _records(out, "train"), _records(one_process, "train")
    assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
    for step in one:
        assert two[step]["loss"] == pytest.approx(one[step]["loss"], abs=1e-5)
    v2, v1 = _records(out, "valid"), _records(one_process, "valid")
    assert sorted(v2) == sorted(v1) == [0, 4, 8]
    for step in v1:
        assert v2[step]["valid_ppl"] == pytest.approx(v1[step]["valid_ppl"], rel=1e-5)
    a, b = (load_file(str(p / "model" / "model.safetensors")) for p in (out, one_process))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # process 0 decided a checkpoint by time after every step (1e-6 minutes), and both acted on it: the newest two
    # are kept; it wrote every file, once
    manifest = json.loads((out / "checkpoint.json").read_text())
    assert [c["step"] for c in manifest["checkpoints"]] == [STEPS - 1, STEPS]
    assert json.loads((out / "train_config.json").read_text())["data_parts"] == 2
    assert (out / "best" / "best.json").is_file() and (out / "learning_curve.png").is_file()


def test_an_interrupt_of_one_process_stops_both_and_resumes_in_one(files, one_process, tmp_path):
    out = tmp_path / "run"
    res = _torchrun(files, out, hooks=("--sigint-at", "1:5"))  # process 1 gets SIGINT during step 5
    assert res.returncode != 0
    assert res.stderr.count("interrupted") == 2, res.stderr[-3000:]  # both processes stopped as interrupted
    assert "stopped after step 5, checkpoint written" in res.stderr
    assert json.loads((out / "checkpoint.json").read_text())["step"] == 5
    assert sorted(_records(out, "train")) == [1, 2, 3, 4, 5] and not (out / "model").exists()
    # the checkpoint of two processes resumes in one: the losses go on as they would have
    summary = Trainer(_config(files, out)).train(resume=True)
    assert summary["steps"] == STEPS
    got, want = _records(out, "train"), _records(one_process, "train")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], abs=1e-5)


def test_a_part_without_lines_stops_every_process_with_the_error(files, tmp_path):
    (tmp_path / "one.txt").write_text("the cat sat\n", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "elmokit",
        "train",
        str(tmp_path / "one.txt"),
        "--out-dir",
        str(tmp_path / "run"),
        "--options",
        str(files / "options.json"),
        "--batch-size",
        "2",
        "--max-steps",
        "2",
        "--no-progress",
        "--device",
        "cpu",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert res.returncode != 0
    # process 1's part is empty: it says so, and process 0 stops with the same error instead of waiting for it
    assert res.stderr.count("fewer lines than the 2 data parts") == 2, res.stderr[-3000:]
    assert "process 1: part 2 of 2" in res.stderr


def test_resume_on_more_processes_than_data_parts_says_what_is_allowed(files, one_process):
    saved = TrainConfig.from_json_file(one_process / "train_config.json")
    with pytest.raises(
        UsageError,
        match=r"3 processes but the run's data is in 2 part\(s\).*run it on 1 to 2 "
        r"processes; more would change the global batch",
    ):
        build_trainer(saved, dist=DistContext(rank=0, world_size=3))
    # fewer than data parts is fine: one process computes both parts (above), two one each
    assert build_trainer(saved, dist=DistContext(rank=1, world_size=2)).data.parts == [1]


def test_more_processes_than_lines(tmp_path):
    (tmp_path / "two.txt").write_text("the cat\nsat on\n", encoding="utf-8")
    cfg = TrainConfig(
        [str(tmp_path / "two.txt")], str(tmp_path / "run"), model=TINY_TRAIN_OPTIONS, batch_size=3, progress=False
    )
    with pytest.raises(DataError, match=r"part 3 of 3 .* fewer lines than the 3 data parts \(one per process"):
        build_trainer(cfg, dist=DistContext(rank=2, world_size=3))


def test_windows_in_parts_resume_exactly(files, tmp_path):
    kw = dict(batching="windows", unroll_steps=5, max_steps=10, checkpoint_every=1000, data_parts=3, batch_size=5)
    Trainer(_config(files, tmp_path / "full", **kw)).train()
    Trainer(_config(files, tmp_path / "cut", **{**kw, "max_steps": 4})).train()
    Trainer(_config(files, tmp_path / "cut", **kw)).train(resume=True)  # each part's LSTM state carried over
    full, cut = _records(tmp_path / "full", "train"), _records(tmp_path / "cut", "train")
    assert {s: r["loss"] for s, r in full.items()} == {s: r["loss"] for s, r in cut.items()}


def test_device_and_environment_errors(monkeypatch):
    ctx = DistContext(rank=1, world_size=2, local_rank=1)
    with pytest.raises(UsageError, match=r"--device 'cuda:1' with 2 processes: each process uses its own GPU"):
        ctx.device_for("cuda:1")
    assert ctx.device_for("cpu") == torch.device("cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UsageError, match="start several training processes with torchrun"):
        init_from_env("cpu")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_from_env("cpu").world_size == 1 and not init_from_env("cpu").enabled


def test_another_processs_error_is_rebuilt_one_way_for_train_and_embed():
    """_remote_error: the same kind of elmokit error (the nearest in its MRO that takes a message alone), an
    interrupt as an interrupt, anything else as the command's own error; the message names the process."""

    def remote(exc, rank, command):
        return _remote_error(rank, _describe_error(exc), command)

    got = remote(DataError("part 2 of 2 has fewer lines"), 1, "train")
    assert type(got) is DataError and str(got) == "process 1: part 2 of 2 has fewer lines"
    got = remote(CorpusDecodeError("a.txt", 3, "invalid UTF-8"), 1, "train")  # its constructor takes no message
    assert type(got) is DataError and str(got).startswith("process 1: a.txt:3: invalid UTF-8")
    got = remote(UsageError("holds the parts of an interrupted run"), 0, "embed")
    assert type(got) is UsageError and str(got) == "process 0 stopped: holds the parts of an interrupted run"
    got = remote(RuntimeError("boom"), 1, "train")
    assert type(got) is TrainingError and str(got) == "process 1 failed: RuntimeError: boom"
    got = remote(RuntimeError("boom"), 0, "embed")
    assert type(got) is EmbedWorkerError and str(got) == "process 0 stopped: RuntimeError: boom"
    assert type(remote(KeyboardInterrupt(), 1, "embed")) is KeyboardInterrupt


def test_torchrun_rank_for_train_and_embed(monkeypatch):
    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    assert torchrun_rank() == (0, 1) and writer.torchrun_rank() == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    assert torchrun_rank() == (2, 3) and writer.torchrun_rank() == (2, 3)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(
        UsageError,
        match=r"RANK=3 is outside 0\.\.2: start several embedding processes with torchrun "
        r"\(torchrun --nproc-per-node N -m elmokit embed",
    ):
        writer.torchrun_rank()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(UsageError, match="RANK='x' is missing or not a number: start several training processes"):
        torchrun_rank()
