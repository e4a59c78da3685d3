"""Benchmark: `elmokit embed` at scale — sentences/s and peak resident memory with 1 and 2 worker processes, memory
staying flat on a file 10× larger, the token-vector cache's speed-up, and the extra memory of one very long sentence.

Run by hand (not by CI)::

    python bench/embed_scale.py                 # 3,000 lines, then 30,000; tiny random model
    python bench/embed_scale.py --lines 100000 --scale 10 --long-tokens 10000

What it does, all with a tiny random-weight model (filters (1,4) (2,4) (3,8), 2 LSTM layers of 16 cells, projection 8)
saved to a temporary folder and text drawn from a fixed 2,000-word vocabulary (seeded):

1. ``elmokit embed MODEL in.txt out.h5 --format hdf5 --no-progress --part-size 500 [--workers 2]`` as a subprocess on
   both files, sampling the RSS of its whole process tree every 50 ms: wall time (start-up and merge included) →
   sentences/s, and the peak of the summed RSS.
2. In this process, ``Embedder.embed_file`` on the file ``--scale`` × larger in parts of 1/``parts`` of it, recording
   this process's RSS when each part is finished: RSS at 10 % and at 100 % of the parts, and after the merge.
3. ``Embedder.embed_sentences`` on the small file with and without ``vocab_to_cache`` (the whole vocabulary):
   sentences/s each and the ratio.
4. In a fresh subprocess, one sentence of ``--long-tokens`` distinct words through a random model of the released
   "small" architecture (13.6M parameters): the peak RSS above the model-loaded baseline.

The last line printed is one JSON object with every figure; ratios are to the 1-worker / uncached run of the same
invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def _tiny_model():
    import torch

    from elmokit import BiLM, CharCNNConfig, ElmoConfig, LSTMConfig

    torch.manual_seed(0)
    config = ElmoConfig(
        char_cnn=CharCNNConfig(filters=[(1, 4), (2, 4), (3, 8)], n_highway=1, embedding_dim=4),
        lstm=LSTMConfig(dim=16, projection_dim=8, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True),
    )
    return BiLM(config).eval()


def _vocabulary(n: int = 2000) -> list[str]:
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(n)})


def _write_text(path: Path, lines: int, vocab: list[str], seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(lines):
            fh.write(" ".join(rng.choices(vocab, k=rng.randint(3, 30))) + "\n")


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo.extend(int(c) for c in fh.read().split())
        except OSError:
            pass
    return out


def run_cli(model: Path, text: Path, out: Path, workers: int) -> dict:
    """One `elmokit embed` subprocess: wall seconds and the peak summed RSS of its process tree (MB)."""
    cmd = [
        sys.executable,
        "-m",
        "elmokit",
        "embed",
        str(model),
        str(text),
        str(out),
        "--format",
        "hdf5",
        "--no-progress",
        "--workers",
        str(workers),
        "--part-size",
        "500",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_rss_kb(p) for p in _tree(proc.pid)))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"embed failed: {proc.stderr.read().decode()}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 1024, 1)}


def flat_memory(model, text: Path, out: Path, lines: int, parts: int) -> dict:
    """Embed in this process; RSS (MB) when 10 % and 100 % of the parts are done, and after the merge."""
    from elmokit import Embedder
    from elmokit.embedding import writer as embed_output  # its _probe sees the parts as they are written

    seen: dict[int, int] = {}

    def probe(event, part, **info):
        if event == "part_done":
            seen[part] = _rss_kb(os.getpid())

    embed_output._probe = probe
    try:
        start = time.perf_counter()
        Embedder(model).embed_file(text, out, format="hdf5", part_size=max(1, lines // parts), progress=False)
        wall = time.perf_counter() - start
    finally:
        embed_output._probe = None
    done = sorted(seen)
    at10 = seen[done[max(0, len(done) // 10 - 1)]]
    return {
        "lines": lines,
        "parts": len(done),
        "sent_per_s": round(lines / wall, 1),
        "rss_at_10pct_mb": round(at10 / 1024, 1),
        "rss_at_100pct_mb": round(seen[done[-1]] / 1024, 1),
        "rss_after_merge_mb": round(_rss_kb(os.getpid()) / 1024, 1),
        "growth_10_to_100pct_mb": round((seen[done[-1]] - at10) / 1024, 1),
    }


def cache_speed(model, text: Path, vocab: list[str]) -> dict:
    from elmokit import Embedder

    sentences = [line.split() for line in text.read_text(encoding="utf-8").splitlines()]
    figures = {}
    for name, cache in (("uncached", None), ("cached", vocab)):
        emb = Embedder(model, vocab_to_cache=cache)
        list(emb.embed_sentences(sentences[:200]))  # warm-up
        start = time.perf_counter()
        for _ in emb.embed_sentences(sentences, layers="top"):
            pass
        figures[f"{name}_sent_per_s"] = round(len(sentences) / (time.perf_counter() - start), 1)
    figures["cache_speedup"] = round(figures["cached_sent_per_s"] / figures["uncached_sent_per_s"], 2)
    return figures


_LONG = r"""
import resource, sys, time, torch
sys.path.insert(0, sys.argv[2])
from elmokit import BiLM, Embedder
from elmokit.config import elmo_small
torch.manual_seed(0)
bilm = BiLM(elmo_small()).eval()
n, how = int(sys.argv[1]), sys.argv[3]
words = [f"w{i}" for i in range(n)]
if how == "embedder":
    emb = Embedder(bilm)
    emb.embed_sentence(["warm", "up"])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    out = emb.embed_sentence(words, layers="top")
else:  # the BiLM module itself (what Elmo and perplexity run): TokenEncoder on all the tokens at once
    from elmokit import batch_to_ids
    with torch.no_grad():
        bilm(batch_to_ids([["warm", "up"]]))
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        out = bilm(batch_to_ids([words])).layers[0, -1]
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{out.shape[0]} {base} {peak} {wall}")
"""


def long_sentence(tokens: int, how: str = "embedder") -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _LONG, str(tokens), str(REPO / "src"), how], capture_output=True, text=True
    )
    if res.returncode:
        return {"error": res.stderr.strip().splitlines()[-1:]}
    n, base, peak, wall = res.stdout.split()
    return {
        "tokens": int(n),
        "extra_peak_rss_mb": round((int(peak) - int(base)) / 1024, 1),
        "wall_s": round(float(wall), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=3000, help="lines of the small file (default: %(default)s)")
    ap.add_argument("--scale", type=int, default=10, help="the large file is this many times larger (default: 10)")
    ap.add_argument("--parts", type=int, default=30, help="parts of the large file (default: %(default)s)")
    ap.add_argument(
        "--long-tokens", type=int, default=10000, help="tokens of the long sentence, 0 to skip (default: %(default)s)"
    )
    args = ap.parse_args()
    from elmokit.weights.native import save_pretrained

    vocab = _vocabulary()
    model = _tiny_model()
    result: dict = {"bench": "embed_scale", "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_pretrained(model, tmp / "model")
        small, large = tmp / "small.txt", tmp / "large.txt"
        _write_text(small, args.lines, vocab, 2)
        _write_text(large, args.lines * args.scale, vocab, 3)
        result["small_file_mb"] = round(small.stat().st_size / 2**20, 2)
        result["large_file_mb"] = round(large.stat().st_size / 2**20, 2)
        for name, text, lines in (("small", small, args.lines), ("large", large, args.lines * args.scale)):
            for workers in (1, 2):
                r = run_cli(tmp / "model", text, tmp / f"w{workers}.h5", workers)
                r["sent_per_s"] = round(lines / r["wall_s"], 1)  # wall time includes start-up and the merge
                result[f"{name}_workers_{workers}"] = r
                print(f"{name} file, workers={workers}: {r}", flush=True)
            result[f"{name}_workers_2_over_1_speed"] = round(
                result[f"{name}_workers_2"]["sent_per_s"] / result[f"{name}_workers_1"]["sent_per_s"], 2
            )
        result["flat_memory"] = flat_memory(model, large, tmp / "large.h5", args.lines * args.scale, args.parts)
        print(f"flat memory: {result['flat_memory']}", flush=True)
        result["token_cache"] = cache_speed(model, small, vocab)
        print(f"token cache: {result['token_cache']}", flush=True)
    if args.long_tokens:
        result["long_sentence_small_config"] = long_sentence(args.long_tokens)
        print(f"long sentence (Embedder): {result['long_sentence_small_config']}", flush=True)
        result["long_sentence_small_config_bilm"] = long_sentence(args.long_tokens, "bilm")
        print(f"long sentence (BiLM module, as Elmo runs it): {result['long_sentence_small_config_bilm']}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
