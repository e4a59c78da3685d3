"""Loading the reference fixture models (../shared/fixtures) for tests."""
from __future__ import annotations

import json

import h5py
import numpy as np

from conftest import shared_path
from elmokit import load_original

FIXTURE_SETS = {
    "allennlp-elmo": ("fixtures", "allennlp-elmo", "sentences.json"),
    "bilm-tf": ("fixtures", "bilm-tf", "model", "lm_embeddings_sentences.json"),
}


def fixture_dir(name: str):
    return shared_path(*FIXTURE_SETS[name][:-1])


def fixture_model(name: str, **kwargs):
    d = fixture_dir(name)
    return load_original(d / "options.json", d / "lm_weights.hdf5", **kwargs).eval()


def fixture_sentences(name: str) -> list[list[str]]:
    return json.loads(shared_path(*FIXTURE_SETS[name]).read_text())


def expected_top(name: str, k: int, i: int) -> np.ndarray:
    """(n_tokens, 32): [forward; backward] top layer of sentence i of list k."""
    with h5py.File(fixture_dir(name) / f"lm_embeddings_{k}.hdf5", "r") as fh:
        e = fh[str(i)][...]
    return np.concatenate([e[0], e[1]], axis=-1)
