"""The fixed start state of a window-trained biLM: the LSTM state it reads every sentence from when none is given.

Why (``experiments/results/initial-state.md``): a model trained on bilm-tf's stream windows with the state carried
between batches (``batching="windows"``) almost never sees a zero state in training, so read statelessly from zeros
it starts every sentence out of distribution. A state carried from the previous sentence fits it, but makes a
sentence's vectors depend on what was read before it. The mean of the states such a model reaches at sentence
starts over its training text is a fixed state in that distribution: reading every sentence from it keeps inference a
pure function of (weights, sentence) and recovers most of the carried state's advantage. The trainer stores it with a
window-trained model (:meth:`elmokit.modules.bilm.BiLM.set_start_state`); sentence-trained models, trained and read
from zeros, keep zeros.

Each sentence is read as one window row — forward inputs ``<S> w1 … wn``, backward inputs ``</S> wn … w1`` — exactly as
:class:`elmokit.data.corpus.StreamWindows` feeds it, so the state after a sentence is the one after its last input, as
in training (the pair ``</S>`` → next ``<S>`` is never read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from elmokit.modules.lstm import LSTMState
from elmokit.pretraining.objective import BidirectionalLM

__all__ = ["window_rows", "mean_start_state", "START_STATE_SENTENCES", "START_STATE_STREAMS", "describe"]

BOS, EOS = "<S>", "</S>"
#: Sentences of the training text (file order, from the start) over which the trainer averages, and the number of
#: contiguous streams they are read as (rows of one batch). Bounded so that the cost does not grow with the corpus:
#: 2,048 sentences are about 20 s on one CPU thread for the quickstart's model.
START_STATE_SENTENCES = 2048
START_STATE_STREAMS = 32


def window_rows(
    sentences: Sequence[Sequence[str]],
) -> tuple[list[list[str]], list[list[str]], list[list[str]], list[list[str]]]:
    """Each sentence as one window row: (forward inputs ``<S> w1 … wn``, forward targets ``w1 … wn </S>``, backward
    inputs ``</S> wn … w1``, backward targets ``wn … w1 <S>``), the arguments of
    :meth:`BidirectionalLM.window_nll`."""
    fi = [[BOS, *s] for s in sentences]
    ft = [[*s, EOS] for s in sentences]
    bi = [[EOS, *reversed(s)] for s in sentences]
    bt = [[*reversed(s), BOS] for s in sentences]
    return fi, ft, bi, bt


def describe(samples: int) -> str:
    """The ``start_state`` description stored with a model (native file metadata, ``elmokit info``)."""
    return f"mean carried LSTM state at {samples} sentence starts of the training text"


def mean_start_state(
    lm: BidirectionalLM,
    sentences: Iterable[Sequence[str]],
    *,
    streams: int = START_STATE_STREAMS,
    max_sentences: int | None = START_STATE_SENTENCES,
) -> tuple[LSTMState | None, int]:
    """The mean LSTM state at sentence starts when ``sentences`` are read as ``streams`` contiguous streams with the
    state carried from sentence to sentence (windows training's condition), the first sentence of each stream from
    zeros.

    The first ``max_sentences`` non-empty sentences are cut into ``streams`` contiguous runs of equal length (the rest
    dropped); step k reads sentence k of every run as one batch. The state after each sentence that another sentence
    follows in its run is one sample; c and h are averaged separately (float64 sums), over all samples.

    Args:
        lm: the trained model (read in eval mode, no autograd; its mode is restored).
        sentences: token lists, e.g. the training text in file order.
    Returns:
        ((c (2, L, 1, H), h (2, L, 1, P)) float32 on the model's device, samples averaged); ``(None, 0)`` when
        fewer than two sentences a stream are available (then there is no carried state to average).
    Deterministic: a function of the weights and the sentences.
    """
    picked: list[Sequence[str]] = []
    for s in sentences:
        if len(s):
            picked.append(s)
            if max_sentences is not None and len(picked) >= max_sentences:
                break
    streams = max(1, min(streams, len(picked) // 2))
    per = len(picked) // streams
    if per < 2:
        return None, 0
    runs = [picked[i * per : (i + 1) * per] for i in range(streams)]
    was_training = lm.training
    lm.eval()
    sum_c = sum_h = None
    count = 0
    state = None
    try:
        with torch.no_grad():
            for k in range(per):
                _, state = lm.window_nll(*window_rows([run[k] for run in runs]), state)
                if k < per - 1:
                    c, h = (t.double().sum(2, keepdim=True) for t in state)
                    sum_c = c if sum_c is None else sum_c + c
                    sum_h = h if sum_h is None else sum_h + h
                    count += streams
    finally:
        lm.train(was_training)
    return ((sum_c / count).float(), (sum_h / count).float()), count
