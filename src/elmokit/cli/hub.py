"""``elmokit push``: upload a native model folder to the Hugging Face Hub with its model card
(:func:`elmokit.integrations.hub.push_to_hub`; needs ``pip install 'elmokit[hub]'``)."""

from __future__ import annotations

import argparse

from elmokit.cli.common import check_model, text_arg

__all__ = ["register", "cmd_push"]


def cmd_push(args: argparse.Namespace) -> int:
    """Push MODEL to REPO_ID and print the commit's URL (or, with ``--dry-run``, the files and the card's metadata
    that would be uploaded, as JSON, without sending anything)."""
    from elmokit.integrations.hub import hub_card, push_plan, push_to_hub  # lazy: CLI start-up

    check_model(args.model)
    if args.dry_run:
        import json  # lazy: CLI start-up

        plan = push_plan(args.model, args.repo_id)
        card = hub_card(args.model, args.repo_id)
        metadata = card.split("---\n")[1]
        print(json.dumps({"repo_id": args.repo_id, "files": sorted(plan), "metadata": metadata}, ensure_ascii=False))
        return 0
    url = push_to_hub(args.model, args.repo_id, private=args.private, revision=args.revision)
    print(url)
    return 0


def register(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "push",
        parents=parents,
        help="upload a native model folder to the Hugging Face Hub with a model card (needs elmokit[hub])",
        description="Upload MODEL (a native folder: config.json + model.safetensors, or a built zoo model name) to "
        "the Hub repository REPO_ID in one commit, with README.md: the model card with the Hub's metadata "
        "(library_name elmokit, tags, language, licence from the training data's licences, the figures). The "
        "token is huggingface_hub's (HF_TOKEN or `huggingface-cli login`). Load it back anywhere with the name "
        "REPO_ID (or REPO_ID@REVISION).",
    )
    p.add_argument("model", type=text_arg, help="a native model folder or a built zoo model (elmokit-en, elmokit-zh)")
    p.add_argument(
        "repo_id", type=text_arg, metavar="REPO_ID", help="the Hub repository, org/name (created if missing)"
    )
    p.add_argument(
        "--private",
        action="store_true",
        help="create the repository private (default: public; an existing one is kept)",
    )
    p.add_argument(
        "--revision", default=None, help="the branch to commit to, created if missing (default: the main branch)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the files and the card's metadata that would be uploaded, send nothing (default: off)",
    )
    p.set_defaults(func=cmd_push)
