"""Where a training step's time goes: self CPU time per op family (``torch.profiler``), fp32 and bf16.

For each workload of ``bench/train.py`` (the zoo recipe ``elmokit-en``, the quickstart's settings, bilm-tf's settings;
the same configurations, corpora and trainer step) this tree's trainer takes ``--warmup`` steps, times ``--steps``
steps, then profiles ``--steps`` more, in fp32 and in bf16 (``--precision bf16``: bfloat16 autocast), and prints one
Markdown table per workload:

    | op | fp32 | bf16 |
    | `bmm` (…) | 35.6 % (3,612 calls, 1.25 ms each) | 27.2 % (4,332 calls, 0.49 ms) |
    …
    | step time | 2.54 s | 2.15 s (1.18×) |

The families: the char CNN's max over window positions (the native ``window_max`` and its backward, or
``torch.max``), the fused highway layer's passes, the fused LSTM layer's own time (``elmokit_train::*``: its fused
passes; the GEMMs it calls count under ``mm``/``bmm``), ``bmm``, ``mm`` (``addmm`` included), ``cat``, ``copy_``
(casts, copies), ``add``, the element-wise rest of the LSTM cell (``baddbmm``, ``tanh``, ``sigmoid``, ``mul``, their
backward, clips), the char CNN's convolutions, the sampled softmax's native rows (``elmokit_softmax::*``), the
optimiser and the gradient norm, zero fills, the embedding/index ops and the rest. Shares are of the profiled steps'
total self CPU time; the step time is measured without the profiler.

Printed first: ``lscpu``'s model name and the ``torch.mm`` bf16/fp32 ratio at 2048². The last line is one JSON object.

Run: ``python bench/train_profile.py [--steps 3] [--warmup 2] [--workloads zoo,quickstart,bilm-tf]``. Profile on a
quiet machine; the shares are steadier than the times under load, but both move.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import WORKLOADS, cpu_model, mm_rates, wikitext_lines, workload_config  # noqa: E402  (bench/train.py)

from elmokit.pretraining.trainer import build_trainer, enter_determinism  # noqa: E402

#: (family, op-name prefixes), first match wins; "other" takes the rest
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("char CNN max over windows (`window_max`, `max`)", ("elmokit_train::window_max", "aten::max")),
    ("highway passes (`highway_train_*`)", ("elmokit_train::highway_train",)),
    ("fused LSTM passes (`elmokit_train`)", ("elmokit_train::",)),
    ("sampled softmax rows (`elmokit_softmax`)", ("elmokit_softmax::",)),
    ("`bmm`", ("aten::bmm",)),
    ("`mm` (`addmm`)", ("aten::mm", "aten::addmm")),
    ("`cat`", ("aten::cat",)),
    ("`copy_` (casts, copies)", ("aten::copy_", "aten::_to_copy", "aten::clone")),
    ("`add`", ("aten::add", "aten::add_")),
    (
        "`baddbmm`, `tanh`, `sigmoid`, `mul`, their backward, clips",
        (
            "aten::baddbmm",
            "aten::tanh",
            "aten::sigmoid",
            "aten::mul",
            "aten::addcmul",
            "aten::clamp",
            "aten::ge",
            "aten::le",
            "aten::where",
            "aten::logical_and",
        ),
    ),
    ("char CNN convolutions", ("aten::mkldnn_convolution", "aten::convolution", "aten::_convolution")),
    (
        "optimiser, gradient norm",
        ("aten::_fused_adam", "aten::_foreach", "aten::addcdiv", "aten::sqrt", "aten::linalg_vector_norm"),
    ),
    ("zero fills (`fill_`)", ("aten::fill_", "aten::zero_")),
    ("embedding, gather, scatter", ("aten::embedding", "aten::index", "aten::gather", "aten::scatter")),
    ("softmax, log-sum-exp", ("aten::_log_softmax", "aten::logsumexp", "aten::exp", "aten::log", "aten::amax")),
)


def family(name: str) -> str:
    for label, prefixes in FAMILIES:
        if name.startswith(prefixes):
            return label
    return "other"


def profile_steps(trainer, steps: int) -> dict[str, dict[str, float]]:
    """Self CPU time per family over ``steps`` training steps: {family: {"us", "calls"}}."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.train_step(trainer.next_batch())
    table: dict[str, dict[str, float]] = {}
    for ev in prof.key_averages():
        row = table.setdefault(family(ev.key), {"us": 0.0, "calls": 0})
        row["us"] += ev.self_cpu_time_total
        row["calls"] += ev.count
    return table


def run(workload: str, precision: str, args: argparse.Namespace, text) -> dict:
    """One workload at one precision: the step time and the per-family profile."""
    work = Path(tempfile.mkdtemp(prefix=f"elmokit-profile-{workload}-{precision}-"))
    train, held = text
    (work / "wikitext.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (work / "held_out.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    config, _ = workload_config(workload, work, args.warmup + 2 * args.steps + 1)
    config.precision = precision
    trainer = build_trainer(config)
    trainer.lm.train()
    enter_determinism(config.deterministic)
    for _ in range(args.warmup):
        trainer.train_step(trainer.next_batch())
    start = time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step(trainer.next_batch())
    seconds = (time.perf_counter() - start) / args.steps
    return {"step_seconds": seconds, "families": profile_steps(trainer, args.steps)}


def cell(row: dict[str, float] | None, total: float, steps: int) -> str:
    if not row or row["calls"] == 0:
        return "—"
    share = 100 * row["us"] / total
    return f"{share:.1f} % ({row['calls'] / steps:,.0f} calls a step, {row['us'] / row['calls'] / 1000:.3f} ms each)"


def table(workload: str, results: dict[str, dict], steps: int) -> str:
    """The Markdown table of one workload (fp32 and bf16 columns)."""
    totals = {p: sum(r["us"] for r in res["families"].values()) for p, res in results.items()}
    lines = [f"**{workload}**", "", "| op | fp32 | bf16 |", "|---|---|---|"]
    for label in [f for f, _ in FAMILIES] + ["other"]:
        cells = [cell(results[p]["families"].get(label), totals[p], steps) for p in ("fp32", "bf16")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    fp32, bf16 = results["fp32"]["step_seconds"], results["bf16"]["step_seconds"]
    lines.append(f"| step time | {fp32:.3f} s | {bf16:.3f} s ({fp32 / bf16:.2f}×) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps, then as many profiled")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--held-out", type=int, default=300)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    machine = {"cpu": cpu_model(), "threads": args.threads, **mm_rates(args.threads)}
    print(f"CPU: {machine['cpu']}; torch.mm bf16/fp32 at 2048²: {machine['mm_bf16_over_fp32']:.2f}", flush=True)
    torch.set_num_threads(args.threads)
    text = wikitext_lines(args.held_out)
    summary: dict = {"machine": machine}
    for workload in args.workloads.split(","):
        results = {p: run(workload, p, args, text) for p in ("fp32", "bf16")}
        print(table(workload, results, args.steps) + "\n", flush=True)
        summary[workload] = {
            p: {
                "step_seconds": r["step_seconds"],
                "self_cpu_us_per_step": {k: v["us"] / args.steps for k, v in r["families"].items()},
            }
            for p, r in results.items()
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
