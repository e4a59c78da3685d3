"""How much the held-out perplexity after a few equal steps depends on WHICH dropout masks were drawn (not on the
code): the spread that ``bench/train.py``'s "within 2 % of bb33407 after equal steps" check meets once the masks
change.

``elmokit.modules.dropout`` draws its masks from a hash of one generator draw (issue 40); bb33407 drew them with
``F.dropout``. Both keep each element with probability 1 − p; the masks differ. For a workload of ``bench/train.py``
(the same configuration, corpus, batches and steps: ``--warmup`` + ``--steps``, the quickstart 4× as many) this runs
four variants of THIS tree, fp32, one after the other:

* ``torch``: ``F.dropout`` (bb33407's masks: the same generator state at each call);
* ``torch, shifted``: ``F.dropout`` after one extra ``torch.rand(1)`` before each call (other masks, same law);
* ``hashed``: this tree's dropout;
* ``hashed, shifted``: the same after one extra draw.

and prints each variant's held-out perplexity (full softmax, zero state per sentence, as ``bench/train.py``) and the
per-step training loss and gradient norm. Where ``torch`` and ``torch, shifted`` already differ by more than 2 %, the
check after equal steps cannot tell the code apart from the masks: bilm-tf's settings (Adagrad, early loss spikes)
are chaotic in their first steps.

``--shifts K`` runs K shifted variants of each family (1 … K draws: K + 1 seeds a family) and prints each family's mean
and standard deviation: the fair comparison of the two kinds of mask.

Run: ``python bench/dropout_masks.py [--workload bilm-tf] [--steps 8] [--warmup 2] [--shifts 1]``. No timing: the
machine need not be quiet. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import WORKLOADS, wikitext_lines, workload_config  # noqa: E402  (bench/train.py)

import elmokit.modules.lstm as lstm_module  # noqa: E402
import elmokit.pretraining.objective as objective_module  # noqa: E402
from elmokit.allocator import keep_freed_memory  # noqa: E402
from elmokit.modules.dropout import dropout as hashed_dropout  # noqa: E402
from elmokit.pretraining.perplexity import evaluate_perplexity  # noqa: E402
from elmokit.pretraining.trainer import build_trainer, enter_determinism  # noqa: E402


def _torch_dropout(x, p, training=True):
    return F.dropout(x, p, training)


def _shifted(fn, draws: int = 1):
    def shifted(x, p, training=True):
        torch.rand(draws)  # draws from the default generator: the masks that follow are others
        return fn(x, p, training)

    return shifted


def variants(shifts: int) -> dict:
    """{name: dropout}: ``torch`` and ``hashed``, each also shifted by 1 … ``shifts`` draws before every call."""
    out = {}
    for family, fn in (("torch", _torch_dropout), ("hashed", hashed_dropout)):
        out[family] = fn
        for k in range(1, shifts + 1):
            out[f"{family}, shifted" + ("" if k == 1 else f" {k}")] = _shifted(fn, k)
    return out


VARIANTS = variants(1)


def run(workload: str, variant: str, steps: int, work: Path) -> dict:
    """``steps`` training steps of ``workload`` with ``variant``'s dropout, then the held-out perplexity."""
    lstm_module.dropout = objective_module.dropout = VARIANTS[variant]
    try:
        config, held_out = workload_config(workload, work, steps)
        trainer = build_trainer(config)
        trainer.lm.train()
        enter_determinism(config.deterministic)
        curve = []
        for _ in range(steps):
            result = trainer.train_step(trainer.next_batch())
            curve.append([round(result.loss, 3), round(result.grad_norm, 1)])
        trainer.lm.eval()
        with torch.no_grad():
            perplexity = evaluate_perplexity(trainer.lm, held_out)["average"]
    finally:
        lstm_module.dropout = objective_module.dropout = hashed_dropout
    return {"perplexity": perplexity, "loss_and_grad_norm": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=WORKLOADS, default="bilm-tf")
    ap.add_argument("--steps", type=int, default=8, help="as bench/train.py's (the quickstart: 4 times as many)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--held-out", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shifts", type=int, default=1, help="shifted variants per family (masks of other seeds)")
    args = ap.parse_args()
    VARIANTS.clear()
    VARIANTS.update(variants(args.shifts))
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    steps = args.warmup + args.steps * (4 if args.workload == "quickstart" else 1)
    work = Path(tempfile.mkdtemp(prefix="elmokit-dropout-masks-"))
    train, held = wikitext_lines(args.held_out)
    (work / "wikitext.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (work / "held_out.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    results = {}
    for variant in VARIANTS:
        results[variant] = run(args.workload, variant, steps, work)
        print(
            f"{args.workload} / {variant}: held-out perplexity {results[variant]['perplexity']:,.1f} after {steps} "
            f"steps; loss, grad norm per step {results[variant]['loss_and_grad_norm']}",
            flush=True,
        )
    base = results["torch"]["perplexity"]
    for variant, r in results.items():
        print(f"  {variant}: {r['perplexity'] / base:.3f} × torch's")
    families = {}
    for family in ("torch", "hashed"):
        values = [r["perplexity"] for v, r in results.items() if v.split(",")[0] == family]
        mean, sd = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
        families[family] = {"mean": mean, "sd": sd}
        print(f"  {family} masks ({len(values)} seeds): {mean:,.2f} ± {sd:,.2f}")
    print(f"  hashed / torch, means: {families['hashed']['mean'] / families['torch']['mean']:.3f}")
    print(json.dumps({"workload": args.workload, "steps": steps, "results": results, "families": families}))


if __name__ == "__main__":
    main()
