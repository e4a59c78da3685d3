"""``elmokit quickstart``: the main job (see :mod:`elmokit.quickstart`)."""
from __future__ import annotations

import argparse

from .common import DEVICE_HELP, path_arg, positive_float, positive_int, resolve_cli_device, seed, text_arg

__all__ = ["register", "cmd_quickstart"]


def cmd_quickstart(args: argparse.Namespace) -> int:
    """Train, evaluate, save and embed; a folder holding an earlier quickstart run is replaced (with a note)."""
    from .. import quickstart

    resolve_cli_device(args.device)
    quickstart.run_quickstart(args.out_dir, minutes=args.minutes, seed=args.seed, steps=args.steps,
                              device=args.device)
    return 0


def quickstart_interrupted_note(args: argparse.Namespace) -> str:
    return f"the partial run in {args.out_dir} is replaced by the next `elmokit quickstart --out-dir {args.out_dir}`"


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    from ..quickstart import SEPARATION_MARGIN

    p = sub.add_parser(
        "quickstart", parents=parents,
        help="train a small biLM on English text shipped with gensim, evaluate it, show \"bank\" in context",
        description="Train a small biLM on gensim's Lee news corpus, print its held-out perplexity beside an add-one "
                    "unigram baseline, save it, and compare the vectors of \"bank\" in river and money sentences "
                    f"(the senses count as separated when the mean within-sense cosine exceeds the mean across-sense "
                    f"cosine by at least {SEPARATION_MARGIN} in the top layer). Running it again into the same "
                    "--out-dir replaces the earlier quickstart run there; a folder holding anything else is refused.")
    p.add_argument("--out-dir", type=path_arg, default="runs/quickstart",
                   help="folder for the corpus split, the training run and quickstart.json (default: %(default)s)")
    p.add_argument("--minutes", type=positive_float, default=5.0,
                   help="training time budget, turned into a number of steps after timing 20 steps (after 5 of "
                        "warm-up) (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="train exactly this many steps, the same training on any machine (default: from --minutes)")
    p.add_argument("--seed", type=seed, default=0, help="data order, initialisation, dropout (default: %(default)s)")
    p.add_argument("--device", type=text_arg, default="auto", help=f"{DEVICE_HELP} (default: %(default)s)")
    p.set_defaults(func=cmd_quickstart, interrupted_note=quickstart_interrupted_note)
