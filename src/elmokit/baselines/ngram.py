"""An interpolated Kneser-Ney n-gram language model, scored under the biLM's own held-out perplexity protocol.

The model (Kneser & Ney 1995; the interpolated form of Chen & Goodman 1999, eq. 17) for order n and discount D:

    p_n(w | h) = max(c(h w) − D, 0) / c(h •)  +  D · N1+(h •) / c(h •) · p_{n−1}(w | h')     (highest order, raw counts)
    p_k(w | h) = max(N1+(• h w) − D, 0) / N1+(• h •)  +  D · N1+(h •) / N1+(• h •) · p_{k−1}(w | h')   (1 < k < n)
    p_1(w)     = N1+(• w) / N1+(• •)                                             (continuation unigram, undiscounted)

where h' is h without its first word, c counts n-gram tokens, N1+(• h w) counts the distinct words seen before
``h w`` and N1+(h •) the distinct words seen after ``h``. A context never seen before a word defers to the next lower
order (weight 1). This is exactly the recursion of ``nltk.lm.KneserNeyInterpolated`` (nltk 3.8–3.10:
``InterpolatedLanguageModel.unmasked_score`` with ``smoothing.KneserNey``): one fixed discount for every order, no
discount and no uniform floor at the unigram level; ``tests/test_baselines.py`` checks our probabilities against
nltk's to 1e-9. The discount is fixed (default 0.75, the usual Kneser-Ney choice; nltk's own default is 0.1) unless
``discount="estimate"``, which gives each order its own D_k = n1 / (n1 + 2 n2) from that order's counts of counts
(Ney, Essen & Kneser 1994; raw counts at the highest order, continuation counts below).

**Modified Kneser-Ney** (Chen & Goodman 1999, section 3.4, eq. 26, interpolated): ``discount="modified"`` (or three
fixed numbers ``(D1, D2, D3+)``) discounts an n-gram seen once by D1, twice by D2 and three or more times by D3+, and
gives the lower order the mass those discounts free:

    p_k(w | h) = max(c(h w) − D(c(h w)), 0) / c(h •)  +  γ(h) · p_{k−1}(w | h'),
    γ(h) = (D1 N1(h •) + D2 N2(h •) + D3+ N3+(h •)) / c(h •)

with N_r(h •) the number of words seen exactly r times after h (the counts c are raw at the highest order,
continuation counts below, as above). Estimated per order from that order's counts of counts n1 … n4:
Y = n1 / (n1 + 2 n2), D1 = 1 − 2Y n2/n1, D2 = 2 − 3Y n3/n2, D3+ = 3 − 4Y n4/n3 (Chen & Goodman eq. 26; the formula of
KenLM's and SRILM's ``-kndiscount`` estimates). The counts it is fed differ from KenLM's in one point: here every
lower-order n-gram gets its continuation count, those that begin with the start symbol included, where KenLM keeps
the raw counts of n-grams that begin with ``<s>``; so the lower orders' discounts differ a little from KenLM's on
the same text.

Sentence boundaries follow the biLM (:meth:`elmokit.pretraining.objective.BidirectionalLM.sentence_nll`): a sentence
``w1 … wm`` is read as ``<S>^(n−1) w1 … wm </S>`` and its m + 1 targets are ``w1 … wm </S>`` (the n−1 copies of the
start symbol let the first words be predicted from the raw counts of sentence-initial n-grams, as nltk's
``pad_both_ends`` does on the left). Unlike nltk's padding, only one end symbol is appended and the n-grams made of
padding alone (``<S>``, ``<S> <S>``, …) are not counted: nltk counts them, which gives the start symbol probability
mass as a target and leaves the distribution after ``<S>`` summing to more than 1. With that, every context's
distribution sums to 1 over the vocabulary (a test checks it). The backward LM is the same model on reversed
sentences with the roles of ``<S>`` and ``</S>`` swapped (:func:`kneser_ney_perplexity`).

Implementation: n-grams are integer keys (``id of the context (k−1)-gram × V + word id``) in sorted numpy arrays, so
fitting 2M tokens takes seconds and memory in the tens of MB; lookups are ``np.searchsorted``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

import numpy as np

from elmokit.checks import check_int
from elmokit.errors import DataError, InputTypeError, UsageError, UsageTypeError
from elmokit.vocabulary import BOS, EOS, Vocabulary

__all__ = ["KneserNeyLM", "kneser_ney_perplexity"]


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each of ``keys`` in ``sorted_keys`` (int64), or -1 where absent."""
    if sorted_keys.size == 0:
        return np.full(keys.shape, -1, dtype=np.int64)
    idx = np.searchsorted(sorted_keys, keys)
    idx_c = np.minimum(idx, sorted_keys.size - 1)
    return np.where(sorted_keys[idx_c] == keys, idx_c, -1).astype(np.int64)


class _Level:
    """The statistics of one order k: ``keys`` (sorted, ``ctx_id * V + w``), ``counts`` (raw at the highest order,
    continuation counts below), per context id ``total`` (sum of counts) and ``types`` (number of distinct next
    words), and the discount."""

    __slots__ = ("keys", "counts", "total", "types", "discount", "by_count")

    def __init__(self, keys, counts, total, types, discount, by_count=None):
        self.keys, self.counts, self.total, self.types, self.discount = keys, counts, total, types, discount
        #: modified Kneser-Ney only: (3, contexts) float64, the number of next words seen 1, 2 and 3+ times per context
        self.by_count = by_count


def _is_number(x) -> bool:
    """A real number (Python's or numpy's), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def _check_discount(discount):
    """``discount`` as :class:`KneserNeyLM` keeps it (a tuple becomes a tuple of floats), or the error."""
    if isinstance(discount, str) and discount in ("estimate", "modified"):
        return discount
    if isinstance(discount, np.ndarray):
        discount = discount.tolist()
    if isinstance(discount, (tuple, list)):
        ok = len(discount) == 3 and all(_is_number(d) and 0 < d <= r for r, d in enumerate(discount, start=1))
        if not ok:
            raise UsageError(
                f"modified discounts must be three numbers (D1, D2, D3+) with 0 < Dr <= r, got {discount!r}"
            )
        return tuple(float(d) for d in discount)
    if _is_number(discount) and 0 < discount <= 1:
        return float(discount)
    raise (UsageError if _is_number(discount) or isinstance(discount, str) else UsageTypeError)(
        f"discount must be a number in (0, 1], 'estimate', 'modified' or (D1, D2, D3+), got {discount!r}"
    )


def _modified_discounts(k: int, counts: np.ndarray) -> tuple[float, float, float]:
    """Chen & Goodman's (1999, eq. 26) D1, D2, D3+ from the order-k counts of counts n1 … n4.

    Raises:
        DataError: some n_r is 0, or an estimate falls outside (0, r] (a corpus too small or too regular)."""
    n = [int((counts == r).sum()) for r in (1, 2, 3, 4)]
    fix = "the corpus is too small or too regular for the estimate: give fixed discounts (D1, D2, D3+)"
    if min(n) == 0:
        raise DataError(
            f"cannot estimate the modified Kneser-Ney discounts of order {k}: counts of counts n1..n4 = {n} "
            f"hold a 0 ({fix})"
        )
    y = n[0] / (n[0] + 2 * n[1])
    d = (1 - 2 * y * n[1] / n[0], 2 - 3 * y * n[2] / n[1], 3 - 4 * y * n[3] / n[2])
    if not all(0 < x <= r for r, x in enumerate(d, start=1)):
        shown = ", ".join(f"{x:.4g}" for x in d)
        raise DataError(
            f"modified Kneser-Ney discounts of order {k} out of range: ({shown}) from counts of counts n1..n4 = "
            f"{n}, each Dr must be in (0, r] ({fix})"
        )
    return d


class KneserNeyLM:
    """Interpolated Kneser-Ney n-gram LM over a fixed vocabulary, one reading direction (see the module docstring for
    the equations, the boundary convention and how it relates to ``nltk.lm.KneserNeyInterpolated``).

    Args:
        vocab: the word vocabulary; tokens it does not hold are read as ``<UNK>`` (as the biLM reads them).
        order: n >= 2.
        discount: a float in (0, 1] used at every order above the unigram, ``"estimate"`` (per order,
            n1 / (n1 + 2 n2)), ``"modified"`` (modified Kneser-Ney, three discounts per order estimated from its
            counts of counts) or a tuple ``(D1, D2, D3+)`` of fixed modified discounts (each in (0, r] for the
            count r = 1, 2, 3 it discounts).
        start, end: the boundary tokens (``<S>``/``</S>`` forward; ``</S>``/``<S>`` for a backward LM on reversed
            sentences). Both must be in ``vocab``.

    Raises:
        UsageTypeError: (also a ``TypeError``) ``vocab`` is not a :class:`Vocabulary`, ``order`` not an int,
            ``discount`` neither a number nor a string.
        UsageError: ``order`` < 2, ``discount`` is not in (0, 1] nor ``"estimate"``/``"modified"`` nor a valid
            ``(D1, D2, D3+)``, or ``start`` / ``end`` are not in the vocabulary or are equal.
    """

    def __init__(
        self, vocab: Vocabulary, order: int = 3, discount: float | str | tuple = 0.75, start: str = BOS, end: str = EOS
    ) -> None:
        if not isinstance(vocab, Vocabulary):
            raise UsageTypeError(f"vocab must be an elmokit Vocabulary, got {type(vocab).__name__}")
        check_int("order", order, 2)
        discount = _check_discount(discount)
        for name, tok in (("start", start), ("end", end)):
            if tok not in vocab:
                raise UsageError(f"{name} token {tok!r} is not in the vocabulary")
        if start == end:
            raise UsageError(f"start and end tokens must differ, both are {start!r}")
        self.vocab = vocab
        self.order = order
        self.discount = discount
        self.start, self.end = start, end
        self._start_id = vocab.token_to_id(start)
        self._end_id = vocab.token_to_id(end)
        self._V = len(vocab)
        self._ctx_keys: list[np.ndarray] = []  # [m] for m = 0 … n−1: sorted keys of the m-grams (m = 0 unused)
        self._levels: list[_Level | None] = []  # [k] for k = 1 … n (k = 0 unused)
        self.fitted = False

    # ------------------------------------------------------------------ encoding
    def _encode(self, sentences: Iterable[Sequence[str]]) -> tuple[np.ndarray, np.ndarray, int]:
        """(seq, local, n_sentences): the padded id sequence of all sentences back to back, and each position's index
        inside its padded sentence."""
        pad = [self._start_id] * (self.order - 1)
        ids: list[int] = []
        lengths: list[int] = []
        for i, s in enumerate(sentences):
            if isinstance(s, str):
                raise InputTypeError(f"sentence {i} is a str; pass lists of tokens (e.g. line.split())")
            enc = self.vocab.encode(s)
            ids.extend(pad)
            ids.extend(enc)
            ids.append(self._end_id)
            lengths.append(len(enc) + self.order)
        seq = np.asarray(ids, dtype=np.int64)
        lengths_a = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths_a)[:-1]]) if lengths else np.zeros(0, np.int64)
        local = np.arange(seq.size, dtype=np.int64) - np.repeat(starts, lengths_a)
        return seq, local, len(lengths)

    def _history(self, seq: np.ndarray, local: np.ndarray, fit: bool) -> list[np.ndarray]:
        """hist[m][j] = id of the m-gram ending at position j (m = 0 … n−1), -1 where it would cross the sentence
        start or (when scoring) was never seen in training. When ``fit``, the m-gram tables are built."""
        V = self._V
        hist = [np.zeros(seq.size, dtype=np.int64)]
        for m in range(1, self.order):
            prev = np.roll(hist[m - 1], 1)
            valid = (local >= m - 1) & (prev >= 0)
            keys = prev[valid] * V + seq[valid]
            h = np.full(seq.size, -1, dtype=np.int64)
            if fit:
                uniq, inv = np.unique(keys, return_inverse=True)
                self._ctx_keys.append(uniq)
                h[valid] = inv.reshape(-1)
            else:
                h[valid] = _lookup(self._ctx_keys[m], keys)
            hist.append(h)
        return hist

    # ------------------------------------------------------------------ fitting
    def fit(self, sentences: Iterable[Sequence[str]]) -> KneserNeyLM:
        """Count ``sentences`` (token lists, no boundary tokens; consumed once). Returns ``self``.

        Raises:
            InputTypeError: (also a ``TypeError``) a sentence is a ``str``.
            DataError: no sentences, ``discount="estimate"`` finds no n-gram seen once at some order, or
                ``discount="modified"`` cannot estimate an order's discounts (a count of counts n1..n4 is 0, or an
                estimate falls outside (0, r]).
        """
        seq, local, n_sent = self._encode(sentences)
        if n_sent == 0:
            raise DataError("KneserNeyLM.fit: no training sentences")
        n, V = self.order, self._V
        if (seq.size + 1) * V >= 2**62:
            raise DataError(f"KneserNeyLM.fit: {seq.size} positions × vocabulary {V} overflow the int64 n-gram keys")
        self._ctx_keys = [np.zeros(1, dtype=np.int64)]
        hist = self._history(seq, local, fit=True)
        targets = np.flatnonzero(local >= n - 1)
        del local
        gram = [None] + [hist[k - 1][targets - 1] * V + seq[targets] for k in range(1, n + 1)]
        del hist, seq, targets  # (memory: a 5-gram fit of 40M tokens holds several int64 arrays of that length)
        self._levels = [None] * (n + 1)
        for k in range(n, 0, -1):
            if k == n:
                keys, counts = np.unique(gram[k], return_counts=True)
            else:  # continuation count: distinct (k+1)-gram types ending in this k-gram
                _, first = np.unique(gram[k + 1], return_index=True)
                keys, counts = np.unique(gram[k][first], return_counts=True)
            ctx = keys // V
            n_ctx = 1 if k == 1 else self._ctx_keys[k - 1].size
            total = np.bincount(ctx, weights=counts, minlength=n_ctx).astype(np.float64)
            types = np.bincount(ctx, minlength=n_ctx).astype(np.float64)
            discount = self._discount_for(k, counts)
            by_count = None
            if isinstance(discount, tuple):  # modified: per context, the next words seen 1, 2 and 3+ times
                bucket = np.minimum(counts, 3) - 1
                by_count = np.stack([np.bincount(ctx[bucket == r], minlength=n_ctx) for r in range(3)])
                by_count = by_count.astype(np.float64)
            self._levels[k] = _Level(keys, counts.astype(np.float64), total, types, discount, by_count)
            if k < n:
                gram[k + 1] = None  # only level k − 1 reads gram[k] from here on
        self.fitted = True
        return self

    def _discount_for(self, k: int, counts: np.ndarray) -> float | tuple[float, float, float]:
        if k == 1:
            return 0.0  # the unigram level is not discounted (nltk's unigram_score)
        if isinstance(self.discount, tuple):
            return self.discount
        if self.discount == "modified":
            return _modified_discounts(k, counts)
        if self.discount != "estimate":
            return float(self.discount)
        n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
        if n1 == 0:
            raise DataError(
                f"cannot estimate the order-{k} discount: no {k}-gram was seen once "
                "(give a fixed discount for so small a corpus)"
            )
        return n1 / (n1 + 2 * n2)

    @property
    def discounts(self) -> list:
        """The discount used at each order 2 … n (after :meth:`fit`): a float, or ``[D1, D2, D3+]`` when modified."""
        self._check_fitted()
        d = [self._levels[k].discount for k in range(2, self.order + 1)]
        return [list(x) if isinstance(x, tuple) else x for x in d]

    def _check_fitted(self) -> None:
        if not self.fitted:
            raise UsageError("KneserNeyLM: call fit(sentences) before scoring")

    # ------------------------------------------------------------------ scoring
    def _probs(self, words: np.ndarray, ctx: list[np.ndarray | None], top: int) -> np.ndarray:
        """p(words | contexts) with levels 1 … ``top``; ``ctx[k]`` = id of the (k−1)-gram context used at level k
        (-1 = unseen), shape of ``words``. float64."""
        V = self._V
        lv = self._levels[1]
        idx = _lookup(lv.keys, words)
        p = np.where(idx >= 0, lv.counts[np.maximum(idx, 0)], 0.0) / lv.total[0]
        for k in range(2, top + 1):
            lv = self._levels[k]
            h = ctx[k]
            hc = np.maximum(h, 0)
            total = np.where(h >= 0, lv.total[hc], 0.0)
            seen = total > 0
            if not seen.any():
                continue
            hs, ws, ts = h[seen], words[seen], total[seen]
            idx = _lookup(lv.keys, hs * V + ws)
            c = np.where(idx >= 0, lv.counts[np.maximum(idx, 0)], 0.0)
            p = p.copy()
            if lv.by_count is None:
                d = lv.discount
                p[seen] = np.maximum(c - d, 0.0) / ts + d * lv.types[hs] / ts * p[seen]
            else:  # modified: D(c) by the count, the freed mass from the context's counts of counts
                d = np.asarray((0.0, *lv.discount))[np.minimum(c, 3).astype(np.int64)]
                gamma = (np.asarray(lv.discount) @ lv.by_count[:, hs]) / ts
                p[seen] = np.maximum(c - d, 0.0) / ts + gamma * p[seen]
        return p

    def _context_ids(self, context: Sequence[str]) -> tuple[list[np.ndarray | None], int]:
        """Ids (as 1-element arrays) of the suffixes of ``context`` (truncated to n−1 tokens, as nltk does) for
        each level, and the top level it allows."""
        if isinstance(context, str):
            raise InputTypeError("context must be a sequence of tokens, got a str")
        ids = self.vocab.encode(list(context))[-(self.order - 1) :] if context else []
        V = self._V
        ctx: list[np.ndarray | None] = [None, np.zeros(1, dtype=np.int64)]
        for k in range(2, len(ids) + 2):
            suffix = ids[len(ids) - (k - 1) :]
            h = 0
            for m, tok in enumerate(suffix, start=1):
                h = int(_lookup(self._ctx_keys[m], np.asarray([h * V + tok]))[0])
                if h < 0:
                    break
            ctx.append(np.asarray([h], dtype=np.int64))
        return ctx, len(ids) + 1

    def prob(self, word: str, context: Sequence[str] = ()) -> float:
        """p(word | context), context = the preceding tokens (only the last n−1 are used; a shorter context uses the
        lower orders only, as ``nltk.lm`` does). Unknown tokens count as ``<UNK>``.

        Raises:
            UsageError: not fitted.
            InputTypeError: (also a ``TypeError``) ``context`` is a ``str``.
        """
        self._check_fitted()
        ctx, top = self._context_ids(context)
        return float(self._probs(np.asarray([self.vocab.token_to_id(word)], dtype=np.int64), ctx, top)[0])

    def distribution(self, context: Sequence[str] = ()) -> np.ndarray:
        """p(w | context) for every w of the vocabulary in id order: shape (V,), float64 (sums to 1).

        Raises:
            UsageError: not fitted.
            InputTypeError: (also a ``TypeError``) ``context`` is a ``str``.
        """
        self._check_fitted()
        ctx, top = self._context_ids(context)
        words = np.arange(self._V, dtype=np.int64)
        ctx = [None if c is None else np.broadcast_to(c, words.shape) for c in ctx]
        return self._probs(words, ctx, top)

    def target_probs(self, sentences: Iterable[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """(p, sentence index) for every target of ``sentences`` in order (m + 1 per sentence of m tokens: each token
        and the end symbol, each from its left context starting at the start symbol): two arrays of shape (N,),
        float64 and int64.

        Raises:
            UsageError: not fitted.
            InputTypeError: (also a ``TypeError``) a sentence is a ``str``.
        """
        self._check_fitted()
        seq, local, n_sent = self._encode(sentences)
        n = self.order
        hist = self._history(seq, local, fit=False)
        targets = np.flatnonzero(local >= n - 1)
        ctx = [None] + [hist[k - 1][targets - 1] for k in range(1, n + 1)]
        p = self._probs(seq[targets], ctx, n)
        sentence = np.cumsum(local == 0)[targets] - 1
        return p, sentence

    def nll_sums(self, sentences: Iterable[Sequence[str]]) -> tuple[float, int, int]:
        """(NLL in nats summed over all targets, number of targets, number of sentences); see :meth:`target_probs`.

        Raises:
            DataError: a target has probability 0 (a word that never followed anything in the training text, e.g.
                ``<UNK>`` when no training token was unknown), naming the sentence and token.
        """
        sentences = [list(s) if not isinstance(s, str) else s for s in sentences]
        p, sent = self.target_probs(sentences)
        zero = np.flatnonzero(p <= 0)
        if zero.size:
            i = int(sent[zero[0]])
            j = int(zero[0] - np.searchsorted(sent, i))
            toks = [*sentences[i], self.end]
            raise DataError(
                f"Kneser-Ney probability 0 for token {j} ({toks[j]!r}, read as "
                f"{self.vocab.id_to_token(self.vocab.token_to_id(toks[j]))!r}) of test sentence {i}: "
                "it never occurs in the training text (a vocabulary word missing from it, or <UNK> when "
                "no training token is unknown)"
            )
        return float(-np.log(p).sum()), int(p.size), len(sentences)


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


def _fit_direction(lm: KneserNeyLM, sentences, direction: str) -> KneserNeyLM:
    """``lm.fit(sentences)``, a discount that cannot be estimated named with its direction."""
    try:
        return lm.fit(sentences)
    except DataError as e:
        if "discount" not in str(e):
            raise
        raise DataError(f"the {direction} Kneser-Ney LM: {e}") from None


def kneser_ney_perplexity(
    train_sentences: Iterable[Sequence[str]],
    test_sentences: Iterable[Sequence[str]],
    vocab: Vocabulary,
    order: int = 3,
    discount: float | str | tuple = 0.75,
) -> dict:
    """Held-out perplexity of interpolated Kneser-Ney n-gram LMs under the biLM's protocol.

    Same targets and averaging as :func:`elmokit.pretraining.perplexity.evaluate_perplexity`: words outside
    ``vocab`` are ``<UNK>``; the forward LM predicts ``w1 … wm </S>`` from the left (starting at ``<S>``), the backward
    LM (trained on the reversed sentences) predicts ``wm … w1 <S>`` from the right (starting at ``</S>``); per
    direction ``exp(mean NLL)`` over its m + 1 targets per sentence; ``average = exp(0.5 · (NLL_fwd + NLL_bwd))``.

    Args:
        train_sentences, test_sentences: token lists (no boundary tokens).
        vocab: the biLM's vocabulary (e.g. ``Vocabulary.build(train, min_count=2)``).
        order, discount: see :class:`KneserNeyLM`.

    Returns:
        ``{"forward", "backward", "average", "tokens", "sentences", "order", "discount"}`` (tokens = targets per
        direction; discount = the discounts per order 2 … n used by the forward LM).

    Raises:
        UsageError: bad ``order`` / ``discount`` / ``vocab``.
        DataError: no training or test sentences, an estimated discount that cannot be estimated (naming the
            direction; see :meth:`KneserNeyLM.fit`), or a test target of probability 0 (see
            :meth:`KneserNeyLM.nll_sums`).
    """
    train = [list(s) if not isinstance(s, str) else s for s in train_sentences]
    test = [list(s) if not isinstance(s, str) else s for s in test_sentences]
    if not test:
        raise DataError("kneser_ney_perplexity: no test sentences")
    fwd = _fit_direction(KneserNeyLM(vocab, order, discount, start=BOS, end=EOS), train, "forward")
    nll_f, n_tok, n_sent = fwd.nll_sums(test)
    discounts = fwd.discounts
    del fwd  # one direction's tables at a time (a 5-gram model of 40M tokens holds GBs)
    reversed_train = (s[::-1] if not isinstance(s, str) else s for s in train)
    bwd = _fit_direction(KneserNeyLM(vocab, order, discount, start=EOS, end=BOS), reversed_train, "backward")
    nll_b, _, _ = bwd.nll_sums([s[::-1] for s in test])  # the same m + 1 targets per sentence
    f, b = nll_f / n_tok, nll_b / n_tok
    return {
        "forward": _exp(f),
        "backward": _exp(b),
        "average": _exp(0.5 * (f + b)),
        "tokens": n_tok,
        "sentences": n_sent,
        "order": order,
        "discount": discounts,
    }
