"""Training speed: this tree (fp32 and bf16) against the landed code before the fused LSTM (``bb33407``, fp32), one run.

Three workloads, each through the trainer — the code ``elmokit train`` runs — in a child process per code version and
precision (so that each imports its own ``elmokit`` and its peak RSS is its own):

* **the zoo recipe** (``elmokit-en`` of ``recipes/zoo/specs.py``: LSTM 512 → 128, 2 layers, clips 3, 128 sentences a
  step, 4,096 sampled negatives, Adam) on WikiText-2 valid + test as text (``../shared/data/wikitext-2``);
* **the quickstart's settings** (``elmokit quickstart``: LSTM 512/128, 32 sentences a step, full softmax, Adam) on its
  Lee corpus;
* **bilm-tf's settings**: the "small" configuration (LSTM 1024 → 128), stream windows, batch 128 × 20 unroll steps,
  8,192 sampled negatives, Adagrad, on the WikiText-2 text with the vocabulary of all its words; also useful-FLOP
  utilisation against a ``torch.mm`` rate measured in the same run (146 MFLOP per token, forward + backward of the
  small configuration, each token embedded once, as the speed issue counts it).

Each child trains ``--warmup`` steps (default 30: steady state; under bf16, oneDNN compiles a kernel the first time a
product meets a shape, and the padded row counts of :func:`elmokit.modules.precision.gemm_rows` are all met only after
some tens of batches of varying size — as in every long run), then times the next ``--steps`` by calling the trainer's
own ``train_step`` (what ``Trainer.train`` runs each step) on ``next_batch()``, then measures the **held-out
perplexity** (full softmax, zero state per sentence) on text kept out of training (the last ``--held-out`` lines of the
WikiText-2 text; the Lee corpus's test split for the quickstart). Both trees draw the same batches (same seed, same data
code), so the ratio of tokens/s is the ratio of seconds per step, and the perplexities are after equal steps. The
variants of a workload run alternating (reference fp32, this fp32, this bf16, then again) so that a change in the
machine's load shows as a spread between the repeats; each figure is the faster repeat. The reference is a git worktree
of ``--reference`` (default ``bb33407``) made in a temporary folder.

Printed with the figures: ``lscpu``'s model name and the ``torch.mm`` bf16/fp32 rate ratio at 2048² (machines of this
kind are Intel with AMX, ≈ 4.9, or AMD EPYC with AVX512-BF16 and no AMX, ≈ 2.4).

Run: ``python bench/train.py [--steps 8] [--warmup 30] [--repeats 2] [--workloads zoo,quickstart,bilm-tf]
[--reference bb33407]``. Benchmark on a quiet machine (another process on the 2 cores makes 2-thread torch several
times slower). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2"
MFLOP_PER_TOKEN = 146.0  # small configuration, training (forward + backward), each token embedded once
REFERENCE = "bb33407"  # main before the fused LSTM training layer (issue 40)
WORKLOADS = ("zoo", "quickstart", "bilm-tf")
#: (label, source tree, precision) of each child of a workload, in the order they alternate
VARIANTS = (("reference fp32", "reference", "fp32"), ("fp32", "this", "fp32"), ("bf16", "this", "bf16"))


# ------------------------------------------------------------------------------------------------ the machine
def cpu_model() -> str:
    """``lscpu``'s model name (``/proc/cpuinfo``'s where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def mm_rates(threads: int, n: int = 2048, repeats: int = 8) -> dict[str, float]:
    """``torch.mm`` GFLOP/s at n × n in float32 and bfloat16 (best of ``repeats``) and their ratio."""
    import torch  # lazy: the parent process needs no torch until here

    torch.set_num_threads(threads)
    rates = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        for _ in range(2):
            torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
        rates[f"mm_gflops_{name}"] = 2 * n**3 / best / 1e9
    rates["mm_bf16_over_fp32"] = rates["mm_gflops_bf16"] / rates["mm_gflops_fp32"]
    return rates


# ------------------------------------------------------------------------------------------------ the workloads
def wikitext_lines(held_out: int) -> tuple[list[str], list[str]]:
    """WikiText-2 valid + test as lines: (training lines, the last ``held_out`` lines)."""
    text = "".join((WIKITEXT / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[:-held_out], lines[-held_out:]


def workload_config(workload: str, work: Path, max_steps: int):
    """The :class:`~elmokit.pretraining.trainer.TrainConfig` of ``workload`` (its corpus written under ``work``) and
    its held-out sentences; imported from the ``elmokit`` on ``sys.path`` (this tree or the reference)."""
    from elmokit.config import PRESETS
    from elmokit.pretraining.trainer import TrainConfig

    out = str(work / "run")
    common = dict(out_dir=out, progress=False, device="cpu", max_steps=max_steps, log_every=1, checkpoint_every=10_000)
    if workload == "quickstart":
        from elmokit.recipes.quickstart import load_lee_corpus, quickstart_config

        train, test = load_lee_corpus()
        corpus = work / "lee.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in train), encoding="utf-8")
        settings = dict(min_count=2, batching="sentences", batch_size=32, unroll_steps=20, n_epochs=1000)
        settings.update(optimizer="adam", lr=2e-3, clip_norm=5.0, dropout=0.5, n_negative_samples=0, seed=0)
        model = quickstart_config().to_options()
        return TrainConfig(train_files=[str(corpus)], model=model, **settings, **common), [list(s) for s in test]
    held = [line.split() for line in (work / "held_out.txt").read_text(encoding="utf-8").splitlines()]
    corpus = [str(work / "wikitext.txt")]
    if workload == "zoo":  # elmokit-en's recipe
        from elmokit.recipes.zoo.specs import SPECS

        spec = SPECS["en"]
        settings = {k: v for k, v in spec.train.items() if k not in common}
        return TrainConfig(train_files=corpus, model=spec.model, **settings, **common), held
    settings = dict(batching="windows", batch_size=128, unroll_steps=20, n_negative_samples=8192, optimizer="adagrad")
    return TrainConfig(train_files=corpus, model=PRESETS["small"]().to_options(), **settings, **common), held


def child(args: argparse.Namespace) -> None:
    """One child: train the warm-up steps, time the next ones, measure the held-out perplexity; write the result."""
    sys.path.insert(0, args.src)
    import torch

    torch.set_num_threads(args.threads)
    from elmokit.allocator import keep_freed_memory
    from elmokit.pretraining.perplexity import evaluate_perplexity
    from elmokit.pretraining.trainer import build_trainer, enter_determinism

    keep_freed_memory()  # as `elmokit train` does at start-up
    config, held_out = workload_config(args.workload, Path(args.work), args.warmup + args.steps)
    config.precision = args.precision
    trainer = build_trainer(config)
    trainer.lm.train()
    enter_determinism(config.deterministic)  # as the loop runs its steps
    for _ in range(args.warmup):
        trainer.train_step(trainer.next_batch())
    tokens, seconds = 0, 0.0
    for _ in range(args.steps):
        batch = trainer.next_batch()
        start = time.perf_counter()
        trainer.train_step(batch)
        seconds += time.perf_counter() - start
        tokens += batch.total_tokens
    trainer.lm.eval()
    with torch.no_grad():
        perplexity = evaluate_perplexity(trainer.lm, held_out)["average"]
    result = {"seconds_per_step": seconds / args.steps, "tokens_per_s": tokens / seconds, "perplexity": perplexity}
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["torch_threads"] = torch.get_num_threads()
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------ the parent
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per child (the quickstart: 4 times as many)")
    ap.add_argument("--warmup", type=int, default=30, help="untimed steps first (steady state)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of each variant")
    ap.add_argument("--held-out", type=int, default=300, help="WikiText-2 lines kept out of training")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--reference", default=REFERENCE, help="git commit of the reference code")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help=argparse.SUPPRESS)
    for hidden in ("--child", "--src", "--work", "--result", "--workload"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    return ap.parse_args()


def run_child(src: Path, workload: str, precision: str, args: argparse.Namespace, work: Path, text) -> dict:
    """One child process of the tree at ``src`` training ``workload`` at ``precision``; its result dict."""
    work.mkdir(parents=True)
    train, held = text
    (work / "wikitext.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (work / "held_out.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    steps = args.steps * (4 if workload == "quickstart" else 1)
    res = work / "result.json"
    argv = [sys.executable, __file__, "--child", "1", "--src", str(src), "--work", str(work), "--result", str(res)]
    argv += ["--workload", workload, "--steps", str(steps), "--warmup", str(args.warmup)]
    argv += ["--threads", str(args.threads), "--precision", precision]
    subprocess.run(argv, check=True, env=dict(os.environ, PYTHONPATH=str(src)))
    return json.loads(res.read_text())


def run_workload(workload: str, trees: dict[str, Path], args: argparse.Namespace, tmp: Path, text) -> dict:
    """Every variant of ``workload``, ``--repeats`` times alternating: {label: [result, …]}."""
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in VARIANTS}
    for repeat in range(args.repeats):
        for label, tree, precision in VARIANTS:
            work = tmp / f"{workload}-{label.replace(' ', '_')}-{repeat}"
            r = run_child(trees[tree], workload, precision, args, work, text)
            runs[label].append(r)
            print(f"{workload} / {label} #{repeat}: {json.dumps(r)}", flush=True)
    return runs


def summarise(workload: str, runs: dict[str, list[dict]], gflops: float) -> dict:
    """The faster repeat of each variant; tokens/s and perplexity ratios to the reference fp32."""
    best = {label: max(rs, key=lambda r: r["tokens_per_s"]) for label, rs in runs.items()}
    ref = best["reference fp32"]
    out: dict = {"tokens_per_s": {k: r["tokens_per_s"] for k, r in best.items()}}
    out["tokens_per_s_repeats"] = {k: [r["tokens_per_s"] for r in rs] for k, rs in runs.items()}
    out["perplexity"] = {k: r["perplexity"] for k, r in best.items()}
    out["peak_rss_mb"] = {k: r["peak_rss_mb"] for k, r in best.items()}
    for label in ("fp32", "bf16"):
        out[f"speedup_{label}"] = best[label]["tokens_per_s"] / ref["tokens_per_s"]
        out[f"perplexity_ratio_{label}"] = best[label]["perplexity"] / ref["perplexity"]
    if workload == "bilm-tf":
        out["utilisation"] = {k: r["tokens_per_s"] * MFLOP_PER_TOKEN * 1e6 / (gflops * 1e9) for k, r in best.items()}
    return out


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    machine = {"cpu": cpu_model(), "threads": args.threads, **mm_rates(args.threads)}
    print(f"CPU: {machine['cpu']}; torch.mm bf16/fp32 at 2048²: {machine['mm_bf16_over_fp32']:.2f}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="elmokit-train-bench-"))
    ref_tree = tmp / "reference"
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(ref_tree), args.reference], check=True, capture_output=True)
    trees = {"reference": ref_tree / "src", "this": ROOT / "src"}
    text = wikitext_lines(args.held_out)
    summary: dict = {"machine": machine, "reference": args.reference}
    try:
        for workload in args.workloads.split(","):
            runs = run_workload(workload, trees, args, tmp, text)
            summary[workload] = summarise(workload, runs, machine["mm_gflops_fp32"])
    finally:
        subprocess.run([*git, "remove", "--force", str(ref_tree)], capture_output=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
