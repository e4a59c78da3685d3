"""The cost of a training corpus's fingerprint (``elmokit.pretraining.data.corpus_fingerprint``: size, mtime and
sha256 of each file, read in 1 MiB blocks), taken when a run starts and again at each ``--resume``.

Writes a text corpus of ``--size-mb`` MB (tokenised lines) into ``--work`` as ``--files`` shards, then times the
fingerprint three times (the files are in the page cache after writing them: this is the hashing cost; a cold read adds
the disk's read time) and, for comparison, BLAKE2b over the same bytes. Run it under the CPU lock on a quiet machine:

    flock /tmp/elmokit-cpu.lock python bench/corpus_fingerprint.py --size-mb 1024 --work /tmp/fp

The last line is one JSON object: MB/s of each pass, the median, and the seconds for 1 GB at the median rate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import time
from pathlib import Path

from elmokit.pretraining.data import FINGERPRINT_BLOCK, corpus_fingerprint


def write_corpus(folder: Path, size_mb: int, files: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    block = "".join(" ".join(rng.choice(words) for _ in range(12)) + " .\n" for _ in range(20000)).encode()
    per_file = size_mb * 10**6 // files
    paths = []
    for k in range(files):
        path = folder / f"shard-{k:03d}.txt"
        with open(path, "wb") as fh:
            written = 0
            while written < per_file:
                chunk = block[: per_file - written]
                fh.write(chunk)
                written += len(chunk)
        paths.append(path)
    return paths


def blake2b_rate(paths: list[Path]) -> float:
    start, total = time.perf_counter(), 0
    for path in paths:
        h = hashlib.blake2b()
        with open(path, "rb") as fh:
            while block := fh.read(FINGERPRINT_BLOCK):
                h.update(block)
                total += len(block)
    return total / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="corpus size in MB (10^6 bytes) (default: 1024)")
    parser.add_argument("--files", type=int, default=4, help="shards (default: 4)")
    parser.add_argument("--work", type=Path, required=True, help="folder for the corpus (deleted at the end)")
    args = parser.parse_args()
    paths = write_corpus(args.work, args.size_mb, args.files)
    total = sum(p.stat().st_size for p in paths)
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        corpus_fingerprint(paths)
        rates.append(total / 1e6 / (time.perf_counter() - start))
    blake = blake2b_rate(paths)
    for p in paths:
        p.unlink()
    os.rmdir(args.work)
    median = statistics.median(rates)
    print(
        json.dumps(
            {
                "bytes": total,
                "files": len(paths),
                "sha256_mb_per_s": [round(r) for r in rates],
                "sha256_median_mb_per_s": round(median),
                "seconds_per_gb": round(1000 / median, 2),
                "blake2b_mb_per_s": round(blake),
                "cpu": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
