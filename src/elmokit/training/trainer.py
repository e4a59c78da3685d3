"""Pretraining a biLM: the training loop, checkpoints that resume exactly, metrics and the learning curve.

Optimiser defaults follow bilm-tf: Adagrad (lr 0.2, initial accumulator 1.0), global gradient-norm clip 10,
dropout 0.1, loss ``0.5 · (NLL_fwd + NLL_bwd) · unroll_steps`` (the scale matters for Adagrad).

Batching. Two modes:

* ``"sentences"`` (**default**): batches of whole sentences (length-bucketed), each wrapped in ``<S> … </S>`` and read
  from a zero LSTM state. This is exactly how elmokit evaluates perplexity and embeds text (stateless: a sentence's
  vectors never depend on what came before), so the model is trained in the condition it is used in.
* ``"windows"``: bilm-tf's scheme — the corpus as one continuous stream cut into ``unroll_steps``-token windows, with
  the LSTM state carried between batches (truncated BPTT), which is how the released models were trained. A model
  trained this way almost never sees a zero state, so read statelessly it starts every sentence out of distribution:
  on the quickstart corpus (gensim's Lee news, 60k tokens, same model and optimiser, 32 rows per step), windows gave
  held-out perplexity 165 after 987 steps with the directions far apart (forward 124, backward 218), sentences 108
  after 600 steps (forward 107, backward 108). Use windows for parity with bilm-tf, for long-document corpora, or
  when you embed statefully as the original did.

Output folder layout::

    out_dir/train_config.json     the TrainConfig (resume checks it)
    out_dir/metrics.jsonl         one JSON object per logged step (step, loss, ppl_fwd, ppl_bwd, tokens/s, lr)
    out_dir/checkpoint.json       names the latest complete checkpoint (written last, atomically)
    out_dir/ckpt-<step>.safetensors + ckpt-<step>.state.pt   model tensors; optimiser/data/RNG/LSTM state
    out_dir/model/                final model: config.json, model.safetensors (biLM + softmax), vocab.txt
    out_dir/learning_curve.png
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..characters import CharVocabulary
from ..config import ElmoConfig
from ..data.corpus import SentenceBatcher, StreamWindows, TextCorpus
from ..errors import ElmoError
from ..io import atomic_path, atomic_write_text
from ..vocabulary import Vocabulary
from .lm import BidirectionalLM

__all__ = ["TrainConfig", "Trainer", "TrainingError", "save_lm", "load_lm"]

logger = logging.getLogger(__name__)


class TrainingError(ElmoError, RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the message names the step."""


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``train_config.json``).

    Attributes:
        train_files: glob pattern(s) of training shards (one tokenised sentence per line).
        out_dir: output folder (see module docstring).
        model: the biLM architecture as an options dict (``ElmoConfig.to_options()``).
        vocab_file: bilm-tf vocabulary; ``None`` = build from the training files with ``min_count``/``max_vocab``.
        char_vocab: ``True`` = character-vocabulary input (built from the training files) instead of UTF-8 bytes.
        batching: ``"sentences"`` (default) or ``"windows"`` (bilm-tf stream windows); see the module docstring.
        batch_size: rows (windows) or sentences per step. unroll_steps: T, window length and loss scale.
        n_epochs: passes over the data. max_steps: stop after this many steps (``None`` = epochs decide).
        optimizer: ``"adagrad"`` (lr 0.2, accumulator 1.0, as bilm-tf) or ``"adam"``.
        lr: learning rate (``None`` = 0.2 for Adagrad, 1e-3 for Adam). clip_norm: global gradient-norm clip.
        dropout: on LSTM inputs and before the softmax. n_negative_samples: sampled softmax negatives (0 = full).
        seed: seeds data shuffling, initialisation, dropout and the sampler.
        decode_errors: invalid UTF-8 in the corpus: ``"strict"`` (error naming file and line), ``"replace"``,
            ``"ignore"`` or ``"skip"`` (drop the line); see :class:`elmokit.data.corpus.TextCorpus`.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        deterministic: run with ``torch.use_deterministic_algorithms(True, warn_only=True)`` while training (restored
            afterwards), so that a run repeats bit-exactly with several CPU threads; without it two identical
            40-step runs of the quickstart model on 2 threads differed by up to 6.8e-4 in a parameter, with it by 0
            (``bench/determinism.py``). It cost about 6 % of the step time there.
        checkpoint_every / log_every: in steps.
    """

    train_files: list[str]
    out_dir: str
    model: dict[str, Any]
    vocab_file: str | None = None
    min_count: int = 1
    max_vocab: int | None = None
    char_vocab: bool = False
    batching: str = "sentences"
    batch_size: int = 128
    unroll_steps: int = 20
    n_epochs: int = 10
    max_steps: int | None = None
    optimizer: str = "adagrad"
    lr: float | None = None
    clip_norm: float = 10.0
    dropout: float = 0.1
    n_negative_samples: int = 8192
    seed: int = 0
    shuffle: bool = True
    decode_errors: str = "strict"
    device: str = "auto"
    deterministic: bool = True
    checkpoint_every: int = 500
    log_every: int = 10
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "TrainConfig":
        if self.batching not in ("windows", "sentences"):
            raise ValueError(f"batching must be 'windows' or 'sentences', got {self.batching!r}")
        if self.optimizer not in ("adagrad", "adam"):
            raise ValueError(f"optimizer must be 'adagrad' or 'adam', got {self.optimizer!r}")
        for name in ("batch_size", "unroll_steps", "n_epochs", "checkpoint_every", "log_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_negative_samples < 0:
            raise ValueError("n_negative_samples must be >= 0 (0 = full softmax)")
        if self.max_steps is not None and int(self.max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1 (or None), got {self.max_steps}")
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        ElmoConfig.from_options(self.model)
        return self

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (0.2 if self.optimizer == "adagrad" else 1e-3)


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` → ``cuda`` when available, else ``cpu``; anything else as ``torch.device``.

    Raises:
        ValueError: an unknown device name, or a CUDA device asked for where CUDA is not available.
    """
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asked for, but CUDA is not available on this machine")
    return dev


# ---------------------------------------------------------------------------------------------- saving models
def save_lm(lm: BidirectionalLM, out_dir: str | os.PathLike) -> Path:
    """Save a trained LM in the native format: the biLM (loadable by :func:`elmokit.load_native`, ``Elmo``), the softmax
    (``softmax.weight``, ``softmax.bias``), ``vocab.txt`` and, in character-vocabulary mode, ``chars.txt``."""
    from ..weights.native import save_pretrained

    return save_pretrained(lm.bilm, out_dir, vocab_lines=lm.vocab.tokens,
                           extra_tensors={f"softmax.{k}": v for k, v in lm.softmax.state_dict().items()})


def load_lm(model_dir: str | os.PathLike) -> BidirectionalLM:
    """Load :func:`save_lm`'s folder as a :class:`BidirectionalLM` (eval mode).

    Raises:
        FileNotFoundError: the folder lacks ``vocab.txt`` or the softmax (only an embedding model was saved).
    """
    from ..weights.native import WEIGHTS_NAME, load_native

    model_dir = Path(model_dir)
    missing = [n for n in ("config.json", WEIGHTS_NAME, "vocab.txt") if not (model_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir} is not a trained LM folder (no {', '.join(missing)}): perplexity and "
                                "scoring need the model/ folder that `elmokit train` writes (biLM + softmax + vocab)")
    bilm = load_native(model_dir)
    vocab = Vocabulary.from_file(model_dir / "vocab.txt")
    tensors = load_file(str(model_dir / WEIGHTS_NAME))
    if "softmax.weight" not in tensors:
        raise FileNotFoundError(f"{model_dir}/{WEIGHTS_NAME} has no softmax: it is an embedding-only model")
    lm = BidirectionalLM(bilm.config, vocab, dropout=0.0, char_vocab=bilm.char_vocab)
    lm.bilm.load_state_dict(bilm.state_dict())
    if tuple(tensors["softmax.weight"].shape) != tuple(lm.softmax.weight.shape):
        raise ValueError(f"{model_dir}: softmax.weight has shape {tuple(tensors['softmax.weight'].shape)} but vocab.txt "
                         f"and the config imply {tuple(lm.softmax.weight.shape)}")
    lm.softmax.load_state_dict({"weight": tensors["softmax.weight"], "bias": tensors["softmax.bias"]})
    return lm.eval()


# ---------------------------------------------------------------------------------------------- trainer
class Trainer:
    """Train a :class:`BidirectionalLM` as configured; :meth:`train` runs (or resumes) to the end.

    Raises (from :meth:`train`):
        TrainingError: a non-finite loss (names the step; the last good checkpoint is left intact, nothing is saved).
        ValueError / FileNotFoundError: bad corpus, vocabulary or options (see :class:`TextCorpus`, :class:`Vocabulary`).
    """

    def __init__(self, config: TrainConfig) -> None:
        self.config = config.validate()
        self.out_dir = Path(config.out_dir)
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)
        self.corpus = TextCorpus(config.train_files, shuffle=config.shuffle, seed=config.seed,
                                 errors=config.decode_errors)
        self.vocab = self._vocabulary()
        model_config = ElmoConfig.from_options(config.model)
        self.char_vocab = None
        if config.char_vocab:
            self.char_vocab = CharVocabulary.build(self.corpus.sentences(0),
                                                   max_characters_per_token=model_config.char_cnn.max_characters_per_token)
            model_config.char_cnn.char_vocab_size = self.char_vocab.vocab_size
        self.lm = BidirectionalLM(model_config, self.vocab, dropout=config.dropout, char_vocab=self.char_vocab)
        self.device = resolve_device(config.device)
        self.lm.to(self.device)
        params = list(self.lm.parameters())
        if config.optimizer == "adagrad":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adagrad(params, lr=config.learning_rate,
                                                                        initial_accumulator_value=1.0)
        else:
            self.optimizer = torch.optim.Adam(params, lr=config.learning_rate)
        self.sampler = torch.Generator().manual_seed(config.seed + 1)
        if config.batching == "windows":
            self.data: StreamWindows | SentenceBatcher = StreamWindows(
                self.corpus, config.batch_size, config.unroll_steps, num_epochs=config.n_epochs)
        else:
            self.data = SentenceBatcher(self.corpus, config.batch_size, num_epochs=config.n_epochs,
                                        bucket_by_length=True)
        self.step = 0
        self.lstm_state = None

    def _vocabulary(self) -> Vocabulary:
        c = self.config
        if c.vocab_file:
            return Vocabulary.from_file(c.vocab_file)
        return Vocabulary.build(self.corpus.sentences(0), min_count=c.min_count, max_size=c.max_vocab)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        """Write ``ckpt-<step>.*`` then point ``checkpoint.json`` at them (each write atomic), drop older ones."""
        step = self.step
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.lm.state_dict().items()}
        with atomic_path(self.out_dir / f"ckpt-{step}.safetensors", suffix=".safetensors") as tmp:
            save_file(tensors, str(tmp))
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "data": json.dumps(self.data.state_dict()),
            "torch_rng": torch.get_rng_state(),
            "sampler_rng": self.sampler.get_state(),
            "python_rng": json.dumps(random.getstate()),
            "lstm_state": None if self.lstm_state is None else [s.cpu() for s in self.lstm_state],
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        with atomic_path(self.out_dir / f"ckpt-{step}.state.pt", suffix=".pt") as tmp:
            torch.save(state, tmp)
        atomic_write_text(self.out_dir / "checkpoint.json", json.dumps({"step": step}) + "\n")
        for old in self.out_dir.glob("ckpt-*"):
            if not old.name.startswith(f"ckpt-{step}."):
                old.unlink(missing_ok=True)

    def load_checkpoint(self) -> bool:
        """Restore the latest checkpoint of ``out_dir`` if there is one; return whether one was loaded."""
        manifest = self.out_dir / "checkpoint.json"
        if not manifest.is_file():
            return False
        step = int(json.loads(manifest.read_text())["step"])
        tensors = load_file(str(self.out_dir / f"ckpt-{step}.safetensors"))
        self.lm.load_state_dict(tensors)
        state = torch.load(self.out_dir / f"ckpt-{step}.state.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.data.load_state_dict(json.loads(state["data"]))
        torch.set_rng_state(state["torch_rng"])
        self.sampler.set_state(state["sampler_rng"])
        py = json.loads(state["python_rng"])
        random.setstate((py[0], tuple(py[1]), py[2]))
        self.lstm_state = None if state["lstm_state"] is None else tuple(s.to(self.device) for s in state["lstm_state"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step = step
        self._truncate_metrics(step)
        logger.info("resumed from step %d", step)
        return True

    def _recovery_hint(self) -> str:
        manifest = self.out_dir / "checkpoint.json"
        if manifest.is_file():
            step = json.loads(manifest.read_text())["step"]
            return (f"The last good checkpoint (step {step}) in {self.out_dir} is intact: check the data and --resume, "
                    "or start a new run with a lower learning rate")
        return "No checkpoint was written yet: start a new run with a lower learning rate, or check the data"

    def _truncate_metrics(self, step: int) -> None:
        path = self.out_dir / "metrics.jsonl"
        if not path.is_file():
            return
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    # ------------------------------------------------------------------ loop
    def _step_nll(self, batch):
        c = self.config
        if c.batching == "windows":
            nll, self.lstm_state = self.lm.window_nll(
                batch.forward_inputs, batch.forward_targets, batch.backward_inputs, batch.backward_targets,
                self.lstm_state if self._state_fits(batch) else None,
                num_samples=c.n_negative_samples, generator=self.sampler)
            return nll
        return self.lm.sentence_nll(batch, num_samples=c.n_negative_samples, generator=self.sampler)

    def _state_fits(self, batch) -> bool:
        return self.lstm_state is not None and self.lstm_state[0].shape[2] == len(batch.forward_inputs)

    def train(self, resume: bool = False) -> dict[str, Any]:
        """Run to the end of the configured epochs / steps. With ``resume``, continue from the latest checkpoint.

        Returns a summary: steps, tokens, seconds (this call, saving included), loop_seconds (the training steps
        alone), tokens_per_s, final loss, paths.
        """
        from tqdm.auto import tqdm

        c = self.config
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            if not self.load_checkpoint():
                logger.warning("no checkpoint in %s yet: starting from step 0", self.out_dir)
                (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)
        else:
            for stale in ("metrics.jsonl", "checkpoint.json"):
                (self.out_dir / stale).unlink(missing_ok=True)
        atomic_write_text(self.out_dir / "train_config.json", json.dumps(asdict(c), indent=2) + "\n")
        self.lm.train()
        previous_determinism = (torch.are_deterministic_algorithms_enabled(),
                                torch.is_deterministic_algorithms_warn_only_enabled())
        if c.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        metrics = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")
        bar = tqdm(total=c.max_steps, initial=self.step, unit="step", disable=not c.progress, desc="training",
                   mininterval=0.1 if sys.stderr.isatty() else 30.0)
        tokens_seen, start = 0, time.perf_counter()
        last_loss = float("nan")
        window: list[tuple[float, float, float]] = []
        try:
            batches = iter(self.data)
            while c.max_steps is None or self.step < c.max_steps:
                # test max_steps before drawing: a batch drawn and not trained on would be skipped after a resume
                batch = next(batches, None)
                if batch is None:
                    break
                self.step += 1
                nll = self._step_nll(batch)
                loss = nll.loss()
                if not torch.isfinite(loss):
                    raise TrainingError(f"non-finite loss ({float(loss.detach())}) at step {self.step}; stopping. "
                                        + self._recovery_hint())
                self.optimizer.zero_grad(set_to_none=True)
                (loss * c.unroll_steps).backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.lm.parameters(), c.clip_norm)
                if not torch.isfinite(grad_norm):
                    raise TrainingError(f"non-finite gradient norm at step {self.step} (loss {float(loss.detach()):.4f}); "
                                        "stopping before the update. " + self._recovery_hint())
                self.optimizer.step()
                n_tok = int(nll.forward.numel())
                tokens_seen += n_tok
                last_loss = float(loss.detach())
                window.append((float(nll.forward.detach().mean()), float(nll.backward.detach().mean()), n_tok))
                elapsed = time.perf_counter() - start
                if self.step % c.log_every == 0:
                    f = sum(a * n for a, _, n in window) / max(1, sum(n for *_, n in window))
                    b = sum(bb * n for _, bb, n in window) / max(1, sum(n for *_, n in window))
                    record = {"step": self.step, "loss": round(last_loss, 6), "train_ppl_fwd": _exp(f),
                              "train_ppl_bwd": _exp(b), "train_ppl": _exp(0.5 * (f + b)),
                              "tokens_per_s": tokens_seen / max(elapsed, 1e-9), "lr": c.learning_rate}
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                    window = []
                bar.update(1)
                # refresh=False: the bar redraws at its own interval (30 s when stderr is not a terminal)
                bar.set_postfix(loss=f"{last_loss:.3f}", tok_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}",
                                refresh=False)
                if self.step % c.checkpoint_every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
            metrics.close()
            torch.use_deterministic_algorithms(previous_determinism[0], warn_only=previous_determinism[1])
        loop_seconds = time.perf_counter() - start
        if self.step == 0:
            raise TrainingError(
                f"no training step could be made: the data yields no batch (batching={c.batching!r}, batch size "
                f"{c.batch_size}{', unroll steps ' + str(c.unroll_steps) if c.batching == 'windows' else ''}, "
                f"{c.n_epochs} epoch(s), max_steps={c.max_steps}); use a smaller batch size, more epochs or more data")
        self.save_checkpoint()
        model_dir = save_lm(self.lm, self.out_dir / "model")
        curve = plot_learning_curve(self.out_dir / "metrics.jsonl", self.out_dir / "learning_curve.png")
        seconds = time.perf_counter() - start
        return {"steps": self.step, "tokens": tokens_seen, "seconds": seconds, "loop_seconds": loop_seconds,
                "final_loss": last_loss if math.isfinite(last_loss) else None,
                "tokens_per_s": tokens_seen / max(seconds, 1e-9), "model_dir": str(model_dir),
                "learning_curve": str(curve) if curve else None}


def _exp(x: float) -> float:
    """``math.exp`` that gives ``inf`` instead of raising for a huge loss (metrics must not stop training)."""
    return math.exp(x) if x < 700 else float("inf")


def plot_learning_curve(metrics_path: Path, out_png: Path) -> Path | None:
    """Training perplexity (log scale) per step from ``metrics.jsonl`` → PNG (atomic). ``None`` if nothing logged."""
    if not metrics_path.is_file():
        return None
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["step"] for r in rows]
    for key, label in (("train_ppl_fwd", "forward"), ("train_ppl_bwd", "backward"), ("train_ppl", "average")):
        ax.plot(steps, [r[key] for r in rows], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training perplexity")
    ax.set_title("per logged batch, with dropout; sampled softmax if used", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out_png, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out_png
