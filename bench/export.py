"""Eager biLM vs its ``.pt2`` (torch.export + AOTInductor) and ONNX Runtime exports on CPU: latency, tokens/s, the
largest difference from eager, file sizes, export times.

A random model of ``--preset`` (seed 0; ``small`` by default: the figures are about speed, and the exported programs
do not depend on the weights' values) is exported in this process to a temporary folder in both formats
(:func:`elmokit.export.export_model`) and loaded with :func:`elmokit.export.load_exported`. Two inputs, real text:
batch 1 = the first sentence of UD English-EWT dev with exactly 10 tokens; batch 64 = the first 64 sentences (mixed
lengths). Each path runs ``--warmup`` calls, then ``--repeats`` timed calls; the median is reported. Eager is
``BiLM.forward(char_ids)`` under ``torch.no_grad`` (all layers, state returned: the exported programs' outputs);
torch and ONNX Runtime both get ``--threads`` threads (ORT: intra-op threads, 1 inter-op).

Prints one JSON line per (input, path), then one JSON line with all figures and each export's latency ratio to eager
(< 1 = faster than eager), as ``bench/*.py`` do.

Run: ``python bench/export.py [--preset small] [--threads 2] [--repeats 50] [--warmup 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from inference import EWT_DEV, read_conllu_forms  # bench/inference.py: the same sentences


def timed(fn, warmup: int, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inputs(n_batch: int) -> dict[str, list[list[str]]]:
    """``batch1``: the first 10-token sentence of EWT dev; ``batch64``: its first ``n_batch`` sentences."""
    sentences = read_conllu_forms(EWT_DEV, 2000)
    ten = next(s for s in sentences if len(s) == 10)
    return {"batch1": [ten], f"batch{n_batch}": sentences[:n_batch]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", type=Path, help="folder to keep the exported files in (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from elmokit import batch_to_ids
    from elmokit.config import PRESETS
    from elmokit.export import export_model, load_exported
    from elmokit.modules.bilm import BiLM

    torch.manual_seed(0)
    bilm = BiLM(PRESETS[args.preset]()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        models, export_s, size_mb = {}, {}, {}
        for kind in ("pt2", "onnx"):
            start = time.perf_counter()
            path = export_model(bilm, folder / f"{args.preset}.{kind}", kind)
            export_s[kind] = time.perf_counter() - start
            size_mb[kind] = path.stat().st_size / 2**20
            models[kind] = load_exported(path, threads=args.threads)
            print(json.dumps({"export": kind, "seconds": round(export_s[kind], 2), "mib": round(size_mb[kind], 1)}))
        results = {}
        for name, sentences in inputs(args.batch).items():
            ids = batch_to_ids(sentences)
            tokens = sum(len(s) for s in sentences)
            with torch.no_grad():
                reference = bilm(ids)
            runs = {"eager": lambda ids=ids: bilm(ids)}
            runs.update({kind: (lambda m=m, ids=ids: m(ids)) for kind, m in models.items()})
            for path_name, fn in runs.items():
                with torch.no_grad():
                    seconds = timed(fn, args.warmup, args.repeats)
                    out = fn()
                diff = float((out.layers - reference.layers).abs().max())
                row = {
                    "input": name,
                    "path": path_name,
                    "rows": len(sentences),
                    "tokens": tokens,
                    "latency_ms": round(seconds * 1e3, 3),
                    "tokens_per_s": round(tokens / seconds, 1),
                    "max_abs_diff": diff,
                }
                results[(name, path_name)] = row
                print(json.dumps(row), flush=True)
    summary = {
        "bench": "export",
        "preset": args.preset,
        "threads": args.threads,
        "torch": torch.__version__,
        "export_seconds": {k: round(v, 2) for k, v in export_s.items()},
        "file_mib": {k: round(v, 1) for k, v in size_mb.items()},
        "rows": list(results.values()),
        "latency_ratio_to_eager": {
            f"{name}/{kind}": round(results[(name, kind)]["latency_ms"] / results[(name, "eager")]["latency_ms"], 3)
            for (name, kind) in results
            if kind != "eager"
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
