"""Where a single-sentence call's time goes, and what this machine's memory can stream.

Builds the same random "small"-configuration ``Elmo`` as ``bench/inference.py`` (weights written in the original
options.json + HDF5 layout, then loaded), embeds one 10-token sentence repeatedly (batch 1, 2 threads, inference
mode) and reports:

* the median latency of the whole ``Elmo`` call, and the time inside the char CNN, the highway layers, the token
  encoder as a whole, and the two LSTM stacks (each part timed inside whole calls, so caches are as in real use);
* the weight bytes such a call reads: the token encoder once, each LSTM layer's recurrent and projection weights at
  every one of its steps, and its input weights once;
* the rate at which 2 threads stream (``Tensor.sum``) working sets of 8 MB … 512 MB: the floor for the bytes above.

Run: ``python bench/latency_breakdown.py [--threads 2] [--calls 200]``. Benchmark on a quiet machine. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

SENTENCE = "The quick brown fox jumps over the lazy dog today".split()


def stream_rates(sizes_mb: list[int]) -> dict[int, float]:
    """GB/s of ``Tensor.sum`` over a float32 tensor of each size, repeated (the tensor stays wherever it fits)."""
    import torch

    rates = {}
    for mb in sizes_mb:
        x = torch.ones(mb * 1024 * 256)
        for _ in range(3):
            x.sum()
        n = max(3, 2000 // mb)
        start = time.perf_counter()
        for _ in range(n):
            x.sum()
        rates[mb] = mb / 1024 / ((time.perf_counter() - start) / n)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from inference import make_weights

    from elmokit import Elmo, batch_to_ids

    options, weights, opts = make_weights(Path(tempfile.mkdtemp(prefix="elmokit-latency-")), "small", args.seed)
    elmo = Elmo(str(options), str(weights), 1, dropout=0.0).eval()
    bilm = elmo.bilm
    encoder = bilm.token_encoder
    spent: dict[str, float] = collections.defaultdict(float)

    def timed(obj, name: str, label: str) -> None:
        inner = getattr(obj, name)

        def wrapper(*a, **k):
            start = time.perf_counter()
            out = inner(*a, **k)
            spent[label] += time.perf_counter() - start
            return out

        setattr(obj, name, wrapper)

    timed(encoder.char_cnn, "forward", "char_cnn")
    timed(encoder.highway, "forward", "highway")
    timed(encoder, "forward", "token_encoder")
    timed(bilm.bilstm, "forward", "lstm")
    latencies = []
    with torch.inference_mode():
        for _ in range(10):
            elmo(batch_to_ids([SENTENCE]))
        spent.clear()
        for _ in range(args.calls):
            start = time.perf_counter()
            elmo(batch_to_ids([SENTENCE]))
            latencies.append(time.perf_counter() - start)
    parts = {k: 1000 * v / args.calls for k, v in spent.items()}
    latency = 1000 * statistics.median(latencies)
    parts["rest"] = 1000 * sum(latencies) / args.calls - parts["token_encoder"] - parts["lstm"]

    cnn, lstm = opts["char_cnn"], opts["lstm"]
    n_filters = sum(n for _, n in cnn["filters"])
    d = cnn["embedding"]["dim"]
    encoder_bytes = 4 * (
        sum(w * d * n for w, n in cnn["filters"])
        + cnn["n_highway"] * 2 * n_filters * n_filters
        + n_filters * lstm["projection_dim"]
    )
    p, h = lstm["projection_dim"], lstm["dim"]
    steps = len(SENTENCE) + 1  # <S> w1 … w10 (each direction skips its last boundary step)
    per_step = 4 * 2 * (p * 4 * h + h * p)  # both directions: W_hh and W_proj
    lstm_bytes = lstm["n_layers"] * (steps * per_step + 4 * 2 * p * 4 * h)
    rates = stream_rates([8, 32, 64, 96, 128, 256, 512])
    result = {
        "threads": torch.get_num_threads(),
        "tokens": len(SENTENCE),
        "latency_ms": latency,
        "parts_ms": {k: round(v, 3) for k, v in parts.items()},
        "weight_mb_read_per_call": {"token_encoder": encoder_bytes / 1e6, "lstm": lstm_bytes / 1e6},
        "stream_gb_per_s_by_working_set_mb": {str(k): round(v, 1) for k, v in rates.items()},
    }
    print(
        f"latency {latency:.2f} ms (median of {args.calls}); per call: char CNN {parts['char_cnn']:.2f}, highway "
        f"{parts['highway']:.2f}, token encoder {parts['token_encoder']:.2f}, LSTMs {parts['lstm']:.2f}, the rest "
        f"{parts['rest']:.2f} ms"
    )
    print(
        f"weights read per call: token encoder {encoder_bytes / 1e6:.1f} MB once, LSTMs {lstm_bytes / 1e6:.1f} MB "
        f"({steps} steps per direction and layer)"
    )
    print("streaming rate (2 threads, Tensor.sum): " + ", ".join(f"{k} MB {v:.0f} GB/s" for k, v in rates.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
