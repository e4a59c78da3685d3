"""The zoo's models and their one fixed configuration each (:data:`SPECS`), where they live (:func:`model_dir`) and
how they are rebuilt (:func:`rebuild_command`).

A build (:func:`elmokit.recipes.zoo.build.build_model`) follows a :class:`ZooSpec`; a test builds a tiny model by
giving :func:`elmokit.recipes.zoo.build.build_spec` a spec of its own (``dataclasses.replace(SPECS["zh"], ...)``),
and the card then records how that spec differs from the zoo's (:func:`spec_differences`) and says it is a test build.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from elmokit.errors import UsageError
from elmokit.weights.native import zoo_model_dir

__all__ = [
    "SPECS",
    "ZooSpec",
    "THREADS",
    "MODEL_FILES",
    "model_dir",
    "find_spec",
    "rebuild_command",
    "spec_differences",
]

#: torch threads of every zoo training run: part of the configuration (a float sum's order, hence the bits of the
#: result, depends on it).
THREADS = 2
#: The model files of a zoo folder whose sha256 the card records (those present).
MODEL_FILES = ("config.json", "model.safetensors", "vocab.txt", "chars.txt", "tokenizer.json")
#: What a build writes in its folder (``--overwrite`` removes these, nothing else).
OWN_ENTRIES = (
    *MODEL_FILES,
    "corpus",
    "corpus.json",
    "word2vec",
    "train",
    "learning_curve.png",
    "card.json",
    "README.md",
)


def _char_cnn(max_characters_per_token: int) -> dict:
    """The token encoder of both zoo models: the quickstart's char CNN (384 filters, widths 1-5), one highway."""
    return {
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
        "activation": "relu",
        "embedding": {"dim": 16},
        "n_characters": 262,
        "n_highway": 1,
        "max_characters_per_token": max_characters_per_token,
    }


def _lstm(dim: int, projection_dim: int) -> dict:
    """The biLSTM of both zoo models: ``dim`` cells projected to ``projection_dim``, 2 layers, clips 3, skips."""
    return {
        "dim": dim,
        "projection_dim": projection_dim,
        "n_layers": 2,
        "cell_clip": 3,
        "proj_clip": 3,
        "use_skip_connections": True,
    }


@dataclass(frozen=True)
class ZooSpec:
    """One zoo model's fixed recipe.

    Attributes:
        name: the model name (``elmokit-en``). recipe: the corpus recipe (:data:`elmokit.recipes.zoo.corpora.RECIPES`).
        language: the language's name for the card (``English``).
        model: the architecture (options.json layout: ``lstm``, ``char_cnn``).
        train: the :class:`~elmokit.pretraining.TrainConfig` fields (everything but files and folders).
        valid_points: held-out evaluations during training besides step 0 (every ``max_steps / valid_points``).
        curve_tokens: score the learning curve's points on a fixed subset of about this many held-out tokens
            (:func:`elmokit.recipes.zoo.corpora.write_heldout_subset`) and the final model once on the whole split;
            ``None`` (the default): every point on the whole split.
        wikitext: also score WikiText-2 test (English).
        tokenizer: how raw text was tokenised, for ``tokenizer.json`` (the corpus's segmenter key).
        why: one line on how the configuration was chosen (the card prints it).
        corpus: options of :func:`elmokit.recipes.zoo.corpora.build_corpus` (``limit``, ``seed``,
            ``heldout_fraction``; the zoo's: none, the recipe's own).
        word2vec: settings of :func:`elmokit.baselines.word2vec.train_word2vec` over its fixed ones (the zoo's: none).
        wikitext_file: the WikiText-2 test file (default ``None``: ``<data>/wikitext-2/test.txt``).
    """

    name: str
    recipe: str
    language: str
    model: dict
    train: dict
    valid_points: int = 4
    curve_tokens: int | None = None
    wikitext: bool = False
    tokenizer: str = "sacremoses"
    why: str = ""
    corpus: dict = field(default_factory=dict)
    word2vec: dict = field(default_factory=dict)
    wikitext_file: str | None = None


#: The zoo's two models, one fixed configuration each. The step counts come from timing runs on this project's
#: 2-core machine (2 threads, quiet) so that the whole build fits in 25 minutes; the measured times are in the cards.
SPECS: dict[str, ZooSpec] = {
    "en": ZooSpec(
        name="elmokit-en",
        recipe="en",
        language="English",
        model={"char_cnn": _char_cnn(50), "lstm": _lstm(512, 128)},
        train={
            "min_count": 3,
            "char_vocab": False,
            "batching": "sentences",
            "batch_size": 64,
            "unroll_steps": 20,
            "n_epochs": 100,
            "max_steps": 3600,
            "optimizer": "adam",
            "lr": 2e-3,
            "clip_norm": 5.0,
            "dropout": 0.1,
            "n_negative_samples": 4096,
            "seed": 0,
            "shuffle": True,
            "deterministic": True,
            "checkpoint_every": 250,
            "keep_checkpoints": 2,
            "log_every": 10,
        },
        valid_points=2,
        wikitext=True,
        tokenizer="sacremoses",
        why="the quickstart's biLM (char CNN 384 filters, LSTM 512 → 128, 2 layers, skip connections, Adam 2e-3) "
        "with a sampled softmax of 4,096 negatives over the 49k-word vocabulary, dropout 0.1 (the run sees the "
        "corpus about once), 64 sentences a step. Steps: a 120-step timing run (2 threads, quiet) took 313 ms a "
        "step (4,270 tokens/s) and a held-out evaluation 39 s; a first full build at 2,900 steps took 19.6 min "
        "(biLM 16.1 min; held-out 220.6, level with Kneser-Ney's 220.2), so the count was raised to 3,600 to fill "
        "the 25-minute budget with the corpus, word2vec, 3 held-out evaluations (39 s each: full softmax over 49k "
        "words), WikiText-2 and the baselines",
    ),
    "zh": ZooSpec(
        name="elmokit-zh",
        recipe="zh",
        language="Chinese",
        model={"char_cnn": _char_cnn(10), "lstm": _lstm(512, 128)},
        train={
            "min_count": 3,
            "char_vocab": True,
            "batching": "sentences",
            "batch_size": 64,
            "unroll_steps": 20,
            "n_epochs": 100,
            "max_steps": 3800,
            "optimizer": "adam",
            "lr": 2e-3,
            "clip_norm": 5.0,
            "dropout": 0.2,
            "n_negative_samples": 4096,
            "seed": 0,
            "shuffle": True,
            "deterministic": True,
            "checkpoint_every": 250,
            "keep_checkpoints": 2,
            "log_every": 10,
        },
        valid_points=4,
        wikitext=False,
        tokenizer="jieba",
        why="the English configuration with word tokens read through the character-vocabulary mode (8 characters "
        "a word fit: 99.99 % of the training words have at most 6), dropout 0.2 (the run sees the 1.3M-token "
        "corpus about four times). Steps: a 120-step timing run (2 threads, quiet) took 291 ms a step (5,180 "
        "tokens/s), so 3,800 steps (~18 min) leave the corpus, word2vec, 5 held-out evaluations and the baselines "
        "inside 25 minutes with a margin",
    ),
}


def find_spec(lang_or_name: str) -> ZooSpec:
    """The zoo spec of ``"en"``/``"zh"`` or ``"elmokit-en"``/``"elmokit-zh"``.

    Raises:
        UsageError: not a zoo language or name (the message lists them).
    """
    for key, spec in SPECS.items():
        if lang_or_name in (key, spec.name):
            return spec
    raise UsageError(
        f"unknown zoo model {lang_or_name!r}: expected one of "
        f"{', '.join(list(SPECS) + [s.name for s in SPECS.values()])}"
    )


def model_dir(lang_or_name: str, cache: str | os.PathLike | None = None) -> Path:
    """The folder of a zoo model: ``<cache>/zoo/elmokit-<lang>`` (``cache`` default: ``$ELMOKIT_CACHE``, else
    ``~/.cache/elmokit``).

    Raises:
        UsageError: not a zoo language or name.
    """
    return zoo_model_dir(find_spec(lang_or_name).name, cache)


def rebuild_command(spec: ZooSpec) -> str:
    """The command that rebuilds ``spec``'s model (``elmokit zoo build en``)."""
    return f"elmokit zoo build {spec.recipe}"


def spec_differences(spec: ZooSpec) -> dict | None:
    """How ``spec`` differs from the zoo's spec of the same name: ``{field: value}`` for every field that differs
    (for ``train`` only the differing keys), or ``None`` when it is the zoo's recipe. A card with differences is a
    test build's.

    Raises:
        UsageError: ``spec.name`` is not a zoo model.
    """
    zoo = find_spec(spec.name)
    out: dict = {}
    for f in fields(ZooSpec):
        mine, theirs = getattr(spec, f.name), getattr(zoo, f.name)
        if f.name == "train" and mine != theirs:
            out["train"] = {k: v for k, v in mine.items() if k not in theirs or theirs[k] != v}
        elif mine != theirs:
            out[f.name] = mine
    return out or None
