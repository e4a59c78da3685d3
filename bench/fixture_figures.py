"""Print the reproduction figures of the reference fixtures (docs/explanation/measured.md and issue notes quote them).

Run from the repo root with ``../shared`` beside it: ``python bench/fixture_figures.py``. The tests
(``tests/test_fixtures.py``) assert the same quantities against 1e-5; this prints them. One JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import shared_path  # noqa: E402
from elmokit import batch_to_ids  # noqa: E402
from helpers import fixture_model  # noqa: E402
from test_fixtures import _run_stateful  # noqa: E402


def main() -> int:
    figures = {}
    for name in ("allennlp-elmo", "bilm-tf"):
        errors = _run_stateful(name)
        figures[f"{name}_stateful_top_layer_max_abs_diff"] = max(errors)
        figures[f"{name}_sentences_compared"] = len(errors)
    d = shared_path("fixtures", "allennlp-elmo")
    words = (d / "vocab_test.txt").read_text().split("\n")
    with h5py.File(d / "elmo_token_embeddings.hdf5", "r") as fh:
        expected = fh["embedding"][...]
    model = fixture_model("allennlp-elmo")
    with torch.no_grad():
        got = model.token_encoder(batch_to_ids([[w] for w in words]))[:, 0].numpy()
        out = model(batch_to_ids([["a", "b"]]), keep_sentence_boundaries=True)
    figures["token_embeddings_max_abs_diff"] = float(np.abs(got - expected).max())
    figures["bos_vs_literal_<S>"] = float(np.abs(out.token_vectors[0, 0].numpy() - expected[words.index("<S>")]).max())
    figures["eos_vs_literal_</S>"] = float(
        np.abs(out.token_vectors[0, 3].numpy() - expected[words.index("</S>")]).max()
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
