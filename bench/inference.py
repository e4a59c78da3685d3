"""Inference speed and memory: elmokit vs AllenNLP 2.10.1's ELMo, same weights, same sentences, one run.

Both sides load the same random "small"-configuration weights written in the original options.json + HDF5 layout,
embed the first 1,000 sentences of UD English-EWT dev (``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``) through
their ``Elmo`` module (one ScalarMix, dropout 0, fp32), each in its own child process so that memory is its own:

* tokens/s (real tokens only) with consecutive batches of 64 in file order, and with length-sorted batches of 64;
* single-sentence latency (10 tokens, batch 1; median of 200 calls after 10 warm-up calls: the median of 30 moved
  by ±10 % between runs), with elmokit's native kernels where they
  build (``native_kernels`` in elmokit's result; ``ELMOKIT_NATIVE=0`` measures without them);
* memory: peak RSS, and peak RSS above the child's own post-import baseline (after ``import torch`` and the library,
  before the model is built);
* the max abs difference of the two sides' outputs (AllenNLP's state reset before every batch, which makes it
  stateless like elmokit's default).

Useful FLOPs per token are counted from the configuration (char CNN + highway + projection + LSTM cells and
projections, each token counted once), and reported as a fraction of a ``torch.mm`` rate measured in the same run.

Run (see ``../shared/docs/peer-allennlp.md`` for the peer venv)::

    python bench/inference.py --peer-python .venv-peer/bin/python [--sentences 1000] [--threads 2]

Without ``--peer-python`` only elmokit is measured. Benchmark on a quiet machine. The last line is one JSON object.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import cpu_model, mm_rates  # noqa: E402  (bench/train.py: lscpu's model name, torch.mm rates at 2048²)

ROOT = Path(__file__).resolve().parents[1]
EWT_DEV = ROOT.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"


def read_conllu_forms(path: Path, n: int) -> list[list[str]]:
    """The FORM column of the first ``n`` sentences (multi-word token ranges and empty nodes skipped)."""
    sentences, current = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                if current:
                    sentences.append(current)
                    current = []
                    if len(sentences) == n:
                        break
                continue
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            if "-" in cols[0] or "." in cols[0]:
                continue
            current.append(cols[1])
    if current and len(sentences) < n:
        sentences.append(current)
    return sentences


def useful_flops_per_token(options: dict) -> float:
    """Multiply-adds × 2 per token of the biLM forward pass (each token once): char CNN, highway, projection, LSTMs."""
    cnn = options["char_cnn"]
    c, d = cnn["max_characters_per_token"], cnn["embedding"]["dim"]
    f = sum(2 * w * d * n * (c - w + 1) for w, n in cnn["filters"])
    n_filters = sum(n for _, n in cnn["filters"])
    f += cnn["n_highway"] * 2 * (2 * n_filters * n_filters)
    lstm = options["lstm"]
    p, h = lstm["projection_dim"], lstm["dim"]
    f += 2 * n_filters * p
    f += 2 * lstm["n_layers"] * (2 * p * 4 * h + 2 * p * 4 * h + 2 * h * p)
    return float(f)


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------------------------------------- child side
def import_elmo(side: str):
    """``(Elmo, batch_to_ids)`` of ``side`` (``"elmokit"`` or ``"allennlp"``). AllenNLP 2.10.1 is imported as
    ``peer-allennlp.md`` says: spacy and transformers first, and a stand-in ``torchvision`` module while its import
    runs when the real one cannot be imported beside torch 2.13."""
    if side != "allennlp":
        from elmokit import Elmo, batch_to_ids

        return Elmo, batch_to_ids
    import types

    import spacy  # noqa: F401
    import transformers  # noqa: F401

    fake = None
    try:
        import torchvision  # noqa: F401
    except Exception:
        fake = sys.modules["torchvision"] = types.ModuleType("torchvision")
    from allennlp.modules.elmo import Elmo, batch_to_ids

    if fake is not None:
        sys.modules.pop("torchvision", None)
    return Elmo, batch_to_ids


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    Elmo, batch_to_ids = import_elmo(args.child)
    baseline = _rss_mb()
    sentences = json.loads(Path(args.sentences).read_text(encoding="utf-8"))
    elmo = Elmo(args.options, args.weights, 1, dropout=0.0).eval()

    def reset() -> None:
        if args.child == "allennlp":
            elmo._elmo_lstm._elmo_lstm.reset_states()

    def run(batches: list[list[int]]) -> tuple[float, list]:
        outs = []
        start = time.perf_counter()
        with torch.inference_mode():
            for idx in batches:
                reset()
                out = elmo(batch_to_ids([sentences[i] for i in idx]))
                rep = out["elmo_representations"][0]
                outs.append((idx, rep, out["mask"]))
        return time.perf_counter() - start, outs

    b = args.batch_size
    file_order = [list(range(i, min(i + b, len(sentences)))) for i in range(0, len(sentences), b)]
    by_len = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    sorted_order = [by_len[i : i + b] for i in range(0, len(by_len), b)]
    n_tokens = sum(len(s) for s in sentences)
    run(file_order[:1])  # warm-up
    times_file, times_sorted = [], []
    outs = None
    for _ in range(args.repeats):
        t, o = run(file_order)
        times_file.append(t)
        outs = outs or o
        t, _ = run(sorted_order)
        times_sorted.append(t)
    # single-sentence latency: 10 tokens, batch 1
    one = [sentences[i] for i in range(len(sentences)) if len(sentences[i]) == 10][:1] or [sentences[0][:10]]
    lat = []
    with torch.inference_mode():
        for _ in range(10):
            reset()
            elmo(batch_to_ids(one))
        for _ in range(args.latency_repeats):
            reset()
            t = time.perf_counter()
            elmo(batch_to_ids(one))
            lat.append(time.perf_counter() - t)
    lat.sort()
    # outputs in sentence order, real tokens only, concatenated
    rows: list = [None] * len(sentences)
    for idx, rep, mask in outs:
        for j, i in enumerate(idx):
            rows[i] = rep[j][mask[j].bool()].float().numpy()
    np.save(args.outputs, np.concatenate(rows, axis=0))
    peak = _peak_rss_mb()
    result = {
        "side": args.child,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens": n_tokens,
        "tokens_per_s_file_order": n_tokens / min(times_file),
        "tokens_per_s_sorted": n_tokens / min(times_sorted),
        "seconds_file_order": times_file,
        "seconds_sorted": times_sorted,
        "latency_ms_10_tokens": 1000 * lat[len(lat) // 2],
        "baseline_rss_mb": baseline,
        "peak_rss_mb": peak,
        "memory_above_baseline_mb": peak - baseline,
    }
    if args.child != "allennlp":  # whether the batch-1 calls ran elmokit's C++ kernels (elmokit/modules/native.py)
        from elmokit.modules import native

        result["native_kernels"] = native.kernels() is not None
    Path(args.result).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------- parent side
def make_weights(folder: Path, preset: str, seed: int) -> tuple[Path, Path, dict]:
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from elmokit import PRESETS
    from elmokit.modules.bilm import BiLM
    from elmokit.weights.original import export_original

    torch.manual_seed(seed)
    model = BiLM(PRESETS[preset]())
    # random biases and a non-trivial scale so that every gate and clip path is exercised
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.uniform_(-0.1, 0.1)
    options, weights = export_original(model, folder)
    return options, weights, json.loads(options.read_text())


def bench_parser(description: str, repeats: int, repeats_help: str) -> argparse.ArgumentParser:
    """The options every elmokit-vs-AllenNLP bench takes (and the hidden ones of its child processes)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--peer-python", help="python of a venv with AllenNLP 2.10.1 (../shared/docs/peer-allennlp.md)")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seed", type=int, default=0)
    # child mode (internal)
    ap.add_argument("--child", choices=["elmokit", "allennlp"], help=argparse.SUPPRESS)
    ap.add_argument("--options", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--outputs", help=argparse.SUPPRESS)
    ap.add_argument("--sentences-file", dest="sentences_path", help=argparse.SUPPRESS)
    return ap


def run_sides(script: str, args: argparse.Namespace, prefix: str, outputs: str, extra: list[str]):
    """Write the random weights and the sentences once, run ``script`` as a child per side (elmokit here, AllenNLP
    with ``--peer-python``), and return ``(results per side, sentences, tmp folder, options dict)``; ``outputs`` is
    the child's output path under the folder (``{side}`` is replaced), ``extra`` more child arguments."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    options, weights, opts = make_weights(tmp, args.preset, args.seed)
    sentences = read_conllu_forms(EWT_DEV, args.sentences)
    (tmp / "sentences.json").write_text(json.dumps(sentences))
    sides = [("elmokit", sys.executable)] + ([("allennlp", args.peer_python)] if args.peer_python else [])
    results = {}
    for side, python in sides:
        env = dict(os.environ)
        if side == "elmokit":
            env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            python,
            script,
            "--child",
            side,
            "--options",
            str(options),
            "--weights",
            str(weights),
            "--sentences-file",
            str(tmp / "sentences.json"),
            "--result",
            str(tmp / f"{side}.json"),
            "--outputs",
            str(tmp / outputs.format(side=side)),
            "--threads",
            str(args.threads),
            "--batch-size",
            str(args.batch_size),
            "--repeats",
            str(args.repeats),
            *extra,
        ]
        subprocess.run(cmd, check=True, env=env)
        results[side] = json.loads((tmp / f"{side}.json").read_text())
        print(f"{side}: {json.dumps(results[side])}", flush=True)
    return results, sentences, tmp, opts


def main() -> None:
    ap = bench_parser(__doc__.split("\n")[0], 2, "timed passes per ordering (the best is reported)")
    ap.add_argument("--latency-repeats", type=int, default=200)
    args = ap.parse_args()
    if args.child:
        args.sentences = args.sentences_path
        child(args)
        return

    import numpy as np

    results, sentences, tmp, opts = run_sides(
        __file__, args, "elmokit-bench-", "{side}.npy", ["--latency-repeats", str(args.latency_repeats)]
    )
    rates = mm_rates(args.threads)
    gflops = rates["mm_gflops_fp32"]
    flops = useful_flops_per_token(opts)
    summary = {
        "preset": args.preset,
        "sentences": len(sentences),
        "tokens": results["elmokit"]["tokens"],
        "batch_size": args.batch_size,
        "threads": args.threads,
        "cpu": cpu_model(),
        "matmul_gflops": gflops,
        "mm_bf16_over_fp32": rates["mm_bf16_over_fp32"],
        "useful_mflop_per_token": flops / 1e6,
        "fp32_limit_tokens_per_s": gflops * 1e9 / flops,
    }
    for side, r in results.items():
        summary[side] = {
            k: r[k]
            for k in (
                "tokens_per_s_file_order",
                "tokens_per_s_sorted",
                "latency_ms_10_tokens",
                "peak_rss_mb",
                "memory_above_baseline_mb",
            )
        }
        summary[side]["fraction_of_matmul_limit"] = r["tokens_per_s_file_order"] * flops / (gflops * 1e9)
        if "native_kernels" in r:
            summary[side]["native_kernels"] = r["native_kernels"]
    if "allennlp" in results:
        e, a = results["elmokit"], results["allennlp"]
        summary["ratio_file_order"] = e["tokens_per_s_file_order"] / a["tokens_per_s_file_order"]
        summary["ratio_sorted"] = e["tokens_per_s_sorted"] / a["tokens_per_s_sorted"]
        summary["latency_ratio"] = e["latency_ms_10_tokens"] / a["latency_ms_10_tokens"]
        summary["memory_ratio"] = e["memory_above_baseline_mb"] / max(a["memory_above_baseline_mb"], 1e-9)
        summary["max_abs_diff"] = float(np.abs(np.load(tmp / "elmokit.npy") - np.load(tmp / "allennlp.npy")).max())
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
