"""Make tests/fixtures/efml/: a small random-weight ELMoForManyLangs (EFML) model and EFML's own outputs on it.

Run in a venv holding EFML 0.0.4.post2 (see /work/shared/docs/peer-efml.md), NOT elmokit's::

    /work/venv-efml/bin/python tools/make_efml_fixtures.py --shared ../shared --out tests/fixtures/efml

What comes from EFML's own code:

* ``char.dic``, ``word.dic``, ``config.json``: its trainer (``python -m elmoformanylangs train ... --max_epoch 0``) on a
  small corpus (60 English + 60 Chinese training sentences of the UD treebanks in ../shared/data), with the
  architecture file ``small_arch.json`` given by an absolute path outside the model folder (as the released models'
  ``config_path`` points at their author's machine); a copy of it is put in the folder under the same base name (EFML's
  loader falls back to that).
* ``token_embedder.pkl``, ``encoder.pkl``: its module classes (``biLM.Model``), every parameter then drawn from a
  seeded uniform distribution of small scale (peer-efml.md §7: large random weights make EFML's own float32 rounding
  exceed 1e-5), saved with its own ``save_model`` (no ``classifier.pkl``, as released).
* ``expected.npz``: its ``Embedder(model_dir).sents2elmo(sentences, output_layer)`` for output_layer 0, 1, 2, -1, -2,
  each on a FRESH Embedder (only a fresh Embedder's first call is deterministic: it carries LSTM state between calls),
  with all sentences in one batch (fewer than its batch size of 64). Per layer, the sentences' arrays are concatenated
  along the token axis; ``sentences.json`` holds the sentences (English and Chinese, word-segmented) and their lengths.
  ``expected.npz`` also holds ``second_call``: output_layer -2 of a second call with the same sentences on one
  Embedder (its carried state; one batch, so no shuffling), and ``f64_gap``: EFML's own float64-vs-float32
  difference (max abs) on the same input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ARCH = {
    "encoder": {"name": "elmo", "projection_dim": 16, "cell_clip": 3, "proj_clip": 3, "dim": 32, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 8], [2, 8], [3, 16], [4, 16]],
        "n_highway": 2,
        "word_dim": 16,
        "char_dim": 16,
        "max_characters_per_token": 16,
    },
    "classifier": {"name": "softmax"},
    "dropout": 0.0,
}

#: tokens of exactly max_characters_per_token - 2 = 14 characters, longer ones (cut to 14 by EFML), an unknown
#: character (Ω) and an unknown word; a one-token sentence
EXTRA = [
    ["The", "internationalization", "of", "abcdefghijklmn", "uncharacteristically", "Ωmega", "zyxwvut", "."],
    ["Hello"],
]


def read_conllu(path: Path, n: int, min_len: int, max_len: int, skip: int = 0) -> list[list[str]]:
    """The first ``n`` sentences (after ``skip``) with min_len..max_len words (multi-word token lines skipped)."""
    out, words = [], []
    seen = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words and min_len <= len(words) <= max_len:
                seen += 1
                if seen > skip:
                    out.append(words)
                    if len(out) == n:
                        break
            words = []
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if "-" in cols[0] or "." in cols[0]:
            continue
        words.append(cols[1])
    return out


def reinit_small(model: torch.nn.Module, seed: int) -> None:
    """Every parameter uniform in ±1.2/sqrt(fan-in) (matrices), ±0.4 (embeddings), ±0.3 (biases): small, seeded."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 1:
                bound = 0.3
            elif "embedding" in name:
                bound = 0.4
            else:
                fan_in = p[0].numel()
                bound = 1.2 / fan_in**0.5
            p.copy_((torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound)


def build(shared: Path, out: Path) -> None:
    """Write the fixture folder ``out`` (see the module docstring)."""
    from elmoformanylangs import Embedder  # the peer venv's EFML
    from elmoformanylangs.biLM import Model
    from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

    ewt, gsd = shared / "data" / "ud-english-ewt", shared / "data" / "ud-chinese-gsd"
    train = read_conllu(ewt / "en_ewt-ud-train.conllu", 60, 4, 25) + read_conllu(gsd / "zh-ud-train.conllu", 60, 4, 25)
    english = read_conllu(ewt / "en_ewt-ud-dev.conllu", 8, 5, 14)
    chinese = read_conllu(gsd / "zh-ud-dev.conllu", 8, 5, 14)
    sentences = english + chinese + EXTRA
    with tempfile.TemporaryDirectory() as tmp:
        author = Path(tmp) / "author-machine"  # the architecture file outside the model folder, then gone
        author.mkdir()
        arch_path = author / "small_arch.json"
        arch_path.write_text(json.dumps(ARCH, indent=1), encoding="utf-8")
        corpus = Path(tmp) / "train.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in train), encoding="utf-8")
        model_dir = Path(tmp) / "model"
        cmd = [sys.executable, "-m", "elmoformanylangs.biLM", "train", "--train_path", str(corpus)]
        cmd += ["--config_path", str(arch_path), "--model", str(model_dir), "--max_epoch", "0", "--min_count", "1"]
        subprocess.run(cmd, check=True, capture_output=True)
        shutil.copy(arch_path, model_dir / arch_path.name)
        save_weights(model_dir, EmbeddingLayer, Model)
        expected, f64_gap = run_efml(Embedder, model_dir, sentences)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(model_dir, out)
    meta = {
        "sentences": sentences,
        "english": len(english),
        "chinese": len(chinese),
        "lengths": [len(s) for s in sentences],
        "efml": "elmoformanylangs 0.0.4.post2, torch " + torch.__version__,
        "made_by": "tools/make_efml_fixtures.py",
    }
    (out / "sentences.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    np.savez_compressed(out / "expected.npz", f64_gap=np.float64(f64_gap), **expected)
    print(f"wrote {out}: f64 gap {f64_gap:.2e}, {sum(f.stat().st_size for f in out.iterdir())} bytes")


def read_dic(path: Path) -> dict[str, int]:
    """EFML's own reading of a .dic file (its Embedder.get_model)."""
    lexicon = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        tokens = line.strip().split("\t")
        if len(tokens) == 1:
            tokens.insert(0, "\u3000")
        lexicon[tokens[0]] = int(tokens[1])
    return lexicon


def save_weights(model_dir: Path, EmbeddingLayer, Model) -> None:  # noqa: N803 (EFML's classes)
    """EFML's model classes over its .dic files, small seeded weights, saved with its own ``save_model``."""
    torch.manual_seed(22)
    cfg = ARCH["token_embedder"]
    words, chars = read_dic(model_dir / "word.dic"), read_dic(model_dir / "char.dic")
    word_layer = EmbeddingLayer(cfg["word_dim"], words, fix_emb=False, embs=None)
    char_layer = EmbeddingLayer(cfg["char_dim"], chars, fix_emb=False, embs=None)
    model = Model(ARCH, word_layer, char_layer, len(words), use_cuda=False)
    reinit_small(model, seed=2022)
    model.save_model(str(model_dir), False)


def run_efml(Embedder, model_dir: Path, sentences: list[list[str]]) -> tuple[dict[str, np.ndarray], float]:  # noqa: N803
    """EFML's outputs for every output_layer, each from a fresh Embedder; and its own float64-vs-float32 gap."""
    expected = {}
    for layer in (0, 1, 2, -1, -2):
        emb = Embedder(str(model_dir), batch_size=64)
        outs = emb.sents2elmo(sentences, output_layer=layer)
        assert [o.shape[-2] for o in outs] == [len(s) for s in sentences]
        expected[f"layer{layer}"] = np.concatenate(outs, axis=-2).astype(np.float32)
    # EFML carries the LSTM state: a second call on the same Embedder (one batch, so no shuffling) starts from the
    # state the first call reached, row by row in its batch order (sentences sorted by length, longest first)
    emb = Embedder(str(model_dir), batch_size=64)
    emb.sents2elmo(sentences, output_layer=-2)
    expected["second_call"] = np.concatenate(emb.sents2elmo(sentences, output_layer=-2), axis=-2).astype(np.float32)
    emb = Embedder(str(model_dir), batch_size=64)
    emb.model.double()
    f64 = np.concatenate(emb.sents2elmo(sentences, output_layer=-2), axis=-2)
    gap = float(np.abs(f64 - expected["layer-2"]).max())
    return expected, gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "efml")
    args = parser.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    build(args.shared, args.out)


if __name__ == "__main__":
    main()
