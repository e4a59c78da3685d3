"""First calls at new shapes, and process start to first vector: what a server's first requests and a short CLI run pay.

For each inference loop (``--loops``: ``torchscript`` = the TorchScript-compiled step loop, ``eager`` = the same
loop run by Python, ``ELMOKIT_TORCHSCRIPT=0``), a child process embeds, with a random model of the ``--preset`` shape,
6 batch shapes it has not seen (batch 1, 3, 17, 64; lengths 5 to 80), after one warm-up call at another shape:

* ``within_one_process``: per shape, the first call's seconds, the steady call's (the fastest of 3 repeats) and their
  ratio, all shapes in one process;
* ``fresh_process``: the same for each shape in a process of its own (its first call is then also the process's
  first call after the warm-up);
* ``embed_one_line``: seconds from process start to the end of ``elmokit embed`` of a one-line file
  (``python -m elmokit``; the model saved as a native folder first), the native kernels already built.

The last line is one JSON object. Run: ``python bench/cold_start.py [--preset small] [--threads 2]``. Quiet
machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(1, 5), (3, 17), (17, 40), (64, 23), (64, 80), (1, 60)]
WORDS = "the bank of a river is where money went to sit and wait for the boat on water while rates rose".split()


def child(args: argparse.Namespace) -> None:
    import random

    import torch

    torch.set_num_threads(args.threads)
    from elmokit import Embedder
    from elmokit.config import PRESETS
    from elmokit.modules.bilm import BiLM

    torch.manual_seed(0)
    embedder = Embedder(BiLM(PRESETS[args.preset]()), batch_size=128)
    rng = random.Random(0)

    def batch(b: int, t: int) -> list[list[str]]:
        return [[rng.choice(WORDS) for _ in range(t)] for _ in range(b)]

    embedder.embed_batch(batch(2, 4))  # warm-up at a shape not measured
    out = []
    for b, t in json.loads(args.shapes):
        x = batch(b, t)
        start = time.perf_counter()
        embedder.embed_batch(x)
        first = time.perf_counter() - start
        steady = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            embedder.embed_batch(x)
            steady = min(steady, time.perf_counter() - start)
        out.append({"batch": b, "length": t, "first_s": first, "steady_s": steady, "ratio": first / steady})
    print(json.dumps(out))


def run_child(loop: str, shapes: list, args: argparse.Namespace) -> list:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ELMOKIT_TORCHSCRIPT="1" if loop == "torchscript" else "0")
    argv = [sys.executable, __file__, "--child", "--preset", args.preset, "--threads", str(args.threads)]
    done = subprocess.run([*argv, "--shapes", json.dumps(shapes)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def embed_one_line(loop: str, args: argparse.Namespace, folder: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), ELMOKIT_TORCHSCRIPT="1" if loop == "torchscript" else "0")
    out = folder / f"out-{loop}.hdf5"
    out.unlink(missing_ok=True)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "elmokit", "embed", str(folder / "model"), str(folder / "one.txt"), str(out)],
        env=env,
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loops", default="torchscript,eager")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from elmokit.config import PRESETS
    from elmokit.modules.bilm import BiLM
    from elmokit.modules.native import kernels
    from elmokit.weights.native import save_pretrained

    kernels()  # built once here, not inside a timed process
    result: dict = {"preset": args.preset, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="elmokit-cold-") as tmp:
        folder = Path(tmp)
        torch.manual_seed(0)
        save_pretrained(BiLM(PRESETS[args.preset]()), folder / "model")
        (folder / "one.txt").write_text("The bank raised interest rates .\n", encoding="utf-8")
        for loop in args.loops.split(","):
            result[loop] = {
                "within_one_process": run_child(loop, SHAPES, args),
                "fresh_process": [run_child(loop, [shape], args)[0] for shape in SHAPES],
                "embed_one_line_s": min(embed_one_line(loop, args, folder) for _ in range(2)),
            }
            print(json.dumps({loop: result[loop]}), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
