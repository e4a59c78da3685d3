"""``elmokit zoo build {en,zh}`` and ``elmokit zoo list``: the models trained here (see
:mod:`elmokit.recipes.zoo.build`)."""

from __future__ import annotations

import argparse
import json

from elmokit.cli.common import add_threads_option, path_arg
from elmokit.errors import UsageError
from elmokit.recipes.zoo.build import SPECS, THREADS, build_model, list_models, model_dir

__all__ = ["register", "cmd_zoo_build", "cmd_zoo_list"]


def cmd_zoo_build(args: argparse.Namespace) -> int:
    """Build (or ``--resume``) one zoo model; print where it went and its figures."""
    if args.overwrite and args.resume:
        raise UsageError("--overwrite rebuilds from scratch and --resume continues the build: give one of them")
    card = build_model(
        args.lang,
        args.data_dir,
        args.cache,
        overwrite=args.overwrite,
        resume=args.resume,
        progress=not args.no_progress,
        threads=args.threads,
    )
    folder = model_dir(args.lang, args.cache)
    h = card["figures"]["heldout"]
    t = card["figures"]["training"]
    print(
        f"{card['name']} built in {folder} ({card['figures']['timing']['total_seconds'] / 60:.1f} min; biLM "
        f"{card['figures']['timing']['bilm_seconds'] / 60:.1f} min, {t['steps']} steps, {t['tokens_per_s']:.0f} "
        "tokens/s)"
    )
    print(
        f"held-out perplexity (average): biLM {h['bilm']['average']:.1f}, Kneser-Ney 3-gram "
        f"{h['kneser_ney_3']['average']:.1f}{_kn5(h)}, add-one unigram {h['unigram_add_one']:.1f}"
    )
    wt = card["figures"].get("wikitext2_test")
    if wt:
        print(
            f"WikiText-2 test (average): biLM {wt['bilm']['average']:.1f}, Kneser-Ney 3-gram "
            f"{wt['kneser_ney_3']['average']:.1f}{_kn5(wt)}, add-one unigram {wt['unigram_add_one']:.1f} (OOV rate "
            f"{100 * wt['oov_rate']:.2f} %)"
        )
    print(f"card: {folder / 'README.md'}")
    return 0


def _kn5(figures: dict) -> str:
    """``", modified Kneser-Ney 5-gram X"`` when the figures hold it (not in older cards or tiny corpora)."""
    kn5 = figures.get("kneser_ney_5_modified") or {}
    return f", modified Kneser-Ney 5-gram {kn5['average']:.1f}" if "average" in kn5 else ""


def cmd_zoo_list(args: argparse.Namespace) -> int:
    """One line per zoo model (built or not, path, card summary); ``--json`` for the records."""
    models = list_models(args.cache)
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    for m in models:
        print(f"{m['name']}  {m['state']}  {m['path']}")
        c = m["card"]
        if c:
            wt = f", WikiText-2 test {c['wikitext2_test_average']:.1f}" if c["wikitext2_test_average"] else ""
            print(
                f"    held-out perplexity {c['heldout_average']:.1f} (Kneser-Ney 3-gram {c['kneser_ney_3']:.1f}"
                + (f", modified 5-gram {c['kneser_ney_5_modified']:.1f}" if c.get("kneser_ney_5_modified") else "")
                + ", "
                f"unigram {c['unigram']:.1f}){wt}; {c['steps']} steps, {c['tokens_per_s']:.0f} tokens/s, built in "
                f"{c['build_minutes']} min on {c['built_at']} (commit {c['commit'][:12]})"
                + ("; TEST BUILD (recipe overridden)" if c["test_build"] else "")
            )
        elif m["state"] == "unfinished":
            print(f"    continue with `{m['rebuild_command']} --resume` (or start again with --overwrite)")
        else:
            print(f"    build with `{m['rebuild_command']}`")
    return 0


def _interrupted_note(args: argparse.Namespace) -> str:
    return (
        f"the build can be continued with `elmokit zoo build {args.lang} --resume` (training resumes from its "
        "latest checkpoint)"
    )


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``elmokit zoo build`` and ``elmokit zoo list``."""
    zoo = sub.add_parser(
        "zoo",
        parents=parents,
        help="the models trained here (elmokit-en, elmokit-zh): build, list",
        description="The English and Chinese biLMs this project trains, each rebuilt from scratch "
        "by one command into $ELMOKIT_CACHE/zoo/elmokit-<lang> (with its word2vec "
        "baseline and a model card).",
    )
    zsub = zoo.add_subparsers(
        dest="zoo_command",
        required=True,
        metavar="ZOO_COMMAND",
        help="build (one model, from scratch) or list (all, with their figures)",
    )
    cache_help = "cache root (default: $ELMOKIT_CACHE, else ~/.cache/elmokit); models go to CACHE/zoo/elmokit-<lang>"

    p = zsub.add_parser(
        "build",
        parents=parents,
        help="build a zoo model from scratch (fixed seed, ~25 min on 2 cores)",
        description="Build the corpus, the word2vec baseline and the biLM of one zoo model, evaluate "
        "them (held-out perplexity beside add-one unigram and Kneser-Ney 3-gram; "
        "WikiText-2 test for en) and write the model card.",
    )
    p.add_argument("lang", choices=sorted(SPECS), help="en (elmokit-en) or zh (elmokit-zh)")
    p.add_argument(
        "--data-dir",
        type=path_arg,
        default=None,
        help="the shared data folder (default: $ELMOKIT_DATA, else ../shared/data beside the repository)",
    )
    p.add_argument("--cache", type=path_arg, default=None, help=cache_help)
    p.add_argument("--overwrite", action="store_true", help="rebuild a model that is already built (default: refuse)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted build (the corpus and word2vec are kept when intact, training "
        "resumes from its latest checkpoint) (default: start a new build)",
    )
    p.add_argument("--no-progress", action="store_true", help="no training progress bar (default: shown)")
    add_threads_option(
        p, default=THREADS, note=": the recipe's; a rebuild repeats bit-exactly on the same thread count"
    )
    p.set_defaults(func=cmd_zoo_build, interrupted_note=_interrupted_note)

    p = zsub.add_parser("list", parents=parents, help="the zoo models: built or not, where, their figures")
    p.add_argument("--cache", type=path_arg, default=None, help=cache_help)
    p.add_argument("--json", action="store_true", help="print the records as JSON (default: text)")
    p.set_defaults(func=cmd_zoo_list)
