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


#: The zoo's two models, one fixed configuration each (chosen by ``experiments/recipe_study.py``). The step counts come
#: from timing probes on this project's 2-core machine (2 threads, quiet) so that the biLM's training fits in 60
#: minutes; the corpus, word2vec and the final evaluations come on top; the measured times are in the cards.
SPECS: dict[str, ZooSpec] = {
    "en": ZooSpec(
        name="elmokit-en",
        recipe="en",
        language="English",
        model={"char_cnn": _char_cnn(20), "lstm": _lstm(512, 128)},
        train={
            "min_count": 3,
            "char_vocab": False,
            "batching": "sentences",
            "batch_size": 128,
            "unroll_steps": 20,
            "n_epochs": 100,
            "max_steps": 8400,
            "optimizer": "adam",
            "lr": 4e-3,
            "lr_warmup_steps": 200,
            "lr_schedule": "cosine",
            "lr_decay_steps": 8400,
            "lr_final": 0.1,
            "clip_norm": 5.0,
            "dropout": 0.0,
            "n_negative_samples": 4096,
            "seed": 0,
            "shuffle": True,
            "deterministic": True,
            "precision": "bf16",
            "checkpoint_every": 250,
            "keep_checkpoints": 2,
            "log_every": 10,
        },
        valid_points=4,
        curve_tokens=20000,
        wikitext=True,
        tokenizer="sacremoses",
        corpus={"heldout_fraction": 0.005},
        why="the recipe study's `fast` configuration (experiments/results/recipe-study-en.md: best of 4 at an equal "
        "8-minute budget): char CNN 384 filters over 20 characters a token, LSTM 512 → 128, 2 layers, skip "
        "connections, sampled softmax of 4,096 negatives over the 196k-word vocabulary, 128 sentences a step, Adam "
        "4e-3 with 200 warm-up steps and a cosine decay to 0.1 × at the last step, no dropout (the run reads about "
        "45 % of the 39M-token corpus once). Products in bfloat16 (`--precision bf16`, issue 40: the fused LSTM "
        "layer and the native softmax rows; float32 master weights, Adam state, gates and cell state). Steps: "
        "`python bench/zoo_probe.py en --precision bf16 --steps 100 --skip 50` (2 threads, quiet, on this corpus; "
        "the mean of the last 50 steps, once oneDNN's kernels for the padded row counts are compiled) took 0.390 s a "
        "step, so 8,400 steps (55 min) and 5 curve points on a 20k-token held-out subset (≈ 33 s each) fill the "
        "60-minute biLM budget (issue 40's second round: 0.495 s, 6,600 steps; issue 27's float32 recipe: 0.805 s, "
        "4,100 steps); the held-out fraction is 0.005 (≈ 200k tokens) so "
        "that scoring the final model on the whole split (full softmax) takes minutes, not half an hour",
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
            "batch_size": 128,
            "unroll_steps": 20,
            "n_epochs": 100,
            "max_steps": 7200,
            "optimizer": "adam",
            "lr": 4e-3,
            "lr_warmup_steps": 200,
            "lr_schedule": "cosine",
            "lr_decay_steps": 7200,
            "lr_final": 0.1,
            "clip_norm": 5.0,
            "dropout": 0.0,
            "n_negative_samples": 4096,
            "seed": 0,
            "shuffle": True,
            "deterministic": True,
            "precision": "bf16",
            "checkpoint_every": 250,
            "keep_checkpoints": 2,
            "log_every": 10,
        },
        valid_points=4,
        curve_tokens=20000,
        wikitext=False,
        tokenizer="jieba",
        why="the recipe study's `fast` configuration (experiments/results/recipe-study-zh.md: the better of the two "
        "run at an equal 8-minute budget): the English model's shape with word tokens read through the "
        "character-vocabulary mode (10 characters a word), 128 sentences a step, Adam 4e-3 with 200 warm-up steps "
        "and a cosine decay to 0.1 × at the last step, no dropout (the run reads the 13.7M-token corpus about 1.6 "
        "times). Products in bfloat16 (`--precision bf16`, issue 40), as the English model. Steps: "
        "`python bench/zoo_probe.py zh` (2 threads, builds paused, on this corpus), run twice: bf16 0.510 s a step "
        "(torch.mm bf16/fp32 ratio 2.72 in that run) and 0.398 s (ratio 6.18; fp32 0.599 s in the same run); their "
        "mean, 0.454 s, makes 7,200 steps 55 min: those and 5 curve points on a 20k-token held-out subset fill the "
        "60-minute biLM budget (issue 27's float32 recipe: 0.720 s, 4,700 steps)",
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
