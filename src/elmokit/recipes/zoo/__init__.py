"""The model zoo: the data recipes of the English and Chinese biLMs (:mod:`.corpora`) and their builds
(:mod:`.build`: ``elmokit zoo build {en,zh}`` → ``$ELMOKIT_CACHE/zoo/elmokit-<lang>``, with the word2vec baseline and a
model card; the names ``elmokit-en`` / ``elmokit-zh`` resolve there in every loader).

Importing it is light: sacremoses, jieba, gensim and nltk are imported inside the functions that use them.
"""
from elmokit.recipes.zoo.corpora import RECIPES, build_corpus, leak_check, read_kept_out, read_source, resolve_data_dir, sentence_key

__all__ = ["RECIPES", "build_corpus", "leak_check", "read_kept_out", "read_source", "resolve_data_dir",
           "sentence_key"]
