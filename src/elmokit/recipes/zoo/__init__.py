"""The model zoo: the data recipes of the English and Chinese biLMs (:mod:`.corpora`) and their builds
(:mod:`.build`: ``elmokit zoo build {en,zh}`` → ``$ELMOKIT_CACHE/zoo/elmokit-<lang>``, with the word2vec baseline
and a model card, :mod:`.card`; the configurations are :mod:`.specs`, the figures :mod:`.figures`; the names
``elmokit-en`` / ``elmokit-zh`` resolve there in every loader). The corpora's modules: :mod:`.readers` (the sources'
formats), :mod:`.pretext` (the staged pretraining text, tokenised once into a cache), :mod:`.sources` (the recipe
tables and licences), :mod:`.leaks` (sentence keys and the leak check), :mod:`.ngrams` (the n-gram leak filter).

Importing it is light: sacremoses, jieba, gensim and nltk are imported inside the functions that use them.
"""

from elmokit.recipes.zoo.corpora import (
    RECIPES,
    build_corpus,
    leak_check,
    read_kept_out,
    read_source,
    resolve_data_dir,
    sentence_key,
)

__all__ = ["RECIPES", "build_corpus", "leak_check", "read_kept_out", "read_source", "resolve_data_dir", "sentence_key"]
