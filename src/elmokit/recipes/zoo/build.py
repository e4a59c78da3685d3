"""The model zoo's builds: ``elmokit zoo build {en,zh}`` makes the English or Chinese biLM, its word2vec baseline and
its card, from scratch and with a fixed seed, into ``$ELMOKIT_CACHE/zoo/elmokit-<lang>/``.

One build (:func:`build_model`) is, in order:

1. the corpus (:func:`elmokit.recipes.zoo.corpora.build_corpus`: ``corpus/train.txt``, ``corpus/heldout.txt``,
   ``corpus.json``), leak-free;
2. the static baseline (:func:`elmokit.baselines.word2vec.train_word2vec`, fixed settings, one worker) on exactly
   the tokens of ``train.txt`` (``word2vec/``);
3. the biLM with the language's **one** fixed configuration (:data:`~elmokit.recipes.zoo.specs.SPECS`: architecture,
   batching, batch size, negatives, optimiser, learning rate, dropout, min_count, a fixed step count, seed), trained
   through :func:`elmokit.pretraining.build_trainer` / :meth:`~elmokit.pretraining.Trainer.train` with 2 torch threads
   and deterministic algorithms (so the rebuild repeats bit-exactly on the same machine and versions, and ``--resume``
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

Each step is a method of the build (:class:`_ZooBuild`); the configurations are in :mod:`.specs`, the figures in
:mod:`.figures`, the card in :mod:`.card`. Tests build a tiny model with :func:`build_spec` and a spec of their own.

Names: ``elmokit-en`` and ``elmokit-zh`` (:data:`elmokit.weights.native.ZOO_MODELS`) resolve to these folders in
every loader (``Elmo.from_pretrained``, ``Embedder``, ``elmokit embed``/``info``/``export``).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import time
from dataclasses import fields
from pathlib import Path

import torch

from elmokit.baselines.word2vec import SETTINGS_FILE, VECTORS_FILE, WORD2VEC_SETTINGS, train_word2vec
from elmokit.data.tokenizers import load_tokenizer, segmenter_versions
from elmokit.errors import UsageError, UsageTypeError
from elmokit.io import atomic_path, atomic_write_text, file_sha256, folder_lock
from elmokit.pretraining import TrainConfig, build_trainer, load_lm
from elmokit.recipes.zoo.card import (
    data_record,
    file_records,
    git_commit,
    machine,
    read_card,
    render_card,
    train_configuration,
    versions,
)
from elmokit.recipes.zoo.corpora import build_corpus, resolve_data_dir, source_table, write_heldout_subset
from elmokit.recipes.zoo.figures import (
    WIKITEXT_PROTOCOL,
    heldout_figures,
    run_tokens_per_s,
    training_figures,
    valid_records,
    wikitext_figures,
    wikitext_sentences,
)
from elmokit.recipes.zoo.specs import (
    MODEL_FILES,
    OWN_ENTRIES,
    SPECS,
    THREADS,
    ZooSpec,
    find_spec,
    model_dir,
    rebuild_command,
    spec_differences,
)

__all__ = [
    "SPECS",
    "ZooSpec",
    "build_model",
    "build_spec",
    "model_dir",
    "list_models",
    "read_card",
    "render_card",
    "wikitext_sentences",
    "load_tokenizer",
    "MODEL_FILES",
    "THREADS",
    "WIKITEXT_PROTOCOL",
]

logger = logging.getLogger(__name__)


# ==================================================================================================== helpers
def _copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` atomically (an interrupted copy leaves the old file or none)."""
    with atomic_path(dst, suffix=dst.suffix) as tmp:
        shutil.copyfile(src, tmp)


def _read_lines(path: Path) -> list[list[str]]:
    """The sentences (token lists) of a corpus file, blank lines skipped."""
    return [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _seconds_since(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)


class _Threads:
    """Set torch's intra-op thread count for a block, then restore it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self):
        self.previous = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)
        return False


def _tokenizer_info(spec: ZooSpec, manifest: dict) -> dict:
    """``tokenizer.json``: what a token of the model is and how raw text was cut and tokenised, with versions."""
    versions_ = segmenter_versions()
    if spec.tokenizer == "jieba":
        return {
            "language": "zh",
            "tokens": "words",
            "segmenter": "jieba",
            "version": versions_["jieba"],
            "sentence_splitter": "elmokit.data.tokenizers.split_chinese",
            "how": "sentences cut with split_chinese, each segmented with jieba.Tokenizer() (default "
            "dictionary) .lcut(sentence, HMM=True); People's Daily text keeps its own PKU segmentation",
            "char_vocab": "chars.txt (the characters inside a word, as the model reads them)",
            "corpus_segmenters": manifest.get("segmenters", {}),
        }
    return {
        "language": "en",
        "tokens": "words",
        "tokenizer": "sacremoses",
        "version": versions_["sacremoses"],
        "sentence_splitter": "elmokit.data.tokenizers.split_english",
        "how": "sentences cut with split_english, each tokenised with MosesTokenizer(lang='en')"
        ".tokenize(sentence, escape=False); pre-tokenised sources keep their own tokens",
        "corpus_segmenters": manifest.get("segmenters", {}),
    }


# ==================================================================================================== the folder
def _is_built(folder: Path) -> bool:
    return (folder / "card.json").is_file() and (folder / "model.safetensors").is_file()


def _prepare_folder(folder: Path, overwrite: bool, resume: bool, spec: ZooSpec) -> None:
    """Refuse a folder holding a build unless ``overwrite`` or ``resume``; with ``overwrite`` remove the build's own
    entries (:data:`~elmokit.recipes.zoo.specs.OWN_ENTRIES`, nothing else); create the folder.

    Raises:
        UsageError: the folder is a file, or holds a build and neither flag is given."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"the zoo model folder {folder} is a file: remove it or choose another --cache")
    found = sorted(e for e in OWN_ENTRIES if (folder / e).exists())
    if found and not (overwrite or resume):
        state = "a built model" if _is_built(folder) else "an unfinished build"
        raise UsageError(
            f"{folder} already holds {state} ({', '.join(found[:6])}): pass --overwrite to rebuild it "
            f"from scratch or --resume to continue the build (`{rebuild_command(spec)} --resume`)"
        )
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
            if file_sha256(corpus / name) != manifest["files"][name]["sha256"]:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _word2vec_is_intact(folder: Path, train_sha: str, settings: dict) -> dict | None:
    """The record (``word2vec.json``) of vectors in ``folder`` trained on the text of ``train_sha`` with
    ``settings`` and whose vectors match their sha256, else ``None``."""
    try:
        meta = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        if (
            meta["train_text_sha256"] == train_sha
            and meta["settings"] == {**WORD2VEC_SETTINGS, **settings}
            and file_sha256(folder / VECTORS_FILE) == meta["vectors_sha256"]
        ):
            return meta
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


# ==================================================================================================== the build
class _ZooBuild:
    """One build of a zoo model into its (locked, prepared) folder, as named steps in order: :meth:`corpus`,
    :meth:`word2vec`, :meth:`train_bilm`, :meth:`evaluate`, :meth:`write_model_folder`, :meth:`write_card`.
    Each step records its wall time in ``timing``; :meth:`run` runs them all and returns the card."""

    def __init__(self, spec: ZooSpec, folder: Path, data: Path, *, resume: bool, progress: bool, threads: int) -> None:
        self.spec, self.folder, self.data = spec, folder, data
        self.resume, self.progress, self.threads = resume, progress, threads
        self.corpus_dir = folder / "corpus"
        self.run_dir = folder / "train"
        self.timing: dict[str, float] = {}
        self.started = time.perf_counter()

    def run(self) -> dict:
        """Every step in order; the card (``card.json``'s content)."""
        self.corpus()
        self.word2vec()
        self.train_bilm()
        self.evaluate()
        self.write_model_folder()
        return self.write_card()

    def corpus(self) -> None:
        """1. The leak-free corpus (``corpus/``; kept on resume when its files match its manifest), read back."""
        t0 = time.perf_counter()
        manifest = _corpus_is_intact(self.corpus_dir) if self.resume else None
        self.corpus_reused = manifest is not None
        if manifest is None:
            text_cache = self.folder.parent.parent / "corpora"  # <cache>/corpora beside <cache>/zoo/<name>
            manifest = build_corpus(
                self.spec.recipe, self.data, self.corpus_dir, text_cache=text_cache, **self.spec.corpus
            )
        _copy(self.corpus_dir / "corpus.json", self.folder / "corpus.json")
        self.manifest = manifest
        self.timing["corpus_seconds"] = _seconds_since(t0)
        logger.info(
            "corpus %s (%s):\n%s", self.corpus_dir, "kept" if self.corpus_reused else "built", source_table(manifest)
        )
        self.train_sentences = _read_lines(self.corpus_dir / "train.txt")
        self.held_sentences = _read_lines(self.corpus_dir / "heldout.txt")

    def word2vec(self) -> None:
        """2. The word2vec baseline on exactly the tokens of ``train.txt`` (``word2vec/``; kept on resume when it
        matches the text and settings)."""
        t0 = time.perf_counter()
        out = self.folder / "word2vec"
        train_sha = self.manifest["files"]["train.txt"]["sha256"]
        meta = _word2vec_is_intact(out, train_sha, self.spec.word2vec) if self.resume else None
        self.w2v_reused = meta is not None
        if meta is None:
            train_word2vec(self.train_sentences, out, **self.spec.word2vec)
            meta = json.loads((out / SETTINGS_FILE).read_text(encoding="utf-8"))
        self.w2v_meta = meta
        self.timing["word2vec_seconds"] = _seconds_since(t0)

    def train_bilm(self) -> None:
        """3. The biLM with the spec's fixed configuration on ``threads`` torch threads (``train/``; on resume from
        its newest checkpoint), held-out perplexity every ``max_steps / valid_points`` steps."""
        spec = self.spec
        max_steps = spec.train["max_steps"]
        valid = self.corpus_dir / "heldout.txt"
        self.curve_subset = None
        if spec.curve_tokens is not None:  # the curve on a fixed subset; the final model on the whole split
            self.curve_subset = write_heldout_subset(self.corpus_dir, spec.curve_tokens)
            valid = self.corpus_dir / self.curve_subset["file"]
        self.config = TrainConfig(
            train_files=[str(self.corpus_dir / "train.txt")],
            out_dir=str(self.run_dir),
            model=spec.model,
            valid_files=[str(valid)],
            valid_every=max(1, max_steps // max(1, spec.valid_points)),
            device="cpu",
            progress=self.progress,
            extra={"zoo": spec.name},
            **spec.train,
        )
        self.loadavg_before = _loadavg()
        # resumed from a checkpoint (not: a resumed build whose training had not saved one, which starts at step 0)
        self.training_resumed = self.resume and any(self.run_dir.glob("ckpt-*.safetensors"))
        t0 = time.perf_counter()
        with _Threads(self.threads):
            trainer = build_trainer(self.config)
            self.summary = trainer.train(resume=True) if self.resume else trainer.train(overwrite=True)
        self.timing["bilm_seconds"] = _seconds_since(t0)
        self.loadavg_after = _loadavg()
        self.train_config = train_configuration(trainer.config.to_dict())

    def evaluate(self) -> None:
        """4. The figures of the final model: held-out beside the baselines, WikiText-2 test where the spec asks,
        the training run's."""
        t0 = time.perf_counter()
        self.lm = load_lm(self.run_dir / "model")
        valid = valid_records(self.run_dir / "metrics.jsonl")
        final = next((r for r in reversed(valid) if r["step"] == self.summary["steps"]), None)
        if self.curve_subset is not None:  # the curve's last point scored the subset: score the whole split
            final = None
        with _Threads(self.threads):
            self.heldout = heldout_figures(self.lm, self.train_sentences, self.held_sentences, final)
            self.wikitext = None
            if self.spec.wikitext:
                path = Path(self.spec.wikitext_file or self.data / "wikitext-2" / "test.txt")
                self.wikitext = wikitext_figures(self.lm, self.train_sentences, path)
        self.timing["evaluation_seconds"] = _seconds_since(t0)
        self.training = training_figures(
            self.summary,
            valid,
            self.manifest,
            resumed=self.training_resumed,
            loadavg=(self.loadavg_before, self.loadavg_after),
            logged_tokens_per_s=run_tokens_per_s(self.run_dir / "metrics.jsonl"),
        )
        self.training["curve_subset"] = self.curve_subset

    def write_model_folder(self) -> None:
        """5a. The native model files, ``tokenizer.json`` and the learning curve into the model folder."""
        for name in ("config.json", "model.safetensors", "vocab.txt", "chars.txt"):
            src = self.run_dir / "model" / name
            if src.is_file():
                _copy(src, self.folder / name)
            elif (self.folder / name).exists():
                (self.folder / name).unlink()
        atomic_write_text(
            self.folder / "tokenizer.json",
            json.dumps(_tokenizer_info(self.spec, self.manifest), indent=2, ensure_ascii=False) + "\n",
        )
        if (self.run_dir / "learning_curve.png").is_file():
            _copy(self.run_dir / "learning_curve.png", self.folder / "learning_curve.png")
        self.timing["total_seconds"] = _seconds_since(self.started)

    def write_card(self) -> dict:
        """5b. ``card.json`` and the ``README.md`` card; returns the card."""
        spec = self.spec
        card = {
            "name": spec.name,
            "language": spec.language,
            "recipe": spec.recipe,
            "rebuild_command": rebuild_command(spec),
            "cache_note": "the model folder is <cache>/zoo/" + spec.name + " with <cache> = $ELMOKIT_CACHE (default "
            "~/.cache/elmokit); the names resolve there",
            "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git": git_commit(),
            "versions": versions(),
            "overrides": spec_differences(spec),
            "data": data_record(spec, self.manifest, self.data, self.lm, self.corpus_reused),
            "configuration": {
                "model": spec.model,
                "train": self.train_config,
                "torch_threads": self.threads,
                "valid_every": self.config.valid_every,
                "why": spec.why,
                "word2vec": {**WORD2VEC_SETTINGS, **spec.word2vec},
            },
            "tokenizer": _tokenizer_info(spec, self.manifest),
            "figures": {
                "heldout": self.heldout,
                "wikitext2_test": self.wikitext,
                "training": self.training,
                "word2vec": {
                    k: self.w2v_meta.get(k)
                    for k in ("sentences", "tokens", "vocabulary", "train_seconds", "vectors_sha256", "gensim_version")
                },
                "word2vec_reused": self.w2v_reused,
                "timing": self.timing,
            },
            "machine": machine(),
            "learning_curve": "learning_curve.png",
            "files": file_records(self.folder, self.manifest),
        }
        atomic_write_text(self.folder / "README.md", render_card(card))
        atomic_write_text(self.folder / "card.json", json.dumps(card, indent=2, ensure_ascii=False) + "\n")
        logger.info("zoo model %s built in %s (%.1f min)", spec.name, self.folder, self.timing["total_seconds"] / 60)
        return card


def _check_spec(spec: ZooSpec) -> None:
    """A spec :func:`build_spec` can follow: a :class:`ZooSpec` of a zoo model name whose ``train`` holds only
    TrainConfig fields (files and folders excepted).

    Raises:
        UsageTypeError: not a ZooSpec. UsageError: an unknown name or ``train`` field (named)."""
    if not isinstance(spec, ZooSpec):
        raise UsageTypeError(
            f"spec must be a ZooSpec (e.g. dataclasses.replace(SPECS['zh'], ...)), got {type(spec).__name__}"
        )
    find_spec(spec.name)
    allowed = {f.name for f in fields(TrainConfig)} - {
        "train_files",
        "out_dir",
        "model",
        "valid_files",
        "valid_every",
        "device",
        "progress",
        "extra",
    }
    unknown = sorted(set(spec.train) - allowed)
    if unknown:
        raise UsageError(
            f"zoo spec {spec.name}: unknown train field(s) {', '.join(unknown)} (TrainConfig fields "
            "other than files, folders, model, valid_every, device, progress and extra)"
        )


def build_model(
    lang: str,
    data_dir: str | os.PathLike | None = None,
    cache: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    threads: int = THREADS,
) -> dict:
    """Build a zoo model from scratch (or continue an interrupted build) into :func:`model_dir` and return its card:
    :func:`build_spec` with the language's fixed spec (:data:`SPECS`).

    Args:
        lang: ``"en"`` / ``"zh"`` (or ``"elmokit-en"`` / ``"elmokit-zh"``).
        data_dir, cache, overwrite, resume, progress, threads: as :func:`build_spec`.

    Raises:
        UsageError: unknown language; and as :func:`build_spec`.
    """
    return build_spec(
        find_spec(lang), data_dir, cache, overwrite=overwrite, resume=resume, progress=progress, threads=threads
    )


def build_spec(
    spec: ZooSpec,
    data_dir: str | os.PathLike | None = None,
    cache: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    threads: int = THREADS,
) -> dict:
    """Build the model of ``spec`` (a zoo spec of :data:`SPECS`, or a test's own made from one with
    ``dataclasses.replace``: its card then records the differences and says it is a test build) into the folder of
    its name, and return its card.

    Args:
        spec: the recipe: architecture, training settings, corpus options, word2vec settings, WikiText-2 file.
        data_dir: the shared data folder (see :func:`elmokit.recipes.zoo.corpora.resolve_data_dir`).
        cache: the cache root (default ``$ELMOKIT_CACHE``, else ``~/.cache/elmokit``); the model goes to
            ``<cache>/zoo/elmokit-<lang>``. The names resolve there only when ``$ELMOKIT_CACHE`` points at it.
        overwrite: remove an earlier build's files from the folder first (its own files only).
        resume: continue a build: a corpus and word2vec vectors that match their records are kept, the biLM run
            continues from its newest checkpoint (bit-exactly, see :mod:`elmokit.pretraining.trainer`).
        progress: show the training progress bar.
        threads: torch threads for the build (default :data:`THREADS`, the recipe's: a rebuild repeats the card's
            figures bit-exactly only on the same thread count; the card records it). The caller's setting is
            restored afterwards.

    Returns:
        The card (``card.json``'s content).

    Raises:
        UsageError: both ``overwrite`` and ``resume``; the folder holds a build and neither is given; the folder is
            a file; a spec that is not a zoo model's or has unknown ``train`` fields (UsageTypeError: not a ZooSpec).
        FolderInUseError: another build of the same model is running (names its pid, start time and command): the
            model folder's writer lock is held from before the folder is looked at to the written card.
        MissingFileError: the data folder or a source file is missing (named).
        DataError / CheckpointError / TrainingError: from the corpus build or training (named).
        KeyboardInterrupt: Ctrl-C/SIGTERM (under :func:`elmokit.interrupts.handling_signals`): during training a
            checkpoint is written first, so ``resume=True`` continues.
    """
    if overwrite and resume:
        raise UsageError("--overwrite rebuilds from scratch and --resume continues the build: give one of them")
    _check_spec(spec)
    folder = model_dir(spec.name, cache)
    data = resolve_data_dir(data_dir)  # before the folder is touched
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"the zoo model folder {folder} is a file: remove it or choose another --cache")
    with folder_lock(folder, "zoo model folder"):
        _prepare_folder(folder, overwrite, resume, spec)
        return _ZooBuild(spec, folder, data, resume=resume, progress=progress, threads=threads).run()


# ==================================================================================================== listing
def _summary(card: dict) -> dict:
    """The figures ``elmokit zoo list`` prints from a card."""
    h = card["figures"]["heldout"]
    wt = card["figures"].get("wikitext2_test")
    return {
        "heldout_average": h["bilm"]["average"],
        "unigram": h["unigram_add_one"],
        "kneser_ney_3": h["kneser_ney_3"]["average"],
        "kneser_ney_5_modified": (h.get("kneser_ney_5_modified") or {}).get("average"),
        "wikitext2_test_average": wt["bilm"]["average"] if wt else None,
        "steps": card["figures"]["training"]["steps"],
        "tokens_per_s": card["figures"]["training"]["tokens_per_s"],
        "build_minutes": round(card["figures"]["timing"]["total_seconds"] / 60, 1),
        "built_at": card["built_at"],
        "commit": card["git"]["commit"],
        "test_build": bool(card.get("overrides")),
    }


def list_models(cache: str | os.PathLike | None = None) -> list[dict]:
    """Every zoo model: ``{"name", "lang", "path", "state" ("built" / "unfinished" / "not built"), "card"
    (summary or None), "rebuild_command"}``."""
    out = []
    for lang, spec in SPECS.items():
        folder = model_dir(lang, cache)
        card = read_card(folder) if _is_built(folder) else None
        if card is not None:
            state = "built"
        elif folder.is_dir() and any((folder / e).exists() for e in OWN_ENTRIES):
            state = "unfinished"
        else:
            state = "not built"
        out.append(
            {
                "name": spec.name,
                "lang": lang,
                "path": str(folder),
                "state": state,
                "card": None if card is None else _summary(card),
                "rebuild_command": rebuild_command(spec),
            }
        )
    return out
