"""The options of ``elmokit train``, ``perplexity`` and ``score``, in the groups their ``--help`` lists them.

``train``'s options default to ``None`` (see :mod:`elmokit.cli.train`); the defaults their help shows are
TrainConfig's, read by :func:`_train_default`. :mod:`elmokit.cli.train` registers the commands with these groups.
"""

from __future__ import annotations

import argparse
import dataclasses

from elmokit.cli.common import (
    DECODE_CHOICES,
    DEVICE_HELP,
    RELEASED_HELP,
    add_threads_option,
    fraction,
    int_at_least,
    non_negative_int,
    path_arg,
    positive_float,
    positive_int,
    probability,
    seed,
    text_arg,
)
from elmokit.config import PRESETS
from elmokit.data.tokenizers import TOKENIZERS

__all__ = [
    "add_lm_file_args",
    "add_run_args",
    "add_model_args",
    "add_optimisation_args",
    "add_heldout_and_checkpoint_args",
    "add_execution_args",
]


def _train_default(name: str, unit: str = "") -> str:
    """``"(default: X)"`` from TrainConfig's field ``name`` — what a new run takes when the option is left out."""
    from elmokit.pretraining.config import TrainConfig  # lazy: CLI start-up

    for f in dataclasses.fields(TrainConfig):
        if f.name == name:
            if f.default is None:
                return "(default: none)"
            return f"(default: {f.default}{unit})"
    return "(default: TrainConfig's)"


def add_lm_file_args(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``perplexity`` and ``score``: a trained LM folder and a text file."""
    p.add_argument(
        "model",
        type=path_arg,
        help="a trained model folder (OUT_DIR/model, as `elmokit train` writes it: biLM + softmax + vocab.txt)",
    )
    p.add_argument(
        "file", type=path_arg, help="text, one sentence per line (UTF-8): tokenised, or raw with --tokenizer"
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=64, help="sentences per forward pass (default: %(default)s)"
    )
    p.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default="whitespace",
        help="how lines become words: whitespace (pre-tokenised text), moses (sacremoses, raw English), "
        "jieba (raw Chinese: word segmentation) (default: %(default)s)",
    )
    p.add_argument(
        "--decode-errors",
        choices=DECODE_CHOICES,
        default="strict",
        help="a line that is not text (invalid UTF-8, a NUL byte): stop naming the file and line (strict), "
        "replace or ignore the bad bytes, or skip the line (default: %(default)s)",
    )
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """``train``'s files and run folder: the training shards, --out-dir, --overwrite, --resume."""
    p.add_argument(
        "train_files",
        nargs="*",
        type=text_arg,
        help="glob pattern(s) of the training shards (one tokenised sentence per line, UTF-8); may be "
        "left out with --resume",
    )
    p.add_argument(
        "--out-dir",
        required=True,
        type=path_arg,
        help="run folder: train_config.json, checkpoints, metrics.jsonl, model/ (and best/)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run already in --out-dir (default: refuse, so a finished run is not lost)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out-dir from its latest checkpoint (default: start a new run)",
    )


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``train``'s model and vocabulary: --preset, --options, --init-from, --freeze-bilm-steps, --vocab,
    --min-count, --max-vocab, --char-vocab."""
    d = _train_default
    p.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help="architecture preset (default: small; with --init-from: the init model's)",
    )
    p.add_argument(
        "--options", type=text_arg, help="options.json with the architecture; overrides --preset (default: none)"
    )
    p.add_argument(
        "--init-from",
        type=text_arg,
        default=None,
        metavar="MODEL",
        help=f"continued pretraining: start from this model's biLM weights and architecture, "
        f"{RELEASED_HELP}, or a model trained here (elmokit-en, elmokit-zh: `elmokit zoo build`); a "
        "new softmax over your vocabulary (kept when a native model has the same vocabulary) "
        "(default: none, random initialisation)",
    )
    p.add_argument(
        "--freeze-bilm-steps",
        type=non_negative_int,
        default=None,
        metavar="N",
        help=f"train only the softmax for the first N steps (with --init-from) {d('freeze_bilm_steps')}",
    )
    p.add_argument("--vocab", type=text_arg, help="bilm-tf vocabulary file (default: built from the training files)")
    p.add_argument("--min-count", type=positive_int, help=f"words seen fewer times become <UNK> {d('min_count')}")
    p.add_argument(
        "--max-vocab",
        type=int_at_least(3),
        help="keep at most this many entries, the three specials <S> </S> <UNK> included (default: no limit)",
    )
    p.add_argument(
        "--char-vocab",
        action="store_true",
        help="character-vocabulary input (CJK) instead of UTF-8 bytes (default: bytes)",
    )


def add_optimisation_args(p: argparse.ArgumentParser) -> None:
    """``train``'s batches and optimiser: --batching, --batch-size, --unroll-steps, --epochs, --max-steps,
    --optimizer, --lr, --lr-warmup-steps, --lr-schedule, --lr-decay-steps, --lr-final, --clip-norm, --dropout,
    --negatives, --seed."""
    from elmokit.pretraining.config import (  # lazy: CLI start-up
        Batching,
        LRSchedule,
        OptimizerName,
        default_learning_rate,
        literal_choices,
    )

    d = _train_default
    p.add_argument(
        "--batching",
        choices=literal_choices(Batching),
        default=None,
        help="whole sentences from a zero state (as elmokit embeds) or bilm-tf's stream windows with "
        f"carried state {d('batching')}",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help=f"sentences (or windows) per step, over all processes together {d('batch_size')}",
    )
    p.add_argument(
        "--unroll-steps", type=positive_int, help=f"window length in tokens, and the loss scale {d('unroll_steps')}"
    )
    p.add_argument("--epochs", type=positive_int, help=f"passes over the data {d('n_epochs')}")
    p.add_argument("--max-steps", type=positive_int, help="stop after this many steps (default: the epochs decide)")
    p.add_argument("--optimizer", choices=literal_choices(OptimizerName), default=None, help=f"{d('optimizer')}")
    p.add_argument(
        "--lr",
        type=positive_float,
        help=f"learning rate (default: {default_learning_rate('adagrad'):g} with adagrad, "
        f"{default_learning_rate('adam'):g} with adam)",
    )
    p.add_argument(
        "--lr-warmup-steps",
        type=non_negative_int,
        metavar="N",
        help=f"raise the rate linearly over the first N steps {d('lr_warmup_steps')}",
    )
    p.add_argument(
        "--lr-schedule",
        choices=literal_choices(LRSchedule),
        default=None,
        help=f"after the warm-up: keep the rate, or decay it to --lr-final x --lr at --lr-decay-steps "
        f"{d('lr_schedule')}",
    )
    p.add_argument(
        "--lr-decay-steps",
        type=positive_int,
        metavar="N",
        help="the step where a decay ends (default: none; needed by --lr-schedule linear/cosine)",
    )
    p.add_argument("--lr-final", type=fraction, help=f"the decay's floor, a fraction of --lr {d('lr_final')}")
    p.add_argument("--clip-norm", type=positive_float, help=f"global gradient-norm clip {d('clip_norm')}")
    p.add_argument("--dropout", type=probability, help=f"dropout rate, in [0, 1) {d('dropout')}")
    p.add_argument(
        "--negatives",
        type=non_negative_int,
        help=f"sampled-softmax negatives, 0 = full softmax {d('n_negative_samples')}",
    )
    p.add_argument("--seed", type=seed, help=f"data order, initialisation, dropout, sampler {d('seed')}")


def add_heldout_and_checkpoint_args(p: argparse.ArgumentParser) -> None:
    """``train``'s held-out evaluation, checkpoints and logging: --valid-files, --valid-every, --valid-minutes,
    --checkpoint-every, --checkpoint-minutes, --keep-checkpoints, --log-every."""
    d = _train_default
    p.add_argument(
        "--valid-files",
        type=text_arg,
        action="append",
        default=None,
        metavar="PATTERN",
        help="held-out text (glob pattern, repeatable): full-softmax perplexity logged to metrics.jsonl and "
        "drawn on the learning curve; the best model is kept in OUT_DIR/best/ (default: none)",
    )
    p.add_argument(
        "--valid-every",
        type=positive_int,
        metavar="N",
        help="evaluate the held-out text every N steps (default: every --checkpoint-every steps, or only "
        "by --valid-minutes when that is given)",
    )
    p.add_argument(
        "--valid-minutes",
        type=positive_float,
        metavar="M",
        help="also evaluate the held-out text every M minutes (default: off)",
    )
    p.add_argument("--checkpoint-every", type=positive_int, help=f"checkpoint every N steps {d('checkpoint_every')}")
    p.add_argument(
        "--checkpoint-minutes",
        type=positive_float,
        help="also checkpoint when this many minutes passed since the last one (default: off)",
    )
    p.add_argument(
        "--keep-checkpoints",
        type=positive_int,
        help=f"how many of the latest checkpoints to keep {d('keep_checkpoints')}",
    )
    p.add_argument("--log-every", type=positive_int, help=f"log metrics every N steps {d('log_every')}")


def add_execution_args(p: argparse.ArgumentParser) -> None:
    """How ``train`` runs: --data-parts, --no-progress, --device, --precision, --nondeterministic, --decode-errors,
    --threads."""
    d = _train_default
    p.add_argument(
        "--data-parts",
        type=positive_int,
        metavar="P",
        help="cut the corpus and every global batch into P parts; a run can then resume on any number "
        "of processes from 1 to P, all computing the same steps (default: the number of processes "
        "the run starts with)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar (default: shown)")
    p.add_argument(
        "--device",
        type=text_arg,
        default=None,
        help=f"{DEVICE_HELP}; with several processes each takes cuda:LOCAL_RANK {d('device')}",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default=None,
        help="bf16: matrix products in bfloat16 (autocast), weights, optimiser, cell state, clips and loss in float32 "
        f"(fixed for a run) {d('precision')}",
    )
    p.add_argument(
        "--nondeterministic",
        action="store_true",
        help="allow non-deterministic kernels (about 6%% faster on CPU; runs no longer repeat "
        "bit-exactly) (default: deterministic)",
    )
    p.add_argument(
        "--decode-errors",
        choices=DECODE_CHOICES,
        default=None,
        help="invalid UTF-8 in the corpus: stop naming the file and line (strict), or replace, ignore "
        f"or skip {d('decode_errors')}",
    )
    add_threads_option(p)
