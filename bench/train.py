"""Training speed: this tree's trainer vs the landed code at the start of the speed issue, one run, same machine.

Two workloads, each through the trainer — the code ``elmokit train`` runs — in a child
process per code version (so that each imports its own ``elmokit`` and its peak RSS is its own):

* **bilm-tf's settings**: the "small" configuration, stream windows, batch 128 × 20 unroll steps, 8,192 sampled
  negatives, Adagrad, on WikiText-2 valid + test as text (``../shared/data/wikitext-2``) with the vocabulary of all
  its words. Reported: tokens/s (tokens of one direction per step: 128 × 20), useful-FLOP utilisation against a
  ``torch.mm`` rate measured in the same run, with 146 MFLOP per token (forward + backward of the small
  configuration, each token embedded once, as the speed issue counts it), and peak RSS.
* **the quickstart's settings** (``elmokit quickstart``: LSTM 512/128, 32 sentences a step, full softmax, Adam):
  steps per minute.

Each child trains ``--warmup`` steps, then times the next ones: in this tree by calling the trainer's own
``train_step`` (what ``Trainer.train`` runs each step) on ``next_batch()``; in a reference tree from before
``elmokit.pretraining`` existed, as the quickstart times its budget there (``elmokit.training.trainer``'s
``loop_seconds``: the training steps alone, no checkpoint or model saving). The reference code is a git worktree
of ``--reference`` (default ``07aab1b``, main at the start of the speed issue), made in a temporary folder.

With ``--precision bf16`` the comparison is this tree's bf16 training against its own fp32 training instead (no
reference tree): bilm-tf's settings, the zoo's ``elmokit-en`` recipe (LSTM 512 → 128, batch 64, 4,096 negatives, Adam;
``--steps`` × 3 timed steps) on the same WikiText-2 text, and the quickstart; each in fp32, bf16, fp32, bf16 child
processes, the ratio taken between the faster repeat of each precision.

Run: ``python bench/train.py [--steps 8] [--warmup 2] [--quickstart-steps 40] [--reference 07aab1b]
[--precision bf16]``.
Benchmark on a quiet machine (another process on the 2 cores makes 2-thread torch several times slower). The last line
is one JSON object.
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


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, args.src)
    import torch

    torch.set_num_threads(args.threads)
    from elmokit.config import PRESETS

    try:  # as `elmokit train` does at start-up (this tree; the reference tree has no such module)
        from elmokit.allocator import keep_freed_memory

        allocator = "kept freed blocks" if keep_freed_memory() else "C library defaults"
    except ImportError:
        allocator = "C library defaults (no elmokit.allocator)"

    try:  # this tree
        from elmokit.pretraining.trainer import TrainConfig, build_trainer, enter_determinism
    except ImportError:  # a reference tree from before the package was named pretraining
        from elmokit.training.trainer import TrainConfig, Trainer

        build_trainer = None

    out = Path(args.work) / "run"
    if args.workload == "bilm-tf":
        corpus = Path(args.work) / "wikitext.txt"
        config = TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(out),
            model=PRESETS["small"]().to_options(),
            batching="windows",
            batch_size=128,
            unroll_steps=20,
            n_negative_samples=8192,
            optimizer="adagrad",
            max_steps=args.warmup + args.steps,
            log_every=1,
            checkpoint_every=10_000,
            progress=False,
            device="cpu",
        )
    elif args.workload == "zoo":  # elmokit-en's recipe (recipes/zoo/specs.py) on WikiText-2 valid + test
        from elmokit.recipes.zoo.specs import SPECS

        spec = SPECS["en"]
        corpus = Path(args.work) / "wikitext.txt"
        settings = dict(spec.train, max_steps=args.warmup + args.steps, log_every=1, checkpoint_every=10_000)
        config = TrainConfig(
            train_files=[str(corpus)], out_dir=str(out), model=spec.model, progress=False, device="cpu", **settings
        )
    else:
        try:  # this tree
            from elmokit.recipes.quickstart import load_lee_corpus, quickstart_config
        except ImportError:  # a reference tree from before the layout issue
            from elmokit.quickstart import load_lee_corpus, quickstart_config

        train, _ = load_lee_corpus()
        corpus = Path(args.work) / "lee.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in train), encoding="utf-8")
        config = TrainConfig(
            train_files=[str(corpus)],
            out_dir=str(out),
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
            max_steps=args.warmup + args.steps,
            checkpoint_every=10_000,
            log_every=1,
            progress=False,
            device="cpu",
        )
    if args.precision != "fp32":
        config.precision = args.precision
    if build_trainer is not None:
        # the step the training loop runs: draw the step's batch, train_step (forward, backward, clip, update)
        trainer = build_trainer(config)
        trainer.lm.train()
        enter_determinism(config.deterministic)  # as the loop runs its steps
        for _ in range(args.warmup):
            trainer.train_step(trainer.next_batch())
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step(trainer.next_batch())
        seconds = time.perf_counter() - start
    else:
        # as the quickstart times its budget: train the warm-up steps, then time the next ones (loop only)
        trainer = Trainer(config)
        trainer.config.max_steps = args.warmup
        trainer.train()
        trainer.config.max_steps = args.warmup + args.steps
        seconds = trainer.train(resume=True)["loop_seconds"]
    result = {"seconds_per_step": seconds / args.steps, "steps_per_minute": 60 * args.steps / seconds}
    if args.workload == "bilm-tf":
        result["tokens_per_s"] = args.steps * 128 * 20 / seconds
    if build_trainer is not None:
        result["loss_last"] = trainer.train_step(trainer.next_batch()).loss  # one more step: a sanity figure
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["torch_threads"] = torch.get_num_threads()
    result["allocator"] = allocator
    Path(args.result).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="timed steps of the bilm-tf workload")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quickstart-steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference", default="07aab1b", help="git commit of the reference code")
    ap.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: compare this tree's bf16 training with its fp32 training in the same run (bilm-tf's settings, "
        "the zoo's elmokit-en recipe, the quickstart), instead of this tree with the reference",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from inference import matmul_gflops

    if args.precision != "fp32":
        precision_main(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="elmokit-train-bench-"))
    ref_tree = tmp / "reference"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref_tree), args.reference],
        check=True,
        capture_output=True,
    )
    text = "".join((WIKITEXT / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        results: dict = {}
        for workload, steps in (("bilm-tf", args.steps), ("quickstart", args.quickstart_steps)):
            for side, src in (("reference", ref_tree / "src"), ("this tree", ROOT / "src")):
                work = tmp / f"{workload}-{side.replace(' ', '_')}"
                work.mkdir()
                (work / "wikitext.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
                res = work / "result.json"
                env = dict(os.environ, PYTHONPATH=str(src))
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        "1",
                        "--src",
                        str(src),
                        "--work",
                        str(work),
                        "--result",
                        str(res),
                        "--workload",
                        workload,
                        "--steps",
                        str(steps),
                        "--warmup",
                        str(args.warmup),
                        "--threads",
                        str(args.threads),
                        "--precision",
                        "fp32",
                    ],
                    check=True,
                    env=env,
                )
                r = json.loads(res.read_text())
                results[(workload, side)] = r
                print(f"{workload} / {side}: {json.dumps(r)}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref_tree)], capture_output=True)
    gflops = matmul_gflops(args.threads)
    summary = {"matmul_gflops": gflops, "mflop_per_token": MFLOP_PER_TOKEN}
    for side in ("reference", "this tree"):
        r = results[("bilm-tf", side)]
        summary[side] = {
            "tokens_per_s": r["tokens_per_s"],
            "seconds_per_step": r["seconds_per_step"],
            "utilisation": r["tokens_per_s"] * MFLOP_PER_TOKEN * 1e6 / (gflops * 1e9),
            "peak_rss_mb": r["peak_rss_mb"],
        }
    summary["speedup"] = summary["this tree"]["tokens_per_s"] / summary["reference"]["tokens_per_s"]
    summary["quickstart_steps_per_minute"] = {
        side: results[("quickstart", side)]["steps_per_minute"] for side in ("reference", "this tree")
    }
    summary["quickstart_ratio"] = (
        summary["quickstart_steps_per_minute"]["this tree"] / summary["quickstart_steps_per_minute"]["reference"]
    )
    print(json.dumps(summary))


def run_child(
    workload: str, precision: str, steps: int, args: argparse.Namespace, work: Path, lines: list[str]
) -> dict:
    """One child process of this tree training ``workload`` at ``precision``; its result dict."""
    work.mkdir()
    (work / "wikitext.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = work / "result.json"
    argv = [sys.executable, __file__, "--child", "1", "--src", str(ROOT / "src"), "--work", str(work)]
    argv += ["--result", str(res), "--workload", workload, "--steps", str(steps), "--warmup", str(args.warmup)]
    argv += ["--threads", str(args.threads), "--precision", precision]
    subprocess.run(argv, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    return json.loads(res.read_text())


def precision_main(args: argparse.Namespace) -> None:
    """``--precision bf16``: each workload in fp32 and in bf16, alternating (fp32, bf16, fp32, bf16) so that a change
    in the machine's load shows as a spread between the repeats; prints the bf16/fp32 speed ratio per workload."""
    from inference import matmul_gflops  # bench/inference.py (main put bench/ on the path)

    tmp = Path(tempfile.mkdtemp(prefix="elmokit-train-bench-"))
    text = "".join((WIKITEXT / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt"))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    summary: dict = {"threads": args.threads, "precision": args.precision}
    for workload, steps in (("bilm-tf", args.steps), ("zoo", args.steps * 3), ("quickstart", args.quickstart_steps)):
        runs: dict[str, list[float]] = {"fp32": [], args.precision: []}
        for repeat in range(2):
            for precision in ("fp32", args.precision):
                work = tmp / f"{workload}-{precision}-{repeat}"
                r = run_child(workload, precision, steps, args, work, lines)
                runs[precision].append(r["seconds_per_step"])
                print(f"{workload} / {precision} #{repeat}: {json.dumps(r)}", flush=True)
        best = {p: min(v) for p, v in runs.items()}
        summary[workload] = {
            "seconds_per_step": runs,
            "speedup": best["fp32"] / best[args.precision],  # of the faster repeat of each
        }
    summary["matmul_gflops_fp32"] = matmul_gflops(args.threads)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
