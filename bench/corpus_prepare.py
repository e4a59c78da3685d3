"""The cost of preparing the zoo's staged pretraining text, and of reading compressed training corpora.

1. Tokenisation: the first ``--mb`` MB (decompressed) of each staged source of ``../shared/data`` (``en-*``: the
   sentence splitter + sacremoses; ``zh-*``: the splitter + jieba; :mod:`elmokit.recipes.zoo.pretext`), timed in CPU
   seconds on one thread, and the whole source's time extrapolated from its uncompressed size (``SOURCE.md``).
2. Decompression: the same text written as ``.xz``, ``.gz`` and ``.bz2`` shards (and plain) into ``--work``, read
   whole by :class:`elmokit.data.TextCorpus` (what ``elmokit train`` does each epoch): MB of text per second each.

Run it on a quiet machine, one thread:

    OMP_NUM_THREADS=1 flock /tmp/elmokit-cpu.lock python bench/corpus_prepare.py --mb 1 --work /tmp/corpus-prepare

The last line is one JSON object: per source words (en) or characters (zh) per CPU second and the extrapolated
minutes for the whole source and language, and per compression format the reading rate and its ratio to plain text.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import time
from pathlib import Path

from elmokit.data import TextCorpus
from elmokit.recipes.zoo.readers import _raw_en_document, raw_zh_document
from elmokit.recipes.zoo.sources import RECIPES, resolve_data_dir


def _sample(paths: list[Path], nbytes: int) -> tuple[list[str], int]:
    lines, n = [], 0
    for path in paths:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                lines.append(line.rstrip("\n"))
                n += len(line.encode("utf-8"))
                if n >= nbytes:
                    return lines, n
    return lines, n


def _uncompressed_size(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with lzma.open(path, "rb") as f:
            while block := f.read(1 << 24):
                total += len(block)
    return total


def tokenise(data: Path, nbytes: int) -> dict:
    out: dict = {}
    raw_zh_document("热身")  # jieba's dictionary loads once, outside the timing
    _raw_en_document(["Warm up."])
    for lang in ("en", "zh"):
        for src in (s for s in RECIPES[lang].sources if s.ngram_filter):
            paths = [data / src.folder / f for f in src.files]
            lines, n = _sample(paths, nbytes)
            units = sum(len(x.split()) for x in lines) if lang == "en" else sum(len("".join(x.split())) for x in lines)
            t0 = time.process_time()
            for x in lines:
                if x.strip():
                    _raw_en_document([x]) if lang == "en" else raw_zh_document(x)
            cpu = time.process_time() - t0
            whole = _uncompressed_size(paths)
            out[src.name] = {
                "sample_bytes": n,
                ("words" if lang == "en" else "characters"): units,
                "cpu_s": round(cpu, 3),
                "per_cpu_s": round(units / cpu),
                "whole_source_minutes": round(cpu * whole / n / 60, 1),
            }
    return out


def decompression(data: Path, work: Path, nbytes: int) -> dict:
    src = next(s for s in RECIPES["en"].sources if s.name == "en-wikipedia-2021")
    lines, _ = _sample([data / src.folder / src.files[0]], nbytes)
    text = ("\n".join(x for x in lines if x) + "\n").encode("utf-8")
    work.mkdir(parents=True, exist_ok=True)
    writers = {"txt": lambda b: b, "txt.xz": lzma.compress, "txt.gz": gzip.compress, "txt.bz2": bz2.compress}
    out: dict = {}
    for suffix, compress in writers.items():
        path = work / f"shard.{suffix}"
        path.write_bytes(compress(text))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            n = sum(1 for _ in TextCorpus(str(path)))
            best = min(best, time.perf_counter() - t0)
        out[suffix] = {
            "file_bytes": path.stat().st_size,
            "sentences": n,
            "text_mb_per_s": round(len(text) / best / 1e6, 1),
        }
    for suffix in writers:
        out[suffix]["ratio_to_plain"] = round(out[suffix]["text_mb_per_s"] / out["txt"]["text_mb_per_s"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=1.0, help="MB of decompressed text per source (default 1)")
    parser.add_argument("--work", default="/tmp/corpus-prepare", help="folder for the compressed shards")
    parser.add_argument("--data-dir", default=None, help="the shared data folder (default ../shared/data)")
    args = parser.parse_args()
    data = resolve_data_dir(args.data_dir)
    nbytes = int(args.mb * 1e6)
    tok = tokenise(data, nbytes)
    for lang, key in (("en", "words"), ("zh", "characters")):
        rows = [v for k, v in tok.items() if k.startswith(f"{lang}-")]
        tok[f"{lang}_total_minutes"] = round(sum(r["whole_source_minutes"] for r in rows), 1)
        print(f"{lang}: " + ", ".join(f"{r[key]:,} {key} at {r['per_cpu_s']:,}/s" for r in rows))
    print(json.dumps({"tokenise": tok, "read_compressed": decompression(data, Path(args.work), nbytes)}))


if __name__ == "__main__":
    main()
