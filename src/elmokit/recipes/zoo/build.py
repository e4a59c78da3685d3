"""The model zoo's builds: ``elmokit zoo build {en,zh}`` makes the English or Chinese biLM, its word2vec baseline and
its card, from scratch and with a fixed seed, into ``$ELMOKIT_CACHE/zoo/elmokit-<lang>/``.

One build (:func:`build_model`) is, in order:

1. the corpus (:func:`elmokit.recipes.zoo.corpora.build_corpus`: ``corpus/train.txt``, ``corpus/heldout.txt``,
   ``corpus.json``), leak-free;
2. the static baseline (:func:`elmokit.baselines.word2vec.train_word2vec`, fixed settings, one worker) on exactly
   the tokens of ``train.txt`` (``word2vec/``);
3. the biLM with the language's **one** fixed configuration (:data:`SPECS`: architecture, batching, batch size,
   negatives, optimiser, learning rate, dropout, min_count, a fixed step count, seed), trained through
   :func:`elmokit.pretraining.build_trainer` / :meth:`~elmokit.pretraining.Trainer.train` with 2 torch threads and
   deterministic algorithms (so the rebuild repeats bit-exactly on the same machine and versions, and ``--resume``
   after an interruption continues the same run), with the held-out perplexity of ``heldout.txt`` on the learning
   curve (``train/``);
4. the figures, all under the biLM's perplexity protocol (:func:`elmokit.pretraining.evaluate_perplexity`: each
   sentence from a zero state, ``n + 1`` targets per direction, unknown words as ``<UNK>``): held-out forward /
   backward / average perplexity of the final model beside an add-one unigram and an interpolated Kneser-Ney 3-gram
   (:func:`elmokit.baselines.ngram.kneser_ney_perplexity`, discount 0.75) fitted on ``train.txt`` over the biLM's
   vocabulary; for English also WikiText-2 test (see :func:`wikitext_sentences` for how its ``<unk>`` and OOV words
   are handled); tokens/s and wall times;
5. the model folder: the native model (``config.json``, ``model.safetensors``, ``vocab.txt``, ``chars.txt`` for the
   character-vocabulary model, ``tokenizer.json`` naming the tokeniser/segmenter and its version),
   ``learning_curve.png``, ``card.json`` and the ``README.md`` card (data, the rebuild command, git commit,
   configuration, figures, sha256 of every model file).

Names: ``elmokit-en`` and ``elmokit-zh`` (:data:`elmokit.weights.native.ZOO_MODELS`) resolve to these folders in
every loader (``Elmo.from_pretrained``, ``Embedder``, ``elmokit embed``/``info``/``export``).
"""
from __future__ import annotations

import copy
import datetime as _dt
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from elmokit.data.tokenizers import load_tokenizer, segmenter_versions
from elmokit.errors import MissingFileError, UsageError, import_optional
from elmokit.io import atomic_write_text, folder_lock
from elmokit.weights.native import zoo_model_dir

__all__ = ["SPECS", "ZooSpec", "build_model", "model_dir", "list_models", "read_card", "render_card",
           "wikitext_sentences", "load_tokenizer", "MODEL_FILES", "THREADS", "WIKITEXT_PROTOCOL"]

logger = logging.getLogger(__name__)

#: torch threads of every zoo training run: part of the configuration (a float sum's order, hence the bits of the
#: result, depends on it).
THREADS = 2
#: The model files of a zoo folder whose sha256 the card records (those present).
MODEL_FILES = ("config.json", "model.safetensors", "vocab.txt", "chars.txt", "tokenizer.json")
#: What a build writes in its folder (``--overwrite`` removes these, nothing else).
_OWN_ENTRIES = (*MODEL_FILES, "corpus", "corpus.json", "word2vec", "train", "learning_curve.png", "card.json",
                "README.md")

from elmokit.io import file_sha256 as _sha256


def _char_cnn(max_characters_per_token: int) -> dict:
    """The token encoder of both zoo models: the quickstart's char CNN (384 filters, widths 1-5), one highway."""
    return {"filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]], "activation": "relu",
            "embedding": {"dim": 16}, "n_characters": 262, "n_highway": 1,
            "max_characters_per_token": max_characters_per_token}


def _lstm(dim: int, projection_dim: int) -> dict:
    return {"dim": dim, "projection_dim": projection_dim, "n_layers": 2, "cell_clip": 3, "proj_clip": 3,
            "use_skip_connections": True}


@dataclass(frozen=True)
class ZooSpec:
    """One zoo model's fixed recipe.

    Attributes:
        name: the model name (``elmokit-en``). recipe: the corpus recipe (:data:`elmokit.recipes.zoo.corpora.RECIPES`).
        model: the architecture (options.json layout: ``lstm``, ``char_cnn``).
        train: the :class:`~elmokit.pretraining.TrainConfig` fields (everything but files and folders).
        valid_points: held-out evaluations during training besides step 0 (every ``max_steps / valid_points``).
        wikitext: also score WikiText-2 test (English).
        tokenizer: how raw text was tokenised, for ``tokenizer.json`` (the corpus's segmenter key).
        why: one line on how the configuration was chosen (the card prints it).
    """

    name: str
    recipe: str
    language: str
    model: dict
    train: dict
    valid_points: int = 4
    wikitext: bool = False
    tokenizer: str = "sacremoses"
    why: str = ""


#: The zoo's two models, one fixed configuration each. The step counts come from timing runs on this project's
#: 2-core machine (2 threads, quiet) so that the whole build fits in 25 minutes; the measured times are in the cards.
SPECS: dict[str, ZooSpec] = {
    "en": ZooSpec(
        name="elmokit-en", recipe="en", language="English",
        model={"char_cnn": _char_cnn(50), "lstm": _lstm(512, 128)},
        train={"min_count": 3, "char_vocab": False, "batching": "sentences", "batch_size": 64, "unroll_steps": 20,
               "n_epochs": 100, "max_steps": 3600, "optimizer": "adam", "lr": 2e-3, "clip_norm": 5.0,
               "dropout": 0.1, "n_negative_samples": 4096, "seed": 0, "shuffle": True, "deterministic": True,
               "checkpoint_every": 250, "keep_checkpoints": 2, "log_every": 10},
        valid_points=2, wikitext=True, tokenizer="sacremoses",
        why="the quickstart's biLM (char CNN 384 filters, LSTM 512 → 128, 2 layers, skip connections, Adam 2e-3) "
            "with a sampled softmax of 4,096 negatives over the 49k-word vocabulary, dropout 0.1 (the run sees the "
            "corpus about once), 64 sentences a step. Steps: a 120-step timing run (2 threads, quiet) took 313 ms a "
            "step (4,270 tokens/s) and a held-out evaluation 39 s; a first full build at 2,900 steps took 19.6 min "
            "(biLM 16.1 min; held-out 220.6, level with Kneser-Ney's 220.2), so the count was raised to 3,600 to fill "
            "the 25-minute budget with the corpus, word2vec, 3 held-out evaluations (39 s each: full softmax over 49k "
            "words), WikiText-2 and the baselines"),
"zh": ZooSpec(
        name="elmokit-zh", recipe="zh", language="Chinese",
        model={"char_cnn": _char_cnn(10), "lstm": _lstm(512, 128)},
        train={"min_count": 3, "char_vocab": True, "batching": "sentences", "batch_size": 64, "unroll_steps": 20,
               "n_epochs": 100, "max_steps": 3800, "optimizer": "adam", "lr": 2e-3, "clip_norm": 5.0,
               "dropout": 0.2, "n_negative_samples": 4096, "seed": 0, "shuffle": True, "deterministic": True,
               "checkpoint_every": 250, "keep_checkpoints": 2, "log_every": 10},
        valid_points=4, wikitext=False, tokenizer="jieba",
        why="the English configuration with word tokens read through the character-vocabulary mode (8 characters "
            "a word fit: 99.99 % of the training words have at most 6), dropout 0.2 (the run sees the 1.3M-token "
            "corpus about four times). Steps: a 120-step timing run (2 threads, quiet) took 291 ms a step (5,180 "
            "tokens/s), so 3,800 steps (~18 min) leave the corpus, word2vec, 5 held-out evaluations and the baselines "
            "inside 25 minutes with a margin"),
}


# ==================================================================================================== locations
def model_dir(lang_or_name: str, cache: str | os.PathLike | None = None) -> Path:
    """The folder of a zoo model: ``<cache>/zoo/elmokit-<lang>`` (``cache`` default: ``$ELMOKIT_CACHE``, else
    ``~/.cache/elmokit``).

    Raises:
        UsageError: not a zoo language or name.
    """
    return zoo_model_dir(_spec(lang_or_name).name, cache)


def _spec(lang_or_name: str) -> ZooSpec:
    for key, spec in SPECS.items():
        if lang_or_name in (key, spec.name):
            return spec
    raise UsageError(f"unknown zoo model {lang_or_name!r}: expected one of "
                     f"{', '.join(list(SPECS) + [s.name for s in SPECS.values()])}")


def rebuild_command(spec: ZooSpec) -> str:
    return f"elmokit zoo build {spec.recipe}"


# ==================================================================================================== helpers


def _git_commit() -> dict:
    """``{"commit", "dirty"}`` of the source tree this package runs from (``"unknown"`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=20, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=20, check=True).stdout
        return {"commit": commit or "unknown", "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def _copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` atomically (an interrupted copy leaves the old file or none)."""
    from elmokit.io import atomic_path

    with atomic_path(dst, suffix=dst.suffix) as tmp:
        shutil.copyfile(src, tmp)


def _read_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _versions() -> dict:
    import numpy
    import torch

    gensim = import_optional("gensim", "zoo", "the zoo build")

    import elmokit

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "gensim": gensim.__version__, "elmokit": getattr(elmokit, "__version__", "unknown")}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ==================================================================================================== WikiText-2
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
    "vocabulary.")


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
        raise MissingFileError(f"WikiText-2 test file not found: {path} (expected wikitext-2/test.txt in the data "
                               "folder)")
    from elmokit.vocabulary import UNK

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
        current: list[str] = []
        for tok in tokens:
            current.append(tok)
            if tok in _SENTENCE_END:
                sentences.append(current)
                current = []
        if current:
            sentences.append(current)
    out = []
    for s in sentences:
        mapped = [UNK if t == "<unk>" else _WIKITEXT_MARKERS.get(t, t) for t in s]
        stats["unk"] += sum(t == "<unk>" for t in s)
        stats["words"] += len(mapped)
        out.append(mapped)
    stats["sentences"] = len(out)
    return out, stats


# ==================================================================================================== tokenizers
def _tokenizer_info(spec: ZooSpec, manifest: dict) -> dict:
    versions = segmenter_versions()
    if spec.tokenizer == "jieba":
        return {"language": "zh", "tokens": "words", "segmenter": "jieba", "version": versions["jieba"],
                "sentence_splitter": "elmokit.data.tokenizers.split_chinese",
                "how": "sentences cut with split_chinese, each segmented with jieba.Tokenizer() (default "
                       "dictionary) .lcut(sentence, HMM=True); People's Daily text keeps its own PKU segmentation",
                "char_vocab": "chars.txt (the characters inside a word, as the model reads them)",
                "corpus_segmenters": manifest.get("segmenters", {})}
    return {"language": "en", "tokens": "words", "tokenizer": "sacremoses", "version": versions["sacremoses"],
            "sentence_splitter": "elmokit.data.tokenizers.split_english",
            "how": "sentences cut with split_english, each tokenised with MosesTokenizer(lang='en')"
                   ".tokenize(sentence, escape=False); pre-tokenised sources keep their own tokens",
            "corpus_segmenters": manifest.get("segmenters", {})}


# ==================================================================================================== the build
def _is_built(folder: Path) -> bool:
    return (folder / "card.json").is_file() and (folder / "model.safetensors").is_file()


def _prepare_folder(folder: Path, overwrite: bool, resume: bool, spec: ZooSpec) -> None:
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"the zoo model folder {folder} is a file: remove it or choose another --cache")
    found = sorted(e for e in _OWN_ENTRIES if (folder / e).exists())
    if found and not (overwrite or resume):
        state = "a built model" if _is_built(folder) else "an unfinished build"
        raise UsageError(f"{folder} already holds {state} ({', '.join(found[:6])}): pass --overwrite to rebuild it "
                         f"from scratch or --resume to continue the build (`{rebuild_command(spec)} --resume`)")
    if overwrite:
        for e in found:
            p = folder / e
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        if found:
            logger.warning("overwrite: removed the earlier build from %s (%s)", folder, ", ".join(found))
    folder.mkdir(parents=True, exist_ok=True)


def _corpus_is_intact(corpus: Path) -> dict | None:
    """The manifest of a corpus already in ``corpus`` whose files match it (sha256), else ``None``."""
    try:
        manifest = json.loads((corpus / "corpus.json").read_text(encoding="utf-8"))
        for name in ("train.txt", "heldout.txt"):
            if _sha256(corpus / name) != manifest["files"][name]["sha256"]:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _word2vec_is_intact(folder: Path, train_sha: str, settings: dict) -> dict | None:
    from elmokit.baselines.word2vec import SETTINGS_FILE, VECTORS_FILE, WORD2VEC_SETTINGS

    try:
        meta = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        if (meta["train_text_sha256"] == train_sha and meta["settings"] == {**WORD2VEC_SETTINGS, **settings}
                and _sha256(folder / VECTORS_FILE) == meta["vectors_sha256"]):
            return meta
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _valid_records(metrics: Path) -> list[dict]:
    rows = []
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "valid":
            rows.append(r)
    return rows


class _Threads:
    """Set torch's intra-op thread count for a block, then restore it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self):
        import torch

        self.previous = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.previous)
        return False


def _apply_overrides(spec: ZooSpec, overrides: dict | None) -> tuple[ZooSpec, dict]:
    """The spec with test overrides applied (``model``, ``train``, ``valid_points``, ``wikitext``) and the other
    override groups (``corpus``: build_corpus options; ``word2vec``: settings; ``wikitext_file``: a path)."""
    if not overrides:
        return spec, {}
    known = {"model", "train", "valid_points", "wikitext", "corpus", "word2vec", "wikitext_file"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UsageError(f"unknown zoo build override(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    train = {**spec.train, **overrides.get("train", {})}
    new = ZooSpec(spec.name, spec.recipe, spec.language, copy.deepcopy(overrides.get("model", spec.model)), train,
                  overrides.get("valid_points", spec.valid_points), overrides.get("wikitext", spec.wikitext),
                  spec.tokenizer, spec.why)
    return new, {k: overrides[k] for k in ("corpus", "word2vec", "wikitext_file") if k in overrides}


def build_model(lang: str, data_dir: str | os.PathLike | None = None, cache: str | os.PathLike | None = None, *,
                overwrite: bool = False, resume: bool = False, progress: bool = True,
                overrides: dict | None = None, threads: int = THREADS) -> dict:
    """Build a zoo model from scratch (or continue an interrupted build) into :func:`model_dir` and return its card.

    Args:
        lang: ``"en"`` / ``"zh"`` (or ``"elmokit-en"`` / ``"elmokit-zh"``).
        data_dir: the shared data folder (see :func:`elmokit.recipes.zoo.corpora.resolve_data_dir`).
        cache: the cache root (default ``$ELMOKIT_CACHE``, else ``~/.cache/elmokit``); the model goes to
            ``<cache>/zoo/elmokit-<lang>``. The names resolve there only when ``$ELMOKIT_CACHE`` points at it.
        overwrite: remove an earlier build's files from the folder first (its own files only).
        resume: continue a build: a corpus and word2vec vectors that match their records are kept, the biLM run
            continues from its newest checkpoint (bit-exactly, see :mod:`elmokit.pretraining.trainer`).
        progress: show the training progress bar.
        threads: torch threads for the build (default :data:`THREADS`, the recipe's: a rebuild repeats the card's
            figures bit-exactly only on the same thread count; the card records it).
        overrides: **tests only** — ``{"model": options, "train": {TrainConfig fields}, "valid_points": n,
            "wikitext": bool, "wikitext_file": path, "corpus": {build_corpus options}, "word2vec": {settings}}``. The
            card records them and says that the model is not the zoo recipe.

    The steps and files are in the module docstring. Torch runs on ``threads`` threads during the build (the
    caller's setting is restored).

    Returns:
        The card (``card.json``'s content).

    Raises:
        UsageError: unknown language; both ``overwrite`` and ``resume``; the folder holds a build and neither is
            given; the folder is a file; an unknown override.
        FolderInUseError: another build of the same model is running (names its pid, start time and command): the
            model folder's writer lock is held from before the folder is looked at to the written card.
        MissingFileError: the data folder or a source file is missing (named).
        DataError / CheckpointError / TrainingError: from the corpus build or training (named).
        KeyboardInterrupt: Ctrl-C/SIGTERM (under :func:`elmokit.interrupts.handling_signals`): during training a
            checkpoint is written first, so ``resume=True`` continues.
    """
    from elmokit.recipes.zoo.corpora import resolve_data_dir

    if overwrite and resume:
        raise UsageError("--overwrite rebuilds from scratch and --resume continues the build: give one of them")
    base_spec = _spec(lang)
    spec, extra = _apply_overrides(base_spec, overrides)
    folder = model_dir(spec.name, cache)
    data = resolve_data_dir(data_dir)  # before the folder is touched
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"the zoo model folder {folder} is a file: remove it or choose another --cache")
    with folder_lock(folder, "zoo model folder"):
        return _build(spec, extra, folder, data, overwrite=overwrite, resume=resume, progress=progress,
                      overrides=overrides, threads=threads)


# long: the five steps of a build in order (the module docstring lists them), each timed, then the card
def _build(spec: ZooSpec, extra: dict, folder: Path, data: Path, *, overwrite: bool, resume: bool, progress: bool,
           overrides: dict | None, threads: int = THREADS) -> dict:
    """:func:`build_model`'s work, with the model folder locked."""
    from elmokit.baselines.ngram import kneser_ney_perplexity
    from elmokit.baselines.word2vec import WORD2VEC_SETTINGS, train_word2vec
    from elmokit.pretraining import TrainConfig, build_trainer, evaluate_perplexity, load_lm, unigram_perplexity
    from elmokit.recipes.zoo.corpora import build_corpus, source_table

    _prepare_folder(folder, overwrite, resume, spec)
    started = time.perf_counter()
    timing: dict[str, float] = {}

    # 1. corpus ------------------------------------------------------------------------------------------------
    corpus_dir = folder / "corpus"
    t0 = time.perf_counter()
    manifest = _corpus_is_intact(corpus_dir) if resume else None
    corpus_reused = manifest is not None
    if manifest is None:
        manifest = build_corpus(spec.recipe, data, corpus_dir, **extra.get("corpus", {}))
    _copy(corpus_dir / "corpus.json", folder / "corpus.json")
    timing["corpus_seconds"] = round(time.perf_counter() - t0, 1)
    logger.info("corpus %s (%s):\n%s", corpus_dir, "kept" if corpus_reused else "built", source_table(manifest))
    train_file, held_file = corpus_dir / "train.txt", corpus_dir / "heldout.txt"
    train = _read_lines(train_file)
    held = _read_lines(held_file)

    # 2. word2vec ----------------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    w2v_settings = dict(extra.get("word2vec", {}))
    w2v_meta = _word2vec_is_intact(folder / "word2vec", manifest["files"]["train.txt"]["sha256"],
                                   w2v_settings) if resume else None
    w2v_reused = w2v_meta is not None
    if w2v_meta is None:
        train_word2vec(train, folder / "word2vec", **w2v_settings)
        w2v_meta = json.loads((folder / "word2vec" / "word2vec.json").read_text(encoding="utf-8"))
    timing["word2vec_seconds"] = round(time.perf_counter() - t0, 1)

    # 3. the biLM ----------------------------------------------------------------------------------------------
    max_steps = spec.train["max_steps"]
    config = TrainConfig(train_files=[str(train_file)], out_dir=str(folder / "train"), model=spec.model,
                         valid_files=[str(held_file)], valid_every=max(1, max_steps // max(1, spec.valid_points)),
                         device="cpu", progress=progress, extra={"zoo": spec.name},
                         **spec.train)
    load_before = _loadavg()
    t0 = time.perf_counter()
    with _Threads(threads):
        trainer = build_trainer(config)
        summary = trainer.train(resume=True) if resume else trainer.train(overwrite=True)
    timing["bilm_seconds"] = round(time.perf_counter() - t0, 1)
    load_after = _loadavg()

    # 4. figures -----------------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    run_dir = folder / "train"
    lm = load_lm(run_dir / "model")
    valid = _valid_records(run_dir / "metrics.jsonl")
    final = next((r for r in reversed(valid) if r["step"] == summary["steps"]), None)
    with _Threads(threads):
        if final is None:  # (only when the metrics were lost) measure it again
            ppl = evaluate_perplexity(lm, held)
        else:
            ppl = {"forward": final["valid_ppl_fwd"], "backward": final["valid_ppl_bwd"],
                   "average": final["valid_ppl"], "tokens": final["valid_tokens"],
                   "sentences": final["valid_sentences"]}
        heldout = {"bilm": ppl, "unigram_add_one": unigram_perplexity(train, held, lm.vocab),
                   "kneser_ney_3": kneser_ney_perplexity(train, held, lm.vocab, order=3)}
        wikitext = None
        if spec.wikitext:
            wt_path = Path(extra.get("wikitext_file") or data / "wikitext-2" / "test.txt")
            wt, wt_stats = wikitext_sentences(wt_path)
            words = [t for s in wt for t in s]
            from elmokit.vocabulary import UNK

            oov = sum(1 for t in words if t != UNK and t not in lm.vocab)
            wikitext = {"file": str(wt_path), "sha256": _sha256(wt_path), **wt_stats,
                        "oov_words": oov, "oov_rate": (oov + wt_stats["unk"]) / max(1, len(words)),
                        "oov_rate_without_unk": oov / max(1, len(words)),
                        "bilm": evaluate_perplexity(lm, wt),
                        "unigram_add_one": unigram_perplexity(train, wt, lm.vocab),
                        "kneser_ney_3": kneser_ney_perplexity(train, wt, lm.vocab, order=3),
                        "protocol": WIKITEXT_PROTOCOL}
    timing["evaluation_seconds"] = round(time.perf_counter() - t0, 1)

    # 5. the model folder --------------------------------------------------------------------------------------
    for name in ("config.json", "model.safetensors", "vocab.txt", "chars.txt"):
        src = run_dir / "model" / name
        if src.is_file():
            _copy(src, folder / name)
        elif (folder / name).exists():
            (folder / name).unlink()
    atomic_write_text(folder / "tokenizer.json",
                      json.dumps(_tokenizer_info(spec, manifest), indent=2, ensure_ascii=False) + "\n")
    if (run_dir / "learning_curve.png").is_file():
        _copy(run_dir / "learning_curve.png", folder / "learning_curve.png")
    timing["total_seconds"] = round(time.perf_counter() - started, 1)

    n_train_tokens = manifest["files"]["train.txt"]["tokens"]
    best = min(valid, key=lambda r: r["valid_ppl"]) if valid else None
    loop = summary.get("loop_seconds") or 0.0
    training = {
        "steps": summary["steps"], "tokens_this_session": summary["tokens"],
        "targets_per_direction_per_epoch": n_train_tokens + manifest["files"]["train.txt"]["sentences"],
        "epochs": None, "train_seconds": round(summary["seconds"], 1), "loop_seconds": round(loop, 1),
        "tokens_per_s": round(summary["tokens"] / loop, 1) if loop else None,
        "heldout_evaluations": len(valid),
        "resumed": bool(resume), "final_loss": summary.get("final_loss"),
        "best_heldout": None if best is None else {"step": best["step"], "average": best["valid_ppl"]},
        "curve": [{"step": r["step"], "average": round(r["valid_ppl"], 2)} for r in valid],
        "loadavg_before": load_before, "loadavg_after": load_after,
    }
    if not resume:
        training["epochs"] = round(summary["tokens"] / training["targets_per_direction_per_epoch"], 2)
    train_cfg = trainer.config.to_dict()
    for k in ("train_files", "out_dir", "valid_files", "progress", "extra", "init_from", "freeze_bilm_steps",
              "vocab_file", "data_parts", "device", "decode_errors", "valid_minutes", "checkpoint_minutes"):
        train_cfg.pop(k, None)
    card = {
        "name": spec.name, "language": spec.language, "recipe": spec.recipe,
        "rebuild_command": rebuild_command(spec),
        "cache_note": "the model folder is <cache>/zoo/" + spec.name + " with <cache> = $ELMOKIT_CACHE (default "
                      "~/.cache/elmokit); the names resolve there",
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git": _git_commit(), "versions": _versions(),
        "overrides": overrides or None,
        "data": {
            "data_dir": str(data),
            "sources": [{k: s[k] for k in ("name", "folder", "tokenisation", "sentences_read", "dropped_kept_out",
                                           "dropped_in_kept_out_sentence", "dropped_in_leaked_document",
                                           "dropped_duplicate", "train_sentences", "train_tokens",
                                           "heldout_sentences", "heldout_tokens")} for s in manifest["sources"]],
            "files": manifest["files"], "kept_out": [k["name"] if isinstance(k, dict) else k
                                                     for k in manifest.get("kept_out", [])],
            "exclusions": manifest["exclusions"], "split": manifest["split"],
            "heldout_fraction": manifest["heldout_fraction"], "seed": manifest["seed"],
            "vocabulary": {"size": len(lm.vocab), "min_count": spec.train["min_count"]},
            "characters": None if lm.char_vocab is None else lm.char_vocab.vocab_size,
            "leak_check": manifest["leak_check"], "limit": manifest.get("limit"),
            "corpus_reused": corpus_reused,
        },
        "configuration": {"model": spec.model, "train": train_cfg, "torch_threads": threads,
                          "valid_every": config.valid_every, "why": spec.why,
                          "word2vec": {**WORD2VEC_SETTINGS, **w2v_settings}},
        "tokenizer": _tokenizer_info(spec, manifest),
        "figures": {"heldout": heldout, "wikitext2_test": wikitext, "training": training,
                    "word2vec": {k: w2v_meta.get(k) for k in ("sentences", "tokens", "vocabulary", "train_seconds",
                                                              "vectors_sha256", "gensim_version")},
                    "word2vec_reused": w2v_reused, "timing": timing},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
        "learning_curve": "learning_curve.png",
        "files": {},
    }
    for name in MODEL_FILES:
        p = folder / name
        if p.is_file():
            card["files"][name] = {"sha256": _sha256(p), "bytes": p.stat().st_size}
    vec = folder / "word2vec" / "vectors.bin"
    card["files"]["word2vec/vectors.bin"] = {"sha256": _sha256(vec), "bytes": vec.stat().st_size}
    for name in ("train.txt", "heldout.txt"):
        card["files"][f"corpus/{name}"] = {"sha256": manifest["files"][name]["sha256"],
                                           "bytes": manifest["files"][name]["bytes"]}
    atomic_write_text(folder / "README.md", render_card(card))
    atomic_write_text(folder / "card.json", json.dumps(card, indent=2, ensure_ascii=False) + "\n")
    logger.info("zoo model %s built in %s (%.1f min)", spec.name, folder, timing["total_seconds"] / 60)
    return card


# ==================================================================================================== cards
def read_card(folder: str | os.PathLike) -> dict | None:
    """``card.json`` of a zoo model folder, or ``None`` (missing or unreadable)."""
    try:
        return json.loads((Path(folder) / "card.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _f(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:,.{digits}f}"


def _minutes(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 60:.1f} min"


def render_card(card: dict) -> str:
    """The ``README.md`` model card from ``card.json``'s content (Markdown)."""
    fig = card["figures"]
    h = fig["heldout"]
    tr = fig["training"]
    tm = fig["timing"]
    d = card["data"]
    cfg = card["configuration"]
    t = cfg["train"]
    lstm, cnn = cfg["model"]["lstm"], cfg["model"]["char_cnn"]
    lines = [f"# {card['name']}: {card['language']} biLM trained by elmokit", ""]
    if card.get("overrides"):
        lines += ["**Test build**: this model was built with overrides of the zoo recipe "
                  f"(`{json.dumps(card['overrides'], ensure_ascii=False)}`); it is not `{card['name']}`.", ""]
    lines += [
        "## Rebuild", "",
        "```bash", f"{card['rebuild_command']}          # into $ELMOKIT_CACHE/zoo/{card['name']}", "```", "",
        f"From scratch with fixed seeds; on the same machine and versions it repeats bit-exactly (torch "
        f"{cfg['torch_threads']} threads, deterministic algorithms). `--resume` continues an interrupted build, "
        "`--overwrite` rebuilds a built one. Source: git commit `{commit}`{dirty}; built {built}.".format(
            commit=card["git"]["commit"], built=card["built_at"],
            dirty=" (with uncommitted changes)" if card["git"].get("dirty") else ""),
        "", "Versions: " + ", ".join(f"{k} {v}" for k, v in card["versions"].items()) + ".", "",
        "## Use", "",
        "```python", "from elmokit import Elmo, Embedder",
        f"elmo = Elmo.from_pretrained({card['name']!r}, num_output_representations=1)",
        f"vectors = Embedder({card['name']!r}).embed_sentence(tokens)   # (3, len(tokens), 256)",
        "```", "",
    ]
    tok = card["tokenizer"]
    if tok.get("segmenter") == "jieba":
        lines += [f"Tokens are **words**: segment raw text with {tok['version']} as the corpus was "
                  "(`elmokit.data.tokenizers.load_tokenizer('elmokit-zh')` does it); the characters inside a word are read "
                  "through the character vocabulary `chars.txt` (the model cannot be exported to the original "
                  "options.json + HDF5 format, which has no character vocabulary).", ""]
    else:
        lines += [f"Tokens: {tok['version']} for raw text (`elmokit.data.tokenizers.load_tokenizer('elmokit-en')`), the "
                  "sources' own tokenisation where they have one. `elmokit export elmokit-en OUT` writes "
                  "options.json + weights.hdf5 + vocab.txt for bilm-tf / AllenNLP.", ""]
    lines += ["## Data", "",
              f"Recipe `{card['recipe']}` (`elmokit.recipes.zoo.corpora`), held-out fraction {d['heldout_fraction']}, seed "
              f"{d['seed']}; {d['files']['train.txt']['tokens']:,} training tokens in "
              f"{d['files']['train.txt']['sentences']:,} sentences, {d['files']['heldout.txt']['tokens']:,} held-out "
              f"tokens in {d['files']['heldout.txt']['sentences']:,} sentences; vocabulary {d['vocabulary']['size']:,} "
              f"(min count {d['vocabulary']['min_count']}, with `<S>`, `</S>`, `<UNK>`)"
              + (f", {d['characters']:,} character ids" if d.get("characters") else "") + ".", "",
              "| source | tokenisation | read | dropped (kept-out / inside kept-out / leaked review / duplicate) | "
              "train sentences | train tokens | held-out sentences | held-out tokens |",
              "|---|---|---:|---|---:|---:|---:|---:|"]
    for s in d["sources"]:
        lines.append(f"| {s['name']} | {s['tokenisation']} | {s['sentences_read']:,} | {s['dropped_kept_out']} / "
                     f"{s['dropped_in_kept_out_sentence']} / {s['dropped_in_leaked_document']} / "
                     f"{s['dropped_duplicate']} | {s['train_sentences']:,} | {s['train_tokens']:,} | "
                     f"{s['heldout_sentences']:,} | {s['heldout_tokens']:,} |")
    lines += ["", "Kept out: " + "; ".join(d["kept_out"]) + ".", "", "Exclusions:", ""]
    lines += [f"- {e}" for e in d["exclusions"]]
    lines += ["", f"Split: {d['split']}. Leak check on the written files: {json.dumps(d['leak_check'])}.", ""]
    lines += ["## Configuration", "",
              f"Char CNN {sum(n for _, n in cnn['filters'])} filters (widths "
              f"{', '.join(str(w) for w, _ in cnn['filters'])}), {cnn['n_highway']} highway, "
              f"{cnn['max_characters_per_token']} characters a token"
              + (" (character vocabulary)" if t.get("char_vocab") else " (UTF-8 bytes)")
              + f"; LSTM {lstm['dim']} → projection {lstm['projection_dim']}, {lstm['n_layers']} layers, skip "
              f"connections, clips {lstm['cell_clip']}/{lstm['proj_clip']}. Training: {t['batching']} batching, "
              f"{t['batch_size']} a step, {t['max_steps']:,} steps, {t['optimizer']} lr {t['lr']}, clip norm "
              f"{t['clip_norm']}, dropout {t['dropout']}, "
              + (f"sampled softmax with {t['n_negative_samples']:,} negatives" if t["n_negative_samples"]
                 else "full softmax")
              + f", min count {t['min_count']}, seed {t['seed']}, {cfg['torch_threads']} torch threads, "
              f"deterministic algorithms; held-out perplexity every {cfg['valid_every']} steps.", "",
              f"Why: {cfg['why']}.", "",
              "word2vec baseline (`word2vec/vectors.bin`, gensim): "
              + ", ".join(f"{k}={v}" for k, v in cfg["word2vec"].items()) + ".", "",
              "Full configuration: `card.json` (`configuration`), `train/train_config.json`.", ""]
    lines += ["## Figures", "",
              "Perplexity under the biLM's protocol: each sentence from a zero state, per direction its words plus one "
              "boundary, words outside the vocabulary as `<UNK>`; average = exp of the mean of the two directions' "
              "mean NLL. The baselines are fitted on the same `train.txt` over the same vocabulary (add-one unigram; "
              "interpolated Kneser-Ney 3-gram, discount 0.75, forward and backward).", "",
              "| text | biLM forward | biLM backward | biLM average | add-one unigram | Kneser-Ney 3-gram average |",
              "|---|---:|---:|---:|---:|---:|",
              f"| held-out ({h['bilm']['tokens']:,} targets) | {_f(h['bilm']['forward'])} | "
              f"{_f(h['bilm']['backward'])} | **{_f(h['bilm']['average'])}** | {_f(h['unigram_add_one'])} | "
              f"{_f(h['kneser_ney_3']['average'])} |"]
    wt = fig.get("wikitext2_test")
    if wt:
        lines.append(f"| WikiText-2 test ({wt['bilm']['tokens']:,} targets) | {_f(wt['bilm']['forward'])} | "
                     f"{_f(wt['bilm']['backward'])} | **{_f(wt['bilm']['average'])}** | "
                     f"{_f(wt['unigram_add_one'])} | {_f(wt['kneser_ney_3']['average'])} |")
    lines.append("")
    if wt:
        lines += [f"WikiText-2 test: {wt['protocol']} {wt['sentences']:,} sentences, {wt['words']:,} words "
                  f"({wt['headings']} headings dropped); {wt['unk']:,} WikiText `<unk>` and {wt['oov_words']:,} other "
                  f"words outside the vocabulary: OOV rate {100 * wt['oov_rate']:.2f} % "
                  f"({100 * wt['oov_rate_without_unk']:.2f} % without `<unk>`).", ""]
    best = tr.get("best_heldout")
    lines += [f"Training: {tr['steps']:,} steps"
              + (f" ({tr['epochs']} epochs)" if tr.get("epochs") is not None else "")
              + f", {_f(tr['tokens_per_s'], 0)} tokens/s over the training loop (one direction's targets; "
              f"the held-out evaluations after step 0 included; {tr['heldout_evaluations']} in all), biLM training "
              f"{_minutes(tm.get('bilm_seconds'))} wall"
              + (" (this session of a resumed build)" if tr.get("resumed") else "")
              + f"; whole build {_minutes(tm.get('total_seconds'))} (corpus {_f(tm.get('corpus_seconds'))} s, "
              f"word2vec {_f(tm.get('word2vec_seconds'))} s, final evaluation {_f(tm.get('evaluation_seconds'))} s) "
              f"on {card['machine']['cpus']} CPUs (load average before/after training "
              f"{tr.get('loadavg_before')} / {tr.get('loadavg_after')}).", ""]
    if best:
        lines += ["Held-out curve (average): " + ", ".join(f"step {c['step']}: {c['average']}" for c in tr["curve"])
                  + f"; best {best['average']:.2f} at step {best['step']} (the folder's model is the final one; "
                  "`train/best/` holds the best). Learning curve: `learning_curve.png`.", ""]
    lines += ["## Files", "", "| file | bytes | sha256 |", "|---|---:|---|"]
    for name, info in card["files"].items():
        lines.append(f"| `{name}` | {info['bytes']:,} | `{info['sha256']}` |")
    lines += ["", "`train/` holds the training run (checkpoints, `metrics.jsonl`, `best/`), `corpus/` the corpus and "
              "`corpus.json` its manifest (per-source counts, sha256 of every source file).", ""]
    return "\n".join(lines)


def list_models(cache: str | os.PathLike | None = None) -> list[dict]:
    """Every zoo model: ``{"name", "lang", "path", "state" ("built" / "unfinished" / "not built"), "card"
    (summary or None), "rebuild_command"}``."""
    out = []
    for lang, spec in SPECS.items():
        folder = model_dir(lang, cache)
        card = read_card(folder) if _is_built(folder) else None
        if card is not None:
            state = "built"
        elif folder.is_dir() and any((folder / e).exists() for e in _OWN_ENTRIES):
            state = "unfinished"
        else:
            state = "not built"
        summary = None
        if card is not None:
            h = card["figures"]["heldout"]
            wt = card["figures"].get("wikitext2_test")
            summary = {"heldout_average": h["bilm"]["average"], "unigram": h["unigram_add_one"],
                       "kneser_ney_3": h["kneser_ney_3"]["average"],
                       "wikitext2_test_average": wt["bilm"]["average"] if wt else None,
                       "steps": card["figures"]["training"]["steps"],
                       "tokens_per_s": card["figures"]["training"]["tokens_per_s"],
                       "build_minutes": round(card["figures"]["timing"]["total_seconds"] / 60, 1),
                       "built_at": card["built_at"], "commit": card["git"]["commit"],
                       "test_build": bool(card.get("overrides"))}
        out.append({"name": spec.name, "lang": lang, "path": str(folder), "state": state, "card": summary,
                    "rebuild_command": rebuild_command(spec)})
    return out
