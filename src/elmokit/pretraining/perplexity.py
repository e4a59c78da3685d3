"""Held-out perplexity (full softmax) and per-sentence scores of a trained biLM, plus a unigram baseline."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from elmokit.data.text_checks import unk_targets
from elmokit.errors import DataError, UsageError
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.vocabulary import Vocabulary

__all__ = ["evaluate_perplexity", "perplexity_sums", "unigram_perplexity", "score_sentences"]


def _check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be an int >= 1 (sentences per batch), got {batch_size!r}")


def _batches(sentences: Iterable[Sequence[str]], batch_size: int):
    batch: list[Sequence[str]] = []
    for s in sentences:
        batch.append(s)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def evaluate_perplexity(
    lm: BidirectionalLM, sentences: Iterable[Sequence[str]], batch_size: int = 64
) -> dict[str, float]:
    """Perplexity of held-out sentences with the full softmax, each sentence read independently from a zero state.

    Per direction: ``exp(mean NLL)`` over its n + 1 targets per sentence (forward ``w1 … wn </S>``, backward
    ``<S> w1 … wn``; unknown words count as ``<UNK>``). ``average`` = ``exp(0.5 · (NLL_fwd + NLL_bwd))``, bilm-tf's
    "average perplexity". Returns ``{"forward", "backward", "average", "tokens", "sentences", "unk_targets",
    "unk_share"}``: ``tokens`` = targets per direction, ``unk_targets`` = how many of them are ``<UNK>`` (words
    outside the vocabulary; :func:`elmokit.data.text_checks.unk_targets`), ``unk_share`` = their share. A perplexity
    over many ``<UNK>`` targets is low and says little (see :data:`elmokit.data.text_checks.UNK_WARN_SHARE`).

    Args:
        batch_size: sentences per forward pass (>= 1); it changes speed and memory, not the result.

    Raises:
        UsageError: ``batch_size`` is not an int >= 1.
        DataError: no sentences.
    """
    sentences = sentences if isinstance(sentences, Sequence) else list(sentences)  # read twice
    total_f, total_b, n_tok, n_sent = perplexity_sums(lm, sentences, batch_size)
    if n_tok == 0:
        raise DataError("no sentences to evaluate: the input holds no non-empty sentence")
    unknown, _ = unk_targets(lm.vocab, sentences)
    return {**perplexities(total_f, total_b, n_tok, n_sent), "unk_targets": unknown, "unk_share": unknown / n_tok}


def perplexities(total_f: float, total_b: float, n_tok: int, n_sent: int) -> dict[str, float]:
    """:func:`evaluate_perplexity`'s dict from :func:`perplexity_sums`' figures (possibly added up over processes)."""
    f, b = total_f / n_tok, total_b / n_tok
    return {
        "forward": _exp(f),
        "backward": _exp(b),
        "average": _exp(0.5 * (f + b)),
        "tokens": int(n_tok),
        "sentences": int(n_sent),
    }


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


def perplexity_sums(
    lm: BidirectionalLM, sentences: Iterable[Sequence[str]], batch_size: int = 64
) -> tuple[float, float, int, int]:
    """The sums behind :func:`evaluate_perplexity`: ``(NLL_fwd, NLL_bwd, targets, sentences)``, NLLs in nats summed in
    float64 over every target (full softmax, eval mode, no autograd). Sums of disjoint sets of sentences add up, so
    processes that each evaluate their share can add theirs. The model is left in eval mode.

    Raises:
        UsageError: ``batch_size`` is not an int >= 1.
    """
    _check_batch_size(batch_size)
    lm.eval()
    total_f = total_b = 0.0
    n_tok = n_sent = 0
    with torch.no_grad():
        for batch in _batches(sentences, batch_size):
            nll = lm.sentence_nll(batch)
            total_f += float(nll.forward.double().sum())
            total_b += float(nll.backward.double().sum())
            n_tok += int(nll.forward.numel())
            n_sent += len(batch)
    return total_f, total_b, n_tok, n_sent


def unigram_perplexity(
    train_sentences: Iterable[Sequence[str]], test_sentences: Iterable[Sequence[str]], vocab: Vocabulary
) -> float:
    """Perplexity of an add-one-smoothed unigram model over ``vocab`` (same targets as :func:`evaluate_perplexity`:
    every word, mapped to ``<UNK>`` when unknown, plus one sentence boundary per sentence).

    Raises:
        DataError: no test sentences.
    """
    counts: Counter[int] = Counter()
    for s in train_sentences:
        counts.update(vocab.encode(s))
        counts[vocab.eos_id] += 1
    total = sum(counts.values()) + len(vocab)
    nll, n = 0.0, 0
    for s in test_sentences:
        for i in [*vocab.encode(s), vocab.eos_id]:
            nll -= math.log((counts[i] + 1) / total)
            n += 1
    if n == 0:
        raise DataError("no test tokens for the unigram baseline")
    return math.exp(nll / n)


def score_sentences(
    lm: BidirectionalLM, sentences: Sequence[Sequence[str]], batch_size: int = 64
) -> list[tuple[float, float]]:
    """Per-sentence (log p_fwd, log p_bwd) in nats, see :meth:`BidirectionalLM.score`; ``batch_size`` sentences per
    forward pass (each sentence is read independently, so the scores do not depend on it).

    Raises:
        UsageError: ``batch_size`` is not an int >= 1.
    """
    _check_batch_size(batch_size)
    out: list[tuple[float, float]] = []
    for batch in _batches(sentences, batch_size):
        out.extend(lm.score(batch))
    return out
