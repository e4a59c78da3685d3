"""The model card of a zoo build: its records (``card.json``: data, configuration, versions, sha256 of every model
file) and its Markdown (``README.md``, :func:`render_card`)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path

import numpy
import torch

import elmokit
from elmokit.errors import import_optional
from elmokit.io import file_sha256
from elmokit.recipes.zoo.specs import MODEL_FILES, ZooSpec

__all__ = [
    "read_card",
    "render_card",
    "git_commit",
    "versions",
    "machine",
    "data_record",
    "file_records",
    "train_configuration",
]

#: The TrainConfig fields the card leaves out of its configuration (files, folders and run-time switches).
_NOT_CONFIGURATION = (
    "train_files",
    "out_dir",
    "valid_files",
    "progress",
    "extra",
    "init_from",
    "freeze_bilm_steps",
    "vocab_file",
    "data_parts",
    "device",
    "decode_errors",
    "valid_minutes",
    "checkpoint_minutes",
)
_SOURCE_FIELDS = (
    "name",
    "folder",
    "tokenisation",
    "sentences_read",
    "dropped_kept_out",
    "dropped_in_kept_out_sentence",
    "dropped_in_leaked_document",
    "dropped_duplicate",
    "train_sentences",
    "train_tokens",
    "heldout_sentences",
    "heldout_tokens",
)
#: Source fields that manifests written before they existed lack (``licence`` → "", counts → 0).
_NEW_SOURCE_FIELDS = {"licence": "", "dropped_ngram_overlap": 0}


# ==================================================================================================== records
def read_card(folder: str | os.PathLike) -> dict | None:
    """``card.json`` of a zoo model folder, or ``None`` (missing or unreadable)."""
    try:
        return json.loads((Path(folder) / "card.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def git_commit() -> dict:
    """``{"commit", "dirty"}`` of the source tree this package runs from (``"unknown"`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return {"commit": commit or "unknown", "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def versions() -> dict:
    """The versions a rebuild must match to repeat bit-exactly: Python, torch, numpy, gensim, elmokit.

    Raises:
        ImportError: gensim is missing (the word2vec baseline needs it)."""
    gensim = import_optional("gensim", "zoo", "the zoo build")  # optional: gensim

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "gensim": gensim.__version__,
        "elmokit": getattr(elmokit, "__version__", "unknown"),
    }


def machine() -> dict:
    """The CPUs and platform the build ran on."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()}


def train_configuration(config: dict) -> dict:
    """A TrainConfig's ``to_dict()`` without files, folders and run-time switches (:data:`_NOT_CONFIGURATION`)."""
    return {k: v for k, v in config.items() if k not in _NOT_CONFIGURATION}


def data_record(spec: ZooSpec, manifest: dict, data_dir: Path, lm, corpus_reused: bool) -> dict:
    """The card's ``data``: the corpus manifest's sources, files, exclusions, split and leak check, with the biLM's
    vocabulary size (and character ids for a character-vocabulary model)."""
    return {
        "data_dir": str(data_dir),
        "sources": [
            {**{k: s[k] for k in _SOURCE_FIELDS}, **{k: s.get(k, v) for k, v in _NEW_SOURCE_FIELDS.items()}}
            for s in manifest["sources"]
        ],
        "ngram_filter": _ngram_summary(manifest.get("ngram_filter")),
        "files": manifest["files"],
        "kept_out": [k["name"] if isinstance(k, dict) else k for k in manifest.get("kept_out", [])],
        "exclusions": manifest["exclusions"],
        "split": manifest["split"],
        "heldout_fraction": manifest["heldout_fraction"],
        "seed": manifest["seed"],
        "vocabulary": {"size": len(lm.vocab), "min_count": spec.train["min_count"]},
        "characters": None if lm.char_vocab is None else lm.char_vocab.vocab_size,
        "leak_check": manifest["leak_check"],
        "limit": manifest.get("limit"),
        "corpus_reused": corpus_reused,
    }


def _ngram_summary(ngram: dict | None) -> dict | None:
    """The card's view of the manifest's ``ngram_filter``: n, unit, the filtered sources, the sets compared with."""
    if not ngram:
        return None
    return {
        "n": ngram["n"],
        "unit": ngram["unit"],
        "sources": ngram["sources"],
        "sets": [f"{x['name']} ({x['sentences']:,} sentences)" for x in ngram["sets"]],
        "ngrams": ngram["ngrams"],
    }


def file_records(folder: Path, manifest: dict) -> dict:
    """``{path: {"sha256", "bytes"}}`` of the model files present (:data:`MODEL_FILES`), the word2vec vectors and the
    two corpus files (from the manifest)."""
    files = {}
    for name in MODEL_FILES:
        p = folder / name
        if p.is_file():
            files[name] = {"sha256": file_sha256(p), "bytes": p.stat().st_size}
    vec = folder / "word2vec" / "vectors.bin"
    files["word2vec/vectors.bin"] = {"sha256": file_sha256(vec), "bytes": vec.stat().st_size}
    for name in ("train.txt", "heldout.txt"):
        files[f"corpus/{name}"] = {
            "sha256": manifest["files"][name]["sha256"],
            "bytes": manifest["files"][name]["bytes"],
        }
    return files


# ==================================================================================================== Markdown
def _f(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:,.{digits}f}"


def _minutes(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 60:.1f} min"


def _header(card: dict) -> list[str]:
    """Title, the test-build warning, how to rebuild and use the model."""
    cfg = card["configuration"]
    lines = [f"# {card['name']}: {card['language']} biLM trained by elmokit", ""]
    if card.get("overrides"):
        lines += [
            "**Test build**: this model was built with overrides of the zoo recipe "
            f"(`{json.dumps(card['overrides'], ensure_ascii=False)}`); it is not `{card['name']}`.",
            "",
        ]
    dirty = " (with uncommitted changes)" if card["git"].get("dirty") else ""
    return lines + [
        "## Rebuild",
        "",
        "```bash",
        f"{card['rebuild_command']}          # into $ELMOKIT_CACHE/zoo/{card['name']}",
        "```",
        "",
        f"From scratch with fixed seeds; on the same machine and versions it repeats bit-exactly (torch "
        f"{cfg['torch_threads']} threads, deterministic algorithms). `--resume` continues an interrupted build, "
        f"`--overwrite` rebuilds a built one. Source: git commit `{card['git']['commit']}`{dirty}; built "
        f"{card['built_at']}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in card["versions"].items()) + ".",
        "",
        "## Use",
        "",
        "```python",
        "from elmokit import Elmo, Embedder",
        f"elmo = Elmo.from_pretrained({card['name']!r}, num_output_representations=1)",
        f"vectors = Embedder({card['name']!r}).embed_sentence(tokens)   # (3, len(tokens), 256)",
        "```",
        "",
    ]


def _tokens(card: dict) -> list[str]:
    """What a token is and how raw text becomes tokens."""
    tok = card["tokenizer"]
    if tok.get("segmenter") == "jieba":
        return [
            f"Tokens are **words**: segment raw text with {tok['version']} as the corpus was "
            "(`elmokit.data.tokenizers.load_tokenizer('elmokit-zh')` does it); the characters inside a word are "
            "read through the character vocabulary `chars.txt` (the model cannot be exported to the original "
            "options.json + HDF5 format, which has no character vocabulary).",
            "",
        ]
    return [
        f"Tokens: {tok['version']} for raw text (`elmokit.data.tokenizers.load_tokenizer('elmokit-en')`), the "
        "sources' own tokenisation where they have one. `elmokit export elmokit-en OUT` writes "
        "options.json + weights.hdf5 + vocab.txt for bilm-tf / AllenNLP.",
        "",
    ]


def _data(card: dict) -> list[str]:
    """The corpus: sizes, the per-source table, what was kept out, the split and the leak check."""
    d = card["data"]
    train, held = d["files"]["train.txt"], d["files"]["heldout.txt"]
    lines = [
        "## Data",
        "",
        f"Recipe `{card['recipe']}` (`elmokit.recipes.zoo.corpora`), held-out fraction {d['heldout_fraction']}, "
        f"seed {d['seed']}; {train['tokens']:,} training tokens in {train['sentences']:,} sentences, "
        f"{held['tokens']:,} held-out tokens in {held['sentences']:,} sentences; vocabulary "
        f"{d['vocabulary']['size']:,} (min count {d['vocabulary']['min_count']}, with `<S>`, `</S>`, `<UNK>`)"
        + (f", {d['characters']:,} character ids" if d.get("characters") else "")
        + ".",
        "",
        "| source | tokenisation | read | dropped (kept-out / inside kept-out / leaked review / n-gram / duplicate) "
        "| train sentences | train tokens | held-out sentences | held-out tokens |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for s in d["sources"]:
        lines.append(
            f"| {s['name']} | {s['tokenisation']} | {s['sentences_read']:,} | {s['dropped_kept_out']} / "
            f"{s['dropped_in_kept_out_sentence']} / {s['dropped_in_leaked_document']} / "
            f"{s.get('dropped_ngram_overlap', 0)} / {s['dropped_duplicate']} | {s['train_sentences']:,} | "
            f"{s['train_tokens']:,} | {s['heldout_sentences']:,} | {s['heldout_tokens']:,} |"
        )
    lines += [
        "",
        "Licences of the training text (from each data folder's SOURCE.md; check them before you redistribute the "
        "model or use it commercially):",
        "",
    ]
    lines += [f"- {s['name']} (`{s['folder']}`): {s.get('licence') or 'not recorded'}" for s in d["sources"]]
    lines += ["", "Kept out: " + "; ".join(d["kept_out"]) + "."]
    ngram = d.get("ngram_filter")
    if ngram:
        lines += [
            "",
            f"N-gram filter ({ngram['n']}-grams of {ngram['unit']}; {ngram['ngrams']:,} distinct) on "
            + ", ".join(ngram["sources"])
            + ", against: "
            + "; ".join(ngram["sets"])
            + ".",
        ]
    lines += ["", "Exclusions:", ""]
    lines += [f"- {e}" for e in d["exclusions"]]
    return lines + ["", f"Split: {d['split']}. Leak check on the written files: {json.dumps(d['leak_check'])}.", ""]


def _configuration(card: dict) -> list[str]:
    """The architecture, the training settings, why, and the word2vec baseline's settings."""
    cfg = card["configuration"]
    t = cfg["train"]
    lstm, cnn = cfg["model"]["lstm"], cfg["model"]["char_cnn"]
    softmax = (
        f"sampled softmax with {t['n_negative_samples']:,} negatives" if t["n_negative_samples"] else "full softmax"
    )
    return [
        "## Configuration",
        "",
        f"Char CNN {sum(n for _, n in cnn['filters'])} filters (widths "
        f"{', '.join(str(w) for w, _ in cnn['filters'])}), {cnn['n_highway']} highway, "
        f"{cnn['max_characters_per_token']} characters a token"
        + (" (character vocabulary)" if t.get("char_vocab") else " (UTF-8 bytes)")
        + f"; LSTM {lstm['dim']} → projection {lstm['projection_dim']}, {lstm['n_layers']} layers, skip "
        f"connections, clips {lstm['cell_clip']}/{lstm['proj_clip']}. Training: {t['batching']} batching, "
        f"{t['batch_size']} a step, {t['max_steps']:,} steps, {t['optimizer']} lr {t['lr']}, clip norm "
        f"{t['clip_norm']}, dropout {t['dropout']}, {softmax}, min count {t['min_count']}, seed {t['seed']}, "
        f"{cfg['torch_threads']} torch threads, deterministic algorithms; held-out perplexity every "
        f"{cfg['valid_every']} steps.",
        "",
        f"Why: {cfg['why']}.",
        "",
        "word2vec baseline (`word2vec/vectors.bin`, gensim): "
        + ", ".join(f"{k}={v}" for k, v in cfg["word2vec"].items())
        + ".",
        "",
        "Full configuration: `card.json` (`configuration`), `train/train_config.json`.",
        "",
    ]


def kn5_of(figures: dict) -> dict:
    """The modified Kneser-Ney 5-gram entry of held-out or WikiText figures (``{}`` in a card older than it)."""
    return figures.get("kneser_ney_5_modified") or {}


def _kn5(figures: dict) -> str:
    kn5 = kn5_of(figures)
    return _f(kn5["average"]) if "average" in kn5 else "—"


def _perplexity_table(card: dict) -> list[str]:
    """The perplexity protocol and the table: held-out (and WikiText-2 test) for the biLM and the baselines."""
    h = card["figures"]["heldout"]
    wt = card["figures"].get("wikitext2_test")
    lines = [
        "## Figures",
        "",
        "Perplexity under the biLM's protocol: each sentence from a zero state, per direction its words plus one "
        "boundary, words outside the vocabulary as `<UNK>`; average = exp of the mean of the two directions' "
        "mean NLL. The baselines are fitted on the same `train.txt` over the same vocabulary (add-one unigram; "
        "interpolated Kneser-Ney 3-gram, discount 0.75, and modified Kneser-Ney 5-gram, discounts D1, D2, D3+ "
        "estimated per order, each forward and backward).",
        "",
        "| text | biLM forward | biLM backward | biLM average | add-one unigram | Kneser-Ney 3-gram average | "
        "modified Kneser-Ney 5-gram average |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| held-out ({h['bilm']['tokens']:,} targets) | {_f(h['bilm']['forward'])} | "
        f"{_f(h['bilm']['backward'])} | **{_f(h['bilm']['average'])}** | {_f(h['unigram_add_one'])} | "
        f"{_f(h['kneser_ney_3']['average'])} | {_kn5(h)} |",
    ]
    if wt:
        lines.append(
            f"| WikiText-2 test ({wt['bilm']['tokens']:,} targets) | {_f(wt['bilm']['forward'])} | "
            f"{_f(wt['bilm']['backward'])} | **{_f(wt['bilm']['average'])}** | "
            f"{_f(wt['unigram_add_one'])} | {_f(wt['kneser_ney_3']['average'])} | {_kn5(wt)} |"
        )
    lines.append("")
    reasons = {kn5_of(x)["unavailable"] for x in (h, wt) if x and "unavailable" in kn5_of(x)}
    lines += [f"Modified Kneser-Ney 5-gram not available: {r}" for r in sorted(reasons)] + [""] * bool(reasons)
    if wt:
        lines += [
            f"WikiText-2 test: {wt['protocol']} {wt['sentences']:,} sentences, {wt['words']:,} words "
            f"({wt['headings']} headings dropped); {wt['unk']:,} WikiText `<unk>` and {wt['oov_words']:,} other "
            f"words outside the vocabulary: OOV rate {100 * wt['oov_rate']:.2f} % "
            f"({100 * wt['oov_rate_without_unk']:.2f} % without `<unk>`).",
            "",
        ]
    return lines


def _training(card: dict) -> list[str]:
    """Steps, speed and wall times of the build, and the held-out curve."""
    tr, tm = card["figures"]["training"], card["figures"]["timing"]
    lines = [
        f"Training: {tr['steps']:,} steps"
        + (f" ({tr['epochs']} epochs)" if tr.get("epochs") is not None else "")
        + f", {_f(tr['tokens_per_s'], 0)} tokens/s over the training loop (one direction's targets; "
        f"the held-out evaluations after step 0 included; {tr['heldout_evaluations']} in all), biLM training "
        f"{_minutes(tm.get('bilm_seconds'))} wall"
        + (
            f" (this session of a resumed build; over the whole run the logged steps' mean was "
            f"{_f(tr.get('run_tokens_per_s'), 0)} tokens/s)"
            if tr.get("resumed")
            else ""
        )
        + f"; whole build {_minutes(tm.get('total_seconds'))} (corpus {_f(tm.get('corpus_seconds'))} s, "
        f"word2vec {_f(tm.get('word2vec_seconds'))} s, final evaluation {_f(tm.get('evaluation_seconds'))} s) "
        f"on {card['machine']['cpus']} CPUs (load average before/after training "
        f"{tr.get('loadavg_before')} / {tr.get('loadavg_after')}).",
        "",
    ]
    best = tr.get("best_heldout")
    if best:
        lines += [
            "Held-out curve (average"
            + (
                f", on a fixed subset of {tr['curve_subset']['tokens']:,} tokens, one held-out sentence in "
                f"{tr['curve_subset']['every']}; the figures above score the whole split"
                if tr.get("curve_subset")
                else ""
            )
            + "): "
            + ", ".join(f"step {c['step']}: {c['average']}" for c in tr["curve"])
            + f"; best {best['average']:.2f} at step {best['step']} (the folder's model is the final one; "
            "`train/best/` holds the best). Learning curve: `learning_curve.png`.",
            "",
        ]
    return lines


def _files(card: dict) -> list[str]:
    """The sha256 table of the model files and what the other folders hold."""
    lines = ["## Files", "", "| file | bytes | sha256 |", "|---|---:|---|"]
    for name, info in card["files"].items():
        lines.append(f"| `{name}` | {info['bytes']:,} | `{info['sha256']}` |")
    return lines + [
        "",
        "`train/` holds the training run (checkpoints, `metrics.jsonl`, `best/`), `corpus/` the "
        "corpus and `corpus.json` its manifest (per-source counts, sha256 of every source file).",
        "",
    ]


def render_card(card: dict) -> str:
    """The ``README.md`` model card from ``card.json``'s content (Markdown): rebuild and use, tokens, data,
    configuration, figures, files.

    Raises:
        KeyError: ``card`` lacks a record the card prints (it is not a zoo build's ``card.json``)."""
    sections = (_header, _tokens, _data, _configuration, _perplexity_table, _training, _files)
    return "\n".join(line for section in sections for line in section(card))
