"""Training killed for real, in a subprocess: ``SIGKILL`` at each point of a checkpoint write (from the trainer's
``checkpoint_point`` hook, :class:`~elmokit.pretraining.hooks.TrainHooks`), and ``SIGTERM`` / ``SIGINT`` sent to a
running run. Every time, a resume in a new process starts from a complete checkpoint and ends with the same losses
and parameters as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT
from elmokit.pretraining.checkpoint import KILL_POINTS
from elmokit.pretraining.trainer import latest_checkpoint_step
from helpers import tiny_window_config, write_tiny_corpus

# Runs Trainer directly (not the CLI) inside interrupts.handling_signals(), as the CLI's main does. With a pause step,
# that step waits (inside its deferred block) until a signal has arrived, so the test can send SIGTERM/SIGINT while a
# step is running and the run cannot finish first. With a kill point (<point>:<step>), the trainer's hook SIGKILLs the
# process at that point of the checkpoint of that step.
SCRIPT = r"""
import json, logging, os, signal, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from elmokit import interrupts
from elmokit.pretraining.hooks import TrainHooks
from elmokit.pretraining.trainer import TrainConfig, Trainer

config, resume, pause_step, ready = json.loads(sys.argv[1]), sys.argv[2] == "resume", int(sys.argv[3]), sys.argv[4]
kill_point, _, kill_step = sys.argv[5].partition(":")

class KillAt(TrainHooks):
    def checkpoint_point(self, point, step):
        if point == kill_point and str(step) == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

if pause_step:
    real = Trainer.train_step
    def step(self, batch):
        out = real(self, batch)
        if self.step == pause_step:
            Path(ready).write_text(str(self.step))
            for _ in range(12000):  # at most 2 minutes
                if interrupts.requested():
                    break
                time.sleep(0.01)
        return out
    Trainer.train_step = step
with interrupts.handling_signals():
    summary = Trainer(TrainConfig(**config), hooks=KillAt()).train(resume=resume)
print(json.dumps({"steps": summary["steps"]}))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    write_tiny_corpus(d)
    (d / "run.py").write_text(SCRIPT, encoding="utf-8")
    return d


def _config(setup: Path, out: Path, **kw) -> dict:
    """The tiny windowed run (20 steps, a checkpoint every 5), as the JSON the child process builds its config from."""
    changes = {"max_steps": 20, "checkpoint_every": 5, "keep_checkpoints": 2, **kw}
    return tiny_window_config(setup / "train.txt", out, **changes).to_dict()


def _start(setup: Path, config: dict, *, resume: bool = False, pause_step: int = 0, kill_at: str | None = None):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    ready = Path(config["out_dir"] + ".ready")
    cmd = [
        sys.executable,
        str(setup / "run.py"),
        json.dumps(config),
        "resume" if resume else "new",
        str(pause_step),
        str(ready),
        kill_at or "",
    ]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), ready


def _run(setup: Path, config: dict, **kw) -> subprocess.CompletedProcess:
    proc, _ = _start(setup, config, **kw)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def _assert_same_run(out: Path, reference: Path) -> None:
    assert _losses(out) == _losses(reference)
    got, want = (load_file(str(p / "model" / "model.safetensors")) for p in (out, reference))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _manifest(out: Path) -> dict:
    return json.loads((out / "checkpoint.json").read_text())


def _assert_no_orphans(out: Path) -> None:
    listed = {n for c in _manifest(out)["checkpoints"] for n in c["files"]}
    assert {p.name for p in out.glob("ckpt-*")} == listed
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def reference(setup):
    out = setup / "reference"
    res = _run(setup, _config(setup, out))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == 20 and sorted(_losses(out)) == list(range(1, 21))
    return out


# the checkpoint of step 15 is the one cut; 5 and 10 were written before it (2 kept: 5 and 10)
EXPECTED_RESUME_STEP = {"before_write": 10, "between_files": 10, "before_manifest": 10, "after_manifest": 15}


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_during_a_checkpoint_write_then_resume(setup, reference, point):
    out = setup / f"killed-{point}"
    cfg = _config(setup, out)
    res = _run(setup, cfg, kill_at=f"{point}:15")
    assert res.returncode == -signal.SIGKILL, res.stderr
    step = EXPECTED_RESUME_STEP[point]
    assert latest_checkpoint_step(out) == step
    manifest = _manifest(out)
    assert [c["step"] for c in manifest["checkpoints"]] == ([5, 10] if step == 10 else [10, 15])
    files = {p.name for p in out.glob("ckpt-*")}
    if point == "between_files":  # the tensor file of 15 is complete, its state file was never written
        assert "ckpt-15.safetensors" in files and "ckpt-15.state.pt" not in files
    if point == "before_manifest":
        assert {"ckpt-15.safetensors", "ckpt-15.state.pt"} <= files
    if point == "after_manifest":  # killed before the old files were deleted
        assert "ckpt-5.safetensors" in files
    res = _run(setup, cfg, resume=True)
    assert res.returncode == 0, res.stderr
    assert f"resumed from step {step}" in res.stderr
    _assert_same_run(out, reference)
    _assert_no_orphans(out)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_sigint_leaves_a_checkpoint_at_the_interrupt(setup, reference, sig):
    out = setup / f"signalled-{sig.name}"
    cfg = _config(setup, out)
    proc, ready = _start(setup, cfg, pause_step=13)
    deadline = time.monotonic() + 240
    while not ready.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.is_file(), proc.communicate()[1]
    assert sorted(_losses(out)) == list(range(1, 13))  # training is under way: 12 steps logged, step 13 running
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    # KeyboardInterrupt reached the top: Python ends itself with SIGINT after printing it -- or with status 1 when an
    # exit hook imports a module (CPython 3.11 then no longer re-raises SIGINT): torch._dynamo's compile-time report
    # imports tabulate at exit where it is installed (flair, in the test extra, brings it)
    assert proc.returncode in (-signal.SIGINT, 130, 1), err
    assert "KeyboardInterrupt" in err and f"{sig.name}: stopped after step 13, checkpoint written" in err
    assert latest_checkpoint_step(out) == 13 and [c["step"] for c in _manifest(out)["checkpoints"]] == [10, 13]
    assert not (out / "model").exists()
    res = _run(setup, cfg, resume=True)
    assert res.returncode == 0, res.stderr
    assert "resumed from step 13" in res.stderr
    _assert_same_run(out, reference)
    _assert_no_orphans(out)
