"""elmokit.modules.threads: the OpenMP wait setting made before torch loads, the default thread count, --threads on
the computing commands, and the quickstart's busy-machine warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elmokit.cli import build_parser, main
from elmokit.errors import UsageError
from elmokit.modules import threads

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPUTING = [
    ["train", "c.txt", "--out-dir", "r"],
    ["perplexity", "m", "t.txt"],
    ["score", "m", "t.txt"],
    ["embed", "m", "i.txt", "o.hdf5"],
    ["similar", "m", "s.txt", "--word", "bank"],
    ["quickstart"],
    ["zoo", "build", "en"],
    ["tag", "train", "c.toml", "--out", "o"],
    ["classify", "predict", "m", "i.txt"],
    ["tag", "evaluate", "m", "f.txt"],
]


def _child(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (OpenMP settings are read once per process) and parse its JSON output."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "ELMOKIT_THREADS")}
    clean.update(env, PYTHONPATH=str(REPO_ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


REPORT = "import json; from elmokit.modules import threads; print(json.dumps(threads.openmp_settings()))"


def test_import_sets_the_spin_count_before_torch_loads():
    s = _child("import elmokit, torch, os; " + REPORT)
    assert s["GOMP_SPINCOUNT"] == str(threads.SPIN_COUNT)
    assert s["set_by_elmokit"] == {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT)} and s["torch_loaded_first"] is False


@pytest.mark.parametrize("env", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}])
def test_the_users_setting_wins(env):
    s = _child("import elmokit; " + REPORT, **env)
    assert s["set_by_elmokit"] == {}
    name, value = next(iter(env.items()))
    assert s[name] == value


def test_torch_imported_first_is_left_alone_and_reported():
    s = _child("import torch; import elmokit; " + REPORT)
    assert s == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None, "set_by_elmokit": {}, "torch_loaded_first": True}


def test_spawned_children_inherit_the_setting():
    code = (
        "import elmokit, subprocess, sys, json; print(subprocess.run([sys.executable, '-c', "
        '\'import os, json; print(json.dumps({"GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT")}))\'], '
        "capture_output=True, text=True).stdout)"
    )
    assert _child(code) == {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT)}


def test_default_threads_from_the_environment_and_affinity(monkeypatch):
    monkeypatch.delenv("ELMOKIT_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda: None)
    assert threads.default_threads() == len(os.sched_getaffinity(0))
    cpus = len(os.sched_getaffinity(0))
    for omp, expected in (("1", 1), ("3,2", 3), ("", cpus), ("x", cpus)):
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert threads.default_threads() == expected  # what torch would use, as before --threads existed
    monkeypatch.setenv("ELMOKIT_THREADS", "3")
    assert threads.default_threads() == 3
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("ELMOKIT_THREADS", bad)
        with pytest.raises(UsageError, match=f"ELMOKIT_THREADS must be an integer >= 1, got '{bad}'"):
            threads.default_threads()


def test_a_cgroup_quota_caps_the_cpus(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    for quota, expected in ((None, 16), (1.0, 1), (1.5, 2), (0.2, 1), (64.0, 16)):
        monkeypatch.setattr(threads, "_cgroup_cpu_limit", lambda q=quota: q)
        assert threads.available_cpus() == expected


def test_cgroup_v2_cpu_max_is_parsed(monkeypatch, tmp_path):
    files = {"/sys/fs/cgroup/cpu.max": "150000 100000\n"}
    real = Path.read_text

    def read_text(self, *a, **k):
        if str(self) in files:
            return files[str(self)]
        if str(self).startswith("/sys/fs/cgroup"):
            raise FileNotFoundError(str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert threads._cgroup_cpu_limit() == 1.5
    files["/sys/fs/cgroup/cpu.max"] = "max 100000\n"
    assert threads._cgroup_cpu_limit() is None
    del files["/sys/fs/cgroup/cpu.max"]
    files["/sys/fs/cgroup/cpu/cpu.cfs_quota_us"] = "250000\n"
    files["/sys/fs/cgroup/cpu/cpu.cfs_period_us"] = "100000\n"
    assert threads._cgroup_cpu_limit() == 2.5
    files["/sys/fs/cgroup/cpu/cpu.cfs_quota_us"] = "-1\n"
    assert threads._cgroup_cpu_limit() is None


@pytest.mark.parametrize("argv", COMPUTING, ids=lambda a: " ".join(a[:2]))
def test_every_computing_command_takes_threads(argv, monkeypatch):
    monkeypatch.setenv("ELMOKIT_THREADS", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    expected_default = 2 if argv[0] == "zoo" else 3  # zoo build: the recipe's count, for bit-exact rebuilds
    assert args.threads == expected_default and args.uses_threads
    assert parser.parse_args(argv + ["--threads", "1"]).threads == 1
    with pytest.raises(SystemExit):
        parser.parse_args(argv + ["--threads", "0"])


def test_threads_is_applied_before_the_command_runs(monkeypatch):
    seen = []
    before = torch.get_num_threads()
    import elmokit.cli.models as models  # noqa: F401
    from elmokit.cli import train as cli_train

    monkeypatch.setattr(cli_train, "cmd_perplexity", lambda args: seen.append(torch.get_num_threads()) or 0)
    assert main(["perplexity", "m", "t.txt", "--threads", "3"]) == 0
    assert seen == [3]
    assert torch.get_num_threads() == before  # restored: tests and scripts call main() in-process


def test_a_bad_elmokit_threads_is_one_line_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("ELMOKIT_THREADS", "many")
    assert main(["perplexity", "m", "t.txt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["elmokit perplexity: error: ELMOKIT_THREADS must be an integer >= 1, got 'many'"]


def test_set_threads_checks_its_argument():
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(UsageError, match="thread count must be an int >= 1"):
            threads.set_threads(bad)


def test_cpu_share_of_a_busy_loop_and_a_sleep():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threads.cpu_share() as busy:
            x = 0
            while busy is not None and x < 3_000_000:
                x += 1
        import time

        with threads.cpu_share() as idle:
            time.sleep(0.3)
    finally:
        torch.set_num_threads(before)
    # a pure-Python loop on one thread: its own CPU time is close to the wall time unless the machine is very busy
    assert 0.3 < busy.share <= 1.05
    assert idle.share < 0.1 and idle.wall_seconds >= 0.3 and idle.threads == 1


class _FakeTrainer:
    """What :func:`elmokit.recipes.quickstart.protocol._steps_for_budget` uses of a Trainer:
    ``config.max_steps``/``valid_every``, ``step``, ``step_seconds`` and ``train(resume)``, with step times given by
    ``seconds_of(step)``."""

    def __init__(self, seconds_of):
        self.config = type("C", (), {"max_steps": None, "valid_every": 10_000})()
        self.step, self.step_seconds, self.seconds_of, self.calls = 0, [], seconds_of, []

    def train(self, resume: bool = False):
        self.calls.append((resume, self.config.max_steps))
        self.step_seconds = [self.seconds_of(s) for s in range(self.step + 1, self.config.max_steps + 1)]
        self.step = self.config.max_steps
        return {"loop_seconds": sum(self.step_seconds)}


def _budget(monkeypatch, capsys, seconds_of, share: float, minutes: float = 5.0):
    from elmokit.recipes.quickstart import protocol as quickstart

    @__import__("contextlib").contextmanager
    def fake_share():
        yield threads.CpuShare(wall_seconds=10.0, cpu_seconds=20.0 * share, threads=2, load_average=3.5, cpus=2)

    monkeypatch.setattr(quickstart, "cpu_share", fake_share)
    trainer = _FakeTrainer(seconds_of)
    steps = quickstart._steps_for_budget(trainer, minutes, steps_per_epoch=50)
    return steps, trainer, capsys.readouterr().out


def test_budget_from_the_median_step_time_a_brief_burst_is_ignored(monkeypatch, capsys):
    # 0.2 s steps, with a burst of load making steps 8-14 (7 of the 20 timed steps) ten times slower
    steps, trainer, out = _budget(monkeypatch, capsys, lambda s: 2.0 if 8 <= s <= 14 else 0.2, share=0.95)
    assert steps == 1500 and trainer.config.max_steps == 1500  # 300 s / 0.2 s
    assert "~200 ms/step (median of 20 timed steps) → 1500 steps" in out and "busy" not in out
    # warm-up, timed probe, then the re-timing segment up to a quarter of the estimate
    assert trainer.calls == [(False, 5), (True, 25), (True, 375)]
    assert trainer.config.valid_every == 150


def test_a_burst_over_the_whole_probe_is_corrected_by_the_second_timing(monkeypatch, capsys):
    # the machine is busy (1 s steps) during the probe only; the longer second window sees 0.2 s steps
    steps, trainer, out = _budget(monkeypatch, capsys, lambda s: 1.0 if s <= 25 else 0.2, share=0.95)
    assert trainer.calls == [(False, 5), (True, 25), (True, 75)]  # 300 steps estimated first, a quarter re-timed
    assert steps == 1500 and "re-timed over 50 steps: ~200 ms/step → 1500 steps" in out


def test_a_busy_machine_is_named_with_what_to_do(monkeypatch, capsys):
    steps, _, out = _budget(monkeypatch, capsys, lambda s: 0.5, share=0.45)
    assert steps == 600
    assert "warning: this machine looks busy: the timed steps got 45% of their 2 threads' CPU time" in out
    assert "load average 3.5 on 2 CPUs" in out and "--steps" in out and "--threads 1" in out
