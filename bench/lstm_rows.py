"""The biLSTM without autograd by batch rows: the C++ step loop against the batched-GEMM loop, in the same run.

``elmokit.modules.native.MAX_LSTM_ROWS`` sends batches of up to that many rows to the C++ kernel and larger ones to
the TorchScript loop that does both directions per step in one batched product; this script measures both paths on
the same inputs so that the threshold follows a measurement. For each row count it runs the random-weight biLSTM of
a released configuration (``--preset``: small, LSTM 1024 → 128; original, 4096 → 512) over rows of 5 … 20 steps
(lengths drawn with a fixed seed, sorted, the same for both paths) and reports real positions per second through both
paths and their ratio (> 1: the kernel is faster).

Run (on a quiet machine)::

    python bench/lstm_rows.py --preset small --threads 1
    python bench/lstm_rows.py --preset small --threads 2
    python bench/lstm_rows.py --preset original --threads 2 --rows 1,8,32,64

The last line is one JSON object. Without the native kernels (no compiler) it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def positions_per_s(lstm, x, lengths, seconds: float) -> float:
    """Real positions per second of ``lstm(x, lengths)`` under ``no_grad``: one warm-up call, then calls for at
    least ``seconds`` (at least three)."""
    import torch

    with torch.no_grad():
        lstm(x, lengths)
        calls, start = 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - start < seconds:
            lstm(x, lengths)
            calls += 1
        elapsed = time.perf_counter() - start
    return int(lengths.sum()) * calls / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["small", "original"], default="small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,4,8,16,32,64", help="comma-separated row counts")
    p.add_argument("--seconds", type=float, default=1.0, help="per path and row count")
    args = p.parse_args()

    import torch

    from elmokit import elmo_original, elmo_small
    from elmokit.modules import native
    from elmokit.modules.bilm import BiLM

    torch.set_num_threads(args.threads)
    if native.kernels() is None:
        print(json.dumps({"error": "the native kernels are unavailable here", "status": native.status()}))
        return
    torch.manual_seed(0)
    config = {"small": elmo_small, "original": elmo_original}[args.preset]()
    lstm = BiLM(config).eval().bilstm
    generator = torch.Generator().manual_seed(1)
    limit = native.MAX_LSTM_ROWS
    results = []
    try:
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(2, rows, 20, lstm.projection_dim, generator=generator) * 0.5
            lengths = torch.randint(5, 21, (rows,), generator=generator).sort(descending=True).values
            rates = {}
            for path, rows_limit in (("kernel", 1 << 30), ("gemm", 0)):
                native.MAX_LSTM_ROWS = rows_limit
                rates[path] = positions_per_s(lstm, x, lengths, args.seconds)
            row = {"rows": rows, "kernel_per_s": round(rates["kernel"]), "gemm_per_s": round(rates["gemm"])}
            row["kernel_vs_gemm"] = round(rates["kernel"] / rates["gemm"], 3)
            results.append(row)
            print(json.dumps(row), flush=True)
    finally:
        native.MAX_LSTM_ROWS = limit
    print(
        json.dumps({"preset": args.preset, "threads": args.threads, "max_lstm_rows": limit, "rows": results}),
        flush=True,
    )


if __name__ == "__main__":
    main()
