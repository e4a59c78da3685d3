"""Print the README's "Models trained here" table from the zoo models' cards.

    ELMOKIT_CACHE=/work/cache python experiments/zoo_table.py          # or --cache DIR

Reads ``<cache>/zoo/elmokit-<lang>/card.json`` (written by ``elmokit zoo build``) and prints one Markdown table with
the rebuild command, data, configuration, perplexities (held-out: biLM vs add-one unigram vs interpolated Kneser-Ney
3-gram and modified Kneser-Ney 5-gram; WikiText-2 test for English), tokens/s, wall times and the card path. A
model not built is listed as such.
"""

from __future__ import annotations

import argparse
import sys

from elmokit.recipes.zoo.build import SPECS, model_dir, read_card
from elmokit.recipes.zoo.figures import run_tokens_per_s


def _ppl(x: float) -> str:
    return f"{x:.1f}"


def _kn5(figures: dict) -> str:
    """The modified Kneser-Ney 5-gram's average (— in a card that predates it or could not estimate it)."""
    kn5 = figures.get("kneser_ney_5_modified") or {}
    return _ppl(kn5["average"]) if "average" in kn5 else "—"


def row(lang: str, cache) -> list[str]:
    spec = SPECS[lang]
    folder = model_dir(lang, cache)
    card = read_card(folder)
    if card is None:
        return [f"`{spec.name}`", f"`elmokit zoo build {lang}`", "not built", "", "", "", "", "", ""]
    d, c, f = card["data"], card["configuration"], card["figures"]
    t, lstm, cnn = c["train"], c["model"]["lstm"], c["model"]["char_cnn"]
    h, tr, tm = f["heldout"], f["training"], f["timing"]
    data = (
        f"{d['files']['train.txt']['tokens'] / 1e6:.2f}M train / {d['files']['heldout.txt']['tokens'] / 1e3:.0f}k "
        f"held-out tokens, {len(d['sources'])} sources, vocab {d['vocabulary']['size']:,}"
    )
    config = (
        f"char CNN {sum(n for _, n in cnn['filters'])} ({'char vocab' if t['char_vocab'] else 'bytes'}, "
        f"C={cnn['max_characters_per_token']}), LSTM {lstm['dim']}→{lstm['projection_dim']} ×{lstm['n_layers']}, "
        f"{t['batch_size']} sentences/step, {t['max_steps']:,} steps, {t['optimizer']} {t['lr']:g}, dropout "
        f"{t['dropout']}, {t['n_negative_samples']:,} negatives, seed {t['seed']}, {c['torch_threads']} threads, "
        f"{t.get('precision', 'fp32')}"
    )
    held = (
        f"**{_ppl(h['bilm']['average'])}** (fwd {_ppl(h['bilm']['forward'])}, bwd {_ppl(h['bilm']['backward'])})"
        f" / {_ppl(h['unigram_add_one'])} / {_ppl(h['kneser_ney_3']['average'])} / {_kn5(h)}"
    )
    wt = f.get("wikitext2_test")
    wiki = (
        f"**{_ppl(wt['bilm']['average'])}** / {_ppl(wt['unigram_add_one'])} / "
        f"{_ppl(wt['kneser_ney_3']['average'])} / {_kn5(wt)} (OOV {100 * wt['oov_rate']:.1f} %)"
        if wt
        else "—"
    )
    speed = f"{tr['tokens_per_s']:,.0f}"
    if tr.get("resumed"):  # the last session may have trained no step: the whole run's logged speed
        logged = tr.get("run_tokens_per_s") or run_tokens_per_s(folder / "train" / "metrics.jsonl")
        speed = f"{logged:,.0f} (the run's logged mean; resumed build)" if logged else "— (resumed build)"
    wall = f"{tm['bilm_seconds'] / 60:.1f} min (build {tm['total_seconds'] / 60:.1f} min)"
    if tr.get("resumed"):
        wall = (
            f"{tm['bilm_seconds'] / 60:.1f} min in the last session (resumed; build {tm['total_seconds'] / 60:.1f} min)"
        )
    note = " (TEST BUILD)" if card.get("overrides") else ""
    return [
        f"`{spec.name}`{note}",
        f"`{card['rebuild_command']}`",
        data,
        config,
        held,
        wiki,
        speed,
        wall,
        f"`$ELMOKIT_CACHE/zoo/{spec.name}/README.md`",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=None, help="cache root (default: $ELMOKIT_CACHE, else ~/.cache/elmokit)")
    args = parser.parse_args(argv)
    header = [
        "model",
        "rebuild",
        "data",
        "configuration",
        "held-out perplexity: biLM / add-one unigram / Kneser-Ney 3-gram / modified KN 5-gram",
        "WikiText-2 test: biLM / unigram / KN-3 / modified KN-5",
        "tokens/s",
        "biLM training wall",
        "card",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for lang in SPECS:
        lines.append("| " + " | ".join(row(lang, args.cache)) + " |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
