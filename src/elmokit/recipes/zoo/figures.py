"""The figures of a zoo build, all under the biLM's perplexity protocol
(:func:`elmokit.pretraining.evaluate_perplexity`: each sentence from a zero state, ``n + 1`` targets per direction,
unknown words as ``<UNK>``): held-out perplexity of the final model beside an add-one unigram and an interpolated
Kneser-Ney 3-gram (:func:`elmokit.baselines.ngram.kneser_ney_perplexity`, discount 0.75) fitted on ``train.txt`` over
the biLM's vocabulary; WikiText-2 test for English (:func:`wikitext_sentences`); the training run's figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from elmokit.baselines.ngram import kneser_ney_perplexity
from elmokit.errors import DataError, MissingFileError
from elmokit.io import file_sha256
from elmokit.pretraining import evaluate_perplexity, unigram_perplexity
from elmokit.vocabulary import UNK

__all__ = [
    "WIKITEXT_PROTOCOL",
    "wikitext_sentences",
    "valid_records",
    "heldout_figures",
    "wikitext_figures",
    "training_figures",
]

_WIKITEXT_MARKERS = {"@-@": "-", "@,@": ",", "@.@": "."}
_SENTENCE_END = frozenset({".", "!", "?"})
#: How WikiText-2 test is scored (written to the card): :func:`wikitext_sentences`, then the held-out protocol.
WIKITEXT_PROTOCOL = (
    "blank lines and section headings (`= … =` lines) are dropped; each paragraph line is cut into sentences after "
    "the tokens `.`, `!` and `?`; WikiText's markers `@-@`, `@,@`, `@.@` become the plain tokens `-`, `,`, `.` (after "
    "the cut, so `3 @.@ 5` ends no sentence; our training text has no such markers); WikiText's own `<unk>` becomes "
    "the model's `<UNK>` (its input is the characters of `<UNK>`); every sentence is scored like held-out text (its "
    "words plus one boundary per direction), and any other word outside the vocabulary is read as `<UNK>` as a "
    "target (its own characters still go into the char CNN). The baselines score the same sentences over the same "
    "vocabulary."
)


def _cut_sentences(tokens: list[str]) -> list[list[str]]:
    """A paragraph line's tokens cut after each ``.``, ``!`` and ``?`` (a trailing rest is a sentence too)."""
    sentences: list[list[str]] = []
    current: list[str] = []
    for tok in tokens:
        current.append(tok)
        if tok in _SENTENCE_END:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def wikitext_sentences(path: str | os.PathLike) -> tuple[list[list[str]], dict]:
    """WikiText-2's (tokenised) test file as the biLM's sentences, and what was done to it (:data:`WIKITEXT_PROTOCOL`).

    Blank lines and section headings (``= … =`` lines) are dropped; each paragraph line is cut into
    sentences after the tokens ``.``, ``!`` and ``?``; WikiText's number/hyphen markers ``@-@``, ``@,@``, ``@.@``
    become the plain tokens ``-``, ``,``, ``.`` (after the cut, so ``3 @.@ 5`` does not end a sentence: our training
    text has no such markers), and WikiText's own ``<unk>`` becomes the model's ``<UNK>``. Each sentence is then scored
    like held-out text: its words plus one boundary per direction, any word outside the model's vocabulary read as
    ``<UNK>`` (its characters still go into the char CNN; ``<unk>`` enters as the characters of ``<UNK>``).

    Returns ``(sentences, {"lines", "headings", "sentences", "words", "unk"})`` (``unk``: WikiText ``<unk>`` tokens).

    Raises:
        MissingFileError: no such file.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"WikiText-2 test file not found: {path} (expected wikitext-2/test.txt in the data folder)"
        )
    sentences: list[list[str]] = []
    stats = {"lines": 0, "headings": 0, "sentences": 0, "words": 0, "unk": 0}
    for line in path.read_text(encoding="utf-8").splitlines():
        tokens = line.split()
        if not tokens:
            continue
        stats["lines"] += 1
        if tokens[0] == "=" and tokens[-1] == "=":
            stats["headings"] += 1
            continue
        sentences.extend(_cut_sentences(tokens))
    out = []
    for s in sentences:
        mapped = [UNK if t == "<unk>" else _WIKITEXT_MARKERS.get(t, t) for t in s]
        stats["unk"] += sum(t == "<unk>" for t in s)
        stats["words"] += len(mapped)
        out.append(mapped)
    stats["sentences"] = len(out)
    return out, stats


def _records(metrics: Path, kind: str) -> list[dict]:
    """The ``"kind": kind`` records of a run's ``metrics.jsonl``, in order (lines that are not JSON, e.g. one cut by
    an interruption, are skipped)."""
    rows = []
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == kind:
            rows.append(r)
    return rows


def valid_records(metrics: Path) -> list[dict]:
    """The held-out evaluations (``"kind": "valid"`` records) of a run's ``metrics.jsonl``, in order."""
    return _records(metrics, "valid")


def modified_kneser_ney_5(train: list[list[str]], test: list[list[str]], vocab) -> dict:
    """The modified Kneser-Ney 5-gram (:func:`~elmokit.baselines.ngram.kneser_ney_perplexity` with
    ``discount="modified"``) reported beside the 3-gram, or ``{"unavailable": reason}`` when its discounts cannot be
    estimated (a corpus too small: some count of counts n1..n4 is 0)."""
    try:
        return kneser_ney_perplexity(train, test, vocab, order=5, discount="modified")
    except DataError as e:
        return {"unavailable": str(e)}


def heldout_figures(lm, train: list[list[str]], held: list[list[str]], final: dict | None) -> dict:
    """Held-out perplexity of the biLM ``lm`` (from the run's ``final`` valid record of the last step, or measured
    again when it is ``None``) beside the add-one unigram and the Kneser-Ney 3-gram fitted on ``train`` over
    ``lm.vocab``, and the modified Kneser-Ney 5-gram (:func:`modified_kneser_ney_5`): ``{"bilm": {"forward",
    "backward", "average", "tokens", "sentences"}, "unigram_add_one", "kneser_ney_3", "kneser_ney_5_modified"}``."""
    if final is None:  # (only when the metrics were lost) measure it again
        ppl = evaluate_perplexity(lm, held)
    else:
        ppl = {
            "forward": final["valid_ppl_fwd"],
            "backward": final["valid_ppl_bwd"],
            "average": final["valid_ppl"],
            "tokens": final["valid_tokens"],
            "sentences": final["valid_sentences"],
        }
    return {
        "bilm": ppl,
        "unigram_add_one": unigram_perplexity(train, held, lm.vocab),
        "kneser_ney_3": kneser_ney_perplexity(train, held, lm.vocab, order=3),
        "kneser_ney_5_modified": modified_kneser_ney_5(train, held, lm.vocab),
    }


def wikitext_figures(lm, train: list[list[str]], path: Path) -> dict:
    """WikiText-2 test (``path``, read by :func:`wikitext_sentences`) under the held-out protocol: the biLM, the
    unigram, the Kneser-Ney 3-gram and the modified 5-gram, with the file's sha256, its counts and OOV rates
    (``oov_rate`` counts WikiText's ``<unk>`` too, ``oov_rate_without_unk`` only the other words outside
    ``lm.vocab``).

    Raises:
        MissingFileError: no such file."""
    wt, wt_stats = wikitext_sentences(path)
    words = [t for s in wt for t in s]
    oov = sum(1 for t in words if t != UNK and t not in lm.vocab)
    return {
        "file": str(path),
        "sha256": file_sha256(path),
        **wt_stats,
        "oov_words": oov,
        "oov_rate": (oov + wt_stats["unk"]) / max(1, len(words)),
        "oov_rate_without_unk": oov / max(1, len(words)),
        "bilm": evaluate_perplexity(lm, wt),
        "unigram_add_one": unigram_perplexity(train, wt, lm.vocab),
        "kneser_ney_3": kneser_ney_perplexity(train, wt, lm.vocab, order=3),
        "kneser_ney_5_modified": modified_kneser_ney_5(train, wt, lm.vocab),
        "protocol": WIKITEXT_PROTOCOL,
    }


def run_tokens_per_s(metrics: Path) -> float | None:
    """The mean of the ``tokens_per_s`` that a run's ``metrics.jsonl`` logged over its training steps (``"kind":
    "train"`` records, every session of a resumed run), or ``None`` where it logged none: the speed of a resumed build,
    whose last session may have trained no step at all."""
    speeds = [
        float(r["tokens_per_s"]) for r in _records(metrics, "train") if isinstance(r.get("tokens_per_s"), (int, float))
    ]
    return round(sum(speeds) / len(speeds), 1) if speeds else None


def training_figures(
    summary: dict,
    valid: list[dict],
    manifest: dict,
    *,
    resumed: bool,
    loadavg: tuple[list[float] | None, list[float] | None],
    logged_tokens_per_s: float | None = None,
) -> dict:
    """The training run's figures for the card from the trainer's ``summary``, its ``valid`` records and the corpus
    ``manifest``: steps, tokens/s over the loop (one direction's targets), epochs (``None`` for a resumed session,
    whose token count covers only that session), the held-out curve and its best point, the load average before and
    after training; ``logged_tokens_per_s`` (:func:`run_tokens_per_s`) the whole run's logged speed."""
    train_file = manifest["files"]["train.txt"]
    best = min(valid, key=lambda r: r["valid_ppl"]) if valid else None
    loop = summary.get("loop_seconds") or 0.0
    training = {
        "steps": summary["steps"],
        "tokens_this_session": summary["tokens"],
        "targets_per_direction_per_epoch": train_file["tokens"] + train_file["sentences"],
        "epochs": None,
        "train_seconds": round(summary["seconds"], 1),
        "loop_seconds": round(loop, 1),
        "tokens_per_s": round(summary["tokens"] / loop, 1) if loop else None,
        "run_tokens_per_s": logged_tokens_per_s,
        "heldout_evaluations": len(valid),
        "resumed": bool(resumed),
        "final_loss": summary.get("final_loss"),
        "best_heldout": None if best is None else {"step": best["step"], "average": best["valid_ppl"]},
        "curve": [{"step": r["step"], "average": round(r["valid_ppl"], 2)} for r in valid],
        "loadavg_before": loadavg[0],
        "loadavg_after": loadavg[1],
    }
    if not resumed:
        training["epochs"] = round(summary["tokens"] / training["targets_per_direction_per_epoch"], 2)
    return training
