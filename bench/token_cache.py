"""Token-embedding cache (``vocab_to_cache``) speed-up: elmokit vs AllenNLP 2.10.1's ELMo, same weights, one run.

The setting is that of ``bench/inference.py`` (whose helpers this script imports): random "small"-configuration
weights written in the original options.json + HDF5 layout, the first 1,000 sentences of UD English-EWT dev
(``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``), consecutive batches of 64 in file order, ``Elmo`` with one
ScalarMix, dropout 0, fp32, AllenNLP's state reset before every batch, each side in its own child process.

The cache is the sorted distinct tokens of those sentences, behind one padding entry: word id ``i`` means
``vocab[i]`` and id 0 is padding (the mask is ``word_ids > 0``), the contract of AllenNLP's
``Elmo(..., vocab_to_cache=vocab)`` (``_ElmoBiLm.create_cached_cnn_embeddings`` computes a row for every entry,
``forward`` masks with ``word_inputs > 0``), whose vocabularies put ``@@PADDING@@`` first; elmokit's
``TokenVectorCache`` documents the same contract. Every token of the text is in the cache, so this is the best case.

Per side:

* cache build time (s): warm, the best of ``--build-repeats`` direct calls of the cache builder on the loaded model
  (AllenNLP ``_ElmoBiLm.create_cached_cnn_embeddings``, elmokit ``TokenVectorCache``); cold, the ``Elmo(...)``
  construction time with ``vocab_to_cache`` minus that without (the first build in the process, which pays
  first-use costs: with the C library's default malloc settings, which both sides keep here, the first large
  temporaries are fresh ``mmap`` pages, see ``elmokit.allocator``);
* tokens/s (real tokens only, best of ``--repeats`` passes, the two modes interleaved) (a) without the cache:
  ``elmo(batch_to_ids(batch))``; (b) with it: ``elmo(batch_to_ids(batch), word_ids)``, character ids passed too
  (AllenNLP needs them: it falls back to them for ids outside the cache). Building the ids is timed in both modes;
* the speed-up (b)/(a), and the max abs difference between the cached and uncached outputs;
* a check that the cached path really ran: the first batch run with all-zero character ids beside its word ids
  must give the cached output (AllenNLP silently falls back to the characters when the cache lookup fails).

Across sides: elmokit/AllenNLP tokens/s ratios for both modes, and the max abs difference between the two sides'
cached (and uncached) outputs.

Run (see ``../shared/docs/peer-allennlp.md`` for the peer venv)::

    python bench/token_cache.py --peer-python .venv-peer/bin/python [--sentences 1000] [--threads 2]

Without ``--peer-python`` only elmokit is measured. Benchmark on a quiet machine. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference import _peak_rss_mb, bench_parser, import_elmo, run_sides  # noqa: E402

PADDING = "@@PADDING@@"


def cache_vocab(sentences: list[list[str]]) -> list[str]:
    """The word list to cache: a padding entry (id 0), then the sorted distinct tokens of ``sentences``."""
    return [PADDING] + sorted({t for s in sentences for t in s} - {PADDING})


# ---------------------------------------------------------------------------------------------- child side
def _import_side(side: str):
    """``(Elmo, batch_to_ids, build_cache)`` of one side; ``build_cache(elmo, vocab)`` rebuilds its token cache."""
    Elmo, batch_to_ids = import_elmo(side)
    if side == "allennlp":

        def build_cache(elmo, vocab):
            elmo._elmo_lstm.create_cached_cnn_embeddings(vocab)
    else:
        from elmokit.elmo import TokenVectorCache

        def build_cache(elmo, vocab):
            TokenVectorCache(elmo.bilm, vocab)

    return Elmo, batch_to_ids, build_cache


class _Passes:
    """Timed passes of one side over the sentences: ``run(elmo, use_cache, batches)`` embeds batches of sentence
    indices (AllenNLP's state reset before each batch), ``rows(outs)`` gathers the real tokens' vectors in sentence
    order, ``word_ids(batch)`` gives the cache's ids (0 = padding)."""

    def __init__(self, side: str, sentences: list[list[str]], vocab: list[str], batch_to_ids):
        self.side, self.sentences, self.batch_to_ids = side, sentences, batch_to_ids
        self.index = {w: i for i, w in enumerate(vocab)}

    def reset(self, elmo) -> None:
        if self.side == "allennlp":
            elmo._elmo_lstm._elmo_lstm.reset_states()

    def word_ids(self, batch: list[list[str]]):
        import torch

        ids = torch.zeros(len(batch), max(len(s) for s in batch), dtype=torch.long)
        for j, s in enumerate(batch):
            ids[j, : len(s)] = torch.tensor([self.index[w] for w in s], dtype=torch.long)
        return ids

    def run(self, elmo, use_cache: bool, batches: list[list[int]]) -> tuple[float, list]:
        import torch

        outs = []
        start = time.perf_counter()
        with torch.inference_mode():
            for idx in batches:
                self.reset(elmo)
                batch = [self.sentences[i] for i in idx]
                if use_cache:
                    out = elmo(self.batch_to_ids(batch), self.word_ids(batch))
                else:
                    out = elmo(self.batch_to_ids(batch))
                outs.append((idx, out["elmo_representations"][0], out["mask"]))
        return time.perf_counter() - start, outs

    def rows(self, outs: list):
        import numpy as np

        got: list = [None] * len(self.sentences)
        for idx, rep, mask in outs:
            for j, i in enumerate(idx):
                got[i] = rep[j][mask[j].bool()].float().numpy()
        return np.concatenate(got, axis=0)

    def cache_used(self, cached, first: list[list[str]]) -> bool:
        """The cached path really ran: all-zero character ids beside the word ids give the same output."""
        import torch

        with torch.inference_mode():
            self.reset(cached)
            chars = self.batch_to_ids(first)
            zero = cached(torch.zeros_like(chars), self.word_ids(first))["elmo_representations"][0]
            self.reset(cached)
            real = cached(chars, self.word_ids(first))["elmo_representations"][0]
        return bool(torch.equal(zero, real))


def _build_models(args: argparse.Namespace, Elmo, build_cache, vocab: list[str]) -> tuple:
    """``(plain, cached, init_plain, init_cached, builds)``: the two models, their construction times (the plain one
    first, so that the weight file is in the page cache) and the warm cache rebuilds' times."""
    t = time.perf_counter()
    plain = Elmo(args.options, args.weights, 1, dropout=0.0).eval()
    init_plain = time.perf_counter() - t
    t = time.perf_counter()
    cached = Elmo(args.options, args.weights, 1, dropout=0.0, vocab_to_cache=vocab).eval()
    init_cached = time.perf_counter() - t
    builds = []
    for _ in range(args.build_repeats):
        t = time.perf_counter()
        build_cache(cached, vocab)
        builds.append(time.perf_counter() - t)
    return plain, cached, init_plain, init_cached, builds


def _timed_passes(passes: _Passes, plain, cached, file_order: list[list[int]], repeats: int) -> tuple:
    """``(times_plain, times_cached, out_plain, out_cached)``: one warm-up batch each, then ``repeats`` passes of
    both modes interleaved (the outputs of the first pass kept)."""
    passes.run(plain, False, file_order[:1])  # warm-up
    passes.run(cached, True, file_order[:1])
    times_plain, times_cached = [], []
    out_plain = out_cached = None
    for _ in range(repeats):
        t, o = passes.run(plain, False, file_order)
        times_plain.append(t)
        out_plain = out_plain or o
        t, o = passes.run(cached, True, file_order)
        times_cached.append(t)
        out_cached = out_cached or o
    return times_plain, times_cached, out_plain, out_cached


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    Elmo, batch_to_ids, build_cache = _import_side(args.child)
    sentences = json.loads(Path(args.sentences).read_text(encoding="utf-8"))
    vocab = cache_vocab(sentences)
    plain, cached, init_plain, init_cached, builds = _build_models(args, Elmo, build_cache, vocab)
    passes = _Passes(args.child, sentences, vocab, batch_to_ids)

    b = args.batch_size
    file_order = [list(range(i, min(i + b, len(sentences)))) for i in range(0, len(sentences), b)]
    n_tokens = sum(len(s) for s in sentences)
    times_plain, times_cached, out_plain, out_cached = _timed_passes(passes, plain, cached, file_order, args.repeats)
    cache_used = passes.cache_used(cached, [sentences[i] for i in file_order[0]])
    a, c = passes.rows(out_plain), passes.rows(out_cached)
    np.save(args.outputs + ".plain.npy", a)
    np.save(args.outputs + ".cached.npy", c)
    tps_plain, tps_cached = n_tokens / min(times_plain), n_tokens / min(times_cached)
    result = {
        "side": args.child,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens": n_tokens,
        "vocab_size": len(vocab),
        "cache_build_s": min(builds),
        "cache_build_s_all": builds,
        "cache_build_s_cold": init_cached - init_plain,
        "init_s_without_cache": init_plain,
        "init_s_with_cache": init_cached,
        "tokens_per_s_without_cache": tps_plain,
        "tokens_per_s_with_cache": tps_cached,
        "speedup": tps_cached / tps_plain,
        "seconds_without_cache": times_plain,
        "seconds_with_cache": times_cached,
        "max_abs_diff_cached_vs_uncached": float(np.abs(a - c).max()),
        "cache_used": cache_used,
        "peak_rss_mb": _peak_rss_mb(),
    }
    Path(args.result).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------- parent side
def table(summary: dict, sides: list[str]) -> str:
    """A Markdown table of the per-side figures (and the elmokit/AllenNLP ratios when both sides ran)."""
    head = ["", *sides] + (["elmokit / AllenNLP"] if len(sides) == 2 else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, key: str, fmt: str, ratio: str | None = None) -> None:
        cells = [format(summary[s][key], fmt) for s in sides]
        if len(sides) == 2:
            cells.append(format(summary[ratio], ".2f") if ratio else "")
        lines.append("| " + " | ".join([label, *cells]) + " |")

    row("cache build, warm (s)", "cache_build_s", ".3f", "cache_build_ratio")
    row("cache build, cold: Elmo() with - without (s)", "cache_build_s_cold", ".2f")
    lines.append(
        "| "
        + " | ".join(
            ["Elmo() without / with cache (s)"]
            + [f"{summary[s]['init_s_without_cache']:.2f} / {summary[s]['init_s_with_cache']:.2f}" for s in sides]
            + ([""] if len(sides) == 2 else [])
        )
        + " |"
    )
    row("tokens/s without cache", "tokens_per_s_without_cache", ",.0f", "ratio_without_cache")
    row("tokens/s with cache", "tokens_per_s_with_cache", ",.0f", "ratio_with_cache")
    row("speed-up (with / without)", "speedup", ".2f")
    row("max |cached - uncached|", "max_abs_diff_cached_vs_uncached", ".2e")
    lines.append(
        "| cached path used | "
        + " | ".join(str(summary[s]["cache_used"]) for s in sides)
        + (" | |" if len(sides) == 2 else " |")
    )
    return "\n".join(lines)


def main() -> None:
    ap = bench_parser(__doc__.split("\n")[0], 3, "timed passes per mode (the best is reported)")
    ap.add_argument("--build-repeats", type=int, default=5, help="timed cache rebuilds (the best is reported)")
    args = ap.parse_args()
    if args.child:
        args.sentences = args.sentences_path
        child(args)
        return

    import numpy as np

    results, sentences, tmp, _ = run_sides(
        __file__, args, "elmokit-bench-cache-", "{side}", ["--build-repeats", str(args.build_repeats)]
    )
    summary = {
        "preset": args.preset,
        "sentences": len(sentences),
        "tokens": results["elmokit"]["tokens"],
        "vocab_size": results["elmokit"]["vocab_size"],
        "batch_size": args.batch_size,
        "threads": args.threads,
        "repeats": args.repeats,
    }
    keys = (
        "cache_build_s",
        "cache_build_s_cold",
        "init_s_without_cache",
        "init_s_with_cache",
        "tokens_per_s_without_cache",
        "tokens_per_s_with_cache",
        "speedup",
        "max_abs_diff_cached_vs_uncached",
        "cache_used",
        "peak_rss_mb",
    )
    for side, r in results.items():
        summary[side] = {k: r[k] for k in keys}
    if "allennlp" in results:
        e, a = results["elmokit"], results["allennlp"]
        summary["ratio_without_cache"] = e["tokens_per_s_without_cache"] / a["tokens_per_s_without_cache"]
        summary["ratio_with_cache"] = e["tokens_per_s_with_cache"] / a["tokens_per_s_with_cache"]
        summary["cache_build_ratio"] = e["cache_build_s"] / a["cache_build_s"]
        for mode in ("cached", "plain"):
            diff = np.abs(np.load(tmp / f"elmokit.{mode}.npy") - np.load(tmp / f"allennlp.{mode}.npy")).max()
            summary[f"max_abs_diff_sides_{mode}"] = float(diff)
    print(table(summary, list(results)))
    if "allennlp" in results:
        print(
            f"max |elmokit - AllenNLP|: cached {summary['max_abs_diff_sides_cached']:.2e}, "
            f"uncached {summary['max_abs_diff_sides_plain']:.2e}"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
