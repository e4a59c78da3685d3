"""The English main job: the protocol (:mod:`elmokit.recipes.quickstart.protocol`) on the Lee news corpus, with "bank"
as the probed word.

Text: the Lee news corpus (300 ABC news articles, 59,890 words) inside the gensim wheel
(``gensim.test.utils.datapath("lee_background.cor")``). It is split into sentences and tokens here; the last 10 % of
the articles are held out. The vocabulary is the training words seen at least twice (the others become ``<UNK>``, so
the model learns how likely an unseen word is).

Settings (chosen on this corpus with a held-out curve every 300 steps): LSTM 512 → projection 128, 2 layers, skip
connections, full softmax, Adam lr 2e-3, dropout 0.5 (the corpus has only 60k tokens: at dropout 0.1 held-out
perplexity rose again after 300 steps), batches of 32 whole sentences from a zero state — the way the model is then
evaluated and embedded (see :mod:`elmokit.pretraining.trainer` for why this beats stream windows here). The held-out
text is also the run's ``valid_files``: its perplexity is measured every tenth of the run and drawn on the learning
curve beside the training perplexity, and the best model is kept in ``train/best/``.
"""

from __future__ import annotations

import re
from pathlib import Path

from elmokit.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmokit.data.examples import BANK_SENTENCES
from elmokit.errors import import_optional
from elmokit.recipes.quickstart.protocol import SEPARATION_MARGIN, TRAIN_SETTINGS, QuickstartJob, sense_similarities

__all__ = ["en_job", "load_lee_corpus", "tokenize", "quickstart_config", "BANK_SENTENCES", "bank_similarities"]

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|\w+(?:['’-]\w+)*|[^\w\s]")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'’”]))\s+(?=[\"'“‘A-Z])")


def tokenize(text: str) -> list[list[str]]:
    """Split running English text into sentences (at . ! ?, or one followed by a closing quote, before a capital or an
    opening quote) and tokens (words, numbers, punctuation)."""
    return [toks for s in _SENTENCE_END.split(text) if (toks := _TOKEN.findall(s))]


def load_lee_corpus() -> tuple[list[list[str]], list[list[str]]]:
    """(train sentences, held-out sentences) from gensim's ``lee_background.cor``; the last 30 articles are held out,
    less their sentences that also occur word for word in the training articles (the split is leak-free).

    Raises:
        ImportError: gensim is not installed (it is a dependency of elmokit).
    """
    utils = import_optional("gensim.test.utils", "quickstart", "the English quickstart (gensim's Lee corpus)")
    datapath = utils.datapath  # optional: gensim, through import_optional

    docs = Path(datapath("lee_background.cor")).read_text(encoding="utf-8").splitlines()
    docs = [d for d in docs if d.strip()]
    split = len(docs) - len(docs) // 10
    train = [s for d in docs[:split] for s in tokenize(d)]
    held = [s for d in docs[split:] for s in tokenize(d)]
    # leak-free: the corpus repeats a story, so a few held-out sentences also occur word for word in the training
    # articles (5 of them); they are dropped from the held-out text
    seen = {tuple(s) for s in train}
    return train, [s for s in held if tuple(s) not in seen]


def quickstart_config() -> ElmoConfig:
    """A small biLM that trains in minutes on 2 CPU cores (output dim 256)."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 32), (2, 32), (3, 64), (4, 128), (5, 128)],
            n_highway=1,
            embedding_dim=16,
            n_characters=261,
            max_characters_per_token=50,
            activation="relu",
        ),
        lstm=LSTMConfig(
            dim=512, projection_dim=128, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True
        ),
    )


def bank_similarities(embedder, sentences=BANK_SENTENCES, margin: float = SEPARATION_MARGIN) -> dict:
    """:func:`sense_similarities` of "bank" over :data:`BANK_SENTENCES` (the English quickstart's probes)."""
    return sense_similarities(embedder, sentences, margin)


def en_job() -> QuickstartJob:
    def load():
        return (*load_lee_corpus(), {})

    def describe(train, held, info):
        return (
            f"corpus: gensim lee_background.cor — {len(train)} training sentences "
            f"({sum(len(s) for s in train)} tokens), {len(held)} held-out sentences "
            f"({sum(len(s) for s in held)} tokens)"
        )

    return QuickstartJob(
        lang="en",
        load_corpus=load,
        describe_corpus=describe,
        model=quickstart_config,
        train=dict(TRAIN_SETTINGS),
        probes=BANK_SENTENCES,
        word="bank",
        probe_key="bank",
        margin=SEPARATION_MARGIN,
    )
