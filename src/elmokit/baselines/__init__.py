"""Classical baselines the biLMs are measured against: an interpolated Kneser-Ney n-gram LM scored under the biLM's
own perplexity protocol (:mod:`.ngram`) and static word2vec vectors trained on the same text (:mod:`.word2vec`).

Importing this package is light: numpy only; gensim is imported inside :mod:`.word2vec`'s functions.
"""

from elmokit.baselines.ngram import KneserNeyLM, kneser_ney_perplexity
from elmokit.baselines.word2vec import WORD2VEC_SETTINGS, load_word2vec, train_word2vec

__all__ = ["KneserNeyLM", "kneser_ney_perplexity", "WORD2VEC_SETTINGS", "train_word2vec", "load_word2vec"]
