"""Ctrl-C and SIGTERM at any moment of the ``elmokit`` program: exit 130 (or 0 when the work was done first) and the
documented files, never death by a signal (elmokit/interrupts.py, elmokit.cli.entry).

The first tests pin the races one at a time in small processes that load no torch (a signal while the options are
read, one during interpreter shutdown, worker processes started with the signals blocked). The last two run
``elmokit embed`` and ``elmokit train`` as a user does and signal them at many points from the handler's installation
to the end (SIGINT and SIGTERM, to the process or to its whole group as a terminal's Ctrl-C does), then follow what
the interrupt message says (``--resume``, or the same command again) and require the uninterrupted run's output,
bit for bit. A signal in the first few hundredths of a second, while Python itself starts and before elmokit's first
line runs, ends the process as Python's defaults do (nothing is written by then): the delays start from the moment
the handler is installed, read from ``/proc/PID/status`` (Linux).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO_ROOT, shared_path
from elmokit import interrupts
from elmokit.cli import main as cli_main
from elmokit.io import atomic_write_text

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
#: more signalled runs per command when set (a stress run by hand: ELMOKIT_SIGNAL_TRIALS=40); CI runs TRIALS
TRIALS = max(3, int(os.environ.get("ELMOKIT_SIGNAL_TRIALS", "4")))
HAVE_PROC = Path("/proc/self/status").is_file() and "SigCgt:" in Path("/proc/self/status").read_text()

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process resumes then give the programs' bits (1 thread)


#: The start of the small programs below: elmokit's CLI with a one-command parser (``info``) instead of the real one,
#: whose help texts import torch (~2 s a process); the signal handling under test is the same.
LIGHT_CLI = r"""
import argparse, atexit, os, signal, sys, time
from elmokit import cli, interrupts

def parser(func):
    p = cli._Parser(prog="elmokit")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info").add_argument("model")
    p.set_defaults(func=func)
    return p
"""


def _python(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=ENV, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------------------------------------- one race at a time
def test_the_program_handles_signals_before_torch_is_imported():
    # the bug: `import elmokit` imported torch (~2 s) before the CLI's handler existed; a signal then killed the
    # process (SIGTERM) or printed a KeyboardInterrupt traceback (SIGINT) — 13 of 16 signals at random moments of an
    # `embed` run did. The package's names now load on first use, so the handler comes within milliseconds.
    res = _python("import sys, elmokit.cli; print(sorted({'torch', 'numpy', 'h5py'} & set(sys.modules)))")
    assert res.stdout.strip() == "[]", res.stderr
    res = _python(
        "import elmokit, sys; from elmokit import Elmo, batch_to_ids, ElmoError; "
        "print(Elmo.__module__, batch_to_ids.__module__, ElmoError.__module__, set(elmokit.__all__) <= "
        "set(dir(elmokit)), 'torch' in sys.modules)"
    )
    assert res.stdout.split() == ["elmokit.elmo", "elmokit.characters", "elmokit.errors", "True", "True"], res.stderr


def test_a_signal_while_the_options_are_read_ends_in_130_and_runs_nothing():
    # the signal lands after the handler is installed and before the command's work starts (the commands' modules and
    # torch are imported then): recorded, and raised as soon as the work would begin
    script = (
        LIGHT_CLI
        + r"""
ran = []
cli.build_parser = lambda: parser(lambda args: ran.append(1) or 0)
interrupts.install_for_process()
os.kill(os.getpid(), signal.SIG%s)
status = cli.main(["info", "anything"])
print(ran)
sys.exit(status)
"""
    )
    for name in ("TERM", "INT"):
        res = _python(script % name)
        assert res.returncode == 130, res.stderr
        assert res.stdout.strip() == "[]" and f"elmokit info: interrupted (SIG{name})" in res.stderr
        assert "Traceback" not in res.stderr


def test_a_signal_after_the_work_leaves_the_status():
    # the bug: the handlers were restored when the command returned, so a SIGTERM while the process exited killed it
    # (-15) and a SIGINT raised KeyboardInterrupt where nothing caught it (-2, "killed by signal 2")
    script = (
        LIGHT_CLI
        + r"""
cli.build_parser = lambda: parser(lambda args: 0)
status = cli.entry()
sig = getattr(signal, os.environ["SIG"])
if os.environ["WHEN"] == "shutdown":
    atexit.register(os.kill, os.getpid(), sig)  # runs during shutdown, before elmokit's own exit handler
else:
    os.kill(os.getpid(), sig)  # after the work, before the exit
sys.exit(status)
"""
    )
    for name in ("SIGTERM", "SIGINT"):
        for when in ("after", "shutdown"):
            res = subprocess.run(
                [sys.executable, "-c", script, "info", "anything"],
                env={**ENV, "SIG": name, "WHEN": when},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 0, (name, when, res.returncode, res.stderr)
            assert res.stderr == ""


def test_an_interrupt_swallowed_by_a_destructor_is_reported_once():
    # found by the many-points test: a signal landing in a weakref callback printed "Exception ignored in … Traceback
    # … KeyboardInterrupt" before the command's own one-line report
    script = (
        LIGHT_CLI
        + r"""
class Swallows:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)  # the handler raises in here; Python can only print what __del__ raises
cli.build_parser = lambda: parser(lambda args: (Swallows(), 0)[1])
sys.exit(cli.entry())
"""
    )
    res = subprocess.run(
        [sys.executable, "-c", script, "info", "anything"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 130
    assert res.stderr == "elmokit info: interrupted (SIGTERM); nothing partial was written\n"


def test_an_interrupt_caught_inside_a_string_exec_still_exits_130(tmp_path):
    # the "killed by signal 2" after SIGTERM: the interrupt landed in code run by a string exec() (dataclasses,
    # namedtuple, torch generate code that way); CPython then marks it unhandled although the command caught it and
    # returned 130, and under `python -m` ends the process by SIGINT (-2). A module, since `-c` skips that check.
    (tmp_path / "signal_in_exec.py").write_text(
        LIGHT_CLI
        + r"""
code = "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)"
cli.build_parser = lambda: parser(lambda args: exec(code))
sys.exit(cli.entry())
"""
    )
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(tmp_path)])}
    res = subprocess.run(
        [sys.executable, "-m", "signal_in_exec", "info", "anything"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert res.stderr == "elmokit info: interrupted (SIGTERM); nothing partial was written\n"


def test_ctrl_c_twice_after_the_work_stops_at_once():
    script = (
        LIGHT_CLI
        + r"""
cli.build_parser = lambda: parser(lambda args: 0)
status = cli.entry()
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGINT)  # e.g. a shutdown that hangs: the second Ctrl-C is the default action
time.sleep(5)
sys.exit(status)
"""
    )
    res = subprocess.run(
        [sys.executable, "-c", script, "info", "anything"], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == -signal.SIGINT


def test_the_handler_raises_only_inside_the_block():
    with interrupts.handling_signals():
        pass
    before = signal.getsignal(signal.SIGTERM)
    assert before is not interrupts._handler  # restored: in-process use (the tests, a library) is left as it was
    with interrupts.handling_signals():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs in here
        assert interrupts.signal_name() == "SIGTERM"
    interrupts.clear()


def test_a_signal_an_earlier_block_recorded_does_not_stop_a_later_library_training(tmp_path):
    """The bug (a test order of CI's): an in-process CLI call interrupted by SIGINT left the signal recorded; a later
    ``Trainer.train`` in the same process, outside any block, read it after its first step and raised
    ``KeyboardInterrupt``. Only a signal still handled (inside a block, or process-wide) is pending."""
    from elmokit.pretraining.trainer import Trainer
    from helpers import tiny_window_config, write_tiny_corpus

    with pytest.raises(KeyboardInterrupt), interrupts.handling_signals():
        signal.raise_signal(signal.SIGINT)
    try:
        assert interrupts.requested() and not interrupts.pending()  # recorded, no longer to be acted on
        Trainer(tiny_window_config(write_tiny_corpus(tmp_path), tmp_path / "run", max_steps=3)).train()
        assert json.loads((tmp_path / "run" / "checkpoint.json").read_text())["step"] == 3
    finally:
        interrupts.clear()


def test_a_signal_as_a_temporary_file_is_created_leaves_no_file(tmp_path, monkeypatch):
    # found by the many-points test (embed signalled as part 0 was done, under ATEN_CPU_CAPABILITY=default): the
    # interrupt landed between mkstemp and atomic_path's try, and part 1's temporary stayed in the parts folder
    real = tempfile.mkstemp

    def mkstemp_then_signal(*args, **kwargs):
        created = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, with the file created and its name not yet returned
        return created

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_signal)
    try:
        with interrupts.handling_signals(), pytest.raises(KeyboardInterrupt):
            atomic_write_text(tmp_path / "out.txt", "text")
        assert list(tmp_path.iterdir()) == []
        # after an interrupt, the writes a command still makes (a checkpoint, the learning curve) are not cut by it
        monkeypatch.setattr(tempfile, "mkstemp", real)
        with interrupts.handling_signals():
            with pytest.raises(KeyboardInterrupt), interrupts.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
            atomic_write_text(tmp_path / "after.txt", "written")
        assert (tmp_path / "after.txt").read_text() == "written"
    finally:
        interrupts.clear()


def test_children_started_while_blocked_inherit_the_blocked_signals():
    # embed's worker processes start inside interrupts.blocked(): Ctrl-C to the process group (or the parent's
    # SIGTERM) waits until their handler is installed instead of landing in the middle of their imports
    code = "import signal; print(sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))"
    with interrupts.blocked():
        inside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert {int(signal.SIGINT), int(signal.SIGTERM)} <= set(json.loads(inside.stdout))
    assert not {int(signal.SIGINT), int(signal.SIGTERM)} & set(json.loads(after.stdout))


# ---------------------------------------------------------------------------------------------- whole runs
def _handler_installed(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM (elmokit's handler is installed; Python alone leaves it default)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in text.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@dataclass
class Trial:
    argv: list[str]
    delay: float | None = None  # seconds after the handler is installed (after ``marker``, with after_marker); None:
    # no signal
    sig: int = signal.SIGTERM
    group: bool = False  # to the whole process group, as a terminal's Ctrl-C
    marker: Callable[[], bool] | None = None  # true once the work is under way
    after_marker: bool = False
    status: int | None = None
    err: str = ""
    total: float = 0.0  # seconds from the handler's installation to the end
    work: float = math.inf  # ... to ``marker``

    def where(self) -> str:
        name = signal.Signals(self.sig).name
        when = f"{self.delay:.2f} s after {'its marker' if self.after_marker else 'the handler'}"
        return f"{name} {when}{' to the group' if self.group else ''} ({' '.join(self.argv[4:])})"


def _run(trial: Trial) -> Trial:
    """Run ``elmokit`` as a program and signal it as the trial says; fill in its status, stderr and times."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "elmokit", *trial.argv],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not _handler_installed(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    start = time.monotonic()
    signalled = False
    while proc.poll() is None:
        now = time.monotonic() - start
        if trial.marker is not None and trial.work == math.inf and trial.marker():
            trial.work = now
        due = None if trial.delay is None else trial.delay + (trial.work if trial.after_marker else 0.0)
        if due is not None and now >= due and not signalled:
            signalled = True
            with contextlib.suppress(ProcessLookupError):  # it ended between the poll and the kill
                if trial.group:
                    os.killpg(proc.pid, trial.sig)
                else:
                    proc.send_signal(trial.sig)
        time.sleep(0.002)
    _, trial.err = proc.communicate(timeout=120)
    trial.status, trial.total = proc.returncode, time.monotonic() - start
    return trial


def _trials(
    argv_of,
    calibration: Trial,
    started: Callable[[int], Callable[[], bool]],
    midway: Callable[[int], Callable[[], bool]],
    n: int,
    seed: int,
) -> list[Trial]:
    """``n`` >= 3 signalled runs, two at a time (most of a run is Python and torch starting: CI time): one right after
    the handler is installed (the commands' modules and torch are being imported), one as soon as ``midway(k)`` is
    true (a resumable point of the work), one at the end of the uninterrupted ``calibration`` run's time, and the
    others stratified (a random point in each of n - 3 equal slices) over the calibration run's time — a point after
    the start of its work (``started``) is taken from the start of each run's own work, so that runs quicker or
    slower to start than the calibration one are still signalled while they work. SIGTERM and SIGINT alternate;
    every third goes to the process group."""
    rng = random.Random(seed)
    total, work = calibration.total, min(calibration.work, calibration.total)
    trials = []
    for k in range(n):
        sig, group = (signal.SIGINT if k % 2 else signal.SIGTERM), k % 3 == 2
        if k == 0:
            trial = Trial(argv_of(k), delay=0.0, sig=sig, group=group)
        elif k == 1:
            trial = Trial(argv_of(k), delay=0.0, sig=sig, group=group, marker=midway(k), after_marker=True)
        elif k == n - 1:
            trial = Trial(argv_of(k), delay=total, sig=sig, group=group)
        else:
            d = total * (k - 2 + rng.random()) / (n - 3)
            trial = (
                Trial(argv_of(k), delay=d, sig=sig, group=group)
                if d < work
                else Trial(argv_of(k), delay=d - work, sig=sig, group=group, marker=started(k), after_marker=True)
            )
        trials.append(trial)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(pool.map(_run, trials))


def _no_temporaries(folder: Path) -> None:
    left = [str(p) for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert not left, left


def _same_hdf5(a: Path, b: Path) -> None:
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        assert sorted(x) == sorted(y) and dict(x.attrs) == dict(y.attrs)
        for k in x:
            assert np.array_equal(x[k][()], y[k][()]), k


def _check_interrupted(trial: Trial) -> None:
    assert trial.status in (0, 130), (trial.where(), trial.status, trial.err)
    assert "Traceback" not in trial.err and "Exception ignored" not in trial.err, (trial.where(), trial.err)
    if trial.status == 130:
        assert f"interrupted ({signal.Signals(trial.sig).name})" in trial.err, (trial.where(), trial.err)


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/PID/status (Linux) to see when the handler is installed")
def test_embed_signalled_at_many_points_ends_in_130_or_0_and_resumes(tmp_path):
    model = shared_path("fixtures", "allennlp-elmo")
    text = tmp_path / "in.txt"
    words = "the river bank is muddy after the rain and a boat on the water".split()
    text.write_text("".join(" ".join(words[(i + j) % len(words)] for j in range(4 + i % 9)) + "\n" for i in range(600)))
    # --threads 1 as the subprocesses' OMP_NUM_THREADS: the in-process reruns compute with the same thread count
    options = ["--part-size", "100", "--batch-size", "16", "--no-progress", "--threads", "1"]

    def argv_of(k: int) -> list[str]:
        out = tmp_path / f"run{k}" / "out.hdf5"
        out.parent.mkdir(exist_ok=True)
        # one run on 2 worker processes: Ctrl-C to the group also reaches them, while they start or work
        return ["embed", str(model), str(text), str(out), *options, *(["--workers", "2"] if k == 2 else [])]

    def parts_of(k: int) -> Path:
        return tmp_path / f"run{k}" / "out.hdf5.parts"

    def first_part_done(k: int) -> Callable[[], bool]:
        return (parts_of(k) / "part-000000.hdf5").exists

    whole = _run(Trial(argv_of(-1), marker=parts_of(-1).exists))  # uninterrupted: the reference, and its times
    assert whole.status == 0, whole.err
    reference = tmp_path / "run-1" / "out.hdf5"
    outcomes = []
    for trial in _trials(argv_of, whole, lambda k: parts_of(k).exists, first_part_done, TRIALS, seed=1):
        _check_interrupted(trial)
        out = Path(trial.argv[3])
        parts = out.with_name(out.name + ".parts")
        _no_temporaries(out.parent)
        if trial.status == 130:
            # the message says whether finished parts were kept (an index makes them resumable); the output is whole
            # or absent
            assert ("--resume" in trial.err) == parts.is_dir() == (parts / "index.json").is_file(), trial.where()
            if out.exists() and not parts.exists():  # signalled after the output was in place and its parts gone
                outcomes.append("130 after the output")
            else:  # (the output may be in place with its parts not yet deleted: --resume merges them again)
                again = [a for a in trial.argv if a not in ("--workers", "2")]
                assert cli_main(again + (["--resume"] if "--resume" in trial.err else [])) == 0, trial.where()
                outcomes.append("130, resumed" if "--resume" in trial.err else "130, run again")
        else:
            outcomes.append("0")
        _same_hdf5(out, reference)
        assert not parts.exists(), trial.where()
    print(f"embed, {len(outcomes)} signalled runs: {dict(collections.Counter(outcomes))}")  # shown with -s
    # at least one run left finished parts that --resume completed to the same bits
    assert "130, resumed" in outcomes, outcomes


@pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/PID/status (Linux) to see when the handler is installed")
def test_train_signalled_at_many_points_ends_in_130_or_0_and_resumes(tmp_path):
    from elmokit.pretraining.trainer import latest_checkpoint_step

    corpus = tmp_path / "c.txt"
    corpus.write_text("the river bank is muddy .\nthe money bank is closed .\na boat on the river .\n" * 30)
    options = [
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--negatives",
        "0",
        "--log-every",
        "1",
        "--no-progress",
        "--max-steps",
        "30",
        "--checkpoint-every",
        "10",
        "--threads",
        "1",
    ]  # the in-process resumes as the runs

    def argv_of(k: int) -> list[str]:
        return ["train", str(corpus), "--out-dir", str(tmp_path / f"run{k}"), *options]

    def model_of(run: Path) -> dict:
        return load_file(str(run / "model" / "model.safetensors"))

    def steps_logged(k: int) -> Callable[[], bool]:
        metrics = tmp_path / f"run{k}" / "metrics.jsonl"
        return lambda: metrics.exists() and metrics.read_text().count("\n") >= 3  # step 3 done, no checkpoint yet

    def started(k: int) -> Callable[[], bool]:
        return (tmp_path / f"run{k}" / "train_config.json").exists

    whole = _run(Trial(argv_of(-1), marker=started(-1)))  # uninterrupted: the reference, and its times
    assert whole.status == 0, whole.err
    want = model_of(tmp_path / "run-1")
    outcomes = []
    for trial in _trials(argv_of, whole, started, steps_logged, TRIALS, seed=2):
        _check_interrupted(trial)
        out = Path(trial.argv[3])
        if out.exists():
            _no_temporaries(out)
        if trial.status == 130:
            metrics = out / "metrics.jsonl"
            logged = [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.exists() else []
            if "(continue with --resume)" in trial.err:  # a checkpoint of the step where it stopped
                assert latest_checkpoint_step(out) == max(logged), (trial.where(), trial.err)
            else:
                assert latest_checkpoint_step(out) is None, (trial.where(), trial.err)
            assert cli_main(trial.argv + (["--resume"] if "--resume" in trial.err else [])) == 0, trial.where()
            outcomes.append("130, resumed" if "--resume" in trial.err else "130, run again")
        else:
            outcomes.append("0")
        got = model_of(out)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), trial.where()
    print(f"train, {len(outcomes)} signalled runs: {dict(collections.Counter(outcomes))}")  # shown with -s
    # at least one run stopped with a checkpoint that --resume continued to the same bits
    assert "130, resumed" in outcomes, outcomes
