"""Speed on a busy machine: training, embedding and batch-1 latency, alone and beside a competing load, one run.

Three workloads, each in a fresh child process per (setting, load) so that the OpenMP runtime reads the setting's
environment when torch loads it:

* **train**: training steps/s at the quickstart's settings (``elmokit quickstart``: LSTM 512/128, 32 sentences a
  step, full softmax, Adam, dropout 0.5) on gensim's Lee corpus, through the trainer's own ``train_step``;
* **embed**: tokens/s (real tokens) of the "small" configuration (random weights, stateless, ``inference_mode``),
  consecutive batches of 64 in file order of UD English-EWT dev (``../shared/data/ud-english-ewt``);
* **latency**: batch-1 latency of the same model on a 10-token sentence (median over the window), with the native
  kernels where they build.

Each workload runs for ``--seconds`` after a warm-up and reports its rate over that window (at least a few steps or
batches, so one slow step under load cannot end it early). Loads, started by this script and stopped after each
measurement:

* ``quiet``: nothing else runs (benchmark on an otherwise quiet machine: the script warns when the load average says
  it is not);
* ``matmul2``: another process multiplying 1024² float32 matrices with torch on 2 threads (a training job beside
  yours);
* ``pyloop``: a CPU-bound single-threaded Python loop.

Settings (``--settings``, comma-separated names from :data:`SETTINGS`): ``today`` is libgomp's default wait policy
(spin 300,000 iterations before sleeping, the state before the busy-machine issue; set explicitly so elmokit's
defaults do not apply), ``elmokit`` whatever ``elmokit`` now sets up by itself (:mod:`elmokit.modules.threads`), and the
others the single knobs tried: passive waiting, shorter spin counts, one thread.

Run: ``python bench/contention.py [--seconds 10] [--settings today,elmokit] [--repeats 1]``. The quiet figures of
each setting are medians over ``--repeats`` children. The last line is one JSON object: per setting and workload the
quiet rate, the rate under each load, their ratios (for latency: loaded / quiet time), and each setting's quiet rate
relative to ``today``'s measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from inference import EWT_DEV, read_conllu_forms  # noqa: E402  (the same sentences as bench/inference.py)

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("train", "embed", "latency")

#: name → (environment set before torch loads, torch threads or None for elmokit's/torch's default). ``today``
#: sets GOMP_SPINCOUNT to libgomp's documented default for an unset OMP_WAIT_POLICY, so that elmokit's own defaults
#: (which only fill in variables the user left unset) stand aside.
SETTINGS: dict[str, tuple[dict[str, str], int | None]] = {
    "today": ({"GOMP_SPINCOUNT": "300000", "ELMOKIT_THREADS": "2"}, 2),
    "elmokit": ({}, None),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE", "ELMOKIT_THREADS": "2"}, 2),
    "spin30k": ({"GOMP_SPINCOUNT": "30000", "ELMOKIT_THREADS": "2"}, 2),
    "spin10k": ({"GOMP_SPINCOUNT": "10000", "ELMOKIT_THREADS": "2"}, 2),
    "spin3k": ({"GOMP_SPINCOUNT": "3000", "ELMOKIT_THREADS": "2"}, 2),
    "spin1k": ({"GOMP_SPINCOUNT": "1000", "ELMOKIT_THREADS": "2"}, 2),
    "spin100": ({"GOMP_SPINCOUNT": "100", "ELMOKIT_THREADS": "2"}, 2),
    "one-thread": ({"GOMP_SPINCOUNT": "300000", "ELMOKIT_THREADS": "1"}, 1),
}

LOADS = {
    "quiet": None,
    "matmul2": ("import torch\ntorch.set_num_threads(2)\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a\n"),
    "pyloop": "x = 0\nwhile True:\n    x += 1\n",
}


# ---------------------------------------------------------------------------------------------- child side
def _timed(step, seconds: float, warmup: int, min_runs: int) -> tuple[list[float], float]:
    """Run ``step()`` ``warmup`` times, then until ``seconds`` have passed (and at least ``min_runs`` times);
    return the per-run times and the window's total."""
    for _ in range(warmup):
        step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times, time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    import torch

    import elmokit  # noqa: F401  (first: elmokit's thread defaults apply before torch starts its OpenMP runtime)
    from elmokit.modules import threads as elmokit_threads

    elmokit_threads.set_threads(args.threads or elmokit_threads.default_threads())  # as the CLI does
    result: dict = {"threads": torch.get_num_threads(), "omp": elmokit_threads.openmp_settings()}
    if args.workload == "train":
        from elmokit.pretraining.trainer import TrainConfig, build_trainer, enter_determinism
        from elmokit.recipes.quickstart import load_lee_corpus, quickstart_config

        train, _ = load_lee_corpus()
        work = Path(args.work)
        corpus = work / "lee.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in train), encoding="utf-8")
        config = TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(work / "run"),
            model=quickstart_config().to_options(),
            min_count=2,
            batching="sentences",
            batch_size=32,
            unroll_steps=20,
            n_epochs=1000,
            optimizer="adam",
            lr=2e-3,
            clip_norm=5.0,
            dropout=0.5,
            n_negative_samples=0,
            seed=0,
            max_steps=10**6,
            checkpoint_every=10**6,
            log_every=10**6,
            progress=False,
            device="cpu",
        )
        trainer = build_trainer(config)
        trainer.lm.train()
        enter_determinism(config.deterministic)  # as the training loop does
        times, total = _timed(lambda: trainer.train_step(trainer.next_batch()), args.seconds, 3, 5)
        result.update(rate=len(times) / total, unit="steps/s", runs=len(times))
    else:
        from elmokit import BiLM, batch_to_ids, elmo_small

        torch.manual_seed(0)
        bilm = BiLM(elmo_small()).eval()
        sentences = read_conllu_forms(EWT_DEV, 1000)
        if args.workload == "embed":
            batches = [batch_to_ids(sentences[i : i + 64]) for i in range(0, len(sentences), 64)]
            tokens = [sum(len(s) for s in sentences[i : i + 64]) for i in range(0, len(sentences), 64)]
            it = iter(range(10**9))

            def step() -> None:
                k = next(it) % len(batches)
                with torch.inference_mode():
                    bilm(batches[k])
                step.tokens += tokens[k]

            step.tokens = 0
            _timed(step, 0, 2, 0)
            step.tokens = 0
            times, total = _timed(step, args.seconds, 0, 4)
            result.update(rate=step.tokens / total, unit="tokens/s", runs=len(times))
        else:
            one = batch_to_ids([next(s for s in sentences if len(s) == 10)])

            def step() -> None:
                with torch.inference_mode():
                    bilm(one)

            times, _ = _timed(step, args.seconds, 10, 20)
            result.update(rate=1000 * statistics.median(times), unit="ms (median)", runs=len(times))
            from elmokit.modules import native

            result["native_kernels"] = native.kernels() is not None
    Path(args.result).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------- parent side
def start_load(name: str) -> subprocess.Popen | None:
    """Start the competing load ``name`` (a child Python process), or ``None`` for ``quiet``."""
    code = LOADS[name]
    if code is None:
        return None
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # let it import torch and reach its loop
    return proc


def run_child(setting: str, workload: str, load: str, args: argparse.Namespace, tmp: Path) -> dict:
    env_extra, threads = SETTINGS[setting]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "ELMOKIT_THREADS")
    }
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT / "src")
    work = Path(tempfile.mkdtemp(dir=tmp))
    result = work / "result.json"
    proc = start_load(load)
    try:
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                workload,
                "--work",
                str(work),
                "--result",
                str(result),
                "--seconds",
                str(args.seconds),
                "--threads",
                str(threads or 0),
            ],
            check=True,
            env=env,
            timeout=args.seconds * 20 + 120,
        )
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window per workload and load")
    ap.add_argument("--settings", default="today,elmokit", help=f"comma-separated, from {', '.join(SETTINGS)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--repeats", type=int, default=1, help="quiet runs per setting and workload (median taken)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.workload = args.child
        child(args)
        return
    settings = args.settings.split(",")
    workloads = args.workloads.split(",")
    loads = args.loads.split(",")
    for s in settings:
        if s not in SETTINGS:
            ap.error(f"unknown setting {s!r}; choose from {', '.join(SETTINGS)}")
    load1 = os.getloadavg()[0]
    if load1 > 0.5:
        print(f"warning: load average {load1:.2f} before the run: the quiet figures may not be quiet", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="elmokit-contention-"))
    out: dict = {
        "seconds": args.seconds,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_before": load1,
        "settings": {},
    }
    for workload in workloads:
        for load in loads:
            # quiet runs are repeated, settings interleaved (A B C A B C …), so that a slow drift of the machine's
            # speed touches every setting alike; the median of each setting's runs is kept
            runs = args.repeats if load == "quiet" else 1
            rates: dict[str, list[float]] = {s: [] for s in settings}
            for _ in range(runs):
                for setting in settings:
                    r = run_child(setting, workload, load, args, tmp)
                    rates[setting].append(r["rate"])
                    entry = out["settings"].setdefault(setting, {}).setdefault(workload, {})
                    entry.update(unit=r["unit"], threads=r["threads"], omp=r["omp"])
                    if "native_kernels" in r:
                        entry["native_kernels"] = r["native_kernels"]
            for setting in settings:
                entry = out["settings"][setting][workload]
                entry[load] = statistics.median(rates[setting])
                if runs > 1:
                    entry[f"{load}_runs"] = rates[setting]
                each = ", ".join(f"{x:.3f}" for x in rates[setting])
                print(
                    f"{workload:8s} {setting:10s} {load:8s} {entry[load]:10.3f} {entry['unit']}"
                    + (f"  (runs: {each})" if runs > 1 else ""),
                    flush=True,
                )
        for setting in settings:
            entry = out["settings"][setting][workload]
            for load in loads:
                if load != "quiet" and "quiet" in entry:
                    entry[f"{load}_vs_quiet"] = entry[load] / entry["quiet"]
    if "today" in out["settings"]:
        for per in out["settings"].values():
            for workload, entry in per.items():
                ref = out["settings"]["today"].get(workload, {}).get("quiet")
                if ref and "quiet" in entry:
                    entry["quiet_vs_today"] = entry["quiet"] / ref
    print(json.dumps(out))


if __name__ == "__main__":
    main()
